"""Views rendered for slides: PNG at a chosen width, SVG and PDF as vector drawings, with a caption.

Everything goes through `QWidget.render`, so what is exported is what the window shows. SVG is
written with QSvgGenerator, not pyqtgraph's SVGExporter (broken on current Qt, pyqtgraph issue
3485): the drawing is recorded into a QPicture and replayed into the generator, because clip paths
drawn straight into it miss the child widgets' offsets and cut curves and labels away; then
`svg_repair` makes the output viewer-proof. PDF pages are the size of the view (one window pixel to
the point) with images stored losslessly; the grid's image is embedded enlarged with
nearest-neighbour sampling in both vector formats.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from pathlib import Path

from pyqtgraph import ImageItem
from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QMarginsF, QPoint, QRectF, QSize, QSizeF, Qt
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
    QPicture,
    QRegion,
)
from PySide6.QtSvg import QSvgGenerator
from PySide6.QtWidgets import QGraphicsItem, QGraphicsView, QWidget

from kvviz.app import theme
from kvviz.app.export.caption import shorten_caption
from kvviz.app.export.files import (
    DEFAULT_PNG_WIDTH,
    ExportError,
    check_png_width,
    check_target_path,
    export_format,
    write_export,
)
from kvviz.app.export.svg_repair import flatten_svg
from kvviz.core.files import FileSet, user_path

MAX_UPSCALED_IMAGE = 4096  # pixels per side of an image embedded in SVG or PDF


class Page:
    """Where the caption and the widget go, in the widget's own pixels (logical units)."""

    def __init__(self, widget: QWidget, caption: str | None) -> None:
        self.widget = widget
        self.content = QSizeF(widget.size())
        self.caption = shorten_caption(caption or "") or None
        self.font = QFont(widget.font())
        self.font.setPixelSize(max(14, min(30, round(self.content.width() / 55))))
        self.pad = round(self.font.pixelSize() * 0.6)
        self.caption_height = 0.0
        if self.caption is not None:
            metrics = QFontMetricsF(self.font)
            box = QRectF(0, 0, max(1.0, self.content.width() - 2 * self.pad), 1e6)
            text_height = metrics.boundingRect(box, self._text_flags(), self.caption).height()
            self.caption_height = math.ceil(text_height + 2 * self.pad)
        self.width = self.content.width()
        self.height = self.content.height() + self.caption_height

    @staticmethod
    def _text_flags() -> int:
        return int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter | Qt.TextFlag.TextWordWrap)

    def paint(self, painter: QPainter) -> None:
        """Fill the page, draw the caption band, then the widget below it."""
        painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        painter.setRenderHint(QPainter.RenderHint.TextAntialiasing, True)
        painter.setRenderHint(QPainter.RenderHint.LosslessImageRendering, True)
        colours = theme.current()
        painter.fillRect(QRectF(0, 0, self.width, self.height), QColor(colours.background))
        if self.caption is not None:
            painter.save()
            painter.setFont(self.font)
            painter.setPen(QColor(colours.foreground))
            box = QRectF(self.pad, 0, self.width - 2 * self.pad, self.caption_height)
            painter.drawText(box, self._text_flags(), self.caption)
            painter.restore()
        painter.save()
        painter.translate(0, self.caption_height)
        # The page is already filled with the theme's background; a plain widget's own "window
        # background" would be the default palette's light grey, which the app never shows.
        flags = QWidget.RenderFlag.DrawChildren
        if self.widget.autoFillBackground():
            flags |= QWidget.RenderFlag.DrawWindowBackground
        self.widget.render(painter, QPoint(0, 0), QRegion(), flags)
        painter.restore()


def _graphics_views(widget: QWidget) -> list[QGraphicsView]:
    views = widget.findChildren(QGraphicsView)
    if isinstance(widget, QGraphicsView):
        views.insert(0, widget)
    return views


def _upscaled_image(view: QGraphicsView, item, image: QImage) -> QImage | None:
    """`image` enlarged by whole factors (nearest neighbour) to about twice its size on screen, or None."""
    if image.isNull():
        return None
    transform = item.deviceTransform(view.viewportTransform())
    sx = math.hypot(transform.m11(), transform.m12())  # screen pixels per image pixel
    sy = math.hypot(transform.m21(), transform.m22())
    kx = max(1, min(math.ceil(2 * sx), MAX_UPSCALED_IMAGE // max(1, image.width())))
    ky = max(1, min(math.ceil(2 * sy), MAX_UPSCALED_IMAGE // max(1, image.height())))
    if kx == 1 and ky == 1:
        return None
    return image.scaled(image.width() * kx, image.height() * ky, Qt.AspectRatioMode.IgnoreAspectRatio,
                        Qt.TransformationMode.FastTransformation)


@contextlib.contextmanager
def prepared_for_export(widget: QWidget, pen_scale: float = 1.0, vector: bool = False) -> Iterator[None]:
    """pyqtgraph views drawn as vectors for the duration of an export, then put back as they were.

    The background cache of each QGraphicsView and the item caches (the views cache their axes)
    are switched off (they would embed screen-sized bitmaps), and so is each viewport's fill in
    the default palette (it shows as a light seam around the plot in SVG viewers). pyqtgraph
    items get their export mode (no hover buttons, vector scatter symbols); curves are drawn as
    one path instead of separate segments; cosmetic pens are scaled by `pen_scale`, so lines in a
    PNG wider than the window keep their weight relative to the text. For `vector` output, images
    (the grid) are embedded enlarged with nearest-neighbour sampling, so viewers that smooth
    images still show sharp cells.
    """
    restore: list[Callable[[], None]] = []
    try:
        for view in _graphics_views(widget):
            mode = view.cacheMode()
            view.setCacheMode(QGraphicsView.CacheModeFlag.CacheNone)
            view.resetCachedContent()
            restore.append(lambda view=view, mode=mode: (view.setCacheMode(mode), view.resetCachedContent()))
            if not view.renderHints() & QPainter.RenderHint.LosslessImageRendering:
                # PDF: embed images (the grid) with lossless compression instead of JPEG
                view.setRenderHint(QPainter.RenderHint.LosslessImageRendering, True)
                restore.append(lambda view=view: view.setRenderHint(QPainter.RenderHint.LosslessImageRendering, False))
            viewport = view.viewport()
            if viewport is not None and viewport.autoFillBackground():
                viewport.setAutoFillBackground(False)
                restore.append(lambda viewport=viewport: viewport.setAutoFillBackground(True))
            scene = view.scene()
            if scene is None:
                continue
            for item in scene.items():
                cache = item.cacheMode()
                if cache != QGraphicsItem.CacheMode.NoCache:  # cached axes: a screen bitmap in a vector file
                    item.setCacheMode(QGraphicsItem.CacheMode.NoCache)
                    restore.append(lambda item=item, cache=cache: item.setCacheMode(cache))
                if hasattr(item, "setExportMode"):
                    item.setExportMode(True, {"antialias": True})
                    restore.append(lambda item=item: item.setExportMode(False))
                if vector and isinstance(item, ImageItem) and item.image is not None:
                    item.render()  # its QImage made now from its data (pyqtgraph makes it when it paints)
                image = item.qimage if isinstance(item, ImageItem) else None
                if vector and isinstance(image, QImage):
                    larger = _upscaled_image(view, item, image)
                    if larger is not None:
                        item.qimage = larger  # pyqtgraph's ImageItem draws `qimage` into the image's own rect
                        restore.append(lambda item=item, image=image: setattr(item, "qimage", image))
                opts = getattr(item, "opts", None)
                if not isinstance(opts, dict):
                    continue
                if opts.get("segmentedLineMode") in ("auto", "on") and hasattr(item, "setSegmentedLineMode"):
                    previous = opts["segmentedLineMode"]
                    item.setSegmentedLineMode("off")
                    restore.append(lambda item=item, previous=previous: item.setSegmentedLineMode(previous))
                if pen_scale != 1.0:
                    for key in ("pen", "shadowPen"):
                        pen = opts.get(key)
                        if isinstance(pen, QPen) and pen.isCosmetic() and pen.style() != Qt.PenStyle.NoPen:
                            wider = QPen(pen)
                            wider.setWidthF(max(1.0, pen.widthF()) * pen_scale)
                            opts[key] = wider
                            restore.append(lambda opts=opts, key=key, pen=pen: opts.__setitem__(key, pen))
                    if hasattr(item, "invalidateBounds"):
                        item.invalidateBounds()
                item.update()
        yield
    finally:
        for undo in reversed(restore):
            undo()


@contextlib.contextmanager
def painting(device: QPaintDevice, what: str) -> Iterator[QPainter]:
    """A painter on `device`, ended however the drawing ends (a painter left active crashes Qt)."""
    painter = QPainter()
    if not painter.begin(device):
        raise ExportError(f"Qt could not start {what}")
    try:
        yield painter
    finally:
        painter.end()


def _check_widget(widget: QWidget, path: Path) -> None:
    size = widget.size()
    if size.width() <= 0 or size.height() <= 0:
        raise ExportError(f"{path}: nothing to export, the view has zero size ({size.width()}x{size.height()})")


def render_png(widget: QWidget, width: int = DEFAULT_PNG_WIDTH, caption: str | None = None) -> QImage:
    """The widget (and caption) as an image `width` pixels wide, scaled as a whole, aspect kept."""
    page = Page(widget, caption)
    scale = width / page.width
    height = max(1, round(page.height * scale))
    image = QImage(width, height, QImage.Format.Format_RGB32)
    if image.isNull():
        raise ExportError(f"not enough memory for a {width}x{height} image")
    dots_per_metre = round(96 / 0.0254 * scale)  # so the image prints at the window's size
    image.setDotsPerMeterX(dots_per_metre)
    image.setDotsPerMeterY(dots_per_metre)
    image.fill(QColor(theme.current().background))
    paint_scaled(image, page, scale)
    return image


def paint_scaled(device: QPaintDevice, page: Page, scale: float) -> None:
    """`page` painted onto `device` (an image, or a test's recording device), `scale` device pixels to the
    widget's pixel."""
    with prepared_for_export(page.widget, pen_scale=scale), painting(device, "a PNG image") as painter:
        painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform, False)  # grid cells stay sharp
        painter.scale(scale, scale)
        page.paint(painter)


def png_bytes(widget: QWidget, width: int, caption: str | None) -> bytes:
    """The PNG file of `render_png`."""
    return encode_png(render_png(widget, width, caption))


def encode_png(image: QImage) -> bytes:
    """`image` as the bytes of a PNG file (ExportError when Qt cannot encode it)."""
    array = QByteArray()
    buffer = QBuffer(array)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    ok = image.save(buffer, "PNG")
    buffer.close()
    if not ok:
        raise ExportError(f"Qt could not encode a {image.width()}x{image.height()} PNG")
    return bytes(array.data())


def svg_bytes(widget: QWidget, caption: str | None) -> bytes:
    """An SVG 1.1 drawing of the widget (and caption) at its size, repaired by `svg_repair`."""
    page = Page(widget, caption)
    # Recorded into a QPicture first, then replayed: drawn straight into QSvgGenerator, the
    # clip paths of child widgets (pyqtgraph's view boxes) miss the widget's offset and cut
    # curves and labels away; replayed from a picture they land where they belong.
    picture = QPicture()
    with prepared_for_export(widget, vector=True), painting(picture, "a recording of the drawing") as recorder:
        page.paint(recorder)
    array = QByteArray()
    buffer = QBuffer(array)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    generator = QSvgGenerator(QSvgGenerator.SvgVersion.Svg11)  # 1.1 writes clip paths; Tiny 1.2 drops them
    generator.setOutputDevice(buffer)
    generator.setSize(QSize(math.ceil(page.width), math.ceil(page.height)))
    generator.setViewBox(QRectF(0, 0, page.width, page.height))
    generator.setResolution(picture.logicalDpiY())  # replayed 1:1, fonts at the size the window lays out
    generator.setTitle(page.caption or "kvviz")
    generator.setDescription("Exported from kvviz")
    with painting(generator, "an SVG drawing") as painter:
        painter.drawPicture(0, 0, picture)
    buffer.close()
    return flatten_svg(bytes(array.data()), picture.logicalDpiY())


def pdf_bytes(widget: QWidget, caption: str | None) -> bytes:
    """A one-page PDF of the widget (and caption), one window pixel to the point."""
    page = Page(widget, caption)
    array = QByteArray()
    buffer = QBuffer(array)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    writer = QPdfWriter(buffer)
    writer.setCreator("kvviz")
    writer.setTitle(page.caption or "kvviz")
    # One page the size of the content, one window pixel to the point: the page is the figure,
    # and cosmetic (device-pixel) pen widths keep their weight relative to the text.
    writer.setResolution(72)
    size = QPageSize(QSizeF(page.width, page.height), QPageSize.Unit.Point, "kvviz",
                     QPageSize.SizeMatchPolicy.ExactMatch)
    writer.setPageLayout(QPageLayout(size, QPageLayout.Orientation.Portrait, QMarginsF(0, 0, 0, 0)))
    with prepared_for_export(widget, vector=True), painting(writer, "a PDF document") as painter:
        painter.scale(writer.width() / page.width, writer.height() / page.height)
        page.paint(painter)
    buffer.close()
    data = bytes(array.data())
    if not data.startswith(b"%PDF") or b"%%EOF" not in data[-64:]:
        raise ExportError("Qt could not finish the PDF document")
    return data


def export_widget(widget: QWidget, path: Path | str, width: int | None = None, caption: str | None = None,
                  files: FileSet | None = None) -> Path:
    """Write `widget` as an image; the format comes from the suffix (.png, .svg, .pdf).

    PNG: `width` pixels wide (default 1920), the whole rendering scaled, aspect kept. SVG and
    PDF: vector drawings (curves as paths, the grid as its image) at the widget's size; `width`
    is ignored. `caption`, when given, is drawn in a band above the image. Given `files`, the image joins
    that set and is in place when it commits. Raises ExportError with one line naming the file and the
    reason; never leaves a partial file behind.
    """
    path = user_path(path)
    fmt = export_format(path)
    if fmt == "png":
        width = check_png_width(DEFAULT_PNG_WIDTH if width is None else width, f"{path}: PNG width")
    check_target_path(path)
    _check_widget(widget, path)
    producers: dict[str, Callable[[], bytes]] = {
        "png": lambda: png_bytes(widget, width, caption),
        "svg": lambda: svg_bytes(widget, caption),
        "pdf": lambda: pdf_bytes(widget, caption),
    }
    try:
        data = producers[fmt]()
    except ExportError as exc:
        raise ExportError(f"{path}: {exc}") from exc
    return write_export(path, data, files)


def png_size(widget: QWidget, width: int, caption: str | None) -> QSize:
    """The pixel size `export_widget` gives a PNG of `widget` at `width`."""
    page = Page(widget, caption)
    return QSize(width, max(1, round(page.height * width / page.width))) if page.width > 0 else QSize()
