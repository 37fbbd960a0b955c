"""Run > Speculative decoding (D): on or off, the drafter (prompt lookup of n-grams, or the embedded draft model) and
k, the tokens drafted a round; applying it restarts the run up to the same token, as any run setting does."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QWidget,
)

from kvviz.app.window.dialog_form import settings_form, spin
from kvviz.core.records import RunRequest
from kvviz.core.resources import embedded_model_dir
from kvviz.core.speculation import MAX_DRAFT_TOKENS, MAX_PROMPT_LOOKUP

DRAFT_MODEL = "kvviz-shakespeare-draft"  # the embedded draft model: kvviz-shakespeare's tokenizer, 2 layers


def draft_source() -> str:
    """The source of the embedded draft model: its shipped weights, or untrained weights of its shape while a
    checkout has none (they draft the same way, badly)."""
    try:
        shipped = (embedded_model_dir(DRAFT_MODEL) / "model.safetensors").is_file()
    except FileNotFoundError:
        shipped = False
    return DRAFT_MODEL if shipped else f"random:{DRAFT_MODEL}"


@dataclass(frozen=True)
class SpeculativeChoice:
    """What Run > Speculative decoding asks for: `on`, `k` drafts a round, drafted by prompt lookup of up to
    `lookup`-grams or (`by_model`) by the draft model `model` (a source: the embedded draft's by default)."""

    on: bool = False
    k: int = 4
    lookup: int = 3
    by_model: bool = False
    model: str = field(default_factory=draft_source)

    def request_fields(self) -> dict:
        """The RunRequest fields of this choice (zeros when off: plain decoding)."""
        if not self.on:
            return {"draft_tokens": 0, "prompt_lookup": 0, "draft_model": ""}
        return {"draft_tokens": self.k, "prompt_lookup": 0 if self.by_model else self.lookup,
                "draft_model": self.model if self.by_model else ""}

    def of_request(self, request: RunRequest) -> SpeculativeChoice:
        """This choice as `request` decodes (a refused change taken back): its drafter when it has one, else off
        with the drafter and k kept for the next time it is turned on."""
        if not request.draft_tokens:
            return replace(self, on=False)
        if request.draft_model:
            return replace(self, on=True, k=request.draft_tokens, by_model=True, model=request.draft_model)
        return replace(self, on=True, k=request.draft_tokens, by_model=False, lookup=request.prompt_lookup)


class SpeculativeDialog(QDialog):
    """Asks for a SpeculativeChoice, starting from `choice`; `chosen()` gives it once accepted."""

    def __init__(self, choice: SpeculativeChoice, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Speculative decoding")
        self._choice = choice
        self.on_check = QCheckBox("Decode speculatively")
        self.on_check.setChecked(choice.on)
        self.drafter_combo = QComboBox()  # (radio buttons had no clear mark in the dark theme's style sheet)
        self.drafter_combo.addItem("prompt lookup (no model): what followed the text's last n tokens before")
        self.drafter_combo.addItem(f"the draft model {choice.model} (the same tokenizer, 2 layers)")
        self.drafter_combo.setCurrentIndex(int(choice.by_model))
        self.lookup_spin = spin(1, MAX_PROMPT_LOOKUP, choice.lookup)
        self.lookup_spin.setToolTip("Prompt lookup tries the last n tokens, then n - 1, ... down to 1")
        self.k_spin = spin(1, MAX_DRAFT_TOKENS, choice.k)
        self.k_spin.setToolTip("Tokens the drafter proposes a round; the model checks them all in one pass")
        settings_form(self, "A cheap drafter guesses the next k tokens; the model checks every guess in one pass, "
                      "keeps the longest run it agrees with and its own next token, and crops the rolled-back "
                      "guesses out of its KV cache. The text is the same as plain greedy decoding, in fewer passes "
                      "of the model. It needs the KV cache, and runs without compare mode and Break the cache.",
                      (self.on_check, ("drafter", self.drafter_combo), ("prompt lookup's n (tokens)", self.lookup_spin),
                       ("draft tokens a round, k", self.k_spin)))
        self.on_check.toggled.connect(self._show_enabled)
        self.drafter_combo.currentIndexChanged.connect(self._show_enabled)
        self._show_enabled()

    @property
    def by_model(self) -> bool:
        return self.drafter_combo.currentIndex() == 1

    def _show_enabled(self) -> None:
        on = self.on_check.isChecked()
        for widget in (self.drafter_combo, self.k_spin):
            widget.setEnabled(on)
        self.lookup_spin.setEnabled(on and not self.by_model)

    def chosen(self) -> SpeculativeChoice:
        return replace(self._choice, on=self.on_check.isChecked(), k=self.k_spin.value(),
                       lookup=self.lookup_spin.value(), by_model=self.by_model)
