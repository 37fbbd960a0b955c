"""A paint device that records the text drawn into it: each string, its font's height in device pixels, and where
it lands. Exports paint into it as they paint into an image, so tests read what an exported image says and how
large, not what the code meant to draw."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QPointF, QRectF
from PySide6.QtGui import QFontMetricsF, QPaintDevice, QPaintEngine, QTransform


@dataclass(frozen=True)
class DrawnText:
    """One run of text as the device received it: its words, its font's pixel size and its box, in device pixels."""

    text: str
    pixels: float  # the font's em height on the device
    box: QRectF
    clip: QRectF | None = None  # the painter's clip where it was drawn, in device pixels (None: no clip)
    ink: QRectF | None = None  # where its glyphs' ink lies (the box less the font's empty room), in device pixels


class _TextEngine(QPaintEngine):
    def __init__(self) -> None:
        super().__init__(QPaintEngine.PaintEngineFeature.AllFeatures)
        self.texts: list[DrawnText] = []
        self._transform = QTransform()

    def begin(self, _device) -> bool:
        return True

    def end(self) -> bool:
        return True

    def updateState(self, state) -> None:
        if state.state() & QPaintEngine.DirtyFlag.DirtyTransform:
            self._transform = QTransform(state.transform())

    def drawPixmap(self, *_args) -> None:
        pass

    def drawImage(self, *_args) -> None:
        pass

    def drawPath(self, *_args) -> None:
        pass

    def drawPolygon(self, *_args) -> None:
        pass

    def drawTextItem(self, point: QPointF, item) -> None:
        text = item.text()
        if not text.strip():
            return
        font = item.font()
        metrics = QFontMetricsF(font)
        em = font.pixelSize() if font.pixelSize() > 0 else font.pointSizeF() * 96 / 72
        scale = (abs(self._transform.m22()) ** 2 + abs(self._transform.m21()) ** 2) ** 0.5
        local = QRectF(point.x(), point.y() - metrics.ascent(), metrics.horizontalAdvance(text), metrics.height())
        painter = self.painter()
        clip = None
        if painter is not None and painter.hasClipping():
            clip = painter.deviceTransform().mapRect(painter.clipBoundingRect())
        ink = metrics.tightBoundingRect(text).translated(point)
        self.texts.append(DrawnText(text, em * scale, self._transform.mapRect(local), clip,
                                    self._transform.mapRect(ink)))

    def type(self) -> QPaintEngine.Type:
        return QPaintEngine.Type.User


class TextRecorder(QPaintDevice):
    """A `width` x `height` device at 96 dpi whose painting keeps only the texts, in `texts`."""

    def __init__(self, width: int, height: int) -> None:
        super().__init__()
        self.size = (width, height)
        self._engine = _TextEngine()

    @property
    def texts(self) -> list[DrawnText]:
        return self._engine.texts

    def paintEngine(self) -> QPaintEngine:
        return self._engine

    def metric(self, metric: QPaintDevice.PaintDeviceMetric) -> int:
        m = QPaintDevice.PaintDeviceMetric
        width, height = self.size
        return {m.PdmWidth: width, m.PdmHeight: height, m.PdmDepth: 32, m.PdmNumColors: 2**31 - 1,
                m.PdmDpiX: 96, m.PdmDpiY: 96, m.PdmPhysicalDpiX: 96, m.PdmPhysicalDpiY: 96,
                m.PdmWidthMM: round(width * 25.4 / 96), m.PdmHeightMM: round(height * 25.4 / 96),
                m.PdmDevicePixelRatio: 1, m.PdmDevicePixelRatioScaled: 65536}.get(metric, 0)


SLIDE_OVERLAP = 4  # pixels of ink two labels may share each way (a comma's tail under an axis title's ascenders)


def slide_problems(texts: list[DrawnText], bars: int, width: int, height: int) -> list[str]:
    """What is wrong with a slide's texts as a `width` x `height` slide receives them: a label off the slide or
    cut by the part of the view that draws it, two labels' ink overlapping, text under 2.5 % of the height, and
    `bars` scroll bars printed."""
    found = [f"{bars} scroll bar(s)"] if bars else []
    for t in texts:
        ink = t.ink
        if ink.left() < -1 or ink.top() < -1 or ink.right() > width + 1 or ink.bottom() > height + 1:
            found.append(f"off the slide: {t.text!r} at {ink.getCoords()}")
        if t.clip is not None and not t.clip.adjusted(-2, -2, 2, 2).contains(ink):
            found.append(f"clipped: {t.text!r} at {ink.getCoords()} in {t.clip.getCoords()}")
        if t.pixels < 0.025 * height:
            found.append(f"small: {t.text!r} {t.pixels:.1f} px")
    for i, a in enumerate(texts):
        for b in texts[i + 1:]:
            shared = a.ink.intersected(b.ink)
            apart = (a.text, a.box) != (b.text, b.box)  # a text drawn twice in one place is one label
            if shared.width() > SLIDE_OVERLAP and shared.height() > SLIDE_OVERLAP and apart:
                found.append(f"overlap: {a.text!r} and {b.text!r}")
    return found
