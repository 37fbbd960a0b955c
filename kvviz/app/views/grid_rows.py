"""The K/V grid's rows (each layer, followed by its heads when it is expanded) and its axes' labels."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QFontMetrics

from kvviz.app.views.grid_cells import HEAD_ROW, LAST_HEAD_ROW, LAYER_ROW
from kvviz.app.views.grid_state import GridState

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
