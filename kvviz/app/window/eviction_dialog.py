"""Run > Evict by importance (E): off, or an importance method (H2O, TOVA, SnapKV, PyramidKV) keeping a budget of
positions a layer, with SnapKV's and PyramidKV's observation window and pooling; applying it restarts the run up to
the same token, as any run setting does. The engine checks the values: what it refuses is said in the banner, and
the run goes on as it was."""

from __future__ import annotations

from dataclasses import dataclass, replace

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QDialog, QLabel, QWidget

from kvviz.app.window.dialog_form import settings_form, spin
from kvviz.core.policy import EVICTION_METHODS, SNAP_METHODS
from kvviz.core.records import RunRequest

MAX_POSITIONS = 4096  # as the sliding window's (the engine refuses a budget past the model's context)
DEFAULT_BUDGET = 16


@dataclass(frozen=True)
class EvictionChoice:
    """What Run > Evict by importance asks for: `method` (a key of EVICTION_METHODS; "" off) keeping `budget`
    positions a layer; SnapKV and PyramidKV watch the last `observe` queries and pool over `pool` positions (0:
    the engine's defaults). Turned off, it keeps the budget and the rest for the next time."""

    method: str = ""
    budget: int = DEFAULT_BUDGET
    observe: int = 0
    pool: int = 0

    def request_fields(self) -> dict:
        """The RunRequest fields of this choice (zeros when off: no importance method)."""
        if not self.method:
            return {"evict": "", "budget": 0, "observe": 0, "pool": 0}
        snap = self.method in SNAP_METHODS
        return {"evict": self.method, "budget": self.budget, "observe": self.observe if snap else 0,
                "pool": self.pool if snap else 0}

    def of_request(self, request: RunRequest) -> EvictionChoice:
        """This choice as `request` evicts (a refused change taken back): its method, budget and window when it
        has one, else off with the rest kept."""
        if not request.evict:
            return replace(self, method="")
        return EvictionChoice(request.evict, request.budget, request.observe or self.observe,
                              request.pool or self.pool)


class EvictionDialog(QDialog):
    """Asks for an EvictionChoice, starting from `choice`; `chosen()` gives it once accepted."""

    def __init__(self, choice: EvictionChoice, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Evict by importance")
        self.method_combo = QComboBox()
        self.method_combo.addItem("off: no eviction by importance", "")
        for method, rule in EVICTION_METHODS.items():
            self.method_combo.addItem(rule.split(":")[0], method)
            self.method_combo.setItemData(self.method_combo.count() - 1, rule, Qt.ItemDataRole.ToolTipRole)
        self.method_combo.setCurrentIndex(max(0, self.method_combo.findData(choice.method)))
        self.rule = QLabel()  # the chosen method's published rule, in a sentence
        self.rule.setObjectName("muted")
        self.rule.setWordWrap(True)
        self.budget_spin = spin(1, MAX_POSITIONS, choice.budget)
        self.budget_spin.setToolTip("Positions each layer keeps (PyramidKV: on average, more below, fewer above)")
        self.observe_spin = spin(0, MAX_POSITIONS, choice.observe, "default: a quarter of B, at most 32")
        self.observe_spin.setToolTip("The latest queries whose attention decides what is kept (fewer than B)")
        self.pool_spin = spin(0, 63, choice.pool, "default: 5")
        self.pool_spin.setToolTip("Scores are averaged over this many neighbouring positions (an odd number)")
        settings_form(self, "The cache keeps a budget of B positions a layer, chosen by the attention they get, "
                      "and evicts the rest; every step attends to what it keeps, with the cache or without it. One "
                      "trade-off at a time: a sliding window or a quantized cache is refused beside it.",
                      (("method", self.method_combo), self.rule, ("budget B (positions a layer)", self.budget_spin),
                       ("observation window (queries)", self.observe_spin), ("pooling (positions)", self.pool_spin)))
        self.method_combo.currentIndexChanged.connect(self._show_enabled)
        self._show_enabled()

    @property
    def method(self) -> str:
        return str(self.method_combo.currentData())

    def _show_enabled(self) -> None:
        method = self.method
        self.rule.setText(EVICTION_METHODS[method].split(": ", 1)[1] if method else "The cache keeps every "
                          "position (or the sliding window's).")
        self.budget_spin.setEnabled(bool(method))
        for box in (self.observe_spin, self.pool_spin):
            box.setEnabled(method in SNAP_METHODS)
        if self.isVisible():  # a rule of more lines: the dialog grows to it, never squeezing the note
            self.layout().activate()
            self.resize(self.width(), max(self.height(), self.layout().totalHeightForWidth(self.width())))

    def chosen(self) -> EvictionChoice:
        return EvictionChoice(self.method, self.budget_spin.value(), self.observe_spin.value(),
                              self.pool_spin.value())


def choose_eviction(controls, parent: QWidget) -> None:
    """Run > Evict by importance (E): ask for the method and its budget, and restart the run with them up to the
    same token (`controls`: the window's RunControls; a refused choice is said in the banner, and the run goes on
    as it was)."""
    dialog = EvictionDialog(controls.eviction, parent)
    if dialog.exec():
        controls.set_eviction(dialog.chosen())
