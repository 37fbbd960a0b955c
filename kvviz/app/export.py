"""Images of the views for slides: PNG at a chosen width, SVG and PDF as vector drawings, with a caption.

Everything goes through `QWidget.render`, so what is exported is what the window shows. SVG is
written with QSvgGenerator, not pyqtgraph's SVGExporter (broken on current Qt, pyqtgraph issue
3485), and Qt's output is repaired on the way:
- the drawing is recorded into a QPicture and replayed into the generator, because clip paths
  drawn straight into it miss the child widgets' offsets and cut curves and labels away;
- `_flatten_svg` applies each group's transform to pyqtgraph's curves, which Qt writes in data
  coordinates under a scaling `transform` with `vector-effect="non-scaling-stroke"`, ignored by
  many viewers (librsvg, office suites) that then draw strokes hundreds of pixels wide;
- text gets the font size Qt really drew, the real family name and Qt's measured width.
PDF pages are the size of the view (one window pixel to the point) with images stored losslessly;
the grid's image is embedded enlarged with nearest-neighbour sampling in both vector formats.
Files are written to a temporary file in the target folder and renamed over the target, so a
failure never leaves a half-written image.
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QMarginsF, QPoint, QRectF, QSettings, QSize, QSizeF, Qt
from PySide6.QtGui import (
    QAction,
    QColor,
    QFont,
    QFontInfo,
    QFontMetricsF,
    QImage,
    QPageLayout,
    QPageSize,
    QPainter,
    QPdfWriter,
    QPen,
    QPicture,
    QRawFont,
    QRegion,
)
from PySide6.QtSvg import QSvgGenerator
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QGraphicsView,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from kvviz.app import theme
from kvviz.app.settings import app_settings

FORMATS = ("png", "svg", "pdf")
FORMAT_LABELS = {"png": "PNG image", "svg": "SVG drawing", "pdf": "PDF document"}
FORMAT_FILTERS = {"png": "PNG image (*.png)", "svg": "SVG drawing (*.svg)", "pdf": "PDF document (*.pdf)"}
TARGETS = ("chart", "grid", "view")  # the keys of MainWindow.export_targets(), in menu order
TARGET_LABELS = {"chart": "Chart", "grid": "K/V grid", "view": "Whole view"}
DEFAULT_PNG_WIDTH = 1920
MIN_PNG_WIDTH = 64
MAX_PNG_WIDTH = 8192
MAX_UPSCALED_IMAGE = 4096  # pixels per side of an image embedded in SVG or PDF
CAPTION_PROMPT_CHARS = 100  # longer prompts are elided in the caption
CAPTION_MAX_CHARS = 300
SETTINGS_GROUP = "export"
DIALOG_STYLE = ""  # dialogs are styled by resources/styles/kvviz.qss

SVG_NS = "http://www.w3.org/2000/svg"
XLINK_NS = "http://www.w3.org/1999/xlink"
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_PAIR = re.compile(rf"({_NUMBER})\s*,\s*({_NUMBER})")
_MATRIX = re.compile(rf"^\s*matrix\(\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,"
                     rf"\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*\)\s*$")
_SPACES = re.compile(r"^ +| +$| {2,}")
_ABSOLUTE_PATH = re.compile(r"^[MLCZ0-9eE.,+\-\s]*$")  # the commands QSvgGenerator writes, all absolute


class ExportError(ValueError):
    """An image that cannot be written; the message is one line naming the file and the reason."""


def export_format(path: Path | str) -> str:
    """'png', 'svg' or 'pdf' from the file name's suffix; ExportError for anything else."""
    path = Path(path)
    suffix = path.suffix.lower().lstrip(".")
    if not suffix:
        raise ExportError(f"{path}: no file extension; name the file .png, .svg or .pdf")
    if suffix not in FORMATS:
        raise ExportError(f"{path}: unknown image type .{suffix}; use .png, .svg or .pdf")
    return suffix


def _elide_prompt(prompt: str) -> str:
    text = " ".join(prompt.split())
    return text if len(text) <= CAPTION_PROMPT_CHARS else text[: CAPTION_PROMPT_CHARS - 1].rstrip() + "\u2026"


def shorten_caption(caption: str) -> str:
    """A caption that fits a few lines: the quoted prompt at its head elided, whitespace collapsed."""
    match = re.match(r"^\u201c(.*)\u201d(.*)$", caption, re.DOTALL)
    if match:
        caption = f"\u201c{_elide_prompt(match.group(1))}\u201d{match.group(2)}"
    caption = " ".join(caption.split())
    return caption if len(caption) <= CAPTION_MAX_CHARS else caption[: CAPTION_MAX_CHARS - 1] + "\u2026"


def make_caption(prompt: str, model: str, step: int, new_tokens: int | None = None,
                 use_cache: bool | None = None) -> str:
    """The caption of an exported view, as the main window writes it:
    “prompt” — model, step 13, 12 new tokens, with KV cache (a long prompt elided)."""
    text = _elide_prompt(prompt)
    parts = [f"step {step}"]
    if new_tokens is not None:
        parts.append(f"{new_tokens} new token{'' if new_tokens == 1 else 's'}")
    where = ", ".join(parts)
    mode = "" if use_cache is None else (", with KV cache" if use_cache else ", without KV cache")
    return f"\u201c{text}\u201d \u2014 {model}, {where}{mode}"


def default_file_name(target: str, fmt: str, step: int | None) -> str:
    """kvviz-chart-step12.png and the like."""
    return f"kvviz-{target}" + (f"-step{step}" if step is not None else "") + f".{fmt}"


def step_from_caption(caption: str) -> int | None:
    """The step number a `make_caption` caption names, if any."""
    match = re.search(r"\bstep (\d+)\b", caption)
    return int(match.group(1)) if match else None


# ----- rendering -----
class _Page:
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
        painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        painter.setRenderHint(QPainter.RenderHint.TextAntialiasing, True)
        painter.setRenderHint(QPainter.RenderHint.LosslessImageRendering, True)
        painter.fillRect(QRectF(0, 0, self.width, self.height), QColor(theme.BACKGROUND))
        if self.caption is not None:
            painter.save()
            painter.setFont(self.font)
            painter.setPen(QColor(theme.FOREGROUND))
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
def _prepared_for_export(widget: QWidget, pen_scale: float = 1.0, vector: bool = False) -> Iterator[None]:
    """pyqtgraph views drawn as vectors for the duration of an export, then put back as they were.

    The background cache of each QGraphicsView is switched off (it would embed a screen-sized
    bitmap) and so is its viewport's fill in the default palette (it shows as a light seam
    around the plot in SVG viewers); pyqtgraph items get their export mode (no hover buttons,
    vector scatter symbols); curves are drawn as one path instead of separate segments; cosmetic
    pens are scaled by `pen_scale`, so lines in a PNG wider than the window keep their weight
    relative to the text. For `vector` output, images (the grid) are embedded enlarged with
    nearest-neighbour sampling, so viewers that smooth images still show sharp cells.
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
                if hasattr(item, "setExportMode"):
                    item.setExportMode(True, {"antialias": True})
                    restore.append(lambda item=item: item.setExportMode(False))
                image = getattr(item, "qimage", None)
                if vector and isinstance(image, QImage) and not getattr(item, "_renderRequired", True):
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


def _check_widget(widget: QWidget, path: Path) -> None:
    size = widget.size()
    if size.width() <= 0 or size.height() <= 0:
        raise ExportError(f"{path}: nothing to export, the view has zero size ({size.width()}x{size.height()})")


def render_png(widget: QWidget, width: int = DEFAULT_PNG_WIDTH, caption: str | None = None) -> QImage:
    """The widget (and caption) as an image `width` pixels wide, scaled as a whole, aspect kept."""
    page = _Page(widget, caption)
    scale = width / page.width
    height = max(1, round(page.height * scale))
    image = QImage(width, height, QImage.Format.Format_RGB32)
    if image.isNull():
        raise ExportError(f"not enough memory for a {width}x{height} image")
    dots_per_metre = round(96 / 0.0254 * scale)  # so the image prints at the window's size
    image.setDotsPerMeterX(dots_per_metre)
    image.setDotsPerMeterY(dots_per_metre)
    image.fill(QColor(theme.BACKGROUND))
    with _prepared_for_export(widget, pen_scale=scale):
        painter = QPainter(image)
        painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform, False)  # grid cells stay sharp
        painter.scale(scale, scale)
        page.paint(painter)
        painter.end()
    return image


def _png_bytes(widget: QWidget, width: int, caption: str | None) -> bytes:
    image = render_png(widget, width, caption)
    array = QByteArray()
    buffer = QBuffer(array)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    ok = image.save(buffer, "PNG")
    buffer.close()
    if not ok:
        raise ExportError(f"Qt could not encode a {image.width()}x{image.height()} PNG")
    return bytes(array.data())


def _svg_bytes(widget: QWidget, caption: str | None) -> bytes:
    page = _Page(widget, caption)
    # Recorded into a QPicture first, then replayed: drawn straight into QSvgGenerator, the
    # clip paths of child widgets (pyqtgraph's view boxes) miss the widget's offset and cut
    # curves and labels away; replayed from a picture they land where they belong.
    picture = QPicture()
    with _prepared_for_export(widget, vector=True):
        recorder = QPainter()
        if not recorder.begin(picture):
            raise ExportError("Qt could not record the drawing")
        page.paint(recorder)
        recorder.end()
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
    painter = QPainter()
    if not painter.begin(generator):
        raise ExportError("Qt could not start an SVG drawing")
    painter.drawPicture(0, 0, picture)
    painter.end()
    buffer.close()
    return _flatten_svg(bytes(array.data()), picture.logicalDpiY())


def _pdf_bytes(widget: QWidget, caption: str | None) -> bytes:
    page = _Page(widget, caption)
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
    with _prepared_for_export(widget, vector=True):
        painter = QPainter()
        if not painter.begin(writer):
            raise ExportError("Qt could not start a PDF document")
        painter.scale(writer.width() / page.width, writer.height() / page.height)
        page.paint(painter)
        ok = painter.end()
    buffer.close()
    data = bytes(array.data())
    if not ok or not data.startswith(b"%PDF"):
        raise ExportError("Qt could not finish the PDF document")
    return data


def _format_number(value: float) -> str:
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _parse_matrix(text: str | None) -> tuple[float, ...] | None:
    match = _MATRIX.match(text or "")
    return tuple(float(v) for v in match.groups()) if match else None


def _map_pairs(text: str, m: tuple[float, ...]) -> str:
    a, b, c, d, e, f = m

    def mapped(match: re.Match) -> str:
        x, y = float(match.group(1)), float(match.group(2))
        return f"{_format_number(a * x + c * y + e)},{_format_number(b * x + d * y + f)}"

    return _PAIR.sub(mapped, text)


def _bake(element: ET.Element, m: tuple[float, ...]) -> bool:
    """Apply matrix `m` to a stroked shape's coordinates; False when the shape cannot be baked."""
    tag = element.tag.removeprefix(f"{{{SVG_NS}}}")
    if tag == "path":
        d = element.get("d", "")
        if not _ABSOLUTE_PATH.match(d):
            return False
        element.set("d", _map_pairs(d, m))
    elif tag in ("polyline", "polygon"):
        element.set("points", _map_pairs(element.get("points", ""), m))
    elif tag == "line":
        for x, y in (("x1", "y1"), ("x2", "y2")):
            px, py = float(element.get(x, "0")), float(element.get(y, "0"))
            element.set(x, _format_number(m[0] * px + m[2] * py + m[4]))
            element.set(y, _format_number(m[1] * px + m[3] * py + m[5]))
    elif tag == "rect":
        x, y = float(element.get("x", "0")), float(element.get("y", "0"))
        w, h = float(element.get("width", "0")), float(element.get("height", "0"))
        corners = " ".join(f"{px},{py}" for px, py in ((x, y), (x + w, y), (x + w, y + h), (x, y + h)))
        attrs = {k: v for k, v in element.attrib.items() if k not in ("x", "y", "width", "height", "rx", "ry")}
        element.clear()
        element.tag = f"{{{SVG_NS}}}polygon"
        element.attrib.update(attrs)
        element.set("points", _map_pairs(corners, m))
    else:
        return False
    return True


def _flatten_svg(data: bytes, dpi: int = 96) -> bytes:
    """Apply each group's transform to its non-scaling strokes, so no viewer has to support vector-effect."""
    ET.register_namespace("", SVG_NS)
    ET.register_namespace("xlink", XLINK_NS)
    root = ET.fromstring(data)
    for parent in list(root.iter()):
        for group in list(parent):
            if group.tag != f"{{{SVG_NS}}}g":
                continue
            m = _parse_matrix(group.get("transform"))
            if m is None or m == (1.0, 0.0, 0.0, 1.0, 0.0, 0.0):
                continue
            baked = [child for child in list(group)
                     if child.get("vector-effect") == "non-scaling-stroke" and _bake(child, m)]
            if not baked:
                continue
            if len(baked) == len(group):
                del group.attrib["transform"]
                continue
            # Text or images share the group: keep them under the transform, move the baked shapes out.
            flat = ET.Element(group.tag, {k: v for k, v in group.attrib.items() if k != "transform"})
            for child in baked:
                group.remove(child)
                flat.append(child)
            parent.insert(list(parent).index(group) + 1, flat)
    _fix_text(root, dpi)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def _fix_text(root: ET.Element, dpi: int) -> None:
    """Make text come out as Qt laid it out, in any viewer.

    Qt names its font aliases ("Sans Serif"): name the font Qt really used, then a CSS generic
    family. Viewers collapse leading, trailing and repeated spaces (librsvg ignores
    xml:space): those become no-break spaces. Each run gets the width Qt measured
    (`textLength`), so a viewer with other font metrics cannot make runs overlap.
    """
    families: dict[str, str] = {}
    metrics: dict[tuple[str, float, int, bool], tuple[QFontMetricsF, float]] = {}
    device = QImage(1, 1, QImage.Format.Format_RGB32)
    device.setDotsPerMeterX(round(dpi / 0.0254))
    device.setDotsPerMeterY(round(dpi / 0.0254))
    for element in root.iter():
        family = element.get("font-family")
        if not family:
            continue
        if family not in families:
            info = QFontInfo(QFont(family))
            names = [info.family(), family] if info.family() and info.family() != family else [family]
            generic = "monospace" if info.fixedPitch() else "sans-serif"
            families[family] = ", ".join([f"'{name}'" for name in names] + [generic])
        element.set("font-family", families[family])
        if element.tag != f"{{{SVG_NS}}}text" or not element.text:
            continue
        text = element.text
        try:
            key = (family, float(element.get("font-size", "12")), int(element.get("font-weight", "400")),
                   element.get("font-style") == "italic")
        except ValueError:
            continue
        if key not in metrics:
            font = QFont(family)
            font.setPointSizeF(key[1] * 72 / dpi)
            font.setWeight(QFont.Weight(min(1000, max(1, key[2]))))
            font.setItalic(key[3])
            # Qt draws a 10 pt font at 13 px, not the 13.33 px it writes: give viewers the size drawn.
            used = QRawFont.fromFont(font).pixelSize()
            metrics[key] = (QFontMetricsF(font, device), used if used > 0 else key[1])
        font_metrics, pixel_size = metrics[key]
        element.set("font-size", _format_number(pixel_size))
        width = font_metrics.horizontalAdvance(text)
        element.text = _SPACES.sub(lambda m: "\u00a0" * len(m.group(0)), text)
        if width > 0 and len(text) > 1:
            element.set("textLength", _format_number(width))


# ----- writing -----
def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _open_temporary(folder: Path, name: str):
    return tempfile.NamedTemporaryFile(dir=folder, prefix=f".{name}.", suffix=".tmp", delete=False)


def _write_atomically(path: Path, data: bytes) -> None:
    folder = path.parent
    if not folder.exists():
        raise ExportError(f"{path}: the folder {folder} does not exist")
    if not folder.is_dir():
        raise ExportError(f"{path}: {folder} is not a folder")
    try:
        handle = _open_temporary(folder, path.name)
    except OSError as exc:
        raise ExportError(f"{path}: cannot write to {folder} ({exc.strerror or exc})") from exc
    temporary = Path(handle.name)
    try:
        with handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise ExportError(f"{path}: could not be written ({exc.strerror or exc})") from exc
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise


def export_widget(widget: QWidget, path: Path | str, width: int | None = None, caption: str | None = None) -> Path:
    """Write `widget` as an image; the format comes from the suffix (.png, .svg, .pdf).

    PNG: `width` pixels wide (default 1920), the whole rendering scaled, aspect kept. SVG and
    PDF: vector drawings (curves as paths, the grid as its image) at the widget's size; `width`
    is ignored. `caption`, when given, is drawn in a band above the image. Raises ExportError
    with one line naming the file and the reason; never leaves a partial file behind.
    """
    path = Path(path).expanduser()
    fmt = export_format(path)
    if fmt == "png":
        width = DEFAULT_PNG_WIDTH if width is None else width
        if not isinstance(width, int) or not MIN_PNG_WIDTH <= width <= MAX_PNG_WIDTH:
            raise ExportError(f"{path}: PNG width must be {MIN_PNG_WIDTH} to {MAX_PNG_WIDTH} pixels, got {width}")
    if path.is_dir():
        raise ExportError(f"{path}: is a folder; give a file name")
    _check_widget(widget, path)
    try:
        if fmt == "png":
            data = _png_bytes(widget, width, caption)
        elif fmt == "svg":
            data = _svg_bytes(widget, caption)
        else:
            data = _pdf_bytes(widget, caption)
    except ExportError as exc:
        raise ExportError(f"{path}: {exc}") from exc
    _write_atomically(path, data)
    return path


def png_size(widget: QWidget, width: int, caption: str | None) -> QSize:
    """The pixel size `export_widget` gives a PNG of `widget` at `width`."""
    page = _Page(widget, caption)
    return QSize(width, max(1, round(page.height * width / page.width))) if page.width > 0 else QSize()


# ----- the dialog -----
class ExportDialog(QDialog):
    """File > Export...: what to export (chart, grid, whole view), as PNG, SVG or PDF, with or
    without the caption, and where. Remembers its choices and the last folder in QSettings.

    `exec()` returns Accepted once a file was written; `written` is its path.
    """

    def __init__(
        self,
        targets: dict[str, QWidget],
        caption: str,
        parent: QWidget | None = None,
        initial: str | None = None,
        step: int | None = None,
        settings: QSettings | None = None,
    ) -> None:
        super().__init__(parent)
        if not targets:
            raise ValueError("ExportDialog needs at least one view to export")
        self.setWindowTitle("Export image")
        # The app's theme colours text light but styles no dialog background and no list: give this
        # dialog, and the message boxes and file dialog it opens, the theme whole.
        self.setStyleSheet(theme.STYLESHEET + DIALOG_STYLE)
        self._targets = dict(targets)
        self._caption = caption
        self._step = step if step is not None else step_from_caption(caption)
        self._settings = settings if settings is not None else app_settings()
        self._auto_name = True  # the file name follows the choices until the user types one
        self._confirmed_overwrite: Path | None = None  # the file dialog already asked about replacing it
        self.written: Path | None = None

        self.target_box = QComboBox()
        order = [k for k in TARGETS if k in targets] + [k for k in targets if k not in TARGETS]
        for key in order:
            self.target_box.addItem(TARGET_LABELS.get(key, key.capitalize()), key)
        self.format_box = QComboBox()
        for fmt in FORMATS:
            self.format_box.addItem(f"{FORMAT_LABELS[fmt]} (.{fmt})", fmt)
        self.width_box = QSpinBox()
        self.width_box.setRange(MIN_PNG_WIDTH, MAX_PNG_WIDTH)
        self.width_box.setSingleStep(160)
        self.width_box.setSuffix(" px")
        self.width_box.setAccelerated(True)
        self.size_label = QLabel()
        self.size_label.setObjectName("muted")
        self.caption_box = QCheckBox("Add the &caption above the image")
        self.caption_box.setToolTip(caption)
        caption_preview = QLabel(caption)
        caption_preview.setObjectName("muted")
        caption_preview.setWordWrap(True)
        self.path_edit = QLineEdit()
        self.path_edit.setMinimumWidth(420)
        self.browse_button = QPushButton("&Browse\u2026")
        self.browse_button.setAutoDefault(False)

        width_row = QHBoxLayout()
        width_row.addWidget(self.width_box)
        width_row.addWidget(self.size_label, 1)
        path_row = QHBoxLayout()
        path_row.addWidget(self.path_edit, 1)
        path_row.addWidget(self.browse_button)
        form = QFormLayout()
        what_label, format_label, width_label, file_label = (
            QLabel("&What:"), QLabel("&Format:"), QLabel("PNG &width:"), QLabel("&Save to:"))
        what_label.setBuddy(self.target_box)
        format_label.setBuddy(self.format_box)
        width_label.setBuddy(self.width_box)
        file_label.setBuddy(self.path_edit)
        form.addRow(what_label, self.target_box)
        form.addRow(format_label, self.format_box)
        form.addRow(width_label, width_row)
        form.addRow("", self.caption_box)
        form.addRow("", caption_preview)
        form.addRow(file_label, path_row)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        self.save_button = self.buttons.button(QDialogButtonBox.StandardButton.Save)
        self.save_button.setText("&Export")
        self.save_button.setDefault(True)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.buttons)

        self._restore_settings(initial)
        self.target_box.currentIndexChanged.connect(self._on_choice_changed)
        self.format_box.currentIndexChanged.connect(self._on_choice_changed)
        self.width_box.valueChanged.connect(self._update_size_label)
        self.caption_box.toggled.connect(self._update_size_label)
        self.path_edit.textEdited.connect(self._on_path_edited)
        self.browse_button.clicked.connect(self._on_browse_clicked)
        self.buttons.accepted.connect(self._on_export_clicked)
        self.buttons.rejected.connect(self.reject)
        self._on_choice_changed()
        self.target_box.setFocus()

    # ----- state -----
    def target(self) -> str:
        return self.target_box.currentData()

    def image_format(self) -> str:
        return self.format_box.currentData()

    def path(self) -> Path:
        return Path(self.path_edit.text().strip()).expanduser()

    def _folder(self) -> Path:
        text = self.path_edit.text().strip()
        if text:
            return self.path().parent
        saved = self._settings.value(f"{SETTINGS_GROUP}/folder", "", str)
        return Path(saved) if saved and Path(saved).is_dir() else Path.home()

    def _default_path(self) -> Path:
        return self._folder() / default_file_name(self.target(), self.image_format(), self._step)

    def _restore_settings(self, initial: str | None) -> None:
        s, g = self._settings, SETTINGS_GROUP
        target = initial or s.value(f"{g}/target", "chart", str)
        index = self.target_box.findData(target)
        self.target_box.setCurrentIndex(max(0, index))
        index = self.format_box.findData(s.value(f"{g}/format", "png", str))
        self.format_box.setCurrentIndex(max(0, index))
        try:
            width = int(s.value(f"{g}/width", DEFAULT_PNG_WIDTH))
        except (TypeError, ValueError):
            width = DEFAULT_PNG_WIDTH
        self.width_box.setValue(min(MAX_PNG_WIDTH, max(MIN_PNG_WIDTH, width)))
        self.caption_box.setChecked(str(s.value(f"{g}/caption", "true")).lower() in ("true", "1"))
        self.path_edit.setText(str(self._default_path()))

    def _save_settings(self, path: Path) -> None:
        s, g = self._settings, SETTINGS_GROUP
        s.setValue(f"{g}/folder", str(path.parent))
        s.setValue(f"{g}/target", self.target())
        s.setValue(f"{g}/format", self.image_format())
        s.setValue(f"{g}/width", self.width_box.value())
        s.setValue(f"{g}/caption", self.caption_box.isChecked())
        s.sync()

    # ----- slots -----
    def _on_choice_changed(self, *_args) -> None:
        is_png = self.image_format() == "png"
        self.width_box.setEnabled(is_png)
        if self._auto_name:
            self.path_edit.setText(str(self._default_path()))
        else:
            path = self.path()
            if path.name and path.suffix.lower().lstrip(".") != self.image_format():
                stem = path.stem if path.suffix.lower().lstrip(".") in FORMATS else path.name
                self.path_edit.setText(str(path.with_name(f"{stem}.{self.image_format()}")))
        self._update_size_label()

    def _update_size_label(self, *_args) -> None:
        widget = self._targets[self.target()]
        caption = self._caption if self.caption_box.isChecked() else None
        if self.image_format() == "png":
            size = png_size(widget, self.width_box.value(), caption)
            self.size_label.setText(f"\u2192 {size.width()} \u00d7 {size.height()} px")
        else:
            page = _Page(widget, caption)
            self.size_label.setText(f"vector, {round(page.width)} \u00d7 {round(page.height)} at the window's scale")

    def _on_path_edited(self, _text: str) -> None:
        self._auto_name = False

    def _on_browse_clicked(self) -> None:
        fmt = self.image_format()
        chosen, _filter = QFileDialog.getSaveFileName(
            self, "Export image", str(self.path()), FORMAT_FILTERS[fmt],
            FORMAT_FILTERS[fmt],
        )
        if not chosen:
            return
        path = Path(chosen)
        if not path.suffix:
            path = path.with_suffix(f".{fmt}")
        suffix = path.suffix.lower().lstrip(".")
        if suffix in FORMATS and suffix != fmt:
            self.format_box.setCurrentIndex(self.format_box.findData(suffix))
        self._auto_name = False
        self.path_edit.setText(str(path))
        self._confirmed_overwrite = path

    def _on_export_clicked(self) -> None:
        path = self.path()
        if not self.path_edit.text().strip():
            self._fail("Choose a file name to export to.")
            return
        if not path.suffix:
            path = path.with_suffix(f".{self.image_format()}")
        suffix = path.suffix.lower().lstrip(".")
        if suffix in FORMATS and suffix != self.image_format():  # a typed .pdf wins over the menu
            self._auto_name = False
            self.format_box.setCurrentIndex(self.format_box.findData(suffix))
        if path.exists() and self._confirmed_overwrite != path:
            answer = QMessageBox.question(
                self, "Replace file?", f"{path.name} already exists in {path.parent}. Replace it?",
                QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No, QMessageBox.StandardButton.No)
            if answer != QMessageBox.StandardButton.Yes:
                return
        caption = self._caption if self.caption_box.isChecked() else None
        try:
            export_widget(self._targets[self.target()], path, self.width_box.value(), caption)
        except ExportError as exc:
            self._fail(f"Could not export: {exc}.")
            return
        self.written = path
        self._save_settings(path)
        self.accept()

    def _fail(self, sentence: str) -> None:
        QMessageBox.warning(self, "Export failed", sentence)


def add_export_actions(
    plot_widget: QWidget,
    targets: dict[str, QWidget] | Callable[[], dict[str, QWidget]],
    caption_fn: Callable[[], str],
    initial: str = "chart",
) -> QAction:
    """Put "Export..." (this dialog) into a pyqtgraph widget's context menu, in place of pyqtgraph's
    own exporter, whose SVG output is broken on current Qt. Returns the action."""

    def open_dialog() -> None:
        chosen = targets() if callable(targets) else targets
        ExportDialog(chosen, caption_fn(), plot_widget.window(), initial=initial).exec()

    action = QAction("Export\u2026", plot_widget)
    action.triggered.connect(open_dialog)
    scene = plot_widget.scene() if hasattr(plot_widget, "scene") else None
    if scene is not None and hasattr(scene, "contextMenu"):
        scene.contextMenu = [action]
    return action
