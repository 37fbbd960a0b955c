"""What the free app had when a lesson began, and giving it back when the lesson ends: its model, the token its
run was at, and the settings a lesson changes (Break the cache, a window, a KV precision, eviction by importance).
The prompt and the other run settings are kept in the window's settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvviz.app.window.actions import check_run_actions
from kvviz.app.window.eviction_dialog import EvictionChoice

if TYPE_CHECKING:
    from kvviz.app.lesson.host import LessonHost


@dataclass(frozen=True)
class FreeApp:
    """What leaving the lesson gives back, besides the run settings kept in the window's settings."""

    source: str  # the model (a --model value; "" = the embedded default)
    steps: int  # the token its run was at, or on its way to
    break_cache: bool
    window: tuple[int, int] = (0, 0)  # Run > Sliding window: positions and sinks
    kv_dtype: str = ""  # Run > KV cache precision
    attention: bool = False  # View > Attention (a lesson's sink step opens it)
    eviction: EvictionChoice = EvictionChoice()  # Run > Evict by importance


def keep_free_app(w: LessonHost) -> FreeApp:
    """Remember the free app as it is (its run settings go to the window's settings, never a lesson's)."""
    w.controls.store(w.settings)
    c = w.controls
    return FreeApp(w.session.latest_source, w.session.steps_target, c.break_cache, (c.window, c.sinks), c.kv_dtype,
                   c.attention, c.eviction)


def give_back(w: LessonHost, free: FreeApp) -> None:
    """The free app as `keep_free_app` found it: controls, checkmarks, model and the run at its token."""
    c = w.controls
    c.restore(w.settings)  # the prompt and the run settings the lesson began with, compare mode too
    c.break_cache = free.break_cache
    c.window, c.sinks = free.window
    c.kv_dtype = free.kv_dtype
    c.attention = free.attention
    c.eviction = free.eviction
    w.workspace.run_view.show_attention(free.attention)
    check_run_actions(w.actions, free.break_cache, c.compare, free.attention, free.kv_dtype)
    if free.source != w.session.latest_source:
        w.load_model(free.source)  # its run starts once it is loaded
    else:
        w.session.start_run(c.request(), free.steps)
