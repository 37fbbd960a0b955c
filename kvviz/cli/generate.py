"""`kvviz generate`: a run of the engine, its text printed as it comes, or one JSON object (with `--attention`,
the newest query's attention weights for every generated token)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from kvviz.cli import json_output as cli_json
from kvviz.cli.parser import UsageError
from kvviz.core.errors import visible


def run_generate(args: argparse.Namespace, load: Callable, say: Callable[[str], None]) -> int:
    """Generate from `args` (loading the model with `load`, notes on stderr through `say`): the text as it
    comes, or one JSON object."""
    import codecs

    from kvviz.cli import speculative
    from kvviz.cli.compare import broken_cache_note
    from kvviz.cli.eviction import evict_fields, evict_json, evicted_positions, kv_layout_fields
    from kvviz.core.counting import plural
    from kvviz.core.records import RunRequest
    from kvviz.engine.engine import Engine
    from kvviz.engine.run import start_run

    if args.break_cache and args.no_cache:
        raise UsageError("--break-cache breaks the KV cache, so it needs one: leave out --no-cache")
    if args.attention and not args.json:
        raise UsageError("--attention goes with --json")
    loaded = load(args.model, args.device, args.dtype)
    engine = Engine(loaded.model, loaded.tokenizer, device=args.device)
    speculative.attach(args, engine, say)
    use_cache = not args.no_cache
    request = RunRequest(0, args.prompt, use_cache, args.max_new_tokens, args.temperature, args.top_k, args.seed,
                         break_cache=args.break_cache, attention=args.attention, window=args.window,
                         sinks=args.sinks, kv_dtype=args.kv_dtype or "", **speculative.request_fields(args),
                         **evict_fields(args), **kv_layout_fields(args))
    # The whole request is checked before the prompt is echoed: an error is never glued to it.
    run = start_run(engine, request, loaded.name, top_candidates=1)
    prompt_ids, fault = list(run.plan.prompt_ids), run.plan.cache_fault
    ids: list[int] = []
    evicted: list[list[int]] = []  # per pass of a cached run: the positions it evicted from the cache
    attention = []  # per generated token, its pass's AttentionWeights (with --attention)
    rounds = []  # speculative decoding: each target pass's round
    last = None
    text_stream = codecs.getincrementaldecoder("utf-8")(errors="replace")  # tokens may split a character
    started = time.perf_counter()
    # on a terminal, a control character the model writes (ESC, BEL) is shown as an escape, never obeyed
    shown = (lambda text: visible(text, keep="\n\t")) if sys.stdout.isatty() else (lambda text: text)
    if not args.json:
        if fault:
            print(broken_cache_note(fault))
        sys.stdout.write(shown(args.prompt))
        sys.stdout.flush()
    for record in run.passes():
        last = record
        evicted.append(evicted_positions(record))
        if record.speculation is not None:
            rounds.append(speculative.round_json(record))
        if record.token_id is not None:
            new = record.speculation.token_ids if record.speculation is not None else (record.token_id,)
            ids.extend(new)
            if record.attention is not None:
                attention.append(record.attention)
            if not args.json:
                for token in new:
                    sys.stdout.write(shown(text_stream.decode(engine.tokenizer.token_bytes(token))))
                sys.stdout.flush()
    seconds = time.perf_counter() - started
    assert last is not None
    text = engine.tokenizer.decode(ids)
    if args.json:
        # per generated token: a list per layer, of a list per head, of a weight per position (outside the timing)
        extra = {"attention": [weights.as_lists() for weights in attention]} if args.attention else {}
        if attention and attention[0].sinks:  # learned sinks (gpt-oss): each head's sink share, per layer
            extra["attention_sink_shares"] = [[[weights.sink_share(layer, head) for head in range(weights.heads)]
                                               for layer in range(weights.layers)] for weights in attention]
        print(cli_json.dumps({
            "model": loaded.name,
            "prompt": args.prompt,
            "prompt_ids": prompt_ids,
            "output_ids": ids,
            "text": text,
            "cache": use_cache,
            "dtype": args.dtype,
            "break_cache": bool(fault),
            "kv_computed_per_layer": last.kv_computed_total,
            "kv_without_cache_per_layer": last.without_cache_total,
            "kv_with_cache_per_layer": last.with_cache_total,
            "layers": last.n_layer,
            "forward_passes": last.step + 1,
            "stop_reason": last.stop_reason,
            "cache_bytes": last.cache_bytes,
            "kv_dtype": run.plan.policy.kv_dtype or None,
            "kv_layout": run.plan.policy.kv_layout or None,  # "kivi": keys per channel in groups of kv_residual
            "kv_residual": run.plan.policy.kv_residual or None,
            "window": run.plan.policy.window,
            "sinks": run.plan.policy.sinks,
            "positions_held": last.positions_held,  # the top layer's: a windowed one where the model has a window
            "positions_held_per_layer": list(last.layer_positions_held) or None,
            "cache_bytes_per_layer": list(last.layer_bytes) or None,  # measured, from the bottom layer
            "layer_kinds": [run.plan.layer_kind(i) for i in range(last.n_layer)],
            "cache_precision": last.cache_precision or None,
            "evicted_per_pass": evicted if run.plan.policy.evicts and use_cache else None,
            **(evict_json(run.plan.policy, last) if run.plan.policy.importance else {}),
            "seconds": round(seconds, 4),
            "tokens_per_second": round(len(ids) / seconds, 3) if seconds > 0 else None,
            "temperature": args.temperature,
            "top_k": args.top_k,
            "seed": args.seed,
            "device": args.device,
            **({**speculative.summary_json(run.plan, last), "rounds": rounds} if rounds else {}),
            **extra,
        }))
    else:
        print(shown(text_stream.decode(b"", final=True)))
    sys.stdout.flush()  # the text ends its line before the note below
    if last.stop_reason == "context_full" and run.plan.policy.sinks:
        say(f"stopped after {plural(len(ids), 'new token')}: {loaded.name}'s positions are learned, up to "
            f"{engine.n_ctx}; attention sinks take a RoPE model past its context, not this one")
    elif last.stop_reason == "context_full":
        say(f"stopped after {plural(len(ids), 'new token')}: the model's context holds {engine.n_ctx} tokens")
    return 0
