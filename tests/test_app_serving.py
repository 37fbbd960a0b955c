"""View > Serving: a batch of four prompts sharing a system prompt, stepped by the clicker's key in the window,
its pool drawn as the hand count says, its speed measured after the last pass, exported as an image."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QImage


def test_the_serving_view_steps_a_shared_prefix_batch_by_clicker_and_exports(window, qtbot, tmp_path, monkeypatch):
    from kvviz.app.export import export_widget
    from kvviz.app.views.serving.pool_state import block_tooltip

    qtbot.keyClick(window, Qt.Key.Key_B, Qt.KeyboardModifier.ShiftModifier)  # View > Serving
    mode = window.serving
    qtbot.waitUntil(lambda: mode.batch.plan is not None, timeout=30_000)
    plan = mode.batch.plan
    assert len(plan.requests) == 4 and plan.block_size == 8
    with qtbot.waitSignal(mode.batch.run_measured, timeout=60_000) as measured:
        for n in range(plan.passes):
            qtbot.keyClick(window, Qt.Key.Key_PageDown)  # a presenter's clicker
            qtbot.waitUntil(lambda n=n: len(mode.batch.records) > n, timeout=30_000)
    record = mode.batch.records[-1]
    assert record.final and all(len(out) == 16 for out in record.outputs)
    # the status bar says the batch's progress, not the run's "0/12 tokens"
    assert f"serving 4 requests \u00b7 pass {plan.passes}/{plan.passes} \u00b7 done" in window.status.text()
    ids = [r.prompt_ids for r in plan.requests]
    common = next(n for n in range(min(map(len, ids))) if len({i[n] for i in ids}) > 1)
    view = window.workspace.serving.get().view
    shared = [cell for cell in view.pool.cells if cell.shared]
    assert [cell.owners for cell in shared] == [(0, 1, 2, 3)] * (common // 8)  # the system prompt, stored once
    assert sum(cell.free for cell in view.pool.cells) == plan.num_blocks - record.blocks_used
    assert block_tooltip(shared[0], 8).startswith("Block 0: positions 0\u20137, 8 of 8 slots filled, shared by "
                                                  "R1, R2, R3, R4 (4 references; stored once)")
    assert f"{measured.args[0].speedup:.2f}\u00d7" in view.speed_line.text()
    image = QImage(str(export_widget(view, tmp_path / "serving.png", 1280)))
    assert image.width() == 1280
    page = window.workspace.serving.get()
    window.presentation.set_presenter(True)  # F11: the batch's settings make room for the view, as the run's do
    assert not page.inputs.isVisible() and view.isVisible()
    window.presentation.set_presenter(False)
    assert page.inputs.isVisible()

    errors = []
    monkeypatch.setattr("kvviz.app.window.serving_page.show_error", lambda parent, title, text: errors.append(text))
    window.workspace.serving.get().prompts.setPlainText("\n   \n")
    qtbot.keyClick(window, Qt.Key.Key_R)  # run the batch again: there is no prompt
    assert errors == ["Type at least one prompt, one per line, or open a prompts file."]
    assert mode.batch.records[-1] is record  # the batch shown stays

    window.workspace.serving.get().prompts.setPlainText("ROMEO:\nJULIET:")
    window.load_model("random:kvviz-shakespeare-gqa")  # another model: the batch is planned anew on it
    gqa = "random:kvviz-shakespeare-gqa"
    qtbot.waitUntil(lambda: mode.batch.plan is not None and mode.batch.plan.model_name == gqa, timeout=60_000)
    qtbot.keyClick(window, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: len(mode.batch.records) == 1, timeout=30_000)

    qtbot.keyClick(window, Qt.Key.Key_B, Qt.KeyboardModifier.ShiftModifier)
    assert window.run_view.isVisible() and not window.workspace.serving.get().isVisible()
    assert "serving" not in window.status.text()  # the run's line again
    with qtbot.waitSignal(window.session.model_loaded, timeout=60_000):  # a switch, the view closed: the batch goes
        window.load_model("random:kvviz-shakespeare")
    assert view.records == [] and "planned anew" in view.summary.text() and not any(c for c in view.pool.cells)
    assert window.run_view.grid.plot_widget.hasFocus()  # Space steps the run again, typing nothing


def test_the_paging_lesson_reveals_the_blocks_measured_and_leaving_it_brings_the_run_back(qtbot, app_model):
    from kvviz.app.assembly import open_window
    from kvviz.app.settings import app_settings

    win = open_window(app_model, "hello", settings=app_settings(), lesson="kv-paging")
    qtbot.addWidget(win)
    win.show()
    try:
        qtbot.waitUntil(lambda: win.lesson.ready, timeout=60_000)
        page = win.workspace.serving.get()
        assert win.serving.active and page.isVisible()
        assert not page.inputs.isVisible()  # the step's batch: no prompts to edit, more room for the view
        assert win.serving.batch.records == []  # the question: before the first pass
        qtbot.keyClick(win, Qt.Key.Key_PageDown)  # the answer: the batch runs to its end
        qtbot.waitUntil(lambda: win.lesson.ready, timeout=60_000)
        assert win.lesson.measured == win.serving.batch.records[-1].blocks_used == 18
        qtbot.keyClick(win, Qt.Key.Key_PageDown)  # step 2: two prefills
        qtbot.waitUntil(lambda: win.lesson.ready, timeout=60_000)
        assert [r.prefill for r in win.serving.batch.records] == [True, True]
        assert win.serving.batch.records[-1].reused_positions == 48
        qtbot.keyClick(win, Qt.Key.Key_Escape)
        qtbot.waitUntil(lambda: not win.lesson.active and win.session.plan is not None
                        and win.session.plan.prompt == "hello", timeout=60_000)
        assert not win.serving.active and win.run_view.isVisible()
        win.actions["serving"].trigger()  # the free app's serving view has its inputs again
        assert page.isVisible() and page.inputs.isVisible()
    finally:
        win.close()


def test_every_press_during_a_pass_gets_its_pass_and_none_goes_past_the_last(window, qtbot):
    """Space pressed faster than the passes compute: each press is one pass, in turn, as a run's Step is one token
    (the same session protocol); presses past the batch's last pass ask for nothing."""
    qtbot.keyClick(window, Qt.Key.Key_B, Qt.KeyboardModifier.ShiftModifier)  # View > Serving
    batch = window.serving.batch
    qtbot.waitUntil(lambda: batch.plan is not None, timeout=30_000)
    for _ in range(5):  # all five before the first pass can have arrived
        qtbot.keyClick(window, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: len(batch.records) == 5, timeout=60_000)
    with qtbot.assertNotEmitted(batch.record_computed, wait=300):
        pass  # no sixth
    assert [r.step for r in batch.records] == [0, 1, 2, 3, 4]
    passes = batch.plan.passes
    for _ in range(passes + 3):
        qtbot.keyClick(window, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: batch.finished, timeout=60_000)
    with qtbot.assertNotEmitted(window.session.controller.worker.computed, wait=300):
        qtbot.keyClick(window, Qt.Key.Key_Space)
    assert len(batch.records) == passes and batch.records[-1].final


def test_the_speed_measured_after_a_batch_gives_way_to_the_next_request(window, qtbot, monkeypatch):
    """After the last pass the worker times the batch against one at a time (up to a minute on a big model); a
    model switch asked for meanwhile stops that timing and loads at once, instead of waiting behind it."""
    import kvviz.engine.serving as serving

    timings = []

    def endless(engine, plan, *args, **kwargs):  # a timing that never ends unless the worker stops it
        timings.append("started")
        while True:
            for _ in serving.run_batch(engine, plan):
                pass

    monkeypatch.setattr(serving, "measure_speed", endless)
    qtbot.keyClick(window, Qt.Key.Key_B, Qt.KeyboardModifier.ShiftModifier)  # View > Serving
    batch = window.serving.batch
    qtbot.waitUntil(lambda: batch.plan is not None, timeout=30_000)
    for n in range(batch.plan.passes):
        qtbot.keyClick(window, Qt.Key.Key_Space)
        qtbot.waitUntil(lambda n=n: len(batch.records) > n, timeout=30_000)
    qtbot.waitUntil(lambda: timings == ["started"], timeout=10_000)
    window.load_model("random:kvviz-shakespeare-gqa")
    gqa = "random:kvviz-shakespeare-gqa"
    qtbot.waitUntil(lambda: batch.plan is not None and batch.plan.model_name == gqa, timeout=60_000)


def test_the_memory_chart_keeps_its_legend_inside_at_any_width(qtbot):
    """Three names in a row where they fit, fewer where they do not: never past the plot's right edge."""
    from kvviz.app.views.serving.serving_chart import ServingChart

    chart = ServingChart()
    qtbot.addWidget(chart)
    chart.setVisible(True)  # (its show() draws records)
    for width in (1200, 520, 360):
        chart.resize(width, 300)
        qtbot.waitUntil(lambda width=width: chart.width() == width, timeout=5_000)
        box = chart.getPlotItem().getViewBox().sceneBoundingRect()
        assert chart.legend.sceneBoundingRect().right() <= box.right(), width
    assert chart.legend.columnCount < 3  # at the narrowest


def test_the_memory_chart_keeps_its_lines_under_its_legend(qtbot):
    """The dashed contiguous line, the highest, is drawn below the legend's box at any size (at 720p the legend's
    second row covered it)."""
    from types import SimpleNamespace

    from PySide6.QtCore import QPointF

    from kvviz.app.views.serving.serving_chart import ServingChart

    mib = 2.5
    chart = ServingChart()
    qtbot.addWidget(chart)
    chart.setVisible(True)
    chart.reset(SimpleNamespace(passes=20, contiguous_reserved_bytes=int(mib * 1024 * 1024)))  # what reset reads
    for width, height in ((1200, 400), (520, 240), (420, 220)):  # 720p's is about 440 x 230
        chart.resize(width, height)
        qtbot.waitUntil(lambda w=width, h=height: chart.size().toTuple() == (w, h), timeout=5_000)
        box = chart.getPlotItem().getViewBox()
        contiguous = box.mapViewToScene(QPointF(1.0, mib)).y()
        assert chart.legend.sceneBoundingRect().bottom() < contiguous, (width, height)
