"""Images of the views for slides (PNG, SVG, PDF, with a caption): the File > Export... dialog and `kvviz export`.

- `caption`: the caption and the default file names;
- `render`: the views painted into PNG, SVG and PDF bytes, `export_widget`;
- `svg_repair`: Qt's SVG output made viewer-proof;
- `files`: formats, targets, `parse_formats`, `ExportError`, atomic writes;
- `dialog`: `ExportDialog` and its remembered `ExportSettings`; `choices`: its menus, file names and sizes;
- `window_export`: `export_from_window` (File > Export... from the main window) and where the file went;
- `headless`: `run_export`, the `kvviz export` command;
- `animation`: `run_animation` (`kvviz export --animate`) and `write_animation`, a GIF and an MP4 of a view
  step by step, through `encoders` (Pillow, PyAV);
- `slides`: `export_lesson`, a lesson as 16:9 slides (a PNG each, one PDF deck), `kvviz lesson --export`;
  `slide_layout` paints a slide, `slide_stage` lays out the views it shows, in type large enough for a hall.

Importing this package loads Qt but never torch (the engine loads inside `run_export` and `export_lesson`).
"""

from kvviz.app.export.animation import (
    ANIMATION_FORMATS,
    AnimationCancelled,
    AnimationSource,
    AnimationSpec,
    animation_file_name,
    run_animation,
    write_animation,
)
from kvviz.app.export.caption import default_file_name, make_caption, shorten_caption
from kvviz.app.export.dialog import ExportDialog, ExportSettings
from kvviz.app.export.files import (
    DEFAULT_PNG_WIDTH,
    FORMAT_FILTERS,
    FORMAT_LABELS,
    FORMATS,
    MAX_PNG_WIDTH,
    MIN_PNG_WIDTH,
    TARGET_LABELS,
    TARGETS,
    ExportError,
    export_format,
    parse_formats,
)
from kvviz.app.export.headless import ensure_application, run_export
from kvviz.app.export.render import export_widget, png_size, render_png
from kvviz.app.export.slide_layout import SLIDE_SIZE
from kvviz.app.export.slides import DECK_NAME, LESSON_FORMATS, export_lesson, slide_file_name
from kvviz.app.export.window_export import export_from_window

__all__ = [
    "ANIMATION_FORMATS",
    "DECK_NAME",
    "DEFAULT_PNG_WIDTH",
    "FORMATS",
    "FORMAT_FILTERS",
    "FORMAT_LABELS",
    "LESSON_FORMATS",
    "MAX_PNG_WIDTH",
    "MIN_PNG_WIDTH",
    "SLIDE_SIZE",
    "TARGETS",
    "TARGET_LABELS",
    "AnimationCancelled",
    "AnimationSource",
    "AnimationSpec",
    "ExportDialog",
    "ExportError",
    "ExportSettings",
    "animation_file_name",
    "default_file_name",
    "ensure_application",
    "export_lesson",
    "export_format",
    "export_from_window",
    "export_widget",
    "make_caption",
    "parse_formats",
    "png_size",
    "render_png",
    "run_animation",
    "run_export",
    "shorten_caption",
    "slide_file_name",
    "write_animation",
]
