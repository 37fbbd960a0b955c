"""The export dialog's choices: its menus of views and formats, the file name that follows the format chosen,
and what a choice comes to in pixels, frames and seconds."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QWidget

from kvviz.app.export.animation import ANIMATION_FORMATS, ANIMATION_LABELS, AnimationSpec
from kvviz.app.export.files import FORMAT_LABELS, FORMATS, TARGET_LABELS, TARGETS
from kvviz.app.export.render import Page, png_size

ALL_FORMATS = (*FORMATS, *ANIMATION_FORMATS)


def target_menu(targets: Collection[str]) -> QComboBox:
    """A menu of the views in `targets`: those of TARGETS in its order, then the others."""
    box = QComboBox()
    order = [k for k in TARGETS if k in targets] + [k for k in targets if k not in TARGETS]
    for key in order:
        box.addItem(TARGET_LABELS.get(key, key.capitalize()), key)
    return box


def format_menu(can_animate: bool) -> QComboBox:
    """A menu of the image formats, then of the animation formats, enabled when `can_animate`."""
    box = QComboBox()
    for fmt in FORMATS:
        box.addItem(f"{FORMAT_LABELS[fmt]} (.{fmt})", fmt)
    for fmt in ANIMATION_FORMATS:
        box.addItem(f"{ANIMATION_LABELS[fmt]} of the run (.{fmt})", fmt)
        enable_item(box, fmt, can_animate)
    return box


def enable_item(box: QComboBox, key: str, enabled: bool) -> None:
    """Enable or disable the item of `box` whose data is `key`."""
    item = box.model().item(box.findData(key))
    flags = item.flags()
    item.setFlags(flags | Qt.ItemFlag.ItemIsEnabled if enabled else flags & ~Qt.ItemFlag.ItemIsEnabled)


def item_enabled(box: QComboBox, key: str) -> bool:
    """Whether the item of `box` whose data is `key` is enabled."""
    return bool(box.model().item(box.findData(key)).flags() & Qt.ItemFlag.ItemIsEnabled)


def suffix_format(path: Path) -> str:
    """The format `path`'s suffix names, in lower case without its dot ("" for no suffix)."""
    return path.suffix.lower().lstrip(".")


def named_for(path: Path, fmt: str) -> Path:
    """`path` named for `fmt`: a format's suffix replaced by `.fmt`, any other name given `.fmt` after it."""
    stem = path.stem if suffix_format(path) in ALL_FORMATS else path.name
    return path.with_name(f"{stem}.{fmt}")


def size_text(widget: QWidget, fmt: str, width: int, caption: str | None, spec: AnimationSpec | None) -> str:
    """What exporting `widget` as `fmt` comes to: an animation's (`spec`) width, frames and seconds, a PNG's
    pixels at `width`, a vector page's size."""
    if spec is not None:
        return (f"\u2192 {spec.width} px wide, {spec.frames} frame{'s' * (spec.frames != 1)}, "
                f"{spec.frames / spec.fps + spec.hold:.1f} s")
    if fmt == "png":
        size = png_size(widget, width, caption)
        return f"\u2192 {size.width()} \u00d7 {size.height()} px"
    page = Page(widget, caption)
    return f"vector, {round(page.width)} \u00d7 {round(page.height)} at the window's scale"
