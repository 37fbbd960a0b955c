"""Eviction by importance in the app: Run > Evict by importance (E) runs H2O, TOVA, SnapKV or PyramidKV; the grid
shows what the method evicted (its tooltip says why and when) and, with View > Scores, shades what it keeps by its
score; the attention view marks the evicted positions; the counter, the memory view and the status line say it;
compare mode puts the full cache against it; what the engine refuses is said in the banner."""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor


def choose(monkeypatch, method: str, budget: int, pool: int = 0) -> None:
    """Run > Evict by importance answers `method`, `budget` (and `pool`) and OK, as a person would."""
    from kvviz.app.window.eviction_dialog import EvictionDialog

    def answer(dialog: EvictionDialog) -> int:
        dialog.method_combo.setCurrentIndex(dialog.method_combo.findData(method))
        dialog.budget_spin.setValue(budget)
        dialog.pool_spin.setValue(pool)
        return 1

    monkeypatch.setattr(EvictionDialog, "exec", answer)


def step_to(qtbot, window, tokens: int) -> None:
    for _ in range(tokens):
        qtbot.keyClick(window, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: window.session.last_record is not None
                    and window.session.last_record.new_tokens == tokens, timeout=30_000)
    window.redraw()


def cell_colour(image: np.ndarray, rows: int, row: int, position: int) -> np.ndarray:
    """The RGB at the middle of the cell (`row`, `position`) of a plot image drawn `rows` rows tall."""
    size = image.shape[0] // rows
    return image[row * size + size // 2, position * size + size // 2, :3].astype(int)


def test_h2o_from_the_run_menu_evicts_in_the_grid_shades_scores_and_marks_the_attention(qtbot, window, monkeypatch):
    """E, H2O with a budget of 4, on "Time flies fast" (3 tokens) for 8 tokens: each grid row shows EVICTED exactly
    where the record says no head holds a position, its tooltip gives the score that evicted it and when;
    View > Scores draws the lowest-scored kept cell fainter than the highest; the attention strip draws the
    evicted positions in the evicted colour; the counter, the memory view and the status line say it."""
    from kvviz.app import theme
    from kvviz.app.views.grid.cell_states import EVICTED

    with qtbot.waitSignal(window.run_prepared, timeout=10_000):
        window.actions["attention"].trigger()
    choose(monkeypatch, "h2o", 4)
    with qtbot.waitSignal(window.run_prepared, timeout=10_000):
        qtbot.keyClick(window, Qt.Key.Key_E)
    assert window.session.plan.policy.describe() == "4 positions a layer, chosen by H2O"
    step_to(qtbot, window, 8)
    record, grid = window.session.last_record, window.grid
    states = grid.cell_states()
    for layer, kept in enumerate(record.eviction.layers):
        gone = [p for p, heads in enumerate(kept.heads) if heads == 0]
        assert gone and list(np.flatnonzero(states[layer] == EVICTED)) == gone
    assert record.eviction.tooltip(5, gone[0]) in grid.cell_info(5, gone[0])
    held = kept.kept()[0]
    assert f"kept by every head: accumulated attention {kept.scores[held]:.4g}" in grid.cell_info(5, held)
    assert "keeping 4 a layer by H2O" in grid.title.text() and grid.legend_row.is_shown(EVICTED)

    qtbot.keyClick(window, Qt.Key.Key_E, Qt.KeyboardModifier.ShiftModifier)  # View > Scores
    assert window.actions["scores"].isChecked()
    window.redraw()
    image, empty = grid.image_item.image, np.array(QColor(theme.current().empty).getRgb()[:3])
    shown = [p for p in kept.kept() if p < record.fed_stop - 1]  # reused ones (the newest is computed, amber)
    low, high = min(shown, key=lambda p: kept.scores[p]), max(shown, key=lambda p: kept.scores[p])
    faint, strong = (np.abs(cell_colour(image, 6, 5, p) - empty).sum() for p in (low, high))
    assert faint < strong / 2

    attention = window.run_view.attention
    attention.set_layer(5)
    window.redraw()
    strip = attention.image_item.image  # (heads × s, width × s, 4)
    size = strip.shape[1] // window.session.plan.width
    cell = strip[:, gone[0] * size:(gone[0] + 1) * size, :3].reshape(-1, 3).astype(int)
    assert (cell == np.array(QColor(theme.current().evicted).getRgb()[:3])).all(axis=1).any()
    assert "reads no key of it: evicted" in attention.cell_info(0, gone[0])
    assert "positions H2O kept (striped: the" in attention.heading.text()

    assert "K/V evicted from every head" in window.counter.window_note.text()
    assert "chosen by H2O" in window.status.text()
    window.actions["memory"].trigger()
    memory = window.workspace.memory_view
    x, y = memory.model_line()
    assert (y[x >= 4] == y[x >= 4][0]).all() and y[x < 4].max() < y[x >= 4][0]  # flat from the budget on
    assert record.cache_bytes == sum(record.layer_bytes) == y[x >= 4][0]  # as measured
    assert "then flat: 4 positions a layer, chosen by H2O" in memory.formula.text()


def test_what_the_engine_refuses_is_said_in_the_banner_and_the_run_goes_on(qtbot, window, monkeypatch):
    """H2O beside a sliding window, then SnapKV with an even pooling: each is the engine's one line in the banner,
    and the run and its settings stay as they were."""
    with qtbot.waitSignal(window.run_prepared, timeout=10_000):
        window.controls.set_window(4, 0)
    choose(monkeypatch, "h2o", 8)
    with qtbot.waitSignal(window.session.run_refused, timeout=10_000):
        qtbot.keyClick(window, Qt.Key.Key_E)
    assert "a window is another trade-off" in window.banner.text()
    assert window.session.plan.policy.window == 4 and window.controls.eviction.method == ""
    with qtbot.waitSignal(window.run_prepared, timeout=10_000):
        window.controls.set_window(0, 0)
    choose(monkeypatch, "snapkv", 8, pool=4)
    with qtbot.waitSignal(window.session.run_refused, timeout=10_000):
        qtbot.keyClick(window, Qt.Key.Key_E)
    assert "Pooling averages an odd number" in window.banner.text()
    assert not window.session.plan.policy.evicts and window.controls.eviction.method == ""


def test_compare_mode_puts_the_full_cache_against_h2o_as_a_trade_off(qtbot, window, monkeypatch):
    """H2O with a budget of 2, then T: the full cache beside H2O in lockstep; only H2O's grid evicts, the identity
    strip and the status name the runs, and once the logits part the banner calls it a trade-off."""
    from kvviz.app.views.grid.cell_states import EVICTED

    choose(monkeypatch, "h2o", 2)
    with qtbot.waitSignal(window.run_prepared, timeout=10_000):
        qtbot.keyClick(window, Qt.Key.Key_E)
    with qtbot.waitSignal(window.run_prepared, timeout=10_000):
        qtbot.keyClick(window, Qt.Key.Key_T)
    assert window.session.plan.lockstep_names == ("full cache", "H2O, budget 2")
    step_to(qtbot, window, 6)
    view = window.workspace.compare_view
    assert (view.cached_grid.cell_states() != EVICTED).all() and (view.uncached_grid.cell_states() == EVICTED).any()
    assert view.identity_strip.row_titles[1:3] == ("full cache", "H2O, budget 2")
    entries, parted = view.identity_strip.entries(), view.banner.first_divergence
    assert len(entries) == 6 and all(e.same for e in entries if parted is None or e.step < parted)
    assert parted is None or not entries[parted - 1].same  # where the runs part, the strip marks it
    assert "H2O keeps a budget of positions and forgets the rest" in view.banner.text()
    assert "trade-off for memory, not a bug" in view.banner.text()
    assert "comparing the full cache and the cache of H2O, budget 2" in window.status.text()
