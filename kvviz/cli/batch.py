"""`kvviz batch`: several requests decoded together from a paged KV cache with prefix sharing, then the same
requests one at a time, in the same run: their tokens, the blocks, the bytes and both speeds."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from kvviz.cli import json_output as cli_json
from kvviz.cli.parser import UsageError
from kvviz.core.errors import KvvizError, visible


def batch_prompts(args: argparse.Namespace) -> list[str]:
    """The prompts of `--prompt` and `--prompts-file`, in that order (UsageError when there are none)."""
    from kvviz.core.files import MAX_PROMPTS, read_prompts

    prompts = list(args.prompt or [])
    if args.prompts_file is not None:
        try:
            prompts += read_prompts(args.prompts_file)
        except KvvizError as exc:
            raise UsageError(str(exc)) from None
    if not prompts:
        raise UsageError("no prompt: give --prompt TEXT (once per request) or --prompts-file FILE")
    if len(prompts) > MAX_PROMPTS:
        raise UsageError(f"{len(prompts)} prompts (--prompt and --prompts-file together); a batch takes at most "
                         f"{MAX_PROMPTS}")
    empty = [i for i, p in enumerate(prompts, 1) if not p.strip()]
    if empty:
        raise UsageError(f"prompt {empty[0]} is empty; every request of a batch needs text to continue")
    return prompts


def run_batch_command(args: argparse.Namespace, load: Callable, say: Callable[[str], None]) -> int:
    """Plan the batch before anything runs, then run it batched and one at a time."""
    from kvviz.engine.engine import Engine, SamplingSettings
    from kvviz.engine.serving import measure_speed, plan_batch, run_batch, run_one_at_a_time

    prompts = batch_prompts(args)
    loaded = load(args.model, args.device, args.dtype)
    engine = Engine(loaded.model, loaded.tokenizer, device=args.device)
    sampling = SamplingSettings(args.temperature, args.top_k, args.seed)
    ids = [engine.encode_prompt(p) for p in prompts]
    plan = plan_batch(engine, ids, args.new_tokens, args.block_size, not args.no_prefix_sharing, sampling,
                      texts=prompts, model_name=loaded.name)
    engine.warm_up()
    solo_logits: dict[tuple[int, int], object] = {}
    seen = [0] * len(prompts)

    def keep(request: int, logits) -> None:
        solo_logits[request, seen[request]] = logits.detach().float().clone()
        seen[request] += 1

    solo_outputs, solo_seconds = run_one_at_a_time(engine, plan, sampling, keep)
    largest = [0.0] * len(prompts)
    step_of = [0] * len(prompts)

    def against_solo(request: int, logits) -> None:
        solo = solo_logits.get((request, step_of[request]))
        if solo is not None:
            largest[request] = max(largest[request], float((logits.float() - solo).abs().max()))
        step_of[request] += 1

    records = list(run_batch(engine, plan, sampling, against_solo))
    solo_logits.clear()
    speed = measure_speed(engine, plan, args.repeat, sampling, first=(sum(r.seconds for r in records), solo_seconds))
    last = records[-1]
    tps, sequential_tps = speed.tokens_per_second, speed.sequential_tokens_per_second
    tokens = sum(r.budget for r in plan.requests)
    batch_seconds, solo_seconds = tokens / tps, tokens / sequential_tps
    report = {
        "model": loaded.name,
        "requests": [{"prompt": r.prompt, "prompt_ids": list(r.prompt_ids), "output_ids": list(out),
                      "text": engine.tokenizer.decode(list(out)), "blocks": list(table),
                      "identical_to_solo": list(out) == solo,
                      "max_abs_logit_diff_vs_solo": largest[r.index]}
                     for r, out, table, solo in zip(plan.requests, last.outputs, last.tables, solo_outputs,
                                                    strict=True)],
        "new_tokens": args.new_tokens,
        "block_size": plan.block_size,
        "prefix_sharing": plan.share_prefixes,
        "pool_blocks": plan.num_blocks,
        "blocks_used": last.blocks_used,
        "blocks_shared": last.blocks_shared,
        "blocks_unshared": plan.blocks_unshared,
        "copy_on_write_copies": last.copies,
        "bytes_per_position": plan.bytes_per_position,
        "paged_bytes": last.paged_bytes,
        "paged_fragmentation_bytes": last.paged_fragmentation_bytes,
        "contiguous_reserved_bytes": plan.contiguous_reserved_bytes,
        "contiguous_fragmentation_bytes": plan.contiguous_reserved_bytes - last.used_bytes,
        "used_bytes": last.used_bytes,
        "forward_passes": last.step + 1,
        "repeat": args.repeat,
        "seconds": round(batch_seconds, 4),
        "sequential_seconds": round(solo_seconds, 4),
        "tokens_per_second": round(tps, 3) if tps else None,
        "sequential_tokens_per_second": round(sequential_tps, 3) if sequential_tps else None,
        "speedup": round(tps / sequential_tps, 3) if tps and sequential_tps else None,
        "speedup_turns": [round(ratio, 3) for ratio in speed.turn_speedups],
        "speedup_clear": speed.speedup_clear,
        "dtype": args.dtype,
        "device": args.device,
    }
    if args.json:
        print(cli_json.dumps(report))
        return 0
    for entry in report["requests"]:
        same = "same as alone" if entry["identical_to_solo"] else "DIFFERS from its run alone"
        print(f"{visible(entry['prompt'])}{visible(entry['text'])}")
        print(f"  blocks {entry['blocks']}  ({same}, max |Δlogit| {entry['max_abs_logit_diff_vs_solo']:.2g})")
    mib = 1024 * 1024
    print(f"blocks of {plan.block_size}: {last.blocks_used} used, {last.blocks_shared} shared "
          f"({plan.blocks_unshared} without sharing), {last.copies} copied on write")
    print(f"memory: paged {report['paged_bytes'] / mib:.3f} MiB, contiguous reserved "
          f"{report['contiguous_reserved_bytes'] / mib:.3f} MiB, used {report['used_bytes'] / mib:.3f} MiB")
    if tps and sequential_tps:
        print(f"speed: {tps:.1f} tok/s batched, {sequential_tps:.1f} tok/s one at a time, best of {speed.turns} "
              f"turns each: {speed.describe_speedup()}")
    return 0
