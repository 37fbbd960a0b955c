"""`kvviz serve-trace`: requests that arrive over time, served pass by pass by a scheduler (a token budget a pass,
chunked prefill mixed with decode steps, preemption by recompute) from a paged cache whose blocks outlive their
requests (a prefix cache by block hash or radix tree); each request against its solo run, and the same trace
without the prefix cache, without chunking and as the all-at-once batch, in turns."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from kvviz.cli import json_output as cli_json
from kvviz.core.errors import visible

MAX_BLOCKS = 65_536
MAX_PASS_TOKENS = 65_536
MAX_REPEAT = 20


def add_serve_trace(commands, add_model: Callable, add_sampling: Callable, add_dtype: Callable,
                    add_device: Callable, whole_number: Callable, path_text: Callable) -> None:
    """The `serve-trace` subcommand's options (the parser module's helpers passed in: it imports this one)."""
    from kvviz.core.serve_records import PREFIX_CACHES

    p = commands.add_parser(
        "serve-trace", help="serve requests that arrive over time: a scheduler, chunked prefill, a prefix cache",
        description="Serve a trace of requests that arrive over time (JSON lines of {arrive_at_pass, prompt, "
                    "max_new_tokens}; the built-in one without --trace) as serving engines do: a scheduler admits "
                    "requests while blocks are free, mixes prefill chunks with decode steps under a token budget "
                    "a pass, and preempts the youngest request (to compute it again) when the pool runs out; "
                    "finished requests' blocks stay cached for later prefixes. Each request is checked against "
                    "its solo run, and the trace is timed without the prefix cache, without chunking and as "
                    "the all-at-once batch, in turns.")
    add_model(p)
    p.add_argument("--trace", type=path_text, default=None, metavar="FILE",
                   help="a JSON-lines trace (default: the built-in one: a shared system prompt, follow-ups of one "
                        "conversation, a long document)")
    p.add_argument("--prefix-cache", choices=PREFIX_CACHES, default="radix",
                   help="keep finished requests' blocks for later prefixes: radix (SGLang: token by token, leaves "
                        "evicted first; the default), hash (vLLM: whole blocks by hash), off")
    p.add_argument("--chunk", type=whole_number(0, MAX_PASS_TOKENS), default=16, metavar="N",
                   help="prompt tokens a request prefills in one pass at most (default: 16; 0: a whole prompt at "
                        "once)")
    p.add_argument("--max-batched-tokens", type=whole_number(1, MAX_PASS_TOKENS), default=256, metavar="N",
                   help="tokens one pass feeds, decode steps and prefill chunks together (default: 256)")
    p.add_argument("--block-size", type=whole_number(1, 256), default=16, metavar="B",
                   help="positions per block of the paged cache (default: 16)")
    p.add_argument("--blocks", type=whole_number(1, MAX_BLOCKS), default=64, metavar="N",
                   help="blocks in the pool (default: 64); a small pool makes the scheduler preempt")
    p.add_argument("--repeat", type=whole_number(1, MAX_REPEAT), default=3, metavar="R",
                   help=f"time every variant R times, taking turns, and report medians (default: 3; at most "
                        f"{MAX_REPEAT})")
    add_sampling(p)
    add_dtype(p)
    add_device(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the text")


def run_serve_trace(args: argparse.Namespace, load: Callable, say: Callable[[str], None]) -> int:
    """Read and check the trace before the model loads, plan it before anything runs, then serve and measure."""
    from kvviz.core.trace import read_trace
    from kvviz.engine.engine import Engine, SamplingSettings
    from kvviz.engine.scheduler import plan_trace
    from kvviz.measure.serve_trace import measure_trace

    trace = read_trace(args.trace)  # TraceError: one line, status 2, no model loaded
    loaded = load(args.model, args.device, args.dtype)
    engine = Engine(loaded.model, loaded.tokenizer, device=args.device)
    sampling = SamplingSettings(args.temperature, args.top_k, args.seed)
    plan = plan_trace(engine, trace, args.block_size, args.blocks, args.prefix_cache, args.chunk,
                      args.max_batched_tokens, sampling, loaded.name)
    engine.warm_up()
    report = measure_trace(engine, trace, plan, sampling, args.repeat, say if not args.json else None)
    out = _report(report, engine, args)
    if args.json:
        print(cli_json.dumps(out))
        return 0
    _print(out)
    return 0


def _report(report, engine, args: argparse.Namespace) -> dict:
    plan, m, last = report.plan, report.measure, report.records[-1]
    requests = []
    for r, rm, out, same, diff in zip(plan.requests, m.requests, last.outputs, report.identical,
                                      report.largest_logit_diff, strict=True):
        requests.append({
            "name": r.name, "arrive_at_pass": r.arrive_at_pass, "prompt_tokens": len(r.prompt_ids),
            "new_tokens": r.budget, "output_ids": list(out), "text": engine.tokenizer.decode(list(out)),
            "identical_to_solo": same, "max_abs_logit_diff_vs_solo": diff,
            "cached_tokens": rm.cached_tokens, "prefill_tokens": rm.prefill_tokens,
            "first_token_passes": rm.first_token_passes, "first_token_ms": round(rm.first_token_ms, 3),
            "mean_gap_passes": round(rm.mean_gap_passes, 3), "max_gap_passes": rm.max_gap_passes,
            "mean_gap_ms": round(rm.mean_gap_ms, 3), "max_gap_ms": round(rm.max_gap_ms, 3),
            "preemptions": rm.preemptions})
    variants = {v.name: {"passes": v.passes, "prefill_tokens": v.prefill_tokens, "cached_tokens": v.cached_tokens,
                         "preemptions": v.preemptions, "seconds": round(v.seconds, 4),
                         "tokens_per_second": round(v.tokens_per_second, 2),
                         "long_prefill_gap_ms": None if v.long_prefill_gap_ms is None else
                         round(v.long_prefill_gap_ms, 3),
                         "turns_seconds": [round(t, 4) for t in v.turns_seconds], "note": v.note}
                for v in report.variants}
    return {
        "model": plan.model_name, "trace": args.trace or "built-in", "prefix_cache": plan.prefix_cache,
        "chunk": plan.chunk, "max_batched_tokens": plan.max_batched_tokens, "block_size": plan.block_size,
        "pool_blocks": plan.num_blocks, "sampling": plan.sampling, "repeat": report.repeat,
        "requests": requests, "passes": m.passes, "tokens": m.tokens, "prompt_tokens": m.prompt_tokens,
        "prefill_tokens": m.prefill_tokens, "cached_tokens": m.cached_tokens, "hit_rate": round(m.hit_rate, 4),
        "preemptions": m.preemptions, "evicted_blocks": m.evicted_blocks,
        "long_prefill_gap_ms": round(m.long_prefill_gap_ms, 3), "long_prefill_gap_passes": m.long_prefill_gap_passes,
        "comparison": variants,
        "prefill_tokens_cut": round(report.prefill_cut, 4),
        "long_prefill_gap_cut": None if report.gap_cut is None else round(report.gap_cut, 3),
        "all_identical_to_solo": all(report.identical),
        "dtype": args.dtype, "device": args.device,
    }


def _print(out: dict) -> None:
    cache = {"radix": "a radix tree", "hash": "block hashes", "off": "no prefix cache"}[out["prefix_cache"]]
    chunk = f"chunks of {out['chunk']}" if out["chunk"] else "whole prompts"
    print(f"{out['model']}: {len(out['requests'])} requests, {out['passes']} passes; {cache}, {chunk}, "
          f"{out['max_batched_tokens']} tokens a pass, {out['pool_blocks']} blocks of {out['block_size']}")
    for r in out["requests"]:
        same = "same as alone" if r["identical_to_solo"] else "DIFFERS from its run alone"
        print(f"  {r['name']} (pass {r['arrive_at_pass']}, {r['prompt_tokens']} prompt tokens, "
              f"{r['cached_tokens']} cached): first token after {r['first_token_passes']} passes "
              f"({r['first_token_ms']:.1f} ms), gaps up to {r['max_gap_passes']} passes ({r['max_gap_ms']:.1f} ms)"
              f"{', preempted ' + str(r['preemptions']) + 'x' if r['preemptions'] else ''}; {same}, max "
              f"|Δlogit| {r['max_abs_logit_diff_vs_solo']:.2g}")
        print(f"    {visible(r['text'])}")
    print(f"prefill: {out['prefill_tokens']} of {out['prompt_tokens']} prompt tokens computed, "
          f"{out['cached_tokens']} found cached (hit rate {out['hit_rate']:.0%}); {out['preemptions']} preempted, "
          f"{out['evicted_blocks']} cached blocks evicted")
    print(f"comparison (medians of {out['repeat']} turns each):")
    for name, v in out["comparison"].items():
        gap = "" if v["long_prefill_gap_ms"] is None else f", longest gap while the long prompt prefills " \
                                                            f"{v['long_prefill_gap_ms']:.1f} ms"
        print(f"  {name}: {v['passes']} passes, {v['prefill_tokens']} prefill tokens, "
              f"{v['tokens_per_second']:.1f} tok/s{gap}{' (' + v['note'] + ')' if v['note'] else ''}")
    cut = out["long_prefill_gap_cut"]
    print(f"the prefix cache cuts prefill tokens by {out['prefill_tokens_cut']:.0%}"
          + (f"; chunking cuts the longest gap {cut:.2f}x" if cut else ""))
