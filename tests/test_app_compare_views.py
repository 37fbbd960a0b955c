"""Compare mode's views, fed real lockstep records: both grids, the identity strip, the divergence banner,
the time plot and the counts each checked against the records of both runs, and the whole view on a
projector screen."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
from helpers_checkpoints import lockstep_ids, plan_ids
from helpers_qt import settle_layouts
from PySide6.QtCore import QEvent, QObject, QPointF, QRect
from PySide6.QtWidgets import QFrame, QLabel, QScrollArea

from kvviz.app import theme
from kvviz.app.views.compare.compare_view import CompareView
from kvviz.app.views.compare.identity_strip import DIFFERENT, LOGITS_DIFFER, SAME, IdentityStrip
from kvviz.app.views.compare.lockstep import format_logit_diff
from kvviz.app.views.grid.cell_states import COMPUTED, EMPTY, PENDING, REUSED
from kvviz.app.views.grid.kv_grid import KVGridView
from kvviz.app.views.labels import chip_text

PROMPT = "Time flies fast"  # 3 GPT-2 tokens
N = 8


@pytest.fixture(scope="module")
def engine(app_model):
    from kvviz.engine.engine import Engine
    from kvviz.sources.weights import load_model

    return Engine(load_model(app_model).model)


@pytest.fixture(scope="module")
def lockstep(engine):
    """lockstep(use_cache, cache_fault, n) -> (plan, records) of a lockstep run of PROMPT, computed once."""
    from kvviz.engine.compare import Lockstep

    runs: dict[tuple, tuple] = {}

    def run(use_cache: bool = True, cache_fault: str = "", n: int = N):
        key = (use_cache, cache_fault, n)
        if key not in runs:
            plan = lockstep_ids(engine, engine.encode_prompt(PROMPT), n, use_cache, cache_fault=cache_fault)
            runs[key] = plan, list(Lockstep(engine, plan).records())
        return runs[key]

    return run


@pytest.fixture
def view(qtbot):
    widget = CompareView()
    qtbot.addWidget(widget)
    widget.resize(1264, 569)
    widget.show()
    return widget


def token_records(records):
    """The records that carry a token step of both runs (a cached primary's filling pass carries none)."""
    return [r for r in records if r.token_id is not None and r.twin]


def token_pass(record, use_cache: bool):
    """The pass of the run `use_cache` that chose `record`'s token: the record or one of its twin's."""
    return next(p for p in (record, *record.twin) if p.use_cache == use_cache and p.token_id is not None)


def first_divergence(records):
    """The 1-based token step at which the two runs' tokens first differ, read off the records."""
    return next((r.new_tokens for r in token_records(records) if r.token_id != r.twin_token_id), None)


# ----- the two grids -----
def expected_states(run_pass, n_layer: int, width: int) -> np.ndarray:
    """The lesson, from the pass's fed positions: amber where it fed tokens, teal before them when it has a
    cache (nothing reused without one), grey for tokens that exist without K/V yet, dark beyond."""
    states = np.full((n_layer, width), EMPTY)
    states[:, : run_pass.sequence_length] = PENDING
    states[:, : run_pass.fed_start] = REUSED if run_pass.use_cache else PENDING
    states[:, run_pass.fed_start: run_pass.fed_stop] = COMPUTED
    return states


@pytest.mark.parametrize("primary_cached", [True, False], ids=["primary-cached", "primary-uncached"])
def test_both_grids_show_their_own_run_step_by_step(view, lockstep, primary_cached):
    plan, records = lockstep(primary_cached)
    P = plan.prompt_tokens
    view.reset(plan)
    for grid in (view.cached_grid, view.uncached_grid):
        assert grid.cell_states().shape == (plan.n_layer, P + N)
        assert (grid.cell_states()[:, :P] == PENDING).all() and (grid.cell_states()[:, P:] == EMPTY).all()
    cached_steps = uncached_steps = 0
    for record in records:
        view.apply([record])
        view.refresh()
        cached, uncached = record.lockstep_passes()
        if cached:
            latest = cached[-1]
            cached_steps += len(cached)
            states = view.cached_grid.cell_states()
            assert (states == expected_states(latest, plan.n_layer, P + N)).all()
            amber = np.flatnonzero(states[0] == COMPUTED).tolist()
            if cached_steps == 1:
                assert amber == list(range(P)), "the first cached pass computes the whole prompt"
            else:
                assert amber == [P + cached_steps - 2], "a cached pass computes the fed position only"
                assert (states[:, : P + cached_steps - 2] == REUSED).all()
        if uncached:
            uncached_steps += len(uncached)
            states = view.uncached_grid.cell_states()
            assert (states == expected_states(uncached[-1], plan.n_layer, P + N)).all()
            assert np.flatnonzero(states[0] == COMPUTED).tolist() == list(range(P + uncached_steps - 1)), \
                "without a cache every existing position is recomputed"
            assert not (states == REUSED).any()
    assert (cached_steps, uncached_steps) == (N + 1, N)  # the cached run's filling pass included
    assert (view.cached_grid.cell_states()[:, : P + N - 1] == REUSED).all()
    assert (view.cached_grid.cell_states()[:, P + N - 1] == COMPUTED).all()


def test_grids_are_titled_and_line_up_column_for_column(qtbot, view, lockstep):
    plan, records = lockstep(True)
    view.reset(plan)
    view.apply(records)
    view.refresh()
    assert "with cache" in view.cached_grid.title.text() and "BROKEN" not in view.cached_grid.title.text()
    assert "without cache" in view.uncached_grid.title.text()
    assert view.cached_grid.isVisible() and view.uncached_grid.isVisible()
    assert view.cached_grid.y() < view.uncached_grid.y(), "with cache above, without cache below"

    def column_edges(grid: KVGridView) -> tuple[int, int]:
        vb = grid.plot_item.getViewBox()
        width = grid.cell_states().shape[1]
        edges = []
        for x in (0, width):
            point = grid.plot_widget.mapFromScene(vb.mapViewToScene(QPointF(x, 0)))
            edges.append(grid.plot_widget.mapTo(view, point).x())
        return edges[0], edges[1]

    qtbot.waitUntil(lambda: column_edges(view.cached_grid) == column_edges(view.uncached_grid), timeout=2_000)
    left, right = column_edges(view.cached_grid)
    assert right - left > 200


@pytest.mark.parametrize("primary_cached", [True, False], ids=["primary-cached", "primary-uncached"])
def test_the_cached_grid_says_when_its_cache_is_broken_on_purpose(view, lockstep, primary_cached):
    plan, records = lockstep(primary_cached, "late_write")
    view.reset(plan)
    view.apply(records[:2])
    view.refresh()
    assert "with cache \u2014 BROKEN on purpose (teaching switch)" in view.cached_grid.title.text()
    assert "BROKEN" not in view.uncached_grid.title.text()


def test_a_lockstep_grid_alone_is_unchanged_for_single_runs(qtbot, engine):
    """The default grid shows the records it gets, as before; a lockstep grid refuses an unknown run."""
    plan = plan_ids(engine, engine.encode_prompt(PROMPT), 3, True)
    records = list(engine.run(plan))
    grid = KVGridView()
    qtbot.addWidget(grid)
    grid.reset(plan)
    grid.apply(records[:2])
    grid.refresh()
    assert (grid.cell_states() == expected_states(records[1], plan.n_layer, plan.width)).all()
    assert "BROKEN" not in grid.title.text()
    with pytest.raises(ValueError, match="lockstep"):
        KVGridView(lockstep="both")


# ----- the identity strip -----
@pytest.mark.parametrize("fault", ["", "late_write"], ids=["cache", "broken-cache"])
@pytest.mark.parametrize("primary_cached", [True, False], ids=["primary-cached", "primary-uncached"])
def test_identity_strip_shows_each_steps_tokens_mark_and_logit_difference(view, lockstep, primary_cached, fault):
    plan, records = lockstep(primary_cached, fault)
    view.reset(plan)
    view.apply(records)
    view.refresh()
    entries = view.identity_strip.entries()
    steps = token_records(records)
    assert len(entries) == len(steps) == N
    for entry, record in zip(entries, steps, strict=True):
        assert entry.step == record.new_tokens
        assert entry.cached == chip_text(token_pass(record, True).token_text)
        assert entry.uncached == chip_text(token_pass(record, False).token_text)
        same = token_pass(record, True).token_id == token_pass(record, False).token_id
        within_noise = record.max_abs_logit_diff <= record.logit_tolerance
        assert entry.same == same
        assert entry.mark == (DIFFERENT if not same else SAME if within_noise else LOGITS_DIFFER)
        diff = record.max_abs_logit_diff
        assert len(entry.logit_diff) <= 5, "compact"
        if diff == 0:
            assert entry.logit_diff == "0"
        else:
            assert float(entry.logit_diff) == pytest.approx(diff, rel=0.5)
    if fault:
        assert not all(entry.same for entry in entries)
    else:
        assert all(entry.same for entry in entries), "with a sound cache both runs choose the same tokens"


def test_logit_differences_are_written_compactly():
    assert [format_logit_diff(v) for v in (0.0, 3.1e-6, 7.6e-6, 0.25, 4.818, 13.6, 140.2)] == \
        ["0", "3e-06", "8e-06", "0.25", "4.8", "14", "140"]


def test_identity_strip_keeps_the_newest_step_in_view_and_paints_only_new_steps(qtbot):
    """220 steps of a tiny model: the strip scrolls to the newest, and a new step repaints its column only."""
    from helpers_checkpoints import tiny_kvviz_model

    from kvviz.engine.compare import Lockstep
    from kvviz.engine.engine import Engine

    engine = Engine(tiny_kvviz_model(n_layer=1, n_head=1, n_embd=16, n_ctx=256))
    plan = lockstep_ids(engine, engine.encode_prompt(PROMPT), 220, True)
    records = list(Lockstep(engine, plan).records())
    strip = IdentityStrip()
    qtbot.addWidget(strip)
    strip.resize(1000, strip.sizeHint().height())
    strip.show()
    strip.reset(plan)
    strip.apply(records[:-3])
    strip.refresh()
    qtbot.wait(10)

    painted: list[QRect] = []

    class PaintSpy(QObject):
        def eventFilter(self, watched, event):
            if event.type() == QEvent.Type.Paint:
                painted.append(event.rect())
            return False

    spy = PaintSpy()
    strip.canvas.installEventFilter(spy)
    strip.apply(records[-3:-2])
    strip.refresh()
    qtbot.waitUntil(lambda: bool(painted), timeout=2_000)
    strip.canvas.removeEventFilter(spy)
    viewport = strip.scroll.viewport().width()
    newest = strip.entry_rect(len(strip.entries()) - 1)
    assert max(rect.width() for rect in painted) <= 2 * newest.width() < viewport / 4, "only the new step is painted"

    strip.apply(records[-2:])
    strip.refresh()
    entries = strip.entries()
    assert len(entries) == 220 and entries[-1].step == 220
    bar = strip.scroll.horizontalScrollBar()
    assert bar.maximum() > 0 and bar.value() == bar.maximum()
    newest = strip.entry_rect(len(entries) - 1)
    shown = strip.canvas.visibleRegion().boundingRect()
    assert shown.contains(newest), "the newest step is in view"


# ----- the divergence banner -----
@pytest.mark.parametrize("primary_cached", [True, False], ids=["primary-cached", "primary-uncached"])
def test_divergence_banner_names_the_first_diverging_step_and_both_continuations(view, lockstep, primary_cached):
    plan, records = lockstep(primary_cached, "late_write")
    first = first_divergence(records)
    assert first is not None, "a cache broken on purpose makes the runs part"
    view.reset(plan)
    banner = view.banner
    for record in records:
        view.apply([record])
        view.refresh()
        if record.token_id is not None and record.new_tokens < first:
            assert not banner.shown and not banner.label.isVisible(), "hidden while the runs agree"
    assert banner.shown and banner.label.isVisible()
    assert banner.isVisible(), "the banner view itself stays shown: the redraw scheduler draws shown views only"
    assert banner.first_divergence == first
    assert f"token step {first}:" in banner.text()
    steps = [r for r in token_records(records) if r.new_tokens >= first]
    cached = "".join(token_pass(r, True).token_text for r in steps)
    uncached = "".join(token_pass(r, False).token_text for r in steps)
    assert banner.continuations() == (cached, uncached)
    assert cached != uncached
    for text in (cached, uncached):
        assert text.replace("\n", "\u21b5")[:40] in banner.text()
    assert "broken on purpose" in banner.text()


def test_divergence_banner_grows_as_the_runs_go_on(view, lockstep):
    plan, records = lockstep(True, "late_write")
    first = first_divergence(records)
    view.reset(plan)
    shown = []
    for record in records:
        view.apply([record])
        view.refresh()
        if view.banner.shown:
            shown.append(view.banner.continuations())
    assert len(shown) >= 2
    assert all(len(a[0]) <= len(b[0]) and len(a[1]) < len(b[1]) for a, b in zip(shown, shown[1:-1], strict=False))
    assert view.banner.first_divergence == first


@pytest.mark.parametrize("primary_cached", [True, False], ids=["primary-cached", "primary-uncached"])
def test_divergence_banner_stays_hidden_while_the_runs_agree(view, lockstep, primary_cached):
    plan, records = lockstep(primary_cached)
    assert first_divergence(records) is None
    view.reset(plan)
    for record in records:
        view.apply([record])
        view.refresh()
        assert not view.banner.shown and view.banner.isVisible()
        assert view.banner.height() == 0, "no room taken while the runs agree"
    assert view.banner.first_divergence is None and view.banner.continuations() is None


def test_divergence_banner_and_strip_catch_logits_that_part_while_the_tokens_agree(qtbot, tmp_path, view):
    """A cache written one slot late on a small checkpoint whose greedy tokens happen to agree for 12 steps:
    the logits part from step 2, the first step that reads what the prefill wrote into the cache."""
    from helpers_checkpoints import save_kvviz_folder

    from kvviz.engine.compare import Lockstep
    from kvviz.engine.engine import Engine
    from kvviz.sources.weights import load_model

    folder = save_kvviz_folder(tmp_path / "tiny", n_layer=3, n_head=2, n_embd=32, n_ctx=48, seed=7)
    engine = Engine(load_model(str(folder)).model)
    plan = lockstep_ids(engine, engine.encode_prompt(PROMPT), 12, True, cache_fault="late_write")
    records = list(Lockstep(engine, plan).records())
    assert first_divergence(records) is None, "the situation: the same tokens all along"
    view.reset(plan)
    view.apply(records)
    view.refresh()
    assert view.banner.shown and view.banner.first_logit_divergence == 2
    assert "logits part at token step 2" in view.banner.text() and "tokens still agree" in view.banner.text()
    marks = [entry.mark for entry in view.identity_strip.entries()]
    assert marks == [SAME] + [LOGITS_DIFFER] * 11


# ----- the time plot and the counts -----
@pytest.mark.parametrize("primary_cached", [True, False], ids=["primary-cached", "primary-uncached"])
def test_time_plot_draws_each_runs_measured_seconds(view, lockstep, primary_cached):
    from kvviz.engine.compare import summarize

    plan, records = lockstep(primary_cached)
    view.reset(plan)
    view.apply(records)
    view.refresh()
    steps = token_records(records)
    if primary_cached:  # the primary's own passes, and its filling pass arriving on its own at the end
        cached = [r.seconds for r in steps]
        cached[-1] += sum(r.seconds for r in records if r.token_id is None)
        uncached = [r.twin[0].seconds for r in steps]
    else:  # the primary is uncached: the cached run's passes are the twins, its filling pass in the last one
        uncached = [r.seconds for r in steps]
        cached = [sum(t.seconds for t in r.twin) for r in steps]
    data = view.time_plot.curve_data()
    x = np.arange(1, N + 1)
    for name, seconds in (("cached", cached), ("uncached", uncached)):
        assert (data[f"{name}_ms"][0] == x).all() and (data[f"{name}_seconds"][0] == x).all()
        assert np.allclose(data[f"{name}_ms"][1], np.array(seconds) * 1000.0)
        assert np.allclose(data[f"{name}_seconds"][1], np.cumsum(seconds))
        curve = view.time_plot.ms_curves[0 if name == "cached" else 1]
        assert np.allclose(curve.getData()[1], np.array(seconds) * 1000.0), "what is drawn"
    # the median of the steps' own ratios (a single slow step cannot swing it), said in words
    estimate = view.time_plot.time_ratio()
    assert estimate.median == pytest.approx(statistics.median(u / c for c, u in zip(cached, uncached, strict=True)))
    assert estimate.median == pytest.approx(summarize(records).time_ratio)
    assert estimate.sentence() in view.time_plot.ratio.text()
    # beside it, each run's median step (ms), not the totals a single slow step can turn around
    for name, seconds in (("with cache", cached), ("without", uncached)):
        median_ms = statistics.median(seconds) * 1000.0
        shown = f"{median_ms:.1f} ms" if median_ms < 100 else f"{median_ms:.0f} ms"
        assert f"{name} {shown}" in view.time_plot.ratio.text()


@pytest.mark.parametrize("primary_cached", [True, False], ids=["primary-cached", "primary-uncached"])
def test_counts_show_both_runs_measured_work(view, lockstep, primary_cached):
    plan, records = lockstep(primary_cached)
    P = plan.prompt_tokens
    view.reset(plan)
    view.apply(records)
    view.refresh()
    values = view.counts.values()
    assert values["with_cache"] == P + N  # the cached run's own count, its filling pass included
    assert values["without_cache"] == N * P + N * (N - 1) // 2  # the uncached run's own count
    assert values["avoided"] == values["without_cache"] - values["with_cache"]
    assert values["ratio"] == pytest.approx(values["without_cache"] / values["with_cache"])
    assert values["with_cache_all_layers"] == (P + N) * plan.n_layer
    last_cached = [p for r in records for p in r.lockstep_passes()[0]][-1]
    last_uncached = [p for r in records for p in r.lockstep_passes()[1]][-1]
    assert (values["with_cache"], values["without_cache"]) == (last_cached.kv_computed_total,
                                                              last_uncached.kv_computed_total)
    assert view.counts.table.labels["with_cache"][1].text() == str(P + N)
    assert view.counts.table.labels["ratio"][1].text() == f"{values['ratio']:.2f}\u00d7"


def test_counts_during_the_run_are_each_runs_latest_totals(view, lockstep):
    plan, records = lockstep(False)
    view.reset(plan)
    assert view.counts.values()["with_cache"] is None
    view.apply(records[:3])
    view.refresh()
    values = view.counts.values()
    assert values["without_cache"] == records[2].kv_computed_total
    assert values["with_cache"] == records[2].twin[-1].kv_computed_total


# ----- outside compare mode -----
def test_a_plan_without_a_twin_leaves_every_compare_view_empty(view, engine):
    plan = plan_ids(engine, engine.encode_prompt(PROMPT), 4, True)
    records = list(engine.run(plan))
    view.reset(plan)
    view.apply(records)
    view.refresh()
    view.set_font_scale(1.25)
    assert not view.banner.shown
    assert view.identity_strip.entries() == []
    assert all(len(x) == 0 for x, _ in view.time_plot.curve_data().values())
    assert view.counts.values()["with_cache"] is None and view.counts.values()["without_cache"] is None
    for grid in (view.cached_grid, view.uncached_grid):
        assert grid.cell_states().shape == (1, 1) and (grid.cell_states() == EMPTY).all()
        assert "no compare run" in grid.title.text()


# ----- the whole view on a projector screen -----
# What MainWindow's scroll area around the views offers at each screen size (windowed: menus, controls
# and status bar around it; presenter: full screen with the presenter zoom), measured at 1280x720 and 1024x768.
SCREENS = {
    "1280x720": (1264, 569, 1.0),
    "1024x768": (1008, 576, 1.0),
    "1280x720-presenter": (1264, 646, 1.07),
    "1024x768-presenter": (1008, 692, 1.14),
}


def _clipped_labels(widget) -> list[str]:
    return [label.text() for label in widget.findChildren(QLabel)
            if label.isVisible() and label.text() and not label.wordWrap()
            and (label.height() < label.sizeHint().height() or label.width() < label.sizeHint().width())]


@pytest.mark.parametrize("screen", SCREENS)
def test_compare_view_fits_a_projector_screen(qtbot, lockstep, screen):
    width, height, scale = SCREENS[screen]
    plan, records = lockstep(False, "late_write", 12)  # the banner shown: the tallest the view gets
    view = CompareView()
    scroll = QScrollArea()  # as MainWindow holds its views
    scroll.setWidget(view)
    scroll.setWidgetResizable(True)
    scroll.setFrameShape(QFrame.Shape.NoFrame)
    scroll.setStyleSheet(theme.stylesheet())
    qtbot.addWidget(scroll)
    scroll.resize(width, height)
    scroll.show()
    view.set_font_scale(scale)
    view.reset(plan)
    view.apply(records)
    view.refresh()
    qtbot.waitUntil(lambda: scroll.viewport().width() == width, timeout=2_000)
    settle_layouts()  # the layout passes a resize posts
    assert view.banner.label.isVisible()
    assert scroll.horizontalScrollBar().maximum() == 0, "the compare view is wider than the screen"
    assert scroll.verticalScrollBar().maximum() == 0, "the compare view does not fit the screen's height"
    for grid in (view.cached_grid, view.uncached_grid):
        assert grid.plot_widget.height() >= 80 * scale
    assert view.time_plot.height() >= 200 * scale
    assert view.identity_strip.height() >= view.identity_strip.sizeHint().height()
    assert view.identity_strip.geometry().bottom() < view.height()
    assert _clipped_labels(view.counts) == []
    assert view.counts.geometry().right() <= view.side_splitter.width()
    assert view.side_splitter.geometry().right() <= view.width()
    gap = (view.main_splitter.geometry().bottom() + view.identity_strip.geometry().top()) // 2
    assert scroll.grab().toImage().pixelColor(view.width() // 2, gap).name().upper() == theme.DARK.background, \
        "the gaps between panels are the theme's background"


# ----- against a window or a quantized cache: the bytes held lead -----
@pytest.fixture(scope="module")
def lossy_lockstep(engine):
    """lossy_lockstep(**options) -> (plan, records) of the exact cache against a window or a quantized one."""
    from kvviz.engine.compare import Lockstep

    runs: dict[tuple, tuple] = {}

    def run(**options):
        key = tuple(sorted(options.items()))
        if key not in runs:
            plan = lockstep_ids(engine, engine.encode_prompt(PROMPT), N, True, **options)
            runs[key] = plan, list(Lockstep(engine, plan).records())
        return runs[key]

    return run


@pytest.mark.parametrize(("options", "second"), [({"window": 4}, "window of 4"), ({"kv_dtype": "int8"}, "int8 cache")],
                         ids=["window", "int8"])
def test_a_lossy_compare_leads_with_the_bytes_each_cache_holds(view, engine, lossy_lockstep, options, second):
    """Both runs keep a cache and compute the same K/V: "avoided 0, ratio 1.00×" would lead with nothing. The big
    figures are the bytes each cache holds (a hand count: positions × 2 × layers × heads × bytes a head), and how
    many times fewer; the computations are a small line."""
    cfg = engine.model.config
    plan, records = lossy_lockstep(**options)
    view.reset(plan)
    view.apply(records)
    view.refresh()
    counts = view.counts
    positions = len(engine.encode_prompt(PROMPT)) + N  # the exact cache after its filling pass
    full = positions * 2 * cfg.n_layer * cfg.n_kv_head * cfg.head_dim * 4  # float32
    if "window" in options:
        lossy = 4 * 2 * cfg.n_layer * cfg.n_kv_head * cfg.head_dim * 4  # the last 4 positions
    else:
        lossy = positions * 2 * cfg.n_layer * cfg.n_kv_head * (cfg.head_dim + 4)  # a byte a number, a float32 scale
    assert counts.values()["bytes_held"] == (full, lossy)
    assert counts.against_lossy() and counts.bytes_box.isVisible() and counts.bytes_heading.isVisible()
    assert not counts.work_box.isVisible() and not counts.heading.isVisible()  # no big "avoided 0, 1.00×"
    name, value = counts.bytes_labels["full"]
    assert (name.text(), value.text()) == ("full cache" if "window" in options else "exact cache",
                                           f"{full:,} bytes".replace(",", "\u2009"))
    name, value = counts.bytes_labels["lossy"]
    assert (name.text(), value.text()) == (second, f"{lossy:,} bytes".replace(",", "\u2009"))
    ratio = [label.text() for label in counts.bytes_labels["ratio"]]
    assert ratio == [f"{second} holds", f"{full / lossy:.1f}\u00d7 fewer"]
    assert value.font().pointSizeF() > counts.work_note.font().pointSizeF()  # the lead is the big figure
    assert counts.work_note.isVisible() and f"{positions} per layer in each run" in counts.work_note.text()


def test_a_cached_against_uncached_compare_still_leads_with_the_computations(view, lockstep):
    plan, records = lockstep(True)
    view.reset(plan)
    view.apply(records)
    view.refresh()
    assert view.counts.work_box.isVisible() and not view.counts.bytes_box.isVisible()
    assert view.counts.values()["bytes_held"] is None


def test_a_quantized_compare_says_why_its_cache_is_slower_beside_the_times(view, lossy_lockstep):
    plan, records = lossy_lockstep(kv_dtype="int8")
    view.reset(plan)
    view.apply(records)
    view.refresh()
    text = view.time_plot.ratio.text()
    assert "int8 cache" in text and "kvviz dequantizes every stored row at each step" in text
    assert "engines use fused kernels: not an engine's times" in text
    plan, records = lossy_lockstep(window=4)  # a window's time needs no such note
    view.reset(plan)
    view.apply(records)
    view.refresh()
    assert "window of 4" in view.time_plot.ratio.text() and "dequantizes" not in view.time_plot.ratio.text()
