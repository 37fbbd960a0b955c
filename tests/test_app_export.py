"""Image export: PNG at a width, SVG with real curves, PDF pages, atomic writes, the dialog and `run_export`."""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from helpers_checkpoints import plan_ids, save_kvviz_folder, tiny_kvviz_model
from PySide6.QtCore import QPoint, QPointF, QRectF, Qt
from PySide6.QtGui import QFont, QFontMetricsF, QImage, QPainter, QRawFont
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QDialog, QFileDialog, QMessageBox, QWidget

import kvviz.core.files
from kvviz.app import theme
from kvviz.app.export import (
    ExportDialog,
    ExportError,
    default_file_name,
    export_widget,
    make_caption,
    parse_formats,
    png_size,
    run_export,
    shorten_caption,
)
from kvviz.app.export import render as export_render
from kvviz.app.export.caption import CAPTION_MAX_CHARS
from kvviz.app.export.headless import VIEW_SIZE, build_view_area
from kvviz.app.export.svg_repair import flatten_svg
from kvviz.app.settings import SettingsFile, app_settings
from kvviz.app.views.grid.kv_grid import KVGridView
from kvviz.app.views.run_view import RunView
from kvviz.app.views.work_chart import WorkChart
from kvviz.core.errors import KvvizError

SVG = "{http://www.w3.org/2000/svg}"
PROMPT = "Time flies fast"  # 3 GPT-2 tokens
N = 12
CAPTION = "\u201cTime flies fast\u201d \u2014 tiny, step 13, 12 new tokens, with KV cache"


def rgb(hex_colour: str) -> np.ndarray:
    return np.array(theme.rgba(hex_colour)[:3], dtype=np.int16)


def pixels(image: QImage) -> np.ndarray:
    """(H, W, 3) RGB of a QImage."""
    image = image.convertToFormat(QImage.Format.Format_RGB888)
    data = np.frombuffer(image.constBits(), dtype=np.uint8, count=image.sizeInBytes())
    return data.reshape(image.height(), image.bytesPerLine())[:, : image.width() * 3].reshape(
        image.height(), image.width(), 3).astype(np.int16)


def distinct_colours(rgb_pixels: np.ndarray) -> int:
    r, g, b = (rgb_pixels[..., i].astype(np.int32) for i in range(3))
    packed = (r << 16) | (g << 8) | b
    return len(np.unique(packed))


def near(rgb_pixels: np.ndarray, hex_colour: str, tolerance: int = 12) -> np.ndarray:
    return np.abs(rgb_pixels - rgb(hex_colour)).max(axis=2) <= tolerance


def count_near(rgb_pixels: np.ndarray, hex_colour: str, tolerance: int = 12) -> int:
    return int(near(rgb_pixels, hex_colour, tolerance).sum())


@pytest.fixture(scope="module")
def run():
    """A tiny model's cached run: its RunPlan (3 layers, 3 prompt tokens, 12 new) and every StepRecord."""
    from kvviz.engine.engine import Engine

    engine = Engine(tiny_kvviz_model(n_layer=3, n_head=2, n_embd=32, n_ctx=64))
    plan = plan_ids(engine, engine.encode_prompt(PROMPT), N, True, prompt=PROMPT, model_name="tiny")
    return plan, list(engine.run(plan))


def fed(view, run, passes: int | None = None):
    """`view` reset with the run's plan and given its first `passes` records (all by default), drawn."""
    plan, records = run
    view.reset(plan)
    view.apply(records[:passes])
    view.refresh()
    return view


def shown(qtbot, widget, width: int, height: int):
    qtbot.addWidget(widget)
    widget.resize(width, height)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


@pytest.fixture
def chart(qtbot, run):
    return shown(qtbot, fed(WorkChart(), run), 900, 560)


@pytest.fixture
def grid(qtbot, run):
    return shown(qtbot, fed(KVGridView(), run), 1000, 480)


def svg_stroke_shapes(root: ET.Element) -> list[tuple[str, list[tuple[float, float]], ET.Element]]:
    """Every stroked path/polyline: (stroke colour, its points, element), styles inherited from groups."""
    found = []

    def walk(element: ET.Element, stroke: str | None, transformed: bool) -> None:
        stroke = element.get("stroke", stroke)
        transformed = transformed or element.get("transform") not in (None, "matrix(1,0,0,1,0,0)")
        for child in element:
            tag = child.tag.removeprefix(SVG)
            if tag in ("path", "polyline") and (child.get("stroke", stroke) or "none") != "none":
                text = child.get("d") or child.get("points") or ""
                points = [(float(x), float(y)) for x, y in re.findall(r"([-\d.e]+),([-\d.e]+)", text)]
                assert not transformed or child.get("vector-effect") != "non-scaling-stroke", \
                    "a non-scaling stroke was left under a transform"
                found.append((child.get("stroke", stroke).lower(), points, child))
            walk(child, stroke, transformed)

    walk(root, None, False)
    return found


def render_svg(path: Path) -> QImage:
    """The SVG drawn by Qt's renderer at one pixel per SVG unit."""
    renderer = QSvgRenderer(str(path))
    box = renderer.viewBoxF()
    image = QImage(round(box.width()), round(box.height()), QImage.Format.Format_RGB32)
    image.fill(0)
    painter = QPainter(image)
    renderer.render(painter, QRectF(0, 0, box.width(), box.height()))
    painter.end()
    return image


def expected_points(chart: WorkChart, key: str, caption_height: float) -> np.ndarray:
    """Where the chart draws series `key`, in the exported SVG's coordinates."""
    x, y = chart.curve_data()[key]
    vb = chart.work_plot.getViewBox()
    viewport = chart.layout_widget.viewport()
    out = []
    corner = viewport.mapTo(chart, QPoint(0, 0))
    for xi, yi in zip(x, y, strict=True):
        scene = vb.mapViewToScene(QPointF(float(xi), float(yi)))
        device = chart.layout_widget.viewportTransform().map(scene)
        out.append((device.x() + corner.x(), device.y() + corner.y() + caption_height))
    return np.array(out)


# ----- PNG -----
def test_png_has_the_width_and_the_chart_colours(chart, tmp_path):
    path = export_widget(chart, tmp_path / "chart.png", width=1280, caption=CAPTION)
    image = QImage(str(path))
    assert (image.width(), image.height()) == (1280, png_size(chart, 1280, CAPTION).height())
    px = pixels(image)
    assert distinct_colours(px) > 50  # text, curves, grid lines: not a blank image
    assert count_near(px, theme.DARK.amber) > 500 and count_near(px, theme.DARK.teal) > 500
    # The caption band sits above the chart: without it the image is shorter by that band.
    plain = QImage(str(export_widget(chart, tmp_path / "plain.png", width=1280)))
    assert plain.width() == 1280 and plain.height() < image.height()
    assert abs(plain.height() - round(chart.height() * 1280 / chart.width())) <= 1
    band = px[: image.height() - plain.height()]
    assert count_near(band, theme.DARK.foreground, 40) > 100  # caption text drawn in the band


def test_long_prompt_caption_stays_a_few_lines(chart, tmp_path):
    prompt = "To be, or not to be, that is the question:\n" * 60
    caption = f"\u201c{prompt}\u201d \u2014 tiny, step 4, 3 new tokens, with KV cache"
    short = shorten_caption(caption)
    assert short.endswith("\u201d \u2014 tiny, step 4, 3 new tokens, with KV cache") and "\n" not in short
    assert len(short) <= CAPTION_MAX_CHARS and "\u2026" in short
    assert make_caption(prompt, "tiny", 4, 3, True) == short
    page = export_render.Page(chart, caption)
    line = QFontMetricsF(page.font).lineSpacing()
    assert page.caption_height <= 3 * line + 2 * page.pad + 2


def test_png_scales_curve_pens_and_puts_them_back(chart, tmp_path):
    pen_before = chart.without_curve.curve.opts["pen"]
    width_before = pen_before.widthF()
    small = pixels(QImage(str(export_widget(chart, tmp_path / "small.png", width=900))))
    large = pixels(QImage(str(export_widget(chart, tmp_path / "large.png", width=2700))))
    # Three times the width: amber covers about nine times the pixels, lines keep their weight.
    ratio = count_near(large, theme.DARK.amber) / count_near(small, theme.DARK.amber)
    assert 6 < ratio < 12
    assert chart.without_curve.curve.opts["pen"].widthF() == width_before
    assert chart.without_curve.curve.opts["segmentedLineMode"] == "auto"
    assert chart.layout_widget.cacheMode() == chart.layout_widget.CacheModeFlag.CacheBackground


def grid_columns(image: QImage) -> str:
    """The exported grid's cell columns, read from the image alone, left to right: 'T' for a teal
    column, 'A' for an amber one; the 1 px dark gaps between cells separate the columns."""
    px = pixels(image)
    teal, amber = near(px, theme.DARK.teal, 4), near(px, theme.DARK.amber, 4)
    rows = (teal | amber).sum(axis=1) > 0.1 * px.shape[1]  # the grid's cell rows, not the legend's swatches
    assert rows.sum() > 50, "no grid rows found in the image"
    kinds = np.where(teal[rows].mean(axis=0) > 0.5, "T", np.where(amber[rows].mean(axis=0) > 0.5, "A", "."))
    return "".join(run[0] for run in re.findall(r"T+|A+", "".join(kinds)))


@pytest.mark.parametrize(("passes", "columns"), [
    (1, "AAA"),  # the first pass computes the 3 prompt positions
    (4, "TTTTTA"),  # pass 4 computes position 5 and reads positions 0-4 from the cache
    (13, "T" * 14 + "A"),  # the cache-filling pass: 14 positions reused, the last one computed
])
def test_png_grid_at_step_k_shows_one_amber_column(passes, columns, qtbot, run, tmp_path):
    grid = shown(qtbot, fed(KVGridView(), run, passes), 1000, 480)
    image = QImage(str(export_widget(grid, tmp_path / "grid.png", width=2000)))
    assert image.width() == 2000
    assert grid_columns(image) == columns


# ----- SVG -----
def test_svg_parses_and_holds_the_curves_as_paths(chart, tmp_path):
    path = export_widget(chart, tmp_path / "chart.svg", caption=CAPTION)
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    assert root.findall(f".//{SVG}image") == []  # no bitmap anywhere in the chart
    assert CAPTION in "".join(t.text or "" for t in root.iter(f"{SVG}text")).replace("\u00a0", " ")
    shapes = svg_stroke_shapes(root)
    caption_height = export_render.Page(chart, CAPTION).caption_height
    drawn = {}
    for key, colour in (("without_cache", theme.DARK.amber), ("with_cache", theme.DARK.teal)):
        expected = expected_points(chart, key, caption_height)
        candidates = [pts for c, pts, _ in shapes if c == colour.lower() and len(pts) == len(expected)]
        assert candidates, f"no {colour} path with {len(expected)} points"
        best = min(np.abs(np.array(pts) - expected).max() for pts in candidates)
        assert best < 0.6, f"{key}: curve points off by {best:.2f} px"
        drawn[key] = expected
    assert len(chart.curve_data()["without_cache"][0]) == N + 1
    # Drawn by an SVG renderer that honours clip paths, every data point is visible where it belongs
    # (clip paths written in the wrong coordinates would cut the curves and axis labels away).
    rendered = pixels(render_svg(path))
    data = chart.curve_data()
    hidden = data["without_cache"][1] == data["with_cache"][1]  # amber under the teal curve drawn after it
    for key, colour in (("without_cache", theme.DARK.amber), ("with_cache", theme.DARK.teal)):
        for (x, y), covered in zip(drawn[key], hidden if key == "without_cache" else hidden & False, strict=True):
            if covered:
                continue
            around = rendered[round(y) - 3: round(y) + 4, round(x) - 3: round(x) + 4]
            assert count_near(around, colour, 30) > 0, f"{key} point at ({x:.0f}, {y:.0f}) not drawn"


@pytest.fixture
def view(qtbot, run):
    """The whole view as `kvviz export` lays it out: nested widgets, each at an offset."""
    area = fed(build_view_area(), run)
    qtbot.addWidget(area)
    area.resize(*VIEW_SIZE)
    area.show()
    qtbot.waitExposed(area)
    return area


@pytest.mark.parametrize("name", ["chart", "grid", "view"])
def test_svg_draws_like_the_png(name, request, tmp_path):
    """Qt's SVG renderer (clip paths and all) draws the SVG as the PNG export shows the widget."""
    widget = request.getfixturevalue(name)
    drawn = pixels(render_svg(export_widget(widget, tmp_path / f"{name}.svg", caption=CAPTION)))
    png = pixels(QImage(str(export_widget(widget, tmp_path / f"{name}.png", width=drawn.shape[1], caption=CAPTION))))
    assert abs(drawn.shape[0] - png.shape[0]) <= 1
    rows = min(drawn.shape[0], png.shape[0])
    differ = (np.abs(drawn[:rows] - png[:rows]).max(axis=2) > 40).mean()
    assert differ < 0.02, f"{differ:.1%} of the SVG's pixels differ from the PNG"
    assert count_near(drawn, theme.DARK.amber) > 100 and count_near(drawn, theme.DARK.teal) > 100
    curves = curves_inside_their_clips(ET.parse(tmp_path / f"{name}.svg").getroot())
    assert curves >= (0 if name == "grid" else 2)


def curves_inside_their_clips(root: ET.Element) -> int:
    """Check that every amber or teal curve lies inside the clip path that applies to it, read as the
    SVG spec reads it (in the user space of the element that references it); return how many curves."""
    parents = {child: parent for parent in root.iter() for child in parent}
    clips = {}
    for clip in root.iter(f"{SVG}clipPath"):
        points = [(float(x), float(y)) for shape in clip for x, y in
                  re.findall(r"([-\d.e]+),([-\d.e]+)", shape.get("d") or shape.get("points") or "")]
        clips[clip.get("id")] = np.array(points)
    checked = 0
    for colour, points, element in svg_stroke_shapes(root):
        if colour not in (theme.DARK.amber.lower(), theme.DARK.teal.lower()) or len(points) < 3:
            continue
        if element.get("vector-effect") != "non-scaling-stroke":
            continue  # not a pyqtgraph curve (the token strip's chips, for one)
        ancestor = parents.get(element)
        while ancestor is not None and ancestor.get("clip-path") is None:
            assert ancestor.get("transform") in (None, "matrix(1,0,0,1,0,0)")  # curves are flattened
            ancestor = parents.get(ancestor)
        if ancestor is None:
            continue
        box = clips[re.search(r"#([^)]+)", ancestor.get("clip-path")).group(1)]
        pts = np.array(points)
        assert (pts >= box.min(axis=0) - 1.5).all() and (pts <= box.max(axis=0) + 1.5).all(), \
            f"a {colour} curve lies outside its clip path {box.min(axis=0)}..{box.max(axis=0)}"
        checked += 1
    return checked


def test_svg_text_keeps_the_window_layout(grid, tmp_path):
    """Fonts at the pixel size Qt drew (a 10 pt label is drawn at 13 px, not 13.33), named by their real
    family, with the width Qt measured, so other viewers cannot make adjacent runs overlap."""
    root = ET.parse(export_widget(grid, tmp_path / "grid.svg", caption=CAPTION)).getroot()
    texts = [t for t in root.iter(f"{SVG}text") if len((t.text or "").strip()) > 5]
    assert len(texts) >= 4
    for text in texts:
        family = text.get("font-family")
        assert "'Sans Serif'" not in family.split(",")[0] and family.endswith("sans-serif")
        font = QFont(family.split(",")[0].strip("' "))
        font.setWeight(QFont.Weight(int(text.get("font-weight", "400"))))
        raw = QRawFont.fromFont(font)
        raw.setPixelSize(float(text.get("font-size")))
        glyphs = raw.glyphIndexesForString(text.text)
        width = sum(a.x() for a in raw.advancesForGlyphIndexes(glyphs))
        measured = float(text.get("textLength"))
        assert abs(width - measured) / measured < 0.015, f"{text.text!r}: {width:.1f} vs {measured:.1f}"


def test_svg_grid_embeds_sharp_cells(grid, tmp_path):
    root = ET.parse(export_widget(grid, tmp_path / "grid.svg")).getroot()
    images = root.findall(f".//{SVG}image")
    big = max(images, key=lambda e: float(e.get("width")) * float(e.get("height")))
    data = big.get("{http://www.w3.org/1999/xlink}href").split(",", 1)[1]
    import base64

    image = QImage.fromData(base64.b64decode(data))
    assert image.width() >= 2 * grid.image_item.image.shape[1]  # enlarged, nearest neighbour
    px = pixels(image)
    assert count_near(px, theme.DARK.teal, 0) > 0 and count_near(px, theme.DARK.amber, 0) > 0
    assert distinct_colours(px) <= 6  # cell colours and the gap colour only: no smoothing blends
    assert grid.image_item.qimage.width() == grid.image_item.image.shape[1]  # the view's own image is back


def test_flatten_svg_bakes_transforms():
    raw = (b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 100 100"><g stroke="#f00" '
           b'transform="matrix(2,0,0,-3,10,90)"><polyline vector-effect="non-scaling-stroke" points="1,2 3,4 "/>'
           b'<path vector-effect="non-scaling-stroke" d="M0,0 L1,1 C2,2 3,3 4,4"/>'
           b'<text x="0" y="0">kept</text></g></svg>')
    root = ET.fromstring(flatten_svg(raw))
    groups = root.findall(f"{SVG}g")
    assert groups[0].get("transform") == "matrix(2,0,0,-3,10,90)" and groups[0][0].tag == f"{SVG}text"
    assert "transform" not in groups[1].attrib
    assert groups[1][0].get("points") == "12,84 16,78 "
    assert groups[1][1].get("d") == "M10,90 L12,87 C14,84 16,81 18,78"


# ----- PDF -----
def test_pdf_has_one_page_the_size_of_the_view(chart, grid, tmp_path):
    path = export_widget(chart, tmp_path / "chart.pdf", caption=CAPTION)
    data = path.read_bytes()
    assert data.startswith(b"%PDF-") and data.rstrip().endswith(b"%%EOF")
    assert len(re.findall(rb"/Type\s*/Page\b", data)) == 1
    page = export_render.Page(chart, CAPTION)
    box = [float(v) for v in re.search(rb"/MediaBox\s*\[([^\]]*)\]", data).group(1).split()]
    assert abs(box[2] - box[0] - page.width) < 1 and abs(box[3] - box[1] - page.height) < 1
    grid_pdf = export_widget(grid, tmp_path / "grid.pdf").read_bytes()
    assert b"/DCTDecode" not in grid_pdf  # the grid is embedded losslessly, not as JPEG


def pdf_strokes(data: bytes) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every stroked path in a PDF's content streams: (stroke RGB 0..255, its m/l points)."""
    import zlib

    text = "".join(zlib.decompress(m.group(1)).decode("latin1")
                   for m in re.finditer(rb"stream\r?\n(.*?)\r?\nendstream", data, re.DOTALL)
                   if m.group(1)[:1] == b"x")
    strokes, colour, points = [], np.zeros(3), []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[3] == "SCN":
            colour = np.array([float(v) * 255 for v in parts[:3]])
        elif len(parts) == 3 and parts[2] in ("m", "l"):
            points = [] if parts[2] == "m" else points
            points.append((float(parts[0]), float(parts[1])))
        elif parts == ["S"]:
            strokes.append((colour, np.array(points)))
            points = []
    return strokes


def test_pdf_holds_the_curves_as_paths(chart, tmp_path):
    data = export_widget(chart, tmp_path / "chart.pdf", caption=CAPTION).read_bytes()
    strokes = pdf_strokes(data)
    caption_height = export_render.Page(chart, CAPTION).caption_height
    for key, colour in (("without_cache", theme.DARK.amber), ("with_cache", theme.DARK.teal)):
        expected = expected_points(chart, key, caption_height)
        matches = [pts for rgb_, pts in strokes
                   if np.abs(rgb_ - rgb(colour)).max() < 2 and pts.shape == expected.shape]
        assert matches, f"no {colour} stroke with {len(expected)} points in the PDF"
        assert min(np.abs(pts - expected).max() for pts in matches) < 0.6


# ----- errors and atomic writes -----
def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != "settings")  # conftest's settings folder


def test_unknown_suffix_writes_nothing(chart, tmp_path):
    for name in ("chart.gif", "chart"):
        with pytest.raises(ExportError) as info:
            export_widget(chart, tmp_path / name)
        assert str(tmp_path / name) in str(info.value) and "\n" not in str(info.value)
    assert leftovers(tmp_path) == []


def test_read_only_folder_raises_and_leaves_nothing(chart, tmp_path, monkeypatch):
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):  # root writes anywhere: make the OS answer as it does for a user
            real_open = os.open

            def refuse(path, *args, **kwargs):
                if Path(path).parent == folder:
                    raise PermissionError(13, "Permission denied")
                return real_open(path, *args, **kwargs)

            monkeypatch.setattr(kvviz.core.files.os, "open", refuse)
        with pytest.raises(ExportError, match="Permission denied") as info:
            export_widget(chart, folder / "chart.png")
        assert str(folder / "chart.png") in str(info.value)
        assert leftovers(folder) == []
    finally:
        folder.chmod(0o755)


def test_failed_rename_keeps_the_old_file_and_no_temporary(chart, tmp_path, monkeypatch):
    target = tmp_path / "chart.svg"
    target.write_text("old")
    real_replace = os.replace

    def broken_replace(src, dst):
        if Path(dst) == target:
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(kvviz.core.files.os, "replace", broken_replace)
    with pytest.raises(ExportError, match="No space left on device"):
        export_widget(chart, target)
    assert target.read_text() == "old"
    assert leftovers(tmp_path) == ["chart.svg"]


def test_disk_full_midway_leaves_no_temporary(chart, tmp_path, monkeypatch):
    """The temporary file exists, half written, when the disk fills: it goes, the old image stays."""
    target = tmp_path / "chart.png"
    target.write_text("old")
    seen = []

    def full(fd):
        seen.append(sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(kvviz.core.files.os, "fsync", full)
    with pytest.raises(ExportError, match=re.escape(f"{target}: could not be written (No space left on device)")):
        export_widget(chart, target, width=400)
    assert len(seen) == 1 and len(seen[0]) == 1  # the temporary file was there
    assert target.read_text() == "old" and leftovers(tmp_path) == ["chart.png"]


@pytest.mark.parametrize("suffix", ["png", "svg", "pdf"])
def test_render_failing_midway_writes_nothing(suffix, chart, tmp_path, monkeypatch):
    """A drawing that raises after the caption is painted: no file, no temporary, the old image kept."""
    real_paint = export_render.Page.paint

    def paint_then_fail(self, painter):
        real_paint(self, painter)
        raise RuntimeError("drawing failed")

    monkeypatch.setattr(export_render.Page, "paint", paint_then_fail)
    (tmp_path / f"old.{suffix}").write_text("old")
    for name in (f"chart.{suffix}", f"old.{suffix}"):
        with pytest.raises(RuntimeError, match="drawing failed"):
            export_widget(chart, tmp_path / name, caption=CAPTION)
    assert leftovers(tmp_path) == [f"old.{suffix}"] and (tmp_path / f"old.{suffix}").read_text() == "old"
    assert chart.layout_widget.cacheMode() == chart.layout_widget.CacheModeFlag.CacheBackground  # put back


def test_exports_never_touch_the_umask(chart, grid, tmp_path, monkeypatch, qtbot):
    """The worker thread may be creating files (the Hugging Face cache) while an image is written:
    changing the process umask, even for a moment, would give its files the wrong permissions."""
    calls = []
    real_umask = os.umask
    monkeypatch.setattr(os, "umask", lambda mask: calls.append(mask) or real_umask(mask))
    for name in ("chart.png", "chart.svg", "chart.pdf"):
        export_widget(chart, tmp_path / name, width=400, caption=CAPTION)
    dialog = ExportDialog({"chart": chart, "grid": grid}, CAPTION, step=13, settings=app_settings())
    qtbot.addWidget(dialog)
    dialog.path_edit.setText(str(tmp_path / "grid.pdf"))
    dialog.save_button.click()
    assert dialog.written == tmp_path / "grid.pdf"
    assert calls == []


def test_bad_places_and_sizes_raise_one_line(chart, tmp_path, qtbot):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    (tmp_path / "folder.png").mkdir()
    empty = QWidget()
    qtbot.addWidget(empty)
    empty.resize(0, 0)
    cases = [
        (chart, not_a_folder / "chart.png", None, "is not a folder"),
        (chart, tmp_path / "missing" / "chart.png", None, "does not exist"),
        (chart, tmp_path / "folder.png", None, "is a folder"),
        (chart, tmp_path / "wide.png", 100_000, "PNG width"),
        (empty, tmp_path / "empty.pdf", None, "zero size"),
    ]
    for widget, path, width, reason in cases:
        with pytest.raises(ExportError, match=reason) as info:
            export_widget(widget, path, width)
        assert "\n" not in str(info.value)
    assert leftovers(tmp_path) == ["file", "folder.png"]


def test_written_files_get_normal_permissions(chart, tmp_path):
    old = os.umask(0o027)
    try:
        path = export_widget(chart, tmp_path / "chart.pdf")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o640


# ----- the dialog -----
@pytest.fixture
def dialog_for(qtbot, chart, grid, tmp_path):
    app_settings().setValue("export/folder", str(tmp_path))

    def make(caption: str = CAPTION, **kwargs) -> ExportDialog:
        kwargs.setdefault("step", 13)
        dialog = ExportDialog({"chart": chart, "grid": grid, "view": chart}, caption, **kwargs)
        qtbot.addWidget(dialog)
        dialog.show()
        qtbot.waitExposed(dialog)
        return dialog

    return make


@pytest.fixture
def no_message_boxes(monkeypatch):
    shown: list[tuple[str, str]] = []

    def warning(_parent, title, text, *args, **kwargs):
        shown.append((title, text))
        return QMessageBox.StandardButton.Ok

    monkeypatch.setattr(QMessageBox, "warning", warning)
    return shown


def test_dialog_exports_with_keyboard_and_remembers(dialog_for, tmp_path, qtbot, no_message_boxes):
    dialog = dialog_for()
    assert dialog.path() == tmp_path / "kvviz-chart-step13.png"
    qtbot.keyClick(dialog.format_box, Qt.Key.Key_Down)  # PNG -> SVG
    assert dialog.image_format() == "svg" and not dialog.width_box.isEnabled()
    assert dialog.path().name == "kvviz-chart-step13.svg"
    qtbot.keyClick(dialog.target_box, Qt.Key.Key_Down)  # chart -> grid
    assert dialog.path().name == "kvviz-grid-step13.svg"
    qtbot.keyClick(dialog.target_box, Qt.Key.Key_Return)  # Enter: the default button, Export
    assert dialog.result() == QDialog.DialogCode.Accepted and no_message_boxes == []
    assert dialog.written == tmp_path / "kvviz-grid-step13.svg"
    ET.parse(dialog.written)
    again = dialog_for()
    assert again.image_format() == "svg" and again.target() == "grid"
    assert again.path() == tmp_path / "kvviz-grid-step13.svg"


def test_dialog_png_width_and_caption_choice(dialog_for, tmp_path, qtbot, chart):
    dialog = dialog_for(initial="chart")
    dialog.format_box.setCurrentIndex(dialog.format_box.findData("png"))
    dialog.width_box.setValue(1000)
    assert "1000 \u00d7" in dialog.size_label.text()
    dialog.caption_box.setChecked(False)
    dialog.save_button.click()
    image = QImage(str(dialog.written))
    assert (image.width(), image.height()) == (1000, png_size(chart, 1000, None).height())


def test_dialog_typed_suffix_wins(dialog_for, tmp_path):
    dialog = dialog_for()
    assert dialog.image_format() == "png"
    dialog.path_edit.setText(str(tmp_path / "figure.pdf"))
    dialog.path_edit.textEdited.emit(dialog.path_edit.text())
    dialog.save_button.click()
    assert dialog.written == tmp_path / "figure.pdf" and dialog.written.read_bytes().startswith(b"%PDF")
    assert app_settings().value("export/format") == "pdf"


def test_dialog_browse_picks_file_and_format(dialog_for, tmp_path, monkeypatch):
    chosen = tmp_path / "slides" / "figure"
    chosen.parent.mkdir()
    asked = []

    def get_save_file_name(parent, caption, directory, filters, selected):
        asked.append((directory, filters))
        return str(chosen) + ".pdf", selected

    monkeypatch.setattr(QFileDialog, "getSaveFileName", get_save_file_name)
    dialog = dialog_for()
    dialog.browse_button.click()
    assert asked and asked[0][0].endswith("kvviz-chart-step13.png")
    assert dialog.image_format() == "pdf" and dialog.path() == chosen.with_suffix(".pdf")
    dialog.save_button.click()
    assert dialog.written.read_bytes().startswith(b"%PDF")
    assert app_settings().value("export/folder") == str(chosen.parent)


def test_dialog_error_is_one_sentence_and_stays_open(dialog_for, tmp_path, no_message_boxes):
    dialog = dialog_for()
    dialog.path_edit.setText(str(tmp_path / "nowhere" / "chart.png"))
    dialog.path_edit.textEdited.emit(dialog.path_edit.text())
    dialog.save_button.click()
    assert len(no_message_boxes) == 1
    title, text = no_message_boxes[0]
    assert "nowhere" in text and "does not exist" in text and "\n" not in text and text.endswith(".")
    assert dialog.isVisible() and dialog.written is None


def test_dialog_an_unknown_user_in_the_path_is_a_dialog(dialog_for, no_message_boxes):
    dialog = dialog_for()
    dialog.path_edit.setText("~nosuchuser-kvviz/chart.png")
    dialog.path_edit.textEdited.emit(dialog.path_edit.text())
    dialog.format_box.setCurrentIndex(dialog.format_box.findData("svg"))  # the name follows the format
    dialog.save_button.click()
    assert no_message_boxes == [("Export failed", "Could not export: ~nosuchuser-kvviz/chart.svg: there is no user "
                                                  "named 'nosuchuser-kvviz' here.")]
    assert dialog.isVisible() and dialog.written is None


def test_dialog_asks_before_replacing(dialog_for, tmp_path, monkeypatch):
    target = tmp_path / "kvviz-chart-step13.png"
    target.write_bytes(b"keep")
    answers = [QMessageBox.StandardButton.No, QMessageBox.StandardButton.Yes]
    monkeypatch.setattr(QMessageBox, "question", lambda *args, **kwargs: answers.pop(0))
    dialog = dialog_for(initial="chart")
    dialog.format_box.setCurrentIndex(dialog.format_box.findData("png"))
    dialog.save_button.click()
    assert target.read_bytes() == b"keep" and dialog.isVisible()
    dialog.save_button.click()
    assert QImage(str(target)).width() == dialog.width_box.value()


def test_dialog_names_the_file_by_its_step_argument_only(dialog_for):
    """A prompt that mentions a step must not name the file: only `step` does."""
    caption = make_caption("Read step 5 of the manual", "tiny", 3, 3, True)
    assert "step 5" in caption and "step 3" in caption
    at_step_3 = dialog_for(caption=caption, step=3)
    assert at_step_3.path().name == "kvviz-chart-step3.png"
    no_step = dialog_for(caption=caption, step=None)
    assert no_step.path().name == "kvviz-chart.png"


def test_dialog_settings_are_typed_and_go_to_the_given_store(qtbot, chart, tmp_path):
    store = SettingsFile(tmp_path / "export.json")
    for key, value in (("export/folder", str(tmp_path)), ("export/target", "nonsense"), ("export/format", "gif"),
                       ("export/width", 99999), ("export/caption", "maybe")):
        store.setValue(key, value)
    dialog = ExportDialog({"chart": chart}, CAPTION, step=2, settings=store)
    qtbot.addWidget(dialog)
    assert (dialog.target(), dialog.image_format(), dialog.width_box.value()) == ("chart", "png", 8192)
    assert dialog.caption_box.isChecked() and dialog.path() == tmp_path / "kvviz-chart-step2.png"
    dialog.width_box.setValue(640)
    dialog.caption_box.setChecked(False)
    dialog.save_button.click()
    assert QImage(str(tmp_path / "kvviz-chart-step2.png")).width() == 640
    saved = json.loads((tmp_path / "export.json").read_text(encoding="utf-8"))
    assert saved["export/width"] == 640 and saved["export/caption"] is False
    assert app_settings().value("export/width") is None  # the app's own settings untouched


def test_whole_run_view_exports_each_format_at_its_step(qtbot, app_model, tmp_path):
    """What File > Export does after four steps of the embedded model, without the main window."""
    from kvviz.engine.engine import Engine
    from kvviz.sources.weights import load_model

    loaded = load_model(app_model)
    engine = Engine(loaded.model)
    plan = plan_ids(engine, engine.encode_prompt(PROMPT), N, True, prompt=PROMPT, model_name=loaded.name)
    area = shown(qtbot, fed(RunView(), (plan, list(engine.run(plan))), 4), *VIEW_SIZE)
    caption = make_caption(PROMPT, loaded.name, 4, 4, True)
    targets = {"chart": area.chart, "grid": area.grid, "view": area}
    written = []
    for target, fmt in [("view", "png"), ("chart", "svg"), ("grid", "pdf")]:
        dialog = ExportDialog(targets, caption, step=4, settings=app_settings())
        qtbot.addWidget(dialog)
        dialog.target_box.setCurrentIndex(dialog.target_box.findData(target))
        dialog.format_box.setCurrentIndex(dialog.format_box.findData(fmt))
        dialog.path_edit.setText(str(tmp_path / dialog.path().name))
        dialog.save_button.click()
        written.append(dialog.written)
    assert [p.name for p in written] == ["kvviz-view-step4.png", "kvviz-chart-step4.svg", "kvviz-grid-step4.pdf"]
    view_png = QImage(str(written[0]))
    assert view_png.width() == 1920 and count_near(pixels(view_png), theme.DARK.teal) > 1000
    assert "\u201cTime flies fast\u201d" in written[1].read_text(encoding="utf-8").replace("\u00a0", " ")
    assert svg_stroke_shapes(ET.parse(written[1]).getroot())
    assert written[2].read_bytes().startswith(b"%PDF")


# ----- captions, names, formats -----
def test_captions_and_file_names():
    head = "\u201cHi\u201d \u2014 gpt2, "
    assert make_caption("Hi", "gpt2", 13, 12, True) == head + "step 13, 12 new tokens, with KV cache"
    assert make_caption("Hi", "gpt2", 1, 1, False) == head + "step 1, 1 new token, without KV cache"
    assert make_caption("Hi", "gpt2", None) == "\u201cHi\u201d \u2014 gpt2, before the first step"
    assert make_caption("Hi", "gpt2", None, use_cache=True) == \
        "\u201cHi\u201d \u2014 gpt2, before the first step, with KV cache"
    assert make_caption("Hi", "gpt2", 2, 1, True, dtype="bfloat16") == \
        "\u201cHi\u201d \u2014 gpt2 (bfloat16), step 2, 1 new token, with KV cache"
    assert default_file_name("grid", "svg", 7) == "kvviz-grid-step7.svg"
    assert default_file_name("view", "png", None) == "kvviz-view.png"


def test_headless_captions_name_the_precision(qtbot, tmp_path):
    """The numbers depend on the number type: `kvviz export --dtype` says it in every caption."""
    model = save_kvviz_folder(tmp_path / "tiny", n_layer=2, n_head=2, n_embd=32, n_ctx=64)
    for dtype in ("float32", "float16"):
        written = run_export(str(model), PROMPT, 2, tmp_path / dtype, ["svg"], dtype=dtype)
        for path in written:
            assert f"tiny ({dtype}), step 3, 2 new tokens" in path.read_text(encoding="utf-8").replace("\u00a0", " ")
    compare = run_export(str(model), PROMPT, 2, tmp_path / "compare", ["svg"], compare=True, dtype="bfloat16")
    assert "tiny (bfloat16), step 3" in compare[0].read_text(encoding="utf-8").replace("\u00a0", " ")


def test_parse_formats_one_parser_for_text_and_lists():
    assert parse_formats(" PNG, .svg,,png ") == ["png", "svg"]
    assert parse_formats(["pdf", "PNG"]) == ["pdf", "png"]
    with pytest.raises(ExportError, match="unknown format 'gif'") as info:
        parse_formats("png,gif")
    assert isinstance(info.value, KvvizError)
    with pytest.raises(ExportError, match="no image format"):
        parse_formats(" , ")


# ----- headless -----
def test_run_export_writes_every_file(qtbot, tmp_path):
    model = save_kvviz_folder(tmp_path / "tiny", n_layer=2, n_head=2, n_embd=32, n_ctx=64)
    out = tmp_path / "out" / "slides"
    paths = run_export(str(model), PROMPT, 5, out, ["png", "svg", "pdf"], width=800)
    expected = [out / f"kvviz-{t}-step6.{f}" for t in ("chart", "grid", "view") for f in ("png", "svg", "pdf")]
    assert paths == expected
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in expected)
    for path in paths:
        if path.suffix == ".png":
            image = QImage(str(path))
            assert image.width() == 800 and count_near(pixels(image), theme.DARK.teal) > 50
        elif path.suffix == ".svg":
            text = path.read_text(encoding="utf-8")
            assert "\u201cTime flies fast\u201d" in text.replace("\u00a0", " ") and "step 6" in text
            ET.fromstring(text.encode())
        else:
            assert path.read_bytes().startswith(b"%PDF")
    uncached = run_export(str(model), PROMPT, 5, out, ["svg"], use_cache=False)
    assert [p.name for p in uncached] == [f"kvviz-{t}-step5.svg" for t in ("chart", "grid", "view")]
    assert "without KV cache" in uncached[0].read_text(encoding="utf-8")


def test_run_export_of_compare_mode_writes_the_compare_view(qtbot, tmp_path):
    model = save_kvviz_folder(tmp_path / "tiny", n_layer=2, n_head=2, n_embd=32, n_ctx=64)
    out = tmp_path / "compare"
    paths = run_export(str(model), PROMPT, 5, out, ["png", "svg", "pdf"], width=900, compare=True)
    assert [p.name for p in paths] == [f"kvviz-compare-step6.{f}" for f in ("png", "svg", "pdf")]
    image = QImage(str(paths[0]))
    assert image.width() == 900
    px = pixels(image)
    assert count_near(px, theme.DARK.teal) > 50 and count_near(px, theme.DARK.amber) > 50  # both grids
    text = paths[1].read_text(encoding="utf-8").replace("\u00a0", " ")
    assert "with and without KV cache in lockstep" in text and "broken" not in text.lower()
    ET.fromstring(text.encode())
    assert paths[2].read_bytes().startswith(b"%PDF")
    broken = run_export(str(model), PROMPT, 5, out, ["svg"], compare=True, break_cache=True)
    assert "KV cache broken on purpose" in broken[0].read_text(encoding="utf-8").replace("\u00a0", " ")


def test_run_export_rejects_bad_input_in_one_line(qtbot, tmp_path):
    from kvviz.sources.weights import ModelLoadError

    file = tmp_path / "file"
    file.write_text("x")
    cases = [
        (dict(formats=["gif"]), ExportError, "unknown format 'gif'"),
        (dict(formats=[]), ExportError, "no image format"),
        (dict(new_tokens=0), ExportError, "new-tokens"),
        (dict(width=10), ExportError, "width"),
        (dict(out_dir=file), ExportError, "not a folder"),
        (dict(model=str(tmp_path / "no-such-model")), ModelLoadError, "no-such-model"),
    ]
    for changes, error, text in cases:
        kwargs = dict(model="random:nope", prompt=PROMPT, new_tokens=3, out_dir=tmp_path / "o", formats=["png"])
        if "model" not in changes:
            kwargs["model"] = str(tmp_path / "unused")  # never loaded: input is checked first
        kwargs.update(changes)
        with pytest.raises(error, match=re.escape(text)) as info:
            run_export(**kwargs)
        assert "\n" not in str(info.value)
    assert not (tmp_path / "o").exists()  # nothing made for a run that could not start


def test_an_export_before_the_first_step_shows_no_key_to_press(qtbot, run):
    """The grid's caption before the first pass said "press Space to compute step 1", and File > Export put it
    on the slide: the caption now says what is ready, and no exported text names a key."""
    from helpers_text import TextRecorder

    from kvviz.app.export.render import Page, paint_scaled

    plan, _ = run
    area = RunView()
    area.reset(plan)
    shown(qtbot, area, *VIEW_SIZE)
    area.refresh()
    page = Page(area, make_caption(PROMPT, "tiny", None, use_cache=True, dtype="float32"))
    recorder = TextRecorder(1920, 1200)
    paint_scaled(recorder, page, 1920 / page.width)
    said = " | ".join(t.text for t in recorder.texts)
    assert "prompt of 3 tokens ready" in said and "before the first step" in said
    assert not re.search(r"\bpress|\bSpace\b|Page ?Down|\bclick", said, re.IGNORECASE), said


# ----- the window says where an export went -----
@pytest.mark.parametrize(("target", "fmt", "said"), [
    ("grid", "png", "the K/V grid (PNG image)"),
    ("chart", "svg", "the chart (SVG drawing)"),
    ("view", "gif", "the whole view (GIF animation)"),
])
def test_the_window_says_where_an_export_went(target, fmt, said, window, qtbot, tmp_path, monkeypatch):
    """File > Export...: once the file is written, the status line names it, and the caption the precision."""
    import kvviz.app.export.window_export as export

    seen = []

    def export_at_once(dialog):  # the user picks the view, the format and a file, and presses Export
        seen.append(dialog._caption)
        dialog.target_box.setCurrentIndex(dialog.target_box.findData(target))
        dialog.format_box.setCurrentIndex(dialog.format_box.findData(fmt))
        dialog.width_box.setValue(320)
        dialog.path_edit.setText(str(tmp_path / f"lecture.{fmt}"))
        dialog.save_button.click()
        return dialog.result()

    monkeypatch.setattr(export.ExportDialog, "exec", export_at_once)
    qtbot.keyClick(window, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: len(window.session.records) == 1, timeout=30_000)
    qtbot.keyClick(window, Qt.Key.Key_E, Qt.KeyboardModifier.ControlModifier)
    path = tmp_path / f"lecture.{fmt}"
    assert path.is_file()
    assert window.status.text() == f"Exported {said} to {path}"
    assert f"({window.session.model_info.dtype}), step 1" in seen[0]
    assert not window.banner.isVisible() and getattr(window, "export_note", None) is None  # the status bar says it


def test_in_presenter_mode_a_note_says_where_an_export_went(window, qtbot, tmp_path, monkeypatch):
    """Presenter mode hides the status bar: a note over the bottom of the window, in no layout, says it for a
    few seconds."""
    import kvviz.app.export.window_export as export

    def export_at_once(dialog):
        dialog.path_edit.setText(str(tmp_path / "shown.png"))
        dialog.save_button.click()
        return dialog.result()

    monkeypatch.setattr(export.ExportDialog, "exec", export_at_once)
    monkeypatch.setattr(export, "NOTE_SECONDS", 0.3)
    window.presentation.set_presenter(True)
    qtbot.waitUntil(lambda: not window.statusBar().isVisible(), timeout=5000)
    window.export()
    note = window.export_note
    assert note.isVisible() and note.text() == f"Exported the chart (PNG image) to {tmp_path / 'shown.png'}"
    assert window.rect().contains(note.geometry()) and note.geometry().bottom() > window.height() * 0.8
    assert not window.banner.isVisible()  # the banner sits among the views: it would push them down
    assert all(window.layout().itemAt(i).widget() is not note for i in range(window.layout().count()))
    qtbot.waitUntil(lambda: not shiboken_valid(note), timeout=5000)
    window.presentation.set_presenter(False)


def shiboken_valid(widget) -> bool:
    import shiboken6

    return shiboken6.isValid(widget)
