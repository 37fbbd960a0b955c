"""The kvviz desktop app (PySide6 + pyqtgraph). Importing it does not import torch."""

from __future__ import annotations

import sys


def launch(model: str | None = None, prompt: str | None = None) -> int:
    """Show the main window at once, load the model in the background, run the event loop."""
    from PySide6.QtWidgets import QApplication

    from kvviz.app.settings import APPLICATION, ORGANIZATION

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setOrganizationName(ORGANIZATION)
    app.setApplicationName(APPLICATION)
    app.setApplicationDisplayName("kvviz")
    from PySide6.QtGui import QIcon

    from kvviz.resources import icon_path

    app.setWindowIcon(QIcon(str(icon_path())))
    from kvviz.app.main_window import MainWindow

    window = MainWindow(model, prompt)
    window.show()
    code = app.exec()
    # Delete the window while Qt is still alive; left to interpreter teardown, it can segfault.
    window.deleteLater()
    app.processEvents()
    del window
    return code


__all__ = ["launch"]
