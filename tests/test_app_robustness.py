"""The app under hostile use: model switches mid-run, absurd and malicious settings files, Ctrl+C in
the terminal, stale status text, names in the picker, a crowded token strip, no display."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers_process import ForkServer, command_preloads
from helpers_qt import download_until_cancelled
from PySide6.QtCore import QByteArray, Qt
from PySide6.QtGui import QTextDocument
from PySide6.QtWidgets import QMessageBox

from kvviz.app.assembly import open_window
from kvviz.app.settings import AppSettings, SettingsFile, app_settings, load_geometry, save_geometry

PROMPT = "Time flies fast"  # 3 GPT-2 tokens
REPO = Path(__file__).resolve().parents[1]


def tiny_checkpoint(folder: Path, n_layer: int = 2) -> Path:
    """A random 2-layer model saved with kvviz.sources.weights.save_checkpoint; returns its model.safetensors."""
    import torch

    from kvviz.models.gpt2 import GPT, GPTConfig
    from kvviz.sources.weights import save_checkpoint

    model = GPT(GPTConfig(n_ctx=64, n_layer=n_layer, n_head=2, n_embd=32, name="tiny"))
    model.init_weights(torch.Generator().manual_seed(1))
    save_checkpoint(model, folder)
    return folder / "model.safetensors"


def press(qtbot, win, key, times: int = 1) -> None:
    for _ in range(times):
        qtbot.keyClick(win, key)


def wait_tokens(qtbot, win, n: int) -> None:
    qtbot.waitUntil(lambda: win.session.last_record is not None and win.session.last_record.new_tokens == n,
                    timeout=60_000)


# ----- 1. a model chosen in the middle of a run -----
def step_once(qtbot, win, failures: list[str]) -> int:
    """Press Space; the new token count once its record is in, or the failure's sentence."""
    before = win.session.steps_done
    press(qtbot, win, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: bool(failures) or win.session.steps_done == before + 1, timeout=30_000)
    assert failures == []
    return win.session.steps_done


@pytest.mark.parametrize("state", ["paused", "playing"])
@pytest.mark.parametrize("how", ["picker", "checkpoint_file"])
def test_model_chosen_mid_run_steps_and_resets(qtbot, window, tmp_path, how, state):
    """Space twice, then another model (Model list or Ctrl+O), paused or playing: the next Step runs
    on the new model, and so does Reset. (The engine's inference mode leaked out of a run between
    its records, so the next model loaded as inference tensors and its first step failed.)"""
    failures: list[str] = []
    window.session.run_failed.connect(failures.append)
    assert [step_once(qtbot, window, failures) for _ in range(2)] == [1, 2]
    if state == "playing":
        window.controls.speed_slider.setValue(0)  # 0.5 tokens a second
        with qtbot.waitSignal(window.session.playing_changed, timeout=10_000):
            press(qtbot, window, Qt.Key.Key_P)
        assert window.session.playing
    if how == "picker":
        new_name = "random:kvviz-shakespeare"
        window.picker.activated.emit(window.picker.findData(new_name))
    else:
        new_name = "switched"
        window.load_model(str(tiny_checkpoint(tmp_path / new_name)))
    qtbot.waitUntil(lambda: window.session.plan is not None and window.session.plan.model_name == new_name,
                    timeout=60_000)
    assert window.session.model_info.name == new_name and not window.session.playing
    assert window.session.steps_done == 0
    assert [step_once(qtbot, window, failures) for _ in range(2)] == [1, 2]
    # Loaded outside inference mode: the new model's weights are ordinary tensors (the worker is idle now).
    model = window.session.controller.worker.loaded_model.model
    assert [name for name, w in model.named_parameters() if w.is_inference()] == []
    with qtbot.waitSignal(window.run_prepared, timeout=10_000) as prepared:
        press(qtbot, window, Qt.Key.Key_R)
    assert prepared.args[0].model_name == new_name and window.session.steps_done == 0
    assert step_once(qtbot, window, failures) == 1
    assert not window.banner.alert


# ----- 2. the settings file: absurd values, the wrong types, files that are not settings -----
def write_settings(folder: Path, data: bytes) -> Path:
    """The user's settings file, as app_settings() finds it under the isolated settings folder."""
    path = folder / "kvviz.json"
    path.write_bytes(data)
    return path


def test_window_starts_with_absurd_settings_and_shows_them_clamped(qtbot, app_model, _isolated_qt_settings):
    write_settings(_isolated_qt_settings, b'{"run/prompt": "Time flies fast", "run/max_new_tokens": 99999999999, '
                                          b'"run/top_k": 1e400, "run/temperature": NaN, "run/seed": -5, '
                                          b'"run/use_cache": "maybe", "view/zoom": null, "view/speed_index": 99, '
                                          b'"view/colour_blind": 2}')
    win = open_window(app_model, None, settings=app_settings())
    qtbot.addWidget(win)
    c = win.controls
    assert c.prompt_edit.text() == "Time flies fast"
    assert (c.max_new_spin.value(), c.top_k_spin.value(), c.temperature_spin.value(), c.seed_spin.value()) == (
        4096, 0, 0.0, 0)
    assert c.cache_check.isChecked() and c.speed_slider.value() == 6 and c.speed_label.text() == "max"
    assert win.presentation.zoom == 1.0 and not win.actions["colour_blind"].isChecked()
    win.show()
    qtbot.waitUntil(lambda: win.session.plan is not None, timeout=60_000)
    assert win.session.plan.max_new_tokens == 4096 and win.session.plan.stop_reason == "context_full"
    win.close()


NOT_SETTINGS = {
    "garbage": b"\xff\xfe not JSON at all \x00\x01",
    "a list": b"[1, 2, 3]",
    "a string": b'"run/seed"',
    "deeply nested": b'{"run/seed": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "truncated": b'{"run/seed": 4, "run/prompt": "Once',
    "too large": b'{"run/prompt": "' + b"x" * (2 << 20) + b'"}',
    "a number of 5000 digits": b'{"run/seed": ' + b"9" * 5000 + b"}",  # past Python's limit for int()
    "objects for values": b'{"run/seed": {"__reduce__": "os.system"}, "run/prompt": ["a"], "window/geometry": 7}',
}


@pytest.mark.parametrize("data", NOT_SETTINGS.values(), ids=NOT_SETTINGS.keys())
def test_a_file_that_is_not_settings_starts_the_app_with_defaults_and_is_rewritten(qtbot, app_model,
                                                                                   _isolated_qt_settings, data):
    path = write_settings(_isolated_qt_settings, data)
    win = open_window(app_model, None, settings=app_settings())
    qtbot.addWidget(win)
    assert AppSettings.load(app_settings()) == AppSettings() or data.startswith(b"{")
    assert win.controls.seed_spin.value() == 0 and win.controls.prompt_edit.text() == AppSettings().prompt
    win.show()
    qtbot.waitUntil(lambda: win.session.plan is not None, timeout=60_000)
    win.close()
    saved = json.loads(path.read_text(encoding="utf-8"))
    assert saved["run/prompt"] == AppSettings().prompt and isinstance(saved["window/geometry"], str)


def test_a_settings_path_that_cannot_be_written_leaves_the_app_working(qtbot, app_model, _isolated_qt_settings):
    (_isolated_qt_settings / "kvviz.json").mkdir()  # taken by a folder: nothing can be read or written there
    win = open_window(app_model, "Time flies", settings=app_settings())
    qtbot.addWidget(win)
    win.show()
    qtbot.waitUntil(lambda: win.session.plan is not None, timeout=60_000)
    win.close()
    assert list((_isolated_qt_settings / "kvviz.json").iterdir()) == []
    assert [p.name for p in _isolated_qt_settings.iterdir()] == ["kvviz.json"]  # and no temporary file


def test_window_geometry_survives_every_byte(qtbot, tmp_path):
    store = SettingsFile(tmp_path / "kvviz.json")
    every_byte = bytes(range(256)) + b"0a,;=\"\\ \t)("
    save_geometry(store, QByteArray(every_byte))
    assert bytes(load_geometry(SettingsFile(tmp_path / "kvviz.json")).data()) == every_byte
    (tmp_path / "kvviz.json").write_text('{"window/geometry": "not base64 !"}', encoding="utf-8")
    assert load_geometry(SettingsFile(tmp_path / "kvviz.json")) is None


PROMPTS = ["@start", "@@two", "@Variant(1)", " leading and trailing ", "a, b, c", 'say "hi"', "back\\slash",
           "tab\there", "semi;colon=equals", "line\nbreak", "ünïcödé \u2014 \U0001f600", "\\x40", "[run]", "",
           "\ud800 lone surrogate"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_prompts_of_every_shape_come_back_as_typed(qtbot, tmp_path, prompt):
    store = SettingsFile(tmp_path / "kvviz.json")
    AppSettings(prompt=prompt, model_source=prompt).save(store)
    again = AppSettings.load(SettingsFile(tmp_path / "kvviz.json"))
    assert (again.prompt, again.model_source) == (prompt, prompt)


@pytest.mark.parametrize(("text", "expected"), [
    (b'{"run/max_new_tokens": 0, "run/seed": 2147483648, "run/temperature": -1, "run/top_k": 50258}',
     {"max_new_tokens": 1, "seed": 2**31 - 1, "temperature": 0.0, "top_k": 50257}),
    (b'{"run/max_new_tokens": 7.0, "run/temperature": Infinity, "run/seed": "16", "run/top_k": 4.5, '
     b'"run/use_cache": false}',
     {"max_new_tokens": 7, "temperature": 0.0, "seed": 0, "top_k": 0, "use_cache": False}),
    (b'{"run/max_new_tokens": ' + b"9" * 400 + b', "run/use_cache": null, "view/zoom": 1e-300, '
     b'"view/speed_index": -3}',
     {"max_new_tokens": 4096, "use_cache": True, "zoom": 0.7, "speed_index": 0}),
    (b'{"run/max_new_tokens": [5, 6], "run/prompt": {"x": 1}, "view/zoom": true, "view/colour_blind": true}',
     {"max_new_tokens": 12, "prompt": "To be, or not to be", "zoom": 1.0, "colour_blind": True}),
    (b'{"run/max_new_tokens": 8, "run/max_new_tokens": 9, "run/seed": 1, "run/seed": 0.5}',  # repeated keys
     {"max_new_tokens": 9, "seed": 0}),
])
def test_every_key_takes_hostile_values(qtbot, tmp_path, text, expected):
    (tmp_path / "kvviz.json").write_bytes(text)
    settings = AppSettings.load(SettingsFile(tmp_path / "kvviz.json"))
    assert {k: getattr(settings, k) for k in expected} == expected


def test_two_windows_sharing_a_home_keep_each_others_keys(qtbot, tmp_path):
    first, second = SettingsFile(tmp_path / "kvviz.json"), SettingsFile(tmp_path / "kvviz.json")
    first.setValue("export/width", 640)
    first.sync()
    AppSettings(prompt="ROMEO:").save(second)  # read before the first wrote, written after
    saved = json.loads((tmp_path / "kvviz.json").read_text(encoding="utf-8"))
    assert saved["export/width"] == 640 and saved["run/prompt"] == "ROMEO:"


# ----- 3. Ctrl+C in the terminal -----
# `python -m kvviz` as it starts, plus a probe: once the first run is prepared it says so on stderr
# (and with "play", first starts autoplay at full speed and waits for two tokens).
LAUNCHER = """
import sys
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

app = QApplication(sys.argv[:1])
play = sys.argv.pop(1) == "play"

started = []

def probe():
    for window in app.topLevelWidgets():
        session = getattr(window, "session", None)
        if session is None or session.plan is None:
            continue
        if play and not started:  # once: a second toggle before the first took effect would pause it again
            started.append(True)
            window.controls.max_new_spin.setValue(60)
            window.controls.speed_slider.setValue(window.controls.speed_slider.maximum())
            QTimer.singleShot(200, window.toggle_play)
        elif not play or session.steps_done >= 2:
            print("probe: ready", file=sys.stderr, flush=True)
            return
    QTimer.singleShot(100, probe)

QTimer.singleShot(100, probe)
from kvviz.cli.commands import main
sys.exit(main(sys.argv[1:]))
"""


def gui_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env.update(QT_QPA_PLATFORM="offscreen", XDG_CONFIG_HOME=str(tmp_path / "config"), HOME=str(tmp_path),
               PYTHONPATH=str(REPO))
    return env


@pytest.fixture(scope="module")
def app_fork_server(tmp_path_factory):
    """The app's processes, forked from one that has imported what the app imports (see ForkServer)."""
    server = ForkServer(gui_env(tmp_path_factory.mktemp("fork-server")),
                        preload=[*command_preloads(), "PySide6.QtWidgets", "pyqtgraph", "kvviz.app.assembly"])
    yield server
    server.close()


@pytest.mark.parametrize(("state", "signum"), [("idle", signal.SIGINT), ("play", signal.SIGINT),
                                               ("play", signal.SIGTERM), ("idle", signal.SIGHUP)],
                         ids=["ctrl-c-idle", "ctrl-c-playing", "sigterm-playing", "sighup-idle"])
def test_a_stop_signal_quits_like_ctrl_q(tmp_path, app_model, app_fork_server, state, signum):
    args = [state, "--prompt", "Stop test"]
    if app_model is not None:
        args += ["--model", app_model]
    proc = app_fork_server.start(args, tmp_path, stdout="null", code=LAUNCHER, env=gui_env(tmp_path))
    said = io.TextIOWrapper(proc.stderr, encoding="utf-8", errors="backslashreplace")
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in said:
            lines.append(line)
            if line.startswith("probe: ready"):
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(120), "".join(lines)
        proc.send_signal(signum)
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    said.close()
    stderr = "".join(lines)
    assert code == 0, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    saved = json.loads((tmp_path / "config" / "kvviz" / "kvviz.json").read_text(encoding="utf-8"))
    assert saved["run/prompt"] == "Stop test" and isinstance(saved["window/geometry"], str)


# ----- 6. no display -----
def _no_display_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    env.update(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "config"), PYTHONPATH=str(REPO), **extra)
    return env


NO_DISPLAY_LINE = ("kvviz: no display to show the window on; set DISPLAY, or QT_QPA_PLATFORM=offscreen "
                   "for a window nobody sees\n")


@pytest.mark.skipif(os.name != "posix" or sys.platform == "darwin", reason="X11 and Wayland systems")
@pytest.mark.parametrize("extra", [{}, {"QT_QPA_PLATFORM": "xcb"}])
def test_without_a_display_kvviz_says_so_in_one_line(tmp_path, extra):
    result = subprocess.run([sys.executable, "-m", "kvviz"], env=_no_display_env(tmp_path, **extra),
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert (result.returncode, result.stderr, result.stdout) == (2, NO_DISPLAY_LINE, "")


@pytest.mark.skipif(os.name != "posix" or sys.platform == "darwin", reason="X11 and Wayland systems")
def test_a_display_nobody_serves_is_one_line_too(tmp_path):
    """DISPLAY names a display that is not there: Qt's xcb plugin fails, and Qt would abort with
    seven lines (one of them a misleading hint about xcb-cursor)."""
    result = subprocess.run([sys.executable, "-m", "kvviz"], env=_no_display_env(tmp_path, DISPLAY=":31999"),
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("kvviz: the window cannot open ("), result.stderr
    assert "xcb-cursor" not in result.stderr


# ----- 4. the status line says what is true now -----
def test_reset_puts_the_status_back_to_zero(qtbot, window):
    press(qtbot, window, Qt.Key.Key_Space, 3)
    wait_tokens(qtbot, window, 3)
    window.redraw()
    assert "3/12 tokens \u00b7 step 3 took" in window.status.text()
    with qtbot.waitSignal(window.run_prepared, timeout=10_000):
        press(qtbot, window, Qt.Key.Key_R)
    window.redraw()
    assert window.status.text().endswith("0/12 tokens \u00b7 ready")
    press(qtbot, window, Qt.Key.Key_Space)
    wait_tokens(qtbot, window, 1)
    window.redraw()
    assert "1/12 tokens \u00b7 step 1 took" in window.status.text()


def broken_checkpoint(tmp_path: Path) -> Path:
    bad = tmp_path / "broken"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes(b"this is not a safetensors file")
    return bad


def test_a_failed_load_leaves_the_status_on_the_model_still_loaded(qtbot, window, tmp_path, monkeypatch):
    errors: list[str] = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text, *a, **k: errors.append(text))
    name = window.session.model_info.name
    press(qtbot, window, Qt.Key.Key_Space, 2)
    wait_tokens(qtbot, window, 2)
    said: list[str] = []
    window.session.model_loading.connect(lambda source: said.append(window.status.text()))
    window.load_model(str(broken_checkpoint(tmp_path)))
    qtbot.waitUntil(lambda: bool(errors), timeout=30_000)
    assert said == [f"Loading {tmp_path / 'broken'}\u2026"]
    window.redraw()
    assert "Loading" not in window.status.text() and window.status.text().startswith(name)
    assert "2/12 tokens" in window.status.text()  # the run goes on where it was
    press(qtbot, window, Qt.Key.Key_Space)
    wait_tokens(qtbot, window, 3)
    window.redraw()
    assert window.status.text().startswith(name) and "3/12 tokens \u00b7 step 3 took" in window.status.text()


def test_a_run_that_cannot_start_leaves_no_stale_progress(qtbot, window):
    press(qtbot, window, Qt.Key.Key_Space, 3)
    wait_tokens(qtbot, window, 3)
    window.redraw()
    n_ctx = window.session.model_info.n_ctx
    window.controls.prompt_edit.setText(" x" * (n_ctx + 5))  # longer than the context: the run cannot start
    with qtbot.waitSignal(window.session.run_failed, timeout=10_000):
        window.reset_run()
    window.redraw()
    assert "3/12" not in window.status.text() and "took" not in window.status.text()
    assert window.status.text().startswith(window.session.model_info.name)


def test_a_prompt_longer_than_qts_default_field_arrives_whole(qtbot, window):
    prompt = " x" * 19_999 + "!"  # 39,999 characters: QLineEdit keeps 32,767 unless told otherwise
    window.controls.prompt_edit.setText(prompt)
    assert window.controls.prompt_edit.text() == prompt
    with qtbot.waitSignal(window.session.run_failed, timeout=10_000) as failed:
        window.reset_run()
    assert f"the prompt has {19_999 + 1} tokens" in failed.args[0].lower()  # " x" is one GPT-2 token, "!" one


def test_zoom_and_presenter_round_trips_leave_no_object_behind(qtbot, window):
    from collections import Counter

    from PySide6.QtCore import QObject, QPropertyAnimation

    presentation = window.presentation

    def objects() -> Counter:
        qtbot.waitUntil(lambda: not window.findChildren(QPropertyAnimation), timeout=5_000)  # Qt's bar animations
        return Counter(type(o).__name__ for o in window.findChildren(QObject))

    def round_trips(times: int) -> None:
        for _ in range(times):
            presentation.step_zoom(+1)
            presentation.step_zoom(-1)
            presentation.set_presenter(True)
            presentation.set_presenter(False)
            qtbot.wait_until(lambda: not presentation.presenter and presentation.zoom == 1.0)

    round_trips(1)
    before = objects()
    round_trips(5)
    after = objects()
    assert {name: after[name] - before[name] for name in after if after[name] != before[name]} == {}


# ----- 5. words and room -----
def test_a_checkpoint_file_shows_in_the_picker_by_its_model_name(qtbot, window, tmp_path):
    file = tiny_checkpoint(tmp_path / "hamlet")
    window.load_model(str(file))
    qtbot.waitUntil(lambda: window.session.source == str(file) and not window.session.loading, timeout=60_000)
    assert window.picker.currentText() == "hamlet" and window.picker.currentData() == str(file)
    tiny_checkpoint(tmp_path / "ophelia")
    window.load_model(str(tmp_path / "ophelia"))  # a folder: its name
    qtbot.waitUntil(lambda: window.session.source == str(tmp_path / "ophelia") and not window.session.loading,
                    timeout=60_000)
    assert window.picker.currentText() == "ophelia"
    names = [window.picker.itemText(i) for i in range(window.picker.count())]
    assert "hamlet" in names and "model.safetensors" not in names


def test_earlier_tokens_label_never_covers_a_chip(qtbot):
    from kvviz.app.views.token_strip import TokenStrip
    from kvviz.core.records import RunPlan

    strip = TokenStrip()
    qtbot.addWidget(strip)
    strip.resize(260, strip.sizeHint().height())
    labels = tuple(f"w{i}" for i in range(300))
    strip.reset(RunPlan(prompt="", prompt_ids=(1,) * 300, prompt_labels=labels, model_name="m", n_layer=1,
                        n_ctx=1024, use_cache=True, max_new_tokens=1, budget=1, passes=2, width=301,
                        final_with_cache=301, final_without_cache=300, cache_bytes_per_position=0,
                        stop_reason="max_new_tokens", sampling="greedy"))
    layout = strip.chip_layout()
    assert layout.label is not None and layout.hidden + len(layout.chips) == 300
    assert [i for i, _rect in layout.chips] == list(range(layout.hidden, 300))  # the newest, in order
    assert all(not rect.intersects(layout.label) and rect.left() >= layout.label.right() for _i, rect in layout.chips)
    text_width = strip._metrics.horizontalAdvance(f"+{layout.hidden} earlier")
    assert text_width <= layout.label.width()
    assert strip.grab().width() == 260  # and it paints


def test_strip_layout_leaves_no_margin_when_everything_fits():
    from kvviz.app.views.token_strip import layout_strip

    layout = layout_strip([30.0] * 4, 400.0, 20.0, 28.0, lambda n: 80.0)
    assert layout.label is None and layout.hidden == 0
    assert [(i, rect.left(), rect.top()) for i, rect in layout.chips] == [(0, 8.0, 4.0), (1, 46.0, 4.0),
                                                                           (2, 84.0, 4.0), (3, 122.0, 4.0)]
    crowded = layout_strip([30.0] * 40, 200.0, 20.0, 28.0, lambda n: 80.0)
    # 200 wide, rows from 8 + 80 + 8 = 96 to 192: two 30-wide chips a row, the newest two rows shown
    assert crowded.hidden == 36 and crowded.label.getRect() == (8.0, 4.0, 80.0, 20.0)
    assert [(i, rect.left(), rect.top()) for i, rect in crowded.chips] == [
        (36, 96.0, 4.0), (37, 134.0, 4.0), (38, 96.0, 32.0), (39, 134.0, 32.0)]


# ----- model switches during loads and downloads -----
def test_a_setting_changed_during_a_failed_load_still_applies(qtbot, window, tmp_path, monkeypatch):
    """C (cache off) while a model loads: the load fails, and the run restarts without the cache,
    replayed to where it was, as it would have without the load (not left with the cache on while
    the checkbox says off)."""
    monkeypatch.setattr(QMessageBox, "critical", lambda *a, **k: None)
    press(qtbot, window, Qt.Key.Key_Space, 2)
    wait_tokens(qtbot, window, 2)
    with qtbot.waitSignal(window.session.model_load_failed, timeout=30_000):
        window.load_model(str(broken_checkpoint(tmp_path)))
        assert window.session.loading
        press(qtbot, window, Qt.Key.Key_C)
    qtbot.waitUntil(lambda: window.session.plan is not None and not window.session.plan.use_cache
                    and window.session.steps_done == 2, timeout=30_000)
    assert not window.controls.cache_check.isChecked()


def test_ctrl_o_during_a_download_then_cancel_loads_the_checkpoint(qtbot, window, tmp_path, monkeypatch):
    import kvviz.sources.weights

    monkeypatch.setattr(kvviz.sources.weights, "download_hub_model", download_until_cancelled(lambda: window))
    errors: list[str] = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text, *a, **k: errors.append(text))
    press(qtbot, window, Qt.Key.Key_Space, 2)
    wait_tokens(qtbot, window, 2)
    window.picker.activated.emit(window.picker.findData("gpt2"))
    qtbot.waitUntil(lambda: window.loading.cancel_button.isVisible() and window.loading.progress_bar.maximum() == 1000,
                    timeout=30_000)
    file = tiny_checkpoint(tmp_path / "queued")
    window.load_model(str(file))  # Ctrl+O while the download runs: queued behind it
    window.loading.cancel_button.click()
    qtbot.waitUntil(lambda: window.session.source == str(file) and window.session.plan is not None
                    and window.session.plan.model_name == "queued", timeout=60_000)
    window.redraw()
    assert not window.loading.cancel_button.isVisible() and not window.loading.progress_bar.isVisible()
    assert window.picker.currentText() == "queued" and window.picker.isEnabled()
    assert window.status.text().startswith("queued \u00b7") and "0/12 tokens" in window.status.text()
    assert errors == [] and not window.banner.isVisible()
    assert step_once(qtbot, window, []) == 1


def test_a_cancelled_download_mid_run_leaves_the_run_going(qtbot, window, monkeypatch):
    import kvviz.sources.weights

    monkeypatch.setattr(kvviz.sources.weights, "download_hub_model", download_until_cancelled(lambda: window))
    press(qtbot, window, Qt.Key.Key_Space, 2)
    wait_tokens(qtbot, window, 2)
    name = window.session.model_info.name
    window.picker.activated.emit(window.picker.findData("gpt2-medium"))
    qtbot.waitUntil(lambda: window.loading.progress_bar.maximum() == 1000, timeout=30_000)
    with qtbot.waitSignal(window.session.model_load_cancelled, timeout=10_000):
        window.loading.cancel_button.click()
    assert window.status.text() == f"Download of gpt2-medium cancelled; kept {name}"
    assert window.picker.currentText().startswith(name)
    press(qtbot, window, Qt.Key.Key_Space)
    wait_tokens(qtbot, window, 3)
    window.redraw()
    assert window.status.text().startswith(name) and "3/12 tokens" in window.status.text()


def test_error_sentences_end_with_one_full_stop():
    from kvviz.app.run.worker_failures import describe_load_error, describe_run_error

    assert describe_run_error("m", RuntimeError("Inference tensors do not track version counter.")) == (
        "Generation with m stopped: Inference tensors do not track version counter.")
    assert describe_run_error("m", ValueError("bad shape")) == "Generation with m stopped: bad shape."
    assert describe_load_error("x.pt", OSError("Is a directory.")) == "Could not load x.pt: Is a directory."


@pytest.mark.parametrize(("environ", "platform", "missing"), [
    ({}, "linux", True),
    ({"DISPLAY": ":0"}, "linux", False),
    ({"WAYLAND_DISPLAY": "wayland-0"}, "linux", False),
    ({"QT_QPA_PLATFORM": "xcb"}, "linux", True),
    ({"QT_QPA_PLATFORM": "xcb:foo=1"}, "freebsd14", True),
    ({"QT_QPA_PLATFORM": "xcb;offscreen"}, "linux", False),
    ({"QT_QPA_PLATFORM": "offscreen"}, "linux", False),
    ({"QT_QPA_PLATFORM": "wayland"}, "linux", False),  # Qt finds its default socket itself
    ({}, "darwin", False),
])
def test_which_environments_have_no_display(environ, platform, missing):
    from kvviz.app import missing_display

    expected = NO_DISPLAY_LINE.removeprefix("kvviz: ").rstrip("\n") if missing else None
    assert missing_display(environ, platform) == expected


def test_about_shows_a_model_named_like_markup_as_typed(qtbot):
    from kvviz.app.window.dialogs import AboutDialog
    from kvviz.core.records import ModelInfo

    info = ModelInfo(name="<b>bold</b> & co", source="/tmp/<i>x</i>", num_parameters=1000, n_layer=1, n_head=1,
                     n_embd=8, n_ctx=16)
    dialog = AboutDialog(info)
    qtbot.addWidget(dialog)
    document = QTextDocument()
    document.setHtml(dialog.label.text())
    assert "Model: <b>bold</b> & co" in document.toPlainText() and "Source: /tmp/<i>x</i>" in document.toPlainText()


def test_a_bug_in_a_run_is_one_sentence_in_the_window_and_its_traceback_in_the_log(qtbot, window, tmp_path,
                                                                                    monkeypatch):
    """An error the user cannot fix: the window says one sentence, the log file keeps the traceback; an exception
    no slot caught on the GUI thread gets a dialog naming the log, and the window goes on."""
    from PySide6.QtWidgets import QMessageBox

    import kvviz.engine.run as run
    from kvviz.app import report_unexpected

    log = tmp_path / "kvviz.log"
    monkeypatch.setenv("KVVIZ_LOG", str(log))
    qtbot.waitUntil(lambda: window.session.can_step, timeout=60_000)
    monkeypatch.setattr(run.Run, "next_token_step", lambda self: {}["no such key"])
    with qtbot.waitSignal(window.session.run_failed, timeout=30_000) as failed:
        window.session.step()
    assert failed.args[0].endswith("stopped: 'no such key'.") and len(failed.args[0].splitlines()) == 1
    assert "KeyError: 'no such key'" in log.read_text(encoding="utf-8")
    said = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text: said.append(text))
    try:
        raise RuntimeError("a slot went wrong")
    except RuntimeError as exc:
        report_unexpected(window, exc)
    assert said == [f"kvviz hit an unexpected error: a slot went wrong. The details are in {log}."]
    assert "RuntimeError: a slot went wrong" in log.read_text(encoding="utf-8")
