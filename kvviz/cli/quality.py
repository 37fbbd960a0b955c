"""`kvviz quality`: what each cache policy costs in perplexity against the full cache, on a held-out text
(kvviz.measure.quality). Torch-free at import: the parser reads the options here."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from kvviz.cli import json_output
from kvviz.cli.arguments import path_text, whole_number
from kvviz.cli.eviction import MAX_BUDGET
from kvviz.core.errors import visible
from kvviz.measure.quality import (
    BASELINES,
    DEFAULT_BUDGETS,
    METHODS,
    STREAMING_SINKS,
    Perplexity,
    QualityError,
    QualityRow,
    QualityTable,
    heldout_ids,
    policy_for,
    quality_table,
    read_text,
    text_ids,
)

MAX_TEXT_TOKENS = 10_000_000
HELD_OUT_NAME = "the held-out passage (Julius Caesar III.2, a play the embedded models never saw)"


def _listed(parse: Callable[[str], object], what: str) -> Callable[[str], tuple]:
    """An argparse type: a comma-separated list of values `parse` takes, at least one, repeats dropped."""

    def parse_list(text: str) -> tuple:
        items = [item.strip() for item in text.split(",")]
        if not any(items):
            raise argparse.ArgumentTypeError(f"names no {what}")
        return tuple(dict.fromkeys(parse(item) for item in items if item))

    parse_list.__name__ = f"list of {what}"
    return parse_list


def _method(text: str) -> str:
    if text.lower() not in METHODS:
        raise argparse.ArgumentTypeError(f"no policy {text[:40]!r}: choose among {', '.join(METHODS)}")
    return text.lower()


def add_quality(commands, add_model: Callable[[argparse.ArgumentParser], None]) -> None:
    """The `quality` command and its options, on the parser's `commands`; `add_model` adds its --model."""
    p = commands.add_parser("quality", help="perplexity through each cache policy against the full cache",
                            description="Measure perplexity on a held-out text, teacher-forced through the KV cache "
                                        "one token a pass (as eviction papers measure it): the full cache, then "
                                        "each importance method (H2O, TOVA, SnapKV, PyramidKV) and the "
                                        "position-based baselines (a window; StreamingLLM's 4 sinks and a window) "
                                        "keeping the same budget of positions a layer. A text longer than the "
                                        "model's context runs in chunks of the context, each from position 0 in "
                                        "a fresh cache.")
    add_model(p)
    p.add_argument("--budgets", type=_listed(whole_number(1, MAX_BUDGET), "budget"), default=DEFAULT_BUDGETS,
                   metavar="LIST", help="comma-separated budgets, positions each layer keeps, 1 to the model's "
                                        f"context (default: {','.join(map(str, DEFAULT_BUDGETS))})")
    p.add_argument("--methods", type=_listed(_method, "policy"), default=METHODS, metavar="LIST",
                   help=f"comma-separated policies among {', '.join(METHODS)} (default: all); "
                        + "; ".join(f"{name}: {what}" for name, what in BASELINES.items()))
    p.add_argument("--tokens", type=whole_number(2, MAX_TEXT_TOKENS), default=None, metavar="N",
                   help="measure the first N tokens of the text (default: all of it; the held-out passage holds "
                        "1,071)")
    p.add_argument("--text", type=path_text, default=None, metavar="FILE",
                   help="a UTF-8 text file of your own instead of the held-out passage (the embedded models saw "
                        "most of Shakespeare: a text they trained on measures less than a held-out one)")
    p.add_argument("--json", action="store_true", help="print one JSON object; no progress on stderr")


def run_quality(args: argparse.Namespace, load: Callable, say: Callable[[str], None]) -> int:
    """`kvviz quality`: the table, or one JSON object; a line per measurement on stderr unless --json."""
    from kvviz.engine.engine import Engine

    text = read_text(args.text) if args.text is not None else None  # a bad file before the model loads
    loaded = load(args.model, "cpu")
    engine = Engine(loaded.model, loaded.tokenizer)
    if text is None:
        ids, source = heldout_ids(engine.tokenizer, args.tokens), HELD_OUT_NAME
    else:
        source = visible(str(args.text))
        ids = text_ids(engine.tokenizer, text, args.tokens, source)
    for budget in args.budgets:  # a policy the model refuses, before a text too short for them
        for method in args.methods:
            policy_for(engine, method, budget)
    largest = max(args.budgets)
    if len(ids) <= largest:
        raise QualityError(f"{source}: {len(ids):,} tokens, no more than the largest budget ({largest}), so no "
                           "policy would evict anything; measure more tokens than that")
    if not args.json:
        say(f"measuring {len(ids):,} tokens of {source} on {visible(loaded.name)}, one token a pass")
    table = quality_table(engine, ids, args.methods, args.budgets, model_name=loaded.name,
                          progress=None if args.json else _progress(say))
    if args.json:
        result = {**table.as_dict(), "text": "held-out" if args.text is None else str(args.text)}
        print(json_output.dumps(result))
    else:
        print(format_table(table, source))
    return 0


def _progress(say: Callable[[str], None]) -> Callable:
    def progress(done: int, total: int, row: QualityRow | None, measured: Perplexity) -> None:
        what = "full cache" if row is None else f"{row.name}, budget {row.budget}"
        say(f"[{done}/{total}] {what}: perplexity {measured.value:.3f} ({measured.seconds:.1f} s)")

    return progress


def format_table(table: QualityTable, source: str) -> str:
    """The table a person reads: a row for the full cache, then one per policy and budget."""
    lines = [f"kvviz quality: {visible(table.model)}, {table.tokens:,} tokens of {source}",
             f"{table.full.tokens:,} predicted, teacher-forced one token a pass, in chunks of {table.chunk} positions "
             "(each from position 0, a fresh cache)",
             "",
             f"{'policy':<14}{'budget':>7}{'perplexity':>12}{'Δ vs full':>12}{'ratio':>9}",
             f"{'full cache':<14}{'all':>7}{table.full.value:>12.3f}"]
    budget = None
    for row in table.rows:
        if row.budget != budget and budget is not None:
            lines.append("")
        budget = row.budget
        lines.append(f"{row.name:<14}{row.budget:>7}{row.perplexity.value:>12.3f}{row.delta:>+12.3f}"
                     f"{row.ratio:>8.3f}x")
    lines += ["", "budget B: the positions each layer keeps (PyramidKV: on average); window: the last B;",
              f"StreamingLLM: the first {STREAMING_SINKS} (sinks) and the last B - {STREAMING_SINKS}.",
              "Δ: the perplexity minus the full cache's; ratio: the perplexity over the full cache's."]
    return "\n".join(lines)
