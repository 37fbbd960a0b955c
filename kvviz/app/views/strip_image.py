"""The attention strip's pixels and head labels from numbers alone (no Qt): weights to an RGBA image, a square
per weight with a gap line between squares, and which heads' rows are labelled."""

from __future__ import annotations

import numpy as np

MAX_CELL_PIXELS = 16  # a weight's square in the strip's image, at most (a 1-pixel gap line from 4 pixels)


def cell_pixels(heads: int, width: int) -> int:
    """A weight's square in the image of a heads × width strip, in pixels, as the K/V grid's cells."""
    return max(1, min(MAX_CELL_PIXELS, 1800 // width, 900 // heads))


def strip_image(strip: np.ndarray, brightest: float, table: np.ndarray, empty: np.ndarray,
                gap: np.ndarray, group: int = 1, evicted: np.ndarray | None = None,
                evicted_colour: np.ndarray | None = None) -> np.ndarray:
    """(heads, width) weights as an RGBA image: `table`'s shades from 0 to `brightest`, `empty` where a weight is
    NaN, and from squares of 4 pixels a `gap` line between heads and between positions; query heads that share a
    KV head (`group` a KV head) are set apart from the next group by a double line. The `evicted` positions (width,)
    (an importance method's, which no head reads) are `evicted_colour`, from 4 pixels `empty` with stripes of it, so
    that no shade of a weight reads as one."""
    shade = np.nan_to_num(strip, nan=0.0) / (brightest or 1.0)
    index = np.clip(shade * (len(table) - 1), 0, len(table) - 1).astype(np.intp)
    image = table[index]  # (heads, width, 4)
    image[np.isnan(strip)] = empty
    gone = evicted is not None and evicted_colour is not None and bool(evicted.any())
    if gone:
        image[:, evicted] = evicted_colour
    size = cell_pixels(*strip.shape)
    if size >= 4:
        image = np.repeat(np.repeat(image, size, axis=0), size, axis=1)  # (heads * s, width * s, 4)
        if gone:  # hatched: the empty colour, striped in the evicted one (no weight's solid shade looks like it)
            columns = np.repeat(evicted, size) & (np.arange(image.shape[1]) % 3 != 1)
            image[:, columns] = empty
        image[size - 1::size, :] = gap
        image[:, size - 1::size] = gap
        if group > 1:
            image[size * group - 2::size * group, :] = gap  # the last row of a group: a second line above its gap
    return image


def head_ticks(heads: int, pitch: float, line_height: float, group: int = 1) -> list[list[tuple[float, str]]]:
    """The left axis's ticks: every head's row labelled when rows `pitch` pixels apart are a line of the font
    tall, else every few; a query head that shares its KV head with others (`group` a KV head) names it: "3 kv1"."""
    step = next((s for s in range(1, heads + 1) if s * pitch >= 0.8 * line_height), heads)
    return [[(h + 0.5, str(h) if group == 1 else f"{h} kv{h // group}") for h in range(0, heads, step)]]
