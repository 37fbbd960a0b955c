"""What speculative decoding adds to a run's plan (`Drafter`: what proposes, and how many tokens a round) and to the
record of each target pass (`Speculation`: what was drafted, accepted and rolled back). Torch-free and Qt-free, as
kvviz.core.records, which carries them."""

from __future__ import annotations

from dataclasses import dataclass

MAX_DRAFT_TOKENS = 64  # the most tokens a drafter may propose a round
MAX_PROMPT_LOOKUP = 8  # the longest n-gram prompt lookup looks up (the CLI, the app and lessons alike)


@dataclass(frozen=True)
class Drafter:
    """What proposes the drafts of a speculative run: prompt lookup of `lookup`-grams (no model), or the draft model
    `model_name`; `k` tokens at most a round."""

    k: int
    lookup: int = 0  # prompt lookup: the longest n-gram it looks up (0: a draft model drafts)
    model_name: str = ""  # a draft model's name ("" for prompt lookup)

    def describe(self) -> str:
        """e.g. 'prompt lookup of 3-grams, 4 drafts a round' or 'draft model kvviz-shakespeare-draft, 4 drafts a
        round'."""
        who = f"prompt lookup of {self.lookup}-grams" if self.lookup else f"draft model {self.model_name}"
        return f"{who}, {self.k} draft{'s' if self.k != 1 else ''} a round"


@dataclass(frozen=True)
class Speculation:
    """One round of speculative decoding, on the record of its target pass. The pass fed the pending token at
    position `start` and the `drafted` tokens after it, [start, start + 1 + len(drafted)); the target agreed with
    the first `accepted` drafts and kept `token_ids` (those, then its own next token); the positions after them were
    written to its cache and rolled back (`rolled_back`). Round 0 is the prompt's pass: it drafts nothing.

    The totals count the run so far, this round included: target passes (rounds), draft model passes, tokens
    drafted, accepted and generated."""

    round: int
    start: int
    drafted: tuple[int, ...]
    drafted_labels: tuple[str, ...]  # one readable label a draft
    accepted: int
    token_ids: tuple[int, ...]
    token_labels: tuple[str, ...]
    draft_passes: int  # the draft model's passes this round (0 for prompt lookup)
    target_passes_total: int
    draft_passes_total: int
    drafted_total: int
    accepted_total: int
    tokens_total: int

    @property
    def rolled_back(self) -> tuple[int, int]:
        """Positions [start, stop) the target's cache was written and cropped back this round (start == stop:
        none)."""
        kept = self.start + 1 + self.accepted
        return kept, self.start + 1 + len(self.drafted)

    @property
    def rolled_back_count(self) -> int:
        return len(self.drafted) - self.accepted

    @property
    def acceptance_rate(self) -> float | None:
        """Drafts accepted out of drafts proposed, so far (None before any draft)."""
        return self.accepted_total / self.drafted_total if self.drafted_total else None

    @property
    def tokens_per_target_pass(self) -> float:
        """Tokens generated a target pass, so far: 1 for plain decoding, up to k + 1."""
        return self.tokens_total / self.target_passes_total if self.target_passes_total else 0.0
