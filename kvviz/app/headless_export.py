"""`kvviz export`: run the engine without a window and write the chart, the grid and the whole view as images."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kvviz.app.export import DEFAULT_PNG_WIDTH, FORMATS, MAX_PNG_WIDTH, MIN_PNG_WIDTH, ExportError

if TYPE_CHECKING:
    from kvviz.app.run_view import RunView

CHART_SIZE = (1000, 640)  # logical pixels of each standalone view; PNGs scale the whole rendering to `width`
GRID_SIZE = (1200, 620)
VIEW_SIZE = (1600, 1000)


def parse_formats(text: str | list[str]) -> list[str]:
    """'png,svg' or ['png', 'svg'] -> ['png', 'svg'], checked, duplicates dropped."""
    items = text.split(",") if isinstance(text, str) else list(text)
    formats: list[str] = []
    for item in items:
        fmt = item.strip().lower().lstrip(".")
        if not fmt:
            continue
        if fmt not in FORMATS:
            raise ExportError(f"unknown format {item.strip()!r}; choose from {', '.join(FORMATS)}")
        if fmt not in formats:
            formats.append(fmt)
    if not formats:
        raise ExportError(f"no image format given; choose from {', '.join(FORMATS)}")
    return formats


def _check_out_dir(out_dir: Path) -> None:
    """ExportError now, not after the run, for a folder that cannot hold the images."""
    if out_dir.exists():
        if not out_dir.is_dir():
            raise ExportError(f"{out_dir}: exists and is not a folder")
        if not os.access(out_dir, os.W_OK):
            raise ExportError(f"{out_dir}: the folder is not writable")
        return
    ancestor = out_dir.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ExportError(f"{out_dir}: cannot create the folder, {ancestor} is not a folder")
    if not os.access(ancestor, os.W_OK):
        raise ExportError(f"{out_dir}: cannot create the folder, {ancestor} is not writable")


@contextlib.contextmanager
def _without_offscreen_chatter():
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


def ensure_application():
    """The running QApplication, or a new one; offscreen when there is no display to draw on."""
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    if app is None:
        app = QApplication(["kvviz-export"])
    return app


def build_view_area() -> RunView:
    """The main window's whole view (RunView), styled and sized for export."""
    from kvviz.app import theme
    from kvviz.app.run_view import RunView

    area = RunView()
    area.setStyleSheet(theme.STYLESHEET)
    area.layout().setContentsMargins(8, 6, 8, 6)
    area.bottom_splitter.setSizes([3 * VIEW_SIZE[0] // 4 - 60, VIEW_SIZE[0] // 4 + 60])  # the counter's labels fit
    return area


def run_export(
    model: str | None,
    prompt: str,
    new_tokens: int,
    out_dir: Path,
    formats: list[str],
    use_cache: bool = True,
    width: int = DEFAULT_PNG_WIDTH,
) -> list[Path]:
    """Generate `new_tokens` tokens and write kvviz-{chart,grid,view}-stepN.{fmt} into `out_dir`.

    The views are the app's own (WorkChart, KVGridView, CounterPanel, TokenStrip), fed every
    StepRecord of the run, and rendered offscreen with the caption (prompt, model, step).
    Returns the written paths. Raises ValueError, ExportError, ModelLoadError or
    GenerationError (all ValueError) with a one-line message for bad input.
    """
    formats = parse_formats(formats)
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens <= 0:
        raise ExportError(f"new-tokens must be a positive integer, got {new_tokens}")
    if isinstance(width, bool) or not isinstance(width, int) or not MIN_PNG_WIDTH <= width <= MAX_PNG_WIDTH:
        raise ExportError(f"width must be {MIN_PNG_WIDTH} to {MAX_PNG_WIDTH} pixels, got {width}")
    out_dir = Path(out_dir).expanduser()
    _check_out_dir(out_dir)  # before the model loads; the folder itself is made once there is something to write

    app = ensure_application()

    from kvviz.app.run_info import RunInfo
    from kvviz.engine import Engine
    from kvviz.weights import load_model

    loaded = load_model(model)
    engine = Engine(loaded.model)
    prompt_ids = engine.encode_prompt(prompt)
    info = RunInfo.from_engine(engine, prompt, prompt_ids, new_tokens, use_cache, model_name=loaded.name)

    with _without_offscreen_chatter():
        return _render_run(app, engine, info, prompt_ids, loaded.name, out_dir, formats, width)


def _render_run(app, engine, info, prompt_ids: list[int], model_name: str, out_dir: Path, formats: list[str],
                width: int) -> list[Path]:
    from PySide6.QtCore import Qt

    from kvviz.app.export import export_widget, make_caption
    from kvviz.app.grid_view import KVGridView
    from kvviz.app.work_chart import WorkChart

    prompt, new_tokens, use_cache = info.prompt, info.max_new_tokens, info.use_cache
    chart, grid = WorkChart(), KVGridView()
    view = build_view_area()
    view_parts = view.views()
    for widget in (chart, grid):
        widget.setStyleSheet(view.styleSheet())
    views = (chart, grid, *view_parts)
    try:
        for v in views:
            v.reset(info)
        last = None
        for record in engine.generate(prompt_ids, new_tokens, use_cache):
            for v in views:
                v.apply_record(record, redraw=False)
            last = record
        for v in views:
            v.refresh()

        if last is None:
            raise ExportError("the run produced no step to export")
        caption = make_caption(prompt, model_name, last.step + 1, last.new_tokens, use_cache)
        step = last.step + 1
        targets = {"chart": (chart, CHART_SIZE), "grid": (grid, GRID_SIZE), "view": (view, VIEW_SIZE)}
        for widget, (w, h) in targets.values():
            widget.setAttribute(Qt.WidgetAttribute.WA_DontShowOnScreen, True)  # even when a display is there
            widget.resize(w, h)
            widget.show()  # lays the widgets out and settles pyqtgraph's ranges
        app.processEvents()
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ExportError(f"{out_dir}: cannot create the folder ({exc.strerror or exc})") from exc
        written: list[Path] = []
        for name, (widget, _size) in targets.items():
            for fmt in formats:
                path = out_dir / f"kvviz-{name}-step{step}.{fmt}"
                written.append(export_widget(widget, path, width if fmt == "png" else None, caption))
        return written
    finally:
        for widget in (chart, grid, view):
            widget.close()
            widget.deleteLater()
        app.processEvents()
