"""Lesson mode in the window: Page Down and Page Up walk the built-in lesson, each step puts the app into
its state, questions are answered with what the engine measured, and leaving gives the free app back."""

from __future__ import annotations

import re

import pytest
from helpers_qt import settle_layouts
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextLayout, QTextOption
from PySide6.QtWidgets import QApplication, QMessageBox, QScrollArea

from kvviz.app.assembly import open_window as open_app_window
from kvviz.app.lesson.step_text import keep_together
from kvviz.app.settings import AppSettings, app_settings
from kvviz.app.views.grid.cell_states import COMPUTED, EMPTY, PENDING, REUSED
from kvviz.app.window.dialogs import ShortcutsDialog
from kvviz.app.window.main_window import MainWindow
from kvviz.app.window.presentation import presenter_zoom

FREE_PROMPT = "hello"  # the free app's prompt: a lesson never leaves its own behind in the settings
TITLE_BAR = 30


def open_window(qtbot, app_model, lesson: str | None, store=None) -> MainWindow:
    win = open_app_window(app_model, FREE_PROMPT, settings=store or app_settings(), lesson=lesson)
    qtbot.addWidget(win)
    win.show()
    return win


@pytest.fixture
def window(qtbot, app_model):
    win = open_window(qtbot, app_model, "")  # "": the built-in lesson, as `kvviz --lesson` passes it
    settle(qtbot, win)
    yield win
    win.close()


def settle(qtbot, win: MainWindow) -> None:
    """Wait until the window shows the lesson's current slide (its run replayed, its answer measured)."""
    qtbot.waitUntil(lambda: win.lesson.ready and not win.scheduler.pending, timeout=60_000)
    win.redraw()


def press(qtbot, win: MainWindow, key: Qt.Key, times: int = 1) -> None:
    for _ in range(times):
        qtbot.keyClick(win, key)
    settle(qtbot, win)


def counts(win: MainWindow) -> tuple[int, int, int]:
    values = win.counter.values()
    return values["with_cache"], values["without_cache"], values["avoided"]


def assert_step(win: MainWindow, prompt: str, cache: bool | str, steps_done: int, number: int) -> None:
    plan, session = win.session.plan, win.session
    assert win.controls.prompt_edit.text() == prompt and plan.prompt == prompt
    assert plan.use_cache == (cache is not False) and (plan.twin is not None) == (cache == "compare")
    assert plan.sampling == "greedy"
    assert session.steps_done == steps_done
    assert win.lesson.panel.position.text().startswith(f"step {number} of 6")


def test_the_built_in_lesson_forward_with_page_down_and_back_with_page_up(qtbot, window):
    panel, lesson = window.lesson.panel, window.lesson
    assert lesson.active and panel.isVisible() and window.actions["lesson"].isChecked()
    assert len(lesson.lesson.slides()) == 10  # six steps, four of them with a question

    # Step 1: "Time flies" (2 tokens), cached, before the prefill; the question shown, not its answer.
    assert_step(window, "Time flies", True, 0, 1)
    assert panel.title.text() == "The prompt goes in"
    assert panel.question.text() == keep_together(lesson.step.question_text) and panel.question.isVisible()
    assert lesson.measured is None and panel.answer_text() == "Enter or Page Down: measure"
    states = window.grid.cell_states()
    assert (states[:, :2] == PENDING).all() and (states[:, 2:] == EMPTY).all()
    assert lesson.focus.target is window.grid and lesson.focus.frame.isVisible()

    press(qtbot, window, Qt.Key.Key_PageDown)  # one generation step: the prefill computes both prompt tokens
    assert_step(window, "Time flies", True, 1, 1)
    assert lesson.measured == 2 and panel.answer_text() == "measured 2"
    assert (window.grid.cell_states()[:, :2] == COMPUTED).all()

    # Step 2: without the cache, at 3 new tokens: the last pass recomputed every position.
    press(qtbot, window, Qt.Key.Key_Right)
    assert_step(window, "Time flies", False, 3, 2)
    assert not window.controls.cache_check.isChecked()
    states = window.grid.cell_states()
    assert (states[:, :4] == COMPUTED).all() and (states[:, 4] == PENDING).all() and (states[:, 5:] == EMPTY).all()
    assert counts(window)[1] == 2 + 3 + 4  # passes fed 2, 3 and 4 tokens
    qtbot.keyClicks(panel.guess_edit, "6")
    qtbot.keyClick(panel.guess_edit, Qt.Key.Key_Return)  # Enter in the guess field measures too
    settle(qtbot, window)
    assert_step(window, "Time flies", False, 4, 2)
    assert lesson.measured == 2 + 3  # the fourth pass feeds the prompt and the 3 tokens so far: P + 3
    assert panel.answer_text() == "you said 6 \u00b7 measured 5"

    # Step 3: the same prompt with the cache at 3 new tokens: one amber column, teal before it.
    press(qtbot, window, Qt.Key.Key_PageDown)
    assert_step(window, "Time flies", True, 3, 3)
    states = window.grid.cell_states()
    assert (states[:, :3] == REUSED).all() and (states[:, 3] == COMPUTED).all() and (states[:, 4] == PENDING).all()
    assert counts(window) == (2 + 1 + 1, 2 + 3 + 4, 9 - 4)
    press(qtbot, window, Qt.Key.Key_PageDown)
    assert_step(window, "Time flies", True, 4, 3)
    assert lesson.measured == 1 and panel.answer_text() == "measured 1"

    # Step 4: the same "Time flies" (2 tokens) at 11 of 12 tokens, the counter pointed at.
    press(qtbot, window, Qt.Key.Key_PageDown)
    assert_step(window, "Time flies", True, 11, 4)
    assert lesson.focus.target is window.counter
    press(qtbot, window, Qt.Key.Key_PageDown)
    assert_step(window, "Time flies", True, 12, 4)
    p, n = 2, 12
    assert lesson.measured == n * p + n * (n - 1) // 2 - (p + n) == 76
    assert panel.answer_text() == "measured 76" and counts(window)[2] == 76  # what the counter shows too

    # Step 5: the speed of a token step, measured on this machine: the speed view shows the sweep under way
    # and the text says so until its figure is in.
    press(qtbot, window, Qt.Key.Key_PageDown)
    assert_step(window, "Time flies", True, 12, 5)
    assert window.speed.isVisible() and (window.speed.sweeper.running or window.speed.result is not None)
    if window.speed.result is None:
        assert "(being measured on this machine\u2026)" in panel.text.text()

    # Step 6: compare mode at the end of the run; nothing framed; the last step.
    press(qtbot, window, Qt.Key.Key_PageDown)
    assert_step(window, "Time flies", "compare", 12, 6)
    assert not window.speed.isVisible(), "the speed step's view closes with its step"
    assert window.workspace.compare_view.isVisibleTo(window) and window.actions["compare"].isChecked()
    assert lesson.focus.target is None and not lesson.focus.frame.isVisible() and not panel.question.isVisible()
    press(qtbot, window, Qt.Key.Key_PageDown)  # past the end: nothing happens
    assert lesson.slide == 9

    # Back: each slide as it was, replayed.
    press(qtbot, window, Qt.Key.Key_PageUp, 2)
    assert_step(window, "Time flies", True, 12, 4)
    assert window.run_view.isVisibleTo(window) and not window.actions["compare"].isChecked()
    assert lesson.measured == 76 and panel.answer_text() == "measured 76"
    press(qtbot, window, Qt.Key.Key_Left)  # from the answer back to the question
    assert_step(window, "Time flies", True, 11, 4)
    assert lesson.measured is None and panel.answer_text() == "Enter or Page Down: measure"
    press(qtbot, window, Qt.Key.Key_PageUp, 3)
    assert_step(window, "Time flies", False, 4, 2)
    assert lesson.measured == 5 and panel.answer_text() == "you said 6 \u00b7 measured 5"  # the guess is kept
    press(qtbot, window, Qt.Key.Key_PageUp)
    assert_step(window, "Time flies", False, 3, 2)
    assert panel.guess_edit.text() == "6"
    assert (window.grid.cell_states()[:, :4] == COMPUTED).all()
    press(qtbot, window, Qt.Key.Key_PageUp, 3)
    assert_step(window, "Time flies", True, 0, 1)
    press(qtbot, window, Qt.Key.Key_PageUp)  # before the start: nothing happens
    assert lesson.slide == 0


def test_the_sharing_lesson_starts_from_the_help_menu_and_runs_by_clicker(qtbot, app_model):
    """Help > Lesson: MHA, GQA, MQA; Page Down through its first five slides loads each step's model and reveals
    the bytes its cache measured (2 x layers x KV heads x head size x 4 bytes, by hand). The later slides' models
    (SmolLM2's shape, with and without GQA) are the same path, their answers checked in the exported deck
    (test_cli_lesson), where they cost no window."""
    win = open_window(qtbot, app_model, None)
    try:
        qtbot.waitUntil(lambda: win.session.plan is not None, timeout=60_000)
        win.actions["lesson_sharing"].trigger()
        settle(qtbot, win)
        lesson, panel = win.lesson, win.lesson.panel
        assert lesson.active and lesson.lesson.title == "MHA, GQA, MQA: sharing keys and values"
        seen = []
        for _ in range(5):
            press(qtbot, win, Qt.Key.Key_PageDown)  # a presenter's clicker sends Page Down
            seen.append((win.session.source, panel.answer_text()))
        assert [answer for _, answer in seen if answer.startswith("measured")] == [
            "measured 9,216 bytes in float32", "measured 3,072 bytes in float32", "measured 1,536 bytes in float32"]
        assert (win.session.plan.n_head, win.session.plan.cache_heads) == (6, 1)  # MQA: one KV head
        assert [source for source, _ in seen] == [
            "kvviz-shakespeare", *["kvviz-shakespeare-gqa"] * 2, *["random:kvviz-shakespeare-mqa"] * 2]
    finally:
        win.close()


def test_space_steps_freely_and_the_next_press_still_reveals_one_step(qtbot, window):
    press(qtbot, window, Qt.Key.Key_PageDown, 2)  # step 2's question: uncached at 3
    qtbot.keyClick(window, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: window.session.steps_done == 4, timeout=30_000)
    assert window.lesson.slide == 2  # Space stepped the run, not the lesson
    press(qtbot, window, Qt.Key.Key_PageDown)  # replayed to the question's step and one more
    assert window.session.steps_done == 4 and window.lesson.measured == 5


def test_escape_leaves_the_lesson_for_the_free_app_and_l_resumes_it(qtbot, window):
    press(qtbot, window, Qt.Key.Key_PageDown, 4)  # step 3: cached at 3
    qtbot.keyClick(window, Qt.Key.Key_Escape)
    assert not window.lesson.active and not window.lesson.panel.isVisible()
    assert not window.actions["lesson"].isChecked() and not window.lesson.focus.frame.isVisible()
    qtbot.waitUntil(lambda: window.session.plan is not None and window.session.plan.prompt == FREE_PROMPT,
                    timeout=30_000)  # the free app's own run (the lesson began before it had stepped)
    assert window.controls.prompt_edit.text() == FREE_PROMPT and window.session.steps_done == 0
    keys = [k.toString() for k in window.actions["step"].shortcuts()]
    assert keys == ["Space", "Right", "PgDown"] and window.actions["lesson_next"].shortcuts() == []
    for key, done in ((Qt.Key.Key_PageDown, 1), (Qt.Key.Key_Right, 2), (Qt.Key.Key_Space, 3)):
        qtbot.keyClick(window, key)  # the free app's keys step the run again
        qtbot.waitUntil(lambda d=done: window.session.steps_done == d, timeout=30_000)
    qtbot.keyClick(window, Qt.Key.Key_PageUp)
    assert window.session.steps_done == 3
    qtbot.keyClick(window, Qt.Key.Key_L)  # back where it was left, the step's state again
    assert window.lesson.active and window.lesson.slide == 4
    settle(qtbot, window)
    assert_step(window, "Time flies", True, 3, 3)


def test_help_lesson_starts_the_built_in_lesson_from_the_free_app(qtbot, app_model):
    win = open_window(qtbot, app_model, None)
    try:
        qtbot.waitUntil(lambda: win.session.plan is not None, timeout=60_000)
        assert not win.lesson.active and not win.lesson.panel.isVisible()
        assert win.actions["lesson"].text().replace("&", "").startswith("Lesson")
        win.actions["lesson"].trigger()
        settle(qtbot, win)
        assert win.lesson.active and win.lesson.lesson.title == "The KV cache in six steps"
        assert_step(win, "Time flies", True, 0, 1)
        win.actions["lesson"].trigger()
        assert not win.lesson.active
    finally:
        win.close()


def test_a_lesson_file_of_three_steps_runs(qtbot, app_model, tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text("""
title = "Mine"

[[step]]
title = "Ratio"
text = "How much more work without the cache?"
prompt = "Time flies fast"
cache = false
advance_to = 2
max_new_tokens = 5
focus = "chart"
question = "ratio_after_next"

[[step]]
title = "Bytes"
text = "What the cache holds after the prefill."
notes = "Only the lecturer reads this."
prompt = "Time flies fast"
cache = true
advance_to = 0
max_new_tokens = 4
focus = "memory"
question = "cache_bytes_after_next"

[[step]]
title = "Both"
text = "Side by side."
prompt = "Time flies"
cache = "compare"
advance_to = 2
max_new_tokens = 4
""", encoding="utf-8")
    win = open_window(qtbot, app_model, str(path))
    try:
        settle(qtbot, win)
        lesson, panel = win.lesson, win.lesson.panel
        assert lesson.lesson.title == "Mine" and len(lesson.lesson.slides()) == 5
        assert win.lesson.panel.position.text().startswith("step 1 of 3")
        assert lesson.focus.target is win.chart
        assert not panel.notes_button.isVisible() and not panel.notes.isVisible()
        qtbot.keyClick(win, Qt.Key.Key_PageDown)
        settle(qtbot, win)
        assert win.session.steps_done == 3
        # after the third token: 3 + 4 + 5 = 12 K/V without the cache, 3 + 2 = 5 with it
        assert lesson.measured == pytest.approx(12 / 5) and panel.answer_text() == "measured 2.4x"
        qtbot.keyClick(win, Qt.Key.Key_PageDown)
        settle(qtbot, win)
        assert win.session.plan.use_cache and win.session.steps_done == 0 and win.session.plan.max_new_tokens == 4
        assert panel.notes_button.isVisible() and not panel.notes.isVisible()  # hidden until shown
        qtbot.keyClick(win, Qt.Key.Key_N)
        assert panel.notes.isVisible() and "lecturer" in panel.notes.text()
        # a memory step opens View > Memory and points at it
        assert win.workspace.memory_view.isVisible() and win.actions["memory"].isChecked()
        assert lesson.focus.target is win.workspace.memory_view and lesson.focus.memory_frame.isVisible()
        frame, view = lesson.focus.memory_frame.geometry(), win.workspace.memory_view
        assert frame.contains(view.mapTo(win.centralWidget(), view.rect().center()))
        qtbot.keyClick(win, Qt.Key.Key_PageDown)
        settle(qtbot, win)
        info = win.session.model_info
        per_position = 2 * info.n_layer * info.n_embd * 4  # a key and a value, float32, every layer
        assert lesson.measured == 3 * per_position  # the prefill fills the prompt's 3 positions
        assert panel.answer_text() == f"measured {3 * per_position:,} bytes in float32"
        win.redraw()
        positions, measured = win.workspace.memory_view.points()
        assert positions.tolist() == [3] and measured[0] == 3 * per_position  # the answer, on the view
        qtbot.keyClick(win, Qt.Key.Key_PageDown)
        settle(qtbot, win)
        assert not win.workspace.memory_view.isVisible() and not win.actions["memory"].isChecked()  # lesson opened it
        assert win.session.plan.twin is not None and win.session.steps_done == 2
        assert win.lesson.panel.position.text().startswith("step 3 of 3")
    finally:
        win.close()


@pytest.mark.parametrize("text", [
    "title = 'Broken'\n[[step]]\ntitle = 'a'\n",  # required keys missing
    "this is not TOML",
])
def test_a_bad_lesson_file_says_why_in_a_dialog_and_the_app_stays_free(qtbot, app_model, tmp_path, monkeypatch,
                                                                        text):
    errors: list[str] = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, message, *a, **k: errors.append(message))
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    win = open_window(qtbot, app_model, str(path))
    try:
        assert len(errors) == 1 and str(path) in errors[0] and "\n" not in errors[0]
        assert not win.lesson.active and not win.lesson.panel.isVisible() and not win.actions["lesson"].isChecked()
        qtbot.waitUntil(lambda: win.session.plan is not None, timeout=60_000)
        assert win.session.plan.prompt == FREE_PROMPT
        qtbot.keyClick(win, Qt.Key.Key_PageDown)  # the free app's keys
        qtbot.waitUntil(lambda: win.session.steps_done == 1, timeout=30_000)
        win.actions["lesson"].trigger()  # L tries the same file again: the same one line
        assert len(errors) == 2 and not win.lesson.active
    finally:
        win.close()


def test_a_missing_lesson_file_is_one_line_too(qtbot, app_model, tmp_path, monkeypatch):
    errors: list[str] = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, message, *a, **k: errors.append(message))
    win = open_window(qtbot, app_model, str(tmp_path / "nowhere.toml"))
    try:
        assert errors == [f"{tmp_path / 'nowhere.toml'}: no such lesson file"] and not win.lesson.active
    finally:
        win.close()


def test_a_lesson_leaves_the_free_apps_settings_as_they_were(qtbot, app_model):
    store = app_settings()
    win = open_window(qtbot, app_model, "builtin", store)
    settle(qtbot, win)
    press(qtbot, win, Qt.Key.Key_PageDown, 9)  # step 6: compare mode
    assert win.session.plan.twin is not None
    win.close()
    remembered = AppSettings.load(store)
    assert remembered.prompt == FREE_PROMPT and not remembered.compare


@pytest.mark.parametrize(("width", "height"), [(1024, 768), (1280, 720)])
@pytest.mark.parametrize("presenter", [False, True])
def test_the_lesson_column_leaves_the_views_their_size(qtbot, window, width, height, presenter):
    if presenter:  # as set_presenter does, without asking the offscreen screen for full screen
        window.menuBar().hide()
        window.statusBar().hide()
        for widget in window.controls.settings_widgets:
            widget.hide()
        window.presentation.set_zoom(presenter_zoom(height))
        window.lesson.panel.lecturer_notes.set_shown(False)
        height += TITLE_BAR
    window.resize(width, height - TITLE_BAR)
    qtbot.waitUntil(lambda: window.width() == width and window.height() == height - TITLE_BAR, timeout=5_000)
    scroll = window.findChild(QScrollArea)
    panel = window.lesson.panel
    scale = window.presentation.zoom
    # 16:9 keeps a column beside the views; 4:3 is too narrow for it: a strip over them, in the controls' place
    qtbot.waitUntil(lambda: panel.beside == (width == 1280), timeout=5_000)
    assert window.controls.isVisible() == panel.beside
    for slide in (0, 1, 6, 7, 8) if presenter else (0, 1, 6, 7):  # the longest text, an answer, compare mode
        press(qtbot, window, Qt.Key.Key_PageDown, slide - window.lesson.slide)
        settle_layouts()  # the layout passes a resize posts
        where = f"at slide {slide}"
        assert scroll.horizontalScrollBar().maximum() == 0, f"the views are wider than the screen {where}"
        assert scroll.verticalScrollBar().maximum() == 0, f"the views do not fit the screen's height {where}"
        if window.workspace.compare_view.isVisibleTo(window):
            compare = window.workspace.compare_view
            assert compare.cached_grid.plot_widget.height() >= 80 * scale
            assert compare.uncached_grid.plot_widget.height() >= 80 * scale
        else:
            assert window.chart.height() >= 180 * scale and window.grid.plot_widget.height() >= 80 * scale
        assert panel.layout().totalHeightForWidth(panel.width()) <= panel.height(), f"lesson text clipped {where}"
        assert panel.text.font().pointSizeF() >= 13.5 * scale  # the app's text is 10 pt


# ----- lesson hygiene: nothing gives an answer away, the guess needs no click, leaving gives the free app back

NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                "twelve")


def _says(text: str, number: str) -> bool:
    """Whether `text` states `number` ("87", "2.4x"; small whole numbers in words too)."""
    digits = number.replace(",", "").rstrip("x").split(" ")[0]
    pattern = rf"(?<![\w.,]){re.escape(digits)}(?![\w]|[.,]\d)"
    if re.search(pattern, text.replace(",", "")):
        return True
    return digits.isdigit() and int(digits) < len(NUMBER_WORDS) and bool(
        re.search(rf"\b{NUMBER_WORDS[int(digits)]}\b", text, re.IGNORECASE))


def _panel_texts(win: MainWindow) -> list[str]:
    """What the lesson panel shows (its "step k of n" counter aside), and its notes even while hidden: a
    lecturer may show them on a mirrored screen."""
    panel = win.lesson.panel
    shown = [label.text() for label in (panel.title, panel.text, panel.question, panel.answer, panel.hint)
             if label.isVisibleTo(win)]
    return [*shown, panel.notes.text(), panel.guess_edit.text()]


def test_no_question_of_the_built_in_lesson_shows_its_answer_before_the_reveal(qtbot, window):
    lesson, asked = window.lesson, 0
    assert not window.lesson.panel.lecturer_notes.shown  # notes are hidden on the projected window until N
    while True:
        step = lesson.step
        if step.question and not lesson.revealed:
            before = _panel_texts(window)
            press(qtbot, window, Qt.Key.Key_PageDown)  # the reveal
            answer = window.lesson.panel.answer_text().removeprefix("measured ")
            with_cache, without_cache, _avoided = counts(window)
            forbidden = [answer]  # and for a difference or a ratio, the two counts it is made of
            if step.question in ("avoided_after_next", "ratio_after_next"):
                forbidden += [str(with_cache), str(without_cache)]
            for number in forbidden:
                assert not any(_says(text, number) for text in before), (step.title, number, before)
            asked += 1
        if lesson.slide + 1 == len(lesson.lesson.slides()):
            break
        press(qtbot, window, Qt.Key.Key_PageDown)
    assert asked == 4


def test_the_check_for_answers_finds_them():
    assert _says("For P = 3 and N = 12 that is 102 against 15.", "15") and _says("avoided 87 (6.8x)", "87")
    assert _says("one amber column", "1") and _says("is two tokens", "2") and _says("36,864 bytes", "36,864 bytes")
    assert not _says("step 12 of float32", "2") and not _says("once", "1") and not _says("6.8x", "8")


def test_notes_are_hidden_until_n_and_in_presenter_mode_open_in_a_window_of_their_own(qtbot, window):
    panel = window.lesson.panel
    assert window.lesson.step.notes and panel.notes_button.isVisible()
    assert not panel.notes.isVisible() and not window.actions["lesson_notes"].isChecked()
    qtbot.keyClick(window, Qt.Key.Key_N)
    assert panel.notes.isVisible() and panel.notes_button.isChecked()
    qtbot.keyClick(window, Qt.Key.Key_N)
    assert not panel.notes.isVisible()
    panel.notes_button.click()  # the button is the same switch
    assert panel.notes.isVisible() and window.actions["lesson_notes"].isChecked()
    window.presentation.presenter_changed.emit(True)  # as F11 does
    assert not panel.notes.isVisible() and panel.lecturer_notes.window is None
    # in presenter mode N shows them in a window of their own: the projected window never carries them
    qtbot.keyClick(window, Qt.Key.Key_N)
    notes = panel.lecturer_notes.window
    assert not panel.notes.isVisible() and notes is not None and notes.isVisible() and notes.isWindow()
    assert notes.text.text() == window.lesson.step.notes and not window.isAncestorOf(notes)
    qtbot.keyClick(window, Qt.Key.Key_PageDown)  # they follow the step
    assert notes.text.text() == (window.lesson.step.notes or "(no notes for this step)")
    notes.close()  # closing their window is N again
    assert not window.actions["lesson_notes"].isChecked()
    qtbot.keyClick(window, Qt.Key.Key_N)
    assert panel.lecturer_notes.window.isVisible()
    window.presentation.presenter_changed.emit(False)  # leaving presenter mode closes it and shows nothing more
    assert panel.lecturer_notes.window is None and not panel.notes.isVisible()
    assert ("Lesson notes (the lecturer's; hidden until shown)", "N") in ShortcutsDialog(
        window.actions.values(), window).rows()  # F1 lists it


def test_a_question_takes_typed_digits_and_enter_reveals_with_feedback(qtbot, window):
    panel, lesson = window.lesson.panel, window.lesson
    press(qtbot, window, Qt.Key.Key_PageDown, 6)  # step 4's question: avoided after the 12th token
    assert lesson.step.question == "avoided_after_next" and not lesson.revealed
    qtbot.waitUntil(lambda: QApplication.focusWidget() is panel.guess_edit, timeout=5_000)  # no click needed
    for key in (Qt.Key.Key_8, Qt.Key.Key_0):
        qtbot.keyClick(QApplication.focusWidget(), key)
    assert panel.guess_edit.text() == "80"
    assert panel.guess_label.isVisible() and not panel.hint.isVisible()
    qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Return)
    settle(qtbot, window)
    assert lesson.revealed and lesson.measured == 76
    assert panel.answer_text() == "you said 80 \u00b7 measured 76"
    assert panel.hint.isVisible() and panel.hint.text() == "Page Down: next"
    assert not panel.guess_label.isVisible() and not panel.guess_edit.isVisible()  # no orphan "your guess"


def test_the_guess_field_passes_space_and_the_lesson_keys_on(qtbot, window):
    press(qtbot, window, Qt.Key.Key_PageDown, 2)  # step 2's question, uncached at 3
    panel = window.lesson.panel
    qtbot.waitUntil(lambda: QApplication.focusWidget() is panel.guess_edit, timeout=5_000)
    qtbot.keyClick(panel.guess_edit, Qt.Key.Key_Space)  # Space steps the run, as everywhere in the lesson
    qtbot.waitUntil(lambda: window.session.steps_done == 4, timeout=30_000)
    assert panel.guess_edit.text() == "" and window.lesson.slide == 2
    qtbot.keyClick(panel.guess_edit, Qt.Key.Key_Right)  # Right goes on: the reveal
    settle(qtbot, window)
    assert window.lesson.revealed and window.lesson.measured == 5


def test_k_v_never_breaks_across_lines(qtbot, window):
    panel = window.lesson.panel
    press(qtbot, window, Qt.Key.Key_PageDown, 6)  # step 4: "K/V" in its text and its question
    label = panel.text
    assert "K/\u2060V" in label.text() and "K/\u2060V" in panel.question.text()
    assert keep_together("N(N\u22121)/2 K/V") == "N(N\u22121)/\u20602 K/\u2060V"

    def lines(text: str, width: int) -> list[str]:
        layout = QTextLayout(text, label.font())
        option = QTextOption()
        option.setWrapMode(QTextOption.WrapMode.WordWrap)
        layout.setTextOption(option)
        layout.beginLayout()
        out = []
        while (line := layout.createLine()).isValid():
            line.setLineWidth(width)
            out.append(text[line.textStart():line.textStart() + line.textLength()])
        layout.endLayout()
        return out

    plain = window.lesson.step.text
    widths = range(120, 600, 3)
    # without the joiner, some widths break "K/" from "V" (so the check below can fail)
    assert any(line.rstrip().endswith("K/") for width in widths for line in lines(plain, width))
    for width in widths:
        for line in lines(label.text(), width):
            assert not line.rstrip().endswith(("K/", "K/\u2060", "/\u2060")), (width, line)
    assert label.width() in range(100, 2000) and lines(label.text(), label.width())  # laid out in the panel


def test_leaving_the_lesson_gives_the_free_app_its_prompt_settings_and_run_back(qtbot, app_model):
    win = open_window(qtbot, app_model, None)
    try:
        qtbot.waitUntil(lambda: win.session.plan is not None, timeout=60_000)
        c = win.controls
        win.actions["toggle_cache"].trigger()  # C: the cache off
        c.max_new_spin.setValue(7)
        c.top_k_spin.setValue(5)
        win.actions["compare"].trigger()  # T: compare mode
        qtbot.waitUntil(lambda: win.session.plan is not None and win.session.plan.twin is not None
                        and win.session.plan.max_new_tokens == 7, timeout=30_000)
        for _ in range(2):
            win.session.step()
        qtbot.waitUntil(lambda: win.session.steps_done == 2, timeout=30_000)
        qtbot.keyClick(win, Qt.Key.Key_L)
        settle(qtbot, win)
        press(qtbot, win, Qt.Key.Key_PageDown, 3)  # step 2: "Time flies" without the cache, 12 tokens
        assert win.session.plan.prompt == "Time flies" and win.session.plan.twin is None
        qtbot.keyClick(win, Qt.Key.Key_Escape)
        qtbot.waitUntil(lambda: win.session.plan is not None and win.session.plan.prompt == FREE_PROMPT
                        and win.session.steps_done == 2, timeout=30_000)
        plan = win.session.plan
        assert c.prompt_edit.text() == FREE_PROMPT and not c.cache_check.isChecked()
        assert c.max_new_spin.value() == 7 and c.top_k_spin.value() == 5 and c.compare
        assert win.actions["compare"].isChecked() and not win.actions["break_cache"].isChecked()
        assert not plan.use_cache and plan.max_new_tokens == 7 and plan.twin is not None
    finally:
        win.close()
