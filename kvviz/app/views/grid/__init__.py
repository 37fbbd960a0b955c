"""The K/V grid: the view, what it knows of each cell, its rows, cells and title."""
