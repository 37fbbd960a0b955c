"""The serving view of a trace: requests that arrive over time, stepped pass by pass from the records of
kvviz.engine.scheduler: the scheduler's decision in one sentence, the timeline of the requests' states, the block
pool (held, cached, free), the radix tree of the prefix cache, and each request's figures after the last pass."""

from __future__ import annotations

import html
from collections.abc import Sequence

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.serving.block_pool import BlockPool
from kvviz.app.views.serving.pool_state import BlockCell
from kvviz.app.views.serving.radix_tree import RadixTreeView
from kvviz.app.views.serving.timeline import RequestTimeline
from kvviz.app.views.serving.trace_state import (
    figure_rows,
    figures_total,
    first_decision,
    no_tree_note,
    pool_counts,
    timeline_columns,
    trace_pool_cells,
    trace_summary,
)
from kvviz.core.counting import plural
from kvviz.core.serve_records import ServeMeasure, ServePlan, ServeRecord

POOL_CELL = 30  # a block's least side at zoom 1: a pool of 64 in five rows beside the tree at 720p
POOL_COLUMNS = 16  # blocks to a row where they can be larger (1080p: four rows)


class TraceView(QWidget):
    """A view of a served trace: `reset(plan)`, `apply(records)`, `refresh()`, `show_measure(measured)`,
    `clear(text)`, `set_font_scale`, `set_theme`. It reads the plan and the records and never re-derives them."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("central")  # the theme's background (kvviz.qss), on screen and in exports
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self._theme = themes.current()
        self._scale = 1.0
        self._plan: ServePlan | None = None
        self.records: list[ServeRecord] = []
        self._drawn: int | None = -1
        self.measured: ServeMeasure | None = None
        self.heading = QLabel("")  # the title and, in smaller type, the server
        self.heading.setObjectName("viewTitle")
        self.heading.setWordWrap(True)
        self.decision = QLabel("")
        self.decision.setObjectName("servingDecision")
        self.decision.setWordWrap(True)
        self.timeline = RequestTimeline()
        self.pool_title = QLabel("Block pool")
        self.pool_legend = QLabel("")
        self.pool_legend.setWordWrap(True)
        self.pool = BlockPool()
        self.pool.least_cell, self.pool.columns = POOL_CELL, POOL_COLUMNS
        self.tree_title = QLabel("Radix tree")
        self.tree_title.setWordWrap(True)
        self.tree = RadixTreeView()
        self.tree_note = QLabel("")  # in place of the tree in hash and off modes: the height left, its text on top
        self.tree_note.setWordWrap(True)
        self.tree_note.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.tree_note.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Expanding)
        self.figures_line = QLabel("")  # the whole trace's figures, after the last pass
        self.figures_line.setWordWrap(True)
        self.figures_line.hide()
        left = QVBoxLayout()
        for widget in (self.pool_title, self.pool_legend, self.pool):
            left.addWidget(widget)
        left.addStretch(1)
        right = QVBoxLayout()
        for widget in (self.tree_title, self.tree, self.tree_note):
            right.addWidget(widget)  # the tree takes the height left (its boxes two lines where it allows)
        columns = QHBoxLayout()
        columns.addLayout(left, 4)
        columns.addSpacing(16)
        columns.addLayout(right, 5)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 6, 12, 6)
        layout.setSpacing(6)
        layout.addWidget(self.heading)
        layout.addWidget(self.decision)
        layout.addWidget(self.timeline)
        layout.addWidget(self.figures_line)
        layout.addLayout(columns, 1)
        self._style()

    # ----- the view protocol -----
    def reset(self, plan: ServePlan) -> None:
        self._plan, self.records, self.measured = plan, [], None
        self.timeline.reset([r.name for r in plan.requests])
        self.figures_line.hide()
        radix = plan.prefix_cache == "radix"
        self.tree.setVisible(radix)
        self.tree.show_tree(())
        self.tree_note.setVisible(not radix)
        self.tree_note.setText(no_tree_note(plan.prefix_cache))
        self._show_titles()
        self.pool_title.setText(f"Block pool: {plural(plan.num_blocks, 'block')} of {plan.block_size} positions")
        self._drawn = None  # draw the empty state on the next refresh
        self.refresh()

    def clear(self, text: str) -> None:
        """No trace (its model was replaced): empty timeline, pool and tree, and `text` saying why."""
        self._plan, self.records, self._drawn, self.measured = None, [], -1, None
        self.decision.setText(text)
        self.timeline.reset(())
        self.pool.show_cells([], 1)
        self.pool_legend.setText("")
        self.tree.show_tree(())
        self.figures_line.hide()

    def apply(self, records: Sequence[ServeRecord]) -> None:
        before = self.timeline.columns[-1] if self.timeline.columns else None
        self.records.extend(records)
        self.timeline.add(timeline_columns(records, before))

    def refresh(self) -> None:
        plan = self._plan
        if plan is None or self._drawn == len(self.records):
            return
        self._drawn = len(self.records)
        record = self.records[-1] if self.records else None
        names = tuple(r.name for r in plan.requests)
        self.decision.setText(record.decision if record is not None else first_decision(plan))
        cells = trace_pool_cells(record) if record is not None else [BlockCell(b) for b in range(plan.num_blocks)]
        self.pool.show_cells(cells, plan.block_size, names)
        self._show_pool_legend(*pool_counts(record, plan.num_blocks))
        if plan.prefix_cache == "radix":
            self.tree.show_tree(record.tree if record is not None else ())

    def show_measure(self, measured: ServeMeasure | None) -> None:
        """The per-request figures, counted by the worker from the records after the last pass: in the timeline's
        rows, and the whole trace's in a line under it."""
        self.measured = measured
        self.timeline.show_figures(figure_rows(measured) if measured is not None else [])
        self.figures_line.setVisible(measured is not None)
        self.figures_line.setText(figures_total(measured) if measured is not None else "")

    def set_font_scale(self, scale: float) -> None:
        self._scale = scale
        for widget in (self.timeline, self.pool, self.tree):
            widget.set_font_scale(scale)
        self._style()

    def set_theme(self, theme: Theme) -> None:
        self._theme = theme
        for widget in (self.timeline, self.pool, self.tree):
            widget.set_theme(theme)
        self._style()
        self._drawn = None
        self.refresh()

    # ----- drawing -----
    def _style(self) -> None:
        t = self._theme
        for label, size, bold in ((self.heading, 14, True), (self.decision, 12.5, True),
                                  (self.pool_title, 11, True), (self.pool_legend, 10, False),
                                  (self.tree_title, 11, True), (self.tree_note, 10, False),
                                  (self.figures_line, 10, False)):
            f = label.font()
            f.setPointSizeF(size * self._scale)
            f.setBold(bold)
            label.setFont(f)
        self.tree_note.setStyleSheet(f"color: {t.muted};")
        self._show_titles()
        self.decision.setStyleSheet(f"QLabel#servingDecision {{ background: {t.surface}; color: {t.foreground}; "
                                    f"border-left: 4px solid {t.amber}; padding: 6px 10px; }}")

    def _show_pool_legend(self, held: int, cached: int, free: int) -> None:
        t = self._theme
        self.pool_legend.setText(
            f"<span style='color:{t.teal}'>&#9632;</span> held by requests <b>{held}</b> &nbsp; "
            f"<span style='color:{t.muted}'>&#9640;</span> cached, evictable <b>{cached}</b> &nbsp; "
            f"<span style='color:{t.border_strong}'>&#9633;</span> free <b>{free}</b>")

    def _show_titles(self) -> None:
        """The heading with the server in smaller type after it; the tree's title with its legend."""
        t, plan = self._theme, self._plan
        small = f"font-size: {10 * self._scale:.1f}pt; font-weight: normal; color: {t.muted}"
        server = f" &nbsp;<span style='{small}'>{html.escape(trace_summary(plan))}</span>" if plan else ""
        self.heading.setText(f"Serving a trace{server}")
        if plan is not None and plan.prefix_cache != "radix":
            self.tree_title.setText("Prefix cache")
            return
        self.tree_title.setText(
            f"Radix tree &nbsp;<span style='{small}'><span style='color:{t.teal}'>&#9632;</span> live: a running "
            f"request holds it &nbsp;<span style='color:{t.border_strong}'>&#9633;</span> cached: evictable, "
            "leaves first</span>")
