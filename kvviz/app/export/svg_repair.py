"""Repairs for the SVG that Qt's QSvgGenerator writes, so any viewer draws it as the window shows it.

- `flatten_svg` applies each group's transform to pyqtgraph's curves, which Qt writes in data
  coordinates under a scaling `transform` with `vector-effect="non-scaling-stroke"`, ignored by
  many viewers (librsvg, office suites) that then draw strokes hundreds of pixels wide;
- text gets the font size Qt really drew, the real family name and Qt's measured width.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from PySide6.QtGui import QFont, QFontInfo, QFontMetricsF, QImage, QRawFont

SVG_NS = "http://www.w3.org/2000/svg"
XLINK_NS = "http://www.w3.org/1999/xlink"
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_PAIR = re.compile(rf"({_NUMBER})\s*,\s*({_NUMBER})")
_MATRIX = re.compile(rf"^\s*matrix\(\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,"
                     rf"\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*\)\s*$")
_SPACES = re.compile(r"^ +| +$| {2,}")
_ABSOLUTE_PATH = re.compile(r"^[MLCZ0-9eE.,+\-\s]*$")  # the commands QSvgGenerator writes, all absolute


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


def flatten_svg(data: bytes, dpi: int = 96) -> bytes:
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
