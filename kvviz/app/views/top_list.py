"""The attention view's list of each head's heaviest positions, painted in aligned columns."""

from __future__ import annotations

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFontMetrics, QPainter, QPaintEvent
from PySide6.QtWidgets import QSizePolicy, QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.attention_state import TOP_POSITIONS, tops_text

TOKEN_ROOM = "wwwwww"  # a token in the top list is cut to this text's width


class TopList(QWidget):
    """Each head's heaviest positions, in cells of aligned columns: "h0:", then per position its token, "@" its
    position and its weight. A line holds as many heads' cells as its width does, so no line wraps; the height
    is kept for every head of the run (`reserve`), so new weights never relayout the window. `text()` gives the
    same as plain text."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._tops: list[tuple[int, list[tuple[str, int, float]]]] = []
        self._heads, self._width = 1, 10  # reserved: cells, and positions (for the widest "@12")
        self._entries = TOP_POSITIONS  # a head's entries: its top positions, and a learned sink's share first
        self._theme = themes.current()
        self._columns: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)  # head, token, position, weight, gap
        policy = QSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)  # its height: for its width
        policy.setHeightForWidth(True)
        self.setSizePolicy(policy)
        self._measure()

    def reserve(self, heads: int, width: int) -> None:
        """Room for `heads` heads' cells and positions up to `width` (a learned sink's share is given room when
        the first one comes, once a run)."""
        if (heads, width, TOP_POSITIONS) != (self._heads, self._width, self._entries):
            self._heads, self._width, self._entries = max(1, heads), max(1, width), TOP_POSITIONS
            self._measure()
            self.updateGeometry()

    def set_tops(self, tops: list[tuple[int, list[tuple[str, int, float]]]]) -> None:
        """(head, [(token, position, weight)]) per head shown, heaviest first (a learned sink: position -1)."""
        self._tops = tops
        entries = max((len(entries) for _head, entries in tops), default=0)
        if entries > self._entries:  # a model with learned sinks: their share is one more entry a head
            self._entries = entries
            self._measure()
            self.updateGeometry()
        self.update()

    def set_theme(self, theme: Theme) -> None:
        self._theme = theme
        self.update()

    def text(self) -> str:
        return tops_text(self._tops)

    def _measure(self) -> None:
        metrics = QFontMetrics(self.font())
        space = metrics.horizontalAdvance(" ")
        self._columns = (metrics.horizontalAdvance(f"h{self._heads - 1}:") + space,
                         metrics.horizontalAdvance(TOKEN_ROOM),
                         metrics.horizontalAdvance(f" @{self._width - 1}"),
                         metrics.horizontalAdvance(" 0.00"),
                         2 * space,  # between a head's positions
                         5 * space)  # between heads

    def _cell_width(self, token: int | None = None) -> int:
        head, token_w, position, weight, entry_gap, _gap = self._columns
        return head + self._entries * ((token_w if token is None else token) + position + weight + entry_gap)

    def _per_line(self, width: int) -> int:
        return max(1, (width + self._columns[5]) // (self._cell_width() + self._columns[5]))

    def _line_height(self) -> int:
        return QFontMetrics(self.font()).lineSpacing()

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        lines = -(-self._heads // self._per_line(width))
        return lines * self._line_height()

    def sizeHint(self) -> QSize:
        width = (self._cell_width() + self._columns[5]) * min(self._heads, 3)
        return QSize(width, self.heightForWidth(width))

    def minimumSizeHint(self) -> QSize:
        return QSize(80, self._line_height())  # the height for its width: AttentionView.minimumSizeHint

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() == event.Type.FontChange:
            self._measure()
            self.updateGeometry()

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        metrics = painter.fontMetrics()
        head_w, token_w, position_w, weight_w, entry_gap, gap = self._columns
        short = self._cell_width() - self.width()
        if short > 0:  # a narrow view: the tokens give up room, each column stays apart
            token_w = max(metrics.horizontalAdvance("ww"), token_w - short // self._entries)
        cell = self._cell_width(token_w)
        per_line, line = self._per_line(self.width()), self._line_height()
        left = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
        right = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
        ink, muted = QColor(self._theme.foreground), QColor(self._theme.muted)
        for index, (head, tops) in enumerate(self._tops):
            x, y = (index % per_line) * (cell + gap), (index // per_line) * line
            painter.setPen(muted)
            painter.drawText(QRectF(x, y, head_w, line), left, f"h{head}:")
            x += head_w
            for token, position, weight in tops:  # "·flies @1 0.52": the token set against its position
                painter.setPen(ink)
                painter.drawText(QRectF(x, y, token_w, line), right,
                                 metrics.elidedText(token, Qt.TextElideMode.ElideRight, token_w))
                painter.setPen(muted)
                if position >= 0:  # a learned sink has no position
                    painter.drawText(QRectF(x + token_w, y, position_w, line), left, f" @{position}")
                painter.setPen(ink)
                painter.drawText(QRectF(x + token_w + position_w, y, weight_w, line), right, f"{weight:.2f}")
                x += token_w + position_w + weight_w + entry_gap
        painter.end()
