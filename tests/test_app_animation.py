"""Animated export (GIF through Pillow, MP4 through PyAV), `kvviz export --animate`, the dialog's animation
formats, and copying views to the clipboard (Ctrl+Shift+C, "Copy image")."""

from __future__ import annotations

import errno
import re
from pathlib import Path

import av
import numpy as np
import pytest
from helpers_checkpoints import plan_ids, save_kvviz_folder, tiny_kvviz_model
from PIL import Image
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QMenu, QMessageBox

from kvviz.app import theme
from kvviz.app.export import AnimationSource, AnimationSpec, ExportDialog, ExportError, encoders, write_animation
from kvviz.app.export.animation import run_animation, terminal_progress
from kvviz.app.views.work_chart import WorkChart
from kvviz.core.errors import KvvizError

PROMPT = "Time flies"  # 2 GPT-2 tokens
N = 8
CACHED_STEPS = N + 1  # a cached run of N tokens makes N + 1 forward passes, the last filling the cache
GIF_MB_BUDGET = 8


def near_count(rgb: np.ndarray, hex_colour: str, tolerance: int = 12) -> int:
    target = np.array(theme.rgba(hex_colour)[:3], dtype=np.int16)
    return int((np.abs(rgb.astype(np.int16) - target).max(axis=2) <= tolerance).sum())


def gif_frames(path: Path) -> tuple[list[np.ndarray], list[int]]:
    """Every frame of a GIF as (H, W, 3) RGB, composed as a viewer shows it, and each frame's duration in ms."""
    frames, durations = [], []
    with Image.open(path) as image:
        for index in range(image.n_frames):
            image.seek(index)
            frames.append(np.array(image.convert("RGB")))
            durations.append(image.info["duration"])
    return frames, durations


def mp4_facts(path: Path) -> dict:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = list(container.decode(video=0))
        return {"codec": stream.codec_context.name, "frames": len(frames), "size": (stream.width, stream.height),
                "pix_fmt": frames[0].format.name, "rate": stream.average_rate,
                "seconds": float(stream.duration * stream.time_base), "last": frames[-1].to_ndarray(format="rgb24")}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(save_kvviz_folder(tmp_path_factory.mktemp("models") / "tiny", n_layer=2, n_head=2, n_embd=32))


@pytest.fixture(scope="module")
def source() -> AnimationSource:
    """A tiny model's cached run of N tokens: its plan and all N + 1 records."""
    from kvviz.engine.engine import Engine

    engine = Engine(tiny_kvviz_model(n_layer=2, n_head=2, n_embd=32, n_ctx=64))
    plan = plan_ids(engine, engine.encode_prompt(PROMPT), N, True, prompt=PROMPT, model_name="tiny")
    return AnimationSource(plan, tuple(engine.run(plan)))


# ----- kvviz export --animate -----
def test_cli_animates_the_run_as_gif_and_mp4(app_model, tmp_path, kvviz_cli):
    """The command of the README, on the embedded model: a GIF and an MP4 of every step of the whole view."""
    out = tmp_path / "anim"
    model = [] if app_model is None else ["--model", app_model]
    done = kvviz_cli("export", "--animate", "--prompt", PROMPT, "--new-tokens", str(N), "--out", str(out),
                     "--format", "gif,mp4", *model)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no progress line when stderr is not a terminal
    gif, mp4 = out / f"kvviz-view-steps1-{CACHED_STEPS}.gif", out / f"kvviz-view-steps1-{CACHED_STEPS}.mp4"
    assert done.stdout.splitlines() == [str(gif), str(mp4)]
    assert sorted(p.name for p in out.iterdir()) == sorted([gif.name, mp4.name])  # no temporary file left

    frames, durations = gif_frames(gif)
    assert len(frames) == CACHED_STEPS  # a frame per step: 8 token steps and the cache-filling pass
    assert durations == [500] * (CACHED_STEPS - 1) + [500 + 2000]  # 2 fps; the last held 2 s longer
    assert frames[0].shape[1] == 1280
    for before, after in zip(frames, frames[1:], strict=False):
        assert (before != after).any(axis=2).sum() > 100  # each step changes the picture
    last = frames[-1]
    assert near_count(last, theme.DARK.amber) > 1000 and near_count(last, theme.DARK.teal) > 1000

    facts = mp4_facts(mp4)
    hold_frames = 2 * 2  # --hold-last 2 s at --fps 2: the last frame 4 more times
    assert facts["frames"] == CACHED_STEPS + hold_frames == 13
    assert facts["codec"] == "h264" and facts["pix_fmt"] == "yuv420p" and facts["rate"] == 2
    assert facts["seconds"] == pytest.approx(13 / 2)
    assert all(side % 2 == 0 for side in facts["size"]) and facts["size"][0] == 1280
    for colour in (theme.DARK.amber, theme.DARK.teal):  # H.264's colours, read back, near the theme's
        assert near_count(facts["last"], colour, 24) > 1000


def test_chart_gif_of_13_steps_at_1280_stays_under_the_budget(app_model, qtbot, tmp_path):
    paths = run_animation(app_model, "Time flies fast", 12, tmp_path, "gif", target="chart", width=1280)
    assert [p.name for p in paths] == ["kvviz-chart-steps1-13.gif"]
    assert paths[0].stat().st_size <= GIF_MB_BUDGET * 1_000_000
    with Image.open(paths[0]) as image:
        assert image.n_frames == 13 and image.width == 1280


def test_steps_speed_and_hold_shape_both_files(tiny, qtbot, tmp_path):
    paths = run_animation(tiny, PROMPT, N, tmp_path, ["mp4", "gif"], steps=(3, 5), fps=4, hold=0.5, width=640,
                          target="grid")
    assert [p.name for p in paths] == ["kvviz-grid-steps3-5.mp4", "kvviz-grid-steps3-5.gif"]
    frames, durations = gif_frames(paths[1])
    assert len(frames) == 3 and durations == [250, 250, 750]
    facts = mp4_facts(paths[0])
    assert facts["frames"] == 3 + 2  # 0.5 s at 4 fps: two repeats of the last frame
    assert facts["rate"] == 4 and facts["size"][0] == 640
    uncached = run_animation(tiny, PROMPT, 3, tmp_path, "gif", use_cache=False, fps=0.5, hold=0)
    assert uncached[0].name == "kvviz-view-steps1-3.gif"  # without the cache, N passes
    assert gif_frames(uncached[0])[1] == [2000, 2000, 2000]
    compare = run_animation(tiny, PROMPT, 2, tmp_path, "mp4", compare=True)
    assert compare[0].name == "kvviz-compare-steps1-3.mp4" and mp4_facts(compare[0])["frames"] == 3 + 4


def test_cli_rejects_bad_animation_options_in_one_line(tiny, tmp_path, kvviz_cli):
    base = ["export", "--prompt", PROMPT, "--new-tokens", str(N), "--out", str(tmp_path / "o"), "--model", tiny]
    cases = [
        (["--animate", "--steps", "9-3"], "runs backwards"),
        (["--animate", "--steps", "3-20"], "steps 3-20: the run has 9 steps, 1-9"),
        (["--animate", "--steps", "0-3"], "steps count from 1"),
        (["--animate", "--steps", "many"], "give the steps as A-B"),
        (["--animate", "--fps", "0"], "--fps: must be more than 0 and at most 60"),
        (["--animate", "--fps", "-2"], "--fps: must be more than 0 and at most 60"),
        (["--animate", "--fps", "1000"], "--fps: must be more than 0 and at most 60"),
        (["--animate", "--hold-last", "-1"], "--hold-last: must be 0 or a positive number"),
        (["--animate", "--target", "counter"], "--target: invalid choice"),
        (["--animate", "--format", "gif,png"], "png is a still image format"),
        (["--format", "png,gif"], "--format gif: an animation; add --animate"),
        (["--fps", "3"], "--fps is for an animation: add --animate"),
    ]
    for extra, message in cases:
        done = kvviz_cli(*base, *extra)
        assert done.returncode == 2, (extra, done.stderr)
        assert message in done.stderr and done.stderr.count("\n") == 1 and done.stdout == "", (extra, done.stderr)
    assert not (tmp_path / "o").exists()


def test_run_animation_rejects_bad_input_before_loading(tmp_path, qtbot):
    unused = str(tmp_path / "never-loaded")
    for changes, text in [(dict(fps=0), "fps"), (dict(hold=-1.0), "hold-last"), (dict(steps=(4, 2)), "steps 4-2"),
                          (dict(target="counter"), "unknown target"), (dict(formats="png"), "still image"),
                          (dict(target="grid", compare=True), "compare view"), (dict(width=10), "width")]:
        with pytest.raises(ExportError, match=text) as info:
            run_animation(unused, PROMPT, N, tmp_path / "o", **changes)
        assert isinstance(info.value, KvvizError) and "\n" not in str(info.value)
    assert not (tmp_path / "o").exists()


# ----- all or nothing -----
def test_a_failing_encoder_leaves_no_file_and_no_folder(source, qtbot, tmp_path, monkeypatch):
    original = encoders.Mp4Encoder.add
    calls = []

    def add(self, rgb, times=1):
        calls.append(times)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, rgb, times)

    monkeypatch.setattr(encoders.Mp4Encoder, "add", add)
    out = tmp_path / "made" / "here"
    paths = [out / "a.gif", out / "a.mp4"]
    with pytest.raises(ExportError, match="a.mp4: could not be written \\(No space left on device\\)"):
        write_animation(source, "chart", paths, AnimationSpec(1, CACHED_STEPS, width=320))
    assert not (tmp_path / "made").exists()


def test_an_interrupt_midway_leaves_nothing_and_old_files_stay(source, qtbot, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    old = out / "a.gif"
    old.write_bytes(b"old")

    def interrupt(done: int, total: int) -> None:
        if done == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_animation(source, "grid", [old, out / "a.mp4"], AnimationSpec(1, CACHED_STEPS, width=320), interrupt)
    assert sorted(p.name for p in out.iterdir()) == ["a.gif"] and old.read_bytes() == b"old"


def test_a_failing_gif_removes_the_finished_mp4(source, qtbot, tmp_path, monkeypatch):
    def fail(self, durations_ms):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(encoders.GifFrames, "encode", fail)
    out = tmp_path / "out"
    with pytest.raises(ExportError, match="a.gif: could not be written \\(Input/output error\\)"):
        write_animation(source, "chart", [out / "a.gif", out / "a.mp4"], AnimationSpec(1, 2, width=320))
    assert not out.exists()


def test_progress_goes_to_a_terminal_only():
    class Stream:
        def __init__(self, tty: bool) -> None:
            self.tty, self.text = tty, ""

        def isatty(self) -> bool:
            return self.tty

        def write(self, text: str) -> None:
            self.text += text

        def flush(self) -> None:
            pass

    assert terminal_progress(Stream(False)) is None
    terminal = Stream(True)
    report = terminal_progress(terminal)
    for done in (1, 2, 3):
        report(done, 3)
    assert terminal.text == "\rkvviz: frame 1/3\rkvviz: frame 2/3\rkvviz: frame 3/3\r\x1b[K"


# ----- frames readable from the back of a hall -----
INSTRUCTION = re.compile(r"\bpress|\bSpace\b|Page ?(Down|Up)|PgDn|Ctrl\+|\bclick", re.IGNORECASE)


def test_a_view_frame_gives_the_chart_a_fifth_of_its_height_and_large_text(source, qtbot):
    """A 1280-wide frame of the whole view: the chart's plot at least a fifth of the frame's height (it was
    about 60 pixels), every text at least 2 % of the height (tick labels were about 1 %), no key to press,
    and the caption names the precision."""
    from helpers_text import TextRecorder
    from PySide6.QtCore import QPoint

    from kvviz.app.export.animation import _Frames
    from kvviz.app.export.render import Page, paint_scaled

    spec = AnimationSpec(1, CACHED_STEPS)
    frames = _Frames(AnimationSource(source.plan, source.records, "bfloat16"), "view", spec)
    try:
        frames.rgb(1)  # the frame before the second pass, which says the most about the run still to come
        view, caption = frames.widget, frames.caption(1)
        assert "tiny (bfloat16), step 1" in caption
        page = Page(view, caption)
        scale = spec.width / page.width
        chart = view.chart.layout_widget
        box = view.chart.work_plot.getViewBox()
        plot = chart.mapFromScene(box.sceneBoundingRect()).boundingRect()
        top = chart.viewport().mapTo(view, QPoint(0, plot.top())).y()
        assert top > view.grid.geometry().bottom()  # below the grid, as the app shows it
        assert plot.height() * scale >= 0.2 * frames.height, (plot.height() * scale, frames.height)
        recorder = TextRecorder(spec.width, frames.height)
        paint_scaled(recorder, page, scale)
        texts = recorder.texts
        assert len(texts) > 20 and any(t.text == "K/V computations" for t in texts)
        small = [(t.text, round(t.pixels, 1)) for t in texts if t.pixels < 0.02 * frames.height]
        assert not small, small[:8]
        assert not [t.text for t in texts if INSTRUCTION.search(t.text)]
    finally:
        frames.close()


# ----- the export dialog -----
@pytest.fixture
def dialog_for(qtbot, tmp_path, source):
    from kvviz.app.settings import app_settings

    settings = app_settings()
    settings.setValue("export/folder", str(tmp_path))

    def make(animation=source) -> ExportDialog:
        chart = WorkChart()
        qtbot.addWidget(chart)
        chart.resize(600, 400)
        dialog = ExportDialog({"chart": chart, "grid": chart, "view": chart}, "caption", step=CACHED_STEPS,
                              animation=animation)
        qtbot.addWidget(dialog)
        dialog.show()
        qtbot.waitExposed(dialog)
        return dialog

    return make


def test_dialog_writes_the_same_animation_as_the_command(dialog_for, source, qtbot, tmp_path, monkeypatch):
    monkeypatch.setattr(QMessageBox, "warning", lambda *args: pytest.fail(f"message box: {args[2]}"))
    dialog = dialog_for()
    dialog.format_box.setCurrentIndex(dialog.format_box.findData("gif"))
    assert dialog.animating() and dialog.width_box.value() == 1280 and dialog.width_box.isEnabled()
    assert dialog.target() == "chart" and dialog.path() == tmp_path / f"kvviz-chart-steps1-{CACHED_STEPS}.gif"
    rows = dialog.animation_rows
    assert (rows.first_box.maximum(), rows.last_box.value()) == (CACHED_STEPS, CACHED_STEPS)
    rows.first_box.setValue(2)
    rows.fps_box.setValue(4)
    dialog.width_box.setValue(480)
    assert dialog.path().name == f"kvviz-chart-steps2-{CACHED_STEPS}.gif"
    assert "8 frames" in dialog.size_label.text()
    dialog.save_button.click()
    assert dialog.written == tmp_path / f"kvviz-chart-steps2-{CACHED_STEPS}.gif"
    headless = write_animation(source, "chart", [tmp_path / "headless" / "same.gif"],
                               AnimationSpec(2, CACHED_STEPS, fps=4, width=480))[0]
    assert dialog.written.read_bytes() == headless.read_bytes()  # the same frames, the same file
    again = dialog_for()
    assert again.image_format() == "gif" and again.animation_rows.fps_box.value() == 4  # remembered
    again.format_box.setCurrentIndex(again.format_box.findData("png"))
    assert again.width_box.value() == 1920 and not again.animation_rows.fps_box.isVisibleTo(again)


def test_dialog_cancel_leaves_no_file(dialog_for, qtbot, tmp_path):
    dialog = dialog_for()
    dialog.format_box.setCurrentIndex(dialog.format_box.findData("mp4"))
    dialog.width_box.setValue(320)
    seen = []

    def cancel_at_two(progress, done, total):
        seen.append((done, total))
        if done == 2:
            progress.cancel()

    dialog.frame_done.connect(cancel_at_two)
    dialog.save_button.click()
    assert seen == [(1, CACHED_STEPS), (2, CACHED_STEPS)]
    assert dialog.written is None and dialog.isVisible()
    assert [p.name for p in tmp_path.iterdir() if p.suffix in (".mp4", ".tmp")] == []


def test_dialog_offers_animation_only_with_a_run(dialog_for):
    dialog = dialog_for(animation=None)
    item = dialog.format_box.model().item(dialog.format_box.findData("gif"))
    assert not item.flags() & Qt.ItemFlag.ItemIsEnabled
    assert not dialog.animation_rows.first_box.isVisibleTo(dialog)


# ----- the window: its records, the clipboard, the plots' menus -----
def test_window_copies_views_and_hands_its_records_to_the_dialog(qtbot, app_model, monkeypatch):
    import kvviz.app.export.window_export as export  # where File > Export... finds the dialog
    from kvviz.app.assembly import open_window
    from kvviz.app.settings import app_settings

    window = open_window(app_model, PROMPT, settings=app_settings())
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: window.session.plan is not None, timeout=60_000)
    for _ in range(3):
        qtbot.keyClick(window, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: len(window.session.records) == 3, timeout=60_000)
    window.redraw()

    QApplication.clipboard().clear()
    qtbot.keyClick(window, Qt.Key.Key_C, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    image = QApplication.clipboard().image()
    ratio = window.chart.devicePixelRatioF()
    assert not image.isNull()
    chart = window.chart
    assert (image.width(), image.height()) == (round(chart.width() * ratio), round(chart.height() * ratio))

    viewport = window.grid.plot_widget.viewport()
    spot = viewport.mapTo(window, viewport.rect().center())
    for action in (QTest.mousePress, QTest.mouseRelease):  # through the window system, as a real right-click
        action(window.windowHandle(), Qt.MouseButton.RightButton, Qt.KeyboardModifier.NoModifier, spot)
    qtbot.waitUntil(lambda: window.copier.menu is not None and window.copier.menu.isVisible(), timeout=5000)
    menu = window.copier.menu
    assert isinstance(menu, QMenu) and menu.isVisible()
    assert [a.text() for a in menu.actions()] == ["Copy image", "Export view\u2026"]
    QApplication.clipboard().clear()
    menu.actions()[0].trigger()
    menu.close()
    grid = QApplication.clipboard().image()
    assert (grid.width(), grid.height()) == (round(window.grid.width() * ratio), round(window.grid.height() * ratio))

    opened = []
    monkeypatch.setattr(export, "ExportDialog", lambda *args, **kwargs: opened.append(kwargs["animation"]) or
                        type("Closed", (), {"exec": lambda self: 0})())
    qtbot.keyClick(window, Qt.Key.Key_E, Qt.KeyboardModifier.ControlModifier)
    assert opened[0].plan is window.session.plan and opened[0].records == tuple(window.session.records)
    assert [r.new_tokens for r in opened[0].records] == [1, 2, 3]
    window.close()
