"""Tiny GPT-2 checkpoints for tests, written the ways real ones are: by transformers, as on the hub, by kvviz."""

from __future__ import annotations

from pathlib import Path

import torch

# "Hello, I am" in GPT-2's BPE.
HELLO_IDS = [15496, 11, 314, 716]
EOT_ID = 50256


def gpt2_config(n_layer: int = 2, n_head: int = 2, n_embd: int = 32, n_positions: int = 64,
                vocab_size: int = 50257):
    """A transformers GPT2Config with dropout off, as GPT-2 runs at inference."""
    from transformers import GPT2Config

    special = min(EOT_ID, vocab_size - 1)
    return GPT2Config(
        vocab_size=vocab_size,
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=special,
        eos_token_id=special,
        pad_token_id=special,
    )


def transformers_model(config, seed: int = 0, dtype: torch.dtype = torch.float32):
    """GPT2LMHeadModel with every parameter random (biases and LayerNorms too), so parity checks all of them."""
    from transformers import GPT2LMHeadModel

    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln_" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=generator))
    return model.to(dtype).eval()


def save_transformers_folder(folder: Path, config=None, seed: int = 0, dtype: torch.dtype = torch.float32):
    """A folder as `GPT2LMHeadModel.save_pretrained` writes it (config.json + model.safetensors); returns the model."""
    model = transformers_model(config or gpt2_config(), seed, dtype)
    model.save_pretrained(str(folder))
    return model


def hub_state_dict(model) -> dict[str, torch.Tensor]:
    """Keys as the hub's openai-community/gpt2 model.safetensors has them: no `transformer.` prefix,
    no lm_head, and the causal-mask buffers `h.N.attn.bias` / `h.N.attn.masked_bias` that old transformers saved."""
    config = model.config
    state: dict[str, torch.Tensor] = {}
    for key, tensor in model.state_dict().items():
        if key.startswith("lm_head."):
            continue
        state[key.removeprefix("transformer.")] = tensor.detach().clone().contiguous()
    n = config.n_positions
    mask = torch.tril(torch.ones(n, n, dtype=torch.float32)).view(1, 1, n, n)
    for i in range(config.n_layer):
        state[f"h.{i}.attn.bias"] = mask.clone()
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    return state


def save_hub_file(path: Path, model) -> Path:
    """A bare hub-style model.safetensors at `path` (no config.json)."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(hub_state_dict(model), str(path), metadata={"format": "pt"})
    return path


def save_kvviz_folder(folder: Path, n_layer: int = 2, n_head: int = 2, n_embd: int = 64, n_ctx: int = 64,
                      seed: int = 0) -> Path:
    """A random kvviz model saved with kvviz.sources.weights.save_checkpoint; returns the folder."""
    from kvviz.models.gpt2 import GPT, GPTConfig
    from kvviz.sources.weights import save_checkpoint

    model = GPT(GPTConfig(n_ctx=n_ctx, n_layer=n_layer, n_head=n_head, n_embd=n_embd, name=folder.name))
    model.init_weights(torch.Generator().manual_seed(seed))
    save_checkpoint(model, folder)
    return folder


def tiny_kvviz_model(n_layer: int = 2, n_head: int = 2, n_embd: int = 32, n_ctx: int = 64,
                     vocab_size: int = 50257, seed: int = 0, std: float = 0.02):
    """A random kvviz GPT in memory; a larger `std` makes the next-token distribution less flat."""
    from kvviz.models.gpt2 import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=vocab_size, n_ctx=n_ctx, n_layer=n_layer, n_head=n_head, n_embd=n_embd))
    model.init_weights(torch.Generator().manual_seed(seed))
    if std != 0.02:
        generator = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("weight") and ".ln_" not in name and "ln_f" not in name:
                    p.copy_(std * torch.randn(p.shape, generator=generator))
    return model.eval()


def embedded_or_tiny_folder(tmp_path: Path) -> Path:
    """The embedded default model if the training has produced it, else a tiny stand-in saved into `tmp_path`."""
    from kvviz.core.resources import default_model_dir

    try:
        folder = default_model_dir()
    except FileNotFoundError:
        folder = None
    if folder is not None and (folder / "model.safetensors").is_file() and (folder / "config.json").is_file():
        return folder
    return save_kvviz_folder(tmp_path / "kvviz-tiny", n_layer=4, n_head=4, n_embd=64, n_ctx=128)


def byte_level_tokenizer(vocab_size: int = 400):
    """A byte-level BPE trained on a few lines, with a beginning-of-text token its post-processor adds, as
    Llama's does, and an end-of-text token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(["Time flies like an arrow.", "Fruit flies like a banana.", "The cache keeps "
                                   "every key and value it has computed."] * 20, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return tokenizer


def spread_peer(model_class, config, seed: int):
    """A transformers model with random weights less flat than its default initialisation (matrices N(0, 0.15),
    vectors N(0, 0.05)), so that greedy tokens differ from step to step; in eval mode."""
    torch.manual_seed(seed)
    peer = model_class(config).eval()
    with torch.no_grad():
        for parameter in peer.parameters():
            parameter.normal_(0.0, 0.15 if parameter.dim() > 1 else 0.05)
    return peer


def peer_greedy(peer, prompt_ids: list[int], new_tokens: int) -> list[int]:
    """The tokens a transformers model generates greedily after `prompt_ids`: the reference a family's run is
    held to."""
    with torch.no_grad():
        out = peer.generate(torch.tensor([prompt_ids]), max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


def plan_ids(engine, prompt_ids, max_new_tokens: int, use_cache: bool = True, sampling=None, *,
             cache_fault: str = "", prompt: str = "", model_name: str = "", policy=None, **fields):
    """`engine.plan` of a RunRequest for `prompt_ids`, as a test states it: its sampling as SamplingSettings, the
    teaching bug by name, the rest of the request (`window`, `sinks`, `kv_dtype`, `attention`) as they are."""
    from kvviz.core.records import RunRequest

    t, k, seed = (sampling.temperature, sampling.top_k, sampling.seed) if sampling is not None else (0.0, None, None)
    request = RunRequest(0, prompt, use_cache, max_new_tokens, t, k, seed, break_cache=bool(cache_fault), **fields)
    return engine.plan(request, prompt_ids, model_name, policy=policy)


def lockstep_ids(engine, prompt_ids, max_new_tokens: int, use_cache: bool = True, sampling=None, *,
                 cache_fault: str = "", prompt: str = "", model_name: str = "", **fields):
    """`plan_lockstep` of a RunRequest for `prompt_ids` (see plan_ids)."""
    from kvviz.core.records import RunRequest
    from kvviz.engine.compare import plan_lockstep

    t, k, seed = (sampling.temperature, sampling.top_k, sampling.seed) if sampling is not None else (0.0, None, None)
    request = RunRequest(0, prompt, use_cache, max_new_tokens, t, k, seed, break_cache=bool(cache_fault),
                         compare=True, **fields)
    return plan_lockstep(engine, request, prompt_ids, model_name)
