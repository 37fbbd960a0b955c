"""Generation as a stream of frozen step records, one per forward pass, with and without a KV cache."""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator, Sequence

import torch

from kvviz.cache.kv_cache import KVCache, build_cache, pass_cache
from kvviz.cache.probe import PassProbe
from kvviz.core.counting import kv_with_cache, kv_without_cache
from kvviz.core.errors import GenerationError
from kvviz.core.records import (
    BROKEN_CACHE_FAULT,
    EXACT,
    AttentionWeights,
    CachePolicy,
    Candidate,
    RunPlan,
    RunRequest,
    StepRecord,
    describe_sampling,
)
from kvviz.core.tokenizer import Tokenizer, get_tokenizer
from kvviz.engine.policies import one_token_read, run_policy
from kvviz.engine.sampling import SamplingSettings, choose, sampling_generator
from kvviz.engine.speculative import check_drafter, speculative_passes
from kvviz.engine.threads import ThreadChooser
from kvviz.models.cache_shape import run_cache_shape
from kvviz.models.families import family_of

FAULT_REFUSALS = {  # why Break the cache cannot plant its bug in a layer of each kind but "full"
    "window": "Break the cache plants its bug in a full cache; turn the window off first",
    "latent": "Break the cache plants its bug in a per-head cache, not a latent one (MLA)",
    "quantized": "Break the cache plants its bug in an exact cache; store it in full precision first",
}



def fault_refusal(name: str, unfit: list[str], policy: CachePolicy) -> str:
    """Why Break the cache cannot plant its bug in a cache whose layers include `unfit` kinds under `policy`."""
    if policy.window or policy.kv_dtype or unfit[0] == "latent":  # a trade-off of the run's, or MLA's cache
        return FAULT_REFUSALS[unfit[0]]
    return (f"Break the cache plants its bug in a model whose every layer keeps a full cache; {name}'s layers "
            f"differ ({', '.join(dict.fromkeys(unfit))} layers)")


__all__ = ["Candidate", "Engine", "GenerationError", "RunPlan", "SamplingSettings", "StepRecord", "generate_ids"]


_WARMED_MODELS: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # models an engine has warmed up


class Engine:
    """Runs a model of any family (kvviz.models.families) and owns its KV cache; `generate` yields a StepRecord
    per forward pass. One-token cached steps take the family's fast decode where it has one."""

    def __init__(self, model: torch.nn.Module, tokenizer: Tokenizer | None = None,
                 device: str | torch.device = "cpu") -> None:
        self.model = model.eval()
        self.fast = family_of(model).fast
        self.tokenizer = tokenizer or get_tokenizer()
        self.device = torch.device(device)
        self._warm = False
        # Called before every block of every pass with the block's index: a way to stop a long pass from
        # another thread (it raises), as the app's worker does when the window closes.
        self.before_block: Callable[[int], None] | None = None
        self.draft: Engine | None = None  # the draft model's engine, for a run that decodes speculatively with it

    @property
    def n_ctx(self) -> int:
        return self.model.config.n_ctx

    @property
    def dtype(self) -> torch.dtype:
        """The number type of the weights and the cache."""
        return next(self.model.parameters()).dtype

    def warm_up(self, tokens: int = 4) -> None:
        """Run each kind of pass once, untimed, so that no timed pass pays a one-time cost (kernel set-up, weight
        packing, first allocations): a prefill, cached one-token steps, and uncached passes. Only the first call
        for a model does anything: what it prepares stays with the model and the process, whatever engine runs."""
        if self._warm or self.model in _WARMED_MODELS:
            self._warm = True
            return
        prompt_tokens = max(1, min(tokens, self.n_ctx // 2))
        new_tokens = max(1, min(tokens, self.n_ctx - prompt_tokens))
        for use_cache in (True, False):
            for _ in self.run(self.plan(RunRequest(0, "", use_cache, new_tokens), [0] * prompt_tokens),
                              top_candidates=1):
                pass
        self._warm = True
        _WARMED_MODELS.add(self.model)

    def encode_prompt(self, prompt: str) -> list[int]:
        """Prompt ids; an empty prompt starts from <|endoftext|>."""
        ids = self.tokenizer.encode(prompt) if prompt else [self.tokenizer.eot_id]
        if len(ids) > self.n_ctx:
            raise GenerationError(f"the prompt has {len(ids)} tokens but the model's context holds {self.n_ctx}")
        if len(ids) == self.n_ctx:
            raise GenerationError(f"the prompt fills the model's whole context ({self.n_ctx} tokens); shorten it")
        return ids

    def _new_cache(self, capacity: int, fault: str = "", policy: CachePolicy = EXACT) -> KVCache:
        """The cache of a run: one layer cache of the kind the model's family asks for under `policy`, a layer."""
        return build_cache(self.model.config.cache_layers(policy), capacity, dtype=self.dtype, device=self.device,
                           fault=fault)

    def forward(self, idx: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache | None, probe: PassProbe,
                weights: object = None) -> torch.Tensor:
        """Logits (B, V) of the last position of each row of `idx` (B, T): through the family's fast file where it
        has one (every kind of pass on the same products, checked against the teaching file), else the teaching
        model. `weights` are the fast file's `decode_weights`, gathered once per run."""
        if self.fast is not None:
            return self.fast.forward(self.model, idx, positions, kv_cache, weights, probe)
        return self.model(idx, positions, kv_cache, last_only=True, probe=probe)[:, -1]

    def choose(
        self, logits: torch.Tensor, sampling: SamplingSettings, generator: torch.Generator | None, top: int
    ) -> tuple[int, tuple[Candidate, ...]]:
        """The next token from `logits` (V,) and the `top` likeliest candidates (kvviz.engine.sampling.choose)."""
        return choose(logits, sampling, generator, top, self.tokenizer,
                      f"{self.model.config.name}: the model's logits hold NaN or infinite values in "
                      f"{str(self.dtype).removeprefix('torch.')}; its output means nothing")

    def plan(self, request: RunRequest, prompt_ids: Sequence[int] | None = None, model_name: str = "",
             policy: CachePolicy | None = None) -> RunPlan:
        """Check `request` now (GenerationError) and plan it: budget, passes, frames.

        The prompt is `request.prompt` encoded, or `prompt_ids` where the caller has ids of its own (their text:
        `request.prompt`, or the ids decoded). `request.break_cache` breaks a cached run's cache on purpose; with
        `request.attention` every record carries its newest query's AttentionWeights; `request.window` keeps the
        last that many positions (0: the model's own sliding window, if it has one), `request.sinks` the first ones
        too, and every pass attends to what that keeps, with the cache or without it; `request.kv_dtype` (a key of
        KV_DTYPES) stores the cache's keys and values quantized. `policy`, given, is taken as it is (compare mode's
        exact twin: EXACT keeps every position, even on a model with a window of its own)."""
        prompt_ids = self.encode_prompt(request.prompt) if prompt_ids is None else list(prompt_ids)
        sampling = SamplingSettings(request.temperature, request.top_k, request.seed)
        max_new_tokens, use_cache, run_id, attention = (request.max_new_tokens, request.use_cache, request.run_id,
                                                         request.attention)
        cache_fault = BROKEN_CACHE_FAULT if request.break_cache else ""
        policy = self.policy(request.window, request.sinks, request.kv_dtype, request.evict, request.budget,
                             request.observe, request.pool, request.kv_layout, request.kv_residual) \
            if policy is None else policy
        unfit = [kind.kind for kind in self.model.config.cache_layers(policy) if kind.kind != "full"]
        if cache_fault and unfit:
            raise GenerationError(fault_refusal(self.model.config.name, unfit, policy))
        if max_new_tokens <= 0:
            raise GenerationError(f"max new tokens must be a positive integer, got {max_new_tokens}")
        drafter = check_drafter(self, request, policy)
        P = len(prompt_ids)
        if P == 0:
            raise GenerationError("the prompt has no tokens")
        if P >= self.n_ctx:
            raise GenerationError(f"the prompt has {P} tokens but the model's context holds {self.n_ctx}")
        vocab_size = self.model.config.vocab_size
        outside = [i for i in prompt_ids if not 0 <= i < vocab_size]
        if outside:
            raise GenerationError(
                f"prompt token {outside[0]} is outside the model's vocabulary of {vocab_size} tokens"
            )
        streams = policy.sinks > 0 and self.model.config.sinks_stream  # positions counted within the cache
        budget = max_new_tokens if streams else min(max_new_tokens, self.n_ctx - P)
        cfg = self.model.config
        return RunPlan(
            prompt=request.prompt or self.tokenizer.decode(prompt_ids),
            prompt_ids=tuple(prompt_ids),
            prompt_labels=tuple(self.tokenizer.token_label(i) for i in prompt_ids),
            model_name=model_name or self.model.config.name,
            n_layer=self.model.config.n_layer,
            n_ctx=self.n_ctx,
            use_cache=use_cache,
            max_new_tokens=max_new_tokens,
            budget=budget,
            passes=budget + 1 if use_cache and drafter is None else budget,  # speculative: at most one a token
            width=P + budget,
            final_with_cache=kv_with_cache(P, budget),
            final_without_cache=kv_without_cache(P, budget),
            cache_bytes_per_position=self._bytes_per_position(policy) if use_cache else 0,
            cache_shape=run_cache_shape(cfg, policy, model_name or cfg.name) if use_cache else None,
            cache_precision=self.cache_precision(policy) if use_cache else "",
            stop_reason="max_new_tokens" if budget == max_new_tokens else "context_full",
            sampling=describe_sampling(sampling.temperature, sampling.top_k, sampling.seed),
            run_id=run_id,
            cache_fault=cache_fault if use_cache else "",
            attention=attention,
            n_head=cfg.n_head,
            n_kv_head=cfg.n_kv_head,
            head_dim=cfg.head_dim,
            dtype_bytes=torch.finfo(self.dtype).bits // 8,
            policy=policy,
            cache_parts=cfg.cache_parts,
            head_key_value=cfg.head_key_value,
            layer_shapes=run_cache_shape(cfg, policy).layer_shapes,
            drafter=drafter,
        )

    def _bytes_per_position(self, policy: CachePolicy) -> int:
        """Bytes the cache of a run under `policy` takes a position, over all layers: what the family states
        (kvviz.models.cache_shape), in the cache's precision."""
        return run_cache_shape(self.model.config, policy).bytes_per_token(self.cache_precision(policy))

    def cache_precision(self, policy: CachePolicy) -> str:
        """What a cache under `policy` stores its numbers in: a quantized type, or the weights' ("float32")."""
        return policy.kv_dtype or str(self.dtype).removeprefix("torch.")

    def policy(self, window: int = 0, sinks: int = 0, kv_dtype: str = "", evict: str = "", budget: int = 0,
               observe: int = 0, pool: int = 0, kv_layout: str = "", kv_residual: int = 0) -> CachePolicy:
        """The cache policy of a run (kvviz.engine.policies.run_policy; GenerationError for values no run can use)."""
        return run_policy(self.model.config, self.n_ctx, window, sinks, kv_dtype, evict, budget, observe, pool,
                          kv_layout, kv_residual)

    def generate(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        use_cache: bool = True,
        sampling: SamplingSettings | None = None,
        top_candidates: int = 5,
    ) -> Iterator[StepRecord]:
        """Check the request now (GenerationError), then return its records, one per forward pass."""
        s = sampling or SamplingSettings()
        plan = self.plan(RunRequest(0, "", use_cache, max_new_tokens, s.temperature, s.top_k, s.seed), prompt_ids)
        return self.run(plan, s, top_candidates)

    def run(
        self,
        plan: RunPlan,
        sampling: SamplingSettings | None = None,
        top_candidates: int = 5,
        watch_logits: Callable[[torch.Tensor], None] | None = None,
    ) -> Iterator[StepRecord]:
        """Yield one StepRecord per forward pass of `plan` (from `plan`), generating `plan.budget` tokens; a plan
        with a drafter decodes speculatively (kvviz.engine.speculative), a record a target pass. Stops cleanly at
        the context length: the final record says so in `stop_reason`. A cached run's KV cache lives as long as the
        run. `watch_logits` sees the logits (V,) of every plain pass that chooses a token, before the choice; it
        must not keep them (they may be a buffer the next pass overwrites)."""
        if plan.drafter is not None:
            yield from speculative_passes(self, plan, sampling or SamplingSettings(), top_candidates)
            return
        cache = self._new_cache(plan.width, plan.cache_fault, plan.policy) if plan.use_cache else None
        yield from self._passes(plan, cache, sampling or SamplingSettings(), top_candidates, watch_logits)

    @torch.inference_mode()  # around each pass only: the caller is back in its own mode between records
    def _passes(
        self,
        plan: RunPlan,
        cache: KVCache | None,
        sampling: SamplingSettings,
        top_candidates: int,
        watch_logits: Callable[[torch.Tensor], None] | None,
    ) -> Iterator[StepRecord]:
        P, budget, use_cache, stop_reason = plan.prompt_tokens, plan.budget, plan.use_cache, plan.stop_reason
        record_attention = plan.attention
        generator = sampling_generator(sampling, self.device)

        model = self.model
        n_layer = model.config.n_layer
        tokens = list(plan.prompt_ids)
        fast = self.fast
        decode_weights = fast.decode_weights(model) if fast is not None else None
        one_token_fast = fast is not None and use_cache and one_token_read(plan.policy, record_attention)
        uncached = None if use_cache else pass_cache(model.config.cache_layers(plan.policy), P)
        computed_total = reused_total = without_total = 0
        step = 0
        threads = ThreadChooser()
        while True:
            generated = len(tokens) - P
            flush = use_cache and generated == budget
            if generated == budget and not use_cache:
                return
            if use_cache:
                fed_start = cache.length
            else:
                fed_start = 0
            fed_stop = len(tokens)
            fed = tokens[fed_start:fed_stop]
            probe = PassProbe(n_layer, record_attention, self.before_block)
            attention = None
            started = time.perf_counter()
            one_token = one_token_fast and len(fed) == 1
            if one_token:
                threads.threads()  # the count this machine runs a step fastest on now (kvviz.engine.threads)
                try:
                    logits = fast.decode_one(model, fed[0], fed_start, cache, decode_weights, probe)[0]  # (V,)
                finally:
                    threads.restore()
            else:
                idx = torch.tensor([fed], dtype=torch.long, device=self.device)  # (1, T)
                positions = torch.arange(fed_start, fed_stop, device=self.device)  # (T,)
                through = cache if use_cache else uncached  # an uncached pass under a window: masked as it says
                logits = self.forward(idx, positions, through, probe, decode_weights)[0]  # (V,)
            if record_attention:
                attention = _attention_weights(probe.attention, fed_stop, probe.sink_shares)
            if flush:
                token, candidates = None, ()
            else:
                token, candidates = self.choose(logits, sampling, generator, top_candidates)
            seconds = time.perf_counter() - started
            if one_token:
                threads.took(seconds)
            if watch_logits is not None and not flush:
                watch_logits(logits)  # outside the timed span
            computed = tuple(probe.kv_rows)
            reused = cache.reused if use_cache else (0,) * n_layer  # rows the cache gave back, measured
            computed_total += computed[0]
            reused_total += reused[0]
            if token is not None:
                tokens.append(token)
                without_total += fed_stop
            new_tokens = len(tokens) - P
            final = flush or (not use_cache and new_tokens == budget)
            yield StepRecord(
                step=step,
                use_cache=use_cache,
                prompt_tokens=P,
                fed_start=fed_start,
                fed_stop=fed_stop,
                fed_token_ids=tuple(fed),
                kv_computed=computed,
                kv_reused=reused,
                token_id=token,
                token_text="" if token is None else self.tokenizer.token_label(token),
                candidates=candidates,
                new_tokens=new_tokens,
                sequence_length=len(tokens),
                seconds=seconds,
                kv_computed_total=computed_total,
                kv_reused_total=reused_total,
                with_cache_total=computed_total if use_cache else len(tokens) - (0 if final else 1),
                without_cache_total=without_total if use_cache else computed_total,
                cache_bytes=cache.bytes_used if cache is not None else 0,
                n_layer=n_layer,
                final=final,
                stop_reason=stop_reason if final else "",
                kv_written=cache.last_written if cache is not None else None,
                attention=attention,
                kv_evicted=cache.evicted if cache is not None else (0, 0),
                positions_held=cache.positions_held if cache is not None else 0,
                layer_positions_held=cache.layer_positions_held if cache is not None else (),
                layer_capacity=cache.layer_limits if cache is not None else (),
                cache_precision=plan.cache_precision,
                layer_bytes=cache.layer_bytes if cache is not None else (),
                windowed=use_cache and plan.policy.evicts,
                lossy=use_cache and plan.policy.lossy,
                eviction=(cache if use_cache else uncached).eviction if plan.policy.importance else None,
            )
            step += 1
            if final:
                return


def _attention_weights(rows: list[torch.Tensor] | None, positions: int,
                       sink_shares: list[torch.Tensor] = ()) -> AttentionWeights:
    """The layers' rows, (nh, S) each with S == `positions`, as one AttentionWeights, with the learned sinks'
    shares (nh,) a layer where the model has them."""
    if not rows:
        raise RuntimeError("the model recorded no attention weights")
    weights = torch.stack(rows).to(device="cpu", dtype=torch.float32).contiguous()  # (L, nh, S)
    layers, heads, recorded = weights.shape
    if recorded != positions:
        raise RuntimeError(f"the model recorded attention over {recorded} positions, not {positions}")
    if sink_shares and len(sink_shares) != layers:
        raise RuntimeError(f"the model recorded {len(sink_shares)} layers' sink shares, not {layers}")
    sinks = torch.stack(sink_shares).float().cpu().contiguous().numpy().tobytes() if sink_shares else b""
    return AttentionWeights(layers, heads, positions, weights.numpy().tobytes(), sinks)


def generate_ids(
    engine: Engine,
    prompt_ids: list[int],
    max_new_tokens: int,
    use_cache: bool = True,
    sampling: SamplingSettings | None = None,
) -> tuple[list[int], list[StepRecord]]:
    """Run a whole generation; return the new token ids and every record."""
    records = list(engine.generate(prompt_ids, max_new_tokens, use_cache, sampling, top_candidates=1))
    ids = [r.token_id for r in records if r.token_id is not None]
    return ids, records
