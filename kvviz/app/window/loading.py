"""What the window shows while a model loads: banner, status line, download progress and Cancel."""

from __future__ import annotations

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QProgressBar, QPushButton, QStatusBar

from kvviz.app.run.session import RunSession
from kvviz.app.views.status import StatusLine
from kvviz.app.window.banner import Banner
from kvviz.app.window.model_picker import HUB_CHOICES, ModelPicker, source_label


class LoadingIndicator(QObject):
    """Follows the session's model loads: says what is loading, shows a hub download's progress
    with a Cancel button, keeps the picker disabled until the last queued load has ended, and then
    shows the model really loaded (in the picker, by its name) and the run still going, if any. A
    run that cannot start leaves the status line on the model, not on the run it replaced."""

    def __init__(self, session: RunSession, status_bar: QStatusBar, status: StatusLine, banner: Banner,
                 picker: ModelPicker) -> None:
        super().__init__(session)
        self._session, self._status, self._banner, self._picker = session, status, banner, picker
        self.progress_bar = QProgressBar()
        self.progress_bar.setFixedWidth(220)
        self.progress_bar.hide()
        self.cancel_button = QPushButton("Cancel download")
        self.cancel_button.hide()
        self.cancel_button.clicked.connect(session.cancel_download)
        status_bar.addPermanentWidget(self.progress_bar)
        status_bar.addPermanentWidget(self.cancel_button)
        session.model_loading.connect(self._on_model_loading)
        session.download_progressed.connect(self._on_download_progressed)
        session.model_loaded.connect(self._end)
        session.model_load_failed.connect(self._end)
        session.model_load_cancelled.connect(self._on_cancelled)
        session.run_failed.connect(self._on_run_failed)

    def _on_model_loading(self, source: str) -> None:
        label = source_label(source)
        self._banner.say(f"Loading {label}\u2026 (the window stays usable; the first load also imports torch)")
        self._status.show_message(f"Loading {label}\u2026")
        self._picker.setEnabled(False)
        self.progress_bar.setRange(0, 0)
        self.progress_bar.setVisible(source in HUB_CHOICES)
        self.cancel_button.setVisible(source in HUB_CHOICES)

    def _on_download_progressed(self, done: int, total: int) -> None:
        if total > 0:
            self.progress_bar.setRange(0, 1000)
            self.progress_bar.setValue(int(1000 * done / total))
            self.progress_bar.setFormat(f"{done / 2**20:,.0f} / {total / 2**20:,.0f} MiB")
        self.progress_bar.show()
        self.cancel_button.show()

    def _end(self, *_args) -> None:
        if self._session.loading:
            return  # another load is queued: it says so itself
        self.progress_bar.hide()
        self.cancel_button.hide()
        self._picker.setEnabled(True)
        info = self._session.model_info
        self._picker.show_source(self._session.source, info.name if info is not None else None)
        self._banner.say("")
        if info is not None and self._session.plan is not None:
            self._status.show_run()  # a load failed or was cancelled: the run goes on
        else:
            self._status.show_message(self._model_line())

    def _model_line(self) -> str:
        info = self._session.model_info
        if info is None:
            return "No model is loaded."
        return (f"{info.name}: {info.n_layer} layers, {info.num_parameters / 1e6:.1f} M parameters, "
                f"context {info.n_ctx}, {info.dtype}")

    def _on_cancelled(self, source: str) -> None:
        self._end()
        if not self._session.loading:
            kept = self._session.model_info.name if self._session.model_info else "no model"
            self._status.show_message(f"Download of {source} cancelled; kept {kept}", sticky=False)

    def _on_run_failed(self, _message: str) -> None:
        if not self._session.loading:  # the banner says why; the progress of the run replaced is gone
            self._status.show_message(self._model_line())
