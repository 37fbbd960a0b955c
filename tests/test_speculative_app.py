"""Speculative decoding in the window (issue #39): Run > Speculative decoding (D) restarts the run up to the same
token, a round at a time (a round adds 1 to k + 1 tokens, so the replay stops at the round that reaches it); what the
engine refuses with it is said in the banner and the run goes on; the worker loads a draft model once; the choice is
remembered."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog

from kvviz.app.assembly import open_window
from kvviz.app.settings import AppSettings, app_settings
from kvviz.app.window.main_window import MainWindow
from kvviz.app.window.speculative_dialog import DRAFT_MODEL, SpeculativeChoice, SpeculativeDialog
from kvviz.core.speculation import Drafter

# A line said twice: prompt lookup of 3-grams, 4 drafts a round, on the embedded model makes rounds that end at
# 1, 4, 7, 12, 13 and 16 tokens (checked below against the plain run's tokens).
QUOTING = "ROMEO:\nAnd, my lord, and my lord,\nAnd, my lord, and my lord,\nAnd,"
BUDGET = 16


@pytest.fixture
def window(qtbot, app_model):
    if app_model is not None:
        pytest.skip("the rounds counted here are the embedded model's")
    store = app_settings()
    settings = AppSettings.load(store)
    settings.max_new_tokens = BUDGET
    settings.save(store)
    win = open_window(None, QUOTING, settings=store)
    qtbot.addWidget(win)
    win.show()
    qtbot.waitUntil(lambda: win.session.plan is not None, timeout=60_000)
    yield win
    win.close()


def answer_dialog(monkeypatch, on: bool, k: int = 4, lookup: int = 3, by_model: bool = False) -> None:
    """The next Run > Speculative decoding dialog is answered with these values and OK."""

    def exec_(dialog: SpeculativeDialog) -> int:
        dialog.on_check.setChecked(on)
        dialog.k_spin.setValue(k)
        dialog.lookup_spin.setValue(lookup)
        dialog.drafter_combo.setCurrentIndex(int(by_model))
        return QDialog.DialogCode.Accepted

    monkeypatch.setattr(SpeculativeDialog, "exec", exec_)


def settled(win: MainWindow, speculative: bool, tokens: int) -> bool:
    s = win.session
    return (s.plan is not None and (s.plan.drafter is not None) == speculative and not s.replaying
            and s.steps_done == tokens and not s.asking and not win.scheduler.pending)


def press_space(qtbot, win: MainWindow, times: int) -> None:
    for _ in range(times):
        before = win.session.steps_done
        qtbot.keyClick(win, Qt.Key.Key_Space)
        qtbot.waitUntil(lambda b=before: win.session.steps_done > b, timeout=30_000)


def kept_tokens(records) -> list[int]:
    """The tokens a run has added, in order (a round adds its accepted drafts and the model's own token)."""
    out: list[int] = []
    for record in records:
        if record.speculation is not None:
            out.extend(record.speculation.token_ids)
        elif record.token_id is not None:
            out.append(record.token_id)
    return out


def test_d_restarts_the_run_speculatively_up_to_the_same_token_and_back(qtbot, window, monkeypatch):
    assert [k.toString() for k in window.actions["speculative"].shortcuts()] == ["D"]
    press_space(qtbot, window, 5)
    plain = kept_tokens(window.session.records)
    assert window.session.steps_done == 5 and len(plain) == 5

    answer_dialog(monkeypatch, on=True, k=4, lookup=3)
    qtbot.keyClick(window, Qt.Key.Key_D)
    # rounds end at 1, 4, 7: the replay stops at the round that reaches token 5, which is 7
    qtbot.waitUntil(lambda: settled(window, True, 7), timeout=60_000)
    s = window.session
    assert s.plan.drafter == Drafter(4, 3, "") and s.request.draft_tokens == 4 and s.request.prompt_lookup == 3
    assert [r.new_tokens for r in s.records] == [1, 4, 7]
    assert [(len(r.speculation.drafted), r.speculation.accepted) for r in s.records] == [(0, 0), (4, 2), (4, 2)]
    assert kept_tokens(s.records)[:5] == plain  # the same text as plain greedy decoding
    press_space(qtbot, window, 1)  # one round: 5 tokens (4 drafts accepted and the model's own)
    assert s.steps_done == 12 and len(s.records) == 4
    speculative = kept_tokens(s.records)

    answer_dialog(monkeypatch, on=False)
    qtbot.keyClick(window, Qt.Key.Key_D)
    qtbot.waitUntil(lambda: settled(window, False, 12), timeout=60_000)  # plain decoding: exactly token 12
    assert kept_tokens(window.session.records) == speculative
    assert not window.controls.speculative.on and window.controls.request().draft_tokens == 0


def test_steps_pressed_during_the_replay_wait_for_it(qtbot, window, monkeypatch):
    press_space(qtbot, window, 4)
    answer_dialog(monkeypatch, on=True)
    window.actions["speculative"].trigger()
    qtbot.waitUntil(lambda: window.session.plan is not None and window.session.plan.drafter is not None,
                    timeout=60_000)
    for _ in range(2):  # while the replay goes a round at a time (or is over already)
        window.session.step()
    qtbot.waitUntil(lambda: settled(window, True, 12), timeout=60_000)  # 4 (the replay's), then 7 and 12
    assert [r.new_tokens for r in window.session.records] == [1, 4, 7, 12]


@pytest.mark.parametrize("other", ["compare", "break_cache", "toggle_cache"])
def test_what_the_engine_refuses_with_speculation_is_said_and_the_run_goes_on(qtbot, window, monkeypatch, other):
    answer_dialog(monkeypatch, on=True)
    window.actions["speculative"].trigger()
    qtbot.waitUntil(lambda: settled(window, True, 0), timeout=60_000)
    press_space(qtbot, window, 2)
    run_id, done = window.session.plan.run_id, window.session.steps_done
    with qtbot.waitSignal(window.session.run_refused, timeout=30_000) as refused:
        window.actions[other].trigger()
    message = refused.args[0]
    assert message.startswith("Speculative decoding") and "\n" not in message and "Traceback" not in message
    assert window.banner.isVisible() and window.banner.text() == message
    assert window.session.plan.run_id == run_id and window.session.steps_done == done  # the run goes on
    assert not window.actions["compare"].isChecked() and not window.actions["break_cache"].isChecked()
    assert window.controls.cache_check.isChecked() and window.controls.request().draft_tokens == 4
    press_space(qtbot, window, 1)


def test_speculation_asked_for_in_compare_mode_is_refused(qtbot, window, monkeypatch):
    window.actions["compare"].trigger()
    qtbot.waitUntil(lambda: not window.session.asking and window.session.plan.twin is not None, timeout=60_000)
    answer_dialog(monkeypatch, on=True)
    with qtbot.waitSignal(window.session.run_refused, timeout=30_000) as refused:
        window.actions["speculative"].trigger()
    assert "compare mode" in refused.args[0] and window.banner.isVisible()
    assert not window.controls.speculative.on and window.session.plan.twin is not None
    assert window.actions["compare"].isChecked()


def test_the_worker_loads_the_draft_model_once(qtbot, window, monkeypatch):
    import kvviz.sources.weights as weights

    loads = []
    original = weights.attach_draft

    def counted(engine, source, *args, **kwargs):
        loads.append(source)
        return original(engine, source, *args, **kwargs)

    monkeypatch.setattr(weights, "attach_draft", counted)
    answer_dialog(monkeypatch, on=True, k=3, by_model=True)
    window.actions["speculative"].trigger()
    qtbot.waitUntil(lambda: settled(window, True, 0), timeout=60_000)
    source = window.session.request.draft_model
    assert source in (DRAFT_MODEL, f"random:{DRAFT_MODEL}") and window.session.plan.drafter == Drafter(3, 0, source)
    press_space(qtbot, window, 2)
    assert window.session.records[-1].speculation.draft_passes > 0  # the draft model drafted
    qtbot.keyClick(window, Qt.Key.Key_R)  # a second run with the same draft model
    qtbot.waitUntil(lambda: settled(window, True, 0), timeout=60_000)
    press_space(qtbot, window, 1)
    assert loads == [source]
    assert window.session.controller.worker.engine.draft is not None


def test_a_draft_model_that_fails_to_load_is_one_sentence_and_its_traceback_is_logged(qtbot, window, monkeypatch,
                                                                                        tmp_path):
    import kvviz.sources.weights as weights

    log = tmp_path / "kvviz.log"
    monkeypatch.setenv("KVVIZ_LOG", str(log))

    def broken(engine, source, *args, **kwargs):
        raise RuntimeError("the draft's weights are torn")

    monkeypatch.setattr(weights, "attach_draft", broken)
    press_space(qtbot, window, 2)
    answer_dialog(monkeypatch, on=True, by_model=True)
    with qtbot.waitSignal(window.session.run_refused, timeout=30_000) as refused:
        window.actions["speculative"].trigger()
    message = refused.args[0]
    assert message.startswith("Could not load the draft model ") and message.endswith("the draft's weights are torn.")
    assert "\n" not in message and window.banner.text() == message
    assert window.session.steps_done == 2 and window.session.plan.drafter is None  # the plain run goes on
    assert not window.controls.speculative.on
    assert "RuntimeError: the draft's weights are torn" in log.read_text(encoding="utf-8")


def test_the_choice_is_remembered(qtbot, app_model):
    store = app_settings()
    first = open_window(app_model, "Time flies", settings=store)
    qtbot.addWidget(first)
    first.controls.set_speculative(SpeculativeChoice(on=True, k=6, lookup=2))
    first.close()
    remembered = AppSettings.load(store)
    assert (remembered.speculative, remembered.draft_tokens, remembered.prompt_lookup) == (True, 6, 2)
    assert not remembered.draft_by_model
    second = open_window(app_model, "Time flies", settings=store)
    qtbot.addWidget(second)
    try:
        request = second.controls.request()
        assert (request.draft_tokens, request.prompt_lookup, request.draft_model) == (6, 2, "")
    finally:
        second.close()


def test_the_dialog_shows_the_choice_and_enables_what_applies(qtbot):
    dialog = SpeculativeDialog(SpeculativeChoice(on=False, k=5, lookup=4))
    qtbot.addWidget(dialog)
    assert not dialog.k_spin.isEnabled() and not dialog.lookup_spin.isEnabled()
    dialog.on_check.setChecked(True)
    assert dialog.k_spin.isEnabled() and dialog.lookup_spin.isEnabled()
    dialog.drafter_combo.setCurrentIndex(1)
    assert not dialog.lookup_spin.isEnabled()
    chosen = dialog.chosen()
    assert (chosen.on, chosen.k, chosen.by_model) == (True, 5, True)
    assert chosen.request_fields() == {"draft_tokens": 5, "prompt_lookup": 0, "draft_model": chosen.model}
