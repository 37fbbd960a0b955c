"""The kvviz desktop app (PySide6 + pyqtgraph). Importing it does not import torch."""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Callable, Mapping

# superqt reaches Qt through qtpy, which takes the first Qt binding it finds: the app's is PySide6, whatever else is
# installed
os.environ.setdefault("QT_API", "pyside6")

NO_DISPLAY = "no display to show the window on; set DISPLAY, or QT_QPA_PLATFORM=offscreen for a window nobody sees"


def missing_display(environ: Mapping[str, str] = os.environ, platform: str = sys.platform) -> str | None:
    """Why Qt would find no display to open the window on (an X11 or Wayland system with neither),
    in one line; None when there may be one. Qt itself would abort the process with seven lines."""
    if platform in ("win32", "darwin") or platform.startswith(("ios", "android", "emscripten", "wasi")):
        return None
    names = [p.split(":", 1)[0].strip() for p in environ.get("QT_QPA_PLATFORM", "").split(";") if p.strip()]
    has_x, has_wayland = bool(environ.get("DISPLAY")), bool(environ.get("WAYLAND_DISPLAY"))
    if not names:  # Qt's choice: Wayland or X11, whichever is there
        return None if has_x or has_wayland else NO_DISPLAY
    if all(name == "xcb" for name in names) and not has_x:
        return NO_DISPLAY
    return None


def _one_line_platform_errors() -> Callable[[], None]:
    """Until the returned function is called, Qt's platform messages are held back, and a fatal one
    (no platform plugin could start: Qt would abort with several lines, some misleading) ends the
    process with one line and status 2. The function lets the held messages out and restores Qt's handler."""
    from PySide6.QtCore import QtMsgType, qInstallMessageHandler

    held: list[str] = []

    def handler(mode: QtMsgType, context, message: str) -> None:
        category = getattr(context, "category", None) or ""
        if mode == QtMsgType.QtFatalMsg:
            reasons = [m for m in held if "connect to display" in m] or held or [message.splitlines()[0]]
            reason = reasons[0].split(": ", 1)[-1].strip().rstrip(".")
            hint = "check DISPLAY, or set" if "display" in reason.lower() else "set"
            sys.stderr.write(f"kvviz: the window cannot open ({reason}); {hint} "
                             "QT_QPA_PLATFORM=offscreen for a window nobody sees\n")
            sys.stderr.flush()
            os._exit(2)
        text = f"{category}: {message}" if category and category != "default" else message
        if category.startswith("qt.qpa"):
            held.append(text)
        else:
            sys.stderr.write(text + "\n")

    previous = qInstallMessageHandler(handler)

    def release() -> None:
        qInstallMessageHandler(previous)
        for text in held:
            sys.stderr.write(text + "\n")

    return release


def _close_on_interrupt(close: Callable[[], None]) -> Callable[[], None]:
    """Ctrl+C in the terminal (SIGINT), SIGTERM (`kill`) and SIGHUP (the terminal closed) call `close` from the
    event loop, as Ctrl+Q does: settings saved, no export left half-written; a second signal ends the process
    at once. Python runs its signal handlers only between bytecodes, so the signal also writes to a socket
    that Qt's event loop watches: that wakes it even when idle. Returns the function that puts everything back."""
    from PySide6.QtCore import QSocketNotifier, QTimer

    from kvviz.core.files import python_stop_handlers

    defaults = python_stop_handlers()
    # one that is ignored (a background job) or someone else's handler is left alone
    taken = [number for number, default in defaults.items() if signal.getsignal(number) is default]
    if not taken:
        return lambda: None
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    try:
        previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except ValueError:  # not the main thread
        reader.close()
        writer.close()
        return lambda: None
    notifier = QSocketNotifier(reader.fileno(), QSocketNotifier.Type.Read)

    def drain() -> None:
        try:
            while reader.recv(256):
                pass
        except OSError:
            pass

    notifier.activated.connect(drain)

    def stop_requested(_signum: int, _frame: object) -> None:
        for number in taken:
            signal.signal(number, signal.SIG_DFL)
        QTimer.singleShot(0, close)

    for number in taken:
        signal.signal(number, stop_requested)

    def restore() -> None:
        for number in taken:
            signal.signal(number, defaults[number])
        signal.set_wakeup_fd(previous_fd)
        notifier.setEnabled(False)
        notifier.deleteLater()
        reader.close()
        writer.close()

    return restore


def launch(model: str | None = None, prompt: str | None = None, lesson: str | None = None,
           theme: str | None = None) -> int:
    """Show the main window at once, load the model in the background, run the event loop.
    `lesson`: start in lesson mode with this lesson file ("" or "builtin": the built-in lesson); `theme`:
    "dark" or "light" (None: the one remembered).
    Without a display, say so in one line and return 2."""
    no_display = missing_display()
    if no_display is not None:
        print(f"kvviz: {no_display}", file=sys.stderr)
        return 2
    from PySide6.QtWidgets import QApplication

    from kvviz.app.settings import APPLICATION, ORGANIZATION

    app = QApplication.instance()
    if app is None:
        release_messages = _one_line_platform_errors()
        app = QApplication(sys.argv[:1])
        release_messages()
    app.setOrganizationName(ORGANIZATION)
    app.setApplicationName(APPLICATION)
    app.setApplicationDisplayName("kvviz")
    from PySide6.QtGui import QIcon

    from kvviz.core.resources import icon_path

    app.setWindowIcon(QIcon(str(icon_path())))
    from kvviz.app.assembly import open_window

    window = open_window(model, prompt, lesson=lesson, theme_name=theme)
    window.show()
    restore_interrupt = _close_on_interrupt(QApplication.closeAllWindows)
    previous_hook, sys.excepthook = sys.excepthook, lambda _kind, exc, _tb, shown=window: report_unexpected(shown, exc)
    try:
        code = app.exec()
    finally:
        sys.excepthook = previous_hook
        restore_interrupt()
    # Delete the window while Qt is still alive; left to interpreter teardown, it can segfault.
    window.deleteLater()
    app.processEvents()
    del window
    return code


def report_unexpected(window, exc: BaseException) -> None:
    """An exception no code caught on the GUI thread (a bug): its traceback to the log file, and a dialog that
    says so in one sentence and where the details are; the window goes on."""
    from PySide6.QtWidgets import QMessageBox

    from kvviz.core.errors import first_line
    from kvviz.core.log import log_error

    logged = log_error("the app", exc)
    where = f" The details are in {logged}." if logged else ""
    QMessageBox.critical(window, "kvviz: unexpected error",
                         f"kvviz hit an unexpected error: {first_line(exc) or type(exc).__name__}.{where}")


__all__ = ["launch", "missing_display", "report_unexpected"]
