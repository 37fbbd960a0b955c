"""`kvviz bench`: the headless benchmark (against the transformers peer with --peer), the window against
headless (--gui), and the speed sweep (--sweep). Nothing heavy is imported before the command runs."""

from __future__ import annotations

import argparse
import os
import sys

from kvviz.cli import json_output
from kvviz.cli.output import print_result
from kvviz.cli.parser import GUI_BENCH_REPEAT, UsageError
from kvviz.core.errors import visible
from kvviz.measure import bench, speed


def check_device(device: str) -> None:
    from kvviz.sources.weights import check_device as check

    check(device)


def cmd_bench(args: argparse.Namespace, launched_at: float) -> int:
    """`kvviz bench`: headless (with --peer, against transformers), --gui (the window against headless) or
    --sweep (ms per token step against the length); `launched_at` is when the process started."""
    if args.variants is not None or args.window or (args.sweep and args.kv_dtype):  # the long sweep
        return _bench_long_sweep(args)
    if args.sweep:
        return _bench_sweep(args)
    from kvviz.cli import speculative

    if speculative.speculative(args):
        return _bench_speculative(args)
    if args.max_length is not None:
        raise UsageError("--max-length is the longest length of a speed sweep: add --sweep")
    if args.compare and not args.gui:
        raise UsageError("--compare times compare mode in the window: add --gui (or use kvviz compare)")
    if args.attention and not args.gui:
        raise UsageError("--attention times the attention view in the window: add --gui")
    if args.window_size is not None and not args.gui:
        raise UsageError("--window-size sizes the window of the GUI benchmark: add --gui")
    if args.background:
        raise UsageError("--background goes with --sweep")
    if args.gui and args.dtype != "float32":
        raise UsageError("--dtype is for the headless bench; the window runs in float32")
    if args.gui and args.peer:
        raise UsageError("--peer times transformers headless; the GUI benchmark compares the window with headless")
    if args.gui and args.device != "cpu":
        raise UsageError("--device is for the headless bench; the window runs on the CPU")
    if args.gui:
        try:
            from kvviz.app.gui_bench import GuiBenchError, format_report, run_gui_bench
        except ImportError as exc:
            raise UsageError(f"the GUI benchmark needs PySide6 and pyqtgraph ({exc})") from exc
        try:
            result = run_gui_bench(args.model, args.prompt, args.new_tokens, launched_at=launched_at,
                                   repeat=args.repeat or GUI_BENCH_REPEAT, window_size=args.window_size,
                                   compare=args.compare, attention=args.attention)
        except GuiBenchError as exc:
            raise UsageError(str(exc)) from exc
        print(json_output.dumps(result) if args.json else visible(format_report(result), keep="\n"))
        return 0
    check_device(args.device)
    from kvviz.cli.compare import dtype_honoured

    with dtype_honoured(args.dtype, args.device):
        result = bench.run_bench(args.model, args.prompt, args.new_tokens, device=args.device, peer=args.peer,
                                 repeat=args.repeat, dtype=args.dtype, kv_dtype=args.kv_dtype or "")
    print_result(result, args.json, "kvviz bench")
    return 0


def _bench_speculative(args: argparse.Namespace) -> int:
    """`kvviz bench --draft M | --prompt-lookup N`: speculative against plain cached decoding, in turns."""
    check_device(args.device)
    from kvviz.cli import speculative
    from kvviz.cli.compare import dtype_honoured
    from kvviz.engine.engine import Engine
    from kvviz.measure.speculative_bench import format_report, run_speculative_bench
    from kvviz.sources.weights import load_model, torch_dtype

    with dtype_honoured(args.dtype, args.device):
        loaded = load_model(args.model, device=args.device, dtype=torch_dtype(args.dtype))
        engine = Engine(loaded.model, loaded.tokenizer, device=args.device)
        speculative.attach(args, engine, lambda note: print(f"kvviz: {note}", file=sys.stderr))
        result = run_speculative_bench(engine, args.prompt, args.new_tokens, speculative.request_fields(args),
                                       args.repeat, loaded.name)
    print(json_output.dumps(result) if args.json else format_report(result))
    return 0


def _bench_sweep(args: argparse.Namespace) -> int:
    """`kvviz bench --sweep`: ms per token step against the length, both modes; medians per length."""
    for option, given in (("--gui", args.gui), ("--peer", args.peer), ("--compare", args.compare),
                          ("--attention", args.attention), ("--window-size", args.window_size is not None)):
        if given:
            raise UsageError(f"{option} does not apply to --sweep")
    check_device(args.device)
    from kvviz.cli.compare import dtype_honoured
    from kvviz.engine.engine import Engine
    from kvviz.measure.speed_sweep import run_sweep
    from kvviz.sources.weights import load_model, torch_dtype

    def progress(done: int, total: int) -> None:
        print(f"progress {done}/{total}", file=sys.stderr, flush=True)

    def partial(result) -> None:  # the app draws the curve as it fills
        print(f"partial {json_output.dumps(result.as_dict())}", file=sys.stderr, flush=True)

    if args.background:
        _run_in_the_background()

    with dtype_honoured(args.dtype, args.device):
        loaded = load_model(args.model, device=args.device, dtype=torch_dtype(args.dtype))
        result = run_sweep(Engine(loaded.model, loaded.tokenizer, device=args.device), args.max_length,
                                 repeat=args.repeat or speed.SWEEP_REPEAT, model_name=loaded.name,
                                 progress=progress if args.background else None,
                                 partial=partial if args.background else None)
    if args.json:
        print(json_output.dumps(result.as_dict()))
        return 0
    print(f"kvviz bench --sweep: {visible(result.model)}, {result.dtype}, median of {result.repeat} turns per length")
    print(f"{'length':>6}  {'cached ms':>10}  {'uncached ms':>11}  {'uncached/cached':>15}")
    for length, cached, uncached, ratio in zip(result.lengths, result.cached_ms, result.uncached_ms,
                                               result.ratios, strict=True):
        print(f"{length:>6}  {cached:>10.2f}  {uncached:>11.2f}  {ratio:>14.1f}x")
    print(result.headline())
    print(result.as_dict()["why"])
    return 0


def _variants_of(args: argparse.Namespace) -> str:
    if not args.sweep:
        raise UsageError("--variants and --window time the steps of a speed sweep: add --sweep")
    for option, given in (("--gui", args.gui), ("--peer", args.peer), ("--compare", args.compare),
                          ("--attention", args.attention), ("--window-size", args.window_size is not None)):
        if given:
            raise UsageError(f"{option} does not apply to --sweep")
    if args.variants is not None and (args.kv_dtype or args.window):
        raise UsageError("--variants lists every variant: name the format or the window there "
                         "(e.g. --variants exact,int8,window:1024)")
    if args.variants is not None:
        return args.variants
    return ",".join(("exact", *((args.kv_dtype,) if args.kv_dtype else ()),
                     *((f"window:{args.window}",) if args.window else ())))


def _bench_long_sweep(args: argparse.Namespace) -> int:
    """Run the long sweep and print its table (or its JSON)."""
    names = _variants_of(args)
    from kvviz.cli.compare import dtype_honoured
    from kvviz.engine.engine import Engine
    from kvviz.measure.cache_sweep import LONG_REPEAT, run_cache_sweep
    from kvviz.sources.weights import load_model, torch_dtype

    check_device(args.device)

    def progress(done: int, total: int) -> None:
        print(f"progress {done}/{total}", file=sys.stderr, flush=True)

    def partial(result) -> None:
        print(f"partial {json_output.dumps(result.as_dict())}", file=sys.stderr, flush=True)

    if args.background:
        _run_in_the_background()
    with dtype_honoured(args.dtype, args.device):
        loaded = load_model(args.model, device=args.device, dtype=torch_dtype(args.dtype))
        result = run_cache_sweep(Engine(loaded.model, loaded.tokenizer, device=args.device), names,
                                 args.max_length, repeat=args.repeat or LONG_REPEAT, model_name=loaded.name,
                                 progress=progress if args.background else None,
                                 partial=partial if args.background else None)
    if args.json:
        print(json_output.dumps(result.as_dict()))
        return 0
    print(f"kvviz bench --sweep: {visible(result.model)}, {result.dtype}, {result.threads} threads, median of "
          f"{result.repeat} turns per length; read rate {result.read_bytes_per_second / 1e9:.1f} GB/s measured, "
          f"weights {result.weight_bytes / 1e6:,.1f} MB a step")
    for curve in result.variants:
        print(f"\n{curve.name}: {curve.label}")
        print(f"{'length':>7}  {'ms':>9}  {'predicted':>9}  {'of bound':>8}  {'cache MB':>9}")
        for length, ms, predicted, share, held in zip(result.lengths, curve.ms, curve.predicted_ms,
                                                      curve.fraction_of_prediction, curve.cache_bytes, strict=True):
            print(f"{length:>7}  {ms:>9.2f}  {predicted:>9.2f}  {share:>7.0%}  {held / 1e6:>9.1f}")
        crossover = curve.crossover_length
        print("the cache holds as many bytes as the weights " + (
            f"at {crossover:,} positions" if crossover is not None else "at no length (it stops growing)"))
    print(f"\n{result.headline()}")
    print(result.as_dict()["why"])
    return 0


def _run_in_the_background() -> None:
    """This process, and the threads it starts, in Linux's idle scheduling class at the lowest priority, below the
    app's worker: a sweep started by the app measures in the background and never takes a core from the window's
    runs (it is also paused while they compute). Elsewhere (or where refused) the lowest niceness only."""
    try:
        os.nice(19)
    except (AttributeError, OSError):
        pass
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        pass
