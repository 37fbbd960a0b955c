"""`kvviz export`: run the engine without a window and write the chart, the grid and the whole view as images.

Torch, the engine and the widgets are imported only when `run_export` runs.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from kvviz.app.export.caption import default_file_name, make_caption
from kvviz.app.export.files import (
    DEFAULT_PNG_WIDTH,
    TARGETS,
    ExportError,
    all_or_nothing,
    check_png_width,
    parse_formats,
)
from kvviz.core.files import folder_problem, stops_deferred, user_path

if TYPE_CHECKING:
    from PySide6.QtWidgets import QApplication, QWidget

    from kvviz.app.views.run_view import RunView
    from kvviz.core.records import RunPlan, StepRecord

CHART_SIZE = (1000, 640)  # logical pixels of each standalone view; PNGs scale the whole rendering to `width`
GRID_SIZE = (1200, 620)
ATTENTION_SIZE = (1200, 360)
VIEW_SIZE = (1600, 1000)
COMPARE_SIZE = (1600, 1000)
EXPORT_FONT_SCALE = 1.9  # the views' fonts in an export: a 9-point tick label is 2 % of a view's exported height
VIEW_CHART_SHARE = 0.45  # of the whole view's height under the token strip: the chart and the counter


def _check_out_dir(out_dir: Path) -> None:
    """ExportError now, not after the run, for a folder that cannot hold the images."""
    problem = folder_problem(out_dir)
    if problem is not None:
        raise ExportError(f"{out_dir}: {problem}")


@contextlib.contextmanager
def without_offscreen_chatter():
    """Drop the offscreen platform's "does not support propagateSizeHints()" warnings; pass on the rest."""
    from PySide6.QtCore import qInstallMessageHandler

    previous = None

    def handler(mode, context, message):
        if "propagateSizeHints" in message:
            return
        if previous is not None:
            previous(mode, context, message)
        else:
            print(message, file=sys.stderr)

    previous = qInstallMessageHandler(handler)
    try:
        yield
    finally:
        qInstallMessageHandler(previous)


def ensure_application() -> QApplication:
    """The running QApplication, or a new one; offscreen when there is no display to draw on."""
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    if app is None:
        app = QApplication(["kvviz-export"])
    return app


def export_view(widget: QWidget) -> QWidget:
    """`widget`, a view made for an export, in the theme's style and the export's font scale."""
    from kvviz.app import theme

    widget.setStyleSheet(theme.stylesheet())
    widget.set_font_scale(EXPORT_FONT_SCALE)
    return widget


def build_view_area() -> RunView:
    """The main window's whole view (RunView), styled and sized for export: the grid over the chart and the
    counter, which get VIEW_CHART_SHARE of the height (left to the splitter, the grid would take most of it)."""
    from kvviz.app.views.run_view import RunView

    area = export_view(RunView())
    area.layout().setContentsMargins(8, 6, 8, 6)
    width, height = VIEW_SIZE
    area.bottom_splitter.setSizes([width * 3 // 5, width * 2 // 5])  # the counter's labels fit at the export's scale
    below = round(height * VIEW_CHART_SHARE)
    area.main_splitter.setSizes([height - below, 0, below])
    return area


def run_export(
    model: str | None,
    prompt: str,
    new_tokens: int,
    out_dir: Path,
    formats: str | list[str],
    use_cache: bool = True,
    width: int = DEFAULT_PNG_WIDTH,
    compare: bool = False,
    break_cache: bool = False,
    theme: str = "dark",
    dtype: str = "float32",
    window: int = 0,
    sinks: int = 0,
    kv_dtype: str = "",
) -> list[Path]:
    """Generate `new_tokens` tokens and write kvviz-{chart,grid,view}-stepN.{fmt} into `out_dir`.

    The views are the app's own (WorkChart, KVGridView and the whole RunView), reset with the
    engine's RunPlan, fed every StepRecord of the run, and rendered offscreen with the caption
    (prompt, model, step). Returns the written paths. Raises ExportError, ModelLoadError or
    GenerationError (all KvvizError) with a one-line message for bad input.

    With `compare`, the cached and the uncached run go in lockstep (kvviz.engine.compare) and the one image per
    format is the compare view, kvviz-compare-stepN.{fmt}; `break_cache` plants the teaching bug.
    `theme` is "dark" or "light" (kvviz.app.theme): the images' colours. `dtype` is the weights' and the
    cache's number type (float32, bfloat16 or float16). `window` and `sinks` give the cache a sliding window;
    `kv_dtype` (int8, int4, fp8) stores it quantized.
    """
    from kvviz.app import theme as themes

    if theme not in themes.THEMES:
        raise ExportError(f"theme must be {' or '.join(themes.THEMES)}, got {theme!r}")
    formats = parse_formats(formats)
    if not str(out_dir).strip():
        raise ExportError("no output folder given (an empty name would mean the current folder)")
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens <= 0:
        raise ExportError(f"new-tokens must be a positive integer, got {new_tokens}")
    check_png_width(width, "width")
    out_dir = user_path(out_dir)
    _check_out_dir(out_dir)  # before the model loads; the folder itself is made once there is something to write

    app = ensure_application()

    plan, records = planned_run(model, prompt, new_tokens, use_cache, compare, break_cache, dtype, window, sinks,
                                kv_dtype)
    run = list(records())
    render = _render_compare if compare else _render_run
    with without_offscreen_chatter(), themes.using(theme), stops_deferred():  # Qt paints: a stop waits for a file
        return render(app, plan, run, out_dir, formats, width, dtype)


def planned_run(model: str | None, prompt: str, new_tokens: int, use_cache: bool = True, compare: bool = False,
                break_cache: bool = False, dtype: str = "float32", window: int = 0, sinks: int = 0,
                kv_dtype: str = "") -> tuple[RunPlan, Callable[[], Iterator[StepRecord]]]:
    """The plan of a headless run of `model` in `dtype` (a lockstep one with `compare`; `break_cache` plants the
    teaching bug), checked, and a function that runs it: the callers check what the plan tells them before the
    work starts."""
    from kvviz.core.records import RunRequest
    from kvviz.engine.engine import Engine
    from kvviz.engine.run import start_run
    from kvviz.sources.weights import load_model, torch_dtype

    loaded = load_model(model, dtype=torch_dtype(dtype))
    request = RunRequest(0, prompt, use_cache, new_tokens, compare=compare, break_cache=break_cache, window=window,
                         sinks=sinks, kv_dtype=kv_dtype)
    run = start_run(Engine(loaded.model, loaded.tokenizer), request, loaded.name)
    return run.plan, run.passes


def _render_compare(app: QApplication, plan: RunPlan, records: list, out_dir: Path, formats: list[str],
                    width: int, dtype: str) -> list[Path]:
    from PySide6.QtCore import Qt

    from kvviz.app.views.compare.compare_view import CompareView

    view = export_view(CompareView())
    try:
        view.reset(plan)
        view.apply(records)
        view.setAttribute(Qt.WidgetAttribute.WA_DontShowOnScreen, True)
        view.resize(*COMPARE_SIZE)
        view.show()
        app.processEvents()
        view.refresh()
        app.processEvents()
        last = records[-1]
        step = last.step + 1
        caption = make_caption(plan.prompt, plan.model_name, step, last.new_tokens, plan.use_cache, compare=True,
                               cache_broken=plan.cache_broken, dtype=dtype)
        return _write_all({"compare": (view, COMPARE_SIZE)}, formats, out_dir, step, width, caption)
    finally:
        view.close()
        view.deleteLater()
        app.processEvents()


def _render_run(app: QApplication, plan: RunPlan, records: list, out_dir: Path, formats: list[str],
                width: int, dtype: str) -> list[Path]:
    from PySide6.QtCore import Qt

    from kvviz.app.views.grid.kv_grid import KVGridView
    from kvviz.app.views.work_chart import WorkChart

    chart, grid = export_view(WorkChart()), export_view(KVGridView())
    view = build_view_area()
    views = (chart, grid, view)
    try:
        for v in views:
            v.reset(plan)
        if not records:
            raise ExportError("the run produced no step to export")
        for v in views:
            v.apply(records)
            v.refresh()

        last = records[-1]
        step = last.step + 1
        caption = make_caption(plan.prompt, plan.model_name, step, last.new_tokens, plan.use_cache,
                               cache_broken=plan.cache_broken, dtype=dtype)
        targets = {"chart": (chart, CHART_SIZE), "grid": (grid, GRID_SIZE), "view": (view, VIEW_SIZE)}
        for widget, (w, h) in targets.values():
            widget.setAttribute(Qt.WidgetAttribute.WA_DontShowOnScreen, True)  # even when a display is there
            widget.resize(w, h)
            widget.show()  # lays the widgets out and settles pyqtgraph's ranges
        app.processEvents()
        return _write_all(targets, formats, out_dir, step, width, caption)
    finally:
        for widget in (chart, grid, view):
            widget.close()
            widget.deleteLater()
        app.processEvents()


def _write_all(targets: dict, formats: list[str], out_dir: Path, step: int, width: int, caption: str) -> list[Path]:
    """Every image, or none: they replace the previous export's images together, and a failure (a full disk,
    an interrupt, a stop signal) leaves those exactly as they were."""
    from kvviz.app.export.render import export_widget

    with all_or_nothing(out_dir) as files:
        for name in [t for t in TARGETS if t in targets] + [t for t in targets if t not in TARGETS]:
            widget = targets[name][0]
            for fmt in formats:
                path = out_dir / default_file_name(name, fmt, step)
                export_widget(widget, path, width if fmt == "png" else None, caption, files)
    return files.targets
