"""File > Export...: the dialog that picks a view, a format (an image, or an animation of the run so far), the
caption and a file, and remembers the choices."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from kvviz.app import theme
from kvviz.app.export.animation import (
    ANIMATION_FORMATS,
    ANIMATION_LABELS,
    DEFAULT_ANIMATION_WIDTH,
    DEFAULT_FPS,
    DEFAULT_HOLD,
    MAX_FPS,
    MAX_HOLD,
    AnimationSource,
    AnimationSpec,
    animation_file_name,
)
from kvviz.app.export.animation_panel import AnimationRows, write_with_progress
from kvviz.app.export.caption import default_file_name
from kvviz.app.export.choices import (
    ALL_FORMATS,
    enable_item,
    format_menu,
    item_enabled,
    named_for,
    size_text,
    suffix_format,
    target_menu,
)
from kvviz.app.export.files import (
    DEFAULT_PNG_WIDTH,
    FORMAT_FILTERS,
    FORMAT_LABELS,
    MAX_PNG_WIDTH,
    MIN_PNG_WIDTH,
    TARGET_LABELS,
    ExportError,
)
from kvviz.app.export.render import export_widget
from kvviz.app.settings import SettingsFile, TypedSettings, app_settings, setting
from kvviz.core.errors import KvvizError
from kvviz.core.files import user_path


@dataclass
class ExportSettings(TypedSettings):
    """The export dialog's remembered choices: the last folder, view, format, widths, caption and animation speed."""

    folder: str = setting("export/folder", "")
    target: str = setting("export/target", "chart")
    image_format: str = setting("export/format", "png")
    width: int = setting("export/width", DEFAULT_PNG_WIDTH, MIN_PNG_WIDTH, MAX_PNG_WIDTH)
    caption: bool = setting("export/caption", True)
    animation_width: int = setting("export/animation_width", DEFAULT_ANIMATION_WIDTH, MIN_PNG_WIDTH, MAX_PNG_WIDTH)
    fps: float = setting("export/fps", DEFAULT_FPS, 0.1, MAX_FPS)
    hold: float = setting("export/hold", DEFAULT_HOLD, 0.0, MAX_HOLD)


class ExportDialog(QDialog):
    """File > Export...: what to export (chart, grid, whole view), as PNG, SVG or PDF, with or
    without the caption, and where. Remembers its choices and the last folder in the app's settings.

    Given `animation` (the run's plan and records so far), it also writes a GIF or an MP4 of the view
    step by step (steps first to last, frames a second, width), rendered from those records on fresh
    views at `kvviz export`'s sizes, under a progress dialog whose Cancel leaves no file.

    `exec()` returns Accepted once a file was written; `written` is its path.
    """

    frame_done = Signal(object, int, int)  # QProgressDialog, frames rendered, frames in all: while animating

    def __init__(
        self,
        targets: dict[str, QWidget],
        caption: str,
        parent: QWidget | None = None,
        initial: str | None = None,
        step: int | None = None,
        settings: SettingsFile | None = None,
        animation: AnimationSource | None = None,
    ) -> None:
        super().__init__(parent)
        if not targets:
            raise ValueError("ExportDialog needs at least one view to export")
        self.setWindowTitle("Export image")
        # The app's theme colours text light but styles no dialog background and no list: give this
        # dialog, and the message boxes and file dialog it opens, the theme whole.
        self.setStyleSheet(theme.stylesheet())
        self._targets = dict(targets)
        self._caption = caption
        self._step = step  # names the default file; the caption is only drawn, never read
        self._store = settings if settings is not None else app_settings()
        self._remembered = ExportSettings.load(self._store)
        self._auto_name = True  # the file name follows the choices until the user types one
        self._confirmed_overwrite: Path | None = None  # the file dialog already asked about replacing it
        self._animation = animation if animation is not None and animation.steps > 0 else None
        self._widths = {False: self._remembered.width, True: self._remembered.animation_width}  # by animating
        self._width_kind: bool | None = None
        self.written: Path | None = None

        self.target_box = target_menu(targets)
        self.format_box = format_menu(self._animation is not None)
        self.animation_rows = AnimationRows(self._animation.steps if self._animation is not None else 1,
                                            self._remembered.fps, self._remembered.hold, self)
        self.width_box = QSpinBox()
        self.width_box.setRange(MIN_PNG_WIDTH, MAX_PNG_WIDTH)
        self.width_box.setSingleStep(160)
        self.width_box.setSuffix(" px")
        self.width_box.setAccelerated(True)
        self.size_label = QLabel()
        self.size_label.setObjectName("muted")
        self.caption_box = QCheckBox("Add the &caption above the image")
        self.caption_box.setToolTip(caption)
        caption_preview = QLabel(caption)
        caption_preview.setObjectName("muted")
        caption_preview.setWordWrap(True)
        self.path_edit = QLineEdit()
        self.path_edit.setMinimumWidth(420)
        self.browse_button = QPushButton("&Browse\u2026")
        self.browse_button.setAutoDefault(False)

        width_row = QHBoxLayout()
        width_row.addWidget(self.width_box)
        width_row.addWidget(self.size_label, 1)
        path_row = QHBoxLayout()
        path_row.addWidget(self.path_edit, 1)
        path_row.addWidget(self.browse_button)
        form = QFormLayout()
        what_label, format_label, width_label, file_label = (
            QLabel("&What:"), QLabel("&Format:"), QLabel("PNG &width:"), QLabel("&Save to:"))
        self.width_label = width_label
        what_label.setBuddy(self.target_box)
        format_label.setBuddy(self.format_box)
        width_label.setBuddy(self.width_box)
        file_label.setBuddy(self.path_edit)
        form.addRow(what_label, self.target_box)
        form.addRow(format_label, self.format_box)
        form.addRow(width_label, width_row)
        self.animation_rows.add_to(form)
        form.addRow("", self.caption_box)
        form.addRow("", caption_preview)
        form.addRow(file_label, path_row)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        self.save_button = self.buttons.button(QDialogButtonBox.StandardButton.Save)
        self.save_button.setText("&Export")
        self.save_button.setDefault(True)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.buttons)

        self._restore_settings(initial)
        self.target_box.currentIndexChanged.connect(self._on_choice_changed)
        self.format_box.currentIndexChanged.connect(self._on_choice_changed)
        self.width_box.valueChanged.connect(self._update_size_label)
        self.animation_rows.changed.connect(self._on_animation_changed)
        self.caption_box.toggled.connect(self._update_size_label)
        self.path_edit.textEdited.connect(self._on_path_edited)
        self.browse_button.clicked.connect(self._on_browse_clicked)
        self.buttons.accepted.connect(self._on_export_clicked)
        self.buttons.rejected.connect(self.reject)
        self._on_choice_changed()
        self.target_box.setFocus()

    # ----- state -----
    def target(self) -> str:
        return self.target_box.currentData()

    def image_format(self) -> str:
        return self.format_box.currentData()

    def animating(self) -> bool:
        return self.image_format() in ANIMATION_FORMATS

    def animation_spec(self) -> AnimationSpec:
        return self.animation_rows.spec(self.width_box.value(), self.caption_box.isChecked())

    def path(self) -> Path:
        """The path typed, `~` expanded; as typed where that fails (the export then says why)."""
        text = self.path_edit.text().strip()
        try:
            return user_path(text)
        except KvvizError:
            return Path(text)

    def _folder(self) -> Path:
        if self.path_edit.text().strip():
            return self.path().parent
        saved = self._remembered.folder
        return Path(saved) if saved and Path(saved).is_dir() else Path.home()

    def _default_path(self) -> Path:
        if self.animating():
            spec = self.animation_spec()
            return self._folder() / animation_file_name(self.target(), self.image_format(), spec.first, spec.last)
        return self._folder() / default_file_name(self.target(), self.image_format(), self._step)

    def _restore_settings(self, initial: str | None) -> None:
        remembered = self._remembered
        self.target_box.setCurrentIndex(max(0, self.target_box.findData(initial or remembered.target)))
        remembered_format = remembered.image_format
        if remembered_format in ANIMATION_FORMATS and self._animation is None:
            remembered_format = "png"  # nothing to animate yet
        self.format_box.setCurrentIndex(max(0, self.format_box.findData(remembered_format)))
        self.caption_box.setChecked(remembered.caption)
        self._sync_kind()
        self.path_edit.setText(str(self._default_path()))

    def _save_settings(self, path: Path) -> None:
        self._widths[self.animating()] = self.width_box.value()
        self._remembered = ExportSettings(
            folder=str(path.parent), target=self.target(), image_format=self.image_format(),
            width=self._widths[False], caption=self.caption_box.isChecked(), animation_width=self._widths[True],
            fps=self.animation_rows.fps_box.value(), hold=self.animation_rows.hold_box.value())
        self._remembered.save(self._store)

    # ----- slots -----
    def _sync_kind(self) -> None:
        """The rows and views that fit a still image or an animation; each kind keeps its own width."""
        animating = self.animating()
        if self._width_kind is not None:
            self._widths[self._width_kind] = self.width_box.value()
        if self._width_kind != animating:
            self.width_box.setValue(self._widths[animating])
        self._width_kind = animating
        self.animation_rows.set_shown(animating)
        self.width_label.setText("&Width:" if animating else "PNG &width:")
        self.width_box.setEnabled(animating or self.image_format() == "png")
        animatable = self._animation.targets if self._animation is not None else ()
        for index in range(self.target_box.count()):
            key = self.target_box.itemData(index)
            enable_item(self.target_box, key, not animating or key in animatable)
        if animating and self.target() not in animatable:
            self.target_box.setCurrentIndex(self.target_box.findData("view" if "view" in animatable else animatable[0]))

    def _on_choice_changed(self, *_args) -> None:
        self._sync_kind()
        if self._auto_name:
            self.path_edit.setText(str(self._default_path()))
        else:
            path = self.path()
            if path.name and suffix_format(path) != self.image_format():
                self.path_edit.setText(str(named_for(path, self.image_format())))
        self._update_size_label()

    def _on_animation_changed(self) -> None:
        if self._auto_name and self.animating():
            self.path_edit.setText(str(self._default_path()))
        self._update_size_label()

    def _update_size_label(self, *_args) -> None:
        caption = self._caption if self.caption_box.isChecked() else None
        spec = self.animation_spec() if self.animating() else None
        self.size_label.setText(size_text(self._targets[self.target()], self.image_format(), self.width_box.value(),
                                          caption, spec))

    def _on_path_edited(self, _text: str) -> None:
        self._auto_name = False

    def _on_browse_clicked(self) -> None:
        fmt = self.image_format()
        chosen, _filter = QFileDialog.getSaveFileName(
            self, "Export image", str(self.path()), FORMAT_FILTERS[fmt],
            FORMAT_FILTERS[fmt],
        )
        if not chosen:
            return
        path = Path(chosen)
        if not path.suffix:
            path = path.with_suffix(f".{fmt}")
        suffix = suffix_format(path)
        if suffix in ALL_FORMATS and suffix != fmt and item_enabled(self.format_box, suffix):
            self.format_box.setCurrentIndex(self.format_box.findData(suffix))
        self._auto_name = False
        self.path_edit.setText(str(path))
        self._confirmed_overwrite = path

    def _on_export_clicked(self) -> None:
        path = self.path()
        if not self.path_edit.text().strip():
            self._fail("Choose a file name to export to.")
            return
        try:
            user_path(self.path_edit.text().strip())
        except KvvizError as exc:
            self._fail(f"Could not export: {exc}.")
            return
        if not path.suffix:
            path = path.with_suffix(f".{self.image_format()}")
        suffix = suffix_format(path)
        if suffix in ALL_FORMATS and suffix != self.image_format() and item_enabled(self.format_box, suffix):
            self._auto_name = False  # a typed .pdf wins over the menu
            self.format_box.setCurrentIndex(self.format_box.findData(suffix))
        if path.exists() and self._confirmed_overwrite != path:
            answer = QMessageBox.question(
                self, "Replace file?", f"{path.name} already exists in {path.parent}. Replace it?",
                QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No, QMessageBox.StandardButton.No)
            if answer != QMessageBox.StandardButton.Yes:
                return
        if self.animating():
            if not self._export_animation(path):
                return
        else:
            caption = self._caption if self.caption_box.isChecked() else None
            try:
                export_widget(self._targets[self.target()], path, self.width_box.value(), caption)
            except ExportError as exc:
                self._fail(f"Could not export: {exc}.")
                return
        self.written = path
        self._save_settings(path)
        self.accept()

    def written_as(self) -> str:
        """What was written, in words: "the K/V grid (PNG image)", "the whole view (GIF animation)"."""
        view = TARGET_LABELS.get(self.target(), self.target())
        if view[1:2] != "/":  # "K/V grid" keeps its capitals
            view = view[0].lower() + view[1:]
        return f"the {view} ({({**FORMAT_LABELS, **ANIMATION_LABELS})[self.image_format()]})"

    def _export_animation(self, path: Path) -> bool:
        """Write the animation to `path` under a progress dialog; False when it failed or was cancelled
        (nothing written either way)."""
        try:
            return write_with_progress(self, self._animation, self.target(), path, self.animation_spec(),
                                       self.frame_done.emit)
        except ExportError as exc:
            self._fail(f"Could not export: {exc}.")
            return False

    def _fail(self, sentence: str) -> None:
        QMessageBox.warning(self, "Export failed", sentence)

