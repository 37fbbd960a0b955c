"""Run > Precision: the number type of the weights and the KV cache, remembered, and kept on failure."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from PySide6.QtCore import QObject
from PySide6.QtGui import QAction

from kvviz.app.run.session import RunSession
from kvviz.core.memory import DTYPE_BYTES
from kvviz.core.records import ModelInfo

DTYPES = tuple(DTYPE_BYTES)  # float32, bfloat16, float16


class PrecisionMenu(QObject):
    """Keeps the Run > Precision choices (actions "dtype_<name>") on the loaded model's dtype.

    Choosing another reloads the model in it; while that load runs the menu shows the choice. If it
    fails (a device that cannot compute in it) the window's dialog says why, and the menu goes back
    to the dtype of the model still loaded. Each of `shown_in` (the status line, the run controls...)
    is told the loaded model's precision, so that the screen says what the numbers were computed in.
    """

    def __init__(self, session: RunSession, actions: Mapping[str, QAction],
                 shown_in: Iterable[Callable[[str], None]] = ()) -> None:
        super().__init__(session)
        self._session = session
        self._shown_in = tuple(shown_in)
        self._actions = {name: actions[f"dtype_{name}"] for name in DTYPES}
        self._showing = False
        for name, action in self._actions.items():
            action.toggled.connect(lambda on, name=name: on and self.choose(name))
        session.model_loaded.connect(self._on_model_loaded)
        session.model_load_failed.connect(self._show_loaded)
        session.model_load_cancelled.connect(self._show_loaded)
        self.show(session.dtype)

    def show_in(self, show: Callable[[str], None]) -> None:
        """Show each loaded model's precision in `show` too (a part added after the window was built)."""
        self._shown_in += (show,)

    @property
    def dtype(self) -> str:
        """The precision checked in the menu."""
        return next(name for name, action in self._actions.items() if action.isChecked())

    def show(self, dtype: str) -> None:
        """Check `dtype` without asking for a load."""
        self._showing = True  # (blocking the action's signals would keep its group from unchecking the others)
        try:
            self._actions[dtype].setChecked(True)
        finally:
            self._showing = False

    def choose(self, dtype: str) -> None:
        """The user chose `dtype`: reload the model (the one loading, if any) in it."""
        s = self._session
        if self._showing:
            return
        if s.model_info is None and not s.loading:
            s.dtype = dtype  # no model yet: the next load takes it
        elif dtype != s.dtype:
            s.load(s.latest_source, dtype)

    def _on_model_loaded(self, info: ModelInfo) -> None:
        for show in self._shown_in:
            show(info.dtype)
        if not self._session.loading:
            self.show(info.dtype)

    def _show_loaded(self, *_args) -> None:
        if not self._session.loading:
            self.show(self._session.dtype)
