"""The perplexity questions of a lesson: which cache policies each measures on the shipped held-out text, and the
answer they make. The measuring itself (torch, kvviz.measure.quality) is the caller's: the app's lesson mode in the
background, `kvviz lesson --export` before its slides (kvviz.app.export.slides.measure_perplexities); this module
says what to measure and what the measurements answer, and imports neither torch nor Qt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kvviz.core.policy import CachePolicy

PERPLEXITY_TOKENS = 128  # the held-out tokens a question measures: seconds on a laptop's CPU, one token a pass
FULL_CACHE = "full cache"


class LessonStep(Protocol):
    """What these questions read of a step (kvviz.lessons.lesson.LessonStep, which imports this module)."""

    question: str | None
    window: int
    sinks: int
    evict: str
    budget: int

    def eviction_fields(self) -> dict: ...


@dataclass(frozen=True)
class PolicyRun:
    """One measurement of a perplexity question: a cache policy (the keyword arguments of Engine.policy) and what
    the answer calls it."""

    label: str
    policy: tuple[tuple[str, object], ...]  # (name, value) pairs of Engine.policy's keywords

    @property
    def fields(self) -> dict:
        return dict(self.policy)


@dataclass(frozen=True)
class Perplexities:
    """A perplexity question's measured answer: each policy's perplexity on the first `tokens` tokens of the
    held-out text, in the order of `perplexity_runs`; the number asked for is the first's over the second's."""

    tokens: int
    measured: tuple[tuple[str, float], ...]  # (label, perplexity)

    @property
    def ratio(self) -> float:
        return self.measured[0][1] / self.measured[1][1]

    def describe(self) -> str:
        """'1.10x (window 122.6, H2O 111.6, full cache 105.2)': the ratio, then each perplexity."""
        each = ", ".join(f"{label} {value:.1f}" for label, value in self.measured)
        return f"{self.ratio:.2f}x ({each})"


def perplexity_runs(step: LessonStep) -> tuple[PolicyRun, ...]:
    """What `step`'s perplexity question measures, the two policies it compares first:
    window_vs_importance_perplexity: a sliding window of the step's budget, the step's importance method at that
    budget, and the full cache for reference; sink_perplexity_ratio: a plain window of the step's window plus sinks
    (the same positions a layer), and the step's window with its sinks."""
    if step.question == "window_vs_importance_perplexity":
        method = CachePolicy(evict=step.evict, budget=step.budget).method_name
        return (PolicyRun("window", (("window", step.budget),)),
                PolicyRun(method, tuple(step.eviction_fields().items())),
                PolicyRun(FULL_CACHE, ()))
    if step.question == "sink_perplexity_ratio":
        positions = step.window + step.sinks
        return (PolicyRun("window", (("window", positions),)),
                PolicyRun("with sinks", (("window", step.window), ("sinks", step.sinks))))
    raise ValueError(f"{step.question!r} is not a perplexity question")


def question_values(step: LessonStep) -> dict:
    """The values a question's words name ({method}, {budget}, {sinks}, {positions})."""
    method = CachePolicy(evict=step.evict, budget=step.budget).method_name if step.evict else ""
    return {"method": method, "budget": step.budget, "sinks": step.sinks, "positions": step.window + step.sinks}
