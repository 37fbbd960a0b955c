"""Themes: the light palette's contrast (WCAG, computed here from the formula), the style sheet made from the
theme, exports in either theme (`run_export(theme=...)`, `kvviz export --theme`, `kvviz lesson --export
--theme`), and View > Theme in the window: every view restyled at once, remembered, `--theme` at launch."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from helpers_checkpoints import save_kvviz_folder
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QMenu

from kvviz.app import theme
from kvviz.app.settings import AppSettings, app_settings
from kvviz.app.theme import DARK, LIGHT, Theme
from kvviz.cli.commands import main

PROMPT = "Time flies fast"  # 3 GPT-2 tokens
N = 12
HEX = re.compile(r"#[0-9A-Fa-f]{6}\b")
APP = Path(__file__).resolve().parents[1] / "kvviz" / "app"
QSS = Path(__file__).resolve().parents[1] / "resources" / "styles" / "kvviz.qss"


@pytest.fixture(autouse=True)
def _dark_again():
    """Each test leaves the dark theme current, as every other test expects."""
    yield
    theme.set_current("dark")


# ----- WCAG 2.x contrast, written out from the definition (not taken from kvviz) -----


def relative_luminance(hex_colour: str) -> float:
    """WCAG 2.x relative luminance of an sRGB colour "#RRGGBB"."""
    channels = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    """(L1 + 0.05) / (L2 + 0.05), L1 the lighter colour's relative luminance."""
    high, low = sorted((relative_luminance(a), relative_luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_the_contrast_formula_gives_the_known_values():
    assert contrast("#FFFFFF", "#000000") == pytest.approx(21.0)
    assert contrast("#777777", "#777777") == pytest.approx(1.0)
    assert contrast("#767676", "#FFFFFF") == pytest.approx(4.54, abs=0.01)  # the classic "just AA" grey


@pytest.mark.parametrize("palette", [LIGHT, DARK], ids=["light", "dark"])
def test_meaningful_colours_keep_3_to_1_against_the_background(palette: Theme):
    for role in ("amber", "teal", "pending", "alert", "evicted"):  # computed, reused, no K/V yet, errors, evicted
        ratio = contrast(getattr(palette, role), palette.background)
        assert ratio >= 3.0, f"{palette.name} {role}: {ratio:.2f}:1"
    for role in ("foreground", "muted"):  # text
        ratio = contrast(getattr(palette, role), palette.background)
        assert ratio >= 4.5, f"{palette.name} {role}: {ratio:.2f}:1"
    assert contrast(palette.on_amber, palette.amber) >= 4.5  # the newest token's chip
    assert contrast(palette.banner_text, palette.amber_tint) >= 4.5


def test_the_light_theme_is_light_and_the_dark_theme_dark():
    assert relative_luminance(LIGHT.background) > 0.9 and relative_luminance(DARK.background) < 0.05
    assert theme.THEMES == {"dark": DARK, "light": LIGHT} and theme.DEFAULT == "dark"
    from kvviz.cli.parser import THEMES

    assert THEMES == tuple(theme.THEMES)  # the command line's choices, kept apart from the app


def test_colour_blind_patterns_show_in_both_themes(qtbot):
    from kvviz.app.views.grid.cell_states import COMPUTED, PENDING, REUSED
    from kvviz.app.views.grid.grid_cells import state_swatch

    for palette in (DARK, LIGHT):
        line = np.array(theme.rgba(palette.grid_line)[:3])
        for state in (COMPUTED, REUSED, PENDING):
            image = state_swatch(state, True, palette, size=16).toImage().convertToFormat(QImage.Format.Format_RGB888)
            body = np.array([[image.pixelColor(x, y).getRgb()[:3] for x in range(1, 14)] for y in range(1, 14)])
            patterned = int((np.abs(body - line).max(axis=2) <= 2).sum())
            plain = state_swatch(state, False, palette, size=16).toImage()
            assert patterned >= 5, (palette.name, state)  # stripes, a dot, a bar inside the cell
            assert image != plain.convertToFormat(QImage.Format.Format_RGB888)


# ----- one place for the colours -----


def test_the_style_sheet_is_made_from_the_theme():
    template = QSS.read_text(encoding="utf-8")
    assert not HEX.search(template), "colours belong to kvviz.app.theme, not to the style sheet"
    fields = set(re.findall(r"\{([a-z_]+)\}", template))
    assert fields and fields <= {*theme.COLOUR_FIELDS, "name", "icons"}  # name and icons: the arrows' files
    dark, light = theme.stylesheet(DARK), theme.stylesheet(LIGHT)
    assert dark != light and not re.search(r"\{[a-z_]+\}", dark + light)
    assert f"background: {LIGHT.background}" in light and f"background: {DARK.background}" in dark
    theme.set_current("light")
    assert theme.stylesheet() == light and theme.current() is LIGHT


def test_the_spin_boxes_arrows_are_files_in_the_themes_colours(qtbot):
    """A style sheet that styles a spin box hides its native arrows: the sheet draws them from resources/icons,
    in each theme's text colour (and a grey when the box is disabled or at its limit)."""
    from PySide6.QtWidgets import QSpinBox

    for chosen in (DARK, LIGHT):
        sheet = theme.stylesheet(chosen)
        urls = re.findall(r'url\("([^"]+)"\)', sheet)
        assert {Path(u).name for u in urls} == {f"spin-{d}-{k}.svg" for d in ("up", "down")
                                                for k in (chosen.name, "disabled")}
        for url in urls:
            assert Path(url).is_file(), url
            if chosen.name in Path(url).name:
                assert f'fill="{chosen.foreground}"' in Path(url).read_text(encoding="utf-8")
        box = QSpinBox()
        qtbot.addWidget(box)
        box.setStyleSheet(sheet)
        box.setRange(0, 10)
        box.setValue(5)
        box.resize(120, 32)
        image = box.grab().toImage().convertToFormat(QImage.Format.Format_RGB888)
        rgb = np.frombuffer(image.constBits(), np.uint8, image.sizeInBytes()).reshape(
            image.height(), image.bytesPerLine())[:, : image.width() * 3].reshape(image.height(), image.width(), 3)
        buttons = rgb[:, image.width() - 16:].astype(int)  # the up and down buttons' column
        text = np.array(theme.rgba(chosen.foreground)[:3])
        arrow = np.abs(buttons - text).max(axis=2) < 40
        upper, lower = arrow[: image.height() // 2].sum(), arrow[image.height() // 2:].sum()
        assert upper >= 8 and lower >= 8, (chosen.name, upper, lower)  # a glyph in each button, in the text colour


def test_no_colour_is_written_outside_the_theme():
    for path in APP.rglob("*.py"):
        if path.name != "theme.py":
            found = HEX.findall(path.read_text(encoding="utf-8"))
            assert not found, f"{path.relative_to(APP)}: {found}"


def test_an_unknown_theme_is_refused_and_a_remembered_one_falls_back_to_dark(tmp_path):
    with pytest.raises(ValueError, match="unknown theme 'purple'"):
        theme.set_current("purple")
    assert theme.current() is DARK
    with theme.using("light") as chosen:
        assert chosen is LIGHT and theme.current() is LIGHT
    assert theme.current() is DARK
    from kvviz.app.settings import SettingsFile

    store = SettingsFile(tmp_path / "kvviz.json")
    store.setValue("view/theme", "purple")
    store.sync()
    assert AppSettings.load(store).theme == "dark"
    store.setValue("view/theme", "light")
    store.sync()
    assert AppSettings.load(store).theme == "light"


# ----- exports -----


def pixels(path: Path) -> np.ndarray:
    """(H, W, 3) RGB of an image file."""
    image = QImage(str(path)).convertToFormat(QImage.Format.Format_RGB888)
    data = np.frombuffer(image.constBits(), dtype=np.uint8, count=image.sizeInBytes())
    return data.reshape(image.height(), image.bytesPerLine())[:, : image.width() * 3].reshape(
        image.height(), image.width(), 3).astype(np.int16)


def luminance(rgb: np.ndarray) -> np.ndarray:
    """Luma, 0 to 255 (ITU-R BT.601 weights on the encoded values)."""
    return 0.299 * rgb[..., 0] + 0.587 * rgb[..., 1] + 0.114 * rgb[..., 2]


def near(rgb: np.ndarray, hex_colour: str, tolerance: int = 12) -> np.ndarray:
    return np.abs(rgb - np.array(theme.rgba(hex_colour)[:3])).max(axis=2) <= tolerance


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return save_kvviz_folder(tmp_path_factory.mktemp("theme-model") / "tiny", n_layer=3, n_head=2, n_embd=32,
                             n_ctx=64)


@pytest.fixture(scope="module")
def exports(tiny, tmp_path_factory) -> dict[str, dict[str, np.ndarray]]:
    """Chart, grid and view PNGs of one cached run, in each theme: {theme: {target: pixels}}."""
    from kvviz.app.export import run_export

    shots = {}
    for name in ("light", "dark"):
        out = tmp_path_factory.mktemp(f"export-{name}")
        paths = run_export(str(tiny), PROMPT, N, out, ["png"], width=1200, theme=name)
        shots[name] = {path.name.split("-")[1]: pixels(path) for path in paths}
    assert theme.current() is DARK  # the export's theme was for the export only
    return shots


@pytest.mark.parametrize("target", ["chart", "grid", "view"])
def test_light_exports_are_light_with_the_light_amber_and_teal(exports, target):
    rgb = exports["light"][target]
    cells = near(rgb, LIGHT.amber) | near(rgb, LIGHT.teal) | near(rgb, LIGHT.pending) | near(rgb, LIGHT.empty)
    assert luminance(rgb).mean() > 180, target
    assert luminance(rgb[~cells]).mean() > 230, target  # around the cells: white
    assert near(rgb, LIGHT.amber).sum() > 100 and near(rgb, LIGHT.teal).sum() > 100
    assert near(rgb, DARK.amber, 4).sum() == 0 and near(rgb, DARK.teal, 4).sum() == 0  # not the dark theme's


@pytest.mark.parametrize("target", ["chart", "grid", "view"])
def test_dark_exports_stay_dark(exports, target):
    rgb = exports["dark"][target]
    cells = near(rgb, DARK.amber) | near(rgb, DARK.teal) | near(rgb, DARK.pending) | near(rgb, DARK.empty)
    if target == "grid":  # the bright cells fill most of it, as in the light one
        assert luminance(rgb[~cells]).mean() < 80
        assert luminance(rgb).mean() < luminance(exports["light"]["grid"]).mean() - 50
    else:
        assert luminance(rgb).mean() < 80, target
    assert near(rgb, DARK.amber).sum() > 100 and near(rgb, DARK.teal).sum() > 100


def one_line_error(capsys, args: list[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(args)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1, err
    return err


def test_kvviz_export_takes_a_theme_and_refuses_others(tiny, tmp_path, capsys, qtbot):
    out = tmp_path / "light"
    assert main(["export", "--model", str(tiny), "--prompt", PROMPT, "--new-tokens", "3", "--out", str(out),
                 "--format", "png", "--width", "600", "--theme", "light"]) == 0
    chart = pixels(out / "kvviz-chart-step4.png")
    assert luminance(chart).mean() > 180 and near(chart, LIGHT.teal).sum() > 50
    assert theme.current() is DARK
    capsys.readouterr()
    for args in (["export", "--prompt", PROMPT, "--out", str(tmp_path / "x"), "--theme", "purple"],
                 ["--theme", "purple"], ["lesson", "--export", str(tmp_path / "y"), "--theme", "purple"]):
        assert "invalid choice: 'purple' (choose from 'dark', 'light')" in one_line_error(capsys, args), args
    assert main(["lesson", "--list", "--theme", "light"]) == 2
    assert "kvviz: --theme goes with --export, not with --list" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_kvviz_lesson_export_takes_a_theme(tiny, tmp_path, qtbot):
    from kvviz.app.export import ExportError, export_lesson
    from kvviz.lessons.lesson import parse_lesson

    lesson = parse_lesson('title = "T"\n[[step]]\ntitle = "S"\ntext = "x"\nprompt = "Time flies"\ncache = true\n'
                          "advance_to = 2\nmax_new_tokens = 4\n", "one.toml")
    light = export_lesson(lesson, tmp_path / "light", "png", width=800, model=str(tiny), theme="light")
    dark = export_lesson(lesson, tmp_path / "dark", "png", width=800, model=str(tiny), theme="dark")
    assert luminance(pixels(light[0])).mean() > 180 and luminance(pixels(dark[0])).mean() < 80
    assert near(pixels(light[0]), LIGHT.amber).sum() > 100
    with pytest.raises(ExportError, match="theme must be dark or light, got 'sepia'"):
        export_lesson(lesson, tmp_path / "sepia", "png", model=str(tiny), theme="sepia")
    assert not (tmp_path / "sepia").exists()


def test_the_app_gets_the_theme_to_start_with(monkeypatch):
    import kvviz.app

    calls = []
    monkeypatch.setattr(kvviz.app, "launch", lambda model, prompt, lesson=None, theme=None: calls.append(theme) or 0)
    assert main(["--theme", "light"]) == 0 and main([]) == 0
    assert calls == ["light", None]


# ----- the window -----


def background(widget) -> str:
    """A pyqtgraph view's background colour."""
    return widget.backgroundBrush().color().name().upper()


def test_view_theme_restyles_every_view_at_once_and_is_remembered(qtbot, app_model, tmp_path):
    from kvviz.app.assembly import open_window
    from kvviz.app.export import export_widget

    win = open_window(app_model, PROMPT, settings=app_settings())
    qtbot.addWidget(win)
    win.show()
    qtbot.waitUntil(lambda: win.session.plan is not None, timeout=60_000)
    view_menu = next(a.menu() for a in win.menuBar().actions() if a.text() == "&View")
    theme_menu = next(a.menu() for a in view_menu.actions() if isinstance(a.menu(), QMenu) and a.text() == "&Theme")
    assert [a.text() for a in theme_menu.actions()] == ["&Dark", "&Light"]
    assert win.actions["theme_dark"].isChecked() and not win.actions["theme_light"].isChecked()
    compare = win.workspace.compare_view
    pyqtgraph_views = (win.grid.plot_widget, win.chart.layout_widget, compare.cached_grid.plot_widget,
                       compare.uncached_grid.plot_widget, compare.time_plot.layout_widget)
    assert {background(v) for v in pyqtgraph_views} == {DARK.background}
    sheets = {w: w.styleSheet() for w in (win, win.counter, win.lesson.panel, compare.counts, win.grid)}
    dark_grid = luminance(qimage_pixels(win.grid.grab().toImage())).mean()

    win.actions["theme_light"].trigger()  # View > Theme > Light
    assert theme.current() is LIGHT and not win.actions["theme_dark"].isChecked()
    assert {background(v) for v in pyqtgraph_views} == {LIGHT.background}  # the compare view's too, hidden
    assert all(w.styleSheet() != sheet for w, sheet in sheets.items())
    assert win.styleSheet().startswith(theme.stylesheet(LIGHT))
    assert win.chart.legend.opts["labelTextColor"].name().upper() == LIGHT.foreground
    assert win.chart.with_curve.opts["pen"].color().name().upper() == LIGHT.teal
    axis = win.chart.work_plot.getAxis("left")
    assert axis.pen().color().name().upper() == LIGHT.muted == axis.textPen().color().name().upper()
    win.redraw()
    light_grid = qimage_pixels(win.grid.grab().toImage())
    assert luminance(light_grid).mean() > dark_grid + 60
    assert near(light_grid, LIGHT.pending, 2).sum() > 100  # the prompt's cells, in the light pending grey
    token_strip = qimage_pixels(win.token_strip.grab().toImage())
    assert near(token_strip, LIGHT.background, 0).mean() > 0.5
    chart = pixels(export_widget(win.chart, tmp_path / "chart.png", 800, "caption"))  # as File > Export does
    assert luminance(chart).mean() > 180 and near(chart, LIGHT.amber).sum() > 20
    win.close()

    again = open_window(app_model, None, settings=app_settings())
    qtbot.addWidget(again)
    assert again.settings.theme == "light" and again.actions["theme_light"].isChecked()
    assert background(again.grid.plot_widget) == LIGHT.background
    again.close()
    chosen = open_window(app_model, None, settings=app_settings(), theme_name="dark")  # kvviz --theme dark
    qtbot.addWidget(chosen)
    assert theme.current() is DARK and background(chosen.chart.layout_widget) == DARK.background
    chosen.close()


def qimage_pixels(image: QImage) -> np.ndarray:
    image = image.convertToFormat(QImage.Format.Format_RGB888)
    data = np.frombuffer(image.constBits(), dtype=np.uint8, count=image.sizeInBytes())
    return data.reshape(image.height(), image.bytesPerLine())[:, : image.width() * 3].reshape(
        image.height(), image.width(), 3).astype(np.int16)
