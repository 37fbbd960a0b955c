"""Options that cannot go together, refused in one line as soon as the command line is read, before any model
loads: one table for every command, so that no option is ever silently ignored by one command and refused by
another."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from kvviz.cli.eviction import evict_refusal
from kvviz.cli.parser import UsageError


def _given(args: argparse.Namespace, name: str) -> bool:
    value = getattr(args, name, None)
    return value not in (None, False, 0, "")


def _speculative(args: argparse.Namespace) -> bool:
    return _given(args, "draft") or _given(args, "prompt_lookup")


@dataclass(frozen=True)
class Refusal:
    """`when(args)` on one of `commands` ("*": any) is refused with `message`."""

    commands: tuple[str, ...]
    when: Callable[[argparse.Namespace], bool]
    message: str


REFUSALS = (
    Refusal(("generate", "export"), lambda a: _given(a, "kv_dtype") and _given(a, "no_cache"),
            "--kv-dtype stores the KV cache quantized, and --no-cache runs without one: leave one out"),
    Refusal(("*",), lambda a: _given(a, "sinks") and not _given(a, "window"),
            "attention sinks go with a window: give --window too"),
    Refusal(("*",), lambda a: _given(a, "kv_dtype") and _given(a, "window"),
            "a quantized cache keeps every position: leave out the window (one trade-off at a time)"),
    Refusal(("*",), lambda a: _given(a, "kv_residual") and not _given(a, "kv_layout"),
            "--kv-residual is KIVI's group of keys: give --kv-layout kivi too"),
    Refusal(("*",), lambda a: _given(a, "kv_layout") and getattr(a, "kv_dtype", None) not in ("int8", "int4"),
            "--kv-layout kivi quantizes keys per channel and values per token in int8 or int4: give --kv-dtype int8 "
            "or int4"),
    Refusal(("bench",), lambda a: _given(a, "kv_dtype") and _given(a, "gui"),
            "--kv-dtype times a quantized cache headless: leave out --gui"),
    Refusal(("*",), lambda a: _given(a, "draft") and _given(a, "prompt_lookup"),
            "speculative decoding takes one drafter: --draft or --prompt-lookup, not both"),
    Refusal(("*",), lambda a: _given(a, "draft_tokens") and not (_given(a, "draft") or _given(a, "prompt_lookup")),
            "--draft-tokens is how many tokens a drafter proposes: give --draft or --prompt-lookup too"),
    Refusal(("*",), lambda a: _speculative(a) and (_given(a, "no_cache") or _given(a, "break_cache")),
            "speculative decoding checks drafts against the target's KV cache: leave out --no-cache and "
            "--break-cache"),
    Refusal(("generate",), lambda a: _speculative(a) and _given(a, "attention"),
            "--attention records one query a pass; a speculative pass has many: leave out one of them"),
    Refusal(("bench",), lambda a: _speculative(a) and any(_given(a, o) for o in ("gui", "sweep", "peer", "kv_dtype")),
            "bench --draft or --prompt-lookup times speculative against plain cached decoding headless: leave out "
            "--gui, --sweep, --peer and --kv-dtype"),
)


def check_options(args: argparse.Namespace) -> None:
    """UsageError (one line, status 2) for the first refused combination of options on `args.command`."""
    refusal = evict_refusal(args)
    if refusal:
        raise UsageError(refusal)
    for refusal in REFUSALS:
        if ("*" in refusal.commands or args.command in refusal.commands) and refusal.when(args):
            raise UsageError(refusal.message)
