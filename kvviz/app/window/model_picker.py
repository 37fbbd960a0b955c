"""The model picker: the embedded default, GPT-2 from the hub, random weights, or a checkpoint."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QFileDialog, QWidget

from kvviz.app.run.session import EMBEDDED
from kvviz.core.resources import EMBEDDED_MODELS, embedded_model_dir

HUB_CHOICES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "smollm2-135m", "smollm2-360m", "qwen2.5-0.5b")
HUB_SIZES = {"gpt2": "0.5 GB", "gpt2-medium": "1.5 GB", "gpt2-large": "3.2 GB", "gpt2-xl": "6.4 GB",
             "smollm2-135m": "0.3 GB", "smollm2-360m": "0.7 GB", "qwen2.5-0.5b": "1.0 GB"}
RANDOM_CHOICES = ("random:kvviz-shakespeare", "random:gpt2", "random:gpt2-medium", "random:gpt2-large",
                  "random:gpt2-xl", "random:kvviz-shakespeare-gqa", "random:smollm2-135m", "random:smollm2-360m",
                  "random:qwen2.5-0.5b")
EMBEDDED_NOTES = {"kvviz-shakespeare-gqa": "grouped-query attention",
                  "kvviz-shakespeare-draft": "2 layers: the draft of speculative decoding"}
OPEN_FILE, OPEN_FOLDER = "\0open-file", "\0open-folder"


def source_label(source: str) -> str:
    """How the window names a model source."""
    from kvviz.core.resources import DEFAULT_MODEL_NAME

    return DEFAULT_MODEL_NAME if source == EMBEDDED else source


class ModelPicker(QComboBox):
    """Emits `model_chosen(source)` for a choice that differs from the loaded model (a --model
    value: "" for the embedded default, a hub name, "random:...", or a checkpoint path)."""

    model_chosen = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMinimumContentsLength(22)
        self.setToolTip("Model: the embedded models, GPT-2, SmolLM2 or Qwen2.5 from the hub, random weights, "
                        "or a checkpoint")
        self._shown: str | None = None
        self._paths: set[str] = set()  # sources with an entry added for them (checkpoints)
        self.addItem(f"{source_label(EMBEDDED)} (embedded)", EMBEDDED)
        for name in EMBEDDED_MODELS[1:]:
            if (embedded_model_dir(name) / "model.safetensors").is_file():  # (the draft until it ships)
                self.addItem(f"{name} (embedded, {EMBEDDED_NOTES.get(name, 'a smaller model')})", name)
        self.insertSeparator(self.count())
        for name in HUB_CHOICES:
            self.addItem(f"{name} (hub, {HUB_SIZES[name]})", name)
        self.insertSeparator(self.count())
        for name in RANDOM_CHOICES:
            self.addItem(name, name)
        self.insertSeparator(self.count())
        self.addItem("Open checkpoint file\u2026", OPEN_FILE)
        self.addItem("Open checkpoint folder\u2026", OPEN_FOLDER)
        self.activated.connect(self._on_activated)

    def show_source(self, source: str | None, name: str | None = None) -> None:
        """Select `source` (the loaded model's; None: no model), adding an entry for a checkpoint
        path, named `name` (the model's name) or else by the path's last part."""
        self._shown = source
        if source is None:
            self.setCurrentIndex(-1)
            return
        index = self.findData(source)
        if index < 0:
            index = self.count() - 2  # before the two "Open checkpoint" entries
            self.insertItem(index, "", source)
            self.setItemData(index, source, Qt.ItemDataRole.ToolTipRole)
            self._paths.add(source)
        if source in self._paths:
            self.setItemText(index, name or self.itemText(index) or Path(source.rstrip("/\\")).name or source)
        self.setCurrentIndex(index)

    def open_checkpoint(self, folder: bool) -> None:
        """Ask for a checkpoint file or folder; a chosen one is emitted as `model_chosen`."""
        if folder:
            path = QFileDialog.getExistingDirectory(self, "Open checkpoint folder (config.json + model.safetensors)")
        else:
            path, _ = QFileDialog.getOpenFileName(self, "Open checkpoint file", "",
                                                  "Checkpoints (*.safetensors *.pth *.pt *.bin);;All files (*)")
        if path:
            self.model_chosen.emit(path)

    def pop_up(self) -> None:
        self.setFocus()
        self.showPopup()

    def _on_activated(self, index: int) -> None:
        source = self.itemData(index)
        if source in (OPEN_FILE, OPEN_FOLDER):
            self.show_source(self._shown)
            self.open_checkpoint(source == OPEN_FOLDER)
        elif source != self._shown:
            self.model_chosen.emit(source)
