"""Speculative decoding against plain cached decoding of the same target, timed in turns in one process, with the
tokens checked identical (greedy)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from kvviz.core.errors import KvvizError

if TYPE_CHECKING:
    from kvviz.engine.engine import Engine

SPECULATIVE_REPEAT = 5  # turns of each by default: the fastest of each is kept


def _timed(engine: Engine, prompt_ids: list[int], new_tokens: int, fields: dict) -> tuple[list[int], float, list]:
    from kvviz.core.records import RunRequest
    from kvviz.engine.run import start_run

    started = time.perf_counter()
    records = list(start_run(engine, RunRequest(0, "", True, new_tokens, **fields), prompt_ids=prompt_ids,
                             top_candidates=1).passes())
    seconds = time.perf_counter() - started
    tokens = [t for r in records for t in (r.speculation.token_ids if r.speculation is not None else
                                           (() if r.token_id is None else (r.token_id,)))]
    return tokens, seconds, records


def run_speculative_bench(engine: Engine, prompt: str, new_tokens: int, fields: dict, repeat: int | None = None,
                          model_name: str = "") -> dict:
    """Plain cached decoding and speculative decoding with the drafter of `fields` (RunRequest's draft_tokens,
    prompt_lookup, draft_model), `repeat` turns each, alternating; the fastest of each, their ratio, and the
    speculative run's acceptance. KvvizError where the two runs' tokens differ."""
    repeat = repeat or SPECULATIVE_REPEAT
    prompt_ids = engine.encode_prompt(prompt)
    engine.warm_up()
    if engine.draft is not None:
        engine.draft.warm_up()
    _timed(engine, prompt_ids, min(new_tokens, 8), fields)  # the verifying pass's shapes, once, untimed
    plain_times, fast_times = [], []
    plain_tokens = fast_tokens = records = None
    for _ in range(repeat):
        plain_tokens, seconds, _ = _timed(engine, prompt_ids, new_tokens, {})
        plain_times.append(seconds)
        fast_tokens, seconds, records = _timed(engine, prompt_ids, new_tokens, fields)
        fast_times.append(seconds)
    if plain_tokens != fast_tokens:
        first = next((i for i, (a, b) in enumerate(zip(plain_tokens, fast_tokens, strict=False)) if a != b),
                     min(len(plain_tokens), len(fast_tokens)))
        raise KvvizError(f"speculative decoding's tokens part from plain decoding's at token {first + 1}: a bug")
    last = records[-1].speculation
    plain, fast = min(plain_times), min(fast_times)
    n = len(plain_tokens)
    return {
        "model": model_name or engine.model.config.name,
        "prompt": prompt,
        "prompt_tokens": len(prompt_ids),
        "new_tokens": n,
        "repeat": repeat,
        "tokens_identical": True,
        "plain_seconds": round(plain, 4),
        "speculative_seconds": round(fast, 4),
        "plain_tokens_per_second": round(n / plain, 2),
        "speculative_tokens_per_second": round(n / fast, 2),
        "speedup": round(plain / fast, 3),
        "plain_seconds_each": [round(t, 4) for t in plain_times],
        "speculative_seconds_each": [round(t, 4) for t in fast_times],
        "drafter": records[0].speculation and _describe(fields),
        "target_passes": last.target_passes_total,
        "plain_target_passes": n,
        "draft_passes": last.draft_passes_total,
        "drafted": last.drafted_total,
        "accepted": last.accepted_total,
        "acceptance_rate": None if last.acceptance_rate is None else round(last.acceptance_rate, 4),
        "tokens_per_target_pass": round(last.tokens_per_target_pass, 3),
    }


def _describe(fields: dict) -> str:
    from kvviz.core.speculation import Drafter

    return Drafter(fields["draft_tokens"], fields["prompt_lookup"], fields["draft_model"]).describe()


def format_report(result: dict) -> str:
    rate = result["acceptance_rate"]
    return "\n".join([
        f"{result['model']}: {result['new_tokens']} tokens after a prompt of {result['prompt_tokens']}, the fastest of "
        f"{result['repeat']} turns each, taken in turns",
        f"plain cached:  {result['plain_tokens_per_second']:>8.1f} tokens/s  ({result['plain_seconds']:.3f} s, "
        f"{result['plain_target_passes']} target passes)",
        f"speculative:   {result['speculative_tokens_per_second']:>8.1f} tokens/s  ({result['speculative_seconds']:.3f}"
        f" s, {result['target_passes']} target passes, {result['draft_passes']} draft passes)",
        f"speedup: {result['speedup']:.2f}x with {result['drafter']}; {result['accepted']} of {result['drafted']} "
        f"drafts accepted{'' if rate is None else f' ({rate:.0%})'}, {result['tokens_per_target_pass']:.2f} tokens "
        f"a target pass; the tokens are identical",
    ])
