"""The main window: controls, the K/V grid, the counter, the chart, the token strip."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from PySide6.QtCore import QByteArray, QEvent, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QFont, QKeySequence, QShowEvent
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMainWindow,
    QProgressBar,
    QPushButton,
    QSlider,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from kvviz.app import theme
from kvviz.app.dialogs import AboutDialog, ShortcutsDialog, show_error
from kvviz.app.run_info import ModelInfo, RunInfo, RunRequest
from kvviz.app.run_view import RunView
from kvviz.app.settings import app_settings
from kvviz.app.worker import WorkerController

if TYPE_CHECKING:
    from kvviz.engine import StepRecord

DEFAULT_PROMPT = "To be, or not to be"
DEFAULT_MAX_NEW_TOKENS = 12
REDRAW_MS = 30  # views redraw at most this often, with the latest records
REDRAW_MAX_MS = 250  # ... and at least this often while records arrive
REDRAW_BUDGET = 0.1  # the share of time redraws may take: a slow redraw spaces the next ones out
# At full-speed autoplay the worker never waits, and every redraw (Python painting, holding the GIL)
# slows it down: there the views redraw less often, up to once a second.
REDRAW_BUDGET_FULL_SPEED = 0.02
REDRAW_MAX_MS_FULL_SPEED = 1000
SPEEDS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 0.0)  # tokens per second for autoplay; 0 = as fast as possible
ZOOM_STEPS = (0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.4, 1.6, 1.8, 2.0, 2.3)
PRESENTER_ZOOM = 1.6
INITIAL_LOAD_DELAY_MS = 100  # after the window is first shown, so it paints before torch is imported
INITIAL_LOAD_FALLBACK_MS = 1000  # a window never shown (headless use) still loads its model
EMBEDDED = ""  # model source meaning the embedded default
HUB_CHOICES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
HUB_SIZES = {"gpt2": "0.5 GB", "gpt2-medium": "1.5 GB", "gpt2-large": "3.2 GB", "gpt2-xl": "6.4 GB"}
RANDOM_CHOICES = ("random:kvviz-shakespeare", "random:gpt2", "random:gpt2-medium", "random:gpt2-large",
                  "random:gpt2-xl")
OPEN_FILE, OPEN_FOLDER = "\0open-file", "\0open-folder"


class MainWindow(QMainWindow):
    """The kvviz desktop window. It only reads records; the model runs on the worker's thread.

    `model` is a `--model` value (None: the one remembered, else the embedded default);
    `prompt` the starting prompt (None: the one remembered).
    """

    run_prepared = Signal(object)  # RunInfo: a fresh run is ready (after a model load, Reset, Enter...)
    run_done = Signal(object)  # the final StepRecord of a run

    def __init__(self, model: str | None = None, prompt: str | None = None,
                 settings: QSettings | None = None, unattended: bool = False) -> None:
        super().__init__()
        # Unattended (the GUI benchmark): errors go to the banner, never to a dialog nobody can close,
        # and a model that fails to load is not replaced by the embedded one.
        self.unattended = unattended
        self.setWindowTitle("kvviz \u2014 KV cache visualiser")
        self.settings = settings if settings is not None else app_settings()
        self.model_info: ModelInfo | None = None
        self.run_info: RunInfo | None = None
        self.last_record: StepRecord | None = None
        self._source: str | None = None  # source of the loaded model
        self._loading_source: str | None = None
        self._run_id = 0
        self._replay_target = 0
        self._steps_requested = 0
        self._finished = False
        self._playing = False
        self._presenter = False
        self._zoom = 1.0
        self._zoom_before_presenter = 1.0
        self._last_redraw = 0.0
        self._redraw_interval_ms = REDRAW_MS
        self.max_redraw_ms = 0.0  # the slowest redraw so far, painting included (gui bench reports it)
        self._fallback_tried = False
        self._base_point_size = QFont(self.font()).pointSizeF()

        self.controller = WorkerController(self)
        self._connect_worker()
        self._build_ui()
        self._build_actions()
        self._redraw_timer = QTimer(self)
        self._redraw_timer.setSingleShot(True)
        self._redraw_timer.timeout.connect(self._redraw_in_slices)
        self._slices_left: list = []
        self._pending_records: list[StepRecord] = []  # arrived, not yet given to the views
        self._slices_seconds = 0.0
        self._restore_settings(prompt)
        geometry = self.settings.value("window/geometry")
        if not (isinstance(geometry, QByteArray) and self.restoreGeometry(geometry)):
            screen = self.screen().availableGeometry()
            self.resize(min(1600, screen.width()), min(1000, screen.height()))
            self.move(screen.topLeft())
        self.main_splitter.setSizes([430, 520])
        self.bottom_splitter.setSizes([1000, 360])
        remembered = self.settings.value("model/source", EMBEDDED, type=str)
        self._initial_source: str | None = remembered if model is None else model
        self.grid.plot_widget.setFocus()
        # Start loading once the window is on screen: importing torch holds the GIL for seconds.
        QTimer.singleShot(INITIAL_LOAD_FALLBACK_MS, self._start_initial_load)

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if self._initial_source is not None:
            QTimer.singleShot(INITIAL_LOAD_DELAY_MS, self._start_initial_load)

    def _start_initial_load(self) -> None:
        if self._initial_source is not None:
            source, self._initial_source = self._initial_source, None
            self.load_model(source)

    # ----- building -----
    def _connect_worker(self) -> None:
        w = self.controller.worker
        w.model_loading.connect(self._on_model_loading)
        w.download_progressed.connect(self._on_download_progressed)
        w.model_loaded.connect(self._on_model_loaded)
        w.model_load_failed.connect(self._on_model_load_failed)
        w.model_load_cancelled.connect(self._on_model_load_cancelled)
        w.run_started.connect(self._on_run_started)
        w.run_failed.connect(self._on_run_failed)
        w.step_computed.connect(self._on_step_computed)
        w.run_finished.connect(self._on_run_finished)
        w.playing_changed.connect(self._on_playing_changed)

    def _build_ui(self) -> None:
        central = QWidget()
        central.setObjectName("central")
        self.setCentralWidget(central)

        self.prompt_edit = QLineEdit()
        self.prompt_edit.setPlaceholderText("Prompt (empty: start from <|endoftext|>); Enter starts a fresh run")
        self.prompt_edit.setClearButtonEnabled(True)
        self.prompt_edit.returnPressed.connect(self._on_prompt_entered)
        self.model_combo = QComboBox()
        self.model_combo.setMinimumContentsLength(22)
        self.model_combo.setToolTip("Model: the embedded default, GPT-2 from the hub, random weights, or a checkpoint")
        self._fill_model_combo()
        self.model_combo.activated.connect(self._on_model_chosen)
        top = QHBoxLayout()
        top.addWidget(QLabel("Prompt"))
        top.addWidget(self.prompt_edit, 1)
        top.addWidget(QLabel("Model"))
        top.addWidget(self.model_combo)

        self.step_button = QPushButton("Step \u25b8")
        self.step_button.setObjectName("primary")
        self.step_button.setToolTip("Compute one new token (Space, Right, PageDown)")
        self.play_button = QPushButton("Play")
        self.play_button.setToolTip("Play / pause (P)")
        self.reset_button = QPushButton("Reset")
        self.reset_button.setToolTip("Start the run again from the prompt (R)")
        for button in (self.step_button, self.play_button, self.reset_button):
            button.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.step_button.clicked.connect(self.step)
        self.play_button.clicked.connect(self.toggle_play)
        self.reset_button.clicked.connect(self.reset_run)
        self.speed_slider = QSlider(Qt.Orientation.Horizontal)
        self.speed_slider.setRange(0, len(SPEEDS) - 1)
        self.speed_slider.setFixedWidth(110)
        self.speed_slider.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.speed_slider.valueChanged.connect(self._on_speed_changed)
        self.speed_label = QLabel()
        self.speed_label.setMinimumWidth(70)
        self.cache_check = QCheckBox("KV cache")
        self.cache_check.setChecked(True)
        self.cache_check.setToolTip("Use the KV cache (C); turning it off recomputes every K/V at every step")
        self.cache_check.toggled.connect(self._on_settings_changed)
        self.max_new_spin = QSpinBox()
        self.max_new_spin.setRange(1, 4096)
        self.max_new_spin.setValue(DEFAULT_MAX_NEW_TOKENS)
        self.max_new_spin.setKeyboardTracking(False)
        self.max_new_spin.valueChanged.connect(self._on_settings_changed)
        self.temperature_spin = QDoubleSpinBox()
        self.temperature_spin.setRange(0.0, 5.0)
        self.temperature_spin.setSingleStep(0.1)
        self.temperature_spin.setDecimals(2)
        self.temperature_spin.setSpecialValueText("greedy")
        self.temperature_spin.setKeyboardTracking(False)
        self.temperature_spin.setToolTip("Temperature; 0 means greedy decoding")
        self.temperature_spin.valueChanged.connect(self._on_settings_changed)
        self.top_k_spin = QSpinBox()
        self.top_k_spin.setRange(0, 50257)
        self.top_k_spin.setSpecialValueText("off")
        self.top_k_spin.setKeyboardTracking(False)
        self.top_k_spin.valueChanged.connect(self._on_settings_changed)
        self.seed_spin = QSpinBox()
        self.seed_spin.setRange(0, 2**31 - 1)
        self.seed_spin.setKeyboardTracking(False)
        self.seed_spin.valueChanged.connect(self._on_settings_changed)
        controls = QHBoxLayout()
        for widget in (self.step_button, self.play_button, QLabel("speed"), self.speed_slider, self.speed_label,
                       self.reset_button):
            controls.addWidget(widget)
        controls.addSpacing(16)
        self.settings_row = QWidget()
        settings_layout = QHBoxLayout(self.settings_row)
        settings_layout.setContentsMargins(0, 0, 0, 0)
        settings_layout.addWidget(self.cache_check)
        for text, widget in (("max new tokens", self.max_new_spin), ("temperature", self.temperature_spin),
                             ("top-k", self.top_k_spin), ("seed", self.seed_spin)):
            settings_layout.addSpacing(8)
            label = QLabel(text)
            label.setObjectName("muted")
            label.setBuddy(widget)
            settings_layout.addWidget(label)
            settings_layout.addWidget(widget)
        controls.addWidget(self.settings_row)
        controls.addStretch(1)

        self.banner = QLabel()
        self.banner.setObjectName("banner")
        self.banner.setWordWrap(True)
        self.banner.hide()

        self.view_area = RunView()  # everything a viewer looks at: exported as "view"
        self.token_strip, self.grid, self.chart, self.counter = self.view_area.views()
        self._graphics_scenes = (self.grid.plot_widget.scene(), self.chart.layout_widget.scene())
        self.main_splitter, self.bottom_splitter = self.view_area.main_splitter, self.view_area.bottom_splitter
        self.grid.export_requested.connect(self.export)
        self.chart.export_requested.connect(self.export)

        layout = QVBoxLayout(central)
        layout.setContentsMargins(8, 6, 8, 4)
        layout.setSpacing(6)
        self.controls_area = QWidget()
        self.controls_area.setObjectName("controlsArea")
        controls_layout = QVBoxLayout(self.controls_area)
        controls_layout.setContentsMargins(0, 0, 0, 0)
        controls_layout.addLayout(top)
        controls_layout.addLayout(controls)
        layout.addWidget(self.controls_area)
        layout.addWidget(self.banner)
        layout.addWidget(self.view_area, 1)

        self.model_status = QLabel("No model")
        self.progress_bar = QProgressBar()
        self.progress_bar.setFixedWidth(220)
        self.progress_bar.hide()
        self.cancel_button = QPushButton("Cancel download")
        self.cancel_button.clicked.connect(self.controller.cancel_download)
        self.cancel_button.hide()
        self.statusBar().addWidget(self.model_status, 1)
        self.statusBar().addPermanentWidget(self.progress_bar)
        self.statusBar().addPermanentWidget(self.cancel_button)

    def _fill_model_combo(self) -> None:
        from kvviz.resources import DEFAULT_MODEL_NAME

        combo = self.model_combo
        combo.addItem(f"{DEFAULT_MODEL_NAME} (embedded)", EMBEDDED)
        combo.insertSeparator(combo.count())
        for name in HUB_CHOICES:
            combo.addItem(f"{name} (hub, {HUB_SIZES[name]})", name)
        combo.insertSeparator(combo.count())
        for name in RANDOM_CHOICES:
            combo.addItem(name, name)
        combo.insertSeparator(combo.count())
        combo.addItem("Open checkpoint file\u2026", OPEN_FILE)
        combo.addItem("Open checkpoint folder\u2026", OPEN_FOLDER)

    def _action(self, text: str, slot, keys: tuple[str | QKeySequence.StandardKey, ...] = (),
                checkable: bool = False, context: Qt.ShortcutContext = Qt.ShortcutContext.WindowShortcut) -> QAction:
        action = QAction(text, self)
        action.setShortcuts([QKeySequence(k) for k in keys])
        action.setShortcutContext(context)
        action.setCheckable(checkable)
        if checkable:
            action.toggled.connect(slot)
        else:
            action.triggered.connect(lambda _checked=False: slot())
        self.addAction(action)  # active with the menu bar hidden too (presenter mode)
        self._all_actions.append(action)
        return action

    def _build_actions(self) -> None:
        self._all_actions: list[QAction] = []
        a = self._action
        self.step_action = a("&Step (one new token)", self.step, ("Space", "Right", "PgDown"))
        self.play_action = a("&Play / pause", self.toggle_play, ("P",))
        self.reset_action = a("&Reset run", self.reset_run, ("R",))
        self.cache_action = a("Toggle KV &cache", self.cache_check.toggle, ("C",))
        self.faster_action = a("Play &faster", lambda: self.speed_slider.setValue(self.speed_slider.value() + 1),
                               ("]",))
        self.slower_action = a("Play &slower", lambda: self.speed_slider.setValue(self.speed_slider.value() - 1),
                               ("[",))
        self.prompt_action = a("Edit &prompt", self.focus_prompt, ("Ctrl+L",))
        self.leave_action = a("Leave prompt field / presenter mode", self._on_escape, ("Esc",))
        self.model_action = a("Choose &model", self._focus_model_picker, ("Ctrl+M",))
        self.open_file_action = a("&Open checkpoint file\u2026", lambda: self._open_checkpoint(False), ("Ctrl+O",))
        self.open_folder_action = a("Open checkpoint &folder\u2026", lambda: self._open_checkpoint(True),
                                    ("Ctrl+Shift+O",))
        self.export_action = a("&Export\u2026", self.export, ("Ctrl+E",))
        self.quit_action = a("&Quit", self.close, ("Ctrl+Q",), context=Qt.ShortcutContext.ApplicationShortcut)
        self.presenter_action = a("&Presenter mode", self.set_presenter_mode, ("F11",), checkable=True)
        self.colour_blind_action = a("&Colour-blind patterns", self._on_colour_blind_toggled, ("B",),
                                     checkable=True)
        self.zoom_in_action = a("Zoom &in", lambda: self.zoom(+1), ("Ctrl+=", "Ctrl++"))
        self.zoom_out_action = a("Zoom &out", lambda: self.zoom(-1), ("Ctrl+-",))
        self.zoom_reset_action = a("&Actual size", lambda: self.set_zoom(1.0), ("Ctrl+0",))
        self.shortcuts_action = a("&Keyboard shortcuts", self.show_shortcuts, ("F1", "Ctrl+/"))
        self.about_action = a("&About kvviz", self.show_about)

        bar = self.menuBar()
        file_menu = bar.addMenu("&File")
        for action in (self.open_file_action, self.open_folder_action, self.model_action, None, self.export_action,
                       None, self.quit_action):
            file_menu.addSeparator() if action is None else file_menu.addAction(action)
        run_menu = bar.addMenu("&Run")
        for action in (self.step_action, self.play_action, self.faster_action, self.slower_action, self.reset_action,
                       None, self.cache_action, self.prompt_action):
            run_menu.addSeparator() if action is None else run_menu.addAction(action)
        view_menu = bar.addMenu("&View")
        for action in (self.presenter_action, self.colour_blind_action, None, self.zoom_in_action,
                       self.zoom_out_action, self.zoom_reset_action):
            view_menu.addSeparator() if action is None else view_menu.addAction(action)
        help_menu = bar.addMenu("&Help")
        help_menu.addAction(self.shortcuts_action)
        help_menu.addAction(self.about_action)

    def actions_for_help(self) -> list[QAction]:
        return list(self._all_actions)

    # ----- settings -----
    def _restore_settings(self, prompt: str | None) -> None:
        s = self.settings
        self._applying_settings = True
        self.prompt_edit.setText(prompt if prompt is not None else s.value("run/prompt", DEFAULT_PROMPT, type=str))
        self.cache_check.setChecked(s.value("run/use_cache", True, type=bool))
        self.max_new_spin.setValue(s.value("run/max_new_tokens", DEFAULT_MAX_NEW_TOKENS, type=int))
        self.temperature_spin.setValue(s.value("run/temperature", 0.0, type=float))
        self.top_k_spin.setValue(s.value("run/top_k", 0, type=int))
        self.seed_spin.setValue(s.value("run/seed", 0, type=int))
        self.speed_slider.setValue(s.value("view/speed_index", 2, type=int))
        self._on_speed_changed(self.speed_slider.value())
        self.colour_blind_action.setChecked(s.value("view/colour_blind", False, type=bool))
        self.set_zoom(s.value("view/zoom", 1.0, type=float))
        self._applying_settings = False

    def save_settings(self) -> None:
        s = self.settings
        s.setValue("run/prompt", self.prompt_edit.text())
        s.setValue("run/use_cache", self.cache_check.isChecked())
        s.setValue("run/max_new_tokens", self.max_new_spin.value())
        s.setValue("run/temperature", self.temperature_spin.value())
        s.setValue("run/top_k", self.top_k_spin.value())
        s.setValue("run/seed", self.seed_spin.value())
        s.setValue("view/speed_index", self.speed_slider.value())
        s.setValue("view/colour_blind", self.colour_blind_action.isChecked())
        s.setValue("view/zoom", self._zoom_before_presenter if self._presenter else self._zoom)
        if self._source is not None and not self._source.startswith(("\0",)):
            s.setValue("model/source", self._source)
        if not self._presenter:
            s.setValue("window/geometry", self.saveGeometry())
        s.sync()

    # ----- model loading -----
    def load_model(self, source: str) -> None:
        """Ask the worker to load `source` (a --model value; "" = embedded default)."""
        self._loading_source = source
        self._pause_if_playing()
        self.controller.load(source)

    def _on_model_loading(self, source: str) -> None:
        label = self._source_label(source)
        self._set_banner(f"Loading {label}\u2026 (the window stays usable; the first load also imports torch)")
        self.model_status.setText(f"Loading {label}\u2026")
        self.model_combo.setEnabled(False)
        self._update_controls()
        if source in HUB_CHOICES:
            self.progress_bar.setRange(0, 0)
            self.progress_bar.show()
            self.cancel_button.show()

    def _on_download_progressed(self, done: int, total: int) -> None:
        if total > 0:
            self.progress_bar.setRange(0, 1000)
            self.progress_bar.setValue(int(1000 * done / total))
            self.progress_bar.setFormat(f"{done / 2**20:,.0f} / {total / 2**20:,.0f} MiB")
        self.progress_bar.show()
        self.cancel_button.show()

    def _end_loading(self) -> None:
        self._loading_source = None
        self.progress_bar.hide()
        self.cancel_button.hide()
        self.model_combo.setEnabled(True)
        self._set_banner("")

    def _on_model_loaded(self, info: ModelInfo) -> None:
        self._source = self._loading_source if self._loading_source is not None else EMBEDDED
        self._end_loading()
        self.model_info = info
        self._select_combo(self._source)
        self.model_status.setText(f"{info.name}: {info.n_layer} layers, {info.num_parameters / 1e6:.1f} M parameters, "
                                  f"context {info.n_ctx}")
        self.setWindowTitle(f"kvviz \u2014 {info.name}")
        self.reset_run()

    def _on_model_load_failed(self, source: str, message: str) -> None:
        self._end_loading()
        if self.unattended:
            self._set_banner(message, alert=True)
            self._update_controls()
            return
        show_error(self, "Model not loaded", message)
        if self.model_info is None and source != EMBEDDED and not self._fallback_tried:
            self._fallback_tried = True
            self.load_model(EMBEDDED)
            return
        self._select_combo(self._source)
        if self.model_info is None:
            self._set_banner("No model is loaded: choose one in the Model list (Ctrl+M).", alert=True)
        self._update_controls()

    def _on_model_load_cancelled(self, source: str) -> None:
        self._end_loading()
        kept = self.model_info.name if self.model_info else "no model"
        self.model_status.setText(f"Download of {source} cancelled; kept {kept}")
        self._select_combo(self._source)
        self._update_controls()

    def _source_label(self, source: str) -> str:
        from kvviz.resources import DEFAULT_MODEL_NAME

        return DEFAULT_MODEL_NAME if source == EMBEDDED else source

    def _select_combo(self, source: str | None) -> None:
        if source is None:
            return
        index = self.model_combo.findData(source)
        if index < 0:
            index = self.model_combo.count() - 2  # before the two "Open checkpoint" entries
            self.model_combo.insertItem(index, source.rsplit("/", 1)[-1] or source, source)
            self.model_combo.setItemData(index, source, Qt.ItemDataRole.ToolTipRole)
        self.model_combo.setCurrentIndex(index)

    def _on_model_chosen(self, index: int) -> None:
        source = self.model_combo.itemData(index)
        if source in (OPEN_FILE, OPEN_FOLDER):
            self._select_combo(self._source)
            self._open_checkpoint(source == OPEN_FOLDER)
            return
        if source != self._source:
            self.load_model(source)

    def _open_checkpoint(self, folder: bool) -> None:
        if folder:
            path = QFileDialog.getExistingDirectory(self, "Open checkpoint folder (config.json + model.safetensors)")
        else:
            path, _ = QFileDialog.getOpenFileName(self, "Open checkpoint file", "",
                                                  "Checkpoints (*.safetensors *.pth *.pt *.bin);;All files (*)")
        if path:
            self.load_model(path)

    def _focus_model_picker(self) -> None:
        self.model_combo.setFocus()
        self.model_combo.showPopup()

    # ----- runs -----
    def _request(self) -> RunRequest:
        self._run_id += 1
        temperature = float(self.temperature_spin.value())
        return RunRequest(
            run_id=self._run_id,
            prompt=self.prompt_edit.text(),
            use_cache=self.cache_check.isChecked(),
            max_new_tokens=int(self.max_new_spin.value()),
            temperature=temperature,
            top_k=int(self.top_k_spin.value()) or None,
            seed=int(self.seed_spin.value()) if temperature > 0 else None,
        )

    def reset_run(self, replay_to: int = 0) -> None:
        """Start a fresh run from the prompt; with `replay_to`, recompute up to that many tokens."""
        if self.model_info is None:
            return
        self._pause_if_playing()
        self._replay_target = replay_to
        self._steps_requested = 0
        self._finished = False
        self.last_record = None
        self.controller.start_run(self._request())

    def _on_run_started(self, info: RunInfo) -> None:
        if info.run_id != self._run_id:
            return
        self.run_info = info
        self._pending_records = []
        for view in self._views():
            view.reset(info)
        self._set_banner("")
        self._update_controls()
        target = min(self._replay_target, info.budget)
        self._replay_target = 0
        for _ in range(target):
            self._request_step()
        self.run_prepared.emit(info)

    def _on_run_failed(self, run_id: int, message: str) -> None:
        if run_id != self._run_id:
            return
        self.run_info = None
        self._set_banner(message, alert=True)
        self._update_controls()

    def _request_step(self) -> None:
        self._steps_requested += 1
        self.controller.step()

    def step(self) -> None:
        """One new token (the GUI's Step); pauses autoplay first."""
        if not self._can_step():
            return
        if self._playing:
            self.controller.pause()
        if self.run_info is not None and self._steps_requested >= self.run_info.budget:
            return
        self._request_step()

    def toggle_play(self) -> None:
        if self._playing:
            self.controller.pause()
        elif self._can_step():
            self.controller.play(self._interval_ms())

    def _pause_if_playing(self) -> None:
        if self._playing:
            self.controller.pause()

    def _can_step(self) -> bool:
        return self.model_info is not None and self.run_info is not None and not self._finished \
            and self._loading_source is None

    def _on_step_computed(self, run_id: int, record: StepRecord) -> None:
        if run_id != self._run_id:
            return
        self.last_record = record
        if record.token_id is not None:
            self._steps_requested = max(self._steps_requested, record.new_tokens)
        # The views take records when they next draw: at full speed that is dozens at once, in one
        # burst on warm caches, instead of a wake-up of the GUI thread's Python for each.
        self._pending_records.append(record)
        if not self._redraw_timer.isActive():
            since = (time.perf_counter() - self._last_redraw) * 1000
            self._redraw_timer.start(max(0, int(self._redraw_interval_ms - since)))

    def _on_run_finished(self, run_id: int, record: StepRecord) -> None:
        if run_id != self._run_id:
            return
        self._finished = True
        if record.stop_reason == "context_full":
            n_ctx = self.run_info.n_ctx if self.run_info else "?"
            self._set_banner(f"Context full: the model holds {n_ctx} positions, so the run stopped after "
                             f"{record.new_tokens} new tokens. Shorten the prompt or lower max new tokens.",
                             alert=True)
        self._update_controls()
        self._redraw_timer.stop()
        self.redraw()  # the final state at once, not after a full-speed redraw interval
        self.run_done.emit(record)

    def _on_playing_changed(self, playing: bool) -> None:
        self._playing = playing
        self.play_button.setText("Pause" if playing else "Play")
        if not playing and self._pending_records:
            self._redraw_timer.start(0)  # paused: catch up with the records now

    def redraw(self) -> None:
        """Draw the latest state of every view now, all at once (tests, exports, the end of a run)."""
        started = time.perf_counter()
        self._slices_left = []
        for draw in self._redraw_slices():
            draw()
        self._paint_now()
        self._account_redraw(time.perf_counter() - started)

    def _apply_pending_records(self) -> None:
        """Hand the records that arrived since the last redraw to every view, in order."""
        records, self._pending_records = self._pending_records, []
        views = self._views()
        for record in records:
            for view in views:
                view.apply_record(record, redraw=False)

    def _apply_and_draw_grid(self) -> None:
        self._apply_pending_records()
        self.grid.refresh()

    def _redraw_slices(self) -> list:
        """The redraw in pieces of similar cost, each drawn in its own pass of the event loop;
        the first hands the views their new records."""
        return [
            self._apply_and_draw_grid,
            self._refresh_text_views,
            self.chart.refresh_work,
            self.chart.refresh_cost,
        ]

    def _refresh_text_views(self) -> None:
        self.token_strip.refresh()
        self.counter.refresh()
        self._update_status()

    def _redraw_in_slices(self) -> None:
        """The coalescing timer's redraw: one slice now, the next ones in later passes of the event
        loop, so that no single pass blocks the GUI for a whole redraw."""
        self._slices_left = self._redraw_slices()
        self._slices_seconds = 0.0
        self._draw_next_slice()

    def _draw_next_slice(self) -> None:
        if not self._slices_left:
            return
        started = time.perf_counter()
        self._slices_left.pop(0)()
        self._paint_now()
        self._slices_seconds += time.perf_counter() - started
        if self._slices_left:
            QTimer.singleShot(0, self, self._draw_next_slice)  # dropped if the window goes first
        else:
            self._account_redraw(self._slices_seconds)

    @property
    def _redraw_pending(self) -> bool:
        return bool(self._slices_left)

    def _paint_now(self) -> None:
        """Paint what the views just changed, now, so that the time taken is the whole cost."""
        if not self.isVisible():
            return
        for scene in self._graphics_scenes:  # a plot posts its scene's changes: deliver them first
            QApplication.sendPostedEvents(scene, QEvent.Type.MetaCall.value)
        QApplication.sendPostedEvents(self, QEvent.Type.UpdateRequest.value)  # paints the dirty regions only

    def _account_redraw(self, cost_seconds: float) -> None:
        """Space the next redraws so that drawing takes at most the budgeted share of the time."""
        self._last_redraw = time.perf_counter()
        cost_ms = cost_seconds * 1000
        self.max_redraw_ms = max(self.max_redraw_ms, cost_ms)
        full_speed = self._playing and SPEEDS[self.speed_slider.value()] == 0
        budget, longest = (REDRAW_BUDGET_FULL_SPEED, REDRAW_MAX_MS_FULL_SPEED) if full_speed else (
            REDRAW_BUDGET, REDRAW_MAX_MS)
        self._redraw_interval_ms = int(min(longest, max(REDRAW_MS, cost_ms / budget)))

    def _views(self) -> tuple:
        return (self.token_strip, self.grid, self.chart, self.counter)

    def _interval_ms(self) -> int:
        speed = SPEEDS[self.speed_slider.value()]
        return 0 if speed == 0 else int(round(1000 / speed))

    def _on_speed_changed(self, index: int) -> None:
        speed = SPEEDS[index]
        self.speed_label.setText("max" if speed == 0 else f"{speed:g} tok/s")
        self.controller.set_interval(self._interval_ms())

    def _on_settings_changed(self, *_args) -> None:
        if getattr(self, "_applying_settings", False):
            return
        done = self.last_record.new_tokens if self.last_record is not None else 0
        self.reset_run(replay_to=done)

    def _on_prompt_entered(self) -> None:
        self.reset_run()
        self.grid.plot_widget.setFocus()

    def focus_prompt(self) -> None:
        self.prompt_edit.setFocus()
        self.prompt_edit.selectAll()

    def _on_escape(self) -> None:
        if self._presenter:
            self.presenter_action.setChecked(False)
        else:
            self.grid.plot_widget.setFocus()

    def _update_controls(self) -> None:
        can = self._can_step()
        self.step_button.setEnabled(can)
        self.play_button.setEnabled(can or self._playing)
        self.reset_button.setEnabled(self.model_info is not None and self._loading_source is None)

    def _update_status(self) -> None:
        rec, info = self.last_record, self.run_info
        if rec is None or info is None or self.model_info is None:
            return
        mode = "cache on" if info.use_cache else "cache off"
        self.model_status.setText(f"{self.model_info.name} \u00b7 {mode} \u00b7 {info.sampling} \u00b7 "
                                  f"{rec.new_tokens}/{info.budget} tokens \u00b7 step {rec.step + 1} took "
                                  f"{rec.seconds * 1000:.1f} ms")

    def _set_banner(self, text: str, alert: bool = False) -> None:
        self.banner.setProperty("alert", "true" if alert else "false")
        self.banner.style().unpolish(self.banner)
        self.banner.style().polish(self.banner)
        self.banner.setText(text)
        self.banner.setVisible(bool(text))

    # ----- view options -----
    def _on_colour_blind_toggled(self, enabled: bool) -> None:
        self.grid.set_colour_blind(enabled)

    def set_zoom(self, zoom: float) -> None:
        self._zoom = min(max(zoom, ZOOM_STEPS[0]), ZOOM_STEPS[-1])
        size = self._base_point_size * self._zoom
        # Style sheets stop font propagation, so the controls get their size from the sheet.
        scaled = f"QWidget#controlsArea QWidget, QLabel#banner {{ font-size: {size:.1f}pt; }}"
        self.setStyleSheet(theme.STYLESHEET + scaled)
        for view in self._views():
            view.set_font_scale(self._zoom)

    def zoom(self, direction: int) -> None:
        bigger = [z for z in ZOOM_STEPS if z > self._zoom + 1e-6]
        smaller = [z for z in ZOOM_STEPS if z < self._zoom - 1e-6]
        if direction > 0 and bigger:
            self.set_zoom(bigger[0])
        elif direction < 0 and smaller:
            self.set_zoom(smaller[-1])

    def set_presenter_mode(self, enabled: bool) -> None:
        """Full screen, larger fonts, no menu bar, status bar or sampling controls."""
        if enabled == self._presenter:
            return
        self._presenter = enabled
        if enabled:
            self._zoom_before_presenter = self._zoom
            self.showFullScreen()
            self.set_zoom(max(self._zoom, PRESENTER_ZOOM))
        else:
            self.showNormal()
            self.set_zoom(self._zoom_before_presenter)
        self.menuBar().setVisible(not enabled)
        self.statusBar().setVisible(not enabled)
        self.settings_row.setVisible(not enabled)
        if self.presenter_action.isChecked() != enabled:
            self.presenter_action.setChecked(enabled)

    @property
    def presenter_mode(self) -> bool:
        return self._presenter

    # ----- export and help -----
    def export_targets(self) -> dict[str, QWidget]:
        """What File > Export... can render: the chart, the grid, and the whole view."""
        return {"chart": self.chart, "grid": self.grid, "view": self.view_area}

    def export_caption(self) -> str:
        """Prompt, model and step, for the caption of an exported view."""
        info, rec = self.run_info, self.last_record
        model = self.model_info.name if self.model_info else "no model"
        prompt = info.prompt if info is not None else self.prompt_edit.text()
        if rec is None:
            where = "before the first step"
        else:
            where = f"step {rec.step + 1}, {rec.new_tokens} new tokens"
        mode = "" if info is None else (", with KV cache" if info.use_cache else ", without KV cache")
        return f"\u201c{prompt}\u201d \u2014 {model}, {where}{mode}"

    def export(self) -> None:
        self._pause_if_playing()
        self.redraw()
        try:
            from kvviz.app.export import ExportDialog
        except ImportError:
            show_error(self, "Export unavailable", "The export module is missing from this installation of kvviz.")
            return
        ExportDialog(self.export_targets(), self.export_caption(), self).exec()

    def show_shortcuts(self) -> None:
        ShortcutsDialog(self.actions_for_help(), self).exec()

    def show_about(self) -> None:
        AboutDialog(self.model_info, self).exec()

    # ----- closing -----
    def closeEvent(self, event: QCloseEvent) -> None:
        self.save_settings()
        self._redraw_timer.stop()
        if not self.controller.stop(1000):
            # Only an uninterruptible load (reading weights) can outlast the second: hide and let it end.
            self.hide()
            self.controller.wait()
        event.accept()
