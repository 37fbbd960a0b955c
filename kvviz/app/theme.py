"""Colours shared by every view: amber = computed this step, teal = reused from the cache."""

from __future__ import annotations

AMBER = "#F5A623"
TEAL = "#1FA6A0"
PENDING = "#5B6270"  # a token exists but its K/V has not been computed yet
EMPTY = "#262A33"  # the position does not exist yet
BACKGROUND = "#1B1E24"
FOREGROUND = "#E6E8EC"
MUTED = "#9AA1AD"
ALERT = "#FF6B5B"
GRID_LINE = "#14161B"


def rgba(hex_colour: str, alpha: int = 255) -> tuple[int, int, int, int]:
    value = hex_colour.lstrip("#")
    return int(value[0:2], 16), int(value[2:4], 16), int(value[4:6], 16), alpha


STYLESHEET = f"""
QMainWindow, QWidget#central {{ background: {BACKGROUND}; }}
QWidget {{ color: {FOREGROUND}; }}
QLabel#muted {{ color: {MUTED}; }}
QLabel#banner {{ background: #3A2A12; color: {AMBER}; border: 1px solid {AMBER}; border-radius: 4px;
                 padding: 4px 8px; font-weight: bold; }}
QLabel#banner[alert="true"] {{ background: #3A1815; color: {ALERT}; border-color: {ALERT}; }}
QLineEdit, QSpinBox, QDoubleSpinBox, QComboBox {{ background: #2A2F38; border: 1px solid #3C4350;
    border-radius: 3px; padding: 3px 5px; selection-background-color: {TEAL}; }}
QLineEdit:focus, QSpinBox:focus, QDoubleSpinBox:focus, QComboBox:focus {{ border-color: {AMBER}; }}
QComboBox QAbstractItemView {{ background: #2A2F38; selection-background-color: {TEAL}; }}
QPushButton, QToolButton {{ background: #2E3440; border: 1px solid #454D5C; border-radius: 4px; padding: 4px 10px; }}
QPushButton:hover, QToolButton:hover {{ border-color: {AMBER}; }}
QPushButton:pressed {{ background: #3A4150; }}
QPushButton:disabled {{ color: #646B78; }}
QPushButton#primary {{ background: #4A3510; border-color: {AMBER}; }}
QCheckBox::indicator {{ width: 14px; height: 14px; }}
QMenuBar {{ background: #20242B; }}
QMenuBar::item:selected {{ background: #2E3440; }}
QMenu {{ background: #252A32; border: 1px solid #3C4350; }}
QMenu::item:selected {{ background: {TEAL}; }}
QStatusBar {{ background: #20242B; color: {MUTED}; }}
QProgressBar {{ border: 1px solid #454D5C; border-radius: 3px; text-align: center; background: #2A2F38; }}
QProgressBar::chunk {{ background: {TEAL}; }}
QSplitter::handle {{ background: #2A2F38; }}
QToolTip {{ background: #252A32; color: {FOREGROUND}; border: 1px solid {AMBER}; }}
QSlider::groove:horizontal {{ height: 4px; background: #3C4350; }}
QSlider::handle:horizontal {{ background: {AMBER}; width: 12px; margin: -5px 0; border-radius: 6px; }}
"""
