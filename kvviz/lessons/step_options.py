"""A lesson step's optional ways of running: speculative decoding (`draft_tokens` with a drafter) and eviction by
importance (`evict` with a `budget`), each read from the step's TOML table and checked against the rest of it.
Torch-free and Qt-free."""

from __future__ import annotations

from kvviz.core.policy import EVICTION_METHODS, SNAP_METHODS
from kvviz.core.speculation import MAX_DRAFT_TOKENS, MAX_PROMPT_LOOKUP
from kvviz.lessons.errors import LessonError
from kvviz.lessons.questions import EVICTION_QUESTIONS, SPECULATIVE_QUESTIONS

MAX_POOL = 63  # SnapKV's pooling width, at most (as Run > Evict by importance takes it)


def parse_drafter(item: dict, source: str, where: str) -> dict:
    """A step's speculative decoding: `draft_tokens` a round with one drafter, `prompt_lookup` or `draft_model`, on
    the cached run alone (the engine refuses compare mode with it); {} for plain decoding."""
    k, lookup, model = item.get("draft_tokens", 0), item.get("prompt_lookup", 0), item.get("draft_model", "")
    if not (k or lookup or model):
        if item.get("question") in SPECULATIVE_QUESTIONS:
            raise LessonError(f"{source}: {where}question: {item['question']} asks about drafts: give draft_tokens "
                              "and a drafter too")
        return {}
    if not 1 <= k <= MAX_DRAFT_TOKENS:
        raise LessonError(f"{source}: {where}draft_tokens: {k} is not from 1 to {MAX_DRAFT_TOKENS} (speculative "
                          "decoding drafts that many tokens a round)")
    if bool(lookup) == bool(model):
        raise LessonError(f"{source}: {where}draft_tokens: give one drafter, prompt_lookup or draft_model")
    if lookup and not 1 <= lookup <= MAX_PROMPT_LOOKUP:
        raise LessonError(f"{source}: {where}prompt_lookup: {lookup} is not from 1 to {MAX_PROMPT_LOOKUP}")
    if item["cache"] is not True:
        raise LessonError(f"{source}: {where}cache: speculative decoding checks drafts against the cache, on its "
                          "own: cache = true")
    return {"draft_tokens": k, "prompt_lookup": lookup, "draft_model": model}


def parse_eviction(item: dict, source: str, where: str, max_positions: int) -> dict:
    """A step's eviction by importance: `evict` (a key of EVICTION_METHODS) keeping `budget` positions a layer, and
    SnapKV's and PyramidKV's `observe` and `pool` (0: the engine's defaults); one trade-off at a time, as the engine
    takes them (no window, no quantized cache, no speculative decoding beside it); {} for none."""
    method, budget = item.get("evict", ""), item.get("budget", 0)
    observe, pool = item.get("observe", 0), item.get("pool", 0)
    if not method:
        for key in ("budget", "observe", "pool"):
            if key in item:
                raise LessonError(f"{source}: {where}{key}: goes with evict (an importance method): give evict too")
        if item.get("question") in EVICTION_QUESTIONS:
            raise LessonError(f"{source}: {where}question: {item['question']} asks about eviction by importance: "
                              "give evict and budget too")
        return {}
    if method not in EVICTION_METHODS:
        raise LessonError(f"{source}: {where}evict: expected one of {', '.join(EVICTION_METHODS)}, got "
                          f"{method!r}"[:300])
    if not 1 <= budget <= max_positions:
        raise LessonError(f"{source}: {where}budget: {budget} is not from 1 to {max_positions} (the positions a "
                          "layer keeps; give it with evict)")
    for key, value, most in (("observe", observe, budget - 1), ("pool", pool, MAX_POOL)):
        if value and method not in SNAP_METHODS:
            raise LessonError(f"{source}: {where}{key}: goes with snapkv or pyramidkv, not {method}")
        if not 0 <= value <= most:
            raise LessonError(f"{source}: {where}{key}: {value} is not from 0 to {most}")
    for key in ("window", "kv_dtype", "draft_tokens"):
        if item.get(key):
            raise LessonError(f"{source}: {where}{key}: a step that evicts by importance takes no {key} beside it "
                              "(one trade-off at a time)")
    return {"evict": method, "budget": budget, "observe": observe, "pool": pool}
