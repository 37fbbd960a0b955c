"""`kvviz compare`: the cached and the uncached run in lockstep, as a table or JSON (kvviz.engine.compare)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator

from kvviz.cli import json_output as cli_json
from kvviz.cli.parser import UsageError
from kvviz.core.errors import first_line, is_out_of_memory, visible


def broken_cache_note(fault: str) -> str:
    """One line that says the cache is broken on purpose, and how."""
    from kvviz.core.records import CACHE_FAULTS

    return f"The KV cache is broken on purpose ({fault}): {CACHE_FAULTS[fault]}."


DTYPE_UNSUPPORTED = ("not implemented for", "not supported", "does not support", "only supported")


@contextlib.contextmanager
def dtype_honoured(dtype_name: str, device: str) -> Iterator[None]:
    """A number type the device (or this torch) cannot compute in becomes one line, status 2."""
    try:
        yield
    except (RuntimeError, TypeError) as exc:
        message = str(exc)
        if dtype_name == "float32" or is_out_of_memory(exc) or not any(w in message for w in DTYPE_UNSUPPORTED):
            raise
        raise UsageError(f"--dtype {dtype_name}: cannot run on {device} here ({first_line(exc)})") from exc


def _compare_step(passes: list) -> tuple[dict, str, str]:
    """One token step of a lockstep run as `kvviz compare --json` shows it, and the two tokens' texts."""
    token_pass = passes[0]
    cached_token, uncached_token = token_pass.lockstep_token_passes()
    cached = [run_pass for record in passes for run_pass in record.lockstep_passes()[0]]
    uncached = [run_pass for record in passes for run_pass in record.lockstep_passes()[1]]
    return {
        "step": token_pass.new_tokens,
        "cached_token_id": cached_token.token_id,
        "uncached_token_id": uncached_token.token_id,
        "same": cached_token.token_id == uncached_token.token_id,
        "max_abs_logit_diff": token_pass.max_abs_logit_diff,
        "logit_tolerance": token_pass.logit_tolerance,
        "logits_agree": token_pass.logits_agree,
        "cached_seconds": round(sum(r.seconds for r in cached), 6),
        "uncached_seconds": round(sum(r.seconds for r in uncached), 6),
        "cached_kv_computed": sum(r.kv_computed[0] for r in cached),
        "uncached_kv_computed": sum(r.kv_computed[0] for r in uncached),
    }, cached_token.token_text, uncached_token.token_text


COMPARE_COLUMNS = ("step", "cached token", "uncached token", "same", "max |Δlogit|", "cached ms", "uncached ms",
                   "K/V cached", "K/V uncached")
COMPARE_WIDTHS = (5, 16, 16, 4, 12, 10, 11, 10, 12)  # the tokens' columns left-aligned, the rest right


def _table_line(cells: tuple) -> str:
    parts = []
    for index, (cell, width) in enumerate(zip(cells, COMPARE_WIDTHS, strict=True)):
        parts.append(f"{cell:<{width}}" if index in (1, 2, 3) else f"{cell:>{width}}")
    return "  ".join(parts).rstrip()


def _same_mark(step: dict) -> str:
    """✓ the same token and logits within float noise, ≠ the same token but logits beyond it, ✗ other tokens."""
    if not step["same"]:
        return "✗"
    return "≠" if step["logits_agree"] is False else "✓"


def _token_cell(token_id: int, text: str) -> str:
    cell = f"{token_id} {text!r}"
    return cell if len(cell) <= COMPARE_WIDTHS[1] else cell[: COMPARE_WIDTHS[1] - 3] + "..."


def _compare_row(step: dict, cached_text: str, uncached_text: str) -> str:
    return _table_line((
        step["step"],
        _token_cell(step["cached_token_id"], cached_text),
        _token_cell(step["uncached_token_id"], uncached_text),
        _same_mark(step),
        f"{step['max_abs_logit_diff']:.2e}",
        f"{step['cached_seconds'] * 1000:.2f}",
        f"{step['uncached_seconds'] * 1000:.2f}",
        step["cached_kv_computed"],
        step["uncached_kv_computed"],
    ))


def _time_verdict(summary) -> str:
    estimate = summary.time_estimate
    if estimate is None:
        return "no step timed"
    return f"{estimate.sentence()} (median of the {estimate.steps} steps' ratios)"


def _compare_summary_lines(summary, steps: list[dict], parted_texts: tuple[str, str], dtype_name: str) -> list[str]:
    from kvviz.core.counting import plural

    if summary.identical:
        verdict = (f"identical: yes, the same {plural(len(steps), 'token')} with and without the cache, "
                   f"the logits within float noise at every step")
    elif summary.first_divergence is None:
        step = steps[summary.first_logit_divergence - 1]
        verdict = (f"identical: no, the logits part at step {summary.first_logit_divergence} (max |Δlogit| "
                   f"{step['max_abs_logit_diff']:.2e} > float noise {step['logit_tolerance']:.1e}), "
                   f"though the {plural(len(steps), 'token')} still agree")
    else:
        parted = steps[summary.first_divergence - 1]
        verdict = (f"identical: no, the runs part at step {summary.first_divergence} (cached "
                   f"{_token_cell(parted['cached_token_id'], parted_texts[0])}, uncached "
                   f"{_token_cell(parted['uncached_token_id'], parted_texts[1])})")
        if summary.first_logit_divergence is not None and summary.first_logit_divergence < summary.first_divergence:
            verdict += f"; their logits part earlier, at step {summary.first_logit_divergence}"
    avoided = summary.kv_without_cache - summary.kv_with_cache
    return [
        verdict,
        f"max |Δlogit|: {summary.max_abs_logit_diff:.2e} (float noise for {dtype_name}: up to "
        f"{summary.logit_tolerance:.1e} here)",
        f"time: {summary.cached_seconds_total:.3f} s with cache, {summary.uncached_seconds_total:.3f} s without: "
        f"{_time_verdict(summary)}",
        f"K/V per layer, measured: {summary.kv_with_cache:,} with cache, {summary.kv_without_cache:,} without"
        + (f" ({avoided:,} avoided)" if avoided > 0 else ""),
    ]


def _interval(estimate) -> list[float] | None:
    if estimate is None or estimate.low is None:
        return None
    return [round(estimate.low, 3), round(estimate.high, 3)]


def run_compare(args: argparse.Namespace, load: Callable, say: Callable[[str], None]) -> int:
    """`kvviz compare`: `load(model, device, dtype)` loads the model, `say` prints a one-line note."""
    from kvviz.cli.speculative import run_compare_draft, speculative

    with dtype_honoured(args.dtype, args.device):
        return run_compare_draft(args, load, say) if speculative(args) else _compare(args, load, say)


def _compare_window(args: argparse.Namespace, load: Callable, say: Callable[[str], None]) -> int:
    """`kvviz compare --window W [--sinks S]`, `--kv-dtype D` or `--evict M --budget B`: the exact cache against
    the lossy one (a window, quantized, or an importance method's), in lockstep, each choosing its own tokens."""
    from kvviz.cli.eviction import evict_fields, evicted_positions
    from kvviz.core.counting import plural
    from kvviz.core.records import RunRequest
    from kvviz.engine.engine import Engine
    from kvviz.engine.run import start_run

    if args.break_cache:
        raise UsageError("--break-cache goes with an exact cache: leave out --window, --evict and --kv-dtype")
    loaded = load(args.model, args.device, args.dtype)
    engine = Engine(loaded.model, loaded.tokenizer, device=args.device)
    request = RunRequest(0, args.prompt, True, args.new_tokens, args.temperature, args.top_k, args.seed,
                         compare=True, window=args.window, sinks=args.sinks, kv_dtype=args.kv_dtype or "",
                         **evict_fields(args))
    run = start_run(engine, request, loaded.name, top_candidates=1)  # the lossy run, the exact one its twin
    lossy, full = run.plan, run.plan.twin
    policy, prompt_ids = lossy.policy, list(lossy.prompt_ids)
    side, short = ("quantized", policy.kv_dtype) if policy.quantized else ("windowed", "window") \
        if policy.window else ("evicting", policy.method_name)
    exact_name = "exact cache" if policy.quantized else "full cache"
    label = engine.tokenizer.token_label
    steps: list[dict] = []
    first = None
    for number, passes in enumerate(run.token_steps(), start=1):
        step, exact = passes[0], passes[0].twin  # the lossy run's token pass, and the exact run's passes
        same = step.token_id == exact[0].token_id
        entry = {"step": number, "full_token_id": exact[0].token_id, f"{side}_token_id": step.token_id,
                 "same": same, "max_abs_logit_diff": step.max_abs_logit_diff,
                 "full_positions_held": exact[-1].positions_held, f"{side}_positions_held": passes[-1].positions_held}
        if policy.evicts:
            entry[f"{side}_evicted"] = evicted_positions(step)
        steps.append(entry)
        if not same and first is None:
            first = (number, label(exact[0].token_id), label(step.token_id))
        if not args.json:
            if number == 1:
                print(f"kvviz compare: {visible(loaded.name)}, {plural(len(prompt_ids), 'prompt token')}, "
                      f"{plural(full.budget, 'new token')}: the {exact_name} against one that keeps "
                      f"{policy.describe()}")
                print(f"{'step':>5}  {exact_name:<16}  {short:<16}  same  {'max |Δlogit|':>12}  held")
            mark = "yes" if same else "NO"
            print(f"{number:>5}  {visible(label(exact[0].token_id))[:16]:<16}  "
                  f"{visible(label(step.token_id))[:16]:<16}  {mark:<4}  {step.max_abs_logit_diff:>12.3g}"
                  f"  {exact[-1].positions_held}/{passes[-1].positions_held}")
            sys.stdout.flush()
    largest = max((s["max_abs_logit_diff"] for s in steps), default=0.0)
    last = steps[-1] if steps else {}
    full_bytes = last.get("full_positions_held", 0) * full.cache_bytes_per_position
    lossy_bytes = last.get(f"{side}_positions_held", 0) * lossy.cache_bytes_per_position
    summary = {"identical": first is None, "first_divergence": first[0] if first else None,
               "max_abs_logit_diff": largest, "full_cache_bytes": full_bytes, f"{side}_cache_bytes": lossy_bytes}
    if args.json:
        print(cli_json.dumps({"model": loaded.name, "prompt_ids": prompt_ids, "dtype": args.dtype,
                              "window": policy.window, "sinks": policy.sinks, "kv_dtype": policy.kv_dtype or None,
                              "evict": policy.evict or None, "budget": policy.budget or None,
                              "steps": steps, "summary": summary}))
        return 0
    what = f"the {policy.kv_dtype} cache" if policy.quantized else "the window" if policy.window else \
        f"{policy.method_name} (a budget of {policy.budget})"
    if first is None:
        unseen = "its rounding" if policy.quantized else "what the cache no longer holds"
        print(f"the same {plural(len(steps), 'token')} with the {exact_name} and {what}; the logits differ by "
              f"up to {largest:.3g}: {unseen} has not changed a choice yet")
    else:
        why = "rounds every key and value" if policy.quantized else "evicts"
        print(f"the runs part at step {first[0]}: {first[1]!r} with the {exact_name}, {first[2]!r} with {what} "
              f"(max |Δlogit| {largest:.3g}). A cache that {why} changes what the model attends to: a trade-off, "
              "not a bug")
    print(f"memory at the end: the {exact_name} holds {last['full_positions_held']} positions ({full_bytes:,} "
          f"bytes), {what} {last[f'{side}_positions_held']} ({lossy_bytes:,} bytes)"
          + (f": {full_bytes / lossy_bytes:.1f}× less" if lossy_bytes else ""))
    return 0


def _compare(args: argparse.Namespace, load: Callable, say: Callable[[str], None]) -> int:
    if args.window or args.sinks or args.kv_dtype or args.evict:
        return _compare_window(args, load, say)
    from kvviz.core.counting import plural
    from kvviz.core.records import RunRequest, describe_sampling
    from kvviz.engine.compare import summarize
    from kvviz.engine.engine import Engine
    from kvviz.engine.run import start_run

    loaded = load(args.model, args.device, args.dtype)
    engine = Engine(loaded.model, loaded.tokenizer, device=args.device)
    request = RunRequest(0, args.prompt, True, args.new_tokens, args.temperature, args.top_k, args.seed,
                         compare=True, break_cache=args.break_cache)
    run = start_run(engine, request, loaded.name, top_candidates=1)
    plan, prompt_ids = run.plan, list(run.plan.prompt_ids)
    fault = plan.cache_fault
    records: list = []
    steps: list[dict] = []
    parted_texts: tuple[str, str] | None = None  # the two tokens' texts where the runs first part
    for passes in run.token_steps():
        records.extend(passes)
        step, cached_text, uncached_text = _compare_step(passes)
        steps.append(step)
        if not step["same"] and parted_texts is None:
            parted_texts = (cached_text, uncached_text)
        if args.json:
            continue
        if len(steps) == 1:  # after the first pass: a model that cannot run prints nothing
            shown = run.sampling
            print(f"kvviz compare: {visible(loaded.name)}, {plural(len(prompt_ids), 'prompt token')}, "
                  f"{plural(plan.budget, 'new token')}, "
                  f"{describe_sampling(shown.temperature, shown.top_k, shown.seed)}, {args.dtype}")
            if fault:
                print(broken_cache_note(fault))
            if plan.policy.evicts:
                print(f"both runs keep {plan.policy.describe()}: the cached one evicts the rest, the uncached "
                      "one recomputes with the same rule")
            print(_table_line(COMPARE_COLUMNS))
        print(_compare_row(step, cached_text, uncached_text))
        sys.stdout.flush()
    summary = summarize(records)
    if args.json:
        print(cli_json.dumps({
            "model": loaded.name,
            "prompt_ids": prompt_ids,
            "dtype": args.dtype,
            "break_cache": bool(fault),
            "window": plan.policy.window,
            "sinks": plan.policy.sinks,
            "steps": steps,
            "summary": {
                "identical": summary.identical,
                "first_divergence": summary.first_divergence,
                "first_logit_divergence": summary.first_logit_divergence,
                "max_abs_logit_diff": summary.max_abs_logit_diff,
                "logit_tolerance": summary.logit_tolerance,
                "cached_seconds_total": round(summary.cached_seconds_total, 6),
                "uncached_seconds_total": round(summary.uncached_seconds_total, 6),
                "time_ratio": round(summary.time_ratio, 3),
                "time_ratio_interval": _interval(summary.time_estimate),
                "time_ratio_clear": bool(summary.time_estimate and summary.time_estimate.clear),
                "time_verdict": _time_verdict(summary),
                "kv_with_cache": summary.kv_with_cache,
                "kv_without_cache": summary.kv_without_cache,
            },
        }))
    else:
        for line in _compare_summary_lines(summary, steps, parted_texts or ("", ""), args.dtype):
            print(line)
    sys.stdout.flush()  # the table ends before the note below
    if plan.stop_reason == "context_full":
        say(f"stopped after {plural(len(steps), 'new token')}: the model's context holds {engine.n_ctx} tokens")
    return 0
