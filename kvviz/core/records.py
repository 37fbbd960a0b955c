"""Frozen records that cross from the engine to the views: the model, a run's plan, one record per pass.

Torch-free and Qt-free (an import contract checks both), so the app's views can read them without
importing the engine, and they can cross threads as they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvviz.core.attention_weights import AttentionWeights
from kvviz.core.eviction import EvictionState
from kvviz.core.policy import EXACT, CachePolicy
from kvviz.core.speculation import Drafter, Speculation

if TYPE_CHECKING:  # a plan carries one; records import no formulas at run time
    from kvviz.core.memory import Architecture, LayerShape


@dataclass(frozen=True)
class Candidate:
    """One of the likeliest next tokens of a pass, with its probability."""

    token_id: int
    text: str
    probability: float


@dataclass(frozen=True)
class ModelInfo:
    """The loaded model, for the title bar, Help > About and the views."""

    name: str
    source: str
    num_parameters: int
    n_layer: int
    n_head: int
    n_embd: int
    n_ctx: int
    dtype: str = "float32"  # the weights' and the cache's number type




@dataclass(frozen=True)
class RunRequest:
    """What the app asks the worker to run; `run_id` tags the run's plan and every record of it."""

    run_id: int
    prompt: str
    use_cache: bool = True
    max_new_tokens: int = 12
    temperature: float = 0.0
    top_k: int | None = None
    seed: int | None = None
    compare: bool = False  # run the other mode in lockstep beside this one (compare mode)
    break_cache: bool = False  # the teaching switch: the cached run uses a KV cache with an indexing bug
    attention: bool = False  # records carry the newest query's attention weights (the attention view is open)
    window: int = 0  # a sliding window of this many positions (0: the model's own, if any, else none)
    sinks: int = 0  # with `window`: the first positions kept as attention sinks
    kv_dtype: str = ""  # a key of KV_DTYPES: the cache stores keys and values quantized ("": exact)
    kv_layout: str = ""  # with kv_dtype int8 or int4: "kivi" quantizes keys per channel (CachePolicy.kv_layout)
    kv_residual: int = 0  # ... in groups of this many tokens (0: KIVI_RESIDUAL)
    draft_tokens: int = 0  # speculative decoding: drafts a round, by prompt lookup or the draft model (0: off)
    prompt_lookup: int = 0  # ... drafted by prompt lookup of up to this many tokens (0: by `draft_model`)
    draft_model: str = ""  # ... drafted by this model (a source kvviz loads)
    evict: str = ""  # an importance method (kvviz.core.policy.EVICTION_METHODS) keeps `budget` positions a layer
    budget: int = 0
    observe: int = 0  # SnapKV and PyramidKV: the observation window (0: the method's default)
    pool: int = 0  # ... and the pooling width (0: the default)


MAX_PROMPT_CHARACTERS = 1_000_000  # the longest prompt kvviz takes, typed, pasted or given with --prompt
CACHE_FAULTS = {
    "late_write": "each new token's key and value are written one slot late, so its query reads a stale row",
}  # the bugs "break the cache" can plant in the cached run, by name
BROKEN_CACHE_FAULT = "late_write"  # the one the teaching switch (Break the cache, --break-cache) plants


def describe_sampling(temperature: float, top_k: int | None, seed: int | None) -> str:
    """'greedy', or e.g. 'temperature 0.8, top-k 40, seed 1'."""
    if temperature == 0:
        return "greedy"
    parts = [f"temperature {temperature:g}"]
    if top_k:
        parts.append(f"top-k {top_k}")
    if seed is not None:
        parts.append(f"seed {seed}")
    return ", ".join(parts)


@dataclass(frozen=True)
class RunPlan:
    """A validated run, planned by the engine before its first pass; views take it in `reset(plan)`.

    Everything a view needs to frame the run comes from here, computed once: how many tokens the
    run can generate (`budget`), how many forward passes that takes (`passes`: a cached run ends
    with one more pass that feeds its last token into the cache), how wide the grid is, and the
    final counts per layer, for charts that are framed before the run starts.
    """

    prompt: str
    prompt_ids: tuple[int, ...]
    prompt_labels: tuple[str, ...]  # one readable label per prompt token
    model_name: str
    n_layer: int
    n_ctx: int
    use_cache: bool
    max_new_tokens: int  # as requested
    budget: int  # tokens this run will generate: max_new_tokens, capped at n_ctx - P unless sinks stream past n_ctx
    passes: int  # forward passes: budget + 1 with the cache (the last fills it), budget without
    width: int  # positions the run reaches: P + budget
    final_with_cache: int  # K/V per layer a cached run has computed at the end: P + N
    final_without_cache: int  # K/V per layer an uncached run has computed at the end: N*P + N(N-1)/2
    cache_bytes_per_position: int  # keys and values of one position over all layers; 0 without a cache
    stop_reason: str  # why the run will end: "max_new_tokens" or "context_full"
    sampling: str  # describe_sampling(...)
    run_id: int = 0
    cache_fault: str = ""  # a key of CACHE_FAULTS when this run's cache is broken on purpose, else ""
    twin: RunPlan | None = None  # compare mode: the other mode's run of the same request, in lockstep
    attention: bool = False  # every record carries its newest query's AttentionWeights
    n_head: int = 0  # attention (query) heads per layer
    n_kv_head: int = 0  # heads whose keys and values the cache keeps (fewer under GQA, one under MQA); 0: n_head
    head_dim: int = 0  # numbers per key (and per value) per head
    dtype_bytes: int = 4  # bytes per number of the weights and the cache
    policy: CachePolicy = EXACT  # which positions the cache keeps (and every pass attends to)
    cache_parts: tuple[tuple[str, int], ...] = ()  # latent attention's: what a layer caches instead of heads,
    # (name, numbers) each, e.g. (("latent c_kv", 512), ("RoPE key k_pe", 64)); () for a cache of heads
    cache_shape: Architecture | None = None  # what the cache holds per layer (kvviz.models.cache_shape); None:
    # no cache
    cache_precision: str = ""  # what its numbers are stored in: the weights' type ("float32") or a KV_DTYPES key
    head_key_value: tuple[int, int] = ()  # latent attention's: the numbers of each head's key and value that every
    # pass rebuilds from the latent (qk_head_dim, v_head_dim), e.g. (192, 128); () for a cache of heads
    layer_shapes: tuple[LayerShape, ...] = ()  # what each layer keeps where the model's layers differ (a window,
    # nothing but a shared source, a fixed state), with or without a cache; () where every layer is alike
    drafter: Drafter | None = None  # speculative decoding's drafter; None: one token a pass

    def layer_kind(self, layer: int) -> str:
        """What `layer` keeps: a key of kvviz.core.memory.LAYER_SHAPE_KINDS ("full" where the layers are alike)."""
        if self.layer_shapes:
            return self.layer_shapes[layer].kind
        if self.policy.importance:
            return "importance"
        return "window" if self.policy.windows(layer) else "full"

    @property
    def multi_head_numbers(self) -> int:
        """Latent attention: the numbers a layer would cache a position as multi-head attention with the same heads,
        each head's key and value (heads × (qk_head_dim + v_head_dim)); 0 for a cache of heads."""
        return self.n_head * sum(self.head_key_value) if self.cache_parts and self.head_key_value else 0

    @property
    def cache_heads(self) -> int:
        """Rows the cache keeps per layer: KV heads, or latent attention's parts."""
        return len(self.cache_parts) or self.n_kv_head or self.n_head

    @property
    def query_group(self) -> int:
        """Query heads reading each cached head: 1 under multi-head attention (and for latent parts)."""
        if self.cache_parts:
            return 1
        return self.n_head // self.cache_heads if self.cache_heads else 1

    @property
    def against_lossy(self) -> bool:
        """Compare mode of an exact cache against a lossy one (a window, or quantized; both runs cached), not of
        cached against uncached."""
        return self.twin is not None and self.use_cache and self.twin.use_cache

    @property
    def lockstep_names(self) -> tuple[str, str]:
        """What compare mode calls its two runs: the cached and the uncached, or the full cache and the window."""
        if not self.against_lossy:
            return "with cache", "without cache"
        lossy = self if self.policy.lossy else self.twin
        if lossy.policy.quantized:
            return "exact cache", f"{lossy.policy.kv_dtype} cache"
        if lossy.policy.importance:
            return "full cache", f"{lossy.policy.method_name}, budget {lossy.policy.budget}"
        sinks = f" + {lossy.policy.sinks} sinks" if lossy.policy.sinks else ""
        return "full cache", f"window of {lossy.policy.window}{sinks}"

    @property
    def cached_plan(self) -> RunPlan | None:
        """The run with the cache: this one or its twin (against a window: the full cache's)."""
        if self.against_lossy:
            return self.twin if self.policy.lossy else self
        return self if self.use_cache else self.twin

    @property
    def uncached_plan(self) -> RunPlan | None:
        """The run without the cache: this one or its twin (against a window: the windowed cache's)."""
        if self.against_lossy:
            return self if self.policy.lossy else self.twin
        return self.twin if self.use_cache else self

    @property
    def cache_broken(self) -> bool:
        """True when this run, or its twin, runs on a KV cache broken on purpose."""
        return bool(self.cache_fault or (self.twin is not None and self.twin.cache_fault))

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def final_cache_bytes(self) -> int:
        """The KV cache's filled bytes once every position of the run has been fed: what each layer holds then
        (a window's layers hold fewer) as the family states it."""
        if self.cache_shape is not None and self.cache_precision:
            return self.cache_shape.cache_bytes(self.width, self.cache_precision)
        return self.cache_bytes_per_position * self.width

    def pass_follows_in_step(self, record: StepRecord) -> bool:
        """True when the pass after `record` belongs to the same user step: the cache-filling
        pass that follows a cached run's last token."""
        return self.passes > self.budget and record.token_id is not None and record.new_tokens == self.budget

    @property
    def steps(self) -> int:
        """Step presses from the first token to the last: one a token (a batch's are its passes: BatchPlan.steps)."""
        return self.budget

    def steps_done(self, record: StepRecord) -> int:
        """Step presses that `record` of this run answers: the tokens generated by then."""
        return record.new_tokens

    def next_token_step(self, passes: Iterator[StepRecord]) -> tuple[StepRecord, ...]:
        """The passes of the next token step from this run's `passes`: the token pass, and after the last
        token of a cached run the pass that fills the cache. StopIteration when the run is over."""
        step = [next(passes)]
        if self.pass_follows_in_step(step[0]):
            step.append(next(passes))
        return tuple(step)


@dataclass(frozen=True)
class StepRecord:
    """What one forward pass really did.

    Positions `fed_start .. fed_stop-1` were fed; every layer projected their keys and values
    (`kv_computed[layer]` rows, counted inside the attention layers) and read
    `kv_reused[layer]` rows from the cache (positions `0 .. fed_start-1` when cached, none
    otherwise). The pass that feeds the last token into the cache emits no token
    (`token_id is None`), as in the reference loop, so a cached run of N tokens makes N + 1
    passes and computes P + N rows per layer; an uncached run makes N passes.

    `with_cache_total` and `without_cache_total` put each run beside its counterpart: a cached
    run counts the rows it projected and, for "without cache", the rows it projected plus the
    rows it read from the cache in every pass that chose a token (what re-running the whole
    sequence would have projected); an uncached run counts its projected rows and, for "with
    cache", the positions a cached run would have projected by the same step: every token but
    the newest, and all P + N once the run is finished.
    """

    step: int  # forward pass index, 0 for the first
    use_cache: bool
    prompt_tokens: int
    fed_start: int
    fed_stop: int
    fed_token_ids: tuple[int, ...]
    kv_computed: tuple[int, ...]  # per layer, this pass
    kv_reused: tuple[int, ...]  # per layer, this pass
    token_id: int | None  # the token this pass chose; None for the final cache-filling pass
    token_text: str
    candidates: tuple[Candidate, ...]
    new_tokens: int  # tokens generated so far, this one included
    sequence_length: int  # prompt + generated tokens after this pass
    seconds: float  # wall time of the forward pass and the choice of token
    kv_computed_total: int  # per layer, this run so far, measured
    kv_reused_total: int  # per layer, this run so far, measured
    with_cache_total: int  # per layer: K/V a cached run has computed at this point (P + N once finished)
    without_cache_total: int  # per layer: K/V an uncached run computes for this much text
    cache_bytes: int  # filled part of the KV cache after this pass (0 without cache)
    n_layer: int
    final: bool  # no pass follows in this run
    stop_reason: str = ""  # set on the final record: why the run ended
    kv_written: tuple[int, int] | None = None  # cache slots [start, stop) this pass wrote its K/V into; None: no cache
    # compare mode: the twin run's passes of the same token step (its cache-filling pass included), the
    # largest |logit difference| between the two runs' token passes, and which of them ran first
    twin: tuple[StepRecord, ...] = ()
    max_abs_logit_diff: float | None = None
    logit_tolerance: float | None = None  # float noise the two logits may differ by (compare.logit_tolerance)
    twin_ran_first: bool = False
    attention: AttentionWeights | None = None  # the newest query's weights, when the plan asks for them
    kv_evicted: tuple[int, int] = (0, 0)  # positions [start, stop) this pass evicted from the cache (a window's)
    positions_held: int = 0  # positions the cache holds after this pass (0 without a cache)
    windowed: bool = False  # the pass ran on a cache that evicts (a window)
    lossy: bool = False  # the pass ran on a cache that evicts or rounds (a window, or quantized)
    layer_positions_held: tuple[int, ...] = ()  # positions each layer's cache holds after this pass (() no cache)
    layer_capacity: tuple[int, ...] = ()  # the most positions each layer's cache ever holds (0: every one)
    cache_precision: str = ""  # what the cache's numbers are stored in: "float32", "bfloat16", "int8", ...
    layer_bytes: tuple[int, ...] = ()  # bytes each layer's cache holds after this pass, measured (() no cache)
    speculation: Speculation | None = None  # speculative decoding: this target pass's round
    eviction: EvictionState | None = None  # an importance method's: what each layer keeps, and its scores

    @property
    def twin_token_id(self) -> int | None:
        """The token the twin run chose in this step (None outside compare mode and for a filling pass)."""
        return next((r.token_id for r in self.twin if r.token_id is not None), None)

    @property
    def logits_agree(self) -> bool | None:
        """Compare mode: whether the two runs' logits of this step agree within float noise (a NaN
        difference never agrees); None for a record that carries no comparison."""
        if self.max_abs_logit_diff is None or self.logit_tolerance is None:
            return None
        return self.max_abs_logit_diff <= self.logit_tolerance

    def lockstep_token_passes(self) -> tuple[StepRecord, StepRecord]:
        """(cached pass, uncached pass) that chose this step's token in compare mode."""
        cached, uncached = (next(p for p in passes if p.token_id is not None) for passes in self.lockstep_passes())
        return cached, uncached

    def lockstep_passes(self) -> tuple[tuple[StepRecord, ...], tuple[StepRecord, ...]]:
        """(cached passes, uncached passes) of this record's step in compare mode, this record included; of a
        full cache against a window, (the full cache's, the window's); likewise against a quantized cache."""
        both = (self, *self.twin)
        if any(r.lossy for r in both) and all(r.use_cache for r in both):  # a pass may come alone: a fill
            return tuple(r for r in both if not r.lossy), tuple(r for r in both if r.lossy)
        cached = tuple(r for r in both if r.use_cache)
        uncached = tuple(r for r in both if not r.use_cache)
        return cached, uncached

    @property
    def avoided_total(self) -> int:
        return self.without_cache_total - self.with_cache_total

    def computed_positions(self, width: int | None = None) -> slice:
        """Positions (below `width`) whose K/V this pass computed, in every layer."""
        width = self.fed_stop if width is None else width
        return slice(min(self.fed_start, width), min(self.fed_stop, width))

    def written_positions(self, width: int | None = None) -> slice:
        """Cache slots (below `width`) this pass wrote its K/V into, in every layer: its computed positions,
        except on a cache broken on purpose (CACHE_FAULTS); none without a cache."""
        width = self.fed_stop if width is None else width
        if self.kv_written is None:
            return slice(0, 0)
        start, stop = self.kv_written
        return slice(min(start, width), min(stop, width))

    def reused_positions(self, width: int | None = None) -> slice:
        """Positions (below `width`) whose K/V this pass read from the cache, in every layer."""
        width = self.fed_stop if width is None else width
        return slice(0, min(self.fed_start, width) if self.use_cache else 0)
