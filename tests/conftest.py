"""Shared test setup. GUI tests run offscreen; helpers only add to this file."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # One test process per core (pytest -n auto): each computes on one thread, so that none spins waiting for a
    # core the other holds. Set before torch is first imported; `kvviz` processes the tests start inherit it.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")


# ----- the command line, in this process -----


@dataclass(frozen=True)
class CliResult:
    """What `kvviz ARGS` did: its exit status and everything it wrote to stdout and stderr (the descriptors too)."""

    returncode: int
    stdout: str
    stderr: str


CLI_TIMEOUT_S = 120


@pytest.fixture
def kvviz_cli(capfd, monkeypatch):
    """`kvviz_cli(*args, cwd=None)`: `kvviz.cli.commands.main(args)` in this process, offline, in `cwd` (a
    process is only needed where its standard streams, permissions or signals are under test). A command still
    running after CLI_TIMEOUT_S fails the test instead of hanging it (a FIFO opened for reading waits forever)."""
    import signal

    from kvviz.cli.commands import main

    def hanging(signum, frame):
        raise TimeoutError(f"kvviz still ran after {CLI_TIMEOUT_S} s")

    def run(*args: str, cwd: Path | None = None) -> CliResult:
        if cwd is not None:
            monkeypatch.chdir(cwd)
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        capfd.readouterr()
        previous = signal.signal(signal.SIGALRM, hanging)
        signal.alarm(CLI_TIMEOUT_S)
        try:
            status = main(list(args))
        except SystemExit as exc:  # argparse's usage errors and --help end the process this way
            status = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        captured = capfd.readouterr()
        return CliResult(status, captured.out, captured.err)

    return run

# ----- one loaded copy of each model that cannot change -----


@pytest.fixture(scope="session", autouse=True)
def _built_in_models_loaded_once():
    """The embedded models (files shipped read-only with kvviz) and the seeded random presets are the same weights
    every time they load: the test process loads each once, in each precision, and every window, engine and
    command of the tests shares that copy (the app loads on its worker thread 300-500 ms a window otherwise).
    Folders and hub models still load from disk each time: their tests change the files."""
    import kvviz.sources.weights as weights

    original, loaded = weights.load_model, {}

    def load_model(source=None, device="cpu", dtype=None, progress=None):
        import torch

        dtype = torch.float32 if dtype is None else dtype
        key = (source or weights.DEFAULT_MODEL_NAME, device, dtype)
        if key[0] not in weights.EMBEDDED_MODELS and not key[0].startswith("random:"):
            return original(source, device=device, dtype=dtype, progress=progress)
        if key not in loaded:
            loaded[key] = original(source, device=device, dtype=dtype, progress=progress)
        return loaded[key]

    weights.load_model = load_model
    yield
    weights.load_model = original


# ----- app (GUI) tests -----


@pytest.fixture(autouse=True)
def _isolated_qt_settings(request, tmp_path, monkeypatch):
    """GUI tests read and write the app's settings under tmp_path, never the user's real settings."""
    if "qtbot" not in request.fixturenames:
        yield
        return
    from kvviz.app import settings
    from kvviz.app.window import main_window

    # the window waits 100 ms after it is shown so that it paints before torch is imported; the tests' process
    # has torch imported already
    monkeypatch.setattr(main_window, "INITIAL_LOAD_DELAY_MS", 0)
    # and fits itself to the screen once a window manager has framed it: offscreen, at once, not in the middle of a
    # test that set its size (a window ready within 250 ms was shrunk to the offscreen screen after the test's
    # resize)
    monkeypatch.setattr(main_window, "FIT_TO_SCREEN_DELAY_MS", 0)
    folder = tmp_path / "settings"
    folder.mkdir()
    monkeypatch.setattr(settings, "settings_path", lambda: folder / settings.SETTINGS_FILE)
    yield folder


@pytest.fixture(autouse=True)
def _no_worker_thread_left(request):
    """Fail any test that leaves a kvviz worker QThread running."""
    yield
    worker = sys.modules.get("kvviz.app.run.worker")
    if worker is None:
        return
    running = worker.running_threads()
    if running:
        for thread in running:
            thread.quit()
            thread.wait(5000)
        pytest.fail(f"{len(running)} kvviz worker thread(s) still running after the test")


@pytest.fixture(scope="session")
def app_model(tmp_path_factory) -> str | None:
    """The model source for GUI tests: None (the embedded default) when it is installed, else a tiny
    random checkpoint (4 layers, 64 positions) saved with kvviz.sources.weights.save_checkpoint."""
    from kvviz.core.resources import default_model_dir

    try:
        if (default_model_dir() / "model.safetensors").is_file():
            return None
    except FileNotFoundError:
        pass
    import torch

    from kvviz.models.gpt2 import GPT, GPTConfig
    from kvviz.sources.weights import save_checkpoint

    folder: Path = tmp_path_factory.mktemp("tiny-model")
    model = GPT(GPTConfig(n_ctx=64, n_layer=4, n_head=2, n_embd=32, name="tiny"))
    model.init_weights(torch.Generator().manual_seed(0))
    save_checkpoint(model, folder)
    return str(folder)


@pytest.fixture
def window(qtbot, app_model):
    """The app's window on the test model with "Time flies fast", its first run planned; closed after the test.
    (Test files that need another window define their own `window`.)"""
    from kvviz.app.assembly import open_window
    from kvviz.app.settings import app_settings

    win = open_window(app_model, "Time flies fast", settings=app_settings())
    qtbot.addWidget(win)
    win.show()
    qtbot.waitUntil(lambda: win.session.plan is not None, timeout=60_000)
    yield win
    win.close()
