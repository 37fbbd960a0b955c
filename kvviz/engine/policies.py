"""A run's cache policy, checked against the model before its first pass: a window and sinks, a quantized cache, or
an importance method with its budget (GenerationError, one line, for what no run can use)."""

from __future__ import annotations

from dataclasses import replace

from kvviz.core.errors import GenerationError
from kvviz.core.formats import KV_DTYPES
from kvviz.core.policy import EVICTION_METHODS, SNAP_METHODS, CachePolicy

KIVI_RESIDUAL = 32  # KIVI's group of keys (and the most held exact) by default: its paper's group size
KV_LAYOUTS = ("kivi",)  # ways to lay out a quantized cache other than a scale a token and head
SNAP_POOL = 5  # SnapKV's pooling width by default (its paper's kernel)
MAX_OBSERVE = 32  # SnapKV's observation window by default: a quarter of the budget, at most its paper's 32


def run_policy(cfg, n_ctx: int, window: int = 0, sinks: int = 0, kv_dtype: str = "", evict: str = "",
               budget: int = 0, observe: int = 0, pool: int = 0, kv_layout: str = "",
               kv_residual: int = 0) -> CachePolicy:
    """The cache policy of a run on a model of config `cfg` and context `n_ctx`: `window` (or the model's own
    sliding window), `sinks` and `kv_dtype` (with `kv_layout` "kivi": keys per channel in groups of `kv_residual`
    tokens, 0: KIVI_RESIDUAL); or `evict`, an importance method keeping `budget` positions a layer (SnapKV and
    PyramidKV: watching `observe` queries, pooled over `pool` positions; 0: their defaults)."""
    if kv_dtype and kv_dtype not in KV_DTYPES:
        raise GenerationError(f"no KV cache in {kv_dtype!r}: kvviz quantizes it to {', '.join(KV_DTYPES)}")
    if kv_layout or kv_residual:
        return _kivi(cfg, n_ctx, run_policy(cfg, n_ctx, window, sinks, kv_dtype, evict, budget, observe, pool),
                     kv_layout, kv_residual)
    if evict:
        return _importance(cfg, n_ctx, window, sinks, kv_dtype, evict, budget, observe, pool)
    if budget or observe or pool:
        raise GenerationError("a budget, an observation window and pooling go with an importance method: give "
                              f"--evict ({', '.join(EVICTION_METHODS)})")
    refusal = cfg.cache_refusal(CachePolicy(window, sinks, kv_dtype))
    if refusal:
        raise GenerationError(refusal)
    if kv_dtype and window:
        raise GenerationError("a quantized cache keeps every position: leave out the window (one trade-off at "
                              "a time)")
    own, first_layer = (0, 0) if window or kv_dtype else cfg.own_window  # the model's own window, on its layers
    window = window or own
    if window < 0 or sinks < 0:
        raise GenerationError(f"a window and sinks are counts of positions, got {window} and {sinks}")
    if sinks and not window:
        raise GenerationError("attention sinks go with a window: give --window too")
    return CachePolicy(window, sinks, kv_dtype, first_layer)


def _kivi(cfg, n_ctx: int, policy: CachePolicy, kv_layout: str, kv_residual: int) -> CachePolicy:
    """`policy`, a quantized one, laid out as `kv_layout` says."""
    if not kv_layout:
        raise GenerationError("a residual is KIVI's group of keys: give the kivi layout too")
    if kv_layout not in KV_LAYOUTS:
        raise GenerationError(f"no KV cache layout {kv_layout!r}: kvviz lays a quantized cache out as "
                              f"{', '.join(KV_LAYOUTS)} (or a scale a token and head)")
    if policy.kv_dtype not in ("int8", "int4"):
        raise GenerationError(f"KIVI's layout quantizes keys per channel and values per token in int8 or int4: give "
                              f"a kv_dtype of int8 or int4{f', not {policy.kv_dtype}' if policy.kv_dtype else ''}")
    residual = kv_residual or KIVI_RESIDUAL
    if not 1 <= residual <= n_ctx:
        raise GenerationError(f"KIVI's group of keys is 1 to the context's {n_ctx} tokens, got {residual}")
    policy = replace(policy, kv_layout=kv_layout, kv_residual=residual)
    refusal = cfg.cache_refusal(policy)
    if refusal:
        raise GenerationError(refusal)
    return policy


def _importance(cfg, n_ctx: int, window: int, sinks: int, kv_dtype: str, evict: str, budget: int, observe: int,
                pool: int) -> CachePolicy:
    if evict not in EVICTION_METHODS:
        raise GenerationError(f"no importance method {evict!r}: kvviz evicts by {', '.join(EVICTION_METHODS)}")
    if window or sinks or kv_dtype:
        what = "a quantized cache" if kv_dtype else "a window"
        raise GenerationError(f"{evict} chooses the positions a cache keeps; {what} is another trade-off: leave it "
                              "out (one at a time)")
    if not 1 <= budget <= n_ctx:
        raise GenerationError(f"a budget is the positions a layer keeps: 1 to the context's {n_ctx}, got {budget}")
    snap = evict in SNAP_METHODS
    if not snap and (observe or pool):
        raise GenerationError(f"an observation window and pooling are SnapKV's and PyramidKV's, not {evict}'s")
    if snap:
        observe = observe or max(1, min(MAX_OBSERVE, budget // 4))
        pool = pool or SNAP_POOL
        if not 1 <= observe < budget:
            raise GenerationError(f"the observation window watches 1 to {budget - 1} queries (fewer than the "
                                  f"budget of {budget}), got {observe}")
        if pool < 1 or pool % 2 == 0:
            raise GenerationError(f"pooling averages an odd number of neighbouring positions (1, 3, 5, ...), got "
                                  f"{pool}")
    policy = CachePolicy(evict=evict, budget=budget, observe=observe if snap else 0, pool=pool if snap else 0)
    refusal = cfg.cache_refusal(policy)
    if refusal:
        raise GenerationError(refusal)
    return policy


def one_token_read(policy: CachePolicy, recording: bool) -> bool:
    """Whether a one-token cached step under `policy` takes the fast file's `decode_one`, where each layer reads
    what it holds its own way (a quantized layer its codes, a window its kept positions). Not under eviction by
    importance (its keeper masks and scores the pass), nor a window with sinks (on RoPE they take queries turned
    to their own positions) or one whose attention is recorded (the view places a window's weights by position):
    those take the forward."""
    return not policy.importance and not (policy.window and (policy.sinks or recording))
