"""Speculative decoding on the command line: the options (`--draft`, `--prompt-lookup`, `--draft-tokens`) that
`generate`, `compare` and `bench` share, the draft model's loading, each round as JSON, and `compare --draft`: plain
decoding against speculative decoding of the same target, in lockstep by token."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from kvviz.cli.arguments import _no_nul, whole_number
from kvviz.core.speculation import MAX_DRAFT_TOKENS, MAX_PROMPT_LOOKUP

DEFAULT_DRAFT_TOKENS = 4  # k when --draft or --prompt-lookup comes without --draft-tokens


def add_speculative(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--draft", type=_no_nul, default=None, metavar="M",
                        help="decode speculatively: the draft model M (any --model value with the target's "
                             "tokenizer, e.g. kvviz-shakespeare-draft) proposes tokens, the target checks them all "
                             "in one pass and keeps those it agrees with; the same tokens, fewer target passes")
    parser.add_argument("--prompt-lookup", type=whole_number(1, MAX_PROMPT_LOOKUP), default=None, metavar="N",
                        help="decode speculatively, drafting by prompt lookup: the tokens that followed the last "
                             "N-gram (or a shorter one) where it occurred earlier in the text; no draft model")
    parser.add_argument("--draft-tokens", type=whole_number(1, MAX_DRAFT_TOKENS), default=None, metavar="K",
                        help=f"with --draft or --prompt-lookup: tokens drafted a round, 1 to {MAX_DRAFT_TOKENS} "
                             f"(default: {DEFAULT_DRAFT_TOKENS})")


def speculative(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "draft", None) or getattr(args, "prompt_lookup", None))


def request_fields(args: argparse.Namespace) -> dict:
    """The RunRequest fields of the drafter `args` ask for ({} for plain decoding)."""
    if not speculative(args):
        return {}
    return {"draft_tokens": args.draft_tokens or DEFAULT_DRAFT_TOKENS, "prompt_lookup": args.prompt_lookup or 0,
            "draft_model": args.draft or ""}


def attach(args: argparse.Namespace, engine, say: Callable[[str], None]) -> None:
    """Load `--draft` beside the target of `engine` (nothing for prompt lookup)."""
    if getattr(args, "draft", None):
        import torch

        from kvviz.sources.weights import attach_draft

        loaded = attach_draft(engine, args.draft, getattr(torch, getattr(args, "dtype", "float32")), args.device)
        say(f"draft model: {loaded.name}, {loaded.num_parameters:,} parameters")


def round_json(record) -> dict:
    """One round of a speculative run, as `generate --json` lists it."""
    r = record.speculation
    return {"round": r.round, "start": r.start, "drafted": list(r.drafted), "accepted": r.accepted,
            "accepted_tokens": list(r.drafted[:r.accepted]), "rolled_back": list(r.drafted[r.accepted:]),
            "rolled_back_positions": list(range(*r.rolled_back)), "tokens": list(r.token_ids),
            "draft_passes": r.draft_passes, "positions_held": record.positions_held}


def summary_json(plan, last) -> dict:
    """The whole speculative run, as `generate --json` and `bench --json` report it."""
    r = last.speculation
    return {"drafter": plan.drafter.describe(), "draft_tokens": plan.drafter.k,
            "prompt_lookup": plan.drafter.lookup or None, "draft_model": plan.drafter.model_name or None,
            "target_passes": r.target_passes_total, "draft_passes": r.draft_passes_total,
            "drafted": r.drafted_total, "accepted": r.accepted_total,
            "rolled_back": r.drafted_total - r.accepted_total,
            "acceptance_rate": None if r.acceptance_rate is None else round(r.acceptance_rate, 4),
            "tokens_per_target_pass": round(r.tokens_per_target_pass, 4)}


def run_compare_draft(args: argparse.Namespace, load: Callable, say: Callable[[str], None]) -> int:
    """`kvviz compare --draft/--prompt-lookup`: plain cached decoding and speculative decoding of the same target
    and request, side by side a token at a time: each run's token, the pass that gave it, and for the speculative
    run whether a draft or the target's own choice; then the passes each took."""
    from kvviz.cli import json_output
    from kvviz.core.records import RunRequest
    from kvviz.engine.engine import Engine
    from kvviz.engine.run import start_run

    loaded = load(args.model, args.device, args.dtype)
    engine = Engine(loaded.model, loaded.tokenizer, device=args.device)
    attach(args, engine, say)
    base = dict(temperature=args.temperature, top_k=args.top_k, seed=args.seed, window=args.window,
                sinks=args.sinks, kv_dtype=args.kv_dtype or "")
    plain = start_run(engine, RunRequest(0, args.prompt, True, args.new_tokens, **base), loaded.name, top_candidates=1)
    fast = start_run(engine, RunRequest(1, args.prompt, True, args.new_tokens, **base, **request_fields(args)),
                     loaded.name, top_candidates=1)
    plain_tokens = [(r.token_id, r.step + 1) for r in plain.passes() if r.token_id is not None]
    rows, last = [], None
    for record in fast.passes():
        last, r = record, record.speculation
        for i, token in enumerate(r.token_ids):
            rows.append((token, r.round + 1, "draft" if i < r.accepted else "target"))
    lines = []
    for i, ((mine, mine_pass), (theirs, pass_, source)) in enumerate(zip(plain_tokens, rows, strict=False)):
        lines.append({"token": i + 1, "plain_id": mine, "plain_pass": mine_pass, "speculative_id": theirs,
                      "speculative_pass": pass_, "from": source, "same": mine == theirs,
                      "text": engine.tokenizer.token_label(theirs)})
    same = len(plain_tokens) == len(rows) and all(line["same"] for line in lines)
    summary = {"model": loaded.name, "prompt": args.prompt, "tokens_identical": same,
               "plain_target_passes": len(plain_tokens),  # that chose a token (a last one fills the cache)
               **summary_json(fast.plan, last), "sampling": fast.plan.sampling}
    if args.json:
        print(json_output.dumps({**summary, "tokens": lines}))
        return 0
    print(f"{'token':>5}  {'plain pass':>10}  {'spec. pass':>10}  {'from':<6}  text")
    for line in lines:
        mark = "" if line["same"] else "   <- the runs part here"
        print(f"{line['token']:>5}  {line['plain_pass']:>10}  {line['speculative_pass']:>10}  {line['from']:<6}  "
              f"{line['text']!r}{mark}")
    rate = summary["acceptance_rate"]
    print(f"plain: {summary['plain_target_passes']} target passes; speculative ({summary['drafter']}): "
          f"{summary['target_passes']} target passes and {summary['draft_passes']} draft passes, "
          f"{summary['accepted']} of {summary['drafted']} drafts accepted"
          f"{'' if rate is None else f' ({rate:.0%})'}, {summary['tokens_per_target_pass']:.2f} tokens a target pass")
    if args.temperature:  # each run draws from its own generator, in its own order: their samples may differ
        print("sampled: both runs draw from the target's distribution, in another order, so their tokens may differ")
        return 0
    print("the tokens are identical" if same else "the tokens differ: greedy speculative decoding must never change "
          "them (a bug)")
    return 0 if same else 1
