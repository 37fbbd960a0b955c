"""The per-layer K/V grid: rows are layers (each expandable into its heads), columns are token positions, one
ImageItem for all cells."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PySide6.QtCore import QEvent, QObject, QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QAction, QColor, QCursor, QFont, QFontMetrics, QMouseEvent, QPen, QResizeEvent
from PySide6.QtWidgets import QGraphicsRectItem, QHBoxLayout, QLabel, QToolTip, QVBoxLayout, QWidget

from kvviz.app import theme as themes
from kvviz.app.flow_layout import FlowLayout
from kvviz.app.theme import Theme
from kvviz.app.views.base import cache_axes, cell_plot, cell_under, chip_text, style_plot
from kvviz.app.views.grid_cells import (
    COMPUTED,
    EMPTY,
    PENDING,
    REUSED,
    ROW_KINDS,
    STATE_NAMES,
    cell_tile,
    state_swatch,
)
from kvviz.app.views.grid_rows import GridRows
from kvviz.app.views.grid_title import grid_title, mode_name
from kvviz.app.views.live_label import LiveLabel
from kvviz.records import RunPlan, StepRecord

MAX_IMAGE_PIXELS = 1800  # upsampled image size limit per axis, so a redraw stays cheap
PLOT_MIN_HEIGHT = 80  # pixels at zoom 1: the grid never collapses into a strip
TICK_LABEL_LIMIT = 40  # label columns with their tokens up to this many positions
LOCKSTEP_RUNS = ("cached", "uncached")  # which run of a compare-mode lockstep a grid can show


class KVGridView(QWidget):
    """Which K/V exist, per layer and position, and what this forward pass did with them.

    A view (views.base.RunViewProtocol): `reset(plan)`, `apply(records)`, `refresh()`.
    Everything drawn comes from the plan's width and the records'
    `computed_positions` / `reused_positions`; nothing is re-derived here.

    By default it shows the records it is given (the primary run). With `lockstep="cached"` or
    `"uncached"` it shows that run of a compare-mode lockstep: the plan's `cached_plan` or
    `uncached_plan`, and each record's `lockstep_passes()` of that run; a plan without a twin
    leaves it empty. `legend=False` leaves out the legend (a grid stacked over another one).

    The cache's true shape is layers x heads x positions x head dim: double-clicking a row (or
    `expand_layer`) shows that layer's heads as rows under it, each with its layer's cells (every head of
    a layer computes and reuses exactly the positions its layer does). A click on a row emits
    `layer_clicked`; `set_selected_layer` outlines a layer's rows.
    """

    export_requested = Signal()
    layer_clicked = Signal(int)  # a click on a row: its layer (a head row's too)

    def __init__(self, parent: QWidget | None = None, lockstep: str | None = None, legend: bool = True) -> None:
        super().__init__(parent)
        if lockstep is not None and lockstep not in LOCKSTEP_RUNS:
            raise ValueError(f"lockstep must be one of {LOCKSTEP_RUNS} or None, got {lockstep!r}")
        self.lockstep = lockstep
        self._was_reset = False
        self._plan: RunPlan | None = None
        self._framed_shape: tuple[int, int] | None = None  # (rows, width) the view box was last framed to
        self._ticks: tuple | None = None  # (left, bottom, label) last given to the axes
        self._left: list[tuple[float, str]] = []  # the left axis's ticks, for `_left_key`
        self._left_key: tuple | None = None  # (label rows, layers, rows, expanded) they were placed for
        self._left_title = "layer"
        self._colour_blind = False
        self._font_scale = 1.0
        self._theme = themes.current()
        self._tiles: dict[tuple[int, bool], np.ndarray] = {}
        self._labels: list[str] = []
        self._states = np.zeros((1, 1), dtype=np.uint8)
        self._computed_at = np.full((1, 1), -1, dtype=np.int32)  # pass number (1-based) of the latest computation
        self._times_computed = np.zeros((1, 1), dtype=np.int32)
        self._times_reused = np.zeros((1, 1), dtype=np.int32)  # reads from the cache since the latest computation
        self._last: StepRecord | None = None
        self._dirty = False
        self._hover: tuple[int, int] | None = None  # (display row, position) under the mouse
        self._expanded: set[int] = set()  # layers shown with their heads
        self._selected: int | None = None  # the outlined layer
        self._tick_width: int | None = None  # pixels reserved for the left axis's labels, None: as wide as they are
        self._set_rows()

        self.plot_widget, self.plot_item, self.image_item = cell_plot(PLOT_MIN_HEIGHT)
        vb = self.plot_item.getViewBox()
        self._outline = QGraphicsRectItem()  # the selected layer's rows
        self._outline.setZValue(self.image_item.zValue() + 1)
        self._outline.setVisible(False)
        self.plot_item.addItem(self._outline, ignoreBounds=True)
        vb.sigTransformChanged.connect(self._update_outline)  # its inset is a pixel: a new range or size moves it
        self.plot_item.setLabel("left", "layer")
        self.plot_item.setLabel("bottom", "token position")
        self.plot_item.showGrid(False, False)
        cache_axes(self.plot_item)
        self._export_action = QAction("Export view\u2026", self)
        self._export_action.triggered.connect(self.export_requested.emit)
        self.plot_widget.scene().contextMenu = [self._export_action]
        self.plot_widget.scene().sigMouseMoved.connect(self._on_mouse_moved)
        self.plot_widget.installEventFilter(self)
        self.plot_widget.viewport().installEventFilter(self)  # clicks on rows

        # wrapped: a narrow screen wraps it instead of widening the window
        own_mode = mode_name(lockstep != "uncached")
        waiting = "K/V cache: no run yet" if lockstep is None else f"{own_mode}: no compare run"
        self.title = LiveLabel(waiting, wrap=True)
        self.legend_row = FlowLayout(spacing=14)  # wraps on a narrow screen, one swatch and its words together
        self._legend_labels: list[tuple[QLabel, QLabel, int]] = []
        for state in (COMPUTED, REUSED, PENDING, EMPTY):
            swatch, text = QLabel(), QLabel(STATE_NAMES[state])
            text.setObjectName("muted")
            entry = QWidget()
            entry_row = QHBoxLayout(entry)
            entry_row.setContentsMargins(0, 0, 0, 0)
            entry_row.addWidget(swatch)
            entry_row.addWidget(text)
            self.legend_row.addWidget(entry)
            self._legend_labels.append((swatch, text, state))

        self.setObjectName("kvGrid")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.setSpacing(4)
        layout.addWidget(self.title)
        layout.addWidget(self.plot_widget, 1)
        layout.addLayout(self.legend_row)
        for index in range(self.legend_row.count()):
            self.legend_row.itemAt(index).widget().setVisible(legend)  # hidden entries take no room
        self._apply_theme()
        self._apply_fonts()

    # ----- public interface -----
    def reset(self, plan: RunPlan) -> None:
        """Start showing `plan`'s run: prompt positions pending, the rest empty. Expanded layers stay expanded
        when the run has them (and heads)."""
        self._was_reset = True
        shown = self._shown_plan(plan)
        self._expanded = {layer for layer in self._expanded if layer < plan.n_layer} if plan.n_head > 0 else set()
        if shown is None:
            self._show_nothing()
            return
        plan = shown
        self._plan = plan
        shape = (plan.n_layer, max(1, plan.width))
        self._labels = list(plan.prompt_labels)
        self._states = np.zeros(shape, dtype=np.uint8)
        self._states[:, : plan.prompt_tokens] = PENDING
        self._computed_at = np.full(shape, -1, dtype=np.int32)
        self._times_computed = np.zeros(shape, dtype=np.int32)
        self._times_reused = np.zeros(shape, dtype=np.int32)
        self._last = None
        self._set_rows()
        self._reserve_tick_width()
        self._update_outline()
        self._dirty = True
        self.refresh()

    def apply(self, records: Sequence[StepRecord]) -> None:
        """Take these forward passes into the grid, in order; `refresh()` draws them."""
        if not self._was_reset:
            raise RuntimeError("KVGridView.apply before reset(plan)")
        if self._plan is None:  # a lockstep grid outside compare mode: nothing to show
            return
        for record in records:
            if self.lockstep is None:
                self._apply_one(record)
            else:
                for run_pass in record.lockstep_passes()[LOCKSTEP_RUNS.index(self.lockstep)]:
                    self._apply_one(run_pass)

    def _shown_plan(self, plan: RunPlan) -> RunPlan | None:
        if self.lockstep is None:
            return plan
        if plan.twin is None:
            return None
        return plan.cached_plan if self.lockstep == "cached" else plan.uncached_plan

    def _show_nothing(self) -> None:
        """An empty grid and a title that says why (a lockstep grid given a plan without a twin)."""
        self._plan = None
        self._labels = []
        self._states = np.zeros((1, 1), dtype=np.uint8)
        self._computed_at = np.full((1, 1), -1, dtype=np.int32)
        self._times_computed = np.zeros((1, 1), dtype=np.int32)
        self._times_reused = np.zeros((1, 1), dtype=np.int32)
        self._last = None
        self._dirty = False
        self._set_rows()
        self._update_outline()
        self._draw_image()
        self._update_ticks()
        own_mode = mode_name(self.lockstep != "uncached")
        self.title.setText(f"<b>{own_mode}</b> &nbsp; <span style='color:{self._theme.muted}'>"
                           "no compare run: this grid shows one run of compare mode</span>")

    def _apply_one(self, record: StepRecord) -> None:
        width = self._states.shape[1]
        computed = np.s_[:, record.computed_positions(width)]  # every layer, these positions
        reused = np.s_[:, record.reused_positions(width)]
        states = self._states
        states[states != EMPTY] = PENDING
        states[reused] = REUSED
        states[computed] = COMPUTED
        self._computed_at[computed] = record.step + 1
        self._times_computed[computed] += 1
        self._times_reused[computed] = 0
        self._times_reused[reused] += 1
        if record.token_id is not None:
            self._labels.append(record.token_text)
            new_position = record.sequence_length - 1
            if new_position < width:
                states[:, new_position] = PENDING
        self._last = record
        self._dirty = True

    def refresh(self) -> None:
        """Draw the current state if it changed since the last draw."""
        if not self._dirty:
            return
        self._dirty = False
        self._draw_image()
        self._update_ticks()
        self._update_title()
        if self._hover is not None:
            self._show_tooltip(*self._hover)

    def set_colour_blind(self, enabled: bool) -> None:
        """Add patterns to the cells (stripes = computed, dot = reused, bar = pending)."""
        if enabled == self._colour_blind:
            return
        self._colour_blind = enabled
        self._update_legend()
        self._dirty = True
        self.refresh()

    def set_theme(self, theme: Theme) -> None:
        """Draw the cells, axes, labels and background in `theme`'s colours."""
        if theme == self._theme:
            return
        self._theme = theme
        self._apply_theme()
        if self._plan is not None:
            self._dirty = True
            self.refresh()
        elif self._was_reset:
            self._show_nothing()  # an empty lockstep grid: its title's colours

    def _apply_theme(self) -> None:
        theme = self._theme
        self._tiles = {}
        self.plot_widget.setBackground(theme.background)
        pen = QPen(QColor(theme.frame))
        pen.setWidthF(2.0)
        pen.setCosmetic(True)  # 2 pixels at any zoom
        self._outline.setPen(pen)
        style_plot(self.plot_item, theme)
        self.setStyleSheet(f"QWidget#kvGrid {{ background: {theme.background}; }} "
                           f"QWidget#kvGrid QLabel {{ color: {theme.foreground}; background: transparent; }} "
                           f"QWidget#kvGrid QLabel#muted {{ color: {theme.muted}; }}")
        self._update_legend()

    def set_font_scale(self, scale: float) -> None:
        self._font_scale = scale
        self._apply_fonts()
        self.plot_widget.setMinimumHeight(int(PLOT_MIN_HEIGHT * scale))
        self._dirty = True
        self.refresh()

    def cell_states(self) -> np.ndarray:
        """(n_layer, width) cell states: EMPTY, PENDING, COMPUTED or REUSED (a copy)."""
        return self._states.copy()

    def display_states(self) -> np.ndarray:
        """(rows, width) states as drawn, one row per `display_rows()` entry (a copy)."""
        return self._states[self._rows.layers]

    def display_rows(self) -> list[tuple[int, int | None]]:
        """The rows drawn, top to bottom: (layer, None) for a layer, (layer, head) for one of its heads."""
        if self._plan is None:
            return []
        return [(int(layer), None if head < 0 else int(head))
                for layer, head in zip(self._rows.layers, self._rows.heads, strict=True)]

    def expand_layer(self, layer: int, expanded: bool = True) -> None:
        """Show `layer`'s heads as rows under it (or hide them). A run without heads (n_head 0) shows none."""
        if self._plan is None or self._plan.n_head == 0:
            return
        if not 0 <= layer < self._plan.n_layer:
            raise ValueError(f"layer {layer} is outside the run's {self._plan.n_layer} layers")
        if (layer in self._expanded) == expanded:
            return
        if expanded:
            self._expanded.add(layer)
        else:
            self._expanded.discard(layer)
        self._set_rows()
        self._hover = None  # the rows under the mouse moved
        self._update_outline()
        self._dirty = True
        self.refresh()

    def toggle_heads(self) -> None:
        """Show or hide the heads of the selected layer (layer 0 when none is): View > Heads, key H."""
        layer = self._selected if self._selected is not None else 0
        if self._plan is not None and 0 <= layer < self._plan.n_layer:
            self.expand_layer(layer, layer not in self._expanded)

    def expanded_layers(self) -> tuple[int, ...]:
        """The layers shown with their heads, in order."""
        return tuple(sorted(self._expanded))

    def set_selected_layer(self, layer: int | None) -> None:
        """Outline `layer`'s rows (its heads' too), or none; a layer the run does not have outlines none."""
        self._selected = layer
        self._update_outline()

    def selected_layer(self) -> int | None:
        """The layer `set_selected_layer` chose, or None."""
        return self._selected

    def cell_info(self, layer: int, position: int, head: int | None = None) -> str:
        """What the hover tooltip says about one cell: of `layer`, or of one of its heads."""
        plan = self._plan
        if plan is None or not (0 <= layer < self._states.shape[0] and 0 <= position < self._states.shape[1]):
            return ""
        if head is not None and not 0 <= head < plan.n_head:
            return ""
        token = chip_text(self._labels[position]) if position < len(self._labels) else "(not generated yet)"
        where = f"layer {layer}" if head is None else f"layer {layer}, head {head}"
        lines = [f"{where}, position {position}", f"token: {token}"]
        state = int(self._states[layer, position])
        at = int(self._computed_at[layer, position])
        if at < 0:
            lines.append("K/V not computed yet" if state == PENDING else "position does not exist yet")
        else:
            lines.append(f"K/V computed at step {at}")
            if plan.use_cache:
                n = int(self._times_reused[layer, position])
                lines.append(f"reused {n} time{'s' if n != 1 else ''} since")
            else:
                n = int(self._times_computed[layer, position])
                lines.append(f"no cache: computed {n} time{'s' if n != 1 else ''} so far, reused never")
        if state != EMPTY:
            lines.append(STATE_NAMES[state])
        kv = "K and V" if head is None else f"K and V of head {head}"
        if plan.use_cache and state in (COMPUTED, REUSED) and plan.n_head > 0:  # in the cache: their bytes
            b, d = plan.dtype_bytes, plan.head_dim
            if head is None:
                total = 2 * plan.n_head * d * b
                lines.append(f"{kv}: 2 \u00d7 {plan.n_head} heads \u00d7 {d} \u00d7 {b} bytes = {total:,} bytes")
            else:
                lines.append(f"{kv}: 2 \u00d7 {d} \u00d7 {b} bytes = {2 * d * b:,} bytes")
        elif not plan.use_cache and at >= 0:
            lines.append(f"{kv}: recomputed each pass, not kept (no cache)")
        return "\n".join(lines)

    # ----- drawing -----
    def _set_rows(self) -> None:
        """The display rows: each layer, followed by its heads when it is expanded."""
        n_head = self._plan.n_head if self._plan is not None else 0
        self._rows = GridRows(self._states.shape[0], n_head, self._expanded)

    def _update_outline(self) -> None:
        layer = self._selected
        if self._plan is None or layer is None or not 0 <= layer < self._states.shape[0]:
            self._outline.setVisible(False)
            return
        rows = 1 + (self._plan.n_head if layer in self._expanded else 0)
        px, py = self.plot_item.getViewBox().viewPixelSize()  # one pixel, in cells: the pen inside the plot's edge
        rect = QRectF(0, int(self._rows.layer_rows[layer]), self._states.shape[1], rows)
        self._outline.setRect(rect.adjusted(px, py, -px, -py))
        self._outline.setVisible(True)

    def _cell_pixels(self) -> int:
        rows, width = len(self._rows), self._states.shape[1]
        size = max(1, min(16, MAX_IMAGE_PIXELS // width, (MAX_IMAGE_PIXELS // 2) // rows))
        if self._colour_blind:
            size = max(size, 6 if width <= 512 else size)
        return size

    def _tiles_for(self, size: int) -> np.ndarray:
        key = (size, self._colour_blind)
        if key not in self._tiles:
            self._tiles[key] = np.stack([np.stack([cell_tile(s, size, self._colour_blind, self._theme, row)
                                                   for s in range(4)])
                                         for row in ROW_KINDS])  # (row kinds, states, s, s, 4)
        return self._tiles[key]

    def _draw_image(self) -> None:
        rows, width = len(self._rows), self._states.shape[1]
        size = self._cell_pixels()
        tiles = self._tiles_for(size)
        display = self._states[self._rows.layers]  # (R, W): each head row repeats its layer's
        if size == 1:
            image = tiles[self._rows.kinds, display, 0, 0]  # (R, W, 4)
        else:
            cells = tiles[self._rows.kinds, display]  # (R, W, s, s, 4)
            image = cells.transpose(0, 2, 1, 3, 4).reshape(rows * size, width * size, 4)
        self.image_item.setImage(image, autoLevels=False, levels=(0, 255))
        if self._framed_shape != (rows, width):  # a new frame repaints the axes: only when the shape changes
            self._framed_shape = (rows, width)
            self.image_item.setRect(QRectF(0, 0, width, rows))
            self.plot_item.getViewBox().setRange(xRange=(0, width), yRange=(0, rows), padding=0)

    def _update_ticks(self) -> None:
        width = self._states.shape[1]
        metrics = QFontMetrics(self._tick_font)
        line = metrics.height()
        label_rows = max(1, int((self.plot_widget.height() - 3 * line) / (1.5 * line)))  # less the bottom axis
        key = (label_rows, self._states.shape[0], len(self._rows), self.expanded_layers())
        if self._left_key != key:  # the layer labels only change with the height and the rows
            self._left_key = key
            self._left = self._rows.left_ticks(label_rows)
        left = self._left
        column = (self.plot_widget.width() - self.plot_item.getAxis("left").width()) / width  # pixels, about
        if width <= TICK_LABEL_LIMIT and column >= metrics.horizontalAdvance("0000"):  # else labels would overlap
            bottom = []
            for i in range(width):
                label = chip_text(self._labels[i]) if i < len(self._labels) else str(i)
                label = label if len(label) <= 8 else label[:7] + "\u2026"
                bottom.append((i + 0.5, metrics.elidedText(label, Qt.TextElideMode.ElideRight, int(column) - 4)))
            title = "token position (labelled with its token)"
        else:
            tick = max(1, int(10 ** np.floor(np.log10(max(1, width / 8)))))
            if width / tick > 16:
                tick *= 5 if width / (tick * 5) >= 4 else 2
            bottom = [(i + 0.5, str(i)) for i in range(0, width, tick)]
            title = "token position"
        if (left, bottom, title) == self._ticks:  # setting ticks repaints an axis, even to the same ones
            return
        left_title = "layer / head" if len(self._rows) > self._states.shape[0] else "layer"
        if left_title != self._left_title:
            self._left_title = left_title
            self.plot_item.setLabel("left", left_title)
        self._ticks = (left, bottom, title)
        self.plot_item.getAxis("left").setTicks([left])
        self.plot_item.getAxis("bottom").setTicks([bottom])
        self.plot_item.setLabel("bottom", title)

    def _reserve_tick_width(self) -> None:
        """Room on the left axis for its widest label, a head's ("h11") too: expanding a layer does not move
        the columns (nor part them from another grid's)."""
        plan = self._plan
        width = None
        if plan is not None and plan.n_head > 0:
            metrics = QFontMetrics(self._tick_font)
            width = 2 + max(metrics.horizontalAdvance(str(plan.n_layer - 1)),
                            metrics.horizontalAdvance(f"h{plan.n_head - 1}"))
        if width != self._tick_width:
            self._tick_width = width
            self.plot_item.getAxis("left").setStyle(autoExpandTextSpace=width is None, tickTextWidth=width or 30)

    def _update_title(self) -> None:
        if self._plan is not None:
            text, widest = grid_title(self._plan, self._last, self.lockstep, self._theme)
            if widest:  # room for the run's longest caption: its numbers grow without moving the grid
                self.title.reserve(widest)
            self.title.setText(text)

    def _update_legend(self) -> None:
        for swatch, _text, state in self._legend_labels:
            swatch.setPixmap(state_swatch(state, self._colour_blind, self._theme))

    def _apply_fonts(self) -> None:
        font = QFont(self.font())
        font.setPointSizeF(max(6.0, 9.0 * self._font_scale))
        self._tick_font = font
        for name in ("left", "bottom"):
            axis = self.plot_item.getAxis(name)
            axis.setStyle(tickFont=font)
            axis.label.setFont(font)
        self._reserve_tick_width()
        title_font = QFont(self.font())
        title_font.setPointSizeF(10.0 * self._font_scale)
        self.title.setFont(title_font)
        for _swatch, text, _state in self._legend_labels:
            text.setFont(font)

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802
        super().resizeEvent(event)
        if self._plan is not None:
            self._update_ticks()  # how many layer labels fit depends on the height

    # ----- hover and clicks -----
    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.plot_widget and event.type() == QEvent.Type.Leave:
            self._hover = None
            QToolTip.hideText()
        elif (watched is self.plot_widget.viewport() and isinstance(event, QMouseEvent)
              and event.type() in (QEvent.Type.MouseButtonPress, QEvent.Type.MouseButtonDblClick)
              and event.button() == Qt.MouseButton.LeftButton):
            cell = self._cell_at(self.plot_widget.mapToScene(event.position().toPoint()))
            if cell is not None:
                layer = int(self._rows.layers[cell[0]])
                if event.type() == QEvent.Type.MouseButtonDblClick:
                    self.expand_layer(layer, layer not in self._expanded)
                else:
                    self.set_selected_layer(layer)
                    self.layer_clicked.emit(layer)
        return super().eventFilter(watched, event)

    def _cell_at(self, scene_pos: QPointF) -> tuple[int, int] | None:
        """(display row, position) of the cell at `scene_pos`, or None off the cells."""
        cell = cell_under(self.plot_item, scene_pos) if self._plan is not None else None
        if cell is None:
            return None
        row, position = cell
        if not (0 <= row < len(self._rows) and 0 <= position < self._states.shape[1]):
            return None
        return row, position

    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        cell = self._cell_at(scene_pos)
        if cell is None:
            self._hover = None
            QToolTip.hideText()
        elif cell != self._hover:
            self._hover = cell
            self._show_tooltip(*cell)

    def _show_tooltip(self, row: int, position: int) -> None:
        text = ""
        if 0 <= row < len(self._rows):
            head = int(self._rows.heads[row])
            text = self.cell_info(int(self._rows.layers[row]), position, None if head < 0 else head)
        if text:
            QToolTip.showText(QCursor.pos(), text, self.plot_widget)
        else:
            QToolTip.hideText()
