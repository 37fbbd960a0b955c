"""The caption drawn above an exported view, and the file names exports get. Qt-free."""

from __future__ import annotations

import re

CAPTION_PROMPT_CHARS = 100  # longer prompts are elided in the caption
CAPTION_MAX_CHARS = 300


def _elide_prompt(prompt: str) -> str:
    text = " ".join(prompt.split())
    return text if len(text) <= CAPTION_PROMPT_CHARS else text[: CAPTION_PROMPT_CHARS - 1].rstrip() + "\u2026"


def quoted_prompt(caption: str) -> tuple[str, str] | None:
    """(the prompt, the rest) of a caption that starts with its quoted prompt (“prompt” — model, ...), else None."""
    match = re.match(r"^\u201c(.*)\u201d(.*)$", caption, re.DOTALL)
    return (match.group(1), match.group(2)) if match else None


def shorten_caption(caption: str) -> str:
    """A caption that fits a few lines: the quoted prompt at its head elided, whitespace collapsed."""
    parts = quoted_prompt(caption)
    if parts:
        caption = f"\u201c{_elide_prompt(parts[0])}\u201d{parts[1]}"
    caption = " ".join(caption.split())
    return caption if len(caption) <= CAPTION_MAX_CHARS else caption[: CAPTION_MAX_CHARS - 1] + "\u2026"


def model_with_precision(model: str, dtype: str | None) -> str:
    """kvviz-shakespeare (bfloat16): the model and the number type of its weights and cache (none when None)."""
    return model if dtype is None else f"{model} ({dtype})"


def make_caption(prompt: str, model: str, step: int | None, new_tokens: int | None = None,
                 use_cache: bool | None = None, compare: bool = False, cache_broken: bool = False,
                 dtype: str | None = None) -> str:
    """The caption of an exported view: “prompt” — model (float32), step 13, 12 new tokens, with KV cache
    (a long prompt elided); with `step` None: “prompt” — model (float32), before the first step. `dtype`: the
    precision the numbers were computed in (None: not said, no model loaded). `compare`: both runs in
    lockstep; `cache_broken`: the teaching switch was on, and the caption says so."""
    parts = ["before the first step" if step is None else f"step {step}"]
    if new_tokens is not None:
        parts.append(f"{new_tokens} new token{'' if new_tokens == 1 else 's'}")
    if compare:
        mode = ", with and without KV cache in lockstep"
    else:
        mode = "" if use_cache is None else (", with KV cache" if use_cache else ", without KV cache")
    if cache_broken:
        mode += " (KV cache broken on purpose)"
    return f"\u201c{_elide_prompt(prompt)}\u201d \u2014 {model_with_precision(model, dtype)}, {', '.join(parts)}{mode}"


def default_file_name(target: str, fmt: str, step: int | None) -> str:
    """kvviz-chart-step12.png and the like; kvviz-chart.png without a step."""
    return f"kvviz-{target}" + (f"-step{step}" if step is not None else "") + f".{fmt}"
