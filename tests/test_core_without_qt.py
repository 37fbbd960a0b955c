"""The core (model, cache, engine, weights, tokenizer, counting, CLI) works where Qt cannot be imported."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from helpers_checkpoints import save_kvviz_folder

import kvviz

PACKAGE_DIR = Path(kvviz.__file__).resolve().parent
QT_MODULES = ("PySide6", "PySide2", "PyQt5", "PyQt6", "pyqtgraph", "shiboken6", "shiboken2", "qtpy", "sip")
CORE_FILES = sorted(p for p in PACKAGE_DIR.rglob("*.py") if p.name != "__main__.py" and "app" not in
                    p.relative_to(PACKAGE_DIR).parts)  # everything but the app

CHILD = textwrap.dedent(
    """
    import importlib, importlib.abc, json, sys

    BLOCKED = {blocked!r}

    class BlockQt(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{{name}} is blocked: the core must not need Qt")
            return None

    sys.meta_path.insert(0, BlockQt())
    for name in BLOCKED:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
        else:
            raise SystemExit(f"the blocker failed for {{name}}")

    report = {{"imported": [], "skipped": []}}
    for module in {modules!r}:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if module == "kvviz.cli.commands" and exc.name == "kvviz.cli.commands":
                report["skipped"].append(module)
                continue
            raise
        report["imported"].append(module)

    import torch
    from kvviz.engine.engine import Engine, SamplingSettings, generate_ids
    from kvviz.models.gpt2 import GPT, GPTConfig
    from kvviz.sources.weights import load_model

    model = GPT(GPTConfig(n_ctx=32, n_layer=2, n_head=2, n_embd=32))
    model.init_weights(torch.Generator().manual_seed(0))
    engine = Engine(model)
    prompt = engine.encode_prompt("Hello, I am")
    cached, records = generate_ids(engine, prompt, 8, use_cache=True)
    uncached, _ = generate_ids(engine, prompt, 8, use_cache=False)
    assert cached == uncached and len(cached) == 8, (cached, uncached)
    sampled, _ = generate_ids(engine, prompt, 8, sampling=SamplingSettings(temperature=1.0, top_k=5, seed=1))
    report["tokens"] = cached
    report["kv_computed_total"] = records[-1].kv_computed_total

    loaded = load_model({checkpoint!r})
    report["loaded_layers"] = loaded.config.n_layer
    loaded_ids, _ = generate_ids(Engine(loaded.model), prompt, 4)
    report["loaded_tokens"] = loaded_ids

    if "kvviz.cli.commands" in report["imported"]:
        import contextlib, io
        from kvviz.cli.commands import main
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = main(["count", "--prompt-tokens", "3", "--new-tokens", "12", "--json"])
        report["cli_count_status"] = status
        report["cli_count"] = json.loads(out.getvalue())

    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    report["leaked"] = leaked
    print("REPORT " + json.dumps(report))
    """
)


def _core_modules() -> list[str]:
    names = [".".join(("kvviz", *p.relative_to(PACKAGE_DIR).with_suffix("").parts)).removesuffix(".__init__")
             for p in CORE_FILES]
    for required in ("kvviz.models.gpt2", "kvviz.cache.kv_cache", "kvviz.engine.engine", "kvviz.sources.weights",
                     "kvviz.core.tokenizer", "kvviz.core.counting", "kvviz.training.train", "kvviz.cli.commands"):
        if required not in names:
            names.append(required)
    return names


def test_core_imports_and_generates_with_qt_blocked(tmp_path):
    checkpoint = save_kvviz_folder(tmp_path / "tiny", n_layer=2, n_head=2, n_embd=32, n_ctx=64)
    script = CHILD.format(blocked=QT_MODULES, modules=_core_modules(), checkpoint=str(checkpoint))
    env = dict(os.environ)
    env.pop("QT_API", None)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180,
                            cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("REPORT "))
    report = json.loads(line.removeprefix("REPORT "))
    for module in ("kvviz", "kvviz.models.gpt2", "kvviz.cache.kv_cache", "kvviz.engine.engine", "kvviz.sources.weights",
                   "kvviz.core.tokenizer", "kvviz.core.counting", "kvviz.training.train"):
        assert module in report["imported"]
    assert report["leaked"] == []
    assert len(report["tokens"]) == 8
    assert report["kv_computed_total"] == 4 + 8  # "Hello, I am" is 4 tokens
    assert report["loaded_layers"] == 2 and len(report["loaded_tokens"]) == 4
    if "kvviz.cli.commands" in report["imported"]:
        assert report["cli_count_status"] == 0
        assert report["cli_count"]["with_cache"] == 15 and report["cli_count"]["without_cache"] == 102


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
            "import_module", "__import__"
        ):
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.add(node.args[0].value)
    return found


def test_core_sources_never_import_qt():
    assert {p.stem for p in CORE_FILES} >= {"gpt2", "kv_cache", "engine", "weights", "tokenizer", "counting"}
    offenders = []
    for path in CORE_FILES:
        for module in _imported_modules(path):
            if module.split(".")[0] in QT_MODULES:
                offenders.append(f"{path.name} imports {module}")
    assert offenders == []


def test_the_scan_would_catch_a_qt_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def later():\n    from PySide6.QtCore import QObject\n    import pyqtgraph as pg\n")
    assert {"PySide6.QtCore", "pyqtgraph"} <= _imported_modules(sample)
