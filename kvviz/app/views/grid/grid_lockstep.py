"""Which run a K/V grid shows: the records it is given, or one run ("cached" or "uncached") of a compare-mode
lockstep; and what its title says while it shows none."""

from __future__ import annotations

from collections.abc import Sequence

from kvviz.app.views.grid.grid_title import mode_name
from kvviz.core.records import RunPlan, StepRecord

LOCKSTEP_RUNS = ("cached", "uncached")  # which run of a compare-mode lockstep a grid can show


def check_lockstep(lockstep: str | None) -> None:
    """Raise ValueError unless `lockstep` is None (the records given) or one of LOCKSTEP_RUNS."""
    if lockstep is not None and lockstep not in LOCKSTEP_RUNS:
        raise ValueError(f"lockstep must be one of {LOCKSTEP_RUNS} or None, got {lockstep!r}")


def lockstep_plan(plan: RunPlan, lockstep: str | None) -> RunPlan | None:
    """The plan of the run shown: `plan` itself, or that run of its compare twin (None for a plan without one)."""
    if lockstep is None:
        return plan
    if plan.twin is None:
        return None
    return plan.cached_plan if lockstep == "cached" else plan.uncached_plan


def lockstep_passes(record: StepRecord, lockstep: str | None) -> Sequence[StepRecord]:
    """The forward passes of the run shown in `record`: the record itself, or that run's passes of its step."""
    if lockstep is None:
        return (record,)
    return record.lockstep_passes()[LOCKSTEP_RUNS.index(lockstep)]


def waiting_title(lockstep: str | None) -> str:
    """The title of a grid before its first run."""
    return "K/V cache: no run yet" if lockstep is None else f"{mode_name(lockstep != 'uncached')}: no compare run"


def no_twin_title(lockstep: str | None, muted: str) -> str:
    """The title of a lockstep grid given a plan without a twin (outside compare mode), `muted` its colour."""
    return (f"<b>{mode_name(lockstep != 'uncached')}</b> &nbsp; <span style='color:{muted}'>"
            "no compare run: this grid shows one run of compare mode</span>")
