"""The K/V grid's rows (each layer, followed by its heads when it is expanded) and its axes' labels."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QFont, QFontMetrics, QFontMetricsF

from kvviz.app.views.grid.cell_states import HEAD_ROW, INNER_ROW, LAST_HEAD_ROW, LAYER_ROW
from kvviz.app.views.grid.grid_state import GridState
from kvviz.core.memory import format_bytes
from kvviz.core.records import RunPlan

TICK_LABEL_LIMIT = 40  # label columns with their tokens up to this many positions
MAX_PART_ROWS = 16  # the tallest a latent attention part is drawn, in rows: beyond, not to scale (its label says so)


MIN_LABEL_POINTS = 6.0  # the left labels shrink to fit their rows, down to this size
LABEL_SHARE = 0.8  # of a font's line height, what a label takes on the axis (as pyqtgraph measures it)


def row_label(layer: int, head: int = -1, group: int = 1, parts: tuple[str, ...] = (), kind: str = "") -> str:
    """A row's label on the left axis: "L2" for layer 2, "L2 h0" for its head 0; a KV head that `group` query
    heads share names them: "L2 kv0 ← q0 q1 q2"; latent attention's parts are named: "L2 latent c_kv". Where
    a model's layers differ, a layer's `kind` follows its number: "L0 window 512", "L5 full", "L7 → L5" (it
    reads layer 5's keys and values), "L0 state 12.0 KiB"."""
    if head < 0:
        return f"L{layer} {kind}" if kind else f"L{layer}"
    if parts:
        return f"L{layer} {parts[head]}"
    if group == 1:
        return f"L{layer} h{head}"
    return f"L{layer} kv{head} ← " + " ".join(f"q{q}" for q in range(head * group, (head + 1) * group))


def part_rows(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """How many rows each of latent attention's parts takes, in proportion to its numbers (`sizes`): the smallest
    one row, (512, 64) 8 rows and 1; at most MAX_PART_ROWS."""
    if not sizes:
        return ()
    smallest = max(1, min(sizes))
    return tuple(min(MAX_PART_ROWS, max(1, round(n / smallest))) for n in sizes)


def part_label(name: str, numbers: int, rows: int, scale: int) -> str:
    """A latent attention part's name with its width: "latent c_kv (512)"; "not to scale" where capped."""
    to_scale = rows * scale == numbers or rows < MAX_PART_ROWS
    return f"{name} ({numbers})" if to_scale else f"{name} ({numbers}, not to scale)"


class GridRows:
    """The display rows of `n_layer` layers of `n_head` heads each, the `expanded` layers opened into their heads.

    `layers[row]` and `heads[row]` (-1 on a layer's own row) say what a row shows, so that the drawn cells
    are `states[layers]`; `kinds` (rows, 1) is the separator under each row: a soft line inside an opened
    layer (its own row and its heads), a wider gap around it; `layer_rows[layer]` is a layer's own row.
    """

    def __init__(self, n_layer: int, n_head: int = 0, expanded: Collection[int] = (), group: int = 1,
                 parts: tuple[str, ...] = (), sizes: tuple[int, ...] = (), layer_kinds: tuple[str, ...] = ()) -> None:
        tall = part_rows(sizes) if parts and len(sizes) == n_head else (1,) * n_head  # rows each head takes
        layers: list[int] = []
        heads: list[int] = []
        kinds: list[int] = []
        for layer in range(n_layer):
            opened = layer in expanded and n_head > 0
            if opened and kinds:
                kinds[-1] = LAST_HEAD_ROW  # the gap above an opened layer is as wide as the one below it
            layers.append(layer)
            heads.append(-1)
            kinds.append(HEAD_ROW if opened else LAYER_ROW)
            if opened:
                for head, rows in enumerate(tall):  # a part several rows tall: no line inside it
                    layers += [layer] * rows
                    heads += [head] * rows
                    kinds += [INNER_ROW] * (rows - 1) + [HEAD_ROW if head < n_head - 1 else LAST_HEAD_ROW]
        self.n_layer = n_layer
        self.group = group  # query heads per cached head, for the labels
        self.kinds_shown = layer_kinds  # each layer's kind for its label, where the layers differ (() where alike)
        self.parts = parts  # latent attention's part names instead of heads
        if parts and len(sizes) == n_head:  # their widths in the labels: the rows' heights are in proportion
            self.parts = tuple(part_label(name, numbers, rows, max(1, min(sizes)))
                               for name, numbers, rows in zip(parts, sizes, tall, strict=True))
        self.layers = np.array(layers, dtype=np.intp)  # display row -> layer
        self.heads = np.array(heads, dtype=np.intp)  # display row -> head, -1 on a layer's row
        self.kinds = np.array(kinds, dtype=np.intp)[:, None]  # (rows, 1)
        self.layer_rows = np.flatnonzero(self.heads < 0)  # layer -> its display row

    def __len__(self) -> int:
        return len(self.layers)

    def labels(self) -> list[tuple[float, str]]:
        """Every row's label at its middle: "L2", then "L2 h0", "L2 h1"... when layer 2 is open; a part drawn
        several rows tall is labelled once, at its middle."""
        return [(middle, row_label(int(self.layers[r]), int(self.heads[r]), self.group, self.parts,
                                   self._kind(int(self.layers[r])))) for r, middle in self._blocks()]

    def _kind(self, layer: int) -> str:
        return self.kinds_shown[layer] if self.kinds_shown else ""

    def _blocks(self) -> list[tuple[int, float]]:
        """(first row, middle) of each run of rows that show one thing: a layer, a head, or a tall part."""
        starts = [r for r in range(len(self.layers))
                  if r == 0 or (self.layers[r], self.heads[r]) != (self.layers[r - 1], self.heads[r - 1])]
        ends = [*starts[1:], len(self.layers)]
        return [(start, (start + end) / 2) for start, end in zip(starts, ends, strict=True)]

    def left_ticks(self, label_rows: int) -> list[tuple[float, str]]:
        """Every row's label when `label_rows` labels fit the grid's height; else layer labels every few layers,
        so that they never overlap, then a head row's label wherever it has room between them."""
        rows = len(self.layers)
        if label_rows >= rows:
            return self.labels()
        gap = rows / max(1, label_rows)  # rows from one label to the next, at least
        step = 1
        while step < self.n_layer and (np.diff(self.layer_rows[::step]) < gap).any():
            step += 1
        labelled = self.layer_rows[::step]
        ticks = [(float(r) + 0.5, row_label(int(self.layers[r]), kind=self._kind(int(self.layers[r]))))
                 for r in labelled]
        last = -np.inf  # the row of the label above
        for r, middle in ((start, middle) for start, middle in self._blocks() if self.heads[start] >= 0):
            above = np.searchsorted(labelled, r)  # labelled[above] is the next layer label below r
            if above:
                last = max(last, labelled[above - 1])
            below = labelled[above] if above < len(labelled) else np.inf
            if r - last >= gap and below - r >= gap:
                ticks.append((float(middle), row_label(int(self.layers[r]), int(self.heads[r]), self.group,
                                                       self.parts)))
                last = r
        return sorted(ticks)


def plan_rows(plan: RunPlan, expanded: Collection[int] = ()) -> GridRows:
    """The display rows of `plan`'s layers, the `expanded` ones opened into their cached heads (or latent parts)."""
    return GridRows(plan.n_layer, plan.cache_heads, expanded, plan.query_group,
                    tuple(name for name, _ in plan.cache_parts), tuple(numbers for _, numbers in plan.cache_parts),
                    layer_kind_labels(plan))


def layer_kind_labels(plan: RunPlan) -> tuple[str, ...]:
    """What each layer keeps, as its row label says it where the model's layers differ: "window 512", "full",
    "→ L5" (reads layer 5's keys and values), "state 12.0 KiB", "keeps 24" (an importance method's budget, where
    it differs from layer to layer: PyramidKV's); () where every layer is alike."""
    if plan.policy.importance and len({shape.window for shape in plan.layer_shapes}) <= 1:
        return ()  # an importance method's layers with one budget (every one but PyramidKV): the title says it
    labels = []
    for shape in plan.layer_shapes:
        if shape.kind == "importance":
            labels.append(f"keeps {shape.window:,}")
        elif shape.kind == "window":
            labels.append(f"window {shape.window:,}")
        elif shape.kind == "shared":
            labels.append(f"\u2192 L{shape.source}")
        elif shape.kind == "state":
            labels.append(f"state {format_bytes(shape.state_elements * plan.dtype_bytes)}")
        else:
            labels.append(shape.kind)
    return tuple(labels)


def fitting_font(font: QFont, pitch: float) -> QFont | None:
    """`font`, or a smaller one (down to MIN_LABEL_POINTS) whose labels fit rows `pitch` pixels apart; None
    when even the smallest does not fit."""
    fitted = QFont(font)
    size = font.pointSizeF() if font.pointSizeF() > 0 else 9.0
    while True:
        if QFontMetricsF(fitted).height() * LABEL_SHARE <= pitch:
            return fitted
        if size <= MIN_LABEL_POINTS:
            return None
        size = max(MIN_LABEL_POINTS, size - 0.5)
        fitted.setPointSizeF(size)


LABEL_OVERHANG = 120  # pixels a bottom label may reach past the axis's ends (half of a long label, zoomed in)


def position_ticks(cells: GridState, column: float, metrics: QFontMetrics) -> tuple[list[tuple[float, str]], str]:
    """The bottom axis's ticks and title: each column labelled with its token when there are few enough and
    `column` (pixels a column) fits a label, else round positions. Columns narrower than a short word's label
    take turns on two lines, so that each label has two columns' width."""
    width = cells.width
    word = metrics.horizontalAdvance("\u00b7word") + 4  # a short word's label, "·word"
    if width <= TICK_LABEL_LIMIT and 2 * column >= word:  # else labels would overlap
        staggered = column < word
        room = int(column * (2 if staggered else 1)) - 4
        ticks = []
        for i in range(width):
            label = cells.label(i) or str(i)
            label = label if len(label) <= 8 else label[:7] + "\u2026"
            line = "\n" if staggered and i % 2 else ""
            ticks.append((i + 0.5, line + metrics.elidedText(label, Qt.TextElideMode.ElideRight, room)))
        title = "token position (labelled with its token)"
        return ticks, title if metrics.horizontalAdvance(title) <= column * width - 8 else "token position"
    tick = max(1, int(10 ** np.floor(np.log10(max(1, width / 8)))))
    if width / tick > 16:
        tick *= 5 if width / (tick * 5) >= 4 else 2
    return [(i + 0.5, str(i)) for i in range(0, width, tick)], "token position"


class GridAxes:
    """The grid's axis labels: every row on the left ("L2", "L2 h0" for an opened layer's heads), in a font
    that fits the rows' height, and positions (or their tokens) at the bottom. The ticks are set only when they
    change (setting them repaints an axis, even to the same ones); the view box's new size relabels them."""

    def __init__(self, plot_widget: pg.PlotWidget, plot_item: pg.PlotItem) -> None:
        self._plot_widget, self._plot_item = plot_widget, plot_item
        self._font = QFont()
        self._ticks: tuple | None = None  # (left, bottom, label) last given to the axes
        self._left: list[tuple[float, str]] = []  # the left axis's ticks, for `_left_key`
        self._left_key: tuple | None = None  # (pitch, font, rows) they were placed for
        self._left_font: QFont | None = None  # the font the left labels are drawn in now
        self._left_title = "layer"
        self._tick_width: int | None = None  # pixels reserved for the left labels, None: as wide as they are
        self._shown: tuple[GridState, GridRows] | None = None  # what `update` labelled last
        # the first column's label, centred under a narrow column, reaches left of the axis: pyqtgraph hid it
        # ("Time" was missing under compare mode's grids); position_ticks already keeps the labels apart
        plot_item.getAxis("bottom").setStyle(hideOverlappingLabels=LABEL_OVERHANG)
        plot_item.getViewBox().sigResized.connect(self._on_resized)

    def set_font(self, font: QFont, plan: RunPlan | None) -> None:
        self._font = font
        for name in ("left", "bottom"):
            axis = self._plot_item.getAxis(name)
            axis.setStyle(tickFont=font)
            axis.label.setFont(font)
        self._left_font, self._left_key = font, None
        self.reserve_width(plan)

    def reserve_width(self, plan: RunPlan | None) -> None:
        """Room on the left axis for its widest label, a head's ("L5 h11") too: opening a layer does not move
        the columns (nor part them from another grid's)."""
        width = None
        if plan is not None and plan.cache_heads > 0:
            last = plan.n_layer - 1
            widest = max((text for _, text in plan_rows(plan, {last}).labels()), key=len)
            width = 2 + QFontMetrics(self._font).horizontalAdvance(widest)
        if width != self._tick_width:
            self._tick_width = width
            self._plot_item.getAxis("left").setStyle(autoExpandTextSpace=width is None, tickTextWidth=width or 30)

    def update(self, cells: GridState, rows: GridRows) -> None:
        """Label `rows` of `cells` for the plot's size now."""
        self._shown = cells, rows
        metrics = QFontMetrics(self._font)
        height = self._plot_item.getViewBox().height()  # the rows' pixels
        pitch = height / max(1, len(rows))
        key = (round(pitch, 1), self._font.key(), cells.n_layer, tuple(rows.layers), tuple(rows.heads),
               rows.kinds_shown)  # (a model of as many layers whose layers differ: other labels)
        if self._left_key != key:  # the layer labels only change with the height and the rows
            self._left_key = key
            font = fitting_font(self._font, pitch)
            if font is not None:
                self._left = rows.labels()
            else:  # rows too thin for the smallest font: as many labels as fit, never overlapping
                font = QFont(self._font)
                font.setPointSizeF(MIN_LABEL_POINTS)
                self._left = rows.left_ticks(int(height / (QFontMetricsF(font).height() * LABEL_SHARE)))
            if font != self._left_font:
                self._left_font = font
                self._plot_item.getAxis("left").setStyle(tickFont=font)
        left = self._left
        column = (self._plot_widget.width() - self._plot_item.getAxis("left").width()) / cells.width  # about
        bottom, title = position_ticks(cells, column, metrics)
        if (left, bottom, title) == self._ticks:
            return
        left_title = "layer / head" if len(rows) > cells.n_layer else "layer"
        if left_title != self._left_title:
            self._left_title = left_title
            self._plot_item.setLabel("left", left_title)
        new_title = self._ticks is None or self._ticks[2] != title
        self._ticks = (left, bottom, title)
        self._plot_item.getAxis("left").setTicks([left])
        self._plot_item.getAxis("bottom").setTicks([bottom])
        self._plot_item.setLabel("bottom", title)
        if new_title:  # pyqtgraph centres an axis title only when the axis is resized
            self._plot_item.getAxis("bottom").resizeEvent(None)

    def left_font(self) -> QFont:
        """The font the left axis's labels are drawn in now."""
        return QFont(self._left_font or self._font)

    def _on_resized(self, _view_box: object) -> None:
        if self._shown is not None:
            self.update(*self._shown)
