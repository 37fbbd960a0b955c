"""The counter's part for a speculative run: the drafts proposed, accepted and rolled back so far, the acceptance
rate and the tokens each target pass gave, as the latest record's `speculation` counts them."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QGridLayout, QLabel, QVBoxLayout, QWidget

from kvviz.app.theme import Theme
from kvviz.app.views.count_table import DASH, format_count
from kvviz.app.views.live_label import LiveLabel
from kvviz.core.records import RunPlan, StepRecord

SPECULATION_ROWS = ("drafted", "accepted", "rolled_back", "acceptance_rate", "tokens_per_target_pass")
SPECULATION_TITLES = {"drafted": "drafted", "accepted": "accepted", "rolled_back": "rolled back",
                      "acceptance_rate": "acceptance rate", "tokens_per_target_pass": "tokens a target pass"}
# each row's number's colour, a Theme field: the drafts' own colour for what the target kept, as the grid draws it
SPECULATION_COLOURS = {"drafted": "foreground", "accepted": "drafted", "rolled_back": "foreground",
                       "acceptance_rate": "foreground", "tokens_per_target_pass": "teal"}
VALUE_KEYS = (*SPECULATION_ROWS, "target_passes", "draft_passes", "tokens")


def speculation_values(record: StepRecord | None) -> dict[str, object]:
    """The run's speculative totals so far, from `record.speculation` (None for each before the first round; the
    acceptance rate None before any draft). Every draft was accepted or rolled back: the rolled back are the
    drafts the target did not accept."""
    spec = record.speculation if record is not None else None
    if spec is None:
        return dict.fromkeys(VALUE_KEYS)
    return {"drafted": spec.drafted_total, "accepted": spec.accepted_total,
            "rolled_back": spec.drafted_total - spec.accepted_total, "acceptance_rate": spec.acceptance_rate,
            "tokens_per_target_pass": spec.tokens_per_target_pass, "target_passes": spec.target_passes_total,
            "draft_passes": spec.draft_passes_total, "tokens": spec.tokens_total}


def speculation_texts(values: dict[str, object]) -> dict[str, tuple[str, str]]:
    """Each row's (number, what it counts) as shown: ("3", "kept: K/V stays")... Plain decoding
    makes one token a target pass: "tokens a target pass" is the speed-up in target passes."""
    drafted, accepted, tokens, passes = (values[key] for key in ("drafted", "accepted", "tokens", "target_passes"))
    rate, per_pass = values["acceptance_rate"], values["tokens_per_target_pass"]
    draft_passes = values["draft_passes"]
    drafted_note = "proposed"  # short: the counter's column is narrow at 1280 x 720
    if draft_passes:
        drafted_note += f", {format_count(int(draft_passes))} draft passes"

    def count(value: object) -> str:
        return DASH if value is None else format_count(int(value))

    return {
        "drafted": (count(drafted), drafted_note),
        "accepted": (count(accepted), "kept: K/V stays"),
        "rolled_back": (count(values["rolled_back"]), "rejected: K/V cropped"),
        "acceptance_rate": (DASH if rate is None else f"{rate:.0%}",
                            "" if rate is None else f"{accepted} of {drafted} drafts"),
        "tokens_per_target_pass": (DASH if per_pass is None else f"{per_pass:.2f}",
                                   "" if passes is None else f"{tokens} tokens, {passes} passes"),
    }


class SpeculationRows(QWidget):
    """A heading that names the drafter, and a row a total (SPECULATION_ROWS): name, number, what it counts.
    Hidden for a plain run (`reset` with a plan without a drafter)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.heading = QLabel("")
        self.heading.setWordWrap(True)
        self.labels: dict[str, tuple[QLabel, LiveLabel, LiveLabel]] = {}
        grid = QGridLayout()
        grid.setHorizontalSpacing(10)
        grid.setVerticalSpacing(2)
        for row, key in enumerate(SPECULATION_ROWS):
            name, number, note = QLabel(SPECULATION_TITLES[key]), LiveLabel(DASH, rich=False), LiveLabel("", rich=False)
            number.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            note.setObjectName("muted")
            for col, label in enumerate((name, number, note)):
                grid.addWidget(label, row, col)
            self.labels[key] = (name, number, note)
        grid.setColumnStretch(2, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 4, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.heading)
        layout.addLayout(grid)
        self.hide()

    def reset(self, plan: RunPlan) -> None:
        """Show the rows for `plan`'s run if it is speculative, its widest numbers' room kept; else hide them."""
        drafter = plan.drafter
        self.setVisible(drafter is not None)
        if drafter is None:
            return
        self.heading.setText(f"Speculative decoding: {drafter.describe()}")
        most = format_count(drafter.k * plan.budget)  # drafts a run can propose, at most
        widest = {"drafted": most, "accepted": most, "rolled_back": most, "acceptance_rate": "100%",
                  "tokens_per_target_pass": f"{drafter.k + 1:.2f}"}
        for key, (_name, number, _note) in self.labels.items():
            number.reserve(widest[key])
        self.show_values(dict.fromkeys(VALUE_KEYS))

    def show_values(self, values: dict[str, object]) -> None:
        """`values` as `speculation_values` gives them."""
        for key, (number, note) in speculation_texts(values).items():
            self.labels[key][1].setText(number)
            self.labels[key][2].setText(note)

    def shown_texts(self) -> dict[str, tuple[str, str]]:
        """What each row shows now: (number, what it counts)."""
        return {key: (number.text(), note.text()) for key, (_name, number, note) in self.labels.items()}

    def all_labels(self) -> tuple[QLabel, ...]:
        return (self.heading, *(label for labels in self.labels.values() for label in labels))

    def set_theme(self, theme: Theme) -> None:
        for key, (_name, number, _note) in self.labels.items():
            number.setStyleSheet(f"color: {getattr(theme, SPECULATION_COLOURS[key])}; font-weight: bold;")

    def set_font(self, font: QFont) -> None:
        heading = QFont(font)
        heading.setBold(True)
        self.heading.setFont(heading)
