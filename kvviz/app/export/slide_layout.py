"""A lesson slide's layout and painting: 16:9, the step's title, text and question over the app's view;
`slide_png` for one slide, `Deck` for the PDF with a page per slide."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QMarginsF, QPoint, QRectF, QSizeF, Qt
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontMetricsF,
    QImage,
    QPageLayout,
    QPageSize,
    QPaintDevice,
    QPainter,
    QPdfWriter,
    QPen,
    QRegion,
)
from PySide6.QtWidgets import QWidget

from kvviz.app import theme as themes
from kvviz.app.export.caption import quoted_prompt
from kvviz.app.export.files import ExportError
from kvviz.app.export.render import encode_png, painting, prepared_for_export

SLIDE_SIZE = (1600, 900)  # logical pixels; PDF pages are as many points, PNGs scale the whole slide to --width
MARGIN = 40
TITLE_BOX = QRectF(MARGIN, 24, SLIDE_SIZE[0] - 2 * MARGIN, 64)
TEXT_BOX = QRectF(MARGIN, 92, SLIDE_SIZE[0] - 2 * MARGIN, 84)
QUESTION_BOX = QRectF(MARGIN, 184, SLIDE_SIZE[0] - 2 * MARGIN, 76)
FOOTER_BOX = QRectF(MARGIN, SLIDE_SIZE[1] - 36, SLIDE_SIZE[0] - 2 * MARGIN, 28)
ANSWER_WIDTH = 560  # the right part of the question box, where the answer goes
VIEW_TOP = {False: 184, True: 272}  # where the view starts, without and with a question box
VIEW_BOTTOM = SLIDE_SIZE[1] - 44
PROMPT_FOR_A_GUESS = "Predict, then reveal"
SMALLEST_TEXT = 23  # logical pixels: no text on a slide is smaller than 2.5 % of its height


@dataclass(frozen=True)
class SlideText:
    """Everything a slide says; a step's notes are not among it."""

    title: str
    text: str
    place: str  # "step 2 of 5"
    question: str  # the question's words; "" for a step without one
    answer: str  # "Answer: 5 (measured)" on the slide that reveals it, else ""
    footer: str  # the run shown: prompt, model, tokens, cache mode


def _font(pixels: float, bold: bool = False) -> QFont:
    font = QFont()
    font.setPixelSize(max(1, round(pixels)))
    font.setBold(bold)
    return font


WRAP = int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop | Qt.TextFlag.TextWordWrap)
WRAP_MIDDLE = int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter | Qt.TextFlag.TextWordWrap)


def _fitting_font(text: str, box: QRectF, largest: float, smallest: float, bold: bool = False,
                  flags: int = WRAP) -> QFont:
    """The largest font from `largest` down to `smallest` pixels in which `text` fits `box`, wrapped."""
    size = largest
    while True:
        font = _font(size, bold)
        height = QFontMetricsF(font).boundingRect(box, flags, text).height()
        if height <= box.height() or size <= smallest:
            return font
        size = max(smallest, size * 0.92)


def _draw_text(painter: QPainter, box: QRectF, text: str, font: QFont, colour: str, flags: int = WRAP) -> None:
    painter.setFont(font)
    painter.setPen(QColor(colour))
    painter.drawText(box, flags, text)


def view_rect(text: SlideText) -> QRectF:
    """Where the view goes on a slide: below the question box when there is one."""
    top = VIEW_TOP[bool(text.question)]
    return QRectF(MARGIN, top, SLIDE_SIZE[0] - 2 * MARGIN, VIEW_BOTTOM - top)


def paint_slide(painter: QPainter, text: SlideText, view: QWidget) -> None:
    """One slide, in the slide's logical pixels: title, place, text, question box, the view, the footer.
    `view` is already sized to `view_rect(text)`."""
    painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
    painter.setRenderHint(QPainter.RenderHint.TextAntialiasing, True)
    painter.setRenderHint(QPainter.RenderHint.LosslessImageRendering, True)
    colours = themes.current()
    painter.fillRect(QRectF(0, 0, *SLIDE_SIZE), QColor(colours.background))
    place_font = _font(SMALLEST_TEXT)
    place_width = QFontMetricsF(place_font).horizontalAdvance(text.place) + 24
    title_box = TITLE_BOX.adjusted(0, 0, -place_width, 0)
    flags = int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
    _draw_text(painter, title_box, text.title, _fitting_font(text.title, title_box, 46, 26, True, flags),
               colours.foreground, flags)
    _draw_text(painter, TITLE_BOX, text.place, place_font, colours.muted,
               int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter))
    _draw_text(painter, TEXT_BOX, text.text, _fitting_font(text.text, TEXT_BOX, 26, SMALLEST_TEXT), colours.foreground)
    if text.question:
        _paint_question(painter, text)
    footer_font = _fitting_font(text.footer, FOOTER_BOX, 24, SMALLEST_TEXT)
    _draw_text(painter, FOOTER_BOX, _one_line(text.footer, footer_font, FOOTER_BOX.width()), footer_font,
               colours.muted, WRAP_MIDDLE)
    region = view_rect(text)
    painter.save()
    painter.translate(region.topLeft())
    flags = QWidget.RenderFlag.DrawChildren
    if view.autoFillBackground():
        flags |= QWidget.RenderFlag.DrawWindowBackground
    view.render(painter, QPoint(0, 0), QRegion(), flags)
    painter.restore()


def _one_line(footer: str, font: QFont, width: float) -> str:
    """`footer` on one line of `width` at `font`: its quoted prompt elided as far as it needs (the footer box holds
    one line; a second was drawn below the slide's edge), then its end."""
    metrics = QFontMetricsF(font)
    if metrics.horizontalAdvance(footer) <= width:
        return footer
    parts = quoted_prompt(footer)
    if parts:
        prompt, rest = parts
        for keep in range(len(prompt) - 1, 0, -1):
            shorter = f"\u201c{prompt[:keep].rstrip()}\u2026\u201d{rest}"
            if metrics.horizontalAdvance(shorter) <= width:
                return shorter
    return metrics.elidedText(footer, Qt.TextElideMode.ElideRight, width)


def _paint_question(painter: QPainter, text: SlideText) -> None:
    colours = themes.current()
    painter.save()
    painter.setPen(QPen(QColor(colours.muted), 1.5))
    painter.setBrush(QColor(colours.empty))
    painter.drawRoundedRect(QUESTION_BOX, 10, 10)
    painter.restore()
    inner = QUESTION_BOX.adjusted(18, 6, -18, -6)
    question_box = inner.adjusted(0, 0, -ANSWER_WIDTH, 0)
    answer_box = QRectF(inner.right() - ANSWER_WIDTH + 24, inner.top(), ANSWER_WIDTH - 24, inner.height())
    question = f"Question: {text.question}"
    question_font = _fitting_font(question, question_box, 26, SMALLEST_TEXT, True, WRAP_MIDDLE)
    _draw_text(painter, question_box, question, question_font, colours.foreground, WRAP_MIDDLE)
    right = int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter | Qt.TextFlag.TextWordWrap)
    if text.answer:
        answer_font = _fitting_font(text.answer, answer_box, 40, SMALLEST_TEXT, True, right)
        _draw_text(painter, answer_box, text.answer, answer_font, colours.foreground, right)
    else:
        _draw_text(painter, answer_box, PROMPT_FOR_A_GUESS, _font(24), colours.muted, right)


def paint_slide_scaled(device: QPaintDevice, text: SlideText, view: QWidget, scale: float) -> None:
    """The slide painted onto `device` (an image, or a test's recording device), `scale` device pixels to the
    slide's logical pixel."""
    with prepared_for_export(view, pen_scale=scale), painting(device, "a PNG image") as painter:
        painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform, False)  # grid cells stay sharp
        painter.scale(scale, scale)
        paint_slide(painter, text, view)


def slide_png(text: SlideText, view: QWidget, width: int) -> bytes:
    """The slide as a PNG `width` pixels wide, 16:9."""
    scale = width / SLIDE_SIZE[0]
    image = QImage(width, max(1, round(SLIDE_SIZE[1] * scale)), QImage.Format.Format_RGB32)
    if image.isNull():
        raise ExportError(f"not enough memory for a {width}-pixel-wide slide")
    dots_per_metre = round(96 / 0.0254 * scale)
    image.setDotsPerMeterX(dots_per_metre)
    image.setDotsPerMeterY(dots_per_metre)
    paint_slide_scaled(image, text, view, scale)
    return encode_png(image)


class Deck:
    """A PDF with a page per slide, one slide pixel to the point, built in memory; `data()` ends it."""

    def __init__(self, title: str) -> None:
        self._array = QByteArray()
        self._buffer = QBuffer(self._array)
        self._buffer.open(QIODevice.OpenModeFlag.WriteOnly)
        self._writer = QPdfWriter(self._buffer)
        self._writer.setCreator("kvviz")
        self._writer.setTitle(title)
        self._writer.setResolution(72)
        size = QPageSize(QSizeF(*SLIDE_SIZE), QPageSize.Unit.Point, "kvviz slide", QPageSize.SizeMatchPolicy.ExactMatch)
        self._writer.setPageLayout(QPageLayout(size, QPageLayout.Orientation.Portrait, QMarginsF(0, 0, 0, 0)))
        self._painter: QPainter | None = None
        self.pages = 0

    def add(self, text: SlideText, view: QWidget) -> None:
        if self._painter is None:
            self._painter = QPainter()
            if not self._painter.begin(self._writer):
                self._painter = None
                raise ExportError("Qt could not start a PDF document")
        elif not self._writer.newPage():
            raise ExportError("Qt could not add a page to the PDF document")
        painter = self._painter
        painter.save()
        with prepared_for_export(view, vector=True):
            painter.scale(self._writer.width() / SLIDE_SIZE[0], self._writer.height() / SLIDE_SIZE[1])
            paint_slide(painter, text, view)
        painter.restore()
        self.pages += 1

    def close(self) -> None:
        """End the painting (a painter left active crashes Qt); safe to call twice."""
        if self._painter is not None:
            self._painter.end()
            self._painter = None
        if self._buffer.isOpen():
            self._buffer.close()

    def data(self) -> bytes:
        self.close()
        data = bytes(self._array.data())
        if not data.startswith(b"%PDF") or b"%%EOF" not in data[-64:]:
            raise ExportError("Qt could not finish the PDF document")
        return data
