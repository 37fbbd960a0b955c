"""Animations of a run for slides: a GIF and an MP4 of a view, one frame per step (`kvviz export --animate`
and the export dialog's GIF and MP4 formats).

A frame is the still export's PNG rendering (`render.render_png`, caption and all) of the view fed the
run's records up to that step: the records are computed once, and the view is reset with the plan and
fed them in order, as the app feeds its views. Steps count forward passes, as the still images' names
do: a cached run of N tokens has N + 1 (the last fills the cache), an uncached one N.

GIF (Pillow): one adaptive 256-colour palette, made from all the frames and shared by them, no dithering
(flat cells stay flat), each frame stored as the rectangle that changed; it loops, and its last frame
stays `hold` seconds longer. MP4 (PyAV, whose wheels carry FFmpeg with libx264): H.264 in
yuv420p with BT.709 colours, even sides (the last row or column repeated), the index at the front for
browsers, at `fps` frames per second, the hold as `round(hold * fps)` repeated frames. Each file is
written beside its target and renamed once whole: a failure, an interrupt or Cancel leaves none of them,
nor a folder made for them. Pillow and PyAV load only when a file is written.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QApplication, QWidget

from kvviz.app import theme as themes
from kvviz.app.export.caption import make_caption
from kvviz.app.export.encoders import GifFrames, Mp4Encoder, padded
from kvviz.app.export.files import ExportError, all_or_nothing, check_png_width, check_target_path, write_export
from kvviz.app.export.headless import (
    ATTENTION_SIZE,
    CHART_SIZE,
    COMPARE_SIZE,
    GRID_SIZE,
    VIEW_SIZE,
    build_view_area,
    ensure_application,
    export_view,
    planned_run,
    without_offscreen_chatter,
)
from kvviz.app.export.render import png_size, render_png
from kvviz.core.errors import first_line
from kvviz.core.files import FileSet, check_stop, folder_problem, stops_deferred, user_path

if TYPE_CHECKING:
    from kvviz.core.records import RunPlan, StepRecord

ANIMATION_FORMATS = ("gif", "mp4")
ANIMATION_LABELS = {"gif": "GIF animation", "mp4": "MP4 video (H.264)"}
ANIMATION_TARGETS = ("chart", "grid", "view")  # and "compare", the only one of a compare-mode run
TARGET_SIZES = {"chart": CHART_SIZE, "grid": GRID_SIZE, "view": VIEW_SIZE, "compare": COMPARE_SIZE,
                "attention": ATTENTION_SIZE}
DEFAULT_ANIMATION_WIDTH = 1280
DEFAULT_FPS = 2.0
MAX_FPS = 60.0
DEFAULT_HOLD = 2.0  # seconds the last frame stays on
MAX_HOLD = 60.0


class AnimationCancelled(Exception):
    """Raised by a progress callback to stop an animation (Cancel); nothing stays written."""


@dataclass(frozen=True)
class AnimationSource:
    """What an animation is made of: a run's plan and its records (a whole headless run, or the app's so far),
    computed in `dtype` (the captions say it; None: not said)."""

    plan: RunPlan
    records: tuple[StepRecord, ...]
    dtype: str | None = None

    @property
    def steps(self) -> int:
        return len(self.records)

    @property
    def targets(self) -> tuple[str, ...]:
        """The views this run can be animated as: the compare view alone for a lockstep run; the attention view
        too when the run recorded attention."""
        if self.plan.twin is not None:
            return ("compare",)
        return (*ANIMATION_TARGETS, "attention") if self.plan.attention else ANIMATION_TARGETS


@dataclass(frozen=True)
class AnimationSpec:
    """Steps `first` to `last` (1-based, inclusive) at `fps` frames a second, the last held `hold` seconds
    more, `width` pixels wide, with or without the caption."""

    first: int
    last: int
    fps: float = DEFAULT_FPS
    hold: float = DEFAULT_HOLD
    width: int = DEFAULT_ANIMATION_WIDTH
    caption: bool = True

    @property
    def frames(self) -> int:
        """One per step (the MP4 then repeats the last round(hold * fps) times)."""
        return self.last - self.first + 1

    def gif_durations_ms(self) -> list[int]:
        step_ms = 1000 / self.fps
        return [round(step_ms)] * (self.frames - 1) + [round(step_ms + 1000 * self.hold)]


def check_fps(fps: object) -> float:
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps <= MAX_FPS:
        raise ExportError(f"fps must be more than 0 and at most {MAX_FPS:g} frames a second, got {fps}")
    return float(fps)


def check_hold(hold: object) -> float:
    if isinstance(hold, bool) or not isinstance(hold, (int, float)) or not 0 <= hold <= MAX_HOLD:
        raise ExportError(f"hold-last must be 0 to {MAX_HOLD:g} seconds, got {hold}")
    return float(hold)


def check_steps(first: int, last: int, available: int | None = None) -> None:
    """ExportError for a range that is not A-B with 1 <= A <= B, or that runs past `available` steps."""
    if first < 1 or last < first:
        raise ExportError(f"steps {first}-{last}: give A-B with 1 <= A <= B")
    if available is not None and last > available:
        raise ExportError(f"steps {first}-{last}: the run has {available} step{'' if available == 1 else 's'}, "
                          f"1-{available}")


def parse_animation_formats(text: str | Sequence[str]) -> list[str]:
    """'gif,mp4' -> ['gif', 'mp4']; a still format or an unknown one is ExportError."""
    formats: list[str] = []
    for item in text.split(",") if isinstance(text, str) else text:
        fmt = item.strip().lower().lstrip(".")
        if fmt in ("png", "svg", "pdf"):
            raise ExportError(f"{fmt} is a still image format; an animation is gif and/or mp4 (export stills "
                              "without --animate)")
        if fmt and fmt not in ANIMATION_FORMATS:
            raise ExportError(f"unknown animation format {item.strip()!r}; choose from {', '.join(ANIMATION_FORMATS)}")
        if fmt and fmt not in formats:
            formats.append(fmt)
    if not formats:
        raise ExportError(f"no animation format given; choose from {', '.join(ANIMATION_FORMATS)}")
    return formats


def animation_file_name(target: str, fmt: str, first: int, last: int) -> str:
    """kvviz-view-steps1-9.gif and the like."""
    return f"kvviz-{target}-steps{first}-{last}.{fmt}"


def terminal_progress(stream=None) -> Callable[[int, int], None] | None:
    """A progress line, rewritten in place with \\r, on `stream` (stderr) when it is a terminal; else None."""
    stream = sys.stderr if stream is None else stream
    try:
        if stream is None or not stream.isatty():
            return None
    except (AttributeError, ValueError):
        return None

    def report(done: int, total: int) -> None:
        with contextlib.suppress(OSError, ValueError):
            stream.write(f"\rkvviz: frame {done}/{total}" + ("\r\x1b[K" if done >= total else ""))
            stream.flush()

    return report


def _target_widget(target: str) -> QWidget:
    """A fresh view for `target`, styled as `kvviz export` styles its views."""
    if target == "view":
        return build_view_area()
    from kvviz.app.views.attention_view import AttentionView
    from kvviz.app.views.compare.compare_view import CompareView
    from kvviz.app.views.grid.kv_grid import KVGridView
    from kvviz.app.views.work_chart import WorkChart

    return export_view({"chart": WorkChart, "grid": KVGridView, "compare": CompareView,
                        "attention": AttentionView}[target]())


def _rgb(image: QImage) -> np.ndarray:
    """(H, W, 3) uint8 RGB of a QImage."""
    image = image.convertToFormat(QImage.Format.Format_RGB888)
    data = np.frombuffer(image.constBits(), dtype=np.uint8, count=image.sizeInBytes())
    rows = data.reshape(image.height(), image.bytesPerLine())[:, : image.width() * 3]
    return rows.reshape(image.height(), image.width(), 3).copy()


class _Frames:
    """The frames of one animation: the target view, offscreen at the export's size, fed step by step."""

    def __init__(self, source: AnimationSource, target: str, spec: AnimationSpec) -> None:
        self.source, self.spec = source, spec
        self.app = QApplication.instance()
        self.widget = _target_widget(target)
        self.widget.setAttribute(Qt.WidgetAttribute.WA_DontShowOnScreen, True)  # even when a display is there
        self.widget.resize(*TARGET_SIZES[target])
        self.widget.reset(source.plan)
        self.widget.show()
        self.app.processEvents()
        self._fed = 0
        # one size for every frame: the tallest caption's (a caption may wrap onto another line)
        self.height = max(png_size(self.widget, spec.width, self.caption(step)).height()
                          for step in range(spec.first, spec.last + 1))

    def caption(self, step: int) -> str | None:
        if not self.spec.caption:
            return None
        plan, record = self.source.plan, self.source.records[step - 1]
        return make_caption(plan.prompt, plan.model_name, step, record.new_tokens, plan.use_cache,
                            compare=plan.twin is not None, cache_broken=plan.cache_broken, dtype=self.source.dtype)

    def rgb(self, step: int) -> np.ndarray:
        """The frame of `step` as (H, W, 3) RGB."""
        if step < self._fed:
            self.widget.reset(self.source.plan)
            self._fed = 0
        self.widget.apply(self.source.records[self._fed:step])
        self._fed = step
        self.widget.refresh()
        self.app.processEvents()
        image = render_png(self.widget, self.spec.width, self.caption(step))
        return padded(_rgb(image), self.height, self.spec.width)

    def close(self) -> None:
        self.widget.close()
        self.widget.deleteLater()
        self.app.processEvents()


def write_animation(source: AnimationSource, target: str, paths: Sequence[Path | str], spec: AnimationSpec,
                    progress: Callable[[int, int], None] | None = None) -> list[Path]:
    """Write the animation of `target` (a view of `source.targets`) to each of `paths` (.gif, .mp4).

    Every file whole, or none: they replace the earlier files of those names together, and a failure
    (ExportError naming the file), an interrupt, a stop signal or AnimationCancelled raised by
    `progress(done, total)` (called after each frame) leaves the earlier files exactly as they were and
    removes the folders made here. Returns the written paths, in the order given.
    """
    check_steps(spec.first, spec.last, source.steps)
    check_png_width(spec.width, "width")
    check_fps(spec.fps)
    check_hold(spec.hold)
    if target not in source.targets:
        raise ExportError(f"this run animates as {' or '.join(source.targets)}, not {target!r}")
    by_format: dict[str, Path] = {}
    for path in map(Path, paths):
        fmt = path.suffix.lower().lstrip(".")
        if fmt not in ANIMATION_FORMATS:
            raise ExportError(f"{path}: an animation is a .gif or an .mp4 file")
        by_format[fmt] = path
    folders = {path.parent for path in by_format.values()}
    with all_or_nothing(*folders) as files:
        for path in by_format.values():
            check_target_path(path)
        frames = _Frames(source, target, spec)
        try:
            gif = _encode(frames, by_format, spec, progress, files)
        finally:
            frames.close()
        if gif is not None:
            data = _write(by_format["gif"], lambda: gif.encode(spec.gif_durations_ms()))
            _write(by_format["gif"], lambda: write_export(by_format["gif"], data, files))
    return [path for path in map(Path, paths) if path in files.targets]


def _write(path: Path, action: Callable):
    """`action()`, with the file system's and FFmpeg's errors as one ExportError line naming `path`."""
    try:
        return action()
    except ExportError:
        raise
    except Exception as exc:
        if not isinstance(exc, OSError) and type(exc).__module__.split(".")[0] != "av":
            raise
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else first_line(exc)
        raise ExportError(f"{path}: could not be written ({reason})") from exc


def _encode(frames: _Frames, by_format: dict[str, Path], spec: AnimationSpec,
            progress: Callable[[int, int], None] | None, files: FileSet) -> GifFrames | None:
    """Render every frame once, muxing the MP4 as they come (staged in `files`); the GIF's frames."""
    gif = GifFrames(spec.frames) if "gif" in by_format else None
    mp4_path = by_format.get("mp4")
    with contextlib.ExitStack() as stack:
        mp4 = None
        if mp4_path is not None:
            temporary = _write(mp4_path, lambda: files.stage(mp4_path))
            mp4 = _write(mp4_path, lambda: stack.enter_context(
                Mp4Encoder(temporary, spec.width, frames.height, spec.fps)))
        for done, step in enumerate(range(spec.first, spec.last + 1), start=1):
            check_stop()
            rgb = frames.rgb(step)
            if gif is not None:
                gif.add(rgb)
            if mp4 is not None:
                hold = round(spec.hold * spec.fps) if step == spec.last else 0
                _write(mp4_path, lambda rgb=rgb, hold=hold: mp4.add(rgb, 1 + hold))
            if progress is not None:
                progress(done, spec.frames)
        if mp4_path is not None:
            _write(mp4_path, lambda: stack.close())  # flush and close the MP4
    return gif


def run_animation(model: str | None, prompt: str, new_tokens: int, out_dir: Path | str,
                  formats: str | Sequence[str] = ANIMATION_FORMATS, use_cache: bool = True,
                  width: int = DEFAULT_ANIMATION_WIDTH, compare: bool = False, break_cache: bool = False,
                  target: str | None = None, steps: tuple[int, int] | None = None, fps: float = DEFAULT_FPS,
                  hold: float = DEFAULT_HOLD, progress: Callable[[int, int], None] | None = None,
                  theme: str | None = None, dtype: str = "float32", window: int = 0, sinks: int = 0,
                  kv_dtype: str = "") -> list[Path]:
    """`kvviz export --animate`: generate `new_tokens` tokens and write kvviz-{target}-stepsA-B.{gif,mp4}.

    `target` is "chart", "grid" or "view" (the default); with `compare`, the compare view of the cached and
    the uncached run in lockstep (`break_cache` plants the teaching bug). `steps` (A, B) picks steps A to B,
    1-based and inclusive (default: all). `theme` ("dark", "light"; None: the current one) colours the
    frames; `dtype` is the weights' and the cache's number type. Progress goes to stderr when it is a
    terminal, unless `progress` is given. Raises ExportError, ModelLoadError or GenerationError (KvvizError)
    with one line for bad input, before the model loads where it can.
    """
    if theme is not None and theme not in themes.THEMES:
        raise ExportError(f"theme must be {' or '.join(themes.THEMES)}, got {theme!r}")
    formats = parse_animation_formats(formats)
    if not str(out_dir).strip():
        raise ExportError("no output folder given (an empty name would mean the current folder)")
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens <= 0:
        raise ExportError(f"new-tokens must be a positive integer, got {new_tokens}")
    check_png_width(width, "width")
    fps, hold = check_fps(fps), check_hold(hold)
    if target is not None and target not in (("compare",) if compare else ANIMATION_TARGETS):
        raise ExportError(f"target {target!r}: with compare the animation is the compare view" if compare else
                          f"unknown target {target!r}; choose from {', '.join(ANIMATION_TARGETS)}")
    target = target or ("compare" if compare else "view")
    if steps is not None:
        check_steps(*steps)
    out_dir = user_path(out_dir)
    problem = folder_problem(out_dir)
    if problem is not None:
        raise ExportError(f"{out_dir}: {problem}")

    ensure_application()
    plan, run = planned_run(model, prompt, new_tokens, use_cache, compare, break_cache, dtype, window, sinks,
                            kv_dtype)
    first, last = steps if steps is not None else (1, plan.passes)
    check_steps(first, last, plan.passes)  # before the run: the plan knows its passes
    records = tuple(run())
    spec = AnimationSpec(first, min(last, len(records)), fps, hold, width)
    paths = [out_dir / animation_file_name(target, fmt, spec.first, spec.last) for fmt in formats]
    with without_offscreen_chatter(), themes.using(theme), stops_deferred():  # Qt paints: a stop waits for a frame
        return write_animation(AnimationSource(plan, records, dtype), target, paths, spec,
                               terminal_progress() if progress is None else progress)
