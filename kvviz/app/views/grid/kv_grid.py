"""The per-layer K/V grid: rows are layers (each expandable into its heads), columns are token positions, one
ImageItem for all cells."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from PySide6.QtCore import QRectF, QSize, Qt, Signal
from PySide6.QtGui import QAction, QFont, QFontMetrics, QResizeEvent
from PySide6.QtWidgets import QLayout, QVBoxLayout, QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.grid.grid_cells import GridLegend
from kvviz.app.views.grid.grid_lockstep import (
    check_lockstep,
    lockstep_passes,
    lockstep_plan,
    no_twin_title,
    waiting_title,
)
from kvviz.app.views.grid.grid_plot import GridPlot
from kvviz.app.views.grid.grid_rows import GridRows, plan_rows
from kvviz.app.views.grid.grid_state import GridState
from kvviz.app.views.grid.grid_title import grid_title
from kvviz.app.views.live_label import LiveLabel
from kvviz.core.records import RunPlan, StepRecord

PLOT_MIN_HEIGHT = 80  # pixels at zoom 1: the grid never collapses into a strip
MIN_ROW_HEIGHT = 14  # pixels: no row of cells is drawn smaller, nor smaller than a line of its labels' font


def least_row_height(font: QFont) -> int:
    """The least height of a row of cells labelled in `font`: MIN_ROW_HEIGHT, or a line of the font if taller."""
    return max(MIN_ROW_HEIGHT, QFontMetrics(font).lineSpacing())


FULL_ROWS = 12  # rows that keep a labelled row's height at the least; a deeper model's rows share less room
DEEP_ROOM_ROWS = 4  # ... the room of this many labelled rows (with the counter and chart beside, on a 720p screen)
THIN_ROW_HEIGHT = 1  # pixels: the thinnest a row gets (48 layers): a line still seen, labelled every few layers


def rows_least_height(rows: int, font: QFont) -> int:
    """The least height of each of `rows` rows: a labelled row's (`least_row_height`) up to FULL_ROWS rows; past
    that the rows share DEEP_ROOM_ROWS rows' room, down to THIN_ROW_HEIGHT, so that a 30- or 48-layer model's grid
    leaves the counter, the chart and the attention strip on a 720p screen (its labels then go every few layers).
    Where the screen has room, the rows take it: this is only how far they may be squeezed."""
    full = least_row_height(font)
    return full if rows <= FULL_ROWS else max(THIN_ROW_HEIGHT, DEEP_ROOM_ROWS * full // rows)


def least_plot_height(plot_item: object, rows: int, row_height: int) -> int:
    """The least height of a cell plot (the grid, the attention strip): `rows` rows of `row_height` pixels,
    its bottom axis (tick labels and title) and the plot's margins."""
    return rows * row_height + math.ceil(plot_item.getAxis("bottom").minimumHeight()) + 3


def least_column_height(layout: QLayout, width: int, title: LiveLabel, plot_widget: QWidget,
                        legend: GridLegend | None) -> int:
    """The least height of a grid's column at `width`: its title and legend as they wrap there, its plot's least
    height, and the layout's margins and spacing."""
    margins = layout.contentsMargins()
    inner = max(1, width - margins.left() - margins.right())
    parts = [title.heightForWidth(inner), plot_widget.minimumHeight(),
             legend.heightForWidth(inner) if legend is not None else 0]
    parts = [part for part in parts if part > 0]
    return margins.top() + margins.bottom() + sum(parts) + layout.spacing() * (len(parts) - 1)


def show_legend_of(legend: GridLegend, plan: RunPlan, shown: RunPlan, scores: bool) -> str:
    """The legend's entries for `plan` (in compare mode, under both grids; `shown`: the run of this grid): the stale
    slot of a cache broken on purpose, the evicted cells of a window or an importance method (named for it), the
    layer kinds, the drafts, latent attention's names, View > Scores (`scores`). Gives the importance method whose
    kept cells View > Scores shades ("H2O": of a cached run, or compare mode's), or ""."""
    legend.show_stale(plan.cache_broken)
    kinds = tuple(shape.kind for shape in shown.layer_shapes)  # a model whose layers differ: what each keeps
    policies = (plan.policy, *((plan.twin.policy,) if plan.twin is not None else ()))  # compare: the lossy one
    method = "".join(policy.method_name for policy in policies)
    legend.show_evicted(any(policy.evicts for policy in policies) or "window" in kinds)
    legend.show_layer_kinds(kinds)
    legend.show_drafted(plan.drafter is not None)  # speculative decoding: accepted and rejected drafts
    legend.show_latent(bool(shown.cache_parts), method)  # latent attention computes and reuses latents
    shaded = method if plan.use_cache else ""  # an uncached run keeps nothing: it attends to what the method keeps
    legend.show_scores(scores and shaded != "")
    return shaded


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
        check_lockstep(lockstep)
        self.lockstep = lockstep
        self._run_name: str | None = None  # compare mode's name of the run shown, where not with/without cache
        self._was_reset = False
        self._plan: RunPlan | None = None
        self._colour_blind = False
        self._scores = False  # View > Scores: an importance method's kept cells shaded by their score
        self._method = ""  # the importance method of the run shown or its compare twin ("H2O"), or ""
        self._font_scale = 1.0
        self._theme = themes.current()
        self._cells = GridState()  # the cells of the run shown, from its records
        self._dirty = False
        self._expanded: set[int] = set()  # layers shown with their heads
        self._selected: int | None = None  # the outlined layer
        self._tick_font = QFont(self.font())
        self._least_height = 0  # the height minimumSizeHint gave, for the width it was asked at
        self._set_rows()

        self._plot = GridPlot(PLOT_MIN_HEIGHT, self._shown_cells, self)
        self.plot_widget, self.plot_item, self.image_item = (
            self._plot.plot_widget, self._plot.plot_item, self._plot.image_item)
        self.tooltips = self._plot.tooltips
        self._plot.layer_pressed.connect(self.set_selected_layer)
        self._plot.layer_pressed.connect(self.layer_clicked.emit)
        self._plot.layer_double_clicked.connect(self._toggle_heads_of)
        # the outline's inset is a pixel: a new range or size moves it
        self.plot_item.getViewBox().sigTransformChanged.connect(self._update_outline)
        self.plot_item.getAxis("bottom").geometryChanged.connect(self._fit_height)  # its height follows its font
        self._export_action = QAction("Export view\u2026", self)
        self._export_action.triggered.connect(self.export_requested.emit)
        self.plot_widget.scene().contextMenu = [self._export_action]

        # wrapped: a narrow screen wraps it instead of widening the window
        self.title = LiveLabel(waiting_title(lockstep), wrap=True)
        self.legend_row = GridLegend(shown=legend)

        self.setObjectName("kvGrid")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.setSpacing(4)
        layout.addWidget(self.title)
        layout.addWidget(self.plot_widget, 1)
        layout.addLayout(self.legend_row)
        self._apply_theme()
        self._apply_fonts()

    # ----- public interface -----
    def reset(self, plan: RunPlan) -> None:
        """Start showing `plan`'s run: prompt positions pending, the rest empty. Expanded layers stay expanded
        when the run has them (and heads)."""
        self._was_reset = True
        shown = lockstep_plan(plan, self.lockstep)
        self._expanded = {layer for layer in self._expanded if layer < plan.n_layer} if plan.cache_heads > 0 else set()
        if shown is None:
            self._show_nothing()
            return
        self._plan = shown
        names = plan.lockstep_names if plan.against_lossy else None
        self._run_name = names[0 if self.lockstep == "cached" else 1] if names and self.lockstep else None
        self._cells = GridState(shown)
        self._method = show_legend_of(self.legend_row, plan, shown, self._scores)
        self._set_rows()
        self._plot.axes.reserve_width(self._plan)
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
            for run_pass in lockstep_passes(record, self.lockstep):
                self._cells.apply(run_pass)
            self._dirty = True

    def _show_nothing(self) -> None:
        """An empty grid and a title that says why (a lockstep grid given a plan without a twin)."""
        self._plan = None
        self._cells = GridState()
        self._dirty = False
        self._set_rows()
        self._update_outline()
        self._plot.draw(self._cells, self._rows, self._colour_blind, self._theme)
        self.title.setText(no_twin_title(self.lockstep, self._theme.muted))

    def refresh(self) -> None:
        """Draw the current state if it changed since the last draw."""
        if not self._dirty:
            return
        self._dirty = False
        self._plot.draw(self._cells, self._rows, self._colour_blind, self._theme, self._scores)
        self._update_title()
        self.tooltips.refresh()

    def set_colour_blind(self, enabled: bool) -> None:
        """Add patterns to the cells (stripes = computed, dot = reused, bar = pending)."""
        if enabled == self._colour_blind:
            return
        self._colour_blind = enabled
        self.legend_row.show_look(self._colour_blind, self._theme)
        self._dirty = True
        self.refresh()

    def show_scores(self, on: bool) -> None:
        """View > Scores: shade the cells an importance method keeps by their score (faint: its layer's lowest)."""
        self._scores = on
        self.legend_row.show_scores(on and self._method != "")
        self._dirty = self._plan is not None
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
        self._plot.set_theme(theme)
        self.setStyleSheet(f"QWidget#kvGrid {{ background: {theme.background}; }} "
                           f"QWidget#kvGrid QLabel {{ color: {theme.foreground}; background: transparent; }} "
                           f"QWidget#kvGrid QLabel#muted {{ color: {theme.muted}; }}")
        self.legend_row.show_look(self._colour_blind, self._theme)

    def set_font_scale(self, scale: float) -> None:
        self._font_scale = scale
        self._apply_fonts()
        self._fit_height()
        self._dirty = True
        self.refresh()

    def cell_states(self) -> np.ndarray:
        """(n_layer, width) cell states, grid.cell_states' values: EMPTY, PENDING, COMPUTED, REUSED... (a copy)."""
        return self._cells.states.copy()

    def display_states(self) -> np.ndarray:
        """(rows, width) states as drawn, one row per `display_rows()` entry (a copy)."""
        return self._cells.states[self._rows.layers]

    def display_rows(self) -> list[tuple[int, int | None]]:
        """The rows drawn, top to bottom: (layer, None) for a layer, (layer, head) for one of its heads."""
        if self._plan is None:
            return []
        return [(int(layer), None if head < 0 else int(head))
                for layer, head in zip(self._rows.layers, self._rows.heads, strict=True)]

    def expand_layer(self, layer: int, expanded: bool = True) -> None:
        """Show `layer`'s heads as rows under it (or hide them). A run without heads (n_head 0) shows none."""
        if self._plan is None or self._plan.cache_heads == 0:
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
        self.tooltips.forget()  # the rows under the mouse moved
        self._update_outline()
        self._dirty = True
        self.refresh()

    def toggle_heads(self) -> None:
        """Show or hide the heads of the selected layer (layer 0 when none is): View > Heads, key H."""
        layer = self._selected if self._selected is not None else 0
        if self._plan is not None and 0 <= layer < self._plan.n_layer:
            self._toggle_heads_of(layer)

    def _toggle_heads_of(self, layer: int) -> None:
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
        return self._cells.cell_info(layer, position, head)

    # ----- drawing -----
    def _set_rows(self) -> None:
        """The display rows: each layer, followed by its heads when it is expanded."""
        self._rows = plan_rows(self._plan, self._expanded) if self._plan is not None else GridRows(self._cells.n_layer)
        if hasattr(self, "plot_widget"):
            self._fit_height()

    def _fit_height(self) -> None:
        """The plot's least height: every row of cells at least `least_row_height` tall, and the bottom axis.
        A screen too short for every panel then scrolls them instead of squeezing the rows."""
        rows = len(self._rows) if self._plan is not None else 0
        least = max(int(PLOT_MIN_HEIGHT * self._font_scale),
                    least_plot_height(self.plot_item, rows, rows_least_height(rows, self._tick_font)))
        if least != self.plot_widget.minimumHeight():
            self.plot_widget.setMinimumHeight(least)
            self.updateGeometry()

    def minimumSizeHint(self) -> QSize:
        """At least the title's and the legend's heights at this width (QSplitter, which lays the grids out, asks
        no height for width) over the plot's least height: the splitter never squeezes one over another."""
        hint = super().minimumSizeHint()
        self._least_height = self._height_at(self.width())
        return QSize(hint.width(), max(hint.height(), self._least_height))

    def _height_at(self, width: int) -> int:
        legend = self.legend_row if self.legend_row.parent() is self.layout() else None  # see take_legend_out
        return least_column_height(self.layout(), width, self.title, self.plot_widget, legend)

    def take_legend_out(self) -> GridLegend:
        """The legend, out of this grid's column, for a layout that puts it under two grids side by side at
        their whole width (a slide's compare mode); the grid still keeps it up to date."""
        self.layout().removeItem(self.legend_row)
        self.legend_row.setParent(None)
        self.updateGeometry()
        return self.legend_row

    def _update_outline(self) -> None:
        layer = self._selected
        if self._plan is None or layer is None or not 0 <= layer < self._cells.n_layer:
            self._plot.outline(None)
            return
        rows = int((self._rows.layers == layer).sum())  # its own row and its heads' (a tall part's rows too)
        self._plot.outline(QRectF(0, int(self._rows.layer_rows[layer]), self._cells.width, rows))

    def _update_title(self) -> None:
        if self._plan is not None:
            text, widest = grid_title(self._plan, self._cells.last, self.lockstep, self._theme,
                                      self._run_name)
            if widest:  # room for the run's longest caption: its numbers grow without moving the grid
                self.title.reserve(widest)
            self.title.setText(text)

    def _apply_fonts(self) -> None:
        font = QFont(self.font())
        font.setPointSizeF(max(6.0, 9.0 * self._font_scale))
        self._plot.axes.set_font(font, self._plan)
        self._tick_font = font
        title_font = QFont(self.font())
        title_font.setPointSizeF(10.0 * self._font_scale)
        self.title.setFont(title_font)
        self.legend_row.set_text_font(font)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width() and self._height_at(self.width()) != self._least_height:
            self.updateGeometry()  # the title or the legend wraps onto more (or fewer) lines at this width
        if self._plan is not None:
            self._plot.axes.update(self._cells, self._rows)  # how many layer labels fit depends on the height

    def _shown_cells(self) -> tuple[GridState, GridRows] | None:
        """The cells and rows the plot shows to the mouse, None before a run (or for an empty lockstep grid)."""
        return (self._cells, self._rows) if self._plan is not None else None
