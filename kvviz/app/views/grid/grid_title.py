"""The K/V grid's two-line caption: what the grid shows, and what the latest pass computed and reused."""

from __future__ import annotations

from kvviz.app.theme import Theme
from kvviz.core.records import RunPlan, StepRecord

BROKEN_NOTE = "BROKEN on purpose (teaching switch)"
CACHE_FILL = "cache fill, no new token"


def mode_name(use_cache: bool) -> str:
    return "with cache" if use_cache else "without cache"


def grid_title(plan: RunPlan, record: StepRecord | None, lockstep: str | None, theme: Theme,
               name: str | None = None) -> tuple[str, str]:
    """The caption for `plan` after `record` (None: before the first pass), and, before the first pass,
    the widest caption the run will show (its last pass's numbers), else "". `name` is what compare mode calls
    the run (RunPlan.lockstep_names), where it is not "with cache" or "without cache"."""
    mode = name or mode_name(plan.use_cache)
    if plan.cache_fault:
        mode = f"<span style='color:{theme.alert}'>{mode} \u2014 {BROKEN_NOTE}</span>"
    size = f"{plan.n_layer} layers \u00d7 {plan.width} positions"
    # what the cache keeps, the sinks by position (compare mode against a window names it: "window of 8 + 1 sinks")
    policy = plan.policy
    if policy.importance and plan.use_cache and not (lockstep is not None and plan.against_lossy):
        average = " on average" if policy.evict == "pyramidkv" else ""  # its budget shrinks with depth
        size += f", keeping {policy.budget} a layer{average} by {policy.method_name}"
    elif plan.policy.evicts and plan.use_cache and not (lockstep is not None and plan.against_lossy):
        sinks = plan.policy.sinks
        kept = f", the sinks {0}\u2013{sinks - 1}" if sinks > 1 else ", the sink 0" if sinks else ""
        size += f", keeping the last {plan.policy.window}{kept}"
    # latent attention keeps a latent a position and rebuilds every head's K and V from it each pass
    kept = "latent (K/V rebuilt from it)" if plan.cache_parts else "K/V"
    if lockstep is None:
        head = f"<b>{kept} per layer and position</b> &nbsp; {size}, {mode}"
    else:
        colour = theme.teal if lockstep == "cached" else theme.amber
        # two grids side by side: the short form, so that each title keeps to a line at half the width
        head = f"<b><span style='color:{colour}'>{mode}</span></b> &nbsp; {kept}: {size}"
        if lockstep == "uncached" and not plan.against_lossy:
            head += exact_note(plan)

    def caption(detail: str) -> str:
        return f"{head}<br><span style='color:{theme.muted}'>{detail}</span>"

    if record is None:
        # what the grid shows, never a key to press: the caption goes into exported images too
        ready = f"prompt of {plan.prompt_tokens} tokens ready; step 1 computes their keys and values"
        widest = CACHE_FILL
        if plan.drafter is not None:  # a round's caption: its tokens and drafts, the most a round can have
            k, last = plan.drafter.k, plan.budget
            widest = round_text(plan.passes - 1, last - k, last, k, k)
        return caption(ready), caption(_step(theme, plan.passes, widest, plan.width, plan.n_layer, plan.width))
    what = CACHE_FILL if record.token_id is None else f"token {record.new_tokens}"
    spec = record.speculation
    if spec is not None:
        what = round_text(spec.round, record.new_tokens - len(spec.token_ids) + 1, record.new_tokens,
                          len(spec.drafted), spec.accepted)
    computed = record.fed_stop - record.fed_start
    # measured, the layer that read the most: a window reads fewer, a linear-attention layer none (its state)
    reused = max(record.kv_reused) if record.kv_reused else record.fed_start
    return caption(_step(theme, record.step + 1, what, computed, record.n_layer, reused)), ""


def round_text(number: int, first: int, last: int, drafted: int, accepted: int) -> str:
    """What a round of speculative decoding added: "round 1, tokens 2\u20134: 2 of 4 drafts accepted, 2 rolled
    back"; "round 0, token 1" for the prompt's pass, which drafts nothing."""
    tokens = f"token {last}" if first == last else f"tokens {first}\u2013{last}"
    if not drafted:
        return f"round {number}, {tokens}" + (": nothing drafted" if number else "")
    rejected = drafted - accepted
    return (f"round {number}, {tokens}: {accepted} of {drafted} draft{'s' if drafted != 1 else ''} accepted"
            + (f", {rejected} rolled back" if rejected else ""))


def exact_note(plan: RunPlan) -> str:
    """Compare mode of a model whose layers differ, cached against uncached: why the two are still exact ("" for a
    model whose layers keep alike). A window of the model's own is the model's: both runs attend through it."""
    kinds = {shape.kind for shape in plan.layer_shapes}
    reasons = []
    if "state" in kinds:
        reasons.append("a state layer folds the same keys and values into its state either way")
    if "shared" in kinds:
        reasons.append("a shared layer reads the same source layer's")
    if "window" in kinds:
        reasons.append("both runs attend through the model's own windows")
    return f"; exact: {', '.join(reasons)}" if reasons else ""


def _step(theme: Theme, step: int, what: str, computed: int, n_layer: int, reused: int) -> str:
    amber = f"<span style='color:{theme.amber}'>computed {computed} position{'s' if computed != 1 else ''}</span>"
    teal = f"<span style='color:{theme.teal}'>reused {reused}</span>"
    return f"step {step} ({what}): {amber} \u00d7 {n_layer} layers, {teal}"
