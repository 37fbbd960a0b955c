"""The attention view: the newest token's query reading the cached keys, one layer's heads at a time."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QFont, QFontMetrics, QHideEvent, QResizeEvent, QShowEvent
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSpinBox, QVBoxLayout, QWidget
from superqt.utils import qthrottled

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.attention_state import AttentionState
from kvviz.app.views.attention_strip import align_columns, draw_strip, outline_head, strip_plot
from kvviz.app.views.base import CellTooltips, style_plot
from kvviz.app.views.grid.kv_grid import least_plot_height, least_row_height
from kvviz.app.views.head_box import ALL_HEADS, HeadBox
from kvviz.app.views.live_label import LiveLabel
from kvviz.app.views.strip_image import head_ticks
from kvviz.app.views.top_list import TopList
from kvviz.core.records import RunPlan, StepRecord

STRIP_MIN_HEIGHT = 70  # pixels at zoom 1
STRIP_ROW_EXTRA = 1.15  # a head's row, against the K/V grid's least row: taller, for the back of the room
STRIP_ROWS_KEPT = 8  # heads whose rows keep their least height; a model with more shares that room
TEXT_UPDATES_PER_SECOND = 5


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
        # the heading and the top list: at most so many times a second while a run plays (nobody reads faster), the
        # last state always; a choice (a layer, a head) or a new run shows at once
        self._texts = qthrottled(self._show_texts, timeout=int(1000 / TEXT_UPDATES_PER_SECOND), parent=self)
        self._texts_due = False  # the strip changed since the texts were last asked for
        self._texts_now = False  # ... and they show at once, not throttled
        self._layer = 0
        self._head = ALL_HEADS
        self._strip = np.zeros((1, 1), dtype=np.float32)  # (heads, width) of the shown layer
        self._heads = 1  # rows of the strip
        self._group = 1  # query heads a KV head, as the plan says
        self._head_ticks: list | None = None  # the left axis's, last set
        self._tick_font = QFont(self.font())
        self._least_height = 0  # the height minimumSizeHint gave, for the width it was asked at

        self.heading = LiveLabel(wrap=True)  # its texts repaint it without a relayout of the window
        self.layer_spin = QSpinBox()
        self.layer_spin.setRange(0, 0)
        self.layer_spin.setToolTip("The layer shown (or click a row of the K/V grid)")
        self.layer_spin.valueChanged.connect(self._on_layer_spin)
        self.head_box = HeadBox()
        self.head_box.currentIndexChanged.connect(self._on_head_box)
        self.layer_label = QLabel("layer")
        self._controls = controls = QHBoxLayout()
        controls.setContentsMargins(0, 0, 0, 0)
        controls.addWidget(self.heading, 1)
        controls.addWidget(self.layer_label, 0, Qt.AlignmentFlag.AlignTop)
        controls.addWidget(self.layer_spin, 0, Qt.AlignmentFlag.AlignTop)
        controls.addWidget(self.head_box, 0, Qt.AlignmentFlag.AlignTop)

        self.plot_widget, self.plot_item, self.image_item, self.head_outline = strip_plot(STRIP_MIN_HEIGHT)
        self.plot_item.getViewBox().sigResized.connect(self._label_heads)  # how many head labels fit
        self.plot_item.getAxis("bottom").geometryChanged.connect(self._fit_height)
        self.tooltips = CellTooltips(self.plot_widget, self.plot_item, self.cell_info)  # (head, position)

        self.top_list = TopList()  # painted in columns: no text to lay out at every step

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.setSpacing(4)
        layout.addLayout(controls)
        layout.addWidget(self.plot_widget, 1)
        layout.addWidget(self.top_list)
        self._apply_theme()
        self._apply_fonts()
        self.heading.setText(self._state.heading(self._layer))

    # ----- the view protocol -----
    def reset(self, plan: RunPlan) -> None:
        self._plan = plan
        self._texts_now = True  # a new run's texts show at once
        self._state = AttentionState(plan)
        heads = max(1, plan.n_head)
        self.layer_spin.blockSignals(True)
        self.layer_spin.setRange(0, max(0, plan.n_layer - 1))
        self._layer = min(self._layer, plan.n_layer - 1)
        self.layer_spin.setValue(self._layer)
        self.layer_spin.blockSignals(False)
        self._group = plan.query_group
        if self.head_box.set_heads(heads, self._group):
            self._head = ALL_HEADS
        self._strip = np.zeros((heads, max(1, plan.width)), dtype=np.float32)
        self._heads = heads
        widest = "W" * 12
        kept = (f", the {plan.width} positions {plan.policy.method_name} kept (striped: the {plan.width} it "
                "evicted before)" if plan.policy.importance else "")  # an importance method's
        self.heading.reserve(f"<b>Attention, layer {plan.n_layer - 1}</b> &nbsp; the query of \u201c{widest}\u201d "
                             f"(position {plan.width}) reads keys recomputed this pass (no cache){kept}; "
                             "brightest: weight 0.00")
        self.top_list.reserve(heads, plan.width)
        self._fit_height()
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
        self._texts_due = True
        self._strip = self._state.strip(self._layer)
        self._draw()
        self.tooltips.refresh()

    def _refresh_texts(self) -> None:
        if not self._texts_due:
            return
        self._texts_due = False
        if self._texts_now:
            self._texts_now = False
            self._texts.cancel()
            self._show_texts()
        else:
            self._texts()

    def _show_texts(self) -> None:
        """The heading and the top positions: at most TEXT_UPDATES_PER_SECOND while a run plays at full speed
        (the strip follows every redraw), and always the last state."""
        self.heading.setText(self._state.heading(self._layer))
        self.top_list.set_tops(self._state.tops(self._layer, None if self._head == ALL_HEADS else [self._head]))

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
        self._fit_height()
        self._label_heads()

    def row_height(self) -> int:
        """The least height of a head's row in the strip at this zoom."""
        return round(least_row_height(self._tick_font) * STRIP_ROW_EXTRA)

    def _fit_height(self) -> None:
        """The strip's least height: a row of `row_height` a head (up to STRIP_ROWS_KEPT heads) and its axis."""
        least = max(int(STRIP_MIN_HEIGHT * self._font_scale),
                    least_plot_height(self.plot_item, min(self._heads, STRIP_ROWS_KEPT), self.row_height()))
        if least != self.plot_widget.minimumHeight():
            self.plot_widget.setMinimumHeight(least)
            self.updateGeometry()

    def minimumSizeHint(self) -> QSize:
        """The heading's and the top list's heights at this width (a QSplitter asks none) over the strip's."""
        hint = super().minimumSizeHint()
        self._least_height = self._height_at(self.width())
        return QSize(hint.width(), max(hint.height(), self._least_height))

    def _height_at(self, width: int) -> int:
        layout = self.layout()
        margins = layout.contentsMargins()
        inner = max(1, width - margins.left() - margins.right())
        beside = sum(w.sizeHint().width() + self._controls.spacing() for w in (self.layer_label, self.layer_spin,
                                                                                  self.head_box))
        controls = max(self.heading.heightForWidth(max(80, inner - beside)), self.layer_spin.sizeHint().height(),
                       self.head_box.sizeHint().height())
        return (margins.top() + margins.bottom() + controls + self.plot_widget.minimumHeight()
                + self.top_list.heightForWidth(inner) + 2 * layout.spacing())

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width() and self._height_at(self.width()) != self._least_height:
            self.updateGeometry()  # the heading or the top list takes more (or fewer) lines at this width

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
            self._dirty = True
            self._texts_now = True  # a choice shows at once
            self.refresh()
            self.layer_shown.emit(layer)

    def align_under(self, plot_item: pg.PlotItem) -> None:
        """Line the strip's columns up under `plot_item`'s (the K/V grid's): the same x range, and a left axis
        as wide as the grid's, whatever it is (the views are as wide as each other)."""
        align_columns(self.plot_item, plot_item)

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
        # shades run from 0 to the largest weight shown, which the heading gives
        draw_strip(self.plot_item, self.image_item, self._strip, self.brightest(), self._theme, self._group,
                   self._state.evicted(self._layer, self._strip.shape[1]))
        self._label_heads()
        outline_head(self.head_outline, self._head, self._strip.shape, self._theme)

    def _label_heads(self, *_args: object) -> None:
        """Every head's row labelled when the rows are a line of the font tall, else every few."""
        heads = self._strip.shape[0]
        pitch = self.plot_item.getViewBox().height() / max(1, heads)
        ticks = head_ticks(heads, pitch, QFontMetrics(self._tick_font).height(), self._group)
        if ticks != self._head_ticks:  # setting ticks repaints the axis, even the same ones
            self._head_ticks = ticks
            self.plot_item.getAxis("left").setTicks(ticks)

    def _apply_theme(self) -> None:
        theme = self._theme
        self.plot_widget.setBackground(theme.background)
        style_plot(self.plot_item, theme)
        self.setStyleSheet(f"QWidget#attentionView {{ background: {theme.background}; }} "
                           f"QWidget#attentionView QLabel {{ color: {theme.foreground}; background: transparent; }}")
        self.top_list.set_theme(theme)

    def _apply_fonts(self) -> None:
        font = QFont(self.font())
        font.setPointSizeF(max(6.0, 9.0 * self._font_scale))
        self._tick_font = font
        axis = self.plot_item.getAxis("left")
        axis.setStyle(tickFont=font)
        axis.label.setFont(font)
        for widget in (self.layer_label, self.layer_spin, self.head_box):
            widget.setFont(font)
        text_font = QFont(self.font())
        text_font.setPointSizeF(10.0 * self._font_scale)  # as the K/V grid's title
        for label in (self.heading, self.top_list):
            label.setFont(text_font)

    # ----- choosing and hovering -----
    def _on_layer_spin(self, layer: int) -> None:
        if layer != self._layer:
            self._layer = layer
            self._dirty = True
            self._texts_now = True  # a choice shows at once
            self.refresh()
            self.layer_shown.emit(layer)

    def _on_head_box(self, _index: int) -> None:
        self._head = int(self.head_box.currentData())
        self._dirty = True
        self._texts_now = True
        self.refresh()

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self.layer_shown.emit(self._layer)

    def hideEvent(self, event: QHideEvent) -> None:
        super().hideEvent(event)
        self.layer_shown.emit(None)
