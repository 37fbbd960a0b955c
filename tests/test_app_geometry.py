"""Projector screens, every panel: at 1024x768 and 1280x720, windowed and in presenter mode, every combination of
View > Attention (A), View > Memory (M), compare mode (T) and the lesson (L), at the zoom steps a lecturer uses,
keeps the grid's rows readable (or scrolls), lays no text or panel over another, and closing a panel gives the
grid its room back. The checks read the widgets' geometry, never the layout code's own numbers."""

from __future__ import annotations

import pyqtgraph as pg
import pytest
from helpers_checkpoints import plan_ids
from helpers_qt import settle_layouts
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractScrollArea,
    QAbstractSpinBox,
    QComboBox,
    QGraphicsTextItem,
    QLabel,
    QLineEdit,
    QScrollArea,
    QSplitterHandle,
    QWidget,
)

from kvviz.app.assembly import open_window
from kvviz.app.settings import app_settings
from kvviz.app.views.attention_view import AttentionView
from kvviz.app.views.grid.kv_grid import KVGridView
from kvviz.app.window import main_window, presentation
from kvviz.app.window.main_window import MainWindow

TITLE_BAR = 30  # what a window manager's frame takes of the screen's height, about
MIN_ROW = 14  # pixels: the least height of a row of cells, from the issue
PANELS = {"A": "attention", "M": "memory", "T": "compare", "L": "lesson"}
# every combination of the four panels, one key press from each to the next (a Gray code); the lesson, whose
# start and end take longest, changes least often, the memory view (no replay) most often
GRAY = [dict(zip("LTAM", format(i ^ (i >> 1), "04b"), strict=True)) for i in range(16)]
COMBINATIONS = ["".join(key for key in PANELS if code[key] == "1") for code in GRAY]


# ----- what is checked -----
def _shown_children(widget: QWidget) -> list[QWidget]:
    return [child for child in widget.findChildren(QWidget, options=Qt.FindChildOption.FindDirectChildrenOnly)
            if child.isVisible() and not child.isWindow() and child.width() > 0 and child.height() > 0
            and not isinstance(child, QSplitterHandle) and type(child).__name__ != "FocusFrame"]  # a lesson's outline


def _name(widget: QWidget) -> str:
    text = f" {widget.text()[:30]!r}" if isinstance(widget, QLabel) else ""
    return f"{type(widget).__name__}{'#' + widget.objectName() if widget.objectName() else ''}{text}"


def layout_faults(root: QWidget) -> list[str]:
    """Siblings that overlap, children that stick out of their parent, and labels whose text does not fit them,
    under `root` (the insides of Qt's own compound widgets left out; a scroll area's contents may be larger)."""
    faults: list[str] = []

    def walk(widget: QWidget) -> None:
        if isinstance(widget, QScrollArea):
            if widget.widget() is not None and widget.widget().isVisible():
                walk(widget.widget())
            return
        if isinstance(widget, (QAbstractScrollArea, QAbstractSpinBox, QComboBox, QLineEdit, QAbstractButton)):
            return
        children = _shown_children(widget)
        for i, child in enumerate(children):
            rect, name = child.geometry(), _name(child)
            if not widget.rect().contains(rect):
                faults.append(f"{name} {rect.getRect()} sticks out of {_name(widget)} {widget.size().toTuple()}")
            faults.extend(f"{name} {rect.getRect()} overlaps {_name(other)} {other.geometry().getRect()}"
                          for other in children[i + 1:] if rect.intersects(other.geometry()))
            leaf = child.layout() is None  # a widget drawn as one, whose height follows its width
            wrapped = child.wordWrap() if isinstance(child, QLabel) else leaf and child.hasHeightForWidth()
            if wrapped and child.heightForWidth(child.width()) > child.height() + 1:
                faults.append(f"{name} needs {child.heightForWidth(child.width())} px, has {child.height()}")
            elif isinstance(child, QLabel) and not wrapped and child.sizeHint().width() > child.width() + 1:
                faults.append(f"{name} is cut: {child.sizeHint().width()} px wide in {child.width()}")
            walk(child)

    walk(root)
    return faults


def plot_text_faults(root: QWidget) -> list[str]:
    """Titles and axis titles drawn in a plot that do not lie whole in its view (cut, or under the next panel)."""
    faults = []
    for view in root.findChildren(pg.GraphicsView):
        if not view.isVisible():
            continue
        shown = view.mapToScene(view.viewport().rect()).boundingRect().adjusted(-1, -1, 1, 1)
        for item in view.scene().items():
            text = item.item if isinstance(item, pg.LabelItem) else item
            if isinstance(item, pg.LabelItem) and item.text and item.isVisible() or (
                    isinstance(item, QGraphicsTextItem) and item.isVisible() and item.toPlainText()
                    and isinstance(item.parentItem(), pg.AxisItem)):
                margin = text.document().documentMargin()  # blank around the text
                rect = text.mapRectToScene(text.boundingRect().adjusted(margin, margin, -margin, -margin))
                if not shown.contains(rect):
                    words = item.text if isinstance(item, pg.LabelItem) else item.toPlainText()
                    faults.append(f"{_name(view.parentWidget())}: {words[:40]!r} is cut: {rect.getRect()} in a "
                                  f"view of {shown.getRect()}")
    return faults


def row_heights(window: MainWindow) -> dict[str, float]:
    """Pixels a row of cells takes in each grid and attention strip on screen, from the drawn view box."""
    heights = {}
    for view in window.findChildren(QWidget):
        if isinstance(view, (KVGridView, AttentionView)) and view.isVisible():
            rows = len(view.display_rows()) if isinstance(view, KVGridView) else view.strip_values().shape[0]
            box = view.plot_item.getViewBox().sceneBoundingRect()
            name = f"{type(view).__name__} {getattr(view, 'lockstep', '') or ''}".strip()
            heights[name] = box.height() / max(1, rows)
    return heights


# ----- driving the window -----
def settle(qtbot, window: MainWindow) -> None:
    """Wait for the run to reach its target (a replay after A, T or L), draw it, and let every layout settle."""
    session = window.session

    def arrived() -> None:
        assert session.plan is not None and session.steps_done >= session.steps_target, (
            f"the run is at {session.steps_done} of {session.steps_target} tokens (plan: {session.plan is not None})")

    qtbot.waitUntil(arrived, timeout=30_000)
    window.redraw()
    settle_layouts()


def geometry_problems(window: MainWindow, screen, where: str, sideways: bool) -> list[str]:
    """What is wrong on screen now; `sideways`: the views must not scroll sideways either (at a zoom further in
    than the two steps a lecturer uses, a narrow screen may scroll them)."""
    problems = []
    if window.size() != screen:
        problems.append(f"{where}: the window is {window.size().toTuple()}, the screen {screen.toTuple()}")
        window.resize(screen)  # the window manager would not let it grow: see what else goes wrong
        settle_layouts()
    problems += [f"{where}: {fault}" for fault in layout_faults(window.centralWidget())]
    problems += [f"{where}: {fault}" for fault in plot_text_faults(window.centralWidget())]
    problems += [f"{where}: {view} rows are {px:.1f} px" for view, px in row_heights(window).items()
                 if px < MIN_ROW - 0.5]
    for grid in window.findChildren(KVGridView):
        if grid.isVisible():
            ticks = grid.plot_item.getAxis("bottom")._tickLevels or [[]]  # what it draws (pyqtgraph has no getter)
            cut = [text.strip() for _x, text in ticks[0] if text.endswith("\u2026") and len(text.strip()) < 8]
            if cut:  # a label may lose its end past 8 characters, never before
                problems.append(f"{where}: {grid.lockstep or 'the'} grid's token labels are cut: {cut}")
    scroll = window.findChild(QScrollArea, "runScroll")
    if sideways and scroll.horizontalScrollBar().maximum() > 0:
        problems.append(f"{where}: the views scroll sideways by {scroll.horizontalScrollBar().maximum()} px")
    return problems


def shown_panels(window: MainWindow) -> str:
    return "".join(key for key, name in PANELS.items() if window.actions[name].isChecked())


@pytest.fixture
def screen_window(qtbot, app_model, monkeypatch, request):
    """The window at `request.param` (width, height, presenter, tokens) of a projector's screen, after that many
    tokens. The offscreen screen is 800x800: the window is sized as on the projector, not shrunk to that screen."""
    width, height, presenter, tokens = request.param
    monkeypatch.setattr(main_window, "fit_to_screen", lambda _window: None)
    monkeypatch.setattr(presentation, "fit_to_screen", lambda _window: None)
    zoom = presentation.presenter_zoom(height)
    monkeypatch.setattr(presentation, "presenter_zoom", lambda _screen_height: zoom)
    window = open_window(app_model, "Time flies fast", settings=app_settings())
    qtbot.addWidget(window)
    monkeypatch.setattr(window, "showFullScreen", lambda: window.resize(width, height))
    monkeypatch.setattr(window, "showNormal", lambda: window.resize(width, height - TITLE_BAR))
    window.resize(width, height - TITLE_BAR)
    window.show()
    qtbot.waitUntil(lambda: window.session.plan is not None, timeout=60_000)
    for _ in range(tokens):
        window.session.step()
    settle(qtbot, window)
    if presenter:
        window.actions["presenter"].trigger()
        settle(qtbot, window)
    yield window
    window.close()


# 2 tokens: every replay is short. The shortest screen in presenter mode (the most zoom on the least height) and
# the narrowest without it: the two corners of the space, and CI time spent where a problem would show first.
SCREENS = [(1280, 720, True, 2), (1024, 768, False, 2)]


@pytest.mark.parametrize("screen_window", SCREENS, indirect=True,
                         ids=lambda s: f"{s[0]}x{s[1]}{'-F11' if s[2] else ''}")
def test_every_panel_combination_and_zoom_keeps_the_views_apart_and_readable(qtbot, screen_window):
    window = screen_window
    screen = window.size()
    base_zoom = window.presentation.zoom
    problems: list[str] = []
    for combination in COMBINATIONS:
        for key in "LATM":  # one press from the last combination (leaving the lesson may restore T: press it again)
            if (key in combination) != window.actions[PANELS[key]].isChecked():
                window.actions[PANELS[key]].trigger()
                settle(qtbot, window)
        assert shown_panels(window) == combination
        # zoom: the combination as opened and two steps in (Ctrl+= twice); with everything open, every zoom step
        if combination == "AMTL":
            window.presentation.set_zoom(presentation.ZOOM_STEPS[0])
        steps = len(presentation.ZOOM_STEPS) - 1 if combination == "AMTL" else 2
        for step in range(steps + 1):
            if step != 1 or combination == "AMTL":
                settle(qtbot, window)
                where = f"{combination or 'no panel'} at zoom {window.presentation.zoom:.2f}"
                problems += geometry_problems(window, screen, where, sideways=window.presentation.zoom < 1.5)
            if step < steps:
                window.actions["zoom_in"].trigger()
        window.presentation.set_zoom(base_zoom)  # Ctrl+0, or presenter mode's own zoom
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("screen_window", [(1280, 720, False, 4), (1280, 720, True, 4)], indirect=True,
                         ids=["1280x720", "1280x720-F11"])
def test_closing_a_panel_gives_the_grid_its_room_back(qtbot, screen_window):
    """The reported bug: at 1280x720, "Time flies fast", Space four times, A, then A again left the 6-layer
    grid a 35 px sliver until a restart."""
    window = screen_window
    grid = window.grid
    before = grid.height()
    assert min(row_heights(window).values()) >= MIN_ROW
    for name in ("attention", "memory", "compare", "lesson", "serving"):  # the serving page is a mode's page
        window.actions[name].trigger()
        settle(qtbot, window)
        window.actions[name].trigger()
        settle(qtbot, window)
        assert abs(grid.height() - before) <= 2, f"after {name} on and off the grid is {grid.height()} px, was {before}"
    assert window.findChild(QScrollArea, "runScroll").verticalScrollBar().maximum() == 0


def test_the_token_strip_keeps_a_second_row_only_for_a_run_that_fills_it(qtbot):
    """A short run's chips fit one row of a 1280-pixel window: the strip leaves the second row's height to the
    grid; at 300 pixels the same run wraps, and the strip keeps two rows."""
    from kvviz.app.views.token_strip import TokenStrip
    from kvviz.core.records import RunPlan

    strip = TokenStrip()
    qtbot.addWidget(strip)
    strip.resize(1250, 100)
    strip.show()
    strip.reset(RunPlan(prompt="Time flies fast", prompt_ids=(1, 2, 3), prompt_labels=("Time", " flies", " fast"),
                        model_name="m", n_layer=6, n_ctx=128, use_cache=True, max_new_tokens=12, budget=12,
                        passes=13, width=15, final_with_cache=15, final_without_cache=102,
                        cache_bytes_per_position=0, stop_reason="max_new_tokens", sampling="greedy"))
    chip = strip.chip_layout().chips[0][1].height()
    one_row = strip.sizeHint().height()
    assert chip < one_row < 2 * chip
    strip.resize(300, 100)
    qtbot.waitUntil(lambda: strip.sizeHint().height() > 2 * chip, timeout=5_000)


def _luminance(rgb) -> float:
    """WCAG 2 relative luminance of an (r, g, b, ...) colour."""
    channels = [c / 255 for c in rgb[:3]]
    r, g, b = (c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def _contrast(a, b) -> float:
    low, high = sorted((_luminance(a), _luminance(b)))
    return (high + 0.05) / (low + 0.05)


@pytest.mark.parametrize("theme_name", ["dark", "light"])
def test_the_attention_shades_stand_apart_in_both_themes(theme_name):
    """The strongest weight against the background, and a weight against one half or a quarter of it (a head
    that spreads its attention), in WCAG 2 contrast; the grey ramp it replaced gave 2.1:1 and 3.7:1 on dark."""
    from PySide6.QtGui import QColor

    from kvviz.app import theme
    from kvviz.app.views.attention_strip import shade_table

    chosen = theme.DARK if theme_name == "dark" else theme.LIGHT
    table = shade_table(chosen)
    shade = lambda weight: table[round(weight * (len(table) - 1))]  # noqa: E731
    assert _contrast(shade(1.0), QColor(chosen.background).getRgb()) >= 12
    assert _contrast(shade(0.5), shade(1.0)) >= 2.5
    assert _contrast(shade(0.25), shade(1.0)) >= 5
    assert _contrast(shade(0.1), QColor(chosen.background).getRgb()) >= 1.8  # a small weight is not background


@pytest.mark.parametrize("zoom", [1.0, 1.6])
def test_the_attention_strip_keeps_tall_rows_and_its_top_list_apart_at_its_least_height(qtbot, app_model, zoom):
    """At its least height (a short screen), each head's row is taller than the grid's least row, more so at a
    presenter's zoom, and the top positions stay under the strip, a line a few heads, one line per head."""
    import numpy as np

    from kvviz.engine.engine import Engine
    from kvviz.sources.weights import load_model

    engine = Engine(load_model(app_model).model)
    plan = plan_ids(engine, engine.encode_prompt("Time flies fast"), 3, True, prompt="Time flies fast", attention=True)
    records = tuple(engine.run(plan))
    view = AttentionView()
    qtbot.addWidget(view)
    view.set_font_scale(zoom)
    view.reset(plan)
    view.apply(records)
    view.resize(1000, 400)
    view.show()
    view.refresh()
    view.resize(1000, view.minimumSizeHint().height())
    qtbot.waitUntil(lambda: view.height() == view.minimumSizeHint().height(), timeout=5_000)
    settle_layouts()
    heads = plan.n_head
    row = view.plot_item.getViewBox().sceneBoundingRect().height() / heads
    assert row >= 16 * zoom - 1  # the strip's rows were about 10 px at zoom 1
    strip, top = view.plot_widget.geometry(), view.top_list.geometry()
    assert top.top() > strip.bottom() and top.bottom() < view.height()
    assert view.top_list.heightForWidth(top.width()) <= top.height()
    qtbot.waitUntil(lambda: view.top_list.text() != "", timeout=5_000)  # the texts follow at most 5 times a second
    lines = view.top_list.text().splitlines()
    assert [line.split(":")[0] for line in lines] == [f"h{h}" for h in range(heads)]
    heaviest = int(np.argmax(records[-1].attention.row(0, 2)))
    assert f"@{heaviest} " in lines[2].split(",")[0]  # head 2's first entry is its heaviest position
