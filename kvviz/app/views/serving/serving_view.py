"""The serving view: a batch of requests stepped pass by pass, from the records of kvviz.engine.serving: the block
pool, each request's block table and tokens, the memory chart, and the speed measured after the last pass."""

from __future__ import annotations

import html
from collections.abc import Sequence

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGridLayout, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.serving.block_pool import BlockPool, request_colours
from kvviz.app.views.serving.pool_state import BlockCell, pool_cells, request_name, summary
from kvviz.app.views.serving.serving_chart import ServingChart
from kvviz.core.batch_records import BatchPlan, BatchRecord, BatchSpeed
from kvviz.core.counting import plural

TEXT_TAIL = 36  # characters of a prompt's end, and of its text so far, shown under its table


class ServingView(QWidget):
    """A view of a batch: `reset(plan)`, `apply(records)`, `refresh()`, `show_speed(speed)`, `set_font_scale`,
    `set_theme`. It reads the plan and the records and never re-derives them."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("central")  # the theme's background (kvviz.qss), on screen and in exports
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self._theme = themes.current()
        self._scale = 1.0
        self._plan: BatchPlan | None = None
        self.records: list[BatchRecord] = []
        self._drawn = -1
        self.speed: BatchSpeed | None = None
        self._part = "serving"  # see show_part
        self.heading = QLabel("Serving: several requests, one paged KV cache")
        self.heading.setObjectName("viewTitle")
        self.summary = QLabel("")
        self.summary.setWordWrap(True)
        self.pool_title = QLabel("Block pool")
        self.pool = BlockPool()
        self.tables_title = QLabel("Block tables")
        self.tables = QGridLayout()
        self.tables.setHorizontalSpacing(10)
        self.tables.setVerticalSpacing(4)
        self.table_labels: list[tuple[QLabel, QLabel]] = []
        self.chart = ServingChart()
        self.speed_line = QLabel("")
        self.speed_line.setWordWrap(True)
        left = QVBoxLayout()  # the pool; beside it the tables over the chart, so that all fits a 720p screen
        left.addWidget(self.pool_title)
        left.addWidget(self.pool)
        left.addStretch(1)
        right = QVBoxLayout()
        right.addWidget(self.tables_title)
        right.addLayout(self.tables)
        right.addWidget(self.chart, 1)
        right.addWidget(self.speed_line)
        columns = self._columns = QHBoxLayout()
        columns.addLayout(left, 4)
        columns.addSpacing(12)
        columns.addLayout(right, 5)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.addWidget(self.heading)
        layout.addWidget(self.summary)
        layout.addLayout(columns, 1)
        self._style()

    def show_part(self, part: str) -> None:
        """What a slide shows of the view (a lesson step's focus): "serving" all of it, "blocks" the pool and the
        block tables, "chart" the memory chart and the speed; the slide's title stands for the heading."""
        whole = part == "serving"
        self.heading.setVisible(whole)
        for widget in (self.pool_title, self.pool, self.tables_title, *(w for row in self.table_labels for w in row)):
            widget.setVisible(part != "chart")
        for widget in (self.chart, self.speed_line):
            widget.setVisible(part != "blocks")
        # the chart alone takes the whole width; the pool beside the tables leaves them room to keep to two lines
        self._columns.setStretch(0, {"chart": 0, "blocks": 3}.get(part, 4))
        self.pool.set_compact(not whole)  # a slide's part: blocks at their least size, more to a row
        margin = 8 if whole else 2  # a slide's part: the slide has margins of its own
        self.layout().setContentsMargins(12, margin, 12, margin)
        self._part = part

    # ----- the view protocol -----
    def reset(self, plan: BatchPlan) -> None:
        self._plan, self.records, self._drawn, self.speed = plan, [], -1, None
        while len(self.table_labels) > len(plan.requests):  # a row per request: gone at once, not when idle
            for label in self.table_labels.pop():
                self.tables.removeWidget(label)
                label.setParent(None)
                label.deleteLater()
        for i in range(len(self.table_labels), len(plan.requests)):
            name, table = QLabel(), QLabel()
            table.setWordWrap(True)  # narrow on a slide: the text wraps rather than widening the view
            self.tables.addWidget(name, i, 0)
            self.tables.addWidget(table, i, 1)
            self.table_labels.append((name, table))
            name.setVisible(self._part != "chart")
            table.setVisible(self._part != "chart")
        self._style()
        self.tables.setColumnStretch(1, 1)
        self.chart.reset(plan)
        self.pool_title.setText(f"Block pool: {plural(plan.num_blocks, 'block')} of {plan.block_size} positions "
                                f"({plan.bytes_per_block / 1024:.1f} KiB each)")
        self._drawn = None  # draw the empty state on the next refresh
        self.refresh()

    def clear(self, text: str) -> None:
        """No batch (its model was replaced): empty pool, tables and chart, and `text` saying why."""
        self._plan, self.records, self._drawn, self.speed = None, [], -1, None
        self.summary.setText(text)
        self.pool.show_cells([], 1)
        for name, table in self.table_labels:
            name.setText("")
            table.setText("")
        self.chart.clear_lines()
        self.speed_line.setText("")

    def apply(self, records: Sequence[BatchRecord]) -> None:
        self.records.extend(records)

    def refresh(self) -> None:
        plan = self._plan
        if plan is None or self._drawn == len(self.records):
            return
        self._drawn = len(self.records)
        record = self.records[-1] if self.records else None
        self.summary.setText(summary(plan, record))
        if record is not None:
            self.pool.show_cells(pool_cells(record), plan.block_size)
        else:
            self.pool.show_cells([BlockCell(b) for b in range(plan.num_blocks)], plan.block_size)
        self._show_tables(plan, record)
        self.chart.show(self.records)
        self._show_speed()

    def show_speed(self, speed: BatchSpeed | None) -> None:
        """The batch's speed against one at a time, measured by the worker after the last pass (None: measuring)."""
        self.speed = speed
        self._show_speed()

    def set_font_scale(self, scale: float) -> None:
        self._scale = scale
        self.pool.set_font_scale(scale)
        self.chart.set_font_scale(scale)
        self._style()

    def set_theme(self, theme: Theme) -> None:
        self._theme = theme
        self.pool.set_theme(theme)
        self.chart.set_theme(theme)
        self._style()
        self._drawn = None
        self.refresh()

    # ----- drawing -----
    def _style(self) -> None:
        for label, size, bold in ((self.heading, 14, True), (self.summary, 11, False), (self.pool_title, 11, True),
                                  (self.tables_title, 11, True), (self.speed_line, 11, False)):
            f = label.font()
            f.setPointSizeF(size * self._scale)
            f.setBold(bold)
            label.setFont(f)
        for name, table in self.table_labels:
            for label in (name, table):
                f = label.font()
                f.setPointSizeF(10.5 * self._scale)
                label.setFont(f)

    def _show_tables(self, plan: BatchPlan, record: BatchRecord | None) -> None:
        t = self._theme
        colours = request_colours(t)
        shared = {b.block for b in record.blocks if b.shared} if record is not None else set()
        for request, (name, table) in zip(plan.requests, self.table_labels, strict=True):
            colour = colours[request.index % len(colours)]
            name.setText(f"<b style='color:{colour}'>&#9632; {request_name(request.index)}</b>")
            blocks = record.tables[request.index] if record is not None else ()
            cells = " ".join(f"<u><b>{b}</b></u>" if b in shared else str(b) for b in blocks)
            if record is not None and not blocks and record.finished[request.index]:
                cells = "<i>done: its blocks are released</i>"
            elif not blocks:
                cells = "<i>waiting for its prefill</i>"
            prompt = request.prompt.replace("\n", " ")
            tail = html.escape(("\u2026" + prompt[-TEXT_TAIL:]) if len(prompt) > TEXT_TAIL else prompt)
            out = record.output_labels[request.index] if record is not None else ()
            made = "".join(out).replace("\n", "\u21b5")
            generated = html.escape(("\u2026" + made[-TEXT_TAIL:]) if len(made) > TEXT_TAIL else made)
            length = record.lengths[request.index] if record is not None else 0
            table.setText(f"[{cells}] <span style='color:{t.muted}'>{plural(length, 'position')}</span><br>"
                          f"<span style='color:{t.muted}'>\u201c{tail}\u201d</span> "
                          f"<b>{generated}</b>")

    def _show_speed(self) -> None:
        plan, t = self._plan, self._theme
        if plan is None:
            return
        final = bool(self.records) and self.records[-1].final
        if self.speed is not None:
            s = self.speed
            self.speed_line.setText(
                f"Measured after the run, the fastest of {s.turns} turns each: batch of {s.requests} "
                f"<b>{s.tokens_per_second:.0f} tok/s</b>, one at a time <b>{s.sequential_tokens_per_second:.0f} "
                f"tok/s</b> \u2014 <b style='color:{t.teal}'>{s.speedup:.2f}\u00d7</b>")
        elif final:
            self.speed_line.setText("Measuring the batch against one request at a time\u2026")
        else:
            self.speed_line.setText(f"<span style='color:{t.muted}'>Speed: measured after the last pass, batch of "
                                    f"{len(plan.requests)} against one at a time.</span>")
