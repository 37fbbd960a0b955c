"""Compare mode's divergence banner: where the cached and the uncached run first chose different tokens."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QVBoxLayout, QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.compare.lockstep import format_logit_diff, token_step
from kvviz.core.records import RunPlan, StepRecord

CONTINUATION_LIMIT = 120  # characters of each continuation shown: its start and its newest end


def _shown(text: str) -> str:
    """A continuation on one line, newlines visible, long ones cut in the middle."""
    text = text.replace("\r", "").replace("\n", "\u21b5")
    if len(text) > CONTINUATION_LIMIT:
        half = CONTINUATION_LIMIT // 2
        text = f"{text[:half]} \u2026 {text[-half:]}"
    return text


class _WrappedLabel(QLabel):
    """A word-wrapped label whose height is set, not asked for width by width."""

    def hasHeightForWidth(self) -> bool:
        """False: a height-for-width child would lay the whole compare view out at its preferred height
        inside the window's scroll area; `fit_height` sets the wrapped text's height instead."""
        return False

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self.fit_height()

    def fit_height(self) -> None:
        """As tall as the wrapped text needs at the current width."""
        height = max(self.minimumSizeHint().height(), self.heightForWidth(max(1, self.width())))
        if height != self.minimumHeight() or height != self.maximumHeight():
            self.setFixedHeight(height)


class DivergenceBanner(QWidget):
    """Empty while the two runs of a lockstep agree: the same tokens, and logits within the float
    noise their records name. From the first token step where they differ on, a red banner names that
    step and shows both continuations from there, growing as the runs go on; logits that part while
    the tokens still agree are named first, with their |Δlogit| against the noise.

    A view (views.base.RunViewProtocol). The widget itself stays shown (a hidden view is not
    redrawn) and takes no room while its `label` is hidden. `shown` says whether the banner is up;
    `first_divergence` is the 1-based token step (the record's `new_tokens`) where the tokens part,
    `first_logit_divergence` where the logits do, each None while the runs agree; `continuations()`
    returns (cached, uncached) texts from that step on.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.label = _WrappedLabel()
        self.label.setObjectName("divergenceBanner")
        self.label.setWordWrap(True)
        self.label.setTextFormat(Qt.TextFormat.PlainText)  # token text is shown as it is, never as markup
        self.label.hide()
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.label)
        self._font_scale = 1.0
        self._theme = themes.current()
        self._broken = False
        self._names = ("with cache", "without cache")  # RunPlan.lockstep_names
        self._against_lossy = False
        self._quantized = False  # against a quantized cache, not a window
        self._importance = ""  # against an importance method's cache, its name ("H2O"), not a window
        self._cached: list[str] = []  # each token step's token text, per run
        self._uncached: list[str] = []
        self.first_divergence: int | None = None
        self.first_logit_divergence: int | None = None
        self._logit_divergence: tuple[float, float] = (0.0, 0.0)  # that step's |Δlogit| and float noise
        self._first_index = 0  # where the first diverging step is in the lists above
        self._dirty = False
        self._apply_style()

    # ----- public interface -----
    def reset(self, plan: RunPlan) -> None:
        self._broken = plan.cache_broken
        self._names = plan.lockstep_names
        self._against_lossy = plan.against_lossy
        self._quantized = plan.against_lossy and (plan.policy.quantized or plan.twin.policy.quantized)
        self._importance = (plan.policy.method_name or plan.twin.policy.method_name) if plan.against_lossy else ""
        self._cached, self._uncached = [], []
        self.first_divergence = None
        self.first_logit_divergence = None
        self._first_index = 0
        self._dirty = True
        self.refresh()

    def apply(self, records: Sequence[StepRecord]) -> None:
        for record in records:
            step = token_step(record)
            if step is None:
                continue
            self._cached.append(step.cached.token_text)
            self._uncached.append(step.uncached.token_text)
            if self.first_divergence is None and not step.same:
                self.first_divergence = step.step
                self._first_index = len(self._cached) - 1
            if self.first_logit_divergence is None and not step.logits_agree:
                self.first_logit_divergence = step.step
                self._logit_divergence = (step.max_abs_logit_diff, step.logit_tolerance)
            self._dirty = self._dirty or self.shown_due

    @property
    def shown_due(self) -> bool:
        """The runs have parted: in their tokens, or in their logits beyond float noise."""
        return self.first_divergence is not None or self.first_logit_divergence is not None

    @property
    def shown(self) -> bool:
        """Whether the banner is up (the runs have parted)."""
        return not self.label.isHidden()

    def text(self) -> str:
        return self.label.text()

    def continuations(self) -> tuple[str, str] | None:
        """(cached, uncached) text each run generated from the first diverging step on; None while they agree."""
        if self.first_divergence is None:
            return None
        start = self._first_index
        return "".join(self._cached[start:]), "".join(self._uncached[start:])

    def refresh(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        if not self.shown_due:
            self.label.setText("")
            self.label.hide()
            return
        why = " The cache is broken on purpose (teaching switch)." if self._broken else ""
        against_lossy = self._against_lossy
        if against_lossy:
            why = (f" An {self._names[1]} rounds every key and value: a trade-off for memory, not a bug."
                   if self._quantized else " A window changes what the model attends to: a trade-off, not a bug.")
            if self._importance:
                why = (f" {self._importance} keeps a budget of positions and forgets the rest, so the model attends "
                       "to less: a trade-off for memory, not a bug.")
        logits = ""
        if self.first_logit_divergence is not None and (
                self.first_divergence is None or self.first_logit_divergence < self.first_divergence):
            difference, tolerance = self._logit_divergence
            noise = "" if against_lossy else f", beyond the float noise of {format_logit_diff(tolerance)}"
            logits = (f"The runs' logits part at token step {self.first_logit_divergence}: max |\u0394logit| "
                      f"{format_logit_diff(difference)}{noise}. ")  # a lossy cache parts them by design
        texts = self.continuations()
        first, second = self._names
        if texts is None:
            lossy = "quantized" if self._quantized else (self._importance or "windowed")
            text = (f"{logits}The tokens still agree, but the {lossy} run computes something else." if against_lossy
                    else f"{logits}The tokens still agree, but the cached run computes something else.")
        else:
            cached, uncached = texts
            text = (f"{logits}The runs diverge at token step {self.first_divergence}: from there, "
                    f"{first}: \u201c{_shown(cached)}\u201d  \u2014  "
                    f"{second}: \u201c{_shown(uncached)}\u201d.")
        self.label.setText(text + why)
        self.label.show()
        self.label.fit_height()

    def set_font_scale(self, scale: float) -> None:
        self._font_scale = scale
        self._apply_style()
        self.label.fit_height()

    def set_theme(self, theme: Theme) -> None:
        self._theme = theme
        self._apply_style()

    def _apply_style(self) -> None:
        # its own style sheet, as the window's banner has: a font set on a QFont does not reach a styled label
        alert, tint = self._theme.alert, self._theme.alert_tint
        self.label.setStyleSheet(f"QLabel#divergenceBanner {{ background: {tint}; color: {alert}; "
                                 f"border: 1px solid {alert}; border-radius: 4px; padding: 4px 8px; "
                                 f"font-weight: bold; font-size: {10.0 * self._font_scale:.1f}pt; }}")
