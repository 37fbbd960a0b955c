"""Views that no longer match what was asked for say so at once (issue #36, section 3): a veil with "Loading
<model>…" or "Preparing step N…" over the run's views until the new content arrives. The worker is held at the
moment of the load or the run's start, so the test sees the in-between state a slow machine shows for seconds."""

from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import Qt

from kvviz.app.assembly import open_window
from kvviz.app.settings import app_settings
from kvviz.app.window.main_window import MainWindow


@pytest.fixture
def held(monkeypatch):
    """`held(module, name)`: the worker waits inside `module.name` until the returned event is set."""
    events = []

    def hold(module, name: str) -> threading.Event:
        original, release = getattr(module, name), threading.Event()

        def waiting(*args, **kwargs):
            release.wait(30)
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, waiting)
        events.append(release)
        return release

    yield hold
    for event in events:
        event.set()


def _window(qtbot, lesson=None) -> MainWindow:
    win = open_window(None, "Time flies", settings=app_settings(), lesson=lesson)
    qtbot.addWidget(win)
    win.show()
    qtbot.waitUntil(lambda: win.session.plan is not None, timeout=60_000)
    return win


def test_a_model_loading_veils_the_views_with_its_name_until_its_run_starts(qtbot, held):
    import kvviz.sources.weights as weights

    win = _window(qtbot)
    cover = win.workspace.stale_cover
    assert cover.text_shown == ""
    release = held(weights, "load_model")
    win.load_model("kvviz-shakespeare-gqa")
    qtbot.waitUntil(lambda: cover.text_shown == "Loading kvviz-shakespeare-gqa\u2026", timeout=5_000)
    release.set()
    qtbot.waitUntil(lambda: win.session.plan is not None and win.session.model_info.name == "kvviz-shakespeare-gqa",
                    timeout=60_000)
    qtbot.waitUntil(lambda: cover.text_shown == "", timeout=5_000)
    win.close()


def test_a_setting_changed_veils_the_old_run_until_the_new_one_starts(qtbot, held):
    import kvviz.engine.run as run

    win = _window(qtbot)
    cover = win.workspace.stale_cover
    release = held(run, "start_run")
    qtbot.keyClick(win, Qt.Key.Key_C)  # the cache box: the grid below still shows the cached run
    qtbot.waitUntil(lambda: cover.text_shown == "Preparing the run\u2026", timeout=5_000)
    release.set()
    qtbot.waitUntil(lambda: win.session.plan is not None and not win.session.plan.use_cache, timeout=30_000)
    qtbot.waitUntil(lambda: cover.text_shown == "", timeout=5_000)
    win.close()


def test_a_lesson_step_being_prepared_says_which(qtbot, held):
    import kvviz.engine.run as run

    win = _window(qtbot, lesson="kv-cache")
    qtbot.waitUntil(lambda: win.lesson.ready and not win.scheduler.pending, timeout=60_000)
    release = held(run, "start_run")
    qtbot.keyClick(win, Qt.Key.Key_PageDown)  # the question's reveal, then step 2
    qtbot.keyClick(win, Qt.Key.Key_PageDown)
    qtbot.waitUntil(lambda: win.workspace.stale_cover.text_shown == "Preparing step 2\u2026", timeout=5_000)
    release.set()
    qtbot.waitUntil(lambda: win.lesson.ready and not win.scheduler.pending, timeout=60_000)
    qtbot.waitUntil(lambda: win.workspace.stale_cover.text_shown == "", timeout=5_000)
    win.close()


def test_page_down_while_an_answer_is_measured_waits_for_it_then_goes_on(qtbot, held):
    """The lesson never passes a question whose answer is missing: Page Down during the measurement says
    'measuring…' and goes on to the next step once the answer is in."""
    import kvviz.engine.run as run

    win = _window(qtbot, lesson="kv-cache")
    lesson = win.lesson
    qtbot.waitUntil(lambda: lesson.ready and not win.scheduler.pending, timeout=60_000)
    assert lesson.step.question and not lesson.revealed
    release = held(run.Run, "next_token_step")
    qtbot.keyClick(win, Qt.Key.Key_PageDown)  # the reveal: its step is held in the worker
    assert lesson.revealed and lesson.measured is None
    qtbot.keyClick(win, Qt.Key.Key_PageDown)  # too early: the lesson waits
    assert lesson.slide == 1 and "measuring" in win.lesson.panel.hint.text()
    release.set()
    qtbot.waitUntil(lambda: lesson.slide == 2, timeout=30_000)  # once measured, it went on by itself
    win.close()


def test_keys_pressed_while_a_model_loads_are_queued_said_and_taken_once_its_run_starts(qtbot, held):
    """Space three times and P during a load: the veil says "3 steps and play queued", and the new model's run
    takes three steps and then plays (they were lost without a sign)."""
    import kvviz.sources.weights as weights

    win = _window(qtbot)
    cover = win.workspace.stale_cover
    release = held(weights, "load_model")
    win.load_model("kvviz-shakespeare-gqa")
    qtbot.waitUntil(lambda: win.session.loading, timeout=5_000)
    for key in (Qt.Key.Key_Space, Qt.Key.Key_Space, Qt.Key.Key_Space, Qt.Key.Key_P):
        qtbot.keyClick(win, key)
    qtbot.waitUntil(lambda: cover.text_shown == "Loading kvviz-shakespeare-gqa\u2026\n3 steps and play queued",
                    timeout=5_000)
    release.set()
    qtbot.waitUntil(lambda: win.session.playing and win.session.steps_done >= 3, timeout=60_000)
    assert win.session.model_info.name == "kvviz-shakespeare-gqa"
    win.session.pause()
    win.close()
