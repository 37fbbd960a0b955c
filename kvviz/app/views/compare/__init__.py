"""Compare mode's views: the two grids' view, time plot, counts, identity strip, banner."""
