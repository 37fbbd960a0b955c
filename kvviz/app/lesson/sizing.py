"""How wide the lesson's column is, and whether the views keep the width they need beside it."""

from __future__ import annotations

PANEL_WIDTH = 330  # pixels at zoom 1
PANEL_SHARE = 0.3  # of the window's width, at most
VIEWS_MIN_WIDTH = 760  # pixels at zoom 1 the views keep beside the column (the chart's plots and the counter)
OUTER_MARGINS = 24  # the window's margins and the spacing between the views and the column
STRIP_FONT = 0.92  # a strip's fonts, relative to a column's: the views below it keep their height


def column_width(font_scale: float, window_width: int) -> int:
    """The column's width at zoom `font_scale`: at most PANEL_SHARE of the window (0: not known yet)."""
    width = round(PANEL_WIDTH * font_scale)
    return min(width, round(PANEL_SHARE * window_width)) if window_width else width


def fits_beside(window_width: int, width: int, columns_beside: int, font_scale: float) -> bool:
    """Whether the views keep VIEWS_MIN_WIDTH (at zoom `font_scale`) beside a column `width` pixels wide and
    the other columns' `columns_beside` pixels (a window of width 0, not known yet: they do)."""
    views = window_width - width - columns_beside - OUTER_MARGINS
    return not window_width or views >= VIEWS_MIN_WIDTH * font_scale
