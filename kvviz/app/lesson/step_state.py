"""A lesson step's run: whether a plan is the step's, and the run controls set as the step asks."""

from __future__ import annotations

from collections.abc import Mapping

from PySide6.QtGui import QAction

from kvviz.app.window.actions import check_run_actions
from kvviz.app.window.controls import RunControls
from kvviz.core.records import RunPlan
from kvviz.lessons.lesson import LessonStep


def plan_is_step(plan: RunPlan | None, step: LessonStep) -> bool:
    """`plan` runs what `step` asks for: its prompt, cache, compare mode, budget, window and precision, greedy and
    with the cache unbroken."""
    return (plan is not None and plan.prompt == step.prompt and plan.use_cache == step.use_cache
            and (plan.twin is not None) == step.compare and plan.max_new_tokens == step.max_new_tokens
            and plan.sampling == "greedy" and not plan.cache_broken
            and (not step.window or (plan.policy.window, plan.policy.sinks) == (step.window, step.sinks))
            and plan.policy.kv_dtype == step.kv_dtype)


def put_step_controls(controls: RunControls, actions: Mapping[str, QAction], step: LessonStep,
                      attention: bool) -> None:
    """The run controls and the Run menu's checkmarks as `step` asks, the attention view open or not."""
    c = controls
    c.prompt_edit.setText(step.prompt)
    c.break_cache = False  # the teaching switch is the lecturer's to turn on, never a step's
    c.window, c.sinks = step.window, step.sinks
    c.kv_dtype = step.kv_dtype
    c.set_run_settings(use_cache=step.use_cache, max_new_tokens=step.max_new_tokens, temperature=0.0,
                       compare=step.compare)
    c.attention = attention
    check_run_actions(actions, False, step.compare, attention, step.kv_dtype)
