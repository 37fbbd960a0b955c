"""Compare mode's identity strip: per token step, the token each run chose, equal or not, and the max |Δlogit|."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from PySide6.QtCore import QRect, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import QFrame, QHBoxLayout, QScrollArea, QSizePolicy, QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.compare.lockstep import format_logit_diff, token_step
from kvviz.app.views.labels import chip_text
from kvviz.core.records import RunPlan, StepRecord

PAD_X, PAD_Y, GAP = 5.0, 2.0, 6.0
SAME, DIFFERENT, LOGITS_DIFFER = "\u2713", "\u2717", "\u2260"  # check mark, cross, not-equal sign
ROW_TITLES = ("token step", "with cache", "without cache", "same  max |\u0394logit|")
PLACEHOLDER = "Compare mode: the token each run chose appears here, step by step."


@dataclass(frozen=True)
class IdentityEntry:
    """One token step of the strip, as drawn."""

    step: int  # 1-based token step
    cached: str  # chip_text of the cached run's token
    uncached: str  # chip_text of the uncached run's token
    same: bool  # the runs chose the same token
    logit_diff: str  # the max |Δlogit| of the step, compact ("3e-06", "0", "14")
    logits_agree: bool = True  # within the float noise of the step's record

    @property
    def mark(self) -> str:
        """✓ the same token and logits, ≠ the same token but logits beyond float noise, ✗ other tokens."""
        if not self.same:
            return DIFFERENT
        return SAME if self.logits_agree else LOGITS_DIFFER


class _Rows:
    """The strip's font and row geometry, shared by the titles and the entries."""

    def __init__(self, scale: float, base: QFont) -> None:
        self.font = QFont(base)
        self.font.setPointSizeF(10.0 * scale)
        self.metrics = QFontMetricsF(self.font)
        self.row_height = self.metrics.height() + 2 * PAD_Y + 3
        self.height = int(len(ROW_TITLES) * self.row_height + GAP)

    def row(self, index: int, left: float, width: float) -> QRectF:
        return QRectF(left, GAP / 2 + index * self.row_height, width, self.row_height - 3)


class _Titles(QWidget):
    """The row titles left of the entries."""

    def __init__(self, strip: IdentityStrip) -> None:
        super().__init__(strip)
        self._strip = strip

    def paintEvent(self, event: QPaintEvent) -> None:
        rows, theme = self._strip._rows, self._strip._theme
        painter = QPainter(self)
        painter.fillRect(self.rect(), QColor(theme.background))
        painter.setFont(rows.font)
        colours = (theme.muted, theme.teal, theme.amber, theme.muted)
        for index, (title, colour) in enumerate(zip(self._strip.row_titles, colours, strict=True)):
            painter.setPen(QColor(colour))
            painter.drawText(rows.row(index, 4, self.width() - 8),
                             Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, title)
        painter.end()


class _Entries(QWidget):
    """The entries, one column each; paints only the columns in the exposed rectangle."""

    def __init__(self, strip: IdentityStrip) -> None:
        super().__init__()
        self._strip = strip
        # it paints every pixel it exposes, and what it drew stays where it is when it grows: growing and
        # scrolling then paint only the columns that come into view
        self.setAttribute(Qt.WidgetAttribute.WA_OpaquePaintEvent, True)
        self.setAttribute(Qt.WidgetAttribute.WA_StaticContents, True)

    def paintEvent(self, event: QPaintEvent) -> None:
        strip, rows, theme = self._strip, self._strip._rows, self._strip._theme
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        exposed = event.rect()
        painter.fillRect(exposed, QColor(theme.background))
        painter.setFont(rows.font)
        if not strip._entries:
            painter.setPen(QColor(theme.muted))
            left_middle = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
            painter.drawText(self.rect().adjusted(6, 0, 0, 0), left_middle, strip._placeholder)
            painter.end()
            return
        lefts = strip._lefts
        first = max(0, bisect_right(lefts, exposed.left()) - 1)
        last = bisect_left(lefts, exposed.right() + 1)
        centre = Qt.AlignmentFlag.AlignCenter
        for i in range(first, min(last, len(strip._entries))):
            entry, left, width = strip._entries[i], lefts[i], strip._widths[i] - GAP
            painter.setPen(QColor(theme.muted))
            painter.drawText(rows.row(0, left, width), centre, str(entry.step))
            edge_alert = QColor(theme.alert)
            for row, text, colour in ((1, entry.cached, theme.teal), (2, entry.uncached, theme.amber)):
                rect = rows.row(row, left, width)
                painter.setPen(QPen(QColor(colour) if entry.same else edge_alert, 1.2))
                painter.setBrush(QColor(theme.raised) if entry.same else QColor(theme.alert_tint))
                painter.drawRoundedRect(rect, 4, 4)
                painter.setPen(QColor(theme.foreground))
                painter.drawText(rect, centre, text)
            painter.setPen(QColor(theme.teal if entry.mark == SAME else theme.alert))
            painter.drawText(rows.row(3, left, width), centre, f"{entry.mark} {entry.logit_diff}")
        painter.end()


class IdentityStrip(QWidget):
    """One column per token step: the token each run chose, a check mark when they are the same (a
    cross when not), and the step's max |Δlogit|. Scrolls sideways and keeps the newest step in
    view (unless scrolled back); a refresh paints only the new columns, so it stays cheap for
    hundreds of steps.

    A view (views.base.RunViewProtocol). `entries()` returns what is drawn. A plan without a twin
    leaves it empty.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._font_scale = 1.0
        self._rows = _Rows(1.0, self.font())
        self.row_titles: tuple[str, ...] = ROW_TITLES  # the runs' names: RunPlan.lockstep_names
        self._entries: list[IdentityEntry] = []
        self._lefts: list[float] = []  # x of each entry's column
        self._widths: list[float] = []  # each column's width, the gap after it included
        self._drawn = 0  # entries laid out and painted so far
        self._placeholder = PLACEHOLDER
        self._follow_newest = True
        self._width_of: dict[str, float] = {}
        self._theme = themes.current()

        self.titles = _Titles(self)
        self.canvas = _Entries(self)
        self.scroll = QScrollArea()
        self.scroll.setWidget(self.canvas)
        self.scroll.setWidgetResizable(False)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        bar = self.scroll.horizontalScrollBar()
        bar.rangeChanged.connect(self._on_range_changed)
        bar.valueChanged.connect(self._on_value_changed)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.titles)
        layout.addWidget(self.scroll, 1)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self._apply_theme()
        self._apply_fonts()

    # ----- public interface -----
    def reset(self, plan: RunPlan) -> None:
        titles = (ROW_TITLES[0], *plan.lockstep_names, ROW_TITLES[3])
        if titles != self.row_titles:
            self.row_titles = titles
            self._apply_fonts()
        self._entries, self._lefts, self._widths = [], [], []
        self._drawn = 0
        self._follow_newest = True
        self._placeholder = PLACEHOLDER if plan.twin is not None else "no compare run"
        self._resize_canvas()
        self.canvas.update()

    def apply(self, records: Sequence[StepRecord]) -> None:
        for record in records:
            step = token_step(record)
            if step is not None:
                self._entries.append(IdentityEntry(step.step, chip_text(step.cached.token_text),
                                                   chip_text(step.uncached.token_text), step.same,
                                                   format_logit_diff(step.max_abs_logit_diff), step.logits_agree))

    def refresh(self) -> None:
        """Lay out and paint the entries that arrived since the last refresh (only those)."""
        if self._drawn == len(self._entries):
            return
        first = self._drawn
        self._layout_from(first)
        self._resize_canvas()
        left = int(self._lefts[first]) if first else 0
        self.canvas.update(QRect(left, 0, self.canvas.width() - left, self.canvas.height()))

    def entries(self) -> list[IdentityEntry]:
        return list(self._entries)

    def entry_rect(self, index: int) -> QRect:
        """Where entry `index` is drawn, in the canvas's coordinates (the canvas scrolls sideways)."""
        return QRect(int(self._lefts[index]), 0, int(self._widths[index]), self.canvas.height())

    def set_font_scale(self, scale: float) -> None:
        self._font_scale = scale
        self._apply_fonts()
        self._layout_from(0)
        self._resize_canvas()
        self.canvas.update()

    def set_theme(self, theme: Theme) -> None:
        self._theme = theme
        self._apply_theme()

    def _apply_theme(self) -> None:
        background = self._theme.background
        self.scroll.setStyleSheet(f"QScrollArea, QScrollArea > QWidget > QWidget {{ background: {background}; }}")
        self.titles.update()
        self.canvas.update()

    def sizeHint(self) -> QSize:
        return QSize(600, self._strip_height())

    def minimumSizeHint(self) -> QSize:
        return QSize(200, self._strip_height())

    # ----- layout -----
    def set_scroll_bar_shown(self, shown: bool) -> None:
        """Without its scroll bar (a slide), the strip is as tall as its rows and shows the newest steps."""
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded if shown
                                                 else Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.updateGeometry()

    def _strip_height(self) -> int:
        bar = self.scroll.horizontalScrollBarPolicy() != Qt.ScrollBarPolicy.ScrollBarAlwaysOff
        return self._rows.height + (self.scroll.horizontalScrollBar().sizeHint().height() if bar else 0)

    def _text_width(self, text: str) -> float:
        width = self._width_of.get(text)
        if width is None:
            width = self._width_of[text] = self._rows.metrics.horizontalAdvance(text)
        return width

    def _layout_from(self, first: int) -> None:
        del self._lefts[first:], self._widths[first:]
        x = self._lefts[-1] + self._widths[-1] if self._lefts else GAP
        for entry in self._entries[first:]:
            texts = (str(entry.step), f"{entry.mark} {entry.logit_diff}")
            width = max(max(self._text_width(t) for t in texts),
                        max(self._text_width(t) for t in (entry.cached, entry.uncached)) + 2 * PAD_X) + GAP
            self._lefts.append(x)
            self._widths.append(width)
            x += width
        self._drawn = len(self._entries)

    def _resize_canvas(self) -> None:
        width = int(self._lefts[-1] + self._widths[-1]) + 1 if self._entries else 600
        # resize, not setFixedSize: a new minimum size would ask every layout up to the window to redo
        # itself on each new entry; the scroll area only needs the canvas's size
        self.canvas.resize(width, self._rows.height)

    def _on_range_changed(self, _minimum: int, maximum: int) -> None:
        if self._follow_newest:
            self.scroll.horizontalScrollBar().setValue(maximum)

    def _on_value_changed(self, value: int) -> None:
        self._follow_newest = value >= self.scroll.horizontalScrollBar().maximum()

    def _apply_fonts(self) -> None:
        self._rows = _Rows(self._font_scale, self.font())
        self._width_of = {}
        titles_width = max(self._rows.metrics.horizontalAdvance(t) for t in self.row_titles) + 14
        self.titles.setFixedWidth(int(titles_width))
        self.setFixedHeight(self._strip_height())
        self.titles.update()
