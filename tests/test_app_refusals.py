"""One rule for every refused setting (issue #36, section 2): the run going on goes on, exactly as it was. Every
refusable setting on every family is refused here, then the run steps on: Step and Play stay, the menus' checkmarks
and the controls show the run's real settings, and the views keep its records."""

from __future__ import annotations

import pytest
from helpers_checkpoints import byte_level_tokenizer, save_kvviz_folder
from PySide6.QtCore import Qt

from kvviz.app.assembly import open_window
from kvviz.app.settings import app_settings
from kvviz.app.window.main_window import MainWindow

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("refusals")
    latent = root / "tiny-deepseek"
    config = transformers.DeepseekV2Config(
        vocab_size=400, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
        kv_lora_rank=8, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
        first_k_dense_replace=2, max_position_embeddings=64)
    transformers.DeepseekV2ForCausalLM(config).save_pretrained(latent)
    byte_level_tokenizer().save(str(latent / "tokenizer.json"))
    odd = save_kvviz_folder(root / "odd-heads", n_layer=2, n_head=2, n_embd=30, n_ctx=64)  # heads of 15 numbers
    return {"mla": str(latent), "gpt2-odd-heads": str(odd), "gqa": "kvviz-shakespeare-gqa"}


def _state(win: MainWindow) -> tuple:
    """What a lecturer sees of the run: its plan, its step, the controls' request and every run checkmark."""
    names = ("break_cache", "compare", "attention", "kv_exact", "kv_int8", "kv_int4", "kv_fp8")
    request = win.controls.request()
    return (win.session.plan.run_id, win.session.steps_done, request,
            tuple(win.actions[name].isChecked() for name in names))


def _refuse(qtbot, win: MainWindow, change) -> None:
    before = _state(win)
    with qtbot.waitSignal(win.session.run_refused, timeout=30_000):
        change(win)
    win.redraw()
    assert _state(win) == before
    assert win.session.can_step and win.controls.step_button.isEnabled() and win.banner.isVisible()
    steps = win.session.steps_done
    qtbot.keyClick(win, Qt.Key.Key_Space)  # the run goes on
    qtbot.waitUntil(lambda: win.session.steps_done == steps + 1 and not win.scheduler.pending, timeout=30_000)


REFUSALS = {  # family -> the settings it refuses, each as the menu or key sets it
    "mla": [lambda w: w.actions["break_cache"].trigger(), lambda w: w.actions["kv_int8"].trigger(),
            lambda w: w.actions["kv_fp8"].trigger(), lambda w: w.controls.set_window(8, 0),
            lambda w: w.controls.set_window(8, 2)],
    "gpt2-odd-heads": [lambda w: w.actions["kv_int4"].trigger()],
    "gqa": [lambda w: w.actions["kv_int8"].trigger()],  # with a window set first: one trade-off at a time
}


@pytest.mark.parametrize("family", list(REFUSALS))
def test_every_refused_setting_leaves_the_run_going_as_it_was(qtbot, models, family):
    win = open_window(models[family], "Time flies", settings=app_settings())
    qtbot.addWidget(win)
    win.show()
    try:
        qtbot.waitUntil(lambda: win.session.plan is not None, timeout=60_000)
        if family == "gqa":
            with qtbot.waitSignal(win.run_prepared, timeout=30_000):
                win.controls.set_window(8, 0)
            qtbot.waitUntil(lambda: win.session.plan is not None and win.session.plan.policy.window == 8,
                            timeout=30_000)
        qtbot.keyClick(win, Qt.Key.Key_Space)
        qtbot.waitUntil(lambda: win.session.steps_done == 1, timeout=30_000)
        for refusal in REFUSALS[family]:
            _refuse(qtbot, win, refusal)
    finally:
        win.close()


def test_leaving_a_quantized_lesson_leaves_one_precision_checked(qtbot, app_model):
    """The lesson's int8 step checks Run > KV cache precision > int8; Esc gives the free app its exact cache back,
    and the menu shows that one precision only (an exclusive group unchecks the others only through signals)."""
    win = open_window(app_model, "Time flies", settings=app_settings(), lesson="kv-quantized")
    qtbot.addWidget(win)
    win.show()
    try:
        qtbot.waitUntil(lambda: win.lesson.ready and not win.scheduler.pending, timeout=60_000)
        assert win.actions["kv_int8"].isChecked() and not win.actions["kv_exact"].isChecked()
        qtbot.keyClick(win, Qt.Key.Key_Escape)
        qtbot.waitUntil(lambda: not win.lesson.active and win.session.plan is not None
                        and win.session.plan.policy.kv_dtype == "", timeout=30_000)
        checked = [name for name in ("kv_exact", "kv_int8", "kv_int4", "kv_fp8") if win.actions[name].isChecked()]
        assert checked == ["kv_exact"]
    finally:
        win.close()
