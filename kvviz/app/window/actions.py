"""The window's actions and menus, written once as a table (name, menu, text, keys); the window says what each
does (MainWindow._action_slots)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from PySide6.QtCore import QSignalBlocker, Qt
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QMainWindow


@dataclass(frozen=True)
class ActionSpec:
    """One action: `name` keys its slot; `menu` None keeps it out of the menus (it still has its keys), and
    "&View/&Theme" puts it in a submenu (`separator_before` on a submenu's first action goes before the
    submenu). Checkable actions of one `group` exclude each other."""

    name: str
    menu: str | None
    text: str
    keys: tuple[str, ...] = ()
    checkable: bool = False
    application_wide: bool = False
    separator_before: bool = False
    group: str | None = None


ACTIONS = (
    ActionSpec("open_file", "&File", "&Open checkpoint file\u2026", ("Ctrl+O",)),
    ActionSpec("open_folder", "&File", "Open checkpoint &folder\u2026", ("Ctrl+Shift+O",)),
    ActionSpec("choose_model", "&File", "Choose &model", ("Ctrl+M",)),
    ActionSpec("export", "&File", "&Export\u2026", ("Ctrl+E",), separator_before=True),
    ActionSpec("copy_image", "&File", "&Copy chart image", ("Ctrl+Shift+C",)),
    ActionSpec("quit", "&File", "&Quit", ("Ctrl+Q",), application_wide=True, separator_before=True),
    ActionSpec("step", "&Run", "&Step (one new token)", ("Space", "Right", "PgDown")),
    ActionSpec("play", "&Run", "&Play / pause", ("P",)),
    ActionSpec("faster", "&Run", "Play &faster", ("]",)),
    ActionSpec("slower", "&Run", "Play &slower", ("[",)),
    ActionSpec("reset", "&Run", "&Reset run", ("R",)),
    ActionSpec("toggle_cache", "&Run", "Toggle KV &cache", ("C",), separator_before=True),
    ActionSpec("break_cache", "&Run", "&Break the cache (teaching switch: plants an indexing bug)", ("Ctrl+B",),
               checkable=True),
    ActionSpec("sliding_window", "&Run", "Sliding &window and attention sinks\u2026", ("W",)),
    ActionSpec("evict_importance", "&Run", "&Evict by importance: H2O, TOVA, SnapKV, PyramidKV\u2026", ("E",)),
    ActionSpec("speculative", "&Run", "Speculative &decoding: draft, verify, roll back\u2026", ("D",)),
    ActionSpec("dtype_float32", "&Run/Prec&ision", "&float32 (4 bytes a number)", checkable=True, group="dtype",
               separator_before=True),
    ActionSpec("dtype_bfloat16", "&Run/Prec&ision", "&bfloat16 (2 bytes, float32's range)", checkable=True,
               group="dtype"),
    ActionSpec("dtype_float16", "&Run/Prec&ision", "f&loat16 (2 bytes, finer, smaller range)", checkable=True,
               group="dtype"),
    ActionSpec("kv_exact", "&Run/&KV cache precision", "&exact (the weights' number type)", checkable=True,
               group="kv_dtype"),
    ActionSpec("kv_int8", "&Run/&KV cache precision", "&int8 (a byte a number, a scale per token and head)",
               checkable=True, group="kv_dtype"),
    ActionSpec("kv_int4", "&Run/&KV cache precision", "i&nt4 (two numbers a byte)", checkable=True, group="kv_dtype"),
    ActionSpec("kv_fp8", "&Run/&KV cache precision", "&fp8 (e4m3, a byte a number)", checkable=True, group="kv_dtype"),
    ActionSpec("edit_prompt", "&Run", "Edit &prompt", ("Ctrl+L",), separator_before=True),
    ActionSpec("escape", None, "Leave prompt field / presenter mode", ("Esc",)),
    ActionSpec("compare", "&View", "Compare &with and without cache", ("T",), checkable=True),
    ActionSpec("memory", "&View", "&Memory of the KV cache", ("M",), checkable=True),
    ActionSpec("attention", "&View", "&Attention of the newest token", ("A",), checkable=True),
    ActionSpec("scores", "&View", "Sco&res of the kept positions (Evict by importance)", ("Shift+E",),
               checkable=True),
    ActionSpec("heads", "&View", "&Heads of the selected layer (or double-click a grid row)", ("H",)),
    ActionSpec("serving", "&View", "Ser&ving: a batch or a trace of requests from a paged KV cache", ("Shift+B",),
               checkable=True),
    ActionSpec("speed", "&View", "&Speed of a token step, measured against the length", ("S",)),
    ActionSpec("long_speed", "&View", "&Long speed sweep: every kind of cache against the bandwidth bound\u2026",
               ("Shift+S",)),
    ActionSpec("presenter", "&View", "&Presenter mode", ("F11",), checkable=True, separator_before=True),
    ActionSpec("colour_blind", "&View", "&Colour-blind patterns", ("B",), checkable=True),
    ActionSpec("theme_dark", "&View/&Theme", "&Dark", checkable=True, group="theme"),
    ActionSpec("theme_light", "&View/&Theme", "&Light", checkable=True, group="theme"),
    ActionSpec("zoom_in", "&View", "Zoom &in", ("Ctrl+=", "Ctrl++"), separator_before=True),
    ActionSpec("zoom_out", "&View", "Zoom &out", ("Ctrl+-",)),
    ActionSpec("zoom_reset", "&View", "&Actual size", ("Ctrl+0",)),
    ActionSpec("lesson", "&Help", "&Lesson (Page Down: next, Page Up: back, Esc: leave)", ("L",), checkable=True),
    ActionSpec("lesson_sharing", "&Help", "Lesson: &MHA, GQA, MQA (sharing keys and values)", ("Shift+L",)),
    ActionSpec("lesson_window", "&Help", "Lesson: sliding &windows and attention sinks"),
    ActionSpec("lesson_paging", "&Help", "Lesson: serving many requests from a pa&ged KV cache"),
    ActionSpec("lesson_quantized", "&Help", "Lesson: a &quantized KV cache"),
    ActionSpec("lesson_layers", "&Help", "Lesson: not every &layer keeps a cache"),
    ActionSpec("lesson_speculative", "&Help", "Lesson: speculative decoding: &draft, verify, roll back"),
    ActionSpec("lesson_importance", "&Help", "Lesson: which tokens can we &forget? (eviction by importance)"),
    ActionSpec("lesson_server", "&Help", "Lesson: a se&rver's cache (requests over time, prefix hits, preemption)"),
    ActionSpec("lesson_notes", "&Help", "Lesson &notes (the lecturer's; hidden until shown)", ("N",), checkable=True),
    ActionSpec("lesson_next", None, "Next lesson step"),  # keys only in lesson mode: LESSON_KEYS
    ActionSpec("lesson_back", None, "Previous lesson step"),
    ActionSpec("shortcuts", "&Help", "&Keyboard shortcuts", ("F1", "Ctrl+/")),
    ActionSpec("about", "&Help", "&About kvviz"),
)
# In lesson mode a presenter's clicker (Page Down / Page Up) and the arrows drive the lesson; Space still steps.
LESSON_KEYS = {"step": ("Space",), "lesson_next": ("PgDown", "Right"), "lesson_back": ("PgUp", "Left")}


def build_actions(window: QMainWindow, slots: Mapping[str, Callable]) -> dict[str, QAction]:
    """Create every action of ACTIONS on `window` (so its keys work with the menu bar hidden too),
    connect it to `slots[name]` (checkable ones get the new state; an action with no slot is left to the
    object that owns it), and fill the menu bar."""
    actions: dict[str, QAction] = {}
    menus: dict[str, object] = {}
    groups: dict[str, QActionGroup] = {}
    for spec in ACTIONS:
        action = QAction(spec.text, window)
        _set_keys(action, spec.keys)
        action.setShortcutContext(Qt.ShortcutContext.ApplicationShortcut if spec.application_wide
                                  else Qt.ShortcutContext.WindowShortcut)
        action.setCheckable(spec.checkable)
        slot = slots.get(spec.name)
        if slot is None:
            pass
        elif spec.checkable:
            action.toggled.connect(slot)
        else:
            action.triggered.connect(lambda _checked=False, slot=slot: slot())
        window.addAction(action)
        actions[spec.name] = action
        if spec.group is not None:
            groups.setdefault(spec.group, QActionGroup(window)).addAction(action)  # exclusive
        if spec.menu is not None:
            new_menu = spec.menu not in menus
            parent, _, title = spec.menu.rpartition("/")
            if new_menu and parent:
                if parent not in menus:
                    menus[parent] = window.menuBar().addMenu(parent)
                if spec.separator_before:
                    menus[parent].addSeparator()
                menus[spec.menu] = menus[parent].addMenu(title)
            elif new_menu:
                menus[spec.menu] = window.menuBar().addMenu(spec.menu)
            if spec.separator_before and not (new_menu and parent):
                menus[spec.menu].addSeparator()
            menus[spec.menu].addAction(action)
    return actions


def set_lesson_keys(actions: Mapping[str, QAction], on: bool) -> None:
    """Give LESSON_KEYS to the lesson's actions (`on`), or every action its keys of ACTIONS again."""
    specs = {spec.name: spec for spec in ACTIONS}
    for name, keys in LESSON_KEYS.items():
        _set_keys(actions[name], keys if on else specs[name].keys)


def _set_keys(action: QAction, keys: tuple[str, ...]) -> None:
    action.setShortcuts([QKeySequence(k) for k in keys])


KV_ACTIONS = {"": "kv_exact", "int8": "kv_int8", "int4": "kv_int4", "fp8": "kv_fp8"}  # Run > KV cache precision


def check_run_actions(actions: Mapping[str, QAction], break_cache: bool, compare: bool, attention: bool,
                      kv_dtype: str) -> None:
    """The Run and View menus' checkmarks as a run's settings are, without triggering them (a refused setting
    taken back, the free app given back after a lesson). Each precision is set on its own: an exclusive group
    unchecks the others only through the signals blocked here."""
    for name, on in (("break_cache", break_cache), ("compare", compare), ("attention", attention),
                     *((action, dtype == kv_dtype) for dtype, action in KV_ACTIONS.items())):
        if actions[name].isChecked() != on:
            with QSignalBlocker(actions[name]):
                actions[name].setChecked(on)
