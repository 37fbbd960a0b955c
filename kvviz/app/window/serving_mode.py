"""View > Serving (Shift+B): the serving page in place of the run's views, its batch or trace stepped by the same
keys (Space and the clicker's Page Down step, P plays, R runs it again) and exported by File > Export."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import QApplication, QMainWindow

from kvviz.app.run.redraw import RedrawScheduler
from kvviz.app.run.stream_session import StreamSession
from kvviz.app.views.on_demand import OnDemandView
from kvviz.app.views.serving.trace_state import CACHE_NAMES
from kvviz.app.window.dialogs import show_error
from kvviz.app.window.serving_page import ServingPage
from kvviz.app.window.workspace import Workspace
from kvviz.core.serve_records import ServePlan, ServeRequest


class ServingMode:
    """Switches the window into serving mode and back, and drives its batch or trace: the session protocol (a
    StreamSession in the worker's "serving" lane) and the view protocol (its page fed by a RedrawScheduler of its
    own, which hands each plan to the view of its kind), as the single run's mode. The page is built on first use.
    A trace that cannot be served (unreadable, or a request that can never fit the pool) is a dialog, and nothing
    runs."""

    def __init__(self, window: QMainWindow, workspace: Workspace, batch: StreamSession, say: Callable[..., None],
                 show_state: Callable[[bool, bool, bool], None]) -> None:
        self.window, self.workspace, self.batch, self._say = window, workspace, batch, say
        self._show_controls = show_state  # the run controls' Step, Play and Reset: (can step, playing, can reset)
        self.active = False
        self._target = 0  # passes to take on their own once the batch is planned (run_to)
        self._asked_trace = False  # the run asked for last is a trace: a refusal is a dialog
        self.scheduler: RedrawScheduler | None = None  # the serving view's, once the page is built
        self.page_view: OnDemandView[ServingPage] = workspace.serving
        self.page_view.on_built(self._wire)
        batch.run_started.connect(self._on_started)
        batch.record_computed.connect(self._on_computed)
        batch.run_measured.connect(lambda measured: self.page_view.get().show_measured(measured))
        batch.run_finished.connect(lambda _record: self.scheduler.redraw_soon())
        batch.run_failed.connect(self._on_failed)
        batch.state_changed.connect(self.show_state)
        window.session.model_loaded.connect(self._on_model_loaded)

    def _wire(self, page: ServingPage) -> None:
        page.run_requested.connect(self.run)
        self.window.painter.find_plots()  # its chart, painted at each redraw as the run's are
        self.scheduler = RedrawScheduler([page], self.window.painter, self.window)

    def set_active(self, on: bool) -> None:
        if on == self.active:
            return
        self.active = on
        self.workspace.show_serving(on)
        if not on:
            self.batch.pause()
            self.window.status.show_run()  # the run's line again
            self.workspace.focus_grid()  # the keys step the run again; none of them types into the prompt
            return
        if self.batch.plan is None and not self.batch.records:
            self.run()
        self.show_state()
        self._show_status()
        self.workspace.focus_grid()

    def show_inputs(self, shown: bool) -> None:
        """The batch's inputs on the page, or not (a lesson's serving step sets them: hidden, so that at 720p the
        view fits with its speed line); presenter mode keeps them hidden either way."""
        if not shown:
            self.page_view.get().inputs.hide()
        elif self.page_view.built:
            self.page_view.get().inputs.setVisible(not self.window.presentation.presenter)

    def run(self, passes: int = 0) -> None:
        """Plan the batch or trace the page asks for anew; with `passes`, take that many passes at once."""
        request = self.page_view.get().request()
        if request is not None:
            self._start(request, passes)

    def run_trace(self, request: ServeRequest, passes: int = 0) -> None:
        """Serve the trace `request` names on its server (its settings shown on the page, Trace chosen), planned
        anew; with `passes`, take that many passes at once once it is planned (a lesson's step)."""
        self.page_view.get().set_trace(request)
        self._start(request, passes)

    def _start(self, request, passes: int) -> None:
        self._say("")
        self._target = passes
        self._asked_trace = isinstance(request, ServeRequest)
        self.batch.start(request)

    def _on_failed(self, message: str) -> None:
        """A batch refused: said in the banner; a trace refused: a dialog with its one line (nothing runs)."""
        if self._asked_trace:
            show_error(self.window, "Trace not served", message)
        else:
            self._say(message, alert=True)

    def run_to(self, prompts: tuple[str, ...], block_size: int, new_tokens: int, passes: int) -> None:
        """A lesson's serving step: these inputs on the page, the batch planned anew and taken `passes` passes."""
        page = self.page_view.get()
        page.set_inputs(prompts, block_size, new_tokens)
        self.run(passes)

    def _on_model_loaded(self, _info) -> None:
        """A new model: the batch of the old one is gone from the worker, and from the view; plan it anew on this
        one (or when the view opens next)."""
        self.batch.forget()
        if self.page_view.built:
            self.scheduler.forget()  # a pass of the old batch still queued would draw over the cleared view
            page = self.page_view.get()
            page.clear(f"The {page.kind} is planned anew on {_info.name} when the serving view opens.")
        if self.active:
            self.run()
        self._show_status()

    def _on_started(self, plan) -> None:
        page = self.page_view.get()  # built, with its scheduler
        self.scheduler.reset(plan)
        self._show_status()
        focus = QApplication.focusWidget()
        if self.active and focus is not None and focus is not page.prompts and page.inputs.isAncestorOf(focus):
            self.workspace.focus_grid()  # from a button or a box of the inputs: Space steps the run it asked for
        if self._target > 0:
            self.batch.step()

    def step(self) -> None:
        self._target = 0
        if self.batch.can_step:
            self.batch.step()

    def toggle_play(self, interval_ms: int = 300) -> None:
        self.batch.toggle_play(max(interval_ms, 150))

    def reset(self) -> None:
        """Reset: the batch or trace planned anew from the page's inputs."""
        self.run()

    def _on_computed(self, record) -> None:
        self.scheduler.add(record)
        self._show_status()
        if len(self.batch.records) < self._target and not record.final:
            self.batch.step()

    def _show_status(self) -> None:
        """The status bar says the batch's progress while the serving view shows (not the run's tokens)."""
        if not self.active:
            return
        plan, records = self.batch.plan, self.batch.records
        if plan is None:
            kind = "trace" if self._asked_trace else "batch"
            self.window.status.show_message(f"Serving: planning the {kind}\u2026")
            return
        done = records[-1].step + 1 if records else 0
        if not records:
            state = "ready"
        elif records[-1].final:
            state = "done"
        else:
            state = f"pass {records[-1].step} took {records[-1].seconds * 1000:.1f} ms"
        if isinstance(plan, ServePlan):  # its passes are not known before it runs; they count from 0
            where = f"pass {records[-1].step}" if records else "before pass 0"
            self.window.status.show_message(f"{plan.model_name} \u00b7 serving a trace of {len(plan.requests)} "
                                            f"requests \u00b7 {where} \u00b7 {state}")
            return
        self.window.status.show_message(f"{plan.model_name} \u00b7 serving {len(plan.requests)} requests \u00b7 "
                                        f"pass {done}/{plan.passes} \u00b7 {state}")

    def show_state(self) -> None:
        if self.active:
            self._show_controls(self.batch.can_step, self.batch.playing, True)

    def caption(self) -> str:
        """What an exported image of the serving view says under it: the batch, the model and the pass."""
        plan, records = self.batch.plan, self.batch.records
        if plan is None:
            return "Serving: no batch yet"
        if isinstance(plan, ServePlan):
            where = f"after pass {records[-1].step}" if records else "before the first pass"
            chunk = f"chunks of {plan.chunk}" if plan.chunk else "no chunking"
            return (f"A trace of {len(plan.requests)} requests \u2014 {plan.model_name}, {where}, "
                    f"{CACHE_NAMES[plan.prefix_cache]}, {chunk}, {plan.num_blocks} blocks of {plan.block_size}")
        sharing = "prefixes shared" if plan.share_prefixes else "no prefix sharing"
        where = f"pass {records[-1].step + 1} of {plan.passes}" if records else "before the first pass"
        return (f"{len(plan.requests)} requests \u2014 {plan.model_name}, {where}, blocks of {plan.block_size} "
                f"positions, {sharing}")

    def export(self, status) -> None:
        """File > Export... in serving mode: the serving view, or a part of it (kvviz.app.window.workspace)."""
        from PySide6.QtWidgets import QDialog

        from kvviz.app.export.dialog import ExportDialog
        from kvviz.app.export.window_export import say_where

        self.batch.pause()
        self.scheduler.flush()
        records = self.batch.records
        dialog = ExportDialog(self.workspace.export_targets(), self.caption(), self.window,
                              step=records[-1].step + 1 if records else None)
        if dialog.exec() == QDialog.DialogCode.Accepted and dialog.written is not None:
            say_where(self.window, status, dialog.written_as(), dialog.written)
