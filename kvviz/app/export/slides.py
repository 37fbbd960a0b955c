"""`kvviz lesson --export`: a lesson as 16:9 slides, one PNG per slide and one PDF deck with a page per slide.

Each slide shows a step's title (big), its text and its place in the lesson over the app's own view in
the step's state: `RunView` (with or without the cache) or `CompareView` (`cache = "compare"`), reset
with the step's plan and fed the records of its run advanced `advance_to` token steps, as `kvviz export`
feeds them. A question step makes two slides: the question, at `advance_to`; then the answer, measured
from the run advanced one token step more. The deck is the only PDF (no PDF per slide). Notes are the
lecturer's: `slide_text` leaves them out, so no slide ever receives them.

Qt loads with this module; torch and the engine only when `export_lesson` runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QMarginsF, QPoint, QRectF, QSizeF, Qt
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontMetricsF,
    QImage,
    QPageLayout,
    QPageSize,
    QPainter,
    QPdfWriter,
    QPen,
    QRegion,
)
from PySide6.QtWidgets import QWidget

from kvviz.app import theme as themes
from kvviz.app.export.caption import shorten_caption
from kvviz.app.export.files import (
    DEFAULT_PNG_WIDTH,
    ExportError,
    all_or_nothing,
    check_png_width,
    parse_formats,
    write_export,
)
from kvviz.app.export.headless import ensure_application, without_offscreen_chatter
from kvviz.app.export.render import painting, prepared_for_export
from kvviz.errors import KvvizError, first_line
from kvviz.files import folder_problem
from kvviz.lesson import Lesson, LessonError, LessonStep, format_answer, measured_answer

if TYPE_CHECKING:
    from PySide6.QtWidgets import QApplication

    from kvviz.engine import Engine
    from kvviz.records import RunPlan, StepRecord

SLIDE_SIZE = (1600, 900)  # logical pixels; PDF pages are as many points, PNGs scale the whole slide to --width
LESSON_FORMATS = ("png", "pdf")
DECK_NAME = "kvviz-lesson.pdf"
MARGIN = 40
TITLE_BOX = QRectF(MARGIN, 24, SLIDE_SIZE[0] - 2 * MARGIN, 64)
TEXT_BOX = QRectF(MARGIN, 92, SLIDE_SIZE[0] - 2 * MARGIN, 84)
QUESTION_BOX = QRectF(MARGIN, 184, SLIDE_SIZE[0] - 2 * MARGIN, 76)
FOOTER_BOX = QRectF(MARGIN, SLIDE_SIZE[1] - 36, SLIDE_SIZE[0] - 2 * MARGIN, 28)
ANSWER_WIDTH = 560  # the right part of the question box, where the answer goes
VIEW_TOP = {False: 184, True: 272}  # where the view starts, without and with a question box
VIEW_BOTTOM = SLIDE_SIZE[1] - 44
PROMPT_FOR_A_GUESS = "Predict, then reveal"


@dataclass(frozen=True)
class SlideText:
    """Everything a slide says; a step's notes are not among it."""

    title: str
    text: str
    place: str  # "step 2 of 5"
    question: str  # the question's words; "" for a step without one
    answer: str  # "Answer: 5 (measured)" on the slide that reveals it, else ""
    footer: str  # the run shown: prompt, model, tokens, cache mode


@dataclass(frozen=True)
class StepRun:
    """A step's run: its plan, its records advanced `advance_to` token steps (`shown`), and for a
    question one token step more (`advanced`) with the measured answer."""

    plan: RunPlan
    shown: tuple[StepRecord, ...]
    advanced: tuple[StepRecord, ...]
    answer: float | None


def slide_file_name(number: int, total: int) -> str:
    """kvviz-lesson-01.png, ...: numbered from 1, as many digits as the last one needs (at least two)."""
    return f"kvviz-lesson-{number:0{max(2, len(str(total)))}d}.png"


def slide_text(lesson: Lesson, index: int, revealed: bool, run: StepRun) -> SlideText:
    """What the slide of step `index` says, before (`revealed` False) or after its question's answer."""
    step = lesson.steps[index]
    records = run.advanced if revealed else run.shown
    answer = ""
    if revealed and step.question and run.answer is not None:
        answer = f"Answer: {format_answer(step.question, run.answer)} (measured)"
    return SlideText(title=step.title, text=step.text, place=f"step {index + 1} of {len(lesson.steps)}",
                     question=step.question_text, answer=answer, footer=_footer(step, run.plan, records))


def _footer(step: LessonStep, plan: RunPlan, records: tuple[StepRecord, ...]) -> str:
    made = records[-1].new_tokens if records else 0
    if step.compare:
        mode = "with and without KV cache in lockstep"
    else:
        mode = "with KV cache" if step.use_cache else "without KV cache"
    return shorten_caption(f"\u201c{step.prompt}\u201d \u2014 {plan.model_name}, {made} of {plan.budget} new "
                           f"token{'' if plan.budget == 1 else 's'}, {mode}, greedy")


# ----- the runs -----


def run_step(engine: Engine, model_name: str, lesson: Lesson, index: int) -> StepRun:
    """Plan step `index`'s run and take its records up to `advance_to` token steps (one more for a
    question); with the cache, the filling pass only after the run's last token. LessonError (naming
    the file, the step and the key) when the model cannot run it."""
    from kvviz.compare import Lockstep, plan_lockstep

    step = lesson.steps[index]
    where = f"{lesson.source}: step {index + 1}: "
    try:
        prompt_ids = engine.encode_prompt(step.prompt)
        if step.compare:
            plan = plan_lockstep(engine, prompt_ids, step.max_new_tokens, True, prompt=step.prompt,
                                 model_name=model_name)
        else:
            plan = engine.plan(prompt_ids, step.max_new_tokens, step.use_cache, prompt=step.prompt,
                               model_name=model_name)
    except KvvizError as exc:
        raise LessonError(f"{where}prompt: {first_line(exc)}") from exc
    reach = step.advance_to + (1 if step.question else 0)
    if reach > plan.budget:
        needs = f"advance_to {step.advance_to}" + (" and the question's step" if step.question else "")
        raise LessonError(f"{where}advance_to: {model_name} holds {plan.n_ctx} tokens, room for "
                          f"{plan.budget} new after the prompt; {needs} take{'' if step.question else 's'} {reach}")
    records: list[StepRecord] = []
    if reach:
        stream = Lockstep(engine, plan).records() if step.compare else engine.run(plan)
        try:
            for record in stream:
                records.append(record)
                if record.final or (record.new_tokens >= reach and not plan.pass_follows_in_step(record)):
                    break
        finally:
            stream.close()
    shown = tuple(r for r in records if r.new_tokens <= step.advance_to)
    answer = None
    if step.question:
        answer = measured_answer(step.question, shown[-1] if shown else None, records[-1])
    return StepRun(plan=plan, shown=shown, advanced=tuple(records), answer=answer)


def _step_engines(lesson: Lesson, model: str | None) -> list[tuple[str, Engine]]:
    """(model name, engine) per step: `model` until a step names its own, which later steps keep;
    each model loaded once."""
    from kvviz.engine import Engine
    from kvviz.weights import load_model

    loaded: dict[str | None, tuple[str, Engine]] = {}
    current, named_at = model, 0
    engines = []
    for number, step in enumerate(lesson.steps, start=1):
        if step.model is not None:
            current, named_at = step.model, number
        if current not in loaded:
            try:
                ready = load_model(current)
            except KvvizError as exc:
                if not named_at:
                    raise
                raise LessonError(f"{lesson.source}: step {named_at}: model: {first_line(exc)}") from exc
            loaded[current] = (ready.name, Engine(ready.model))
        engines.append(loaded[current])
    return engines


# ----- drawing -----


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
    place_font = _font(22)
    place_width = QFontMetricsF(place_font).horizontalAdvance(text.place) + 24
    title_box = TITLE_BOX.adjusted(0, 0, -place_width, 0)
    flags = int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
    _draw_text(painter, title_box, text.title, _fitting_font(text.title, title_box, 46, 26, True, flags),
               colours.foreground, flags)
    _draw_text(painter, TITLE_BOX, text.place, place_font, colours.muted,
               int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter))
    _draw_text(painter, TEXT_BOX, text.text, _fitting_font(text.text, TEXT_BOX, 26, 15), colours.foreground)
    if text.question:
        _paint_question(painter, text)
    _draw_text(painter, FOOTER_BOX, text.footer, _font(17), colours.muted, WRAP_MIDDLE)
    region = view_rect(text)
    painter.save()
    painter.translate(region.topLeft())
    flags = QWidget.RenderFlag.DrawChildren
    if view.autoFillBackground():
        flags |= QWidget.RenderFlag.DrawWindowBackground
    view.render(painter, QPoint(0, 0), QRegion(), flags)
    painter.restore()


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
    _draw_text(painter, question_box, question, _fitting_font(question, question_box, 26, 15, True, WRAP_MIDDLE),
               colours.foreground, WRAP_MIDDLE)
    right = int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter | Qt.TextFlag.TextWordWrap)
    if text.answer:
        _draw_text(painter, answer_box, text.answer, _fitting_font(text.answer, answer_box, 40, 20, True, right),
                   colours.foreground, right)
    else:
        _draw_text(painter, answer_box, PROMPT_FOR_A_GUESS, _font(24), colours.muted, right)


def slide_png(text: SlideText, view: QWidget, width: int) -> bytes:
    """The slide as a PNG `width` pixels wide, 16:9."""
    scale = width / SLIDE_SIZE[0]
    image = QImage(width, max(1, round(SLIDE_SIZE[1] * scale)), QImage.Format.Format_RGB32)
    if image.isNull():
        raise ExportError(f"not enough memory for a {width}-pixel-wide slide")
    dots_per_metre = round(96 / 0.0254 * scale)
    image.setDotsPerMeterX(dots_per_metre)
    image.setDotsPerMeterY(dots_per_metre)
    with prepared_for_export(view, pen_scale=scale), painting(image, "a PNG image") as painter:
        painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform, False)  # grid cells stay sharp
        painter.scale(scale, scale)
        paint_slide(painter, text, view)
    array = QByteArray()
    buffer = QBuffer(array)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    ok = image.save(buffer, "PNG")
    buffer.close()
    if not ok:
        raise ExportError(f"Qt could not encode a {image.width()}x{image.height()} PNG")
    return bytes(array.data())


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


# ----- the export -----


class _Stage:
    """The two views a slide can show, made once, styled, and shown offscreen at the size of the slide's view."""

    def __init__(self, app: QApplication) -> None:
        from kvviz.app.views.compare_view import CompareView
        from kvviz.app.views.run_view import RunView

        self.app = app
        self.run_view = RunView()
        self.run_view.layout().setContentsMargins(0, 0, 0, 0)
        self.compare_view = CompareView()
        for view in (self.run_view, self.compare_view):
            view.setStyleSheet(themes.stylesheet())
            view.setAttribute(Qt.WidgetAttribute.WA_DontShowOnScreen, True)  # even when a display is there

    def show(self, step: LessonStep, plan: RunPlan, records: tuple[StepRecord, ...], region: QRectF) -> QWidget:
        """The step's view in the state of `records`, laid out at the size of `region`."""
        view: QWidget = self.compare_view if step.compare else self.run_view
        view.resize(round(region.width()), round(region.height()))
        if view is self.run_view:
            width = round(region.width())
            view.bottom_splitter.setSizes([3 * width // 4 - 60, width // 4 + 60])  # the counter's labels fit
        view.reset(plan)
        view.apply(records)
        view.show()
        self.app.processEvents()
        view.refresh()
        self.app.processEvents()
        return view

    def close(self) -> None:
        for view in (self.run_view, self.compare_view):
            view.close()
            view.deleteLater()
        self.app.processEvents()


def lesson_formats(formats: str | list[str]) -> list[str]:
    """'png,pdf' checked: a lesson exports PNG slides and a PDF deck (no SVG)."""
    chosen = parse_formats(formats)
    for fmt in chosen:
        if fmt not in LESSON_FORMATS:
            raise ExportError(f"a lesson exports {' and '.join(LESSON_FORMATS)}, not {fmt}")
    return chosen


def export_lesson(
    lesson: Lesson,
    out_dir: Path | str,
    formats: str | list[str] = "png,pdf",
    width: int | None = None,
    model: str | None = None,
    progress: Callable[[str], None] | None = None,
    theme: str = "dark",
) -> list[Path]:
    """Write `lesson`'s slides into `out_dir`: kvviz-lesson-01.png, ... (PNG, `width` pixels wide, 16:9)
    and kvviz-lesson.pdf (a page per slide); returns the paths, in order. `model` runs the steps before
    the first that names its own model. `progress` gets one line per slide written, and one for the deck.
    `theme`: "dark" or "light" (kvviz.app.theme), the slides' colours.

    Formats, width and folder are checked before any model loads; every model before the first slide is
    drawn. Everything or nothing: a failure removes what this call wrote, and the folders it made.
    Errors are KvvizError (ExportError, LessonError, ModelLoadError) with a one-line message.
    """
    chosen = lesson_formats(formats)
    if theme not in themes.THEMES:
        raise ExportError(f"theme must be {' or '.join(themes.THEMES)}, got {theme!r}")
    width = check_png_width(DEFAULT_PNG_WIDTH if width is None else width, "width")
    if not str(out_dir).strip():
        raise ExportError("no output folder given (an empty name would mean the current folder)")
    out_dir = Path(out_dir).expanduser()
    problem = folder_problem(out_dir)
    if problem is not None:
        raise ExportError(f"{out_dir}: {problem}")
    app = ensure_application()
    engines = _step_engines(lesson, model)
    runs = [run_step(engine, name, lesson, index) for index, (name, engine) in enumerate(engines)]
    with without_offscreen_chatter(), themes.using(theme), all_or_nothing(out_dir) as written:
        stage = _Stage(app)
        deck = Deck(lesson.title) if "pdf" in chosen else None
        try:
            slides = lesson.slides()
            for number, (index, revealed) in enumerate(slides, start=1):
                run = runs[index]
                text = slide_text(lesson, index, revealed, run)
                view = stage.show(lesson.steps[index], run.plan, run.advanced if revealed else run.shown,
                                  view_rect(text))
                line = f"slide {number}/{len(slides)}: {text.place}, \u201c{text.title}\u201d" + (
                    f", {text.answer[0].lower()}{text.answer[1:]}" if revealed else ", the question" if text.question
                    else "")
                if "png" in chosen:
                    path = out_dir / slide_file_name(number, len(slides))
                    written.append(write_export(path, slide_png(text, view, width)))
                    line += f" -> {path}"
                if deck is not None:
                    deck.add(text, view)
                if progress is not None:
                    progress(line)
            if deck is not None:
                path = out_dir / DECK_NAME
                written.append(write_export(path, deck.data()))
                if progress is not None:
                    progress(f"deck of {deck.pages} page{'' if deck.pages == 1 else 's'} -> {path}")
        finally:
            if deck is not None:
                deck.close()
            stage.close()
        return list(written)
