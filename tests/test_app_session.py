"""The run session, the redraw scheduler, typed settings and the worker's process-wide side effects."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_checkpoints import plan_ids

from kvviz.app.assembly import open_window as open_app_window
from kvviz.app.settings import AppSettings, SettingsFile, app_settings
from kvviz.app.window.main_window import MainWindow


def _tiny_checkpoint(folder: Path, n_layer: int, vocab_size: int = 50257) -> str:
    import torch

    from kvviz.models.gpt2 import GPT, GPTConfig
    from kvviz.sources.weights import save_checkpoint

    model = GPT(GPTConfig(vocab_size=vocab_size, n_ctx=64, n_layer=n_layer, n_head=2, n_embd=32, name="tiny"))
    model.init_weights(torch.Generator().manual_seed(n_layer))
    folder.mkdir()
    save_checkpoint(model, folder)
    return str(folder)


@pytest.fixture
def open_window(qtbot):
    windows = []

    def make(model: str | None, prompt: str = "Time flies fast") -> MainWindow:
        win = open_app_window(model, prompt, settings=app_settings())
        qtbot.addWidget(win)
        win.show()
        windows.append(win)
        return win

    yield make
    for win in windows:
        win.close()


def test_two_queued_loads_leave_the_window_on_the_last_one(qtbot, tmp_path, open_window, app_model):
    """Ctrl+O during a load: the picker, the runs and the saved settings all follow the model really loaded."""
    first = _tiny_checkpoint(tmp_path / "first", n_layer=2)
    second = _tiny_checkpoint(tmp_path / "second", n_layer=3)
    win = open_window(app_model)
    session = win.session
    qtbot.waitUntil(lambda: session.plan is not None, timeout=60_000)
    win.load_model(first)
    win.load_model(second)  # queued while the first is loading
    assert session.loading and not win.controls.step_button.isEnabled()
    qtbot.waitUntil(lambda: not session.loading and session.plan is not None and session.plan.n_layer == 3,
                    timeout=60_000)
    assert session.source == second and session.model_info.n_layer == 3
    assert win.picker.currentData() == second and win.picker.isEnabled()
    win.save_settings()
    assert AppSettings.load(app_settings()).model_source == second


def test_a_request_the_model_cannot_run_fails_before_the_views_reset(qtbot, tmp_path, open_window):
    """The engine checks a request when the run is requested (its vocabulary here), not at the first step."""
    small_vocab = _tiny_checkpoint(tmp_path / "small-vocab", n_layer=2, vocab_size=500)
    win = open_window(small_vocab, prompt="!")  # "!" is token 0: inside the vocabulary
    session = win.session
    qtbot.waitUntil(lambda: session.plan is not None, timeout=60_000)
    win.controls.prompt_edit.setText("Time flies")  # token 7575: outside a 500-token vocabulary
    with qtbot.assertNotEmitted(session.run_started, wait=300), qtbot.waitSignal(session.run_failed) as failed:
        win.reset_run()
    assert "outside the model's vocabulary" in failed.args[0] and failed.args[0].startswith("Prompt token")
    assert win.banner.isVisible() and "vocabulary" in win.banner.text()
    assert not win.controls.step_button.isEnabled()


def test_chart_frame_holds_the_with_cache_point_of_a_one_token_run(qtbot, app_model):
    """P = 3, N = 1: with the cache 4 K/V per layer (3 prefill + 1 cache fill), more than the 3 without."""
    from kvviz.app.views.work_chart import WorkChart
    from kvviz.engine.engine import Engine
    from kvviz.sources.weights import load_model

    engine = Engine(load_model(app_model).model)
    plan = plan_ids(engine, engine.encode_prompt("Time flies fast"), 1, use_cache=True)
    chart = WorkChart()
    qtbot.addWidget(chart)
    chart.reset(plan)
    chart.apply(list(engine.run(plan)))
    chart.refresh()
    _x, with_cache = chart.curve_data()["with_cache"]
    assert with_cache.tolist() == [3, 4]
    (_x_low, x_high), (_y_low, y_high) = chart.work_plot.getViewBox().viewRange()
    assert y_high >= 4 and x_high >= 2


def test_plan_frames_the_memory_plot_with_the_final_cache_size(qtbot):
    """gpt2's cache: 2 (K and V) x 12 layers x 768 (12 heads x 64) x 4 bytes = 73,728 bytes a position;
    "Hello, I am" (4 tokens) + 200 new tokens fill 204 positions: 14.34 MiB, in a frame that ends at 20."""
    import torch

    from kvviz.app.views.work_chart import WorkChart
    from kvviz.engine.engine import Engine
    from kvviz.models.gpt2 import GPT, GPTConfig

    with torch.device("meta"):  # gpt2's shape, no weights: planning reads the shape only
        engine = Engine(GPT(GPTConfig(n_ctx=1024, n_layer=12, n_head=12, n_embd=768)))
    plan = plan_ids(engine, engine.encode_prompt("Hello, I am"), 200)
    assert plan.cache_bytes_per_position == 73_728 and plan.final_cache_bytes == 73_728 * 204
    chart = WorkChart()
    qtbot.addWidget(chart)
    chart.reset(plan)
    (_x, _), (_low, top) = chart.mem_plot.getViewBox().viewRange()
    assert 20 <= top <= 21  # the frame is 0..20 MiB, with 5% padding


def test_settings_clamp_absurd_values_and_ignore_what_does_not_parse(tmp_path):
    path = tmp_path / "kvviz.json"
    path.write_text('{"run/max_new_tokens": 99999999999, "run/top_k": 1e400, "run/temperature": NaN, "run/seed": -5, '
                    '"run/use_cache": "maybe", "view/zoom": "nan", "view/speed_index": 3}', encoding="utf-8")
    settings = AppSettings.load(SettingsFile(path))
    assert settings.max_new_tokens == 4096 and settings.seed == 0 and settings.speed_index == 3
    assert settings.top_k == 0 and settings.temperature == 0.0 and settings.zoom == 1.0
    assert settings.use_cache is True


def test_settings_round_trip(tmp_path):
    store = SettingsFile(tmp_path / "kvviz.json")
    AppSettings(prompt="ROMEO:", use_cache=False, max_new_tokens=7, temperature=0.8, top_k=40, seed=3,
                speed_index=6, colour_blind=True, zoom=1.4, model_source="random:gpt2").save(store)
    again = AppSettings.load(SettingsFile(tmp_path / "kvviz.json"))
    assert again == AppSettings(prompt="ROMEO:", use_cache=False, max_new_tokens=7, temperature=0.8, top_k=40,
                                seed=3, speed_index=6, colour_blind=True, zoom=1.4, model_source="random:gpt2")


def test_garbage_is_collected_on_the_gui_thread_while_a_worker_exists(qtbot):
    """A Qt object in a reference cycle must never be destroyed by the worker: Python's automatic
    collector runs on whichever thread allocates, so while a worker exists only the GUI thread collects
    (a closed window collected on the worker thread aborted or froze the test suite)."""
    import gc
    import threading
    import weakref

    from kvviz.app.run.controller import WorkerController

    controller = WorkerController()
    try:
        destroyed_on: list[threading.Thread] = []

        class Cycle:
            pass

        gc.collect()  # counts at zero: the main thread allocates too little below to trigger a collection
        cycle = Cycle()
        cycle.itself = cycle
        weakref.finalize(cycle, lambda: destroyed_on.append(threading.current_thread()))
        del cycle

        def allocate_like_a_model_load():
            junk = [[index] for index in range(300_000)]  # far past every generation's threshold
            del junk

        worker = threading.Thread(target=allocate_like_a_model_load)
        worker.start()
        worker.join()
        assert destroyed_on == []
        qtbot.waitUntil(lambda: bool(destroyed_on), timeout=10_000)
        assert destroyed_on == [threading.main_thread()]
    finally:
        assert controller.stop(5000)
    assert gc.isenabled()


def test_step_pressed_right_after_play_pauses_it(qtbot, open_window, app_model):
    """P then Space before the worker has said it plays (#37, defect 2): the Space pauses autoplay and takes its
    one token; autoplay went on and the Space queued an extra token."""
    win = open_window(app_model)
    session = win.session
    qtbot.waitUntil(lambda: session.can_step, timeout=60_000)
    session.toggle_play(1000)  # 1 s a token
    session.step()  # at once: the worker has not answered the Play yet
    qtbot.waitUntil(lambda: session.steps_done >= 1 and not session.playing, timeout=30_000)
    # the Space's token, and autoplay's first where the worker took it before the pause reached it: two at most;
    # autoplay going on would take a third within 2.5 s (a token a second)
    with pytest.raises(qtbot.TimeoutError):
        qtbot.waitUntil(lambda: session.steps_done > 2, timeout=2_500)
    assert not session.playing
