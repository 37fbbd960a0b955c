"""The live counter: K/V computations with and without cache, avoided, and the ratio."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QFont, QResizeEvent
from PySide6.QtWidgets import QFrame, QGridLayout, QLabel, QVBoxLayout, QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.records import RunPlan, StepRecord

ROWS = ("with_cache", "without_cache", "avoided", "ratio")
ROW_TITLES = {
    "with_cache": "with cache",
    "without_cache": "without cache",
    "avoided": "avoided",
    "ratio": "ratio",
}
# each row's colour, a Theme field
ROW_COLOURS = {"with_cache": "teal", "without_cache": "amber", "avoided": "foreground", "ratio": "foreground"}
STOP_REASONS = {
    "max_new_tokens": "done: max new tokens reached",
    "context_full": "context full: the model's {n_ctx} positions are used up",
}


def _fmt(value: int) -> str:
    return f"{value:,}".replace(",", "\u2009")


class CounterPanel(QFrame):
    """K/V computations in the lab's unit (per layer, per token position), all-layers total beside.

    A view (views.base.RunViewProtocol): `reset(plan)`, `apply(records)`, `refresh()`.
    The numbers are the record's measured totals, the same as `kvviz count` gives for P and N.
    `values()` returns what is shown.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("counter")
        self._theme = themes.current()
        self._plan: RunPlan | None = None
        self._record: StepRecord | None = None
        self._dirty = False
        self._font_scale = 1.0

        self.heading = QLabel("K/V computations")
        unit = "The unit of the lab: one key and value row, for one layer and one token position."
        self.heading.setToolTip(unit)
        grid = QGridLayout()
        grid.setHorizontalSpacing(18)
        grid.setVerticalSpacing(4)
        self.per_layer_header = QLabel("per layer")
        self.all_layers_header = QLabel("all layers")
        for col, header in ((1, self.per_layer_header), (2, self.all_layers_header)):
            header.setToolTip(unit)
            header.setObjectName("muted")
            header.setAlignment(Qt.AlignmentFlag.AlignRight)
            grid.addWidget(header, 0, col)
        self._names: dict[str, QLabel] = {}
        self._per_layer: dict[str, QLabel] = {}
        self._all_layers: dict[str, QLabel] = {}
        for row, key in enumerate(ROWS, start=1):
            name = QLabel(ROW_TITLES[key])
            per_layer, all_layers = QLabel("\u2013"), QLabel("\u2013")
            per_layer.setAlignment(Qt.AlignmentFlag.AlignRight)
            all_layers.setAlignment(Qt.AlignmentFlag.AlignRight)
            grid.addWidget(name, row, 0)
            grid.addWidget(per_layer, row, 1)
            grid.addWidget(all_layers, row, 2)
            self._names[key], self._per_layer[key], self._all_layers[key] = name, per_layer, all_layers
        self.measured_note = QLabel("")
        self.measured_note.setObjectName("muted")
        self.measured_note.setWordWrap(True)
        self.progress = QLabel("")
        self.progress.setObjectName("muted")
        self.progress.setWordWrap(True)
        self.stop = QLabel("")
        self.stop.setWordWrap(True)
        self.stop.hide()

        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 10, 12, 10)
        layout.setSpacing(6)
        layout.addWidget(self.heading)
        layout.addLayout(grid)
        layout.addWidget(self.measured_note)
        layout.addWidget(self.progress)
        layout.addWidget(self.stop)
        layout.addStretch(1)
        self._apply_theme()
        self._apply_fonts()

    def reset(self, plan: RunPlan) -> None:
        self._plan = plan
        self._record = None
        self._dirty = True
        self.refresh()

    def apply(self, records: Sequence[StepRecord]) -> None:
        if records:
            self._record = records[-1]
            self._dirty = True

    def values(self) -> dict[str, object]:
        """The shown numbers: per layer, all layers (None before the first step)."""
        rec, plan = self._record, self._plan
        if rec is None or plan is None:
            return {key: None for key in ("with_cache", "without_cache", "avoided", "ratio", "n_layer")}
        return {
            "with_cache": rec.with_cache_total,
            "without_cache": rec.without_cache_total,
            "avoided": rec.avoided_total,
            "ratio": rec.without_cache_total / rec.with_cache_total if rec.with_cache_total else 0.0,
            "n_layer": rec.n_layer,
            "with_cache_all_layers": rec.with_cache_total * rec.n_layer,
            "without_cache_all_layers": rec.without_cache_total * rec.n_layer,
            "avoided_all_layers": rec.avoided_total * rec.n_layer,
            "new_tokens": rec.new_tokens,
            "stop_reason": rec.stop_reason,
        }

    def refresh(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        plan, rec = self._plan, self._record
        if plan is None:
            return
        self.all_layers_header.setText(f"all {plan.n_layer} layers")
        measured = "with_cache" if plan.use_cache else "without_cache"
        counted = "without_cache" if measured == "with_cache" else "with_cache"
        self.measured_note.setText(f"measured in this run: {ROW_TITLES[measured]}; "
                                   f"{ROW_TITLES[counted]} is counted for the same text")
        if rec is None:
            for key in ROWS:
                self._per_layer[key].setText("\u2013")
                self._all_layers[key].setText("\u2013")
            self.progress.setText(f"P = {plan.prompt_tokens} prompt tokens, N = 0 of {plan.budget} new tokens")
            self.stop.hide()
            return
        v = self.values()
        for key in ("with_cache", "without_cache", "avoided"):
            self._per_layer[key].setText(_fmt(int(v[key])))
            self._all_layers[key].setText(_fmt(int(v[f"{key}_all_layers"])))
        self._per_layer["ratio"].setText(f"{v['ratio']:.2f}\u00d7")
        self._all_layers["ratio"].setText(f"{v['ratio']:.2f}\u00d7")
        fill = " + cache fill" if rec.token_id is None else ""
        self.progress.setText(f"P = {plan.prompt_tokens} prompt tokens, N = {rec.new_tokens} of {plan.budget} "
                              f"new tokens; step {rec.step + 1}{fill}")
        if rec.final:
            reason = STOP_REASONS.get(rec.stop_reason, rec.stop_reason or "done").format(n_ctx=plan.n_ctx)
            self._style_stop()
            self.stop.setText(reason[0].upper() + reason[1:])
            self.stop.show()
        else:
            self.stop.hide()

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        """Tall enough for every line at the current width (wrapped notes included): the splitter and
        the scroll area around the views then keep the numbers whole instead of squeezing them."""
        hint = super().minimumSizeHint()
        layout = self.layout()
        return QSize(hint.width(), max(hint.height(), layout.totalHeightForWidth(max(self.width(), hint.width()))))

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802
        super().resizeEvent(event)
        self.updateGeometry()  # the wrapped notes need another height at another width

    def set_font_scale(self, scale: float) -> None:
        self._font_scale = scale
        self._apply_fonts()

    def set_theme(self, theme: Theme) -> None:
        if theme != self._theme:
            self._theme = theme
            self._apply_theme()

    def _apply_theme(self) -> None:
        theme = self._theme
        self.setStyleSheet(f"QFrame#counter {{ border: 1px solid {theme.border}; border-radius: 6px; "
                           f"background: {theme.surface}; }}"
                           " QFrame#counter QLabel { background: transparent; border: none; }"
                           f" QFrame#counter QLabel#muted {{ color: {theme.muted}; }}")
        for key in ROWS:
            for label in (self._names[key], self._per_layer[key], self._all_layers[key]):
                label.setStyleSheet(f"color: {getattr(theme, ROW_COLOURS[key])};")
        self._style_stop()

    def _style_stop(self) -> None:
        alert = self._record is not None and self._record.stop_reason == "context_full"
        colour = self._theme.alert if alert else self._theme.teal
        self.stop.setStyleSheet(f"color: {colour}; font-weight: bold;")

    def _apply_fonts(self) -> None:
        base = QFont(self.font())
        big = QFont(base)
        big.setPointSizeF(15.0 * self._font_scale)
        big.setBold(True)
        normal = QFont(base)
        normal.setPointSizeF(10.0 * self._font_scale)
        heading = QFont(base)
        heading.setPointSizeF(12.0 * self._font_scale)
        heading.setBold(True)
        self.heading.setFont(heading)
        for label in (self.measured_note, self.progress, self.stop, self.per_layer_header,
                      self.all_layers_header):
            label.setFont(normal)
        for key in ROWS:
            self._names[key].setFont(normal)
            self._per_layer[key].setFont(big)
            self._all_layers[key].setFont(normal)
