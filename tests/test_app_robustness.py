"""The app under hostile use: model switches mid-run, absurd and malicious settings files, Ctrl+C in
the terminal, stale status text, names in the picker, a crowded token strip, no display."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from PySide6.QtCore import QByteArray, QSettings, Qt
from PySide6.QtGui import QTextDocument
from PySide6.QtWidgets import QMessageBox

from kvviz.app.ini_file import plain_values
from kvviz.app.settings import AppSettings, app_settings, load_geometry, save_geometry
from kvviz.app.window.main_window import MainWindow

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


# ----- 2. the settings file: absurd values, and objects that QSettings would unpickle -----
def write_ini(folder: Path, data: bytes) -> Path:
    """The user's settings file, as app_settings() finds it under the isolated settings folder."""
    path = folder / "kvviz" / "kvviz.ini"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_window_starts_with_absurd_settings_and_shows_them_clamped(qtbot, app_model, _isolated_qt_settings):
    write_ini(_isolated_qt_settings, b"[run]\nprompt=Time flies fast\nmax_new_tokens=99999999999\ntop_k=1e400\n"
                                     b"temperature=nan\nseed=-5\nuse_cache=maybe\n"
                                     b"[view]\nzoom=nan\nspeed_index=99\ncolour_blind=2\n")
    win = MainWindow(app_model, None, settings=app_settings())
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


class _Touch:
    """Unpickling this creates `path`: the proof that a settings value was unpickled."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def pickled_value(scratch: Path, marker: Path) -> bytes:
    """A value as QSettings writes a Python object into an INI file: `@Variant(...)` around a pickle."""
    store = QSettings(str(scratch), QSettings.Format.IniFormat)
    store.setValue("x/y", _Touch(marker))
    store.sync()
    value = next(line for line in scratch.read_bytes().splitlines() if line.startswith(b"y="))[2:]
    assert value.startswith(b"@Variant(") and b"touch" in value
    return value


def test_a_pickled_setting_is_never_unpickled(qtbot, app_model, tmp_path, _isolated_qt_settings):
    marker = tmp_path / "unpickled"
    evil = pickled_value(tmp_path / "scratch.ini", marker)
    ini = write_ini(_isolated_qt_settings, b"[run]\ntop_k=" + evil + b"\nmax_new_tokens=7\nprompt=Once upon\n"
                                           b"[view]\nzoom=" + evil + b"\n[window]\ngeometry=" + evil +
                                           b"\n[export]\nfolder=" + evil + b"\n[elsewhere]\nx=" + evil + b"\n")
    live = tmp_path / "live.ini"
    live.write_bytes(ini.read_bytes())
    QSettings(str(live), QSettings.Format.IniFormat).value("run/prompt")  # QSettings itself unpickles it
    assert marker.exists()
    marker.unlink()

    win = MainWindow(app_model, None, settings=app_settings())
    qtbot.addWidget(win)
    win.show()
    qtbot.waitUntil(lambda: win.session.plan is not None, timeout=60_000)
    assert win.controls.top_k_spin.value() == 0 and win.controls.max_new_spin.value() == 7
    assert win.controls.prompt_edit.text() == "Once upon" and win.presentation.zoom == 1.0
    win.close()  # saves the settings through QSettings, which parses the whole file first
    assert not marker.exists()
    saved = ini.read_bytes()
    assert b"@Variant" not in saved and b"max_new_tokens=7" in saved and b"geometry=@ByteArray(" in saved
    again = QSettings(str(ini), QSettings.Format.IniFormat)
    for key in again.allKeys():
        again.value(key)
    assert not marker.exists()


def _hex(text: bytes) -> bytes:
    return b"".join(b"\\x%x" % c for c in text)


# Ways to write a value that QSettings reads as "@Variant(" + payload: escapes, quotes, a list,
# a continued line, a byte-order mark, a comment, any section.
DISGUISES = {
    "as_written": lambda p: b"[run]\ntop_k=@Variant(" + p + b"\n",
    "hex_escape": lambda p: b"[run]\ntop_k=\\x40Variant(" + p + b"\n",
    "octal_escape": lambda p: b"[run]\ntop_k=\\100Variant(" + p + b"\n",
    "escape_past_16_bits": lambda p: b"[run]\ntop_k=\\x10040Variant(" + p + b"\n",
    "all_escaped": lambda p: b"[run]\ntop_k=" + _hex(b"@Variant(") + p + b"\n",
    "quoted": lambda p: b'[run]\ntop_k="@Variant(' + p + b'"\n',
    "after_empty_quotes": lambda p: b'[run]\ntop_k=  ""  @Variant(' + p + b"\n",
    "in_a_list": lambda p: b"[run]\ntop_k=a, @Variant(" + p + b"\n",
    "continued_line": lambda p: b"[run]\ntop_k=@Vari\\\nant(" + p + b"\n",
    "crlf_continued_line": lambda p: b"[run]\r\ntop_k=@Vari\\\r\nant(" + p + b"\r\n",
    "other_section": lambda p: b"[zzz]\nx=@Variant(" + p + b"\n[run]\nseed=3\n",
    "no_section": lambda p: b"x=@Variant(" + p + b"\n[run]\nseed=3\n",
    "byte_order_mark": lambda p: b"\xef\xbb\xbf[run]\ntop_k=@Variant(" + p + b"\n",
    "after_comments": lambda p: b"; a comment\n[run]\n;x\ntop_k=@Variant(" + p + b" ;tail\n",
    "key_escaped": lambda p: b"[%72un]\ntop%5Fk=@Variant(" + p + b"\n",
}


@pytest.mark.parametrize("disguise", sorted(DISGUISES))
def test_every_disguise_of_a_pickle_is_deleted_before_qsettings_reads(qtbot, tmp_path, disguise):
    marker = tmp_path / "unpickled"
    payload = pickled_value(tmp_path / "scratch.ini", marker)[len(b"@Variant("):]
    data = DISGUISES[disguise](payload) + b"[view]\nzoom=1.5\n"
    live = tmp_path / "live.ini"
    live.write_bytes(data)
    probe = QSettings(str(live), QSettings.Format.IniFormat)
    probe.setValue("view/speed_index", 3)
    probe.sync()  # QSettings parses every section to write the file: the disguise is real
    assert marker.exists(), "the disguised pickle is not one"
    marker.unlink()
    path = tmp_path / "kvviz.ini"
    path.write_bytes(data)
    store = QSettings(str(path), QSettings.Format.IniFormat)
    settings = AppSettings.load(store)
    assert settings.top_k == 0 and settings.zoom == 1.5
    settings.max_new_tokens = 9
    settings.save(store)  # through QSettings, which reads every section first
    assert AppSettings.load(QSettings(str(path), QSettings.Format.IniFormat)).max_new_tokens == 9
    assert not marker.exists()


def test_window_geometry_survives_every_byte(qtbot, tmp_path):
    store = QSettings(str(tmp_path / "kvviz.ini"), QSettings.Format.IniFormat)
    every_byte = bytes(range(256)) + b"0a,;=\"\\ \t)("
    save_geometry(store, QByteArray(every_byte))
    again = QSettings(str(tmp_path / "kvviz.ini"), QSettings.Format.IniFormat)
    assert bytes(load_geometry(again).data()) == every_byte
    assert bytes(again.value("window/geometry").data()) == every_byte  # QSettings reads it the same


PROMPTS = ["@start", "@@two", "@Variant(1)", " leading and trailing ", "a, b, c", 'say "hi"', "back\\slash",
           "tab\there", "semi;colon=equals", "line\nbreak", "ünïcödé \u2014 \U0001f600", "\\x40", "[run]", ""]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_prompts_of_every_shape_come_back_as_typed(qtbot, tmp_path, prompt):
    store = QSettings(str(tmp_path / "kvviz.ini"), QSettings.Format.IniFormat)
    AppSettings(prompt=prompt, model_source=prompt).save(store)
    again = AppSettings.load(QSettings(str(tmp_path / "kvviz.ini"), QSettings.Format.IniFormat))
    assert (again.prompt, again.model_source) == (prompt, prompt)


@pytest.mark.parametrize(("text", "expected"), [
    (b"[run]\nmax_new_tokens=0\nseed=2147483648\ntemperature=-1\ntop_k=50258\n",
     {"max_new_tokens": 1, "seed": 2**31 - 1, "temperature": 0.0, "top_k": 50257}),
    (b"[run]\nmax_new_tokens= 7 \ntemperature=inf\nseed=0x10\ntop_k=4.5\nuse_cache=FALSE\n",
     {"max_new_tokens": 7, "temperature": 0.0, "seed": 0, "top_k": 0, "use_cache": False}),
    (b"[run]\nmax_new_tokens=" + b"9" * 5000 + b"\nuse_cache=\n[view]\nzoom=1e-300\nspeed_index=-3\n",
     {"max_new_tokens": 12, "use_cache": True, "zoom": 0.7, "speed_index": 0}),
    (b"[run]\nmax_new_tokens=5, 6\nprompt=@ByteArray(x)\n[view]\nzoom=@Rect(1 2 3 4)\ncolour_blind=true\n",
     {"max_new_tokens": 12, "prompt": "To be, or not to be", "zoom": 1.0, "colour_blind": True}),
    (b"\xff\xfe not an INI file at all \x00\x01\n[run\nmax_new_tokens=8\nseed\n",  # "[run": QSettings reads [run]
     {"max_new_tokens": 8, "seed": 0}),
])
def test_every_key_takes_hostile_text(qtbot, tmp_path, text, expected):
    (tmp_path / "kvviz.ini").write_bytes(text)
    settings = AppSettings.load(QSettings(str(tmp_path / "kvviz.ini"), QSettings.Format.IniFormat))
    assert {k: getattr(settings, k) for k in expected} == expected


def test_a_settings_file_not_there_yet_reads_as_empty(qtbot, tmp_path):
    store = QSettings(str(tmp_path / "kvviz.ini"), QSettings.Format.IniFormat)
    assert plain_values(store) == {}  # no file yet
    (tmp_path / "kvviz.ini").write_bytes(b"[run]\nseed=4\n")
    assert plain_values(store) == {"run/seed": "4"}


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


@pytest.mark.parametrize(("state", "signum"), [("idle", signal.SIGINT), ("play", signal.SIGINT),
                                               ("play", signal.SIGTERM), ("idle", signal.SIGHUP)],
                         ids=["ctrl-c-idle", "ctrl-c-playing", "sigterm-playing", "sighup-idle"])
def test_a_stop_signal_quits_like_ctrl_q(tmp_path, app_model, state, signum):
    args = [sys.executable, "-c", LAUNCHER, state, "--prompt", "Stop test"]
    if app_model is not None:
        args += ["--model", app_model]
    proc = subprocess.Popen(args, env=gui_env(tmp_path), stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in proc.stderr:
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
    proc.stderr.close()
    stderr = "".join(lines)
    assert code == 0, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    saved = (tmp_path / "config" / "kvviz" / "kvviz.ini").read_text(encoding="utf-8")
    assert "prompt=Stop test" in saved and "geometry=@ByteArray(" in saved


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
    import time

    import kvviz.sources.weights

    def fake_download(name, progress=None, **_kwargs):
        for i in range(10_000):
            progress(i * 2**20, 500 * 2**20)  # raises DownloadCancelled once the user cancels
            time.sleep(0.01)
        raise AssertionError("the download was not cancelled")

    monkeypatch.setattr(kvviz.sources.weights, "download_hub_model", fake_download)
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
    import time

    import kvviz.sources.weights

    def fake_download(name, progress=None, **_kwargs):
        for i in range(10_000):
            progress(i * 2**20, 500 * 2**20)
            time.sleep(0.01)

    monkeypatch.setattr(kvviz.sources.weights, "download_hub_model", fake_download)
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
    from kvviz.app.run.worker import describe_load_error, describe_run_error

    assert describe_run_error("m", RuntimeError("Inference tensors do not track version counter.")) == (
        "Generation with m stopped: Inference tensors do not track version counter.")
    assert describe_run_error("m", ValueError("bad shape")) == "Generation with m stopped: bad shape."
    assert describe_load_error("x.pt", OSError("Is a directory.")) == "Could not load x.pt: Is a directory."


def test_a_pickle_that_cannot_be_deleted_is_neither_read_nor_written_over(qtbot, tmp_path, monkeypatch):
    import kvviz.app.ini_file as ini_file

    def read_only(path, data):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(ini_file, "write_atomically", read_only)
    marker = tmp_path / "unpickled"
    path = tmp_path / "kvviz.ini"
    data = b"[run]\nseed=5\ntop_k=" + pickled_value(tmp_path / "scratch.ini", marker) + b"\n"
    path.write_bytes(data)
    store = QSettings(str(path), QSettings.Format.IniFormat)
    settings = AppSettings.load(store)
    assert settings == AppSettings()  # nothing read from a file that could not be made safe
    settings.save(store)
    save_geometry(store, QByteArray(b"geometry"))
    assert load_geometry(store) is None and path.read_bytes() == data and not marker.exists()


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


def test_values_not_yet_written_are_read_and_the_pickle_beside_them_is_not(qtbot, tmp_path):
    marker = tmp_path / "unpickled"
    path = tmp_path / "kvviz.ini"
    path.write_bytes(b"[run]\ntop_k=" + pickled_value(tmp_path / "scratch.ini", marker) + b"\n")
    store = QSettings(str(path), QSettings.Format.IniFormat)
    store.setValue("run/seed", 4)  # pending: QSettings writes it, parsing the whole file, at its next sync
    assert AppSettings.load(store).seed == 4
    assert not marker.exists() and b"seed=4" in path.read_bytes() and b"@Variant" not in path.read_bytes()
