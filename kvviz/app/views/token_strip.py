"""The token strip: prompt and generated tokens as chips, the newest highlighted."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QPainter, QPaintEvent, QPen, QResizeEvent
from PySide6.QtWidgets import QSizePolicy, QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.labels import chip_text
from kvviz.core.records import RunPlan, StepRecord

PAD_X, PAD_Y, GAP = 5.0, 3.0, 8.0
MAX_ROWS = 2
TYPICAL_TOKEN = "\u00b7word"  # a token still to come is reckoned this wide, to keep the rows the run will fill


def rows_needed(widths: Sequence[float], width: float) -> int:
    """How many rows chips of `widths` wrap into, `width` wide (as `layout_strip` wraps them)."""
    rows, x = 1, GAP
    for w in widths:
        if x > GAP and x + w > width - GAP:
            rows, x = rows + 1, GAP
        x += w + GAP
    return rows


@dataclass(frozen=True)
class StripLayout:
    """Where the chips go: (token index, rect) for each chip shown, and the "+N earlier" label's
    rect (None when every token is shown), N being `hidden`."""

    chips: list[tuple[int, QRectF]]
    label: QRectF | None
    hidden: int


def layout_strip(widths: Sequence[float], width: float, chip_height: float, row_height: float,
                 label_width: Callable[[int], float], max_rows: int = MAX_ROWS) -> StripLayout:
    """Chips of `widths` wrapped into rows `width` wide; the newest `max_rows` rows are shown.

    When earlier rows are cut, the rows start after a left margin that holds the label "+N
    earlier" (`label_width(n)` is its width), so the label never covers a chip. The margin fits
    any N of as many digits (three at least), so the chips do not move at every new token.
    """
    def wrap(left: float) -> list[list[int]]:
        rows: list[list[int]] = [[]]
        x = left
        for i, w in enumerate(widths):
            if rows[-1] and x + w > width - GAP:
                rows.append([])
                x = left
            rows[-1].append(i)
            x += w + GAP
        return rows

    left, label_w, rows = GAP, 0.0, wrap(GAP)
    digits = 3
    while len(rows) > max_rows:
        label_w = max(label_width(int(d * digits)) for d in "0123456789")
        left = GAP + label_w + GAP
        rows = wrap(left)
        hidden = sum(len(r) for r in rows[:-max_rows])
        if len(str(hidden)) <= digits:
            break
        digits = len(str(hidden))
    hidden = sum(len(r) for r in rows[:-max_rows]) if len(rows) > max_rows else 0
    chips = []
    for r, row in enumerate(rows[-max_rows:]):
        x, y = left, GAP / 2 + r * row_height
        for i in row:
            chips.append((i, QRectF(x, y, widths[i], chip_height)))
            x += widths[i] + GAP
    label = QRectF(GAP, GAP / 2, label_w, chip_height) if hidden else None
    return StripLayout(chips, label, hidden)


class TokenStrip(QWidget):
    """Chips for every token, wrapped over up to two rows; the newest rows stay visible. It is as tall as the
    rows the run will fill at this width (its tokens to come reckoned as TYPICAL_TOKEN), so that a short run
    on a short screen leaves its second row to the grid; a run that needs more takes it when it gets there.

    Prompt chips are grey, generated chips have an amber edge, the newest token is filled
    amber, and the chips fed to the model in the latest step are underlined in amber. Spaces show as
    a middle dot, newlines as a return arrow. A round of speculative decoding adds every token it kept: the
    drafts the target accepted, filled in the drafted colour, then its own token, the newest (its rejected drafts
    are no tokens of the text: only the fed chips it kept are underlined).

    A view (views.base.RunViewProtocol): `reset(plan)`, `apply(records)`, `refresh()`.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._labels: list[str] = []
        self._prompt_tokens = 0
        self._fed = (0, 0)
        self._accepted = (0, 0)  # the chips of the drafts the latest speculative round accepted
        self._font_scale = 1.0
        self._widths: list[float] = []
        self._to_come = 0  # tokens the run may still generate
        self._rows = MAX_ROWS  # the rows its height holds
        self._theme = themes.current()
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self._apply_fonts()

    def reset(self, plan: RunPlan) -> None:
        self._labels = [chip_text(label) for label in plan.prompt_labels]
        self._prompt_tokens = plan.prompt_tokens
        self._fed = self._accepted = (0, 0)
        self._widths = [self._chip_width(text) for text in self._labels]
        self._to_come = plan.budget
        self._fit_rows()
        self.update()

    def apply(self, records: Sequence[StepRecord]) -> None:
        for record in records:
            self._fed = (record.fed_start, record.fed_stop)
            if record.token_id is None:
                continue
            spec = record.speculation
            added = spec.token_labels if spec is not None else (record.token_text,)
            if spec is not None:  # fed and kept: the pending token and the accepted drafts (the rest rolled back)
                self._fed = (record.fed_start, min(record.fed_stop, spec.rolled_back[0]))
                self._accepted = (spec.start + 1, spec.start + 1 + spec.accepted)
            for label in added:
                text = chip_text(label)
                self._labels.append(text)
                self._widths.append(self._chip_width(text))
            self._to_come = max(0, self._to_come - len(added))
            if self._rows < MAX_ROWS:
                self._fit_rows()

    def refresh(self) -> None:
        self.update()

    def tokens(self) -> list[str]:
        """The chip texts, prompt first."""
        return list(self._labels)

    @property
    def accepted_indices(self) -> range:
        """The chips of the drafts the latest speculative round accepted (filled in the drafted colour)."""
        return range(*self._accepted)

    @property
    def newest_index(self) -> int | None:
        """Index of the highlighted chip: the latest generated token, None before any."""
        return len(self._labels) - 1 if len(self._labels) > self._prompt_tokens else None

    def set_font_scale(self, scale: float) -> None:
        self._font_scale = scale
        self._apply_fonts()
        self._widths = [self._chip_width(text) for text in self._labels]
        self._fit_rows(force=True)
        self.update()

    def set_theme(self, theme: Theme) -> None:
        self._theme = theme
        self.update()

    def _apply_fonts(self) -> None:
        font = QFont(self.font())
        font.setPointSizeF(11.0 * self._font_scale)
        self._font = font
        self._metrics = QFontMetricsF(font)
        self._width_of: dict[str, float] = {}  # chip text -> width in this font (shaping text is slow)

    def _chip_width(self, text: str) -> float:
        width = self._width_of.get(text)
        if width is None:
            width = self._width_of[text] = self._metrics.horizontalAdvance(text) + 2 * PAD_X
        return width

    def _row_height(self) -> float:
        return self._metrics.height() + 2 * PAD_Y + GAP

    def _fit_rows(self, force: bool = False) -> None:
        """Hold the rows the run's chips fill at this width, those to come reckoned TYPICAL_TOKEN wide."""
        typical = self._chip_width(TYPICAL_TOKEN)
        rows = min(MAX_ROWS, rows_needed([*self._widths, *[typical] * self._to_come], max(1, self.width())))
        if rows != self._rows or force:
            self._rows = rows
            self.updateGeometry()

    def sizeHint(self) -> QSize:
        return QSize(600, int(self._row_height() * self._rows + GAP + 2))

    def minimumSizeHint(self) -> QSize:
        return QSize(100, int(self._row_height() * self._rows + GAP + 2))

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            self._fit_rows()

    def chip_layout(self) -> StripLayout:
        """Where the chips and the "+N earlier" label go at the strip's current width."""
        row_h = self._row_height()
        return layout_strip(self._widths, self.width(), row_h - GAP, row_h,
                            lambda n: self._metrics.horizontalAdvance(earlier_label(n)), self._rows)

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        theme = self._theme
        painter.fillRect(self.rect(), QColor(theme.background))
        painter.setFont(self._font)
        if not self._labels:
            painter.setPen(QColor(theme.muted))
            align = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
            painter.drawText(self.rect().adjusted(6, 0, 0, 0), align, "Tokens appear here once the model is loaded.")
            painter.end()
            return
        layout = self.chip_layout()
        newest = self.newest_index
        fed_start, fed_stop = self._fed
        accepted_start, accepted_stop = self._accepted
        for i, rect in layout.chips:
            generated = i >= self._prompt_tokens
            if i == newest:
                fill, edge, ink = QColor(theme.amber), QColor(theme.amber), QColor(theme.on_amber)
            elif accepted_start <= i < accepted_stop:
                fill, edge, ink = QColor(theme.drafted), QColor(theme.drafted), QColor(theme.background)
            elif generated:
                fill, edge, ink = QColor(theme.raised), QColor(theme.amber), QColor(theme.foreground)
            else:
                fill, edge, ink = QColor(theme.chip), QColor(theme.chip_edge), QColor(theme.foreground)
            painter.setPen(QPen(edge, 1.2))
            painter.setBrush(fill)
            painter.drawRoundedRect(rect, 4, 4)
            painter.setPen(ink)
            painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, self._labels[i])
            if fed_start <= i < fed_stop:
                painter.setPen(QPen(QColor(theme.amber), 3.0))
                painter.drawLine(QPointF(rect.left() + 3, rect.bottom() + 4.0),
                                 QPointF(rect.right() - 3, rect.bottom() + 4.0))
        if layout.label is not None:
            painter.setPen(QColor(theme.muted))
            painter.drawText(layout.label, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                             earlier_label(layout.hidden))
        painter.end()


def earlier_label(hidden: int) -> str:
    """The label for `hidden` tokens that no longer fit the strip."""
    return f"+{hidden} earlier"
