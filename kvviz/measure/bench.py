"""Benchmarks: cached vs uncached generation, and kvviz vs transformers on the same weights."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, NamedTuple

from kvviz.core.errors import KvvizError

if TYPE_CHECKING:  # torch loads with the first benchmark, not with this module (the CLI reads its defaults)
    from transformers import PreTrainedModel

    from kvviz.engine.engine import Engine

WARMUP_TOKENS = 8
MAX_REPEAT = 100  # turns per configuration: more would only wait longer for the same fastest run


def _timed(engine: Engine, prompt_ids: list[int], new_tokens: int, use_cache: bool, kv_dtype: str = ""
           ) -> tuple[list[int], float, int]:
    from kvviz.core.records import RunRequest
    from kvviz.engine.run import start_run

    started = time.perf_counter()
    request = RunRequest(0, "", use_cache, new_tokens, kv_dtype=kv_dtype)
    records = list(start_run(engine, request, prompt_ids=prompt_ids, top_candidates=1).passes())
    seconds = time.perf_counter() - started
    return [r.token_id for r in records if r.token_id is not None], seconds, records[-1].cache_bytes


def to_transformers(model):
    """transformers' model of `model`'s family (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM,
    DeepseekV2ForCausalLM, Gemma3ForCausalLM, Gemma4ForCausalLM, GptOssForCausalLM) holding
    exactly its weights, in the same dtype, as `from_pretrained(dtype=...)` makes it: RoPE's frequencies stay
    float32 (a plain `.to(bfloat16)` would round them, and the peer would compute other angles)."""
    from kvviz.models.deepseek import Deepseek
    from kvviz.models.gemma3 import Gemma3
    from kvviz.models.gemma4 import Gemma4
    from kvviz.models.gpt2 import GPT
    from kvviz.models.gpt_oss import GptOss
    from kvviz.models.qwen3_5 import Qwen35

    peer = (_gpt2_peer(model) if isinstance(model, GPT) else _deepseek_peer(model) if isinstance(model, Deepseek)
            else _gemma3_peer(model) if isinstance(model, Gemma3)
            else _gemma4_peer(model) if isinstance(model, Gemma4)
            else _gpt_oss_peer(model) if isinstance(model, GptOss)
            else _qwen3_5_peer(model) if isinstance(model, Qwen35) else _llama_peer(model))
    weights = next(model.parameters())
    frequencies = {name: b.clone() for name, b in peer.named_buffers() if name.endswith("inv_freq")}
    peer = peer.eval().to(device=weights.device, dtype=weights.dtype)
    for name, float32 in frequencies.items():
        owner, _, attribute = name.rpartition(".")
        setattr(peer.get_submodule(owner), attribute, float32.to(weights.device))
    return peer


def peer_of_source(source: str | None, model, dtype) -> tuple[object, str]:
    """transformers' own model for `source`: a checkpoint folder (or a file with its config.json beside it) loaded
    by `AutoModelForCausalLM.from_pretrained`, which reads the config itself (Mistral's and Qwen2's windows, a
    Qwen2 `layer_types`), so the peer never inherits kvviz's reading of it; else (embedded models, random presets,
    hub names) the model of `model`'s family built from its config, holding its weights. Returns the peer and
    how it was made."""
    from pathlib import Path

    from kvviz.core.files import user_path

    path = None
    if source and not source.startswith("random:"):
        candidate = user_path(source)
        folder = candidate if candidate.is_dir() else candidate.parent
        if (folder / "config.json").is_file() and (candidate.is_dir() or candidate.name == "model.safetensors"):
            path = Path(folder)
    if path is None:
        return to_transformers(model), "built from kvviz's reading of the config, holding the same weights"
    import transformers

    peer = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    weights = next(model.parameters())
    return peer.eval().to(device=weights.device), f"transformers' from_pretrained({path.name})"


def _llama_peer(model):
    import transformers

    from kvviz.models import llama_format

    cfg = model.config
    model_type = "qwen3" if cfg.qk_norm else "qwen2" if cfg.qkv_bias and not cfg.o_bias else "llama"
    fields = {k: v for k, v in llama_format.config_to_json(cfg, model_type).items()
              if k not in ("architectures", "model_type", "torch_dtype")}
    config_class, model_class = {"qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
                                 "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}.get(
        model_type, (transformers.LlamaConfig, transformers.LlamaForCausalLM))
    return _holding(model_class(config_class(**fields)), model)


def _deepseek_peer(model):
    import transformers

    from kvviz.models import deepseek_format

    cfg = model.config
    fields = {k: v for k, v in deepseek_format.config_to_json(cfg).items()
              if k not in ("architectures", "model_type", "torch_dtype")}
    return _holding(transformers.DeepseekV2ForCausalLM(transformers.DeepseekV2Config(**fields)), model)


def _gemma3_peer(model):
    import transformers

    from kvviz.models import gemma3_format

    cfg = model.config
    fields = {k: v for k, v in gemma3_format.config_to_json(cfg).items()
              if k not in ("architectures", "model_type", "torch_dtype")}
    return _holding(transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**fields)), model)


def _gemma4_peer(model):
    import transformers

    from kvviz.models import gemma4_format

    fields = {k: v for k, v in gemma4_format.config_to_json(model.config).items()
              if k not in ("architectures", "model_type", "torch_dtype")}
    return _holding(transformers.Gemma4ForCausalLM(transformers.Gemma4TextConfig(**fields)), model)


def _gpt_oss_peer(model):
    import transformers

    from kvviz.models import gpt_oss_format

    fields = {k: v for k, v in gpt_oss_format.config_to_json(model.config).items()
              if k not in ("architectures", "model_type", "torch_dtype")}
    fields["attn_implementation"] = "eager"  # its attention with learned sinks (no sdpa for gpt-oss)
    return _holding(transformers.GptOssForCausalLM(transformers.GptOssConfig(**fields)), model)


def _qwen3_5_peer(model):
    import transformers

    from kvviz.models import qwen3_5_format

    fields = {k: v for k, v in qwen3_5_format.config_to_json(model.config).items()
              if k not in ("architectures", "model_type", "torch_dtype")}
    return _holding(transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**fields)), model)


def _holding(peer, model):
    """`peer` (a transformers model of `model`'s family and shape) with `model`'s weights, its head tied where
    `model`'s is; RuntimeError if any weight has no place in it."""
    missing, unexpected = peer.load_state_dict({k: v.float() for k, v in model.state_dict().items()}, strict=False)
    missing = [k for k in missing if not (model.config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"weights do not map onto {type(peer).__name__}: missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]}")
    peer.tie_weights()
    return peer


def _gpt2_peer(model):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = model.config
    hf_config = GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.n_ctx, n_embd=cfg.n_embd,
                           n_layer=cfg.n_layer, n_head=cfg.n_head, layer_norm_epsilon=cfg.layer_norm_epsilon,
                           resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=50256, eos_token_id=50256)
    peer = GPT2LMHeadModel(hf_config)
    missing, unexpected = peer.load_state_dict(
        {k: v.float() for k, v in model.state_dict().items()}, strict=False
    )
    missing = [k for k in missing if k != "lm_head.weight" and not k.endswith(".attn.bias")]
    if missing or unexpected:
        raise RuntimeError(
            f"weights do not map onto GPT2LMHeadModel: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    peer.tie_weights()
    return peer


def _time_peer(peer, prompt_ids: list[int], new_tokens: int, use_cache: bool) -> tuple[list[int], float]:
    import torch

    device = next(peer.parameters()).device
    idx = torch.tensor([prompt_ids], device=device)
    kwargs = dict(do_sample=False, use_cache=use_cache, pad_token_id=0, eos_token_id=None,
                  min_new_tokens=new_tokens, max_new_tokens=new_tokens)
    with torch.inference_mode():
        peer.generate(idx, **{**kwargs, "min_new_tokens": WARMUP_TOKENS, "max_new_tokens": WARMUP_TOKENS})
        started = time.perf_counter()
        out = peer.generate(idx, **kwargs)
        seconds = time.perf_counter() - started
    return out[0, len(prompt_ids):].tolist(), seconds


class Timing(NamedTuple):
    """The fastest of a configuration's runs: its tokens, seconds and final cache size."""

    ids: list[int]
    seconds: float
    cache_bytes: int = 0


def best_of(
    repeat: int, engine: Engine, peer: PreTrainedModel | None, prompt_ids: list[int], new_tokens: int,
    use_cache: bool, float32_engine: Engine | None = None, kv_dtype: str = "",
) -> dict[str, Timing]:
    """Time kvviz `repeat` times, and right after each run the peer, kvviz in float32 (where given) and kvviz with
    its cache quantized to `kv_dtype` (given); keep the fastest run of each, under the keys "kvviz", "peer",
    "float32" and "quantized"."""
    if not 1 <= repeat <= MAX_REPEAT:
        raise KvvizError(f"repeat must be a whole number from 1 to {MAX_REPEAT}, got {repeat}")
    runners = {"kvviz": lambda: Timing(*_timed(engine, prompt_ids, new_tokens, use_cache))}
    if peer is not None:
        runners["peer"] = lambda: Timing(*_time_peer(peer, prompt_ids, new_tokens, use_cache))
    if float32_engine is not None:
        runners["float32"] = lambda: Timing(*_timed(float32_engine, prompt_ids, new_tokens, use_cache))
    if kv_dtype:
        runners["quantized"] = lambda: Timing(*_timed(engine, prompt_ids, new_tokens, use_cache, kv_dtype))
    fastest: dict[str, Timing] = {}
    for _ in range(repeat):
        for name, runner in runners.items():
            run = runner()
            if name not in fastest or run.seconds < fastest[name].seconds:
                fastest[name] = run
    return fastest


CACHED_REPEAT = 3  # cached runs take seconds: by default, three turns each
UNCACHED_REPEAT = 1  # uncached runs take ~10 times longer: one each


def memory_read_rate(device: str = "cpu", megabytes: int = 512, repeat: int = 10) -> float:
    """Bytes per second this machine reads from memory, measured: the best of `repeat` sums over a buffer
    far larger than any cache."""
    import torch

    buffer = torch.ones(megabytes * 1024 * 1024 // 4, dtype=torch.float32, device=device)
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        float(buffer.sum())
        best = min(best, time.perf_counter() - started)
    return buffer.numel() * buffer.element_size() / best


def weight_bytes(model) -> int:
    """Bytes of the model's parameters (a tied embedding once): what a decode step reads at least."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def run_bench(
    model: str | None, prompt: str, new_tokens: int, device: str = "cpu", peer: bool = False,
    repeat: int | None = None, dtype: str = "float32", kv_dtype: str = "",
) -> dict:
    """Cached and uncached tokens/s of kvviz (and, with `peer`, of transformers) in one process.

    Each configuration runs `repeat` times (by default CACHED_REPEAT for cached runs and
    UNCACHED_REPEAT for uncached ones), kvviz and the peer taking turns right after each other,
    and the fastest run of each counts (the usual rule for timings disturbed by other work on the
    machine): the two cached runs that are compared are always seconds apart. With `kv_dtype` the cached run
    with a quantized cache takes turns with the exact one.
    """
    import torch

    from kvviz.engine.engine import Engine, generate_ids
    from kvviz.sources.weights import load_model

    loaded = load_model(model, device=device, dtype=getattr(torch, dtype))
    engine = Engine(loaded.model, loaded.tokenizer, device=device)
    prompt_ids = engine.encode_prompt(prompt)
    engine.policy(kv_dtype=kv_dtype)  # a format the model cannot store in: refused before any timing
    for use_cache in (True, False):
        generate_ids(engine, prompt_ids, WARMUP_TOKENS, use_cache)
    if kv_dtype:
        _timed(engine, prompt_ids, WARMUP_TOKENS, True, kv_dtype)
    reference, peer_source = None, ""
    if peer:
        try:
            reference, peer_source = peer_of_source(model, loaded.model, getattr(torch, dtype))
        except ImportError as exc:
            raise KvvizError(f"--peer needs transformers: pip install transformers ({exc})") from exc
    float32_engine = None
    if dtype != "float32":  # the figure a half-precision run is compared with, timed in turns with it
        float32 = load_model(model, device=device, dtype=torch.float32)
        float32_engine = Engine(float32.model, float32.tokenizer, device=device)
        generate_ids(float32_engine, prompt_ids, WARMUP_TOKENS, True)
    cached_repeat = repeat or CACHED_REPEAT
    uncached_repeat = repeat or UNCACHED_REPEAT
    fastest_cached = best_of(cached_repeat, engine, reference, prompt_ids, new_tokens, True, float32_engine,
                             kv_dtype)
    fastest_uncached = best_of(uncached_repeat, engine, reference, prompt_ids, new_tokens, False)
    cached, uncached = fastest_cached["kvviz"], fastest_uncached["kvviz"]
    peer_cached, peer_uncached = fastest_cached.get("peer"), fastest_uncached.get("peer")
    n = len(cached.ids)
    read_rate = memory_read_rate(device)
    weights = weight_bytes(loaded.model)
    bound = read_rate / weights  # tokens/s if a decode step cost nothing but reading the weights once
    result: dict = {
        "model": loaded.name,
        "dtype": dtype,
        "device": device,
        "threads": torch.get_num_threads(),
        "prompt_tokens": len(prompt_ids),
        "new_tokens": n,
        "cached_tokens_per_second": n / cached.seconds,
        "uncached_tokens_per_second": len(uncached.ids) / uncached.seconds,
        "speedup": uncached.seconds / cached.seconds * n / max(1, len(uncached.ids)),
        "identical": cached.ids == uncached.ids,
        "cache_bytes": cached.cache_bytes,
        "weight_bytes": weights,
        "memory_read_bytes_per_second": read_rate,
        "bandwidth_bound_tokens_per_second": bound,
        "fraction_of_bound": (n / cached.seconds) / bound,
        "cached_runs": cached_repeat,
        "uncached_runs": uncached_repeat,
    }
    if float32_engine is not None:
        float32 = fastest_cached["float32"]
        float32_rate = len(float32.ids) / float32.seconds
        result.update({
            "float32_cached_tokens_per_second": float32_rate,
            "cached_vs_float32": (n / cached.seconds) / float32_rate,
            "float32_identical": float32.ids == cached.ids,
        })
    if kv_dtype:
        quantized = fastest_cached["quantized"]
        quantized_rate = len(quantized.ids) / quantized.seconds
        result.update({
            "kv_dtype": kv_dtype,
            "quantized_tokens_per_second": quantized_rate,
            "quantized_vs_exact_cached": quantized_rate / (n / cached.seconds),
            "quantized_identical": quantized.ids == cached.ids,
            "quantized_cache_bytes": quantized.cache_bytes,
        })
    if peer_cached is not None and peer_uncached is not None:
        peer_cached_rate = len(peer_cached.ids) / peer_cached.seconds
        peer_uncached_rate = len(peer_uncached.ids) / peer_uncached.seconds
        result.update({
            "peer_cached_tokens_per_second": peer_cached_rate,
            "peer_uncached_tokens_per_second": peer_uncached_rate,
            "cached_vs_peer_cached": (n / cached.seconds) / peer_cached_rate,
            "uncached_vs_peer_uncached": (len(uncached.ids) / uncached.seconds) / peer_uncached_rate,
            "peer_identical": peer_cached.ids == cached.ids and peer_uncached.ids == cached.ids,
            "peer_class": type(reference).__name__,
            "peer_source": peer_source,
        })
    return result
