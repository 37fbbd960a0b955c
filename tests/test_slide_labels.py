"""Every slide of the five built-in decks, read as a 1920x1080 slide receives it (issue #36, section 7): each label
lies inside the slide and inside the part of the view that draws it (nothing clipped), no two labels' ink overlaps,
no scroll bar is printed, and no text is smaller than 2.5 % of the slide's height (27 pixels).

The decks are exported as the command line exports them (`kvviz lesson --export`, PDF only: the slides are painted
once more into a device that keeps their texts, as `slide_png` paints them). kv-cache's deck is read in
test_cli_lesson.py, from the export of the README's command."""

from __future__ import annotations

import pytest
from helpers_text import TextRecorder, slide_problems
from PySide6.QtWidgets import QScrollBar

from kvviz.app.export import slide_layout
from kvviz.app.export.slides import export_lesson
from kvviz.lessons.lesson import BUILTIN_LESSONS, load_lesson

WIDTH, HEIGHT = 1920, 1080



# the first, kv-cache, is read in test_cli_lesson.py from the README's own export of it (one export, not two)
@pytest.fixture(scope="module", params=list(BUILTIN_LESSONS)[1:])
def deck(request, tmp_path_factory, monkeypatch_module):
    """(name, [(slide number, texts, scroll bars shown)]) of built-in lesson `request.param`."""
    slides = []
    painted = slide_layout.Deck.add

    def recording(self, text, view):
        recorder = TextRecorder(WIDTH, HEIGHT)
        slide_layout.paint_slide_scaled(recorder, text, view, WIDTH / slide_layout.SLIDE_SIZE[0])
        bars = [bar for bar in view.findChildren(QScrollBar) if bar.isVisibleTo(view) and bar.maximum() > 0]
        slides.append((len(slides) + 1, recorder.texts, len(bars)))
        return painted(self, text, view)

    monkeypatch_module.setattr(slide_layout.Deck, "add", recording)
    export_lesson(load_lesson(request.param), tmp_path_factory.mktemp(request.param), "pdf")
    return request.param, slides


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_every_slide_of_every_built_in_deck_is_readable_and_whole(deck):
    name, slides = deck
    assert slides, name
    for number, texts, bars in slides:
        assert len(texts) > 20, (name, number)  # the views were drawn
        found = slide_problems(texts, bars, WIDTH, HEIGHT)
        assert not found, (name, number, found[:8])
