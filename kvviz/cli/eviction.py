"""The command line's options for what a run's cache keeps: a window and sinks, a quantized cache, or eviction by
importance (`--evict`, `--budget`, SnapKV's `--observe` and `--pool`), and what the last put in a run's request."""

from __future__ import annotations

import argparse

from kvviz.cli.arguments import whole_number
from kvviz.core.policy import EVICTION_METHODS

MAX_BUDGET = 1_000_000  # far past any context: the engine refuses a budget past the model's
MAX_WINDOW = 1_000_000  # likewise for a window and sinks


def add_window(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--window", type=whole_number(1, MAX_WINDOW), default=0, metavar="W",
                        help="keep only the last W positions in the KV cache (a sliding window: older keys and "
                             "values are evicted, and no pass attends to them); default: the model's own window, "
                             "if its config.json declares one, else every position")
    parser.add_argument("--sinks", type=whole_number(1, MAX_WINDOW), default=0, metavar="S",
                        help="with --window: keep the first S positions too, as attention sinks (StreamingLLM); "
                             "a RoPE model then generates past its context length")


MAX_BLOCK_SIZE = 256  # positions a block of the paged cache holds at most, as a lesson's block_size
KV_DTYPE_NAMES = ("int8", "int4", "fp8")  # kvviz.core.records.KV_DTYPES (a test checks they agree)


def add_kv_dtype(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kv-dtype", default=None, choices=KV_DTYPE_NAMES,
                        help="store the KV cache quantized: int8, int4 (two a byte) or fp8 (e4m3), each key and "
                             "value vector with a float32 scale per token and head; it drifts from an exact "
                             "cache by the rounding (default: the weights' number type, exact)")


def add_kv_layout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kv-layout", default=None, choices=("kivi",),
                        help="with --kv-dtype int8 or int4: kivi quantizes each key channel over a group of tokens "
                             "(a scale a channel; the latest keys short of a group held exact) and each value per "
                             "token, as KIVI does")
    parser.add_argument("--kv-residual", type=whole_number(1, MAX_WINDOW), default=None, metavar="R",
                        help="with --kv-layout kivi: the tokens of a group of keys, and the most held exact (default: "
                             "32)")


def kv_layout_fields(args: argparse.Namespace) -> dict:
    """The RunRequest fields of `args`' KIVI options ({} without --kv-layout)."""
    if not getattr(args, "kv_layout", None):
        return {}
    return {"kv_layout": args.kv_layout, "kv_residual": args.kv_residual or 0}


def add_evict(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--evict", default=None, choices=tuple(EVICTION_METHODS),
                        help="keep --budget positions a layer, chosen by the attention they get: h2o (heavy hitters "
                             "and recent), tova (the newest query's least-attended goes), snapkv (an observation "
                             "window's pooled attention), pyramidkv (snapkv, fewer positions higher up)")
    parser.add_argument("--budget", type=whole_number(0, MAX_BUDGET), default=None, metavar="B",
                        help="with --evict: positions each layer keeps (pyramidkv: on average)")
    parser.add_argument("--observe", type=whole_number(1, MAX_BUDGET), default=None, metavar="W",
                        help="with --evict snapkv or pyramidkv: the latest queries whose attention decides "
                             "(default: a quarter of the budget, at most 32)")
    parser.add_argument("--pool", type=whole_number(1, MAX_BUDGET), default=None, metavar="K",
                        help="with --evict snapkv or pyramidkv: average each score over K neighbouring positions, "
                             "K odd (default: 5)")


def evict_fields(args: argparse.Namespace) -> dict:
    """The RunRequest fields of `args`' eviction options ({} without --evict)."""
    if not getattr(args, "evict", None):
        return {}
    return {"evict": args.evict, "budget": args.budget or 0, "observe": args.observe or 0, "pool": args.pool or 0}


def evict_refusal(args: argparse.Namespace) -> str:
    """Why `args`' eviction options cannot go together ("": they can)."""
    evict = getattr(args, "evict", None)
    if not evict:
        extra = next((f"--{name}" for name in ("budget", "observe", "pool") if getattr(args, name, None) is not None),
                     "")
        return f"{extra} goes with --evict: give an importance method too" if extra else ""
    if args.budget is None:
        return f"--evict {evict} keeps a budget of positions a layer: give --budget B"
    if getattr(args, "window", 0) or getattr(args, "sinks", 0) or getattr(args, "kv_dtype", None):
        return "--evict chooses what the cache keeps by importance: leave out --window, --sinks and --kv-dtype (one " \
               "trade-off at a time)"
    if any(getattr(args, name, None) for name in ("draft", "prompt_lookup")):
        return "--evict forgets positions for good, and speculative decoding rolls the cache back: leave one out"
    if getattr(args, "break_cache", False):
        return "--break-cache plants its bug in an exact cache: leave out --evict"
    return ""


def evicted_positions(record) -> list[int]:
    """The positions a pass evicted from the cache: a window's span, or those an importance method dropped from the
    last head of some layer."""
    if record.eviction is None:
        return list(range(*record.kv_evicted))
    return sorted({p for layer in record.eviction.evicted_now(record.step) for p in layer})


def evict_json(policy, last) -> dict:
    """`generate --json`'s fields of an importance method: the policy, and what each layer keeps at the end."""
    state = last.eviction
    return {"evict": policy.evict, "budget": policy.budget, "observe": policy.observe or None,
            "pool": policy.pool or None, "layer_budgets": [layer.budget for layer in state.layers],
            "kept_per_layer": [list(layer.kept()) for layer in state.layers],
            "heads_holding_per_layer": [list(layer.heads) for layer in state.layers], "score": state.score}


VARIANTS_HELP = ("with --sweep: time a cached decode step for each kind of cache listed, comma-separated: exact, "
                 "int8, int4, fp8, kivi-int8, kivi-int4 (keys per channel), window:N (the last N positions), "
                 "mla-naive, mla-absorbed (latent attention), or all; at lengths doubling up to --max-length "
                 "(default: the model's context, at most 32768), beside the bandwidth model (weights and cache "
                 "bytes over this machine's measured read rate). --kv-dtype X or --window N with --sweep time that "
                 "variant against the exact cache")


def add_variants(parser: argparse.ArgumentParser) -> None:
    """`--variants` of `kvviz bench`, and `--window` for --sweep (the other commands' --window keeps a run's)."""
    parser.add_argument("--variants", default=None, metavar="LIST", help=VARIANTS_HELP)
    parser.add_argument("--window", type=whole_number(1, MAX_WINDOW), default=0, metavar="W",
                        help="with --sweep: time a cache keeping the last W positions against the exact cache")
