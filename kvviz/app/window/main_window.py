"""The main window: assembles the session, the controls, the views and the actions, and wires them."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QTimer, Signal
from PySide6.QtGui import QCloseEvent, QShowEvent
from PySide6.QtWidgets import QMainWindow, QWidget

from kvviz.app import theme
from kvviz.app.run.precision import PrecisionMenu
from kvviz.app.run.redraw import Painter, RedrawScheduler
from kvviz.app.run.session import RunSession
from kvviz.app.run.stream_session import StreamSession
from kvviz.app.settings import AppSettings, SettingsFile, app_settings
from kvviz.app.views.grid.kv_grid import KVGridView
from kvviz.app.views.status import StatusLine
from kvviz.app.window.actions import build_actions, check_run_actions
from kvviz.app.window.banner import Banner
from kvviz.app.window.clipboard import ImageCopier
from kvviz.app.window.controls import RunControls
from kvviz.app.window.dialogs import AboutDialog, ShortcutsDialog, show_error
from kvviz.app.window.eviction_dialog import choose_eviction
from kvviz.app.window.lesson_slot import NO_LESSON, LessonSlot
from kvviz.app.window.loading import LoadingIndicator
from kvviz.app.window.model_picker import ModelPicker, source_label
from kvviz.app.window.presentation import Presentation, fit_to_screen
from kvviz.app.window.run_mode import Mode, RunMode
from kvviz.app.window.serving_mode import ServingMode
from kvviz.app.window.speculative_dialog import SpeculativeDialog
from kvviz.app.window.speed_panel import SpeedPanel
from kvviz.app.window.window_state import restore_window, save_window
from kvviz.app.window.workspace import Workspace
from kvviz.core.records import ModelInfo, RunPlan, StepRecord

INITIAL_LOAD_DELAY_MS = 100  # after the window is first shown, so it paints before torch is imported
FIT_TO_SCREEN_DELAY_MS = 250  # after the window is first shown: once the window manager has framed it
INITIAL_LOAD_FALLBACK_MS = 1000  # a window never shown (headless use) still loads its model


class MainWindow(QMainWindow):
    """The kvviz desktop window. It only assembles parts and connects them: run state lives in
    `session`, drawing in `scheduler` and the views, zoom and presenter mode in `presentation`.

    `model` is a `--model` value (None: the one remembered, else the embedded default); `prompt`
    the starting prompt (None: the one remembered); `theme_name` "dark" or "light" (None: the one remembered).
    Lesson mode is attached by the app once the window is built (kvviz.app.assembly); until then `lesson` is
    NO_LESSON, the free app alone. `unattended` (the GUI benchmark) sends errors to the banner, never to a dialog
    nobody can close, and never falls back to the embedded model.
    """

    run_prepared = Signal(object)  # RunPlan: a fresh run is ready (after a model load, Reset, Enter...)
    run_done = Signal(object)  # the final StepRecord of a run

    def __init__(self, model: str | None = None, prompt: str | None = None,
                 settings: SettingsFile | None = None, unattended: bool = False,
                 theme_name: str | None = None) -> None:
        super().__init__()
        self.setWindowTitle("KV cache visualiser")  # Qt adds " \u2014 kvviz", the application's display name
        self.unattended = unattended
        self.store = settings if settings is not None else app_settings()
        self.settings = AppSettings.load(self.store)
        theme.set_current(theme_name or self.settings.theme)  # the views are made in it
        self.session = RunSession(self, fall_back_to_embedded=not unattended)
        self.picker = ModelPicker()
        self.controls = RunControls(self.picker)
        self.banner = Banner()
        self.lesson: LessonSlot = NO_LESSON
        self.workspace = Workspace(self.controls, self.banner)
        self.run_view = self.workspace.run_view
        self.token_strip, self.grid, self.chart, self.counter = self.run_view.views()
        self.setCentralWidget(self.workspace)
        self.status = StatusLine()
        self.statusBar().addWidget(self.status, 1)
        self.loading = LoadingIndicator(self.session, self.statusBar(), self.status, self.banner, self.picker)
        views = (*self.workspace.views(), self.status)
        self.painter = Painter(self)
        self.scheduler = RedrawScheduler(views, self.painter, self)
        chrome = (self.menuBar(), self.statusBar(), *self.controls.settings_widgets)  # hidden in presenter mode
        self.speed = SpeedPanel(self)  # View > Speed: the sweep runs in a process of its own
        self.presentation = Presentation(self, (*views, self.speed.view), chrome)
        self.serving = ServingMode(self, self.workspace, StreamSession(self.session.controller, "serving", self),
                                   self.banner.say, self.controls.set_state)  # View > Serving: a batch, paged
        self.run_mode = RunMode(self)
        self.mode: Mode = self.run_mode  # what Step, Play, Reset and Export drive: the run, or serving
        self.presentation.add_view(self.workspace.serving)
        self.workspace.serving.on_built(lambda page: self.presentation.add_chrome(page.inputs))
        self.copier = ImageCopier(self, self.workspace)  # Ctrl+Shift+C, and "Copy image" on the plots
        self.actions = build_actions(self, action_slots(self))
        self.session.dtype = self.settings.dtype
        self.precision = PrecisionMenu(self.session, self.actions,  # Run > Precision, shown where the run is
                                       (self.status.set_precision, self.controls.show_precision))
        self.actions["kv_exact"].setChecked(True)
        self._wire()
        restore_window(self, self.store, self.settings, self.controls, self.actions, self.presentation, self.run_view,
                       prompt)
        source = self.settings.model_source if model is None else model
        self._initial_source: str | None = source
        self.grid.plot_widget.setFocus()
        # Start loading once the window is on screen: importing torch holds the GIL for seconds.
        QTimer.singleShot(INITIAL_LOAD_FALLBACK_MS, self, self._start_initial_load)  # never after the window

    def _wire(self) -> None:
        s, c = self.session, self.controls
        s.model_loaded.connect(self._on_model_loaded)
        s.model_load_failed.connect(self._on_model_load_failed)
        s.run_started.connect(self._on_run_started)
        s.record_computed.connect(self.scheduler.add)
        s.run_finished.connect(self._on_run_finished)
        s.run_failed.connect(lambda message: self.banner.say(message, alert=True))
        s.run_refused.connect(self._on_run_refused)
        s.playing_changed.connect(self._on_playing_changed)
        s.state_changed.connect(self._show_run_state)
        s.state_changed.connect(self._show_staleness)
        s.state_changed.connect(self._pause_the_sweep_while_busy)
        s.record_computed.connect(lambda _record: self._pause_the_sweep_while_busy())
        c.step_clicked.connect(lambda: self.mode.step())
        c.play_clicked.connect(self.toggle_play)
        c.reset_clicked.connect(lambda: self.mode.reset())
        c.prompt_entered.connect(self._on_prompt_entered)
        c.request_changed.connect(lambda: self.reset_run(replay_to=s.steps_target))
        c.speed_changed.connect(self._on_speed_changed)
        self.picker.model_chosen.connect(self.load_model)
        for view in (self.chart, *self.workspace.grids()):
            view.export_requested.connect(self.export)
        self.workspace.panel_built.connect(self._on_panel_built)
        self.presentation.presenter_changed.connect(self.actions["presenter"].setChecked)
        c.set_state(False, False, False)

    def _on_panel_built(self, panel: QWidget) -> None:
        self.painter.find_plots()
        for grid in panel.findChildren(KVGridView):  # compare mode's two
            grid.export_requested.connect(self.export)
            grid.set_colour_blind(self.actions["colour_blind"].isChecked())
            grid.show_scores(self.actions["scores"].isChecked())

    # ----- settings -----
    def save_settings(self) -> None:
        """Remember the run, the view and the window for the next launch (see window_state)."""
        save_window(self, self.store, self.settings, None if self.lesson.active else self.controls, self.actions,
                    self.presentation, self.session)

    # ----- models -----
    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        QTimer.singleShot(FIT_TO_SCREEN_DELAY_MS, self, lambda: fit_to_screen(self))
        QTimer.singleShot(0, self, self.focus_grid)  # a lesson that opens on a question: its guess takes the keys
        if self._initial_source is not None:
            QTimer.singleShot(INITIAL_LOAD_DELAY_MS, self, self._start_initial_load)

    def _start_initial_load(self) -> None:
        if self._initial_source is not None:
            source, self._initial_source = self._initial_source, None
            self.load_model(source)

    def load_model(self, source: str) -> None:
        """Load `source` (a --model value; "" = the embedded default) on the worker thread."""
        self.session.load(source)

    def _on_model_loaded(self, info: ModelInfo) -> None:
        self._show_title(info.name, broken=False)
        if not self.lesson.active:  # else the lesson puts the new model at its step
            self.reset_run(replay_to=self.session.resume_steps)  # another precision keeps the step

    def _show_title(self, model_name: str, broken: bool) -> None:
        warning = " \u2014 CACHE BROKEN ON PURPOSE (Run > Break the cache)" if broken else ""
        self.setWindowTitle(f"{model_name}{warning}")

    def _on_model_load_failed(self, source: str, message: str) -> None:
        if self.unattended:
            self.banner.say(message, alert=True)
            return
        show_error(self, "Model not loaded", message)
        if self.session.model_info is None and not self.session.loading:
            self.banner.say("No model is loaded: choose one in the Model list (Ctrl+M).", alert=True)

    # ----- runs -----
    def reset_run(self, replay_to: int = 0) -> None:
        """Start a fresh run from the prompt; with `replay_to`, recompute up to that many tokens."""
        self.session.start_run(self.controls.request(), replay_to)

    def toggle_play(self) -> None:
        self.mode.toggle_play(self.controls.interval_ms())

    def serving_toggled(self, on: bool) -> None:
        """View > Serving: the batch of prompts in place of the run's views; the run pauses meanwhile."""
        if on:
            self.session.pause()
        self.mode = self.serving if on else self.run_mode
        self.serving.set_active(on)
        self.mode.show_state()

    def _on_run_refused(self, message: str, request) -> None:
        """A setting the model cannot take: said in the banner, and every control and checkmark shows the run that
        goes on again (its views never left it)."""
        self.banner.say(message, alert=True)
        self.controls.show_request(request)
        check_run_actions(self.actions, request.break_cache, request.compare, request.attention, request.kv_dtype)
        self.run_view.show_attention(request.attention)  # A opens the strip at once, before the run is asked for
        self._show_run_state()

    def _pause_the_sweep_while_busy(self) -> None:
        """The background speed sweep stops while the live run loads, plays or computes a step, and goes on
        when it is idle: a step the lecturer waits for never shares the machine with it."""
        s = self.session
        self.speed.pause(s.playing or s.loading or s.asking or s.steps_target > s.steps_done)

    def _show_staleness(self) -> None:
        """The veil over the run's views while they show what is being replaced: a model loading, a run asked
        for and not yet started (a lesson's step, a setting changed)."""
        s = self.session
        if s.loading:
            text = f"Loading {source_label(s.latest_source)}\u2026"
        elif s.asking:
            text = (f"Preparing step {self.lesson.step_number}\u2026" if self.lesson.active
                    else "Preparing the run\u2026")
        else:
            text = None
        queued = s.queued()
        if text is not None and queued:
            text += f"\n{queued} queued"
        self.workspace.stale_cover.say(text)

    def _show_run_state(self) -> None:
        """The run controls' Step, Play and Reset as the mode that is on allows."""
        self.mode.show_state()

    def _on_run_started(self, plan: RunPlan) -> None:
        self.banner.say("")
        self._show_title(plan.model_name, plan.cache_broken)
        self.workspace.show_compare(plan.twin is not None)
        self.scheduler.reset(plan)
        self.run_prepared.emit(plan)

    def _on_run_finished(self, record: StepRecord) -> None:
        plan = self.session.plan
        if record.stop_reason == "context_full" and plan is not None:
            self.banner.say(f"Context full: the model holds {plan.n_ctx} positions, so the run stopped after "
                             f"{record.new_tokens} new tokens. Shorten the prompt or lower max new tokens.",
                             alert=True)
        # the final state now, not after a full-speed redraw interval; in slices, so no pass of the
        # event loop blocks for a whole redraw
        self.scheduler.redraw_soon(then=lambda: self.run_done.emit(record))

    def _on_playing_changed(self, playing: bool) -> None:
        self.scheduler.full_speed = playing and self.controls.interval_ms() == 0
        if not playing:
            self.scheduler.catch_up()

    def _on_speed_changed(self, interval_ms: int) -> None:
        self.session.set_interval(interval_ms)
        self.scheduler.full_speed = self.session.playing and interval_ms == 0

    def _on_prompt_entered(self) -> None:
        self.reset_run()
        self.focus_grid()

    def show_speed(self, activate: bool = True, long: bool = False) -> None:
        """View > Speed: the speed of a token step against the length, for the loaded model (measured once);
        without `activate` the keys stay with this window. `long` (View > Long speed sweep): asks for the long
        sweep of every kind of cache."""
        info = self.session.model_info
        if info is None:
            self.banner.say("No model is loaded yet: the speed is measured on the loaded model.", alert=True)
            return
        if self.speed.isVisible() and not long:
            self.speed.close()
            return
        self.speed.context = info.n_ctx
        self.speed.show_for(self.session.source or "", info.dtype, info.name, activate, long)

    def focus_grid(self) -> None:
        """Keyboard focus on the shown K/V grid (keys step the run, none of them types)."""
        self.workspace.focus_grid()

    def set_colour_blind(self, on: bool) -> None:
        """Patterns on the amber and teal cells of every grid (View > Colour-blind patterns)."""
        for grid in self.workspace.grids():
            grid.set_colour_blind(on)

    def set_theme(self, name: str) -> None:
        """Show the window and every view in the theme called `name` ("dark" or "light"); exports follow."""
        chosen = theme.set_current(name)
        self.actions[f"theme_{chosen.name}"].setChecked(True)
        if chosen != self.presentation.theme:
            self.presentation.set_theme(chosen)
            self.lesson.set_theme(chosen)

    def choose_window(self) -> None:
        """Run > Sliding window (W): ask for the window and the sinks, and restart the run with them."""
        from kvviz.app.window.window_dialog import WindowDialog

        dialog = WindowDialog(self.controls.window, self.controls.sinks, self)
        if dialog.exec():
            self.controls.set_window(*dialog.chosen())

    def set_kv_dtype(self, kv_dtype: str) -> None:
        """Run > KV cache precision: the run restarts with its cache exact ("") or quantized; compare mode then puts
        the exact cache beside the quantized one."""
        self.actions[f"kv_{kv_dtype or 'exact'}"].setChecked(True)
        self.controls.set_kv_dtype(kv_dtype)

    def escape(self) -> None:
        """Esc: the lesson's, else leave presenter mode, else the keyboard focus back on the grid."""
        if self.lesson.escape():
            return
        if self.presentation.presenter:
            self.presentation.set_presenter(False)
        else:
            self.focus_grid()

    def redraw(self) -> None:
        """Draw every view's latest state now (tests, exports)."""
        self.scheduler.flush()

    # ----- export and closing -----
    def export_targets(self) -> dict[str, QWidget]:
        """What File > Export... can render now (see Workspace.export_targets)."""
        return self.workspace.export_targets()

    def export(self) -> None:
        """File > Export...: what the mode that is on shows."""
        self.mode.export(self.status)

    def closeEvent(self, event: QCloseEvent) -> None:
        self._initial_source = None  # a window closed before its first load never starts one
        self.save_settings()
        self.scheduler.stop()
        self.speed.shut_down()
        if not self.session.stop(1000):
            # Only an uninterruptible load (reading weights) can outlast the second: hide and let it end.
            self.hide()
            self.session.wait()
        event.accept()


def action_slots(w: MainWindow) -> dict[str, Callable]:
    """What each action of actions.ACTIONS does in `w`."""
    c, p = w.controls, w.presentation
    return {
        "open_file": lambda: w.picker.open_checkpoint(False),
        "open_folder": lambda: w.picker.open_checkpoint(True),
        "choose_model": w.picker.pop_up, "export": w.export, "quit": w.close,
        "copy_image": w.copier.copy_chart,
        "step": lambda: w.mode.step(), "play": w.toggle_play,
        "faster": lambda: c.change_speed(+1),
        "slower": lambda: c.change_speed(-1),
        "reset": lambda: w.mode.reset(),
        "toggle_cache": c.cache_check.toggle,
        "edit_prompt": c.focus_prompt, "escape": w.escape, "presenter": p.set_presenter,
        "lesson": lambda on: w.lesson.set_active(on),
        "lesson_sharing": lambda: w.lesson.switch("kv-sharing"),
        "lesson_window": lambda: w.lesson.switch("kv-window"),
        "lesson_paging": lambda: w.lesson.switch("kv-paging"),
        "lesson_quantized": lambda: w.lesson.switch("kv-quantized"),
        "lesson_layers": lambda: w.lesson.switch("kv-layers"),
        "lesson_speculative": lambda: w.lesson.switch("kv-speculative"),
        "lesson_importance": lambda: w.lesson.switch("kv-importance"),
        "lesson_server": lambda: w.lesson.switch("kv-server"),
        "lesson_next": lambda: w.lesson.next(), "lesson_back": lambda: w.lesson.back(),
        "colour_blind": w.set_colour_blind, "compare": c.set_compare, "break_cache": c.set_break_cache,
        "sliding_window": w.choose_window, "speculative": lambda: choose_speculative(w),
        "evict_importance": lambda: choose_eviction(c, w),
        "scores": lambda on: [grid.show_scores(on) for grid in w.workspace.grids()],
        **{f"kv_{name or 'exact'}": (lambda on, name=name: on and w.set_kv_dtype(name))
           for name in ("", "int8", "int4", "fp8")},
        "memory": lambda on: (w.workspace.show_memory(on), w.redraw()),
        "attention": lambda on: (w.run_view.show_attention(on), c.set_attention(on)),
        "heads": lambda: w.grid.toggle_heads(),
        "speed": lambda: w.show_speed(), "long_speed": lambda: w.show_speed(long=True),
        "serving": w.serving_toggled,
        "theme_dark": lambda on: on and w.set_theme("dark"),
        "theme_light": lambda on: on and w.set_theme("light"),
        "zoom_in": lambda: p.step_zoom(+1),
        "zoom_out": lambda: p.step_zoom(-1), "zoom_reset": lambda: p.set_zoom(1.0),
        "shortcuts": lambda: ShortcutsDialog(w.actions.values(), w).exec(),
        "about": lambda: AboutDialog(w.session.model_info, w).exec(),
    }


def choose_speculative(w: MainWindow) -> None:
    """Run > Speculative decoding (D): ask for the drafter and k, and restart the run with them up to the same
    token (a refused combination is said in the banner, and the run goes on as it was)."""
    dialog = SpeculativeDialog(w.controls.speculative, w)
    if dialog.exec():
        w.controls.set_speculative(dialog.chosen())
