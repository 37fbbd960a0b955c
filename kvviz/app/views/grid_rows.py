"""The K/V grid's rows (each layer, followed by its heads when it is expanded) and its axes' labels."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QFont, QFontMetrics

from kvviz.app.views.grid_cells import HEAD_ROW, LAST_HEAD_ROW, LAYER_ROW
from kvviz.app.views.grid_state import GridState
from kvviz.records import RunPlan

TICK_LABEL_LIMIT = 40  # label columns with their tokens up to this many positions


class GridRows:
    """The display rows of `n_layer` layers of `n_head` heads each, the `expanded` layers opened into their heads.

    `layers[row]` and `heads[row]` (-1 on a layer's own row) say what a row shows, so that the drawn cells
    are `states[layers]`; `kinds` (rows, 1) is the separator under each row; `layer_rows[layer]` is a
    layer's own row.
    """

    def __init__(self, n_layer: int, n_head: int = 0, expanded: Collection[int] = ()) -> None:
        layers: list[int] = []
        heads: list[int] = []
        kinds: list[int] = []
        for layer in range(n_layer):
            layers.append(layer)
            heads.append(-1)
            kinds.append(LAYER_ROW)
            if layer in expanded and n_head > 0:
                layers += [layer] * n_head
                heads += range(n_head)
                kinds += [HEAD_ROW] * (n_head - 1) + [LAST_HEAD_ROW]
        self.n_layer = n_layer
        self.layers = np.array(layers, dtype=np.intp)  # display row -> layer
        self.heads = np.array(heads, dtype=np.intp)  # display row -> head, -1 on a layer's row
        self.kinds = np.array(kinds, dtype=np.intp)[:, None]  # (rows, 1)
        self.layer_rows = np.flatnonzero(self.heads < 0)  # layer -> its display row

    def __len__(self) -> int:
        return len(self.layers)

    def left_ticks(self, label_rows: int) -> list[tuple[float, str]]:
        """Layer labels every few layers, so that they never overlap however short the grid is (`label_rows`
        labels fit its height); then a head row's label wherever it has room between them."""
        layers, rows = self.n_layer, len(self.layers)
        gap = max(layers / 16, rows / label_rows)  # rows from one label to the next, at least
        step = 1
        while step < layers and (np.diff(self.layer_rows[::step]) < gap).any():
            step += 1
        labelled = self.layer_rows[::step]
        ticks = [(float(r) + 0.5, str(int(self.layers[r]))) for r in labelled]
        last = -np.inf  # the row of the label above
        for r in np.flatnonzero(self.heads >= 0):
            above = np.searchsorted(labelled, r)  # labelled[above] is the next layer label below r
            if above:
                last = max(last, labelled[above - 1])
            below = labelled[above] if above < len(labelled) else np.inf
            if r - last >= gap and below - r >= gap:
                ticks.append((float(r) + 0.5, f"h{int(self.heads[r])}"))
                last = r
        return sorted(ticks)


def position_ticks(cells: GridState, column: float, metrics: QFontMetrics) -> tuple[list[tuple[float, str]], str]:
    """The bottom axis's ticks and title: each column labelled with its token when there are few enough and
    `column` (pixels a column) fits a label, else round positions."""
    width = cells.width
    if width <= TICK_LABEL_LIMIT and column >= metrics.horizontalAdvance("0000"):  # else labels would overlap
        ticks = []
        for i in range(width):
            label = cells.label(i) or str(i)
            label = label if len(label) <= 8 else label[:7] + "\u2026"
            ticks.append((i + 0.5, metrics.elidedText(label, Qt.TextElideMode.ElideRight, int(column) - 4)))
        return ticks, "token position (labelled with its token)"
    tick = max(1, int(10 ** np.floor(np.log10(max(1, width / 8)))))
    if width / tick > 16:
        tick *= 5 if width / (tick * 5) >= 4 else 2
    return [(i + 0.5, str(i)) for i in range(0, width, tick)], "token position"


class GridAxes:
    """The grid's axis labels: layers (and heads) on the left, positions (or their tokens) at the bottom. The
    ticks are set only when they change (setting them repaints an axis, even to the same ones)."""

    def __init__(self, plot_widget: pg.PlotWidget, plot_item: pg.PlotItem) -> None:
        self._plot_widget, self._plot_item = plot_widget, plot_item
        self._font = QFont()
        self._ticks: tuple | None = None  # (left, bottom, label) last given to the axes
        self._left: list[tuple[float, str]] = []  # the left axis's ticks, for `_left_key`
        self._left_key: tuple | None = None  # (label rows, layers, rows) they were placed for
        self._left_title = "layer"
        self._tick_width: int | None = None  # pixels reserved for the left labels, None: as wide as they are

    def set_font(self, font: QFont, plan: RunPlan | None) -> None:
        self._font = font
        for name in ("left", "bottom"):
            axis = self._plot_item.getAxis(name)
            axis.setStyle(tickFont=font)
            axis.label.setFont(font)
        self.reserve_width(plan)

    def reserve_width(self, plan: RunPlan | None) -> None:
        """Room on the left axis for its widest label, a head's ("h11") too: expanding a layer does not move
        the columns (nor part them from another grid's)."""
        width = None
        if plan is not None and plan.n_head > 0:
            metrics = QFontMetrics(self._font)
            width = 2 + max(metrics.horizontalAdvance(str(plan.n_layer - 1)),
                            metrics.horizontalAdvance(f"h{plan.n_head - 1}"))
        if width != self._tick_width:
            self._tick_width = width
            self._plot_item.getAxis("left").setStyle(autoExpandTextSpace=width is None, tickTextWidth=width or 30)

    def update(self, cells: GridState, rows: GridRows) -> None:
        """Label `rows` of `cells` for the plot's size now."""
        metrics = QFontMetrics(self._font)
        line = metrics.height()
        label_rows = max(1, int((self._plot_widget.height() - 3 * line) / (1.5 * line)))  # less the bottom axis
        key = (label_rows, cells.n_layer, len(rows), tuple(rows.layers), tuple(rows.heads))
        if self._left_key != key:  # the layer labels only change with the height and the rows
            self._left_key = key
            self._left = rows.left_ticks(label_rows)
        left = self._left
        column = (self._plot_widget.width() - self._plot_item.getAxis("left").width()) / cells.width  # about
        bottom, title = position_ticks(cells, column, metrics)
        if (left, bottom, title) == self._ticks:
            return
        left_title = "layer / head" if len(rows) > cells.n_layer else "layer"
        if left_title != self._left_title:
            self._left_title = left_title
            self._plot_item.setLabel("left", left_title)
        self._ticks = (left, bottom, title)
        self._plot_item.getAxis("left").setTicks([left])
        self._plot_item.getAxis("bottom").setTicks([bottom])
        self._plot_item.setLabel("bottom", title)
