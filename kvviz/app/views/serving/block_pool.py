"""The block pool as a grid of blocks: each block filled in its requests' colours (a band each when shared, with
the reference count on it), cached blocks that no request holds hatched (a served trace's prefix cache), free
blocks as empty outlines; its tooltip names the block's tokens and owners."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetricsF, QHelpEvent, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.serving.pool_state import BlockCell, block_tooltip

CELL = 40  # pixels a side at zoom 1, at least
MAX_CELL = 72  # and at most: blocks grow with the widget's width up to this
COLUMNS = 8  # blocks to a row when the width allows
GAP = 6


def request_colours(theme: Theme) -> tuple[str, ...]:
    """One colour a request, told apart from each other in both themes (cycled past the last)."""
    return (theme.teal, theme.amber, *theme.series[:1], *theme.series[2:])


def _luminance(colour: str) -> float:
    c = QColor(colour)
    return 0.299 * c.red() + 0.587 * c.green() + 0.114 * c.blue()


def text_on(colour: str, theme: Theme) -> QColor:
    """The theme's dark text (the newest chip's) or its lightest colour, whichever reads on `colour`."""
    light = max(theme.foreground, theme.background, key=_luminance)
    return QColor(theme.on_amber if _luminance(colour) > 140 else light)


def paint_cached(painter: QPainter, rect: QRectF, t: Theme) -> None:
    """A cached block (no request holds it, its tokens kept for a later prefix): hatched, a solid outline."""
    painter.setPen(QPen(QColor(t.muted), 1.5))
    painter.setBrush(QColor(t.chip))
    painter.drawRoundedRect(rect, 4, 4)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(QBrush(QColor(t.muted), Qt.BrushStyle.BDiagPattern))
    painter.drawRoundedRect(rect.adjusted(1, 1, -1, -1), 4, 4)


class BlockPool(QWidget):
    """The pool's blocks in rows as wide as the widget allows; `show_cells(cells, block_size)` draws a pass."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("blockPool")
        self.cells: list[BlockCell] = []
        self.block_size = 1
        self.names: tuple[str, ...] | None = None  # the requests' names in tooltips (None: R1, R2, ...)
        self.least_cell = CELL  # a block's least side at zoom 1 (a trace's pool shares the page with more)
        self.columns = COLUMNS  # blocks to a row where the width allows them more than the least side
        self._scale = 1.0
        self._compact = False  # see set_compact
        self._theme = themes.current()
        self.setMouseTracking(True)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)  # the keys step the batch; none of them types
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)

    def show_cells(self, cells: list[BlockCell], block_size: int, names: tuple[str, ...] | None = None) -> None:
        resized = len(cells) != len(self.cells)
        self.cells, self.block_size, self.names = cells, block_size, names
        if resized:
            self.setMinimumHeight(self.heightForWidth(self.width()))
        self.update()

    def set_font_scale(self, scale: float) -> None:
        self._scale = scale
        self.setMinimumHeight(self.heightForWidth(self.width()))
        self.update()

    def set_theme(self, theme: Theme) -> None:
        self._theme = theme
        self.update()

    def set_compact(self, compact: bool) -> None:
        """Compact (a slide short of height): each block at its least side at this zoom, as many to a row as
        the width holds; else the blocks grow to fill COLUMNS to a row."""
        self._compact = compact
        self.setMinimumHeight(self.heightForWidth(self.width()))
        self.update()

    def _side(self, width: int | None = None) -> float:
        """A block's side: `columns` to a row of the widget's width, between the zoomed least side and MAX_CELL."""
        width = self.width() if width is None else width
        fitted = (width + GAP) / self.columns - GAP
        if self._compact:
            return self.least_cell * self._scale
        return max(self.least_cell * self._scale, min(MAX_CELL * min(self._scale, 1.25), fitted))

    def _columns(self, width: int | None = None) -> int:
        pitch = self._side(width) + GAP
        return max(1, int(((width if width is not None else self.width()) + GAP) // pitch))

    def heightForWidth(self, width: int) -> int:
        rows = -(-max(1, len(self.cells)) // self._columns(width))
        return int(rows * (self._side(width) + GAP))

    def resizeEvent(self, event) -> None:
        # Its height follows its width, as a minimum: a layout asked for a height for width (a scroll area's)
        # would give every other widget its preferred height too, and scroll on a 720p screen.
        self.setMinimumHeight(self.heightForWidth(self.width()))
        super().resizeEvent(event)

    def sizeHint(self) -> QSize:
        width = int(self.columns * (self.least_cell * self._scale + GAP))
        return QSize(width, self.heightForWidth(width))

    def minimumSizeHint(self) -> QSize:
        return QSize(int(4 * (self.least_cell * self._scale + GAP)), int(self.least_cell * self._scale + GAP))

    def cell_rect(self, index: int) -> QRectF:
        columns, pitch = self._columns(), self._side() + GAP
        row, column = divmod(index, columns)
        return QRectF(column * pitch, row * pitch, self._side(), self._side())

    def cell_at(self, point: QPointF) -> BlockCell | None:
        for i, cell in enumerate(self.cells):
            if self.cell_rect(i).contains(point):
                return cell
        return None

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip and isinstance(event, QHelpEvent):
            cell = self.cell_at(QPointF(event.pos()))
            if cell is None:
                QToolTip.hideText()
            else:
                QToolTip.showText(event.globalPos(), block_tooltip(cell, self.block_size, self.names), self)
            return True
        return super().event(event)

    def paintEvent(self, event: QPaintEvent) -> None:
        t = self._theme
        colours = request_colours(t)
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.fillRect(self.rect(), QColor(t.background))
        small = QFont(self.font())
        small.setPointSizeF(max(6.0, 9.0 * self._scale))  # as the tick labels: 27 px on a slide
        big = QFont(self.font())
        big.setPointSizeF(max(8.0, 12.0 * self._scale))
        big.setBold(True)
        for i, cell in enumerate(self.cells):
            rect = self.cell_rect(i)
            if cell.free:
                painter.setPen(QPen(QColor(t.border_strong), 1.5, Qt.PenStyle.DashLine))
                painter.setBrush(QColor(t.empty))
                painter.drawRoundedRect(rect, 4, 4)
                painter.setPen(QColor(t.muted))
                painter.setFont(small)
                painter.drawText(rect.adjusted(4, 2, -2, -2), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop,
                                 str(cell.block))
                continue
            if cell.cached:
                paint_cached(painter, rect, t)
                painter.setPen(QColor(t.foreground))
                painter.setFont(small)
                painter.drawText(rect.adjusted(4, 2, -2, -2), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop,
                                 str(cell.block))
                continue
            painter.setPen(Qt.PenStyle.NoPen)
            band = rect.width() / len(cell.owners)
            for n, owner in enumerate(cell.owners):  # a band per request that references it
                painter.setBrush(QColor(colours[owner % len(colours)]))
                painter.drawRect(QRectF(rect.left() + n * band, rect.top(), band, rect.height()))
            unfilled = 1 - cell.filled / self.block_size  # the empty tail of a block: internal fragmentation
            if unfilled > 0:
                tail = QColor(t.background)
                tail.setAlpha(150)
                painter.setBrush(tail)
                painter.drawRect(QRectF(rect.left(), rect.bottom() - rect.height() * unfilled, rect.width(),
                                        rect.height() * unfilled))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.setPen(QPen(QColor(t.foreground if cell.shared else t.background), 3 if cell.shared else 1))
            painter.drawRoundedRect(rect, 4, 4)
            painter.setPen(text_on(colours[cell.owners[0] % len(colours)], t))
            painter.setFont(small)
            line = QFontMetricsF(small).height()
            two_lines = rect.height() >= 2 * line + 3
            roomy = rect.width() >= CELL * 0.95 and rect.height() >= line + QFontMetricsF(big).height() + 4
            label = str(cell.block)
            if cell.shared and not roomy and not two_lines:  # too short for the count below:
                label = f"{cell.block} \u00d7{len(cell.owners)}"  # beside the number, where it fits
                if QFontMetricsF(small).horizontalAdvance(label) > rect.width() - 6:
                    label = f"\u00d7{len(cell.owners)}"  # the count alone (the number is in the tooltip)
            painter.drawText(rect.adjusted(4, 2, -2, -2), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop,
                             label)
            if cell.shared and roomy:
                painter.setFont(big)
                painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, f"\u00d7{len(cell.owners)}")
            elif cell.shared and two_lines:  # a small block: the count in its corner, clear of its number
                small.setBold(True)
                painter.setFont(small)
                corner = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignBottom
                painter.drawText(rect.adjusted(2, 2, -3, -1), corner, f"\u00d7{len(cell.owners)}")
                small.setBold(False)
        painter.end()
