"""The K/V grid's cells: their states, colours and the pixels of one cell (patterns in colour-blind mode, softer
separators between the heads of an expanded layer), and the legend of the states."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from PySide6.QtGui import QFont, QImage, QPixmap
from PySide6.QtWidgets import QHBoxLayout, QLabel, QWidget

from kvviz.app import theme as themes
from kvviz.app.theme import Theme
from kvviz.app.views.flow_layout import FlowLayout
from kvviz.app.views.grid.cell_states import (
    COMPUTED,
    DRAFTED,
    EMPTY,
    EVICTED,
    HEAD_ROW,
    LAST_HEAD_ROW,
    LAYER_ROW,
    PENDING,
    REUSED,
    ROLLED_BACK,
    ROW_KINDS,
    SHARED,
    STALE,
    STATE,
    STATE_NAMES,
    state_names,
)

if TYPE_CHECKING:
    from kvviz.app.views.grid.grid_rows import GridRows

MAX_IMAGE_PIXELS = 1800  # the grid's image size limit per axis, so a redraw stays cheap
SCORES = -1  # the legend's entry of View > Scores (not a cell state)


def state_colours(theme: Theme) -> dict[int, str]:
    """Each cell state's colour in `theme`."""
    return {EMPTY: theme.empty, PENDING: theme.pending, COMPUTED: theme.amber, REUSED: theme.teal, STALE: theme.alert,
            EVICTED: theme.evicted, SHARED: theme.shared, STATE: theme.state, DRAFTED: theme.drafted,
            ROLLED_BACK: theme.rolled_back}


def cell_tile(state: int, size: int, colour_blind: bool, theme: Theme, row: int = LAYER_ROW) -> np.ndarray:
    """(size, size, 4) RGBA pixels of one cell; a 1 px gap when cells are big, patterns for colour-blind mode.
    `row` (a ROW_KINDS value) chooses the separator below the cell."""
    tile = np.empty((size, size, 4), dtype=np.uint8)
    colour = np.array(themes.rgba(state_colours(theme)[state]), dtype=np.uint8)
    tile[:] = colour
    dark = np.array(themes.rgba(theme.grid_line), dtype=np.uint8)
    if state == SHARED and size >= 5:  # hatched in every look, in the axes' grey: a row with no cells of its own
        yy, xx = np.mgrid[0:size, 0:size]
        tile[(xx - yy) % 5 == 0] = np.array(themes.rgba(theme.muted), dtype=np.uint8)
    if colour_blind and size >= 5:
        yy, xx = np.mgrid[0:size, 0:size]
        if state == COMPUTED:  # diagonal stripes
            tile[(xx + yy) % 4 == 0] = dark
        elif state == REUSED:  # a centred dot
            c = (size - 1) / 2
            tile[(xx - c) ** 2 + (yy - c) ** 2 <= max(1.0, (size / 5) ** 2)] = dark
        elif state == PENDING:  # a horizontal bar
            tile[size // 2, :] = dark
        elif state == STALE:  # a cross
            tile[(xx == yy) | (xx + yy == size - 1)] = dark
        elif state == EVICTED:  # vertical stripes
            tile[xx % 3 == 1] = dark
        elif state == STATE:  # a horizontal line through the block
            tile[size // 3, :] = dark
        elif state == DRAFTED:  # a hollow square: a draft
            inner = size - max(1, round(size * theme.cell_gap)) - 2  # the ring's far side, inside the gap
            ring = (np.minimum(xx, yy) >= 1) & (np.maximum(xx, yy) <= inner)
            tile[ring & ((xx == 1) | (yy == 1) | (xx == inner) | (yy == inner))] = dark
    if size >= 4:
        gap = max(1, round(size * theme.cell_gap))
        if row == LAYER_ROW:
            tile[-gap:, :] = dark
        elif row == LAST_HEAD_ROW:
            tile[-min(max(2 * gap, size // 4), max(gap, size // 3)):, :] = dark  # twice a layer's, or a quarter
        elif row == HEAD_ROW and size >= 6:  # halfway between the cell and the gap: heads of one layer, one band
            tile[-1, :] = (colour.astype(np.uint16) + dark) // 2
        if state != STATE:  # a state is one block, not positions: no line between its cells
            tile[:, -gap:] = dark
    if state == ROLLED_BACK and size >= 3:  # struck through in every look, in the text's colour, through the gap
        body = size - (max(1, round(size * theme.cell_gap)) if size >= 4 else 0)  # side by side, the positions
        thick = max(1, size // 7)  # rolled back read as one struck line
        middle = (body - thick) // 2
        tile[middle:middle + thick, :] = np.array(themes.rgba(theme.foreground), dtype=np.uint8)
    return tile


FAINTEST = 0.3  # View > Scores: the lowest-scored kept cell keeps this share of its colour over the empty one


def shade_cells(image: np.ndarray, shades: np.ndarray, size: int, theme: Theme) -> np.ndarray:
    """`image` (rows × size, width × size, 4) with each cell's colour drawn `shades` (rows, width) of the way from
    the empty cell's colour (FAINTEST at 0, all of it at 1; NaN: as drawn), its gap lines and patterns kept."""
    if not np.isfinite(shades).any():
        return image
    share = FAINTEST + (1 - FAINTEST) * np.nan_to_num(shades, nan=1.0)
    share = np.repeat(np.repeat(share, size, axis=0), size, axis=1)[..., None]  # (rows × s, width × s, 1)
    empty = np.array(themes.rgba(theme.empty), dtype=np.float32)
    dark = np.array(themes.rgba(theme.grid_line), dtype=np.uint8)
    shaded = (empty + (image.astype(np.float32) - empty) * share).astype(np.uint8)
    lines = np.all(image == dark, axis=-1)  # the gaps between cells, colour-blind patterns: as they are
    shaded[lines] = image[lines]
    return shaded


def scores_swatch(theme: Theme, size: int = 14) -> QPixmap:
    """The legend's swatch of View > Scores: three reused cells, from the lowest score's shade to the highest's."""
    tile = cell_tile(REUSED, size, False, theme)
    cells = np.concatenate([tile] * 3, axis=1)
    cells = np.ascontiguousarray(shade_cells(cells, np.array([[0.0, 0.5, 1.0]]), size, theme)[:-1, :-1])
    h, w = cells.shape[:2]
    return QPixmap.fromImage(QImage(cells.data, w, h, 4 * w, QImage.Format.Format_RGBA8888).copy())


def state_swatch(state: int, colour_blind: bool, theme: Theme, size: int = 14) -> QPixmap:
    """A legend swatch drawn with the same tile as the grid."""
    tile = np.ascontiguousarray(cell_tile(state, size, colour_blind, theme)[:-1, :-1] if size >= 4
                                else cell_tile(state, size, False, theme))
    h, w = tile.shape[:2]
    image = QImage(tile.data, w, h, 4 * w, QImage.Format.Format_RGBA8888)
    return QPixmap.fromImage(image.copy())


class GridLegend(FlowLayout):
    """Each cell state's swatch and name, in a row that wraps on a narrow screen (a swatch stays with its
    words). `shown=False` hides every entry: a hidden legend takes no room. The stale slot's entry shows only
    for a run on a cache broken on purpose (`show_stale`), the evicted one for a run with a window
    (`show_evicted`), the shared layer's and the state's for a model with such layers (`show_layer_kinds`), the
    accepted and the rejected drafts' for a speculative run (`show_drafted`)."""

    def __init__(self, shown: bool = True) -> None:
        super().__init__(spacing=14)
        self._shown = shown
        self._entries: list[tuple[QLabel, QLabel, int]] = []
        self._optional: dict[int, QWidget] = {}  # the entries shown for some runs only
        self._look: tuple[bool, Theme] | None = None  # the swatches' look, for entries made later
        self._font: QFont | None = None
        for state in (COMPUTED, STALE, REUSED, EVICTED, SHARED, STATE, PENDING, EMPTY):
            self._add_entry(state, optional=state in (STALE, EVICTED, SHARED, STATE))

    def _add_entry(self, state: int, optional: bool) -> QWidget:
        """The entry of `state`, a swatch and its name, at the end of the row; an optional one hidden."""
        swatch, text = QLabel(), QLabel(STATE_NAMES[state])
        text.setObjectName("muted")
        entry = QWidget()
        entry_row = QHBoxLayout(entry)
        entry_row.setContentsMargins(0, 0, 0, 0)
        entry_row.addWidget(swatch)
        entry_row.addWidget(text)
        if not self._shown or optional:  # (a parentless widget told to show opens as a window)
            entry.hide()
        if optional:
            self._optional[state] = entry
        self.addWidget(entry)
        self._entries.append((swatch, text, state))
        if self._look is not None:
            swatch.setPixmap(state_swatch(state, *self._look))
        if self._font is not None:
            text.setFont(self._font)
        return entry

    def show_stale(self, on: bool) -> None:
        """Show the stale slot's entry (a run on a cache broken on purpose), or hide it."""
        self._show_optional(STALE, on)

    def show_evicted(self, on: bool) -> None:
        """Show the evicted entry (a run whose cache has a window), or hide it."""
        self._show_optional(EVICTED, on)

    def show_layer_kinds(self, kinds: tuple[str, ...]) -> None:
        """Show the entries of the layer kinds a run's model has: a shared layer's, a linear-attention state's."""
        self._show_optional(SHARED, "shared" in kinds)
        self._show_optional(STATE, "state" in kinds)

    def show_drafted(self, on: bool) -> None:
        """Show the entries of the drafts a target accepted and rejected (a speculative run), or hide them. They are
        made for the first speculative run, after the computed cells' entry: a grid that never shows a speculative
        run holds no widgets for them (two more hidden entries in every legend made a window's teardown under the
        tests crash in Qt about one run in two; made on demand, none did)."""
        if on and DRAFTED not in self._optional:
            for index, state in ((1, DRAFTED), (2, ROLLED_BACK)):
                self._add_entry(state, optional=True)
                self._items.insert(index, self._items.pop())  # beside the computed cells' entry
            self.invalidate()
        if DRAFTED in self._optional:
            self._show_optional(DRAFTED, on)
            self._show_optional(ROLLED_BACK, on)

    def show_scores(self, on: bool) -> None:
        """Show the entry of View > Scores (kept cells shaded by their score, an importance run's), or hide it; made
        the first time it shows, beside the reused cells' entry (as the drafts', on demand)."""
        if on and SCORES not in self._optional:
            self._scores = QLabel(), QLabel("kept, shaded by score: faint = lowest of its layer")
            self._scores[1].setObjectName("muted")
            entry = self._optional[SCORES] = QWidget()
            entry_row = QHBoxLayout(entry)
            entry_row.setContentsMargins(0, 0, 0, 0)
            for label in self._scores:
                entry_row.addWidget(label)
            entry.setVisible(self._shown)
            self.addWidget(entry)
            self._items.insert(self._index_of(REUSED) + 1, self._items.pop())
            self._restyle_scores()
            self.invalidate()
        if SCORES in self._optional:
            self._show_optional(SCORES, on)

    def _index_of(self, state: int) -> int:
        entry = next(text.parentWidget() for _swatch, text, entry_state in self._entries if entry_state == state)
        return next(i for i, item in enumerate(self._items) if item.widget() is entry)

    def _restyle_scores(self) -> None:
        if SCORES in self._optional:
            if self._look is not None:
                self._scores[0].setPixmap(scores_swatch(self._look[1]))
            if self._font is not None:
                self._scores[1].setFont(self._font)

    def is_shown(self, state: int) -> bool:
        """Whether the entry of `state` is in the legend now (an optional one only for the runs it fits)."""
        if all(entry_state != state for _swatch, _text, entry_state in self._entries):
            return False  # a speculative run's entries, before the first one
        entry = self._optional.get(state)
        return self._shown and (entry is None or not entry.isHidden())

    def _show_optional(self, state: int, on: bool) -> None:
        entry = self._optional[state]
        if entry.parentWidget() is not None:
            entry.setVisible(on and self._shown)

    def show_latent(self, latent: bool, method: str = "") -> None:
        """Name the states for a cache of latents (MLA: the latent is computed and reused, each head's K and V
        rebuilt from it every pass) or of K and V; the evicted cells for the importance `method` ("H2O") that
        evicts them, else for a window."""
        names = state_names(latent, method)
        for _swatch, text, state in self._entries:
            text.setText(names[state])

    def show_look(self, colour_blind: bool, theme: Theme) -> None:
        """Draw the swatches as the grid draws its cells."""
        self._look = (colour_blind, theme)
        for swatch, _text, state in self._entries:
            swatch.setPixmap(state_swatch(state, colour_blind, theme))
        self._restyle_scores()

    def set_text_font(self, font: QFont) -> None:
        self._font = font
        for _swatch, text, _state in self._entries:
            text.setFont(font)
        self._restyle_scores()


class CellTiles:
    """The grid's image: each cell drawn as its tile, the tiles made once per size, pattern and theme."""

    def __init__(self) -> None:
        self._tiles: dict[tuple[int, bool, Theme], np.ndarray] = {}

    def image(self, states: np.ndarray, rows: GridRows, colour_blind: bool, theme: Theme,
              shades: np.ndarray | None = None) -> np.ndarray:
        """(rows × s, width × s, 4) RGBA pixels of (n_layer, width) `states` shown as `rows`, the cells with
        `shades` (n_layer, width; View > Scores) drawn fainter (see shade_cells)."""
        n_rows, width = len(rows), states.shape[1]
        size = max(1, min(16, MAX_IMAGE_PIXELS // width, (MAX_IMAGE_PIXELS // 2) // n_rows))
        if colour_blind:
            size = max(size, 6 if width <= 512 else size)
        key = (size, colour_blind, theme)
        if key not in self._tiles:
            states_all = range(len(STATE_NAMES))
            self._tiles[key] = np.stack([np.stack([cell_tile(s, size, colour_blind, theme, row) for s in states_all])
                                         for row in ROW_KINDS])  # (row kinds, states, s, s, 4)
        tiles = self._tiles[key]
        display = states[rows.layers]  # (R, W): each head row repeats its layer's
        if size == 1:
            image = tiles[rows.kinds, display, 0, 0]  # (R, W, 4)
        else:
            cells = tiles[rows.kinds, display]  # (R, W, s, s, 4)
            image = cells.transpose(0, 2, 1, 3, 4).reshape(n_rows * size, width * size, 4)
        return image if shades is None else shade_cells(image, shades[rows.layers], size, theme)
