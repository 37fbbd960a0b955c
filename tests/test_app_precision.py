"""Run > Precision: the model reloads in the chosen dtype, the choice is remembered, and a dtype the device
cannot compute in gets a dialog and keeps the model and the menu as they were."""

from __future__ import annotations

from PySide6.QtWidgets import QMessageBox

from kvviz.app.assembly import open_window
from kvviz.app.settings import AppSettings, app_settings
from kvviz.app.window.main_window import MainWindow

PROMPT = "Time flies fast"


def _checked(win: MainWindow) -> list[str]:
    return [name for name in ("float32", "bfloat16", "float16") if win.actions[f"dtype_{name}"].isChecked()]


def _step(qtbot, win: MainWindow, n: int) -> None:
    """Step the run on to `n` new tokens."""
    for _ in range(n - win.session.steps_done):
        win.session.step()
    qtbot.waitUntil(lambda: win.session.last_record is not None and win.session.last_record.new_tokens == n,
                    timeout=30_000)


def test_bfloat16_reloads_the_model_and_halves_the_cache(qtbot, window):
    assert _checked(window) == ["float32"] and window.session.model_info.dtype == "float32"
    _step(qtbot, window, 2)
    float32_bytes = window.session.last_record.cache_bytes
    window.actions["dtype_bfloat16"].trigger()
    assert _checked(window) == ["bfloat16"]
    qtbot.waitUntil(lambda: window.session.model_info.dtype == "bfloat16" and window.session.plan is not None
                    and not window.session.loading, timeout=60_000)
    # the run is replayed to where it was, as for any other change of a run setting
    qtbot.waitUntil(lambda: window.session.steps_done == 2, timeout=30_000)
    # the cache's tensors, measured: 2 bytes a number instead of 4, the same positions
    assert window.session.last_record.cache_bytes * 2 == float32_bytes
    window.save_settings()
    assert AppSettings.load(app_settings()).dtype == "bfloat16"


def test_the_remembered_precision_is_loaded_next_time(qtbot, app_model):
    store = app_settings()
    store.setValue("model/dtype", "bfloat16")
    store.sync()
    win = open_window(app_model, PROMPT, settings=app_settings())
    qtbot.addWidget(win)
    win.show()
    qtbot.waitUntil(lambda: win.session.model_info is not None and win.session.plan is not None, timeout=60_000)
    assert win.session.model_info.dtype == "bfloat16" and _checked(win) == ["bfloat16"]
    win.close()


def test_a_precision_the_device_cannot_run_keeps_the_model_and_the_menu(qtbot, window, monkeypatch):
    import kvviz.models.gpt2

    errors: list[tuple[str, str]] = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text, *a, **k: errors.append((title, text)))
    real_forward = kvviz.models.gpt2.GPT.forward

    def no_half(self, idx, *args, **kwargs):
        if self.transformer.wte.weight.dtype == torch_float16():
            raise RuntimeError('"addmm_impl_cpu_" not implemented for \'Half\'')
        return real_forward(self, idx, *args, **kwargs)

    monkeypatch.setattr(kvviz.models.gpt2.GPT, "forward", no_half)
    _step(qtbot, window, 3)
    info = window.session.model_info
    window.actions["dtype_float16"].trigger()
    qtbot.waitUntil(lambda: bool(errors) and not window.session.loading, timeout=60_000)
    title, text = errors[0]
    assert text.startswith("float16 cannot run on cpu here") and "previous precision is kept" in text
    assert "\n" not in text
    assert window.session.model_info is info and info.dtype == "float32"
    assert _checked(window) == ["float32"]
    assert window.session.last_record.new_tokens == 3  # the run goes on where it was
    _step(qtbot, window, 4)
    window.save_settings()
    assert AppSettings.load(app_settings()).dtype == "float32"


def torch_float16():
    import torch

    return torch.float16
