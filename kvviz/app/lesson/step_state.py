"""A lesson step's run: whether a plan is the step's and at the step's token, the run controls set as the step
asks, and a serving step's batch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from PySide6.QtGui import QAction

from kvviz.app.window.actions import check_run_actions
from kvviz.app.window.controls import RunControls
from kvviz.core.policy import CachePolicy
from kvviz.core.records import RunPlan, RunRequest
from kvviz.core.speculation import Drafter
from kvviz.lessons.lesson import LessonStep

if TYPE_CHECKING:
    from kvviz.app.lesson.host import LessonHost
    from kvviz.app.run.session import RunSession


def plan_is_step(plan: RunPlan | None, step: LessonStep) -> bool:
    """`plan` runs what `step` asks for: its prompt, cache, compare mode, budget, window, eviction and precision,
    greedy and with the cache unbroken."""
    return (plan is not None and plan.prompt == step.prompt and plan.use_cache == step.use_cache
            and (plan.twin is not None) == step.compare and plan.max_new_tokens == step.max_new_tokens
            and plan.sampling == "greedy" and not plan.cache_broken
            and (not step.window or (plan.policy.window, plan.policy.sinks) == (step.window, step.sinks))
            and plan.policy.kv_dtype == step.kv_dtype and plan.drafter == _drafter(step)
            and _evicts_as(plan.policy, step))


def _evicts_as(policy: CachePolicy, step: LessonStep) -> bool:
    """`policy` evicts by the step's importance method and budget, or by none (an observation window or pooling the
    step leaves at 0 is the engine's default)."""
    return (policy.evict, policy.budget if step.evict else 0) == (step.evict, step.budget) and all(
        given in (0, planned) for given, planned in ((step.observe, policy.observe), (step.pool, policy.pool)))


def _drafter(step: LessonStep) -> Drafter | None:
    """The drafter the engine plans for `step` (None: plain decoding)."""
    if not step.speculative:
        return None
    return Drafter(step.draft_tokens, step.prompt_lookup, step.draft_model)


def run_at(session: RunSession, tokens: int) -> bool:
    """The session's run is at `tokens`: a plain run exactly there; a speculative run at the round that reached it
    (a round adds 1 to k + 1 tokens, so the round before had fewer)."""
    if session.plan is None or session.plan.drafter is None:
        return session.steps_done == tokens
    records = session.records
    return session.steps_done >= tokens and (len(records) < 2 or records[-2].new_tokens < tokens)


def put_step_controls(controls: RunControls, actions: Mapping[str, QAction], step: LessonStep,
                      attention: bool) -> None:
    """The run controls and the Run menu's checkmarks as `step` asks, the attention view open or not."""
    c = controls
    c.prompt_edit.setText(step.prompt)
    c.break_cache = False  # the teaching switch is the lecturer's to turn on, never a step's
    c.window, c.sinks = step.window, step.sinks
    c.kv_dtype = step.kv_dtype
    c.eviction = c.eviction.of_request(RunRequest(0, step.prompt, **step.eviction_fields()))
    c.set_run_settings(use_cache=step.use_cache, max_new_tokens=step.max_new_tokens, temperature=0.0,
                       compare=step.compare)
    c.attention = attention
    c.speculative = c.speculative.of_request(RunRequest(0, step.prompt, **step.drafter_fields()))
    check_run_actions(actions, False, step.compare, attention, step.kv_dtype)


def shows_step(w: LessonHost, step: LessonStep, revealed: bool) -> bool:
    """The window shows `step`'s run (or batch) where its slide is: at `advance_to`, one step further for a
    question's answer (a serving question's: its batch to the end)."""
    s = w.session
    if step.batch:
        batch = w.serving.batch
        target = step.passes if revealed else step.advance_to
        return (batch.plan is not None and tuple(r.prompt for r in batch.plan.requests) == step.prompts
                and len(batch.records) == target)
    if not plan_is_step(s.plan, step):
        return False
    return run_at(s, min(step.advance_to + int(revealed), s.plan.budget))


def show_serving(w: LessonHost, on: bool) -> None:
    """View > Serving on for a serving step, off for the others (and when the lesson ends)."""
    action = w.actions["serving"]
    if action.isChecked() != on:
        action.setChecked(on)
    w.serving.show_inputs(not on)  # a step's batch is the step's: no inputs to edit


def start_batch(w: LessonHost, step: LessonStep, revealed: bool) -> None:
    """The step's batch, planned anew and taken to `advance_to` passes (its answer's slide: to the end)."""
    w.serving.run_to(step.prompts, step.block_size, step.max_new_tokens, step.passes if revealed else step.advance_to)
