"""View > Speed's long sweep (#41): every kind of cache against the bandwidth bound, on a log length axis. The
chart is checked against results written out here by hand; the runner against a stand-in process and the real
`kvviz bench --sweep --variants all` on a tiny model."""

from __future__ import annotations

import json
import math
import os
import sys
import time

import pytest
from helpers_checkpoints import save_kvviz_folder
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QApplication

from kvviz.app import theme as themes
from kvviz.app.run import speed_runner
from kvviz.app.run.speed_runner import long_sweep_arguments
from kvviz.app.views.speed_view import SpeedView
from kvviz.app.window.long_sweep_dialog import longest_lengths
from kvviz.app.window.speed_panel import SpeedPanel
from kvviz.measure.cache_speed import CacheSweepResult
from kvviz.measure.speed import SweepResult

OLD_SWEEP = {"model": "tiny", "dtype": "float32", "lengths": [2, 4], "repeat": 1, "cached_ms": [1.0, 1.0],
             "uncached_ms": [1.0, 1.5], "cached_turns_ms": [[1.0], [1.0]], "uncached_turns_ms": [[1.0], [1.5]]}


def sweep_dict(crossover: int = 200, lengths: tuple[int, ...] = (64, 128, 256)) -> dict:
    """A long sweep as `kvviz bench --sweep --variants exact,int8 --json` prints it, with round numbers: at 256
    positions exact took 16 ms against 12.8 predicted (80% of the bound's speed), int8 11 ms against 5.5 (50%),
    so int8 stepped 16 / 11 = 1.45 times as fast."""
    n = len(lengths)
    exact_ms, int8_ms = [10.0, 12.0, 16.0][-n:], [9.0, 10.0, 11.0][-n:]
    exact_predicted, int8_predicted = [8.0, 9.6, 12.8][-n:], [5.0, 5.2, 5.5][-n:]
    return {"kind": "cache sweep", "model": "tiny", "dtype": "float32", "threads": 2, "lengths": list(lengths),
            "repeat": 1, "read_bytes_per_second": 12_500_000_000, "weight_bytes": 100_000_000,
            "variants": [
                {"name": "exact", "label": "exact float32 cache", "ms": exact_ms,
                 "turns_ms": [[v] for v in exact_ms], "cache_bytes": [1000 * k for k in lengths],
                 "predicted_ms": exact_predicted, "crossover_length": crossover},
                {"name": "int8", "label": "int8 cache (codes and a float32 scale a row and head)", "ms": int8_ms,
                 "turns_ms": [[v] for v in int8_ms], "cache_bytes": [300 * k for k in lengths],
                 "predicted_ms": int8_predicted, "crossover_length": crossover * 3}]}


def result(**kwargs) -> CacheSweepResult:
    return CacheSweepResult.from_dict(sweep_dict(**kwargs))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """A model of 128 positions, small enough that its long sweep (64 and 128 positions) takes a few seconds."""
    return str(save_kvviz_folder(tmp_path_factory.mktemp("long") / "tiny", n_layer=2, n_head=2, n_embd=32,
                                 n_ctx=128, seed=5))


@pytest.fixture
def view(qtbot):
    widget = SpeedView()
    qtbot.addWidget(widget)
    widget.resize(760, 520)
    return widget


@pytest.fixture
def make_panel(qtbot):
    """Make a speed panel (after a test's stand-in command line: its sweepers read it when they are made); its
    sweeps end with the test."""
    made = []

    def make() -> SpeedPanel:
        made.append(SpeedPanel())
        qtbot.addWidget(made[-1])
        return made[-1]

    yield make
    for widget in made:
        widget.shut_down()


@pytest.fixture
def panel(make_panel):
    return make_panel()


def pen_colour(curve) -> str:
    return curve.opts["pen"].color().name().upper()


def test_the_long_sweep_draws_a_solid_line_per_kind_of_cache_and_its_prediction_dashed(view):
    view.show_long_started("tiny")
    view.show_long_result(result())
    chart = view.long_chart
    assert view.showing_long and chart.plot_item.getAxis("bottom").logMode  # lengths on a log axis
    for curve, ms, predicted in ((0, [10, 12, 16], [8, 9.6, 12.8]), (1, [9, 10, 11], [5, 5.2, 5.5])):
        x, y = chart.measured[curve].getData()  # as drawn: log10 of the length
        assert list(x) == pytest.approx([math.log10(n) for n in (64, 128, 256)]) and list(y) == ms
        assert list(chart.predicted[curve].getData()[1]) == predicted
        measured_pen, predicted_pen = chart.measured[curve].opts["pen"], chart.predicted[curve].opts["pen"]
        assert measured_pen.style() == Qt.PenStyle.SolidLine and predicted_pen.dashPattern()
        assert pen_colour(chart.measured[curve]) == pen_colour(chart.predicted[curve])
    assert pen_colour(chart.measured[0]) != pen_colour(chart.measured[1])
    # the legend names each line by its label; the ticks say the lengths measured
    legend = chart.legend.text().replace("&nbsp;", " ")
    assert "exact float32 cache" in legend and "int8 cache (codes and a float32 scale a row and head)" in legend
    ticks = chart.plot_item.getAxis("bottom")._tickLevels[0]
    assert [label for _, label in ticks] == ["64", "128", "256"]
    # the text line: the headline, the read rate and each one's share of the bound's speed at 256
    text = view.headline.text()
    assert "At 256 positions, step speed against exact: int8 1.45\u00d7." in text and "12.5 GB/s" in text
    assert "exact</span> 80%" in text and "int8</span> 50%" in text


def test_the_crossover_is_a_line_within_the_lengths_and_a_note_beyond_them(view):
    view.show_long_result(result(crossover=200))
    line = view.long_chart.crossover_line
    assert line.isVisible() and line.value() == pytest.approx(math.log10(200))
    assert "200 positions" in line.label.toPlainText() and "200 positions" in view.long_chart.note.text()
    view.show_long_result(result(crossover=5000))
    assert not line.isVisible()
    note = view.long_chart.note.text()
    assert "at 5,000 positions, beyond the longest length measured (256)" in note and "100.0 MB" in note


def test_partial_results_draw_the_lengths_measured_so_far(view):
    view.show_long_started("tiny")
    assert view.measuring and view.long_chart.measured == []  # no line before the first length is measured
    view.show_long_partial(result(lengths=(64,)))
    assert list(view.long_chart.measured[0].getData()[1]) == [16.0]
    assert "Measured so far, up to 64 positions" in view.headline.text()
    view.show_long_result(result())
    view.show_long_partial(result(lengths=(64,)))  # a late part leaves the result drawn
    assert len(view.long_chart.measured[0].getData()[1]) == 3


def test_both_themes_draw_the_lines_in_their_own_colours(view):
    view.show_long_result(result())
    for theme in (themes.LIGHT, themes.DARK):
        view.set_theme(theme)
        chart = view.long_chart
        colours = [pen_colour(curve) for curve in chart.measured]
        assert colours[0] == theme.teal.upper() and len(set(colours)) == 2
        background = QColor(theme.background).lightnessF()
        for colour in colours:  # each line stands out of the background
            assert abs(QColor(colour).lightnessF() - background) > 0.25
        assert f"color:{theme.teal}" in view.headline.text()  # the names in the text line in the lines' colours


def test_one_sweep_at_a_time_and_the_view_shows_the_one_started_last(make_panel, monkeypatch):
    waiting = ["-c", "import time; time.sleep(60)"]
    monkeypatch.setattr(speed_runner, "sweep_arguments", lambda *a: waiting)
    monkeypatch.setattr(speed_runner, "long_sweep_arguments", lambda *a: waiting)
    panel = make_panel()
    old = SweepResult.from_dict(OLD_SWEEP)
    panel.view.show_result(old)
    panel.measure_long()
    assert panel.view.showing_long and panel.long_sweeper.running
    panel.measure("", "float32", "tiny")  # the long one is cancelled: two sweeps at once would time each other
    assert not panel.long_sweeper.running and panel.sweeper.running
    assert not panel.view.showing_long and panel.view.charts.currentWidget() is panel.view.plot_widget
    assert panel.view.headline.text() == f"<b>{old.headline()}</b>"  # the old sweep's headline again
    panel.measure_long()
    assert not panel.sweeper.running and panel.long_sweeper.running and panel.view.showing_long


def fake_sweep(final: dict | None, exit_code: int = 0, error: str = "") -> list[str]:
    """A stand-in for `kvviz bench --sweep --variants all --background`: two progress lines, a partial result,
    then the final one on stdout (or `error` on stderr and `exit_code`)."""
    partial = sweep_dict(lengths=(64,))
    script = (f"import sys\nsys.stderr.write('progress 1/4\\nprogress 2/4\\n')\n"
              f"sys.stderr.write('partial ' + {json.dumps(json.dumps(partial))} + '\\n')\n"
              f"sys.stderr.write('progress 4/4\\n')\n")
    if final is not None:
        script += f"print({json.dumps(json.dumps(final))})\n"
    if error:
        script += f"sys.stderr.write({error!r} + '\\n')\n"
    return ["-c", script + f"sys.exit({exit_code})"]


def test_the_long_sweep_reports_progress_parts_and_its_result(make_panel, qtbot, monkeypatch):
    monkeypatch.setattr(speed_runner, "long_sweep_arguments", lambda *a: fake_sweep(sweep_dict()))
    panel = make_panel()
    progress, parts = [], []
    panel.long_sweeper.progressed.connect(lambda done, total: progress.append((done, total)))
    panel.long_sweeper.measured_part.connect(parts.append)
    with qtbot.waitSignal(panel.long_sweeper.finished, timeout=30_000) as finished:
        panel.measure_long(128)
    assert progress == [(1, 4), (2, 4), (4, 4)] and [p.lengths for p in parts] == [(64,)]
    assert finished.args[0] == result() and panel.view.long_result == result()
    assert not panel.view.measuring and panel.view.long_button.isEnabled()


def test_a_long_sweep_that_fails_says_why_in_one_line(make_panel, qtbot, monkeypatch):
    monkeypatch.setattr(speed_runner, "long_sweep_arguments", lambda *a: fake_sweep(
        None, 2, "Traceback (most recent call last):\n  ...\nkvviz: --variants: kivi-int2 is no variant"))
    panel = make_panel()
    with qtbot.waitSignal(panel.long_sweeper.failed, timeout=30_000) as failed:
        panel.measure_long()
    assert failed.args[0] == "The long speed sweep failed: --variants: kivi-int2 is no variant"
    assert panel.view.headline.text() == failed.args[0] and not panel.view.measuring


def test_the_long_sweep_command_asks_for_every_variant():
    assert long_sweep_arguments("", "float32") == ["-m", "kvviz", "bench", "--sweep", "--variants", "all", "--json",
                                                   "--background", "--dtype", "float32"]
    assert long_sweep_arguments("random:gpt2", "bfloat16", 512)[-6:] == ["--dtype", "bfloat16", "--model",
                                                                          "random:gpt2", "--max-length", "512"]
    assert longest_lengths(256) == [128, 256] and longest_lengths(300) == [128, 256, 300]
    assert longest_lengths(100) == [] and longest_lengths(0)[-1] == 131072


def accept_the_dialog(choose: int | None = None, reject: bool = False, seen: list | None = None) -> None:
    """Accept (or `reject`) the long sweep's dialog once it is up, choosing the longest length `choose`; the
    lengths it offers go to `seen`. It looks for the dialog for 10 s at the most."""
    deadline = time.monotonic() + 10

    def answer() -> None:
        dialog = QApplication.activeModalWidget()
        if dialog is None:
            if time.monotonic() < deadline:
                QTimer.singleShot(20, answer)
            return
        box = dialog.length_box
        if seen is not None:
            seen.extend(box.itemData(i) for i in range(box.count()))
        if choose is not None:
            box.setCurrentIndex(box.findData(choose))
        dialog.reject() if reject else dialog.accept()
    QTimer.singleShot(0, answer)


def test_the_long_sweep_button_and_shift_s_ask_for_the_longest_length(panel, qtbot):
    panel.context = 256
    asked = []
    panel.view.long_requested.connect(lambda: asked.append("button"))
    accept_the_dialog(choose=None, reject=True)
    panel.view.long_button.click()
    assert asked == ["button"] and not panel.long_sweeper.running  # the dialog was cancelled: nothing runs
    panel.show()
    panel.activateWindow()
    qtbot.waitUntil(panel.isActiveWindow, timeout=5_000)
    offered = []
    accept_the_dialog(choose=None, reject=True, seen=offered)
    qtbot.keyClick(panel, Qt.Key.Key_S, Qt.KeyboardModifier.ShiftModifier)
    assert offered == [None, 128, 256] and not panel.long_sweeper.running


def test_the_long_sweep_runs_in_the_background(panel, qtbot, tiny):
    progress, parts = [], []
    panel.long_sweeper.progressed.connect(lambda done, total: progress.append((done, total)))
    panel.long_sweeper.measured_part.connect(parts.append)
    panel.context = 128
    accept_the_dialog(choose=128)
    with qtbot.waitSignal(panel.long_sweeper.progressed, timeout=60_000):
        panel.show_for(tiny, "float32", "tiny", long=True)  # View > Long speed sweep
    assert panel.view.measuring and panel.view.cancel_button.isVisibleTo(panel)
    pid = panel.long_sweeper._process.processId()
    panel.pause(True)
    if sys.platform.startswith("linux"):  # stopped while the live run computes
        qtbot.waitUntil(lambda: _state(pid) == "T", timeout=5_000)
    assert panel.view.progress.format().startswith("paused while the run steps")
    with qtbot.waitSignal(panel.long_sweeper.finished, timeout=180_000) as finished:
        panel.pause(False)
    swept: CacheSweepResult = finished.args[0]
    # a GPT-2 runs per-head caches: exact, int8, int4, fp8, int4 in KIVI's layout and a window of its context / 8
    assert swept.lengths == (64, 128) and [c.name for c in swept.variants] == ["exact", "int8", "int4", "fp8",
                                                                               "kivi-int4", "window:16"]
    assert progress[-1][0] == progress[-1][1] and parts and all(p.lengths[-1] <= 128 for p in parts)
    assert [list(curve.getData()[1]) for curve in panel.view.long_chart.measured] == [list(c.ms) for c in
                                                                                     swept.variants]
    assert swept.headline() in panel.view.headline.text() and not panel.view.measuring


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def test_cancel_kills_the_long_sweep(panel, qtbot, tiny):
    accept_the_dialog(choose=None, reject=True)
    panel.show_for(tiny, "float32", "tiny", long=True)
    with qtbot.waitSignal(panel.long_sweeper.progressed, timeout=60_000):
        panel.measure_long()
    pid = panel.long_sweeper._process.processId()
    with qtbot.waitSignal(panel.long_sweeper.cancelled, timeout=5_000):
        panel.view.cancel_button.click()
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(pid, 0)
    assert not panel.long_sweeper.running and not panel.view.measuring
    assert "long sweep was cancelled" in panel.view.headline.text()


def test_drawing_a_long_result_stays_within_a_frame(view):
    """The GUI thread reads and draws a whole result (7 kinds of cache, 11 lengths, 11 turns) in less than a
    frame (16 ms); the fastest of three tries, so that another process on the machine does not count."""
    lengths = tuple(64 * 2 ** i for i in range(11))
    data = sweep_dict(lengths=lengths[:3])
    data["lengths"] = list(lengths)
    variant = data["variants"][0]
    data["variants"] = [{**variant, "name": f"v{i}", "ms": [10.0] * 11, "turns_ms": [[10.0] * 11] * 11,
                         "cache_bytes": [1] * 11, "predicted_ms": [5.0] * 11} for i in range(7)]
    text = json.dumps(data)
    view.show_long_result(CacheSweepResult.from_dict(json.loads(text)))  # the lines made once
    times = []
    for _ in range(3):
        start = time.perf_counter()
        view.show_long_result(CacheSweepResult.from_dict(json.loads(text)))
        QApplication.processEvents()
        times.append(time.perf_counter() - start)
    assert min(times) < 0.016


def test_view_long_speed_sweep_opens_the_panel_and_asks(qtbot, window):
    action = window.actions["long_speed"]
    assert [k.toString() for k in action.shortcuts()] == ["Shift+S"]
    assert action in window.menuBar().actions()[2].menu().actions()  # File, Run, View
    offered = []
    accept_the_dialog(reject=True, seen=offered)
    qtbot.keyClick(window, Qt.Key.Key_S, Qt.KeyboardModifier.ShiftModifier)
    assert window.speed.isVisible() and not window.speed.sweeper.running and not window.speed.long_sweeper.running
    assert offered[-1] == window.session.model_info.n_ctx  # the longest length offered is the model's context
