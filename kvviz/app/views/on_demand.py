"""A view built the first time it is needed, so that opening the window does not pay for panels nobody
has opened yet (compare mode's, View > Memory)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from PySide6.QtWidgets import QWidget

from kvviz.app.theme import Theme
from kvviz.app.views.base import redraw_slices
from kvviz.core.records import RunPlan, StepRecord

ViewT = TypeVar("ViewT", bound=QWidget)


class OnDemandView(Generic[ViewT]):
    """Stands in for a view (RunViewProtocol) until `get()` builds it with `build()`.

    Until then it keeps what the redraw scheduler and the presentation hand a view (the run's plan, the
    records since, the font scale) and gives them to the view when it is built, so the view starts where
    one built with the window would be; the theme it starts in is the current one anyway. Once built,
    every call goes to the view, and `on_built` callbacks have been called with it.
    """

    def __init__(self, build: Callable[[], ViewT]) -> None:
        self._build = build
        self.view: ViewT | None = None
        self._plan: RunPlan | None = None
        self._records: list[StepRecord] = []
        self._font_scale: float | None = None
        self._on_built: list[Callable[[ViewT], None]] = []

    @property
    def built(self) -> bool:
        return self.view is not None

    def on_built(self, callback: Callable[[ViewT], None]) -> None:
        """Call `callback(view)` once the view is built (now, if it is)."""
        if self.view is not None:
            callback(self.view)
        else:
            self._on_built.append(callback)

    def get(self) -> ViewT:
        """The view, built now if it was not."""
        if self.view is None:
            view = self._build()
            if self._font_scale is not None:
                view.set_font_scale(self._font_scale)
            if self._plan is not None:
                view.reset(self._plan)
                if self._records:
                    view.apply(self._records)
            self._plan, self._records = None, []
            self.view = view
            callbacks, self._on_built = self._on_built, []
            for callback in callbacks:
                callback(view)
        return self.view

    def shown(self) -> bool:
        """Built and shown in its window."""
        return self.view is not None and self.view.isVisibleTo(self.view.window())

    def reset(self, plan: RunPlan) -> None:
        if self.view is not None:
            self.view.reset(plan)
        else:
            self._plan, self._records = plan, []

    def apply(self, records: Sequence[StepRecord]) -> None:
        if self.view is not None:
            self.view.apply(records)
        elif self._plan is not None:
            self._records.extend(records)

    def refresh(self) -> None:
        if self.view is not None:
            self.view.refresh()

    def redraw_slices(self) -> list[Callable[[], None]]:
        """The view's slices while it is shown; nothing to draw while it is hidden or not built."""
        return redraw_slices(self.view) if self.shown() else []

    def set_font_scale(self, scale: float) -> None:
        if self.view is not None:
            self.view.set_font_scale(scale)
        else:
            self._font_scale = scale

    def set_theme(self, theme: Theme) -> None:
        if self.view is not None:
            self.view.set_theme(theme)
