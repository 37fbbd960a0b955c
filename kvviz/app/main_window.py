"""The main window: assembles the session, the controls, the views and the actions, and wires them."""

from __future__ import annotations

from pyqtgraph import GraphicsView
from PySide6.QtCore import QEvent, QSettings, QTimer, Signal
from PySide6.QtGui import QCloseEvent, QShowEvent
from PySide6.QtWidgets import QApplication, QFrame, QHBoxLayout, QMainWindow, QScrollArea, QVBoxLayout, QWidget

from kvviz.app import theme
from kvviz.app.actions import build_actions
from kvviz.app.banner import Banner
from kvviz.app.clipboard import ImageCopier
from kvviz.app.controls import RunControls
from kvviz.app.dialogs import AboutDialog, ShortcutsDialog, show_error
from kvviz.app.lesson_mode import LessonMode
from kvviz.app.lesson_panel import LessonPanel
from kvviz.app.loading import LoadingIndicator
from kvviz.app.model_picker import ModelPicker
from kvviz.app.precision import PrecisionMenu
from kvviz.app.presentation import Presentation, fit_to_screen
from kvviz.app.redraw import RedrawScheduler
from kvviz.app.session import RunSession
from kvviz.app.settings import AppSettings, app_settings, load_geometry, save_geometry
from kvviz.app.views.compare_view import CompareView
from kvviz.app.views.memory_view import MemoryView
from kvviz.app.views.run_view import RunView
from kvviz.app.views.status import StatusLine
from kvviz.records import ModelInfo, RunPlan, StepRecord

INITIAL_LOAD_DELAY_MS = 100  # after the window is first shown, so it paints before torch is imported
INITIAL_LOAD_FALLBACK_MS = 1000  # a window never shown (headless use) still loads its model


class MainWindow(QMainWindow):
    """The kvviz desktop window. It only assembles parts and connects them: run state lives in
    `session`, drawing in `scheduler` and the views, zoom and presenter mode in `presentation`.

    `model` is a `--model` value (None: the one remembered, else the embedded default); `prompt`
    the starting prompt (None: the one remembered); `lesson` a lesson file to start in lesson mode with
    ("" or "builtin": the built-in lesson; None: the free app); `theme_name` "dark" or "light" (None: the one
    remembered). `unattended` (the GUI benchmark) sends errors to the banner, never to a dialog nobody can
    close, and never falls back to the embedded model.
    """

    run_prepared = Signal(object)  # RunPlan: a fresh run is ready (after a model load, Reset, Enter...)
    run_done = Signal(object)  # the final StepRecord of a run

    def __init__(self, model: str | None = None, prompt: str | None = None,
                 settings: QSettings | None = None, unattended: bool = False, lesson: str | None = None,
                 theme_name: str | None = None) -> None:
        super().__init__()
        self.setWindowTitle("kvviz \u2014 KV cache visualiser")
        self.unattended = unattended
        self.store = settings if settings is not None else app_settings()
        self.settings = AppSettings.load(self.store)
        theme.set_current(theme_name or self.settings.theme)  # the views are made in it
        self.session = RunSession(self, fall_back_to_embedded=not unattended)
        self.picker = ModelPicker()
        self.controls = RunControls(self.picker)
        self.banner = Banner()
        self.lesson_panel = LessonPanel()  # lesson mode's step, beside the views
        self.lesson_panel.hide()
        self.run_view = RunView()  # everything a viewer looks at: exported as "view"
        self.token_strip, self.grid, self.chart, self.counter = self.run_view.views()
        self.compare_view = CompareView()  # compare mode, in place of run_view; fed the same records
        self.compare_view.hide()
        panels = QWidget()
        panels_layout = QVBoxLayout(panels)  # the hidden panel takes no room, and sets no minimum size
        panels_layout.setContentsMargins(0, 0, 0, 0)
        panels_layout.addWidget(self.run_view)
        panels_layout.addWidget(self.compare_view)
        central = QWidget()
        central.setObjectName("central")
        layout = QVBoxLayout(central)
        layout.setContentsMargins(8, 6, 8, 4)
        layout.setSpacing(6)
        scroll = QScrollArea()  # on a screen too small for every panel's useful size, the panels scroll
        scroll.setWidget(panels)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setObjectName("runScroll")
        beside = QHBoxLayout()  # the lesson's column beside the views, so that they keep their height
        beside.setSpacing(8)
        beside.addWidget(scroll, 1)
        self.memory_view = MemoryView()  # View > Memory: a column beside the views
        self.memory_view.hide()
        beside.addWidget(self.memory_view)
        beside.addWidget(self.lesson_panel)
        for widget, stretch in ((self.controls, 0), (self.banner, 0)):
            layout.addWidget(widget, stretch)
        layout.addLayout(beside, 1)
        self.lesson_panel.set_places(layout, 2, beside)  # a strip over the views when a column does not fit
        self.setCentralWidget(central)
        self.status = StatusLine()
        self.statusBar().addWidget(self.status, 1)
        self.loading = LoadingIndicator(self.session, self.statusBar(), self.status, self.banner, self.picker)
        # a new view joins here
        views = (*self.run_view.views(), self.run_view.attention, *self.compare_view.views(), self.memory_view,
                 self.status)
        self.scheduler = RedrawScheduler(views, self._paint_now, self)
        chrome = (self.menuBar(), self.statusBar(), *self.controls.settings_widgets)  # hidden in presenter mode
        self.presentation = Presentation(self, (*views, self.lesson_panel), chrome)
        self._scenes = [view.scene() for view in self.findChildren(GraphicsView)]  # every plot's
        self.lesson = LessonMode(self, self.lesson_panel, lesson)
        self.records: list[StepRecord] = []  # the current run's, for an animated export
        self.copier = ImageCopier(self)  # Ctrl+Shift+C, and "Copy image" on the plots
        self.actions = build_actions(self, self._action_slots())
        self.session.dtype = self.settings.dtype
        self.precision = PrecisionMenu(self.session, self.actions)  # Run > Precision
        self._wire()
        self._restore(prompt)
        if lesson is not None:
            self.lesson.open(lesson)
        source = self.settings.model_source if model is None else model
        self._initial_source: str | None = source
        self.grid.plot_widget.setFocus()
        # Start loading once the window is on screen: importing torch holds the GIL for seconds.
        QTimer.singleShot(INITIAL_LOAD_FALLBACK_MS, self._start_initial_load)

    def _action_slots(self) -> dict:
        s, c, p = self.session, self.controls, self.presentation
        return {
            "open_file": lambda: self.picker.open_checkpoint(False),
            "open_folder": lambda: self.picker.open_checkpoint(True),
            "choose_model": self.picker.pop_up, "export": self.export, "quit": self.close,
            "copy_image": self.copier.copy_chart,
            "step": s.step, "play": self.toggle_play, "faster": lambda: c.change_speed(+1),
            "slower": lambda: c.change_speed(-1), "reset": self.reset_run, "toggle_cache": c.cache_check.toggle,
            "edit_prompt": c.focus_prompt, "escape": self._on_escape, "presenter": p.set_presenter,
            "lesson": self.lesson.set_active, "lesson_next": self.lesson.next, "lesson_back": self.lesson.back,
            "colour_blind": self._set_colour_blind, "compare": c.set_compare, "break_cache": c.set_break_cache,
            "memory": lambda on: (self.memory_view.setVisible(on), self.redraw()),
            "attention": lambda on: (self.run_view.show_attention(on), c.set_attention(on)),
            "heads": lambda: self.grid.toggle_heads(),
            "theme_dark": lambda on: on and self.set_theme("dark"),
            "theme_light": lambda on: on and self.set_theme("light"),
            "zoom_in": lambda: p.step_zoom(+1),
            "zoom_out": lambda: p.step_zoom(-1), "zoom_reset": lambda: p.set_zoom(1.0),
            "shortcuts": lambda: ShortcutsDialog(self.actions.values(), self).exec(),
            "about": lambda: AboutDialog(self.session.model_info, self).exec(),
        }

    def _wire(self) -> None:
        s, c = self.session, self.controls
        s.model_loaded.connect(self._on_model_loaded)
        s.model_load_failed.connect(self._on_model_load_failed)
        s.run_started.connect(self._on_run_started)
        s.record_computed.connect(self.scheduler.add)
        s.run_started.connect(lambda _plan: self.records.clear())
        s.record_computed.connect(self.records.append)
        s.run_finished.connect(self._on_run_finished)
        s.run_failed.connect(lambda message: self.banner.say(message, alert=True))
        s.playing_changed.connect(self._on_playing_changed)
        s.state_changed.connect(lambda: c.set_state(s.can_step, s.playing, s.can_reset))
        c.step_clicked.connect(s.step)
        c.play_clicked.connect(self.toggle_play)
        c.reset_clicked.connect(self.reset_run)
        c.prompt_entered.connect(self._on_prompt_entered)
        c.request_changed.connect(lambda: self.reset_run(replay_to=s.steps_done))
        c.speed_changed.connect(self._on_speed_changed)
        self.picker.model_chosen.connect(self.load_model)
        for view in (self.grid, self.chart, self.compare_view.cached_grid, self.compare_view.uncached_grid):
            view.export_requested.connect(self.export)
        self.presentation.presenter_changed.connect(self.actions["presenter"].setChecked)
        self.presentation.presenter_changed.connect(lambda on: self.lesson_panel.set_notes_shown(not on))
        c.set_state(False, False, False)

    # ----- settings -----
    def _restore(self, prompt: str | None) -> None:
        self.controls.restore(self.settings, prompt)
        self.actions["colour_blind"].setChecked(self.settings.colour_blind)
        self.actions["compare"].setChecked(self.settings.compare)
        self.actions[f"theme_{theme.current().name}"].setChecked(True)
        self.presentation.set_zoom(self.settings.zoom)
        self.run_view.main_splitter.setSizes([430, 0, 520])
        self.run_view.bottom_splitter.setSizes([1000, 360])
        geometry = load_geometry(self.store)
        if geometry is None or not self.restoreGeometry(geometry):
            screen = self.screen().availableGeometry()
            self.resize(min(1600, screen.width()), min(1000, screen.height()))
            self.move(screen.topLeft())
        fit_to_screen(self)  # the geometry may come from a larger screen than this one

    def save_settings(self) -> None:
        if not self.lesson.active:  # a lesson's settings are its own: the free app's were kept when it began
            self.controls.store(self.settings)
        self.settings.colour_blind = self.actions["colour_blind"].isChecked()
        self.settings.zoom = self.presentation.remembered_zoom
        self.settings.theme = self.presentation.theme.name
        if self.session.source is not None:
            self.settings.model_source = self.session.source
        self.settings.dtype = self.session.model_info.dtype if self.session.model_info else self.session.dtype
        self.settings.save(self.store)
        if not self.presentation.presenter:
            save_geometry(self.store, self.saveGeometry())

    # ----- models -----
    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        QTimer.singleShot(250, self, lambda: fit_to_screen(self))  # once the window manager has framed it
        if self._initial_source is not None:
            QTimer.singleShot(INITIAL_LOAD_DELAY_MS, self._start_initial_load)

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
            self.reset_run()

    def _show_title(self, model_name: str, broken: bool) -> None:
        warning = " \u2014 CACHE BROKEN ON PURPOSE (Run > Break the cache)" if broken else ""
        self.setWindowTitle(f"kvviz \u2014 {model_name}{warning}")

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
        self.session.toggle_play(self.controls.interval_ms())

    def _on_run_started(self, plan: RunPlan) -> None:
        self.banner.say("")
        self._show_title(plan.model_name, plan.cache_broken)
        comparing = plan.twin is not None
        if comparing != self.compare_view.isVisibleTo(self):
            leaving = self.compare_view if not comparing else self.run_view
            focus_was_there = leaving.isAncestorOf(QApplication.focusWidget()) if QApplication.focusWidget() else True
            self.run_view.setVisible(not comparing)
            self.compare_view.setVisible(comparing)
            if focus_was_there:  # else Qt hands the focus to the prompt field, and Space types into it
                self.focus_grid()
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

    def focus_grid(self) -> None:
        """Keyboard focus on the shown K/V grid (keys step the run, none of them types)."""
        grid = self.compare_view.cached_grid if self.compare_view.isVisibleTo(self) else self.grid
        grid.plot_widget.setFocus()

    def _set_colour_blind(self, on: bool) -> None:
        for grid in (self.grid, self.compare_view.cached_grid, self.compare_view.uncached_grid):
            grid.set_colour_blind(on)

    def set_theme(self, name: str) -> None:
        """Show the window and every view in the theme called `name` ("dark" or "light"); exports follow."""
        chosen = theme.set_current(name)
        self.actions[f"theme_{chosen.name}"].setChecked(True)
        if chosen != self.presentation.theme:
            self.presentation.set_theme(chosen)
            self.lesson.set_theme(chosen)

    def _on_escape(self) -> None:
        if self.lesson.escape():
            return
        if self.presentation.presenter:
            self.presentation.set_presenter(False)
        else:
            self.focus_grid()

    def redraw(self) -> None:
        """Draw every view's latest state now (tests, exports)."""
        self.scheduler.flush()

    def _paint_now(self) -> None:
        """Paint what the views just changed, now, so that the time a redraw takes is its whole cost."""
        if not self.isVisible():
            return
        for scene in self._scenes:
            QApplication.sendPostedEvents(scene, QEvent.Type.MetaCall.value)  # a plot posts its scene's changes
        QApplication.sendPostedEvents(self, QEvent.Type.UpdateRequest.value)  # paints the dirty regions only

    # ----- export and closing -----
    def export_targets(self) -> dict[str, QWidget]:
        """What File > Export... can render: the chart, the grid, the whole view and, with View > Attention
        open, the attention strip; in compare mode the compare view and its two grids."""
        if self.compare_view.isVisibleTo(self):
            compare = self.compare_view
            return {"compare": compare, "cached_grid": compare.cached_grid, "uncached_grid": compare.uncached_grid}
        attention = {"attention": self.run_view.attention} if self.run_view.attention.isVisibleTo(self) else {}
        return {"chart": self.chart, "grid": self.grid, "view": self.run_view, **attention}

    def export(self) -> None:
        from kvviz.app.export import AnimationSource, ExportDialog, make_caption

        self.session.pause()
        self.scheduler.flush()
        plan, record, info = self.session.plan, self.session.last_record, self.session.model_info
        step = record.step + 1 if record is not None else None
        caption = make_caption(plan.prompt if plan else self.controls.prompt_edit.text(),
                               info.name if info else "no model", step, record.new_tokens if record else None,
                               plan.use_cache if plan else None, compare=plan is not None and plan.twin is not None,
                               cache_broken=plan is not None and plan.cache_broken)
        animation = AnimationSource(plan, tuple(self.records)) if plan is not None and self.records else None
        ExportDialog(self.export_targets(), caption, self, step=step, animation=animation).exec()

    def closeEvent(self, event: QCloseEvent) -> None:
        self.save_settings()
        self.scheduler.stop()
        if not self.session.stop(1000):
            # Only an uninterruptible load (reading weights) can outlast the second: hide and let it end.
            self.hide()
            self.session.wait()
        event.accept()

