"""View > Speed: the sweep runs in a child process (the GUI thread never runs the model), reports its
progress, can be cancelled, and the view draws what it measured, with the ratio in words."""

from __future__ import annotations

import pytest
from helpers_checkpoints import save_kvviz_folder

from kvviz.app.run.speed_runner import sweep_arguments
from kvviz.app.window.speed_panel import SpeedPanel
from kvviz.measure.speed import SweepResult


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(save_kvviz_folder(tmp_path_factory.mktemp("speed") / "tiny", n_layer=2, n_head=2, n_embd=32,
                                 n_ctx=17, seed=5))


@pytest.fixture
def panel(qtbot):
    widget = SpeedPanel()
    qtbot.addWidget(widget)
    yield widget
    widget.shut_down()


def test_the_sweep_runs_in_the_background_and_the_view_draws_it(qtbot, panel, tiny):
    progress, parts, formats = [], [], []
    panel.sweeper.progressed.connect(lambda done, total: progress.append((done, total)))
    panel.sweeper.progressed.connect(lambda *_: formats.append(panel.view.progress.format()))
    panel.sweeper.measured_part.connect(
        lambda part: parts.append((part.lengths, list(panel.view.cached_curve.getData()[0]))))
    with qtbot.waitSignal(panel.sweeper.finished, timeout=120_000) as finished:
        panel.show_for(tiny, "float32", "tiny")
        assert panel.view.measuring and panel.view.cancel_button.isVisibleTo(panel)
    result: SweepResult = finished.args[0]
    # the context of 17 positions allows a longest cached step at 16: eight lengths, 2 modes x 11 turns each
    assert result.lengths == (2, 4, 6, 8, 10, 12, 14, 16) and result.repeat == 11
    assert progress[-1] == (176, 176) and [d for d, _ in progress] == sorted(d for d, _ in progress)
    # the curve is drawn as the first turn fills it, a length at a time, and the time left is said
    assert [lengths for lengths, _ in parts] == [result.lengths[:n] for n in range(1, 9)]
    assert all(list(drawn) == list(lengths) for lengths, drawn in parts)
    assert any(text.endswith(" left") and "of 176 steps timed, about " in text for text in formats)
    assert not panel.view.measuring and panel.result is result
    x, y = panel.view.uncached_curve.getData()
    assert list(x) == list(result.lengths) and list(y) == list(result.uncached_ms)
    assert list(panel.view.cached_curve.getData()[1]) == list(result.cached_ms)
    assert result.headline() in panel.view.headline.text()
    # shown again for the same model and precision: no second sweep
    panel.show_for(tiny, "float32", "tiny")
    assert not panel.sweeper.running


def test_the_sweep_stops_while_the_live_run_computes_and_goes_on_after(qtbot, panel, tiny):
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("the process state is read from /proc")
    with qtbot.waitSignal(panel.sweeper.progressed, timeout=60_000):
        panel.show_for(tiny, "float32", "tiny")
    pid = panel.sweeper._process.processId()

    def state() -> str:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]

    panel.sweeper.pause(True)
    qtbot.waitUntil(lambda: state() == "T", timeout=5_000)  # stopped: it takes no CPU from the run
    assert panel.view.progress.format().startswith("paused while the run steps")
    with qtbot.waitSignal(panel.sweeper.finished, timeout=120_000):
        panel.sweeper.pause(False)
    assert not panel.sweeper.paused


def test_a_step_timed_before_the_pause_and_read_after_it_leaves_the_bar_saying_paused(panel):
    """The child prints each step as it times it; a line already in the pipe when the sweep is paused arrives
    after: the bar counts it and still says the sweep is paused."""
    view = panel.view
    view.show_progress(1, 10)
    view.show_paused(True)
    view.show_progress(2, 10)
    assert view.progress.format() == "paused while the run steps: 2 of 10 steps timed"
    view.show_paused(False)
    view.show_progress(3, 10)
    assert view.progress.format().startswith("measuring: 3 of 10 steps timed")


def test_the_window_pauses_the_sweep_while_its_run_plays(qtbot, window):
    window.speed.prepare("", "float32", "kvviz-shakespeare")
    qtbot.waitUntil(lambda: window.speed.sweeper.running, timeout=10_000)
    window.controls.max_new_spin.setValue(200)
    window.toggle_play()
    qtbot.waitUntil(lambda: window.speed.sweeper.paused, timeout=10_000)
    window.toggle_play()
    qtbot.waitUntil(lambda: not window.session.playing and not window.speed.sweeper.paused, timeout=30_000)
    window.speed.shut_down()


def test_cancel_ends_the_sweep_and_says_so(qtbot, panel, tiny):
    with qtbot.waitSignal(panel.sweeper.progressed, timeout=60_000):
        panel.show_for(tiny, "float32", "tiny")
    with qtbot.waitSignal(panel.sweeper.cancelled, timeout=5_000):
        panel.view.cancel_button.click()
    assert not panel.sweeper.running and not panel.view.measuring
    assert "cancelled" in panel.view.headline.text() and panel.result is None


def test_a_sweep_that_fails_says_why_in_one_sentence(qtbot, panel, tmp_path):
    with qtbot.waitSignal(panel.sweeper.failed, timeout=60_000) as failed:
        panel.show_for(str(tmp_path / "no-such-model"), "float32", "missing")
    sentence = failed.args[0]
    assert sentence.startswith("The speed sweep failed: ") and "\n" not in sentence and "Traceback" not in sentence
    assert "no-such-model" in sentence and sentence in panel.view.headline.text()


def test_the_sweep_command_names_the_model_and_precision():
    assert sweep_arguments("", "bfloat16") == ["-m", "kvviz", "bench", "--sweep", "--json", "--background",
                                               "--dtype", "bfloat16"]
    assert sweep_arguments("random:gpt2", "float32", 64)[-4:] == ["--model", "random:gpt2", "--max-length", "64"]
