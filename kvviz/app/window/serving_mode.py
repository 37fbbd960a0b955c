"""View > Serving (Shift+B): the serving page in place of the run's views, its batch stepped by the same keys
(Space and the clicker's Page Down step, P plays, R runs it again) and exported by File > Export."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import QMainWindow

from kvviz.app.run.batch_session import BatchSession
from kvviz.app.views.on_demand import OnDemandView
from kvviz.app.window.serving_page import ServingPage
from kvviz.app.window.workspace import Workspace


class ServingMode:
    """Switches the window into serving mode and back, and drives its batch. The page is built on first use."""

    def __init__(self, window: QMainWindow, workspace: Workspace, batch: BatchSession, say,
                 show_state: Callable[[bool, bool, bool], None]) -> None:
        self.window, self.workspace, self.batch, self._say = window, workspace, batch, say
        self._show_controls = show_state  # the run controls' Step, Play and Reset: (can step, playing, can reset)
        self.active = False
        self.page_view: OnDemandView[ServingPage] = workspace.serving
        self.page_view.on_built(self._wire)
        batch.started.connect(lambda plan: self._view().reset(plan))
        batch.computed.connect(self._on_computed)
        batch.measured.connect(lambda speed: self._view().show_speed(speed))
        batch.failed.connect(lambda message: say(message, alert=True))
        batch.state_changed.connect(self._show_state)

    def _view(self):
        return self.page_view.get().view

    def _wire(self, page: ServingPage) -> None:
        page.run_requested.connect(self.run)

    def set_active(self, on: bool) -> None:
        if on == self.active:
            return
        self.active = on
        self.workspace.show_serving(on)
        if not on:
            self.batch.pause()
            return
        if self.batch.plan is None and not self.batch.records:
            self.run()
        self._show_state()
        self.workspace.focus_grid()

    def run(self) -> None:
        request = self.page_view.get().request()
        if request is not None:
            self._say("")
            self.batch.start(request)

    def step(self) -> None:
        if self.batch.can_step:
            self.batch.step()

    def toggle_play(self, interval_ms: int = 300) -> None:
        self.batch.toggle_play(max(interval_ms, 150))

    def _on_computed(self, record) -> None:
        view = self._view()
        view.apply([record])
        view.refresh()

    def _show_state(self) -> None:
        if self.active:
            self._show_controls(self.batch.can_step, self.batch.playing, True)

    def caption(self) -> str:
        """What an exported image of the serving view says under it: the batch, the model and the pass."""
        plan, records = self.batch.plan, self.batch.records
        if plan is None:
            return "Serving: no batch yet"
        sharing = "prefixes shared" if plan.share_prefixes else "no prefix sharing"
        where = f"pass {records[-1].step + 1} of {plan.passes}" if records else "before the first pass"
        return (f"{len(plan.requests)} requests \u2014 {plan.model_name}, {where}, blocks of {plan.block_size} "
                f"positions, {sharing}")

    def export(self, status) -> None:
        """File > Export... in serving mode: the serving view, its block pool or its chart."""
        from PySide6.QtWidgets import QDialog

        from kvviz.app.export.dialog import ExportDialog
        from kvviz.app.export.window_export import say_where

        self.batch.pause()
        view = self._view()
        view.refresh()
        records = self.batch.records
        dialog = ExportDialog(self.workspace.export_targets(), self.caption(), self.window,
                              step=records[-1].step + 1 if records else None)
        if dialog.exec() == QDialog.DialogCode.Accepted and dialog.written is not None:
            say_where(self.window, status, dialog.written_as(), dialog.written)
