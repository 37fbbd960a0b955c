"""The prefix cache's radix tree (SGLang's RadixAttention), drawn left to right from the record's `tree`: a box a
run of tokens (its first tokens, elided, and its length), its hit count, live runs (a running request holds them)
filled, cached ones (evictable, leaves first) dashed; a dot for the root. Short of height (720p), each box takes
one line instead of two."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QHelpEvent, QPainter, QPainterPath, QPaintEvent, QPen
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.serving.trace_state import node_tooltip, run_text, tree_rows
from kvviz.core.counting import plural
from kvviz.core.serve_records import RadixNode

ROOT = 16.0  # the root's column, in pixels at zoom 1
MIN_BOX, MAX_BOX = 92.0, 190.0  # a box's width at zoom 1
GAP = 16.0  # between a parent's box and its child's


def paint_node_box(painter: QPainter, rect: QRectF, live: bool, t: Theme) -> None:
    if live:
        fill = QColor(t.teal)
        fill.setAlpha(70)
        painter.setBrush(fill)
        painter.setPen(QPen(QColor(t.teal), 2))
    else:
        painter.setBrush(QColor(t.empty))
        painter.setPen(QPen(QColor(t.border_strong), 1.5, Qt.PenStyle.DashLine))
    painter.drawRoundedRect(rect, 4, 4)


class RadixTreeView(QWidget):
    """`show_tree(tree)` draws a record's tree; `boxes` are its nodes' rectangles, in the tree's order."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("radixTree")
        self.tree: tuple[RadixNode, ...] = ()
        self._rows: list[tuple[int, int]] = []
        self._scale = 1.0
        self._theme = themes.current()
        self.setMouseTracking(True)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)  # the keys step the trace; none of them types
        # its preferred height is its least (a box a line): a page in a scroll area that asks its height for its
        # width gets the preferred heights, and would scroll at 720p; the room left over makes the boxes two lines
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)

    def show_tree(self, tree: Sequence[RadixNode]) -> None:
        tree = tuple(tree)
        if tree == self.tree:
            return
        self.tree, self._rows = tree, tree_rows(tree)
        self._fit()

    def set_font_scale(self, scale: float) -> None:
        self._scale = scale
        self._fit()

    def set_theme(self, theme: Theme) -> None:
        self._theme = theme
        self.update()

    # ----- geometry -----
    def _font(self, bold: bool = False) -> QFont:
        font = QFont(self.font())
        font.setPointSizeF(max(6.5, 9.0 * self._scale))  # 27 px on a slide
        font.setBold(bold)
        return font

    def _line(self) -> float:
        return QFontMetricsF(self._font()).height()

    def _rows_count(self) -> int:
        return max((r for _d, r in self._rows), default=0) + 1

    def _height_for(self, lines: int, pad: float) -> int:
        """The height the rows take with boxes of `lines` lines, `pad` pixels in a box and between two rows."""
        return int(self._rows_count() * (lines * self._line() + 2 * pad * self._scale) + 4)

    def _spacing(self) -> tuple[int, float]:
        """A box's lines and its padding: two lines, roomy or tight, where the height allows, else one."""
        for lines, pad in ((2, 4.0), (2, 1.5), (1, 3.0)):
            if self.height() >= self._height_for(lines, pad):
                break
        return lines, pad

    @property
    def two_lines(self) -> bool:
        """Each box on two lines (its run, then its length and hits), where the height allows."""
        return self._spacing()[0] == 2

    def _box_height(self) -> float:
        lines, pad = self._spacing()
        return lines * self._line() + pad * self._scale

    def _box_width(self) -> float:
        depth = max((d for d, _r in self._rows), default=0) + 1
        room = (self.width() - ROOT * self._scale) / depth - GAP * self._scale
        return max(MIN_BOX * self._scale, min(MAX_BOX * self._scale, room))

    def box_rect(self, index: int) -> QRectF:
        depth, row = self._rows[index]
        w, h = self._box_width(), self._box_height()
        pitch = h + self._spacing()[1] * self._scale
        return QRectF(ROOT * self._scale + GAP * self._scale + depth * (w + GAP * self._scale), row * pitch + 2, w, h)

    def node_texts(self) -> list[tuple[str, str]]:
        """What each node's box says, in the tree's order: its run's first tokens, its length and hit count."""
        return [(f"\u201c{run_text(node)}\u201d", f"{plural(len(node.token_ids), 'token')} \u00b7 "
                                                  f"{plural(node.hits, 'hit')}") for node in self.tree]

    @property
    def boxes(self) -> list[QRectF]:
        return [self.box_rect(i) for i in range(len(self.tree))]

    def _fit(self) -> None:
        depth = max((d for d, _r in self._rows), default=0) + 1
        self.setMinimumWidth(int((ROOT + GAP + depth * (MIN_BOX + GAP)) * self._scale))
        self.setMinimumHeight(self._height_for(1, 3.0))
        self.updateGeometry()
        self.update()

    def sizeHint(self) -> QSize:
        return QSize(480, self._height_for(1, 3.0))

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip and isinstance(event, QHelpEvent):
            point = QPointF(event.pos())
            hit = next((i for i in range(len(self.tree)) if self.box_rect(i).contains(point)), None)
            if hit is None:
                QToolTip.hideText()
            else:
                QToolTip.showText(event.globalPos(), node_tooltip(self.tree[hit]), self)
            return True
        return super().event(event)

    # ----- drawing -----
    def paintEvent(self, event: QPaintEvent) -> None:
        t = self._theme
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.fillRect(self.rect(), QColor(t.background))
        font, bold = self._font(), self._font(bold=True)
        fm = QFontMetricsF(font)
        if not self.tree:
            painter.setFont(font)
            painter.setPen(QColor(t.muted))
            painter.drawText(QRectF(0, 0, self.width(), self._box_height()),
                             Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft,
                             "Empty: no prompt is cached yet.")
            painter.end()
            return
        boxes = self.boxes
        root = QPointF(ROOT * self._scale / 2, boxes[0].center().y())
        painter.setPen(QPen(QColor(t.muted), 1.3))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        for node, box in zip(self.tree, boxes, strict=True):  # the edges first, under the boxes
            start = QPointF(boxes[node.parent].right(), boxes[node.parent].center().y()) if node.parent >= 0 else root
            end = QPointF(box.left(), box.center().y())
            path = QPainterPath(start)
            bend = box.left() - GAP * self._scale / 2
            path.lineTo(bend, start.y())
            path.lineTo(bend, end.y())
            path.lineTo(end)
            painter.drawPath(path)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(QColor(t.foreground))
        painter.drawEllipse(root, 4 * self._scale, 4 * self._scale)
        inner = 6 * self._scale
        two = self.two_lines
        for node, box, (run, length) in zip(self.tree, boxes, self.node_texts(), strict=True):
            paint_node_box(painter, box, node.live, t)
            if not two:
                length = f"{len(node.token_ids)} tok \u00b7 {plural(node.hits, 'hit')}"
            room = box.width() - inner
            line = QRectF(box.left() + inner / 2, box.top() + (box.height() - (2 if two else 1) * fm.height()) / 2,
                          room, fm.height())
            counts_font = bold if node.hits else font
            counts_width = min(room, QFontMetricsF(counts_font).horizontalAdvance(length)) if two else \
                min(room * 0.55, QFontMetricsF(counts_font).horizontalAdvance(length))
            painter.setPen(QColor(t.foreground))
            painter.setFont(font)
            text_room = room if two else room - counts_width - 6
            painter.drawText(line, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                             fm.elidedText(run, Qt.TextElideMode.ElideRight, text_room))
            painter.setFont(counts_font)
            painter.setPen(QColor(t.foreground if node.hits else t.muted))
            where = line.translated(0, fm.height()) if two else QRectF(line.right() - counts_width, line.top(),
                                                                       counts_width, line.height())
            painter.drawText(where, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                             QFontMetricsF(counts_font).elidedText(length, Qt.TextElideMode.ElideRight, where.width()))
        painter.end()
