"""What the compare-mode views read from a lockstep record: one token step of both runs."""

from __future__ import annotations

from dataclasses import dataclass

from kvviz.core.records import StepRecord


@dataclass(frozen=True)
class TokenStep:
    """One token step of a lockstep run, as the records give it: both runs' token passes side by side."""

    step: int  # 1-based token step: the primary record's new_tokens
    cached: StepRecord  # the cached run's pass that chose this step's token
    uncached: StepRecord  # the uncached run's pass that chose it
    same: bool  # both runs chose the same token (record.token_id == record.twin_token_id)
    max_abs_logit_diff: float  # the largest |logit difference| of the two passes, as recorded
    logits_agree: bool = True  # the difference lies within the float noise the record names (logit_tolerance)
    logit_tolerance: float = 0.0


def token_step(record: StepRecord) -> TokenStep | None:
    """The token step `record` carries, or None for a pass that carries none (a cache-filling pass
    arriving on its own, a record outside compare mode)."""
    if record.token_id is None or record.max_abs_logit_diff is None or record.twin_token_id is None:
        return None
    cached, uncached = record.lockstep_token_passes()
    return TokenStep(record.new_tokens, cached, uncached, record.token_id == record.twin_token_id,
                     record.max_abs_logit_diff, record.logits_agree is not False, record.logit_tolerance or 0.0)


def format_logit_diff(value: float) -> str:
    """A compact |Δlogit|: "0", "8e-06", "0.25", "4.8", "13"."""
    if value != value:
        return "NaN"
    if value == 0:
        return "0"
    if value < 0.01:
        return f"{value:.0e}"
    if value < 10:
        return f"{value:.2g}"
    return f"{value:.0f}"
