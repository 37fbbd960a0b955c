"""The run controls: prompt, Step / Play / Reset, autoplay speed, and the run's settings."""

from __future__ import annotations

import contextlib
from dataclasses import replace

from PySide6.QtCore import QObject, QSignalBlocker, QSize, Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QDoubleSpinBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSlider,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from kvviz.app.settings import AppSettings
from kvviz.app.views.flow_layout import FlowLayout
from kvviz.app.window.eviction_dialog import EvictionChoice
from kvviz.app.window.speculative_dialog import SpeculativeChoice
from kvviz.core.records import MAX_PROMPT_CHARACTERS, RunRequest

SPEEDS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 0.0)  # tokens per second for autoplay; 0 = as fast as possible
SPIN_CHROME = 34  # pixels of a spin box beside its text: the sheet's padding (5 + 18), borders, the caret's room


class _NarrowWidth:
    """A spin box as wide as the widest text it can show (its least, its most, its special text), at its font:
    Qt's own hint left the settings so wide that at 1280 pixels the seed took a second line of the window."""

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        metrics = self.fontMetrics()
        texts = (self.textFromValue(self.minimum()), self.textFromValue(self.maximum()), self.specialValueText())
        return QSize(max(map(metrics.horizontalAdvance, texts)) + SPIN_CHROME, super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        return self.sizeHint()


class NarrowSpin(_NarrowWidth, QSpinBox):
    pass


class NarrowDoubleSpin(_NarrowWidth, QDoubleSpinBox):
    pass


class RunControls(QWidget):
    """Everything the lecturer sets before and during a run; `request()` turns it into a RunRequest.

    Signals: `step_clicked`, `play_clicked`, `reset_clicked`, `prompt_entered` (Enter in the prompt),
    `request_changed` (a run setting changed: the run restarts up to the same token) and
    `speed_changed` (autoplay interval in ms, 0 = full speed).
    """

    step_clicked = Signal()
    play_clicked = Signal()
    reset_clicked = Signal()
    prompt_entered = Signal()
    request_changed = Signal()
    speed_changed = Signal(int)

    def __init__(self, model_picker: QWidget, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("controlsArea")
        self.prompt_edit = QLineEdit()
        self.prompt_edit.setMaxLength(MAX_PROMPT_CHARACTERS)  # Qt's default, 32767, cut long prompts silently
        self.prompt_edit.setPlaceholderText("Prompt (empty: start from <|endoftext|>); Enter starts a fresh run")
        self.prompt_edit.setClearButtonEnabled(True)
        self.prompt_edit.returnPressed.connect(self.prompt_entered)
        top = QHBoxLayout()
        top.addWidget(QLabel("Prompt"))
        top.addWidget(self.prompt_edit, 1)
        top.addWidget(QLabel("Model"))
        top.addWidget(model_picker)

        self.step_button = self._button("Step \u25b8", "Compute one new token (Space, Right, PageDown)",
                                        self.step_clicked)
        self.step_button.setObjectName("primary")
        self.play_button = self._button("Pause", "Play / pause (P)", self.play_clicked)
        # as wide as "Pause" from the start: a button that changes width when a run starts or ends
        # moves the whole window's layout, and repaints every view
        self.play_button.setMinimumWidth(self.play_button.sizeHint().width())
        self.play_button.setText("Play")
        self.reset_button = self._button("Reset", "Start the run again from the prompt (R)", self.reset_clicked)
        self.speed_slider = QSlider(Qt.Orientation.Horizontal)
        self.speed_slider.setRange(0, len(SPEEDS) - 1)
        self.speed_slider.setFixedWidth(96)
        self.speed_slider.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.speed_slider.valueChanged.connect(self._on_speed_changed)
        self.speed_label = QLabel()
        self.speed_label.setMinimumWidth(70)

        self.compare = False  # View > Compare (remembered)
        self.break_cache = False  # Run > Break the cache (never remembered)
        self.window, self.sinks = 0, 0  # Run > Sliding window (never remembered): 0, every position
        self.kv_dtype = ""  # Run > KV cache precision (never remembered): "" exact, or int8, int4, fp8
        self.eviction = EvictionChoice()  # Run > Evict by importance (never remembered): off
        self.attention = False  # View > Attention is open: records carry attention weights
        self.speculative = SpeculativeChoice()  # Run > Speculative decoding (remembered)
        self.cache_check = QCheckBox("KV cache")
        self.cache_check.setChecked(True)
        self.cache_check.setToolTip("Use the KV cache (C); turning it off recomputes every K/V at every step")
        self.max_new_spin = self._spin(NarrowSpin(), 1, 4096)
        self.temperature_spin = self._spin(NarrowDoubleSpin(), 0.0, 5.0, "greedy")
        self.temperature_spin.setSingleStep(0.1)
        self.temperature_spin.setDecimals(2)
        self.temperature_spin.setToolTip("Temperature; 0 means greedy decoding")
        self.top_k_spin = self._spin(NarrowSpin(), 0, 50257, "off")
        self.seed_spin = self._spin(NarrowSpin(), 0, 2**31 - 1)
        self.cache_check.toggled.connect(self.request_changed)

        buttons = QWidget()  # Step, Play, speed and Reset stay together on one line
        button_row = QHBoxLayout(buttons)
        button_row.setContentsMargins(0, 0, 0, 0)
        for widget in (self.step_button, self.play_button, QLabel("speed"), self.speed_slider, self.speed_label,
                       self.reset_button):
            button_row.addWidget(widget)
        self.precision_label = QLabel()  # the loaded model's; it stays in presenter mode: the numbers depend on it
        self.precision_pair = self._pair("precision", self.precision_label)
        self.precision_pair.setToolTip("The number type of the weights and the KV cache (Run > Precision)")
        self.precision_pair.hide()
        settings: list[QWidget] = [self.cache_check]
        for text, widget in (("max new tokens", self.max_new_spin), ("temperature", self.temperature_spin),
                             ("top-k", self.top_k_spin), ("seed", self.seed_spin)):
            settings.append(self._pair(text, widget))
        self.settings_widgets = tuple(settings)  # hidden in presenter mode
        flow = FlowLayout(spacing=10)  # on a narrow screen the settings wrap onto a second line
        for widget in (buttons, self.precision_pair, *settings):
            flow.addWidget(widget)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addLayout(flow)

    def _button(self, text: str, tip: str, clicked: Signal) -> QPushButton:
        button = QPushButton(text)
        button.setToolTip(tip)
        button.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        button.clicked.connect(clicked)
        return button

    @staticmethod
    def _pair(text: str, widget: QWidget) -> QWidget:
        """`widget` after a muted label that names it, kept together on one line."""
        pair = QWidget()
        pair_row = QHBoxLayout(pair)
        pair_row.setContentsMargins(0, 0, 0, 0)
        label = QLabel(text)
        label.setObjectName("muted")
        label.setBuddy(widget)
        pair_row.addWidget(label)
        pair_row.addWidget(widget)
        return pair

    def _spin(self, spin: QSpinBox | QDoubleSpinBox, low: float, high: float, special: str = ""):
        spin.setRange(low, high)
        spin.setKeyboardTracking(False)
        if special:
            spin.setSpecialValueText(special)
        spin.valueChanged.connect(self.request_changed)
        return spin

    def _run_widgets(self) -> tuple[QObject, ...]:
        return (self.prompt_edit, self.cache_check, self.max_new_spin, self.temperature_spin, self.top_k_spin,
                self.seed_spin)

    # ----- requests and settings -----
    def request(self) -> RunRequest:
        """The run these controls describe (run_id 0: the session numbers runs)."""
        temperature = float(self.temperature_spin.value())
        return RunRequest(
            run_id=0,
            prompt=self.prompt_edit.text(),
            use_cache=self.cache_check.isChecked(),
            max_new_tokens=int(self.max_new_spin.value()),
            temperature=temperature,
            top_k=int(self.top_k_spin.value()) or None,
            seed=int(self.seed_spin.value()) if temperature > 0 else None,
            compare=self.compare,
            break_cache=self.break_cache,
            attention=self.attention,
            window=self.window,
            sinks=self.sinks,
            kv_dtype=self.kv_dtype,
            **self.speculative.request_fields(),
            **self.eviction.request_fields(),
        )

    def show_request(self, request: RunRequest) -> None:
        """Show the settings of `request` (the run going on, after another was refused) without starting a run."""
        self.window, self.sinks, self.kv_dtype = request.window, request.sinks, request.kv_dtype
        self.compare, self.break_cache, self.attention = request.compare, request.break_cache, request.attention
        self.speculative = self.speculative.of_request(request)
        self.eviction = self.eviction.of_request(request)
        with contextlib.ExitStack() as blocked:
            for widget in self._run_widgets():
                blocked.enter_context(QSignalBlocker(widget))
            self.prompt_edit.setText(request.prompt)
            self.cache_check.setChecked(request.use_cache)
            self.max_new_spin.setValue(request.max_new_tokens)
            self.temperature_spin.setValue(request.temperature)
            self.top_k_spin.setValue(request.top_k or 0)
            if request.seed is not None:
                self.seed_spin.setValue(request.seed)

    def set_window(self, window: int, sinks: int) -> None:
        """Run > Sliding window: the cache keeps the last `window` positions and `sinks` first ones; the run
        restarts."""
        if (window, sinks) != (self.window, self.sinks):
            self.window, self.sinks = window, sinks
            self.request_changed.emit()

    def set_kv_dtype(self, kv_dtype: str) -> None:
        """Run > KV cache precision: store the cache quantized ("": exact); the run restarts up to the same token."""
        if kv_dtype != self.kv_dtype:
            self.kv_dtype = kv_dtype
            self.request_changed.emit()

    def set_eviction(self, choice: EvictionChoice) -> None:
        """Run > Evict by importance: its method and budget, or off; the run restarts up to the same token."""
        if choice.request_fields() != self.eviction.request_fields():
            self.eviction = choice
            self.request_changed.emit()
        else:
            self.eviction = choice  # the values kept for the next time it is turned on

    def set_speculative(self, choice: SpeculativeChoice) -> None:
        """Run > Speculative decoding: its drafter and k, or plain decoding; the run restarts up to the same token."""
        if choice != self.speculative:
            self.speculative = choice
            self.request_changed.emit()

    def set_attention(self, on: bool) -> None:
        """The attention view (View menu, A) is open: records carry attention; the run restarts up to the same token."""
        if on != self.attention:
            self.attention = on
            self.request_changed.emit()

    def set_compare(self, on: bool) -> None:
        """Compare mode (View menu, T): both runs in lockstep; the run restarts up to the same token."""
        if on != self.compare:
            self.compare = on
            self.request_changed.emit()

    def set_break_cache(self, on: bool) -> None:
        """The teaching switch (Run menu): the cached run's cache gets an indexing bug; the run restarts."""
        if on != self.break_cache:
            self.break_cache = on
            self.request_changed.emit()

    def set_run_settings(self, use_cache: bool | None = None, max_new_tokens: int | None = None,
                         temperature: float | None = None, compare: bool | None = None) -> None:
        """Change run settings without restarting the run (the caller starts the next one)."""
        if compare is not None:
            self.compare = compare
        with contextlib.ExitStack() as blocked:
            for widget in self._run_widgets():
                blocked.enter_context(QSignalBlocker(widget))
            if use_cache is not None:
                self.cache_check.setChecked(use_cache)
            if max_new_tokens is not None:
                self.max_new_spin.setValue(max_new_tokens)
            if temperature is not None:
                self.temperature_spin.setValue(temperature)

    def restore(self, settings: AppSettings, prompt: str | None = None) -> None:
        """Show `settings` (and `prompt`, when given, instead of the remembered one) without restarting."""
        with contextlib.ExitStack() as blocked:
            for widget in self._run_widgets():
                blocked.enter_context(QSignalBlocker(widget))
            self.prompt_edit.setText(settings.prompt if prompt is None else prompt)
            self.cache_check.setChecked(settings.use_cache)
            self.max_new_spin.setValue(settings.max_new_tokens)
            self.temperature_spin.setValue(settings.temperature)
            self.top_k_spin.setValue(settings.top_k)
            self.seed_spin.setValue(settings.seed)
        self.speed_slider.setValue(settings.speed_index)
        self._on_speed_changed(self.speed_slider.value())
        self.compare = settings.compare
        self.speculative = replace(self.speculative, on=settings.speculative, k=settings.draft_tokens,
                                   lookup=settings.prompt_lookup, by_model=settings.draft_by_model)

    def store(self, settings: AppSettings) -> None:
        settings.prompt = self.prompt_edit.text()
        settings.use_cache = self.cache_check.isChecked()
        settings.max_new_tokens = int(self.max_new_spin.value())
        settings.temperature = float(self.temperature_spin.value())
        settings.top_k = int(self.top_k_spin.value())
        settings.seed = int(self.seed_spin.value())
        settings.speed_index = int(self.speed_slider.value())
        settings.compare = self.compare
        s = self.speculative
        settings.speculative, settings.draft_tokens, settings.prompt_lookup, settings.draft_by_model = (
            s.on, s.k, s.lookup, s.by_model)

    # ----- state -----
    def set_state(self, can_step: bool, playing: bool, can_reset: bool) -> None:
        self.step_button.setEnabled(can_step)
        self.play_button.setEnabled(can_step or playing)
        self.play_button.setText("Pause" if playing else "Play")
        self.reset_button.setEnabled(can_reset)

    def interval_ms(self) -> int:
        """Autoplay's interval between tokens; 0 = as fast as possible."""
        speed = SPEEDS[self.speed_slider.value()]
        return 0 if speed == 0 else int(round(1000 / speed))

    def set_speed_index(self, index: int) -> None:
        self.speed_slider.setValue(index)

    def change_speed(self, steps: int) -> None:
        self.speed_slider.setValue(self.speed_slider.value() + steps)

    def _on_speed_changed(self, index: int) -> None:
        speed = SPEEDS[index]
        self.speed_label.setText("max" if speed == 0 else f"{speed:g} tok/s")
        self.speed_changed.emit(self.interval_ms())

    def show_precision(self, dtype: str) -> None:
        """The loaded model's precision beside it (float32, bfloat16, float16)."""
        self.precision_label.setText(dtype)
        self.precision_pair.setVisible(bool(dtype))

    def focus_prompt(self) -> None:
        self.prompt_edit.setFocus()
        self.prompt_edit.selectAll()
