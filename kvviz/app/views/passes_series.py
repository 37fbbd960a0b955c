"""The chart's series for a speculative run: target passes against tokens generated. Plain decoding makes one target
pass a token (the line y = x); speculative decoding's passes are the records' own count, each round's
`speculation.target_passes_total` at its `new_tokens`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from kvviz.app.theme import Theme
from kvviz.core.records import RunPlan, StepRecord

PASSES_TITLE = "Target passes against tokens generated"
PASSES_AXES = ("target passes", "tokens generated")  # (left, bottom)
SYMBOL_LIMIT = 40  # draw point markers while the run has this few rounds


class PassesSeries:
    """Two curves of `plot` (WorkChart's work plot, where a speculative run shows them instead of its K/V curves),
    hidden until `show`: a point a round at (tokens generated, target passes so far), from the origin (no token, no
    pass), and plain decoding's pass a token at the same tokens. `frame` fits the plot to a plan: its budget of
    tokens, and as many passes (plain decoding's, the most a speculative run makes). `data()` returns what is
    drawn."""

    def __init__(self, plot: pg.PlotItem) -> None:
        # unnamed: the chart's legend names the curves it shows (plot.plot would add a named one to it)
        self.plain_curve = plot.plot([], [], symbolPen=None, symbolSize=6)
        self.speculative_curve = plot.plot([], [], symbolPen=None, symbolSize=7)
        self.plain_curve.opts["name"] = "plain decoding: one target pass a token"
        self.speculative_curve.opts["name"] = "speculative decoding (measured)"
        self.curves = (self.plain_curve, self.speculative_curve)
        self._tokens: list[int] = [0]
        self._passes: list[int] = [0]
        self._dirty = False
        self.show(False)

    def show(self, on: bool) -> None:
        for curve in self.curves:
            curve.setVisible(on)

    def reset(self) -> None:
        """No round yet: the origin only."""
        self._tokens, self._passes = [0], [0]
        self._dirty = True

    @staticmethod
    def frame(plot: pg.PlotItem, plan: RunPlan) -> None:
        top = max(1, plan.budget)
        plot.setXRange(0, top, padding=0.03)
        plot.setYRange(0, top, padding=0.05)

    def apply(self, records: Sequence[StepRecord]) -> None:
        """Each round's point: its tokens generated so far, and the target passes so far (records without a round,
        of a plain run, add none)."""
        for record in records:
            if record.speculation is not None:
                self._tokens.append(record.new_tokens)
                self._passes.append(record.speculation.target_passes_total)
                self._dirty = True

    def refresh(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        data = self.data()
        symbol = "o" if len(self._tokens) <= SYMBOL_LIMIT else None
        for curve, key in ((self.plain_curve, "plain"), (self.speculative_curve, "speculative")):
            curve.setSymbol(symbol)
            curve.setData(*data[key])

    def data(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """(tokens generated, target passes) of plain decoding (one a token) and of the speculative run."""
        tokens = np.asarray(self._tokens, dtype=np.int64)
        return {"plain": (tokens, tokens.copy()), "speculative": (tokens, np.asarray(self._passes, dtype=np.int64))}

    def set_theme(self, theme: Theme) -> None:
        # amber: a pass a token, the costly way (as "without cache" is amber); the drafts' own colour for speculation
        for curve, colour, style in ((self.plain_curve, theme.amber, Qt.PenStyle.DashLine),
                                     (self.speculative_curve, theme.drafted, Qt.PenStyle.SolidLine)):
            curve.setPen(pg.mkPen(colour, width=3, style=style))
            curve.setSymbolBrush(colour)
            curve.scatter.setBrush(colour)  # the legend's sample reads it, before the first point too
