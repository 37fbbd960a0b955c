"""The attention view: the newest token's query reading the cached keys, one layer's heads at a time."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QFont, QFontMetrics, QHideEvent, QPainter, QPaintEvent, QResizeEvent, QShowEvent
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QSizePolicy, QSpinBox, QVBoxLayout, QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.attention_state import TOP_POSITIONS, AttentionState, tops_text
from kvviz.app.views.base import CellTooltips, cache_axes, cell_plot, style_plot
from kvviz.app.views.grid.kv_grid import least_plot_height, least_row_height
from kvviz.app.views.live_label import LiveLabel
from kvviz.core.records import RunPlan, StepRecord

STRIP_MIN_HEIGHT = 70  # pixels at zoom 1
STRIP_ROW_EXTRA = 1.15  # a head's row, against the K/V grid's least row: taller, for the back of the room
STRIP_ROWS_KEPT = 8  # heads whose rows keep their least height; a model with more shares that room
ALL_HEADS = -1
TEXT_UPDATES_PER_SECOND = 5
TOKEN_ROOM = "wwwwww"  # a token in the top list is cut to this text's width
MAX_CELL_PIXELS = 16  # a weight's square in the strip's image, at most (a 1-pixel gap line from 4 pixels)
_SHADES: dict[tuple[str, int], np.ndarray] = {}


def shade_table(theme: Theme, steps: int = 256) -> np.ndarray:
    """(steps, 4) RGBA colours from weight 0 to the strip's largest weight: matplotlib's perceptual "inferno"
    ramp, its dark end at 0 on a dark background and its pale end at 0 on a light one. The heaviest weight
    stands out from the background by 16:1 (dark theme) or 20:1 (light), half of it from the heaviest by more
    than 2.5:1, and hue as well as lightness tells the weights apart."""
    key = (theme.background, steps)
    if key not in _SHADES:
        t = np.linspace(0.0, 1.0, steps) ** 0.75  # small weights stay visible
        light = QColor(theme.background).lightnessF() > 0.5
        positions = 0.97 - 0.92 * t if light else 0.22 + 0.78 * t
        _SHADES[key] = pg.colormap.get("inferno").map(positions, mode="byte").astype(np.uint8)
    return _SHADES[key]


class TopList(QWidget):
    """Each head's heaviest positions, in cells of aligned columns: "h0:", then per position its token, "@" its
    position and its weight. A line holds as many heads' cells as its width does, so no line wraps; the height
    is kept for every head of the run (`reserve`), so new weights never relayout the window. `text()` gives the
    same as plain text."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._tops: list[tuple[int, list[tuple[str, int, float]]]] = []
        self._heads, self._width = 1, 10  # reserved: cells, and positions (for the widest "@12")
        self._theme = themes.current()
        self._columns: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)  # head, token, position, weight, gap
        policy = QSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)  # its height: for its width
        policy.setHeightForWidth(True)
        self.setSizePolicy(policy)
        self._measure()

    def reserve(self, heads: int, width: int) -> None:
        """Room for `heads` heads' cells and positions up to `width`."""
        if (heads, width) != (self._heads, self._width):
            self._heads, self._width = max(1, heads), max(1, width)
            self._measure()
            self.updateGeometry()

    def set_tops(self, tops: list[tuple[int, list[tuple[str, int, float]]]]) -> None:
        """(head, [(token, position, weight)]) per head shown, heaviest first."""
        self._tops = tops
        self.update()

    def set_theme(self, theme: Theme) -> None:
        self._theme = theme
        self.update()

    def text(self) -> str:
        return tops_text(self._tops)

    def _measure(self) -> None:
        metrics = QFontMetrics(self.font())
        space = metrics.horizontalAdvance(" ")
        self._columns = (metrics.horizontalAdvance(f"h{self._heads - 1}:") + space,
                         metrics.horizontalAdvance(TOKEN_ROOM),
                         metrics.horizontalAdvance(f" @{self._width - 1}"),
                         metrics.horizontalAdvance(" 0.00"),
                         2 * space,  # between a head's positions
                         5 * space)  # between heads

    def _cell_width(self, token: int | None = None) -> int:
        head, token_w, position, weight, entry_gap, _gap = self._columns
        return head + TOP_POSITIONS * ((token_w if token is None else token) + position + weight + entry_gap)

    def _per_line(self, width: int) -> int:
        return max(1, (width + self._columns[5]) // (self._cell_width() + self._columns[5]))

    def _line_height(self) -> int:
        return QFontMetrics(self.font()).lineSpacing()

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        lines = -(-self._heads // self._per_line(width))
        return lines * self._line_height()

    def sizeHint(self) -> QSize:
        width = (self._cell_width() + self._columns[5]) * min(self._heads, 3)
        return QSize(width, self.heightForWidth(width))

    def minimumSizeHint(self) -> QSize:
        return QSize(80, self._line_height())  # the height for its width: AttentionView.minimumSizeHint

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() == event.Type.FontChange:
            self._measure()
            self.updateGeometry()

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        metrics = painter.fontMetrics()
        head_w, token_w, position_w, weight_w, entry_gap, gap = self._columns
        short = self._cell_width() - self.width()
        if short > 0:  # a narrow view: the tokens give up room, each column stays apart
            token_w = max(metrics.horizontalAdvance("ww"), token_w - short // TOP_POSITIONS)
        cell = self._cell_width(token_w)
        per_line, line = self._per_line(self.width()), self._line_height()
        left = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
        right = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
        ink, muted = QColor(self._theme.foreground), QColor(self._theme.muted)
        for index, (head, tops) in enumerate(self._tops):
            x, y = (index % per_line) * (cell + gap), (index // per_line) * line
            painter.setPen(muted)
            painter.drawText(QRectF(x, y, head_w, line), left, f"h{head}:")
            x += head_w
            for token, position, weight in tops:  # "·flies @1 0.52": the token set against its position
                painter.setPen(ink)
                painter.drawText(QRectF(x, y, token_w, line), right,
                                 metrics.elidedText(token, Qt.TextElideMode.ElideRight, token_w))
                painter.setPen(muted)
                painter.drawText(QRectF(x + token_w, y, position_w, line), left, f" @{position}")
                painter.setPen(ink)
                painter.drawText(QRectF(x + token_w + position_w, y, weight_w, line), right, f"{weight:.2f}")
                x += token_w + position_w + weight_w + entry_gap
        painter.end()


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
        self._heads = 1  # rows of the strip
        self._head_ticks: list | None = None  # the left axis's, last set
        self._tick_font = QFont(self.font())
        self._least_height = 0  # the height minimumSizeHint gave, for the width it was asked at

        self.heading = LiveLabel(wrap=True)  # its texts repaint it without a relayout of the window
        self.layer_spin = QSpinBox()
        self.layer_spin.setRange(0, 0)
        self.layer_spin.setToolTip("The layer shown (or click a row of the K/V grid)")
        self.layer_spin.valueChanged.connect(self._on_layer_spin)
        self.head_box = QComboBox()
        self.head_box.addItem("all heads", ALL_HEADS)
        self.head_box.setToolTip("Outline one head and list its top positions")
        self.head_box.currentIndexChanged.connect(self._on_head_box)
        self.layer_label = QLabel("layer")
        self._controls = controls = QHBoxLayout()
        controls.setContentsMargins(0, 0, 0, 0)
        controls.addWidget(self.heading, 1)
        controls.addWidget(self.layer_label, 0, Qt.AlignmentFlag.AlignTop)
        controls.addWidget(self.layer_spin, 0, Qt.AlignmentFlag.AlignTop)
        controls.addWidget(self.head_box, 0, Qt.AlignmentFlag.AlignTop)

        self.plot_widget, self.plot_item, self.image_item = cell_plot(STRIP_MIN_HEIGHT)
        self.head_outline = pg.QtWidgets.QGraphicsRectItem()
        self.head_outline.setZValue(10)
        self.head_outline.hide()
        self.plot_item.addItem(self.head_outline)
        self.plot_item.setLabel("left", "head")
        self.plot_item.getAxis("bottom").setStyle(showValues=False)
        cache_axes(self.plot_item)
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
        self._heads = heads
        widest = "W" * 12
        self.heading.reserve(f"<b>Attention, layer {plan.n_layer - 1}</b> &nbsp; the query of \u201c{widest}\u201d "
                             f"(position {plan.width}) reads keys recomputed this pass (no cache); "
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
        size = max(1, min(MAX_CELL_PIXELS, 1800 // width, 900 // heads))  # as the K/V grid's cells
        if size >= 4:  # a dark line between heads and between positions, as between the grid's cells
            image = np.repeat(np.repeat(image, size, axis=0), size, axis=1)  # (heads * s, width * s, 4)
            gap = np.array(QColor(self._theme.grid_line).getRgb(), dtype=np.uint8)
            image[size - 1::size, :] = gap
            image[:, size - 1::size] = gap
        self.image_item.setImage(image, autoLevels=False, levels=(0, 255))
        self.image_item.setRect(QRectF(0, 0, width, heads))
        self.plot_item.getViewBox().setYRange(0, heads, padding=0)
        self._label_heads()
        if self._head == ALL_HEADS or self._head >= heads:
            self.head_outline.hide()
        else:
            self.head_outline.setRect(QRectF(0, self._head, width, 1))
            pen = pg.mkPen(self._theme.frame, width=2)
            pen.setCosmetic(True)
            self.head_outline.setPen(pen)
            self.head_outline.show()

    def _label_heads(self, *_args: object) -> None:
        """Every head's row labelled when the rows are a line of the font tall, else every few."""
        heads = self._strip.shape[0]
        pitch = self.plot_item.getViewBox().height() / max(1, heads)
        step = next((s for s in range(1, heads + 1) if s * pitch >= 0.8 * QFontMetrics(self._tick_font).height()),
                    heads)
        ticks = [[(h + 0.5, str(h)) for h in range(0, heads, step)]]
        if ticks != self._head_ticks:  # setting ticks repaints the axis, even the same ones
            self._head_ticks = ticks
            self.plot_item.getAxis("left").setTicks(ticks)

    def _show_heading(self) -> None:
        self.heading.setText(self._state.heading(self._layer))

    def _show_top_list(self) -> None:
        self.top_list.set_tops(self._state.tops(self._layer, None if self._head == ALL_HEADS else [self._head]))

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
            self._dirty, self._texts_shown_at = True, 0.0  # a choice shows at once
            self.refresh()
            self.layer_shown.emit(layer)

    def _on_head_box(self, _index: int) -> None:
        self._head = int(self.head_box.currentData())
        self._dirty, self._texts_shown_at = True, 0.0
        self.refresh()

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self.layer_shown.emit(self._layer)

    def hideEvent(self, event: QHideEvent) -> None:
        super().hideEvent(event)
        self.layer_shown.emit(None)
