"""The timeline of a served trace: a row a request (its name in its colour), a column a pass, each cell coloured by
the request's state after that pass (blank before it arrives), the current pass outlined, a legend under it; after
the passes, each request's figures once the trace is over (room kept for them from the start). It grows a column a
pass; the cells narrow to fit the width, and past their least width the widget widens."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetricsF, QHelpEvent, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.serving.block_pool import request_colours
from kvviz.app.views.serving.trace_state import FIGURE_HEADERS, FIGURE_WIDEST, STATE_LABELS, TimelineColumn
from kvviz.core.serve_records import DECODING, FINISHED, NOT_ARRIVED, PREEMPTED, PREFILLING, WAITING

MIN_SLOTS = 40  # columns the width is shared among at the least, so that the first passes do not fill it
MIN_CELL, MAX_CELL = 5.0, 26.0  # a column's width in pixels at zoom 1
ROW_GROWTH, ROW_PER_WIDTH = 1.4, 0.0125  # a row at most 1.4 times its text's height, 1/80 of the width
TICKS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
LEGEND = (WAITING, PREFILLING, DECODING, PREEMPTED, FINISHED, NOT_ARRIVED)


def state_fill(state: str, t: Theme) -> QColor | None:
    """A state's fill (None: drawn as an outline, or blank)."""
    colour = {PREFILLING: t.amber, DECODING: t.teal, PREEMPTED: t.alert, FINISHED: t.border_strong}.get(state)
    return QColor(colour) if colour is not None else None


def paint_state(painter: QPainter, rect: QRectF, state: str, t: Theme, faded: bool = False) -> None:
    """One cell: a fill per state, waiting as an outline, preempted crossed, not arrived blank."""
    if state == NOT_ARRIVED:
        return
    fill = state_fill(state, t)
    if fill is None:  # waiting: in the queue, nothing computed
        pen = QPen(QColor(t.muted), 1.2)
        pen.setJoinStyle(Qt.PenJoinStyle.MiterJoin)
        painter.setPen(pen)
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawRect(rect.adjusted(0.6, 0.6, -0.6, -0.6))
        return
    if faded:
        fill.setAlpha(110)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(fill)
    painter.drawRect(rect)
    if state == PREEMPTED and rect.width() >= 6:
        painter.setBrush(QBrush(QColor(t.background), Qt.BrushStyle.DiagCrossPattern))
        painter.drawRect(rect)


def legend_text(key: str) -> str:
    if key == "current":
        return "current pass"
    return f"{STATE_LABELS[key]} (blank)" if key == NOT_ARRIVED else STATE_LABELS[key]


class RequestTimeline(QWidget):
    """`reset(names)` for a new trace, `add(columns)` as passes arrive, `state_at(request, step)` what a cell
    shows."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("requestTimeline")
        self.names: tuple[str, ...] = ()
        self.columns: list[TimelineColumn] = []
        self.figures: list[tuple[str, ...]] = []  # a row a request, FIGURE_HEADERS' columns (none: not yet)
        self._kept: dict = {}  # _measured's
        self._scale = 1.0
        self._theme = themes.current()
        self.setMouseTracking(True)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)  # the keys step the trace; none of them types
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    # ----- what it shows -----
    def reset(self, names: Sequence[str]) -> None:
        self.names, self.columns, self.figures = tuple(names), [], []
        self._kept.clear()
        self._fit()

    def show_figures(self, rows: Sequence[tuple[str, ...]]) -> None:
        """Each request's figures after the last pass (kvviz.app.views.serving.trace_state.figure_rows)."""
        self.figures = list(rows)
        self._kept.clear()
        self._fit()

    def add(self, columns: Sequence[TimelineColumn]) -> None:
        self.columns.extend(columns)
        self._fit()

    @property
    def current(self) -> int | None:
        """The pass drawn last (outlined), or None before the first."""
        return self.columns[-1].step if self.columns else None

    def state_at(self, request: int, step: int) -> str:
        """The state the cell of `request` at pass `step` shows (not arrived: blank)."""
        first = self.columns[0].step if self.columns else 0
        if not 0 <= step - first < len(self.columns):
            return NOT_ARRIVED
        return self.columns[step - first].states[request]

    def set_font_scale(self, scale: float) -> None:
        self._scale = scale
        self._kept.clear()
        self._fit()

    def set_theme(self, theme: Theme) -> None:
        self._theme = theme
        self.update()

    # ----- geometry -----
    def _measured(self, key: str, compute):
        """`compute()`, kept until the names, the figures or the zoom change (a paint asks thousands of times)."""
        if key not in self._kept:
            self._kept[key] = compute()
        return self._kept[key]

    def _fonts(self) -> tuple[QFont, QFont, QFont]:
        return self._measured("fonts", self._make_fonts)

    def _make_fonts(self) -> tuple[QFont, QFont, QFont]:
        small, name, bold = QFont(self.font()), QFont(self.font()), QFont(self.font())
        small.setPointSizeF(max(6.5, 9.0 * self._scale))  # 27 px on a slide, as the pool's labels
        name.setPointSizeF(max(7.5, 10.0 * self._scale))
        bold.setPointSizeF(max(6.5, 9.0 * self._scale))
        bold.setBold(True)
        return small, name, bold

    def _metrics(self) -> tuple[float, float, float]:
        """The names' column width, a row's height, the header's height."""
        return self._measured("metrics", self._make_metrics)

    def _make_metrics(self) -> tuple[float, float, float]:
        small, name, _bold = self._fonts()
        fm = QFontMetricsF(name)
        names_width = max((fm.horizontalAdvance(n) for n in self.names), default=40.0) + fm.height() + 14
        return names_width, max(12.0, fm.height() * 1.25), QFontMetricsF(small).height() + 6

    def _row(self, width: float | None = None) -> float:
        """A row's height: its text's, taller on a wide screen (1080p), so that the cells are closer to square."""
        base = self._metrics()[1]
        return max(base, min(base * ROW_GROWTH, (self.width() if width is None else width) * ROW_PER_WIDTH))

    def _figure_widths(self) -> list[float]:
        """Each figure column's width: its header, its widest figure or the room kept for one."""
        return self._measured("figures", self._make_figure_widths)

    def _make_figure_widths(self) -> list[float]:
        fm = QFontMetricsF(self._fonts()[0])
        widths = []
        for i, (header, widest) in enumerate(zip(FIGURE_HEADERS, FIGURE_WIDEST, strict=True)):
            texts = [header, widest, *(row[i] for row in self.figures)]
            widths.append(max(fm.horizontalAdvance(t) for t in texts) + 14 * self._scale)
        return widths

    def _cells_right(self, w: float) -> float:
        return self._metrics()[0] + w * max(MIN_SLOTS, len(self.columns))

    def _cell_width(self, width: float | None = None) -> float:
        names_width = self._metrics()[0]
        room = (self.width() if width is None else width) - names_width - 12 - sum(self._figure_widths())
        return max(MIN_CELL, min(MAX_CELL * self._scale, room / max(MIN_SLOTS, len(self.columns))))

    def _legend_items(self, width: float) -> list[tuple[str, QRectF]]:
        """Each legend entry's box (its swatch at the left), wrapped to `width`, below the rows."""
        small = self._fonts()[0]
        fm = QFontMetricsF(small)
        names_width, _row, header = self._metrics()
        top = header + self._row(width) * len(self.names) + 8
        swatch, x, y, items = fm.height() * 0.8, 0.0, top, []
        for key in (*LEGEND, "current"):
            text = legend_text(key)
            w = swatch + 6 + fm.horizontalAdvance(text) + 18
            if x > 0 and x + w > width:
                x, y = 0.0, y + fm.height() + 4
            items.append((key, QRectF(x, y, w, fm.height())))
            x += w
        return items

    def heightForWidth(self, width: int) -> int:
        items = self._legend_items(width)
        return int(items[-1][1].bottom() + 4) if items else 0

    def _fit(self) -> None:
        names_width = self._metrics()[0]
        self.setMinimumWidth(int(names_width + 12 + sum(self._figure_widths())
                                 + MIN_CELL * max(MIN_SLOTS, len(self.columns))))
        self.setFixedHeight(self.heightForWidth(max(self.width(), self.minimumWidth())))
        self.update()

    def resizeEvent(self, event) -> None:
        self.setFixedHeight(self.heightForWidth(self.width()))
        super().resizeEvent(event)

    def sizeHint(self) -> QSize:
        return QSize(800, self.heightForWidth(800))

    def cell_rect(self, request: int, index: int) -> QRectF:
        names_width, _row, header = self._metrics()
        row = self._row()
        w = self._cell_width()
        gap = 1.0 if w >= 7 else 0.0
        return QRectF(names_width + index * w, header + request * row + 2, w - gap, row - 4)

    def cell_at(self, point: QPointF) -> tuple[int, int] | None:
        """(request, column index) under `point`."""
        names_width, _row, header = self._metrics()
        row = self._row()
        index = int((point.x() - names_width) // self._cell_width())
        request = int((point.y() - header) // row)
        if point.x() >= names_width and 0 <= index < len(self.columns) and 0 <= request < len(self.names) \
                and point.y() >= header:
            return request, index
        return None

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip and isinstance(event, QHelpEvent):
            hit = self.cell_at(QPointF(event.pos()))
            if hit is None:
                QToolTip.hideText()
            else:
                request, index = hit
                column = self.columns[index]
                skipped = "" if column.ran else " (a pass skipped: nothing ran until the next arrival)"
                QToolTip.showText(event.globalPos(), f"{self.names[request]} after pass {column.step}: "
                                                     f"{STATE_LABELS[column.states[request]]}{skipped}", self)
            return True
        return super().event(event)

    # ----- drawing -----
    def paintEvent(self, event: QPaintEvent) -> None:
        t = self._theme
        small, name_font, bold = self._fonts()
        names_width, _row, header = self._metrics()
        row = self._row()
        w = self._cell_width()
        painter = QPainter(self)
        painter.fillRect(self.rect(), QColor(t.background))
        right = self.width()
        colours = request_colours(t)
        painter.setFont(name_font)
        fm = QFontMetricsF(name_font)
        for i, name in enumerate(self.names):
            top = header + i * row
            if i % 2:  # every other row banded, to follow a row across many passes
                painter.fillRect(QRectF(0, top, right, row), QColor(t.surface))
            side = fm.height() * 0.55
            painter.fillRect(QRectF(2, top + (row - side) / 2, side, side), QColor(colours[i % len(colours)]))
            painter.setPen(QColor(t.foreground))
            painter.drawText(QRectF(side + 8, top, names_width - side - 10, row),
                             Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft, name)
        for index, column in enumerate(self.columns):
            for request, state in enumerate(column.states):
                paint_state(painter, self.cell_rect(request, index), state, t, faded=not column.ran)
        self._paint_header(painter, small, bold, names_width, header, w)
        self._paint_figures(painter, small, self._cells_right(w) + 12, header, row)
        if self.columns:  # the current pass: its column outlined
            x = names_width + (len(self.columns) - 1) * w
            painter.setPen(QPen(QColor(t.foreground), 2))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawRect(QRectF(x - 1, header, w + 1, row * len(self.names)))
        self._paint_legend(painter, small, t)
        painter.end()

    def _paint_header(self, painter: QPainter, small: QFont, bold: QFont, left: float, header: float,
                      w: float) -> None:
        t = self._theme
        fm = QFontMetricsF(small)
        every = next((k for k in TICKS if k * w >= fm.horizontalAdvance("888") + 6), TICKS[-1])
        current = self.current
        current_box = None
        if current is not None:
            text = f"pass {current}"
            bw = QFontMetricsF(bold).horizontalAdvance(text) + 8
            cx = left + (len(self.columns) - 0.5) * w
            current_box = QRectF(min(max(left, cx - bw / 2), self._cells_right(w) - bw), 1, bw, header - 3)
        painter.setFont(small)
        painter.setPen(QColor(t.muted))
        for index, column in enumerate(self.columns):
            if column.step % every:
                continue
            cx = left + (index + 0.5) * w
            box = QRectF(cx - 20, 0, 40, header - 2)
            if current_box is not None and box.adjusted(14, 0, -14, 0).intersects(current_box.adjusted(-4, 0, 4, 0)):
                continue
            painter.drawText(box, Qt.AlignmentFlag.AlignCenter, str(column.step))
        if current_box is not None:
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(QColor(t.foreground))
            painter.drawRoundedRect(current_box, 3, 3)
            painter.setPen(QColor(t.background))
            painter.setFont(bold)
            painter.drawText(current_box, Qt.AlignmentFlag.AlignCenter, f"pass {current}")

    def _paint_figures(self, painter: QPainter, small: QFont, left: float, header: float, row: float) -> None:
        """The figures' headers over their columns, and each request's figures in its row (before the end, one
        muted line saying when they come)."""
        t = self._theme
        painter.setFont(small)
        x = left
        align = Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft
        for title, width in zip(FIGURE_HEADERS, self._figure_widths(), strict=True):
            painter.setPen(QColor(t.muted))
            painter.drawText(QRectF(x, 0, width, header - 2), align, title)
            for i, figures in enumerate(self.figures):
                painter.setPen(QColor(t.foreground))
                painter.drawText(QRectF(x, header + i * row, width, row), align, figures[FIGURE_HEADERS.index(title)])
            x += width
        if not self.figures and self.names:
            painter.setPen(QColor(t.muted))
            painter.drawText(QRectF(left, header, x - left, row), align, "each request's figures after the last pass")

    def _paint_legend(self, painter: QPainter, small: QFont, t: Theme) -> None:
        fm = QFontMetricsF(small)
        painter.setFont(small)
        side = fm.height() * 0.8
        for key, box in self._legend_items(self.width()):
            swatch = QRectF(box.left() + 2, box.top() + (box.height() - side) / 2, side, side)
            if key == "current":
                painter.setPen(QPen(QColor(t.foreground), 2))
                painter.setBrush(Qt.BrushStyle.NoBrush)
                painter.drawRect(swatch)
            elif key == NOT_ARRIVED:
                painter.setPen(QPen(QColor(t.border), 1, Qt.PenStyle.DotLine))
                painter.setBrush(Qt.BrushStyle.NoBrush)
                painter.drawRect(swatch)
            else:
                paint_state(painter, swatch, key, t)
            painter.setPen(QColor(t.foreground))
            painter.drawText(QRectF(swatch.right() + 6, box.top(), box.width(), box.height()),
                             Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft, legend_text(key))
