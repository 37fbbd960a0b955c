"""The status line: model, precision, cache mode, sampling, progress and the latest step's measured time."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.live_label import LiveLabel
from kvviz.core.records import RunPlan, StepRecord


class StatusLine(LiveLabel):
    """A view (views.base.RunViewProtocol) for the status bar: the run's line, or a message.

    `show_message` says something else (loading, a cancelled download...): a sticky message stays
    until the next plan (`reset`) or `show_run`; any other gives way to the run's next record.
    While the status bar is hidden (presenter mode) it takes the records without drawing them, and
    draws the latest when it shows again. `set_precision` gives the loaded model's number type.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("No model", parent, rich=False)
        self._plan: RunPlan | None = None
        self._record: StepRecord | None = None
        self._dirty = False
        self._sticky = False
        self._theme = themes.current()
        self._style_sheet = ""
        self._precision = ""

    def show_message(self, text: str, sticky: bool = True) -> None:
        """Say `text` instead of the run's line (see the class)."""
        self._dirty, self._sticky = False, sticky
        self.setText(text)

    def show_run(self) -> None:
        """The run's line again, after a message; nothing changes when no run is planned."""
        self._sticky = False
        self._dirty = self._plan is not None
        self.refresh()

    def set_precision(self, dtype: str) -> None:
        """The number type of the weights and the cache the run computes in (float32, bfloat16...)."""
        if dtype != self._precision:
            self._precision = dtype
            self._dirty = self._plan is not None
            self.refresh()

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self.refresh()  # what came in while hidden (the redraw scheduler draws shown views only)

    def reset(self, plan: RunPlan) -> None:
        self._plan, self._record, self._dirty, self._sticky = plan, None, True, False
        self.refresh()

    def apply(self, records: Sequence[StepRecord]) -> None:
        if records and self._plan is not None:
            self._record, self._dirty = records[-1], True

    def refresh(self) -> None:
        if not self._dirty or self._plan is None or self._sticky:
            return
        self._dirty = False
        plan, rec = self._plan, self._record
        if plan.twin is not None:
            first, second = plan.lockstep_names
            article = "an" if second[:1] in "aeiouf" else "a"  # an int8 cache, an fp8 cache; a window of 8
            if (plan.twin.policy.importance or plan.policy.importance) and plan.against_lossy:
                article = "the cache of"  # the cache of H2O, budget 8
            mode = (f"comparing the {first} and {article} {second}" if plan.against_lossy
                    else "comparing with and without cache")
        else:
            mode = "cache on" if plan.use_cache else "cache off"
            if plan.policy.evicts:
                mode += f", keeping {plan.policy.describe()}"
            elif plan.policy.quantized and plan.use_cache:
                mode += f", stored in {plan.policy.kv_dtype}"
            if plan.drafter is not None:
                mode += f", speculative: {plan.drafter.describe()}"
        if plan.cache_broken:
            mode += " \u00b7 CACHE BROKEN ON PURPOSE (Run menu)"
        precision = f"{self._precision} \u00b7 " if self._precision else ""
        text = f"{plan.model_name} \u00b7 {precision}{mode} \u00b7 {plan.sampling} \u00b7 "
        if rec is None:
            text += f"0/{plan.budget} tokens \u00b7 ready"
        else:
            text += f"{rec.new_tokens}/{plan.budget} tokens \u00b7 step {rec.step + 1} took {rec.seconds * 1000:.1f} ms"
        self.setText(text)
        self._style()

    def _style(self) -> None:
        broken = self._plan is not None and self._plan.cache_broken
        style = f"color: {self._theme.alert}; font-weight: bold;" if broken else ""
        if style != self._style_sheet:  # setting a style sheet, even the same, re-polishes the label
            self._style_sheet = style
            self.setStyleSheet(style)

    def set_theme(self, theme: Theme) -> None:
        self._theme = theme
        self._style()

    def set_font_scale(self, scale: float) -> None:
        pass  # the status bar keeps the system font: it is hidden in presenter mode
