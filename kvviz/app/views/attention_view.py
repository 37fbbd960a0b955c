"""The attention view: the newest token's query reading the cached keys, one layer's heads at a time."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QFont, QHideEvent, QShowEvent
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QSpinBox, QVBoxLayout, QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.attention_state import TOP_POSITIONS, AttentionState, top_list_text
from kvviz.app.views.base import CellTooltips, cache_axes, cell_plot, style_plot
from kvviz.app.views.live_label import LiveLabel
from kvviz.records import RunPlan, StepRecord

STRIP_MIN_HEIGHT = 70  # pixels at zoom 1
ALL_HEADS = -1
TEXT_UPDATES_PER_SECOND = 5


def shade_table(theme: Theme, steps: int = 256) -> np.ndarray:
    """(steps, 4) RGBA colours from the background (weight 0) to the foreground (weight 1)."""
    low, high = np.array(QColor(theme.background).getRgb()), np.array(QColor(theme.foreground).getRgb())
    t = np.linspace(0.0, 1.0, steps)[:, None] ** 0.6  # small weights stay visible
    table = low * (1 - t) + high * t
    table[:, 3] = 255
    return table.astype(np.uint8)


class AttentionView(QWidget):
    """The newest query's attention weights (records' `attention`) in one layer: a heads × positions strip whose
    columns line up under the K/V grid's (`align_under`), and each head's top positions with their tokens.

    The weights are softmax(q·Kᵀ/√d) over the keys the query attends to: with the cache, exactly the teal
    (reused) and amber (just computed) cells of that layer's row. Without the cache the numbers are the same;
    only where the keys came from differs. A view (views.base.RunViewProtocol); `set_layer` follows a click on
    a grid row, and `layer_shown` says which layer it shows (None once hidden), for the grid to outline it.
    """

    layer_shown = Signal(object)  # int, or None when the view is hidden

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("attentionView")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self._theme = themes.current()
        self._font_scale = 1.0
        self._plan: RunPlan | None = None
        self._state = AttentionState()  # the run's latest attention and tokens
        self._dirty = False
        self._texts_dirty = False
        self._texts_shown_at = 0.0
        self._texts_timer = QTimer(self)
        self._texts_timer.setSingleShot(True)
        self._texts_timer.timeout.connect(self._refresh_texts)
        self._layer = 0
        self._head = ALL_HEADS
        self._strip = np.zeros((1, 1), dtype=np.float32)  # (heads, width) of the shown layer

        self.heading = LiveLabel(wrap=True)  # its texts repaint it without a relayout of the window
        self.layer_spin = QSpinBox()
        self.layer_spin.setRange(0, 0)
        self.layer_spin.setToolTip("The layer shown (or click a row of the K/V grid)")
        self.layer_spin.valueChanged.connect(self._on_layer_spin)
        self.head_box = QComboBox()
        self.head_box.addItem("all heads", ALL_HEADS)
        self.head_box.setToolTip("Outline one head and list its top positions")
        self.head_box.currentIndexChanged.connect(self._on_head_box)
        controls = QHBoxLayout()
        controls.setContentsMargins(0, 0, 0, 0)
        controls.addWidget(self.heading, 1)
        controls.addWidget(QLabel("layer"))
        controls.addWidget(self.layer_spin)
        controls.addWidget(self.head_box)

        self.plot_widget, self.plot_item, self.image_item = cell_plot(STRIP_MIN_HEIGHT)
        self.head_outline = pg.QtWidgets.QGraphicsRectItem()
        self.head_outline.setZValue(10)
        self.head_outline.hide()
        self.plot_item.addItem(self.head_outline)
        self.plot_item.setLabel("left", "head")
        self.plot_item.getAxis("bottom").setStyle(showValues=False)
        cache_axes(self.plot_item)
        self.tooltips = CellTooltips(self.plot_widget, self.plot_item, self.cell_info)  # (head, position)

        self.top_list = LiveLabel(rich=False, wrap=True)  # plain text: no HTML to lay out at every step

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.setSpacing(2)
        layout.addLayout(controls)
        layout.addWidget(self.plot_widget, 3)
        layout.addWidget(self.top_list, 2)
        self._apply_theme()
        self._apply_fonts()
        self._show_heading()

    # ----- the view protocol -----
    def reset(self, plan: RunPlan) -> None:
        self._plan = plan
        self._texts_shown_at = 0.0  # a new run's texts show at once
        self._state = AttentionState(plan)
        heads = max(1, plan.n_head)
        self.layer_spin.blockSignals(True)
        self.layer_spin.setRange(0, max(0, plan.n_layer - 1))
        self._layer = min(self._layer, plan.n_layer - 1)
        self.layer_spin.setValue(self._layer)
        self.layer_spin.blockSignals(False)
        if self.head_box.count() != heads + 1:
            self.head_box.blockSignals(True)
            self.head_box.clear()
            self.head_box.addItem("all heads", ALL_HEADS)
            for head in range(heads):
                self.head_box.addItem(f"head {head}", head)
            self._head = ALL_HEADS
            self.head_box.blockSignals(False)
        self._strip = np.zeros((heads, max(1, plan.width)), dtype=np.float32)
        widest = "W" * 12
        self.heading.reserve(f"<b>Attention, layer {plan.n_layer - 1}</b> &nbsp; the query of \u201c{widest}\u201d "
                             f"(position {plan.width}) reads keys recomputed this pass (no cache); "
                             "brightest: weight 0.00")
        self.top_list.reserve(top_list_text([(h, [(plan.width, 1.0)] * TOP_POSITIONS) for h in range(heads)],
                                                  lambda _p: widest))
        self._dirty = True
        self.refresh()

    def apply(self, records: Sequence[StepRecord]) -> None:
        for record in records:
            if self._state.apply(record):
                self._dirty = True

    def refresh(self) -> None:
        for draw in self.redraw_slices():
            draw()

    def redraw_slices(self) -> list:
        """The strip, then the texts: one pass of the event loop each (see views.base.redraw_slices)."""
        return [self._refresh_strip, self._refresh_texts]

    def _refresh_strip(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        self._texts_dirty = True
        self._strip = self._state.strip(self._layer)
        self._draw()
        self.tooltips.refresh()

    def _refresh_texts(self) -> None:
        """The heading and the top positions: at most TEXT_UPDATES_PER_SECOND while a run plays at full speed
        (nobody reads faster; the strip follows every redraw), and always the last state, by a timer."""
        if not self._texts_dirty:
            return
        wait_ms = 1000 / TEXT_UPDATES_PER_SECOND - (time.perf_counter() - self._texts_shown_at) * 1000
        if wait_ms > 0:
            if not self._texts_timer.isActive():
                self._texts_timer.start(int(wait_ms) + 1)
            return
        self._texts_dirty = False
        self._texts_shown_at = time.perf_counter()
        self._show_heading()
        self._show_top_list()

    def set_theme(self, theme: Theme) -> None:
        if theme == self._theme:
            return
        self._theme = theme
        self._apply_theme()
        self._dirty = True
        self.refresh()

    def set_font_scale(self, scale: float) -> None:
        self._font_scale = scale
        self._apply_fonts()
        self.plot_widget.setMinimumHeight(int(STRIP_MIN_HEIGHT * scale))

    # ----- choosing -----
    @property
    def layer(self) -> int:
        return self._layer

    @property
    def head(self) -> int:
        """The head outlined, or ALL_HEADS."""
        return self._head

    def set_layer(self, layer: int) -> None:
        """Show `layer` (a click on a grid row)."""
        if self._plan is not None:
            layer = max(0, min(layer, self._plan.n_layer - 1))
        if layer != self._layer:
            self._layer = layer
            self.layer_spin.blockSignals(True)
            self.layer_spin.setValue(layer)
            self.layer_spin.blockSignals(False)
            self._dirty, self._texts_shown_at = True, 0.0  # a choice shows at once
            self.refresh()
            self.layer_shown.emit(layer)

    def set_head(self, head: int) -> None:
        index = self.head_box.findData(head)
        if index >= 0:
            self.head_box.setCurrentIndex(index)

    def align_under(self, plot_item: pg.PlotItem) -> None:
        """Line the strip's columns up under `plot_item`'s (the K/V grid's): the same x range, and a left axis
        as wide as the grid's, whatever it is (the views are as wide as each other)."""
        self.plot_item.setXLink(plot_item)
        grid_axis, own_axis = plot_item.getAxis("left"), self.plot_item.getAxis("left")

        def follow() -> None:
            if own_axis.width() != grid_axis.width():
                own_axis.setWidth(grid_axis.width())

        grid_axis.geometryChanged.connect(follow)
        follow()

    # ----- what is drawn, for tests and tooltips -----
    def strip_values(self) -> np.ndarray:
        """(heads, positions recorded) weights of the shown layer, from the latest record with attention."""
        return self._state.values(self._layer)

    def top_positions(self, head: int) -> list[tuple[int, float]]:
        """`head`'s likeliest positions in the shown layer: (position, weight), heaviest first."""
        return self._state.top_positions(self._layer, head)

    def cell_info(self, head: int, position: int) -> str:
        return self._state.cell_info(self._layer, head, position)

    def brightest(self) -> float:
        """The largest weight in the strip: the brightest shade."""
        return self._state.brightest(self._layer)

    # ----- drawing -----
    def _draw(self) -> None:
        heads, width = self._strip.shape
        table = shade_table(self._theme)
        empty = np.array(QColor(self._theme.empty).getRgb(), dtype=np.uint8)
        brightest = self.brightest()  # shades run from 0 to the largest weight shown, which the heading gives
        shade = np.nan_to_num(self._strip, nan=0.0) / (brightest or 1.0)
        index = np.clip(shade * (len(table) - 1), 0, len(table) - 1).astype(np.intp)
        image = table[index]  # (heads, width, 4)
        image[np.isnan(self._strip)] = empty
        self.image_item.setImage(image, autoLevels=False, levels=(0, 255))
        self.image_item.setRect(QRectF(0, 0, width, heads))
        self.plot_item.getViewBox().setYRange(0, heads, padding=0)
        step = max(1, int(np.ceil(heads / 6)))
        self.plot_item.getAxis("left").setTicks([[(h + 0.5, str(h)) for h in range(0, heads, step)]])
        if self._head == ALL_HEADS or self._head >= heads:
            self.head_outline.hide()
        else:
            self.head_outline.setRect(QRectF(0, self._head, width, 1))
            pen = pg.mkPen(self._theme.frame, width=2)
            pen.setCosmetic(True)
            self.head_outline.setPen(pen)
            self.head_outline.show()

    def _show_heading(self) -> None:
        self.heading.setText(self._state.heading(self._layer))

    def _show_top_list(self) -> None:
        self.top_list.setText(self._state.top_list(self._layer, None if self._head == ALL_HEADS else [self._head]))

    def _apply_theme(self) -> None:
        theme = self._theme
        self.plot_widget.setBackground(theme.background)
        style_plot(self.plot_item, theme)
        self.setStyleSheet(f"QWidget#attentionView {{ background: {theme.background}; }} "
                           f"QWidget#attentionView QLabel {{ color: {theme.foreground}; background: transparent; }}")

    def _apply_fonts(self) -> None:
        font = QFont(self.font())
        font.setPointSizeF(max(6.0, 9.0 * self._font_scale))
        axis = self.plot_item.getAxis("left")
        axis.setStyle(tickFont=font)
        axis.label.setFont(font)
        for label in (self.heading, self.top_list):
            label.setFont(font)

    # ----- choosing and hovering -----
    def _on_layer_spin(self, layer: int) -> None:
        if layer != self._layer:
            self._layer = layer
            self._dirty, self._texts_shown_at = True, 0.0  # a choice shows at once
            self.refresh()
            self.layer_shown.emit(layer)

    def _on_head_box(self, _index: int) -> None:
        self._head = int(self.head_box.currentData())
        self._dirty, self._texts_shown_at = True, 0.0
        self.refresh()

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802
        super().showEvent(event)
        self.layer_shown.emit(self._layer)

    def hideEvent(self, event: QHideEvent) -> None:  # noqa: N802
        super().hideEvent(event)
        self.layer_shown.emit(None)
