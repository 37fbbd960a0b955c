"""Where the app remembers its settings (QSettings, INI format, per user)."""

from __future__ import annotations

from PySide6.QtCore import QSettings

ORGANIZATION = "kvviz"
APPLICATION = "kvviz"


def app_settings() -> QSettings:
    """The user's kvviz settings; tests redirect them with QSettings.setPath(IniFormat, UserScope, dir)."""
    return QSettings(QSettings.Format.IniFormat, QSettings.Scope.UserScope, ORGANIZATION, APPLICATION)
