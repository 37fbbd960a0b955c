"""View > Serving, Trace: the built-in trace served pass by pass in the window, its timeline showing each request's
state as the records say, its radix tree the records' nodes with their hits, its figures after the last pass; a
small pool's preemption in the timeline and in the decision; a trace that cannot be served is a dialog, and
nothing runs."""

from __future__ import annotations

from PySide6.QtCore import Qt


def _serving(window, qtbot):
    qtbot.keyClick(window, Qt.Key.Key_B, Qt.KeyboardModifier.ShiftModifier)  # View > Serving (its batch planned)
    mode = window.serving
    qtbot.waitUntil(lambda: mode.batch.plan is not None, timeout=30_000)
    return mode, window.workspace.serving.get()


def test_the_built_in_trace_runs_to_the_end_and_the_views_show_its_records(window, qtbot, tmp_path):
    from kvviz.app.export import export_widget
    from kvviz.app.views.serving.trace_state import figure_rows
    from kvviz.core.serve_records import NOT_ARRIVED, ServePlan, ServeRequest, measure

    mode, page = _serving(window, qtbot)
    with qtbot.waitSignal(mode.batch.run_measured, timeout=60_000) as measured:
        mode.run_trace(ServeRequest(0), passes=10_000)  # every pass, on its own
    plan, records = mode.batch.plan, mode.batch.records
    assert isinstance(plan, ServePlan) and records[-1].final and len(plan.requests) == 7
    mode.scheduler.flush()
    view = page.trace_view
    assert page.shown_view is view and not page.view.isVisible() and page.trace_choice.isChecked()
    timeline = view.timeline
    assert timeline.current == records[-1].step and timeline.names == tuple(r.name for r in plan.requests)
    by_step = {r.step: r for r in records}
    states = None
    for step in range(records[-1].step + 1):  # a column a pass; a pass the scheduler skipped keeps the states
        states = by_step[step].states if step in by_step else states
        assert [timeline.state_at(i, step) for i in range(7)] == list(states), step
    assert timeline.state_at(6, 0) == NOT_ARRIVED  # chat 4 arrives at pass 47: blank until then
    last = records[-1]
    assert view.decision.text() == last.decision
    # the radix tree: as many boxes as the record's nodes, each with its hit count
    assert view.tree.isVisible() and len(view.tree.boxes) == len(last.tree) > 5
    for (_run, counts), node in zip(view.tree.node_texts(), last.tree, strict=True):
        assert counts.endswith(f"{node.hits} hit{'' if node.hits == 1 else 's'}")
    assert sum(node.hits for node in last.tree) > 0
    # the pool: cached blocks in their own state, counted in the legend
    cells = view.pool.cells
    assert sum(c.cached for c in cells) == len(last.cached_blocks) > 0
    assert sum(c.free for c in cells) == len(last.free_blocks)
    assert f"cached, evictable <b>{len(last.cached_blocks)}</b>" in view.pool_legend.text()
    # the figures per request, from kvviz.core.serve_records.measure, in the timeline's rows
    assert measured.args[0] == measure(plan, records)
    assert timeline.figures == figure_rows(measured.args[0]) and view.figures_line.isVisible()
    assert f"serving a trace of 7 requests \u00b7 pass {last.step} \u00b7 done" in window.status.text()
    assert set(window.workspace.export_targets()) == {"serving", "timeline", "pool", "radix_tree"}
    assert mode.caption().startswith(f"A trace of 7 requests \u2014 {plan.model_name}, after pass {last.step}, "
                                     "radix-tree prefix cache, chunks of 16, 64 blocks of 16")
    assert export_widget(view, tmp_path / "trace.png", 1280).is_file()

    # the keys step it as a batch: R plans it anew, Space takes one pass, Page Down another
    qtbot.keyClick(window, Qt.Key.Key_R)
    qtbot.waitUntil(lambda: mode.batch.plan is not None and not mode.batch.records, timeout=30_000)
    qtbot.keyClick(window, Qt.Key.Key_Space)
    qtbot.keyClick(window, Qt.Key.Key_PageDown)
    qtbot.waitUntil(lambda: len(mode.batch.records) == 2, timeout=30_000)
    mode.scheduler.flush()
    assert timeline.current == 1 and view.decision.text() == mode.batch.records[1].decision
    assert not timeline.figures and not view.figures_line.isVisible()

    # hash mode: no tree, a line saying why
    page.trace_inputs.prefix_cache.setCurrentIndex(page.trace_inputs.prefix_cache.findData("hash"))
    page.trace_inputs.run_button.click()
    qtbot.waitUntil(lambda: mode.batch.plan is not None and mode.batch.plan.prefix_cache == "hash",
                    timeout=30_000)
    mode.scheduler.flush()
    assert not view.tree.isVisible() and view.tree_note.isVisible() and "hash" in view.tree_note.text().lower()
    page.batch_choice.click()  # Batch again: the batch's view
    qtbot.waitUntil(lambda: mode.batch.plan is not None and not isinstance(mode.batch.plan, ServePlan),
                    timeout=30_000)
    assert page.view.isVisible() and not view.isVisible()


def test_a_small_pool_preempts_in_the_timeline_and_a_bad_trace_is_a_dialog(window, qtbot, tmp_path, monkeypatch):
    from kvviz.core.serve_records import PREEMPTED, ServeRequest

    mode, page = _serving(window, qtbot)
    view = page.trace_view
    errors = []
    monkeypatch.setattr("kvviz.app.window.trace_inputs.show_error", lambda parent, title, text: errors.append(text))
    monkeypatch.setattr("kvviz.app.window.serving_mode.show_error", lambda parent, title, text: errors.append(text))
    # a trace that cannot be read: a dialog with its one line, nothing planned, the batch shown stays
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"arrive_at_pass": 0, "prompt": "Hello"\n', encoding="utf-8")
    plan = mode.batch.plan
    page.set_kind("trace")
    with qtbot.assertNotEmitted(mode.batch.run_started, wait=100):
        assert not page.trace_inputs.open_trace_file(str(bad))
    assert len(errors) == 1 and "bad.jsonl, line 1: not JSON" in errors[0] and "\n" not in errors[0]
    assert page.trace_inputs.trace_path is None  # still the built-in trace

    seen = []

    def on_computed(record) -> None:  # the first preemption, as the view draws it at that pass
        if record.preempted and not seen:
            mode.scheduler.flush()
            victim = record.preempted[0]
            seen.append((record, victim, view.timeline.state_at(victim, record.step), view.decision.text()))

    mode.batch.record_computed.connect(on_computed)
    mode.run_trace(ServeRequest(0, chunk=32, num_blocks=15), passes=10_000)  # the document and the chats
    qtbot.waitUntil(lambda: bool(seen), timeout=60_000)
    mode.batch.record_computed.disconnect(on_computed)
    record, victim, state, decision = seen[0]
    name = mode.batch.plan.requests[victim].name
    assert record.states[victim] == state == PREEMPTED
    assert decision == record.decision and f"preempted {name}, the youngest" in decision
    assert page.trace_inputs.blocks.value() == 15 and page.trace_inputs.chunk.value() == 32  # the settings shown
    assert plan is not mode.batch.plan

    # a request that can never fit the pool: refused before any pass, in a dialog
    with qtbot.waitSignal(mode.batch.run_failed, timeout=30_000), \
            qtbot.assertNotEmitted(mode.batch.run_started, wait=0):
        mode.run_trace(ServeRequest(0, num_blocks=12))
    assert len(errors) == 2 and "can never fit the pool" in errors[1]
    assert mode.batch.plan is None and mode.batch.records == [] and not mode.batch.can_step  # nothing runs
