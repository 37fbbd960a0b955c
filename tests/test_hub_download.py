"""Hub downloads through a loopback server that answers the way huggingface.co does for hf_hub_download."""

from __future__ import annotations

import hashlib
import socket
import threading
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from helpers_checkpoints import HELLO_IDS, plan_ids, save_kvviz_folder

from kvviz.core.errors import as_sentence
from kvviz.sources.weights import (
    HUB_MODELS,
    DownloadCancelled,
    ModelLoadError,
    download_hub_model,
    load_checkpoint,
    load_model,
)

COMMIT = "607a30d783dfa663caf39e06633721c8d4cfcd7e"  # any 40-hex commit id


@dataclass
class FakeHub:
    """What the server serves and what it has seen."""

    files: dict[str, bytes]  # "repo_id/filename" -> content
    interrupt: set[str] = field(default_factory=set)  # files whose body breaks off halfway
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path)
    endpoint: str = ""


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    timeout = 5  # no connection outlives a stuck client

    def log_message(self, format: str, *args) -> None:  # keep test output clean
        pass

    def _lookup(self) -> tuple[str, bytes] | None:
        # /{repo_id}/resolve/{revision}/{filename}, repo_id being "owner/name"
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        if len(parts) != 5 or parts[2] != "resolve":
            return None
        key = f"{parts[0]}/{parts[1]}/{parts[4]}"
        content = self.hub.files.get(key)
        return None if content is None else (key, content)

    def _headers(self, key: str, content: bytes) -> None:
        if key.endswith(".safetensors"):
            etag = hashlib.sha256(content).hexdigest()  # LFS files: the sha256 of the content
        else:
            etag = hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()  # git blob id
        self.send_header("ETag", f'"{etag}"')
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("Content-Length", str(len(content)))
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")

    def _not_found(self) -> None:
        self.send_response(404)
        self.send_header("X-Error-Code", "EntryNotFound")
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _request(self, method: str) -> tuple[str, bytes] | None:
        """Log the request and look the file up; answer 404 (and return None) where it is missing."""
        self.hub.requests.append((method, self.path))
        found = self._lookup()
        if found is None:
            self._not_found()
        return found

    def _ok(self, key: str, content: bytes) -> None:
        self.send_response(200)
        self._headers(key, content)
        self.end_headers()

    def do_HEAD(self) -> None:
        found = self._request("HEAD")
        if found is not None:
            self._ok(*found)

    def do_GET(self) -> None:
        found = self._request("GET")
        if found is None:
            return
        key, content = found
        if key in self.hub.interrupt:
            if self.headers.get("Range"):
                # The connection is gone for good: every retry dies before an answer.
                self.close_connection = True
                return
            self._ok(key, content)
            self.wfile.write(content[: len(content) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._ok(key, content)
        self.wfile.write(content)


class _Server(ThreadingHTTPServer):
    daemon_threads = True


def _start(hub: FakeHub) -> tuple[_Server, threading.Thread]:
    handler = type("Handler", (_Handler,), {"hub": hub})
    server = _Server(("127.0.0.1", 0), handler)
    hub.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    return server, thread


def _stop(server: _Server, thread: threading.Thread) -> None:
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)
    assert not thread.is_alive()


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    return save_kvviz_folder(tmp_path / "published", n_layer=2, n_head=2, n_embd=32, n_ctx=64, seed=21)


@pytest.fixture
def hub(checkpoint) -> FakeHub:
    repo = HUB_MODELS["gpt2"]
    return FakeHub(files={
        f"{repo}/config.json": (checkpoint / "config.json").read_bytes(),
        f"{repo}/model.safetensors": (checkpoint / "model.safetensors").read_bytes(),
    })


@pytest.fixture
def served(hub) -> Iterator[FakeHub]:
    server, thread = _start(hub)
    try:
        yield hub
    finally:
        _stop(server, thread)


@pytest.fixture(autouse=True)
def hf_cache(tmp_path, monkeypatch) -> Path:
    """huggingface_hub caches under tmp_path, never in the user's cache, and retries without sleeping.

    Online whatever HF_HUB_OFFLINE says in the environment: the hub here is the loopback server."""
    from huggingface_hub import constants, file_download
    from huggingface_hub.utils import _http

    cache = tmp_path / "hf-cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    no_sleep = types.SimpleNamespace(sleep=lambda seconds: None)
    for module in (file_download, _http):  # both back off with time.sleep between retries
        if hasattr(module, "time"):
            monkeypatch.setattr(module, "time", no_sleep)
    return cache


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([HELLO_IDS]))


def test_download_then_load_then_offline(served, checkpoint, hf_cache):
    seen: list[tuple[int, int]] = []
    folder = download_hub_model("gpt2", lambda done, total: seen.append((done, total)), endpoint=served.endpoint)

    assert folder.is_relative_to(hf_cache)
    assert (folder / "model.safetensors").read_bytes() == (checkpoint / "model.safetensors").read_bytes()
    model = load_checkpoint(folder)
    reference = load_checkpoint(checkpoint)
    assert torch.equal(_logits(model), _logits(reference))

    size = (checkpoint / "model.safetensors").stat().st_size
    assert seen, "the progress callback was never called"
    done = [d for d, _ in seen]
    assert done == sorted(done) and done[-1] == size
    assert {t for _, t in seen} == {size}
    assert ("GET", "/openai-community/gpt2/resolve/main/model.safetensors") in served.requests

    # A hub that cannot be reached: the cached copy is used without the network.
    served.requests.clear()
    assert download_hub_model("gpt2", None, endpoint=_dead_endpoint()) == folder
    assert served.requests == []


def _dead_endpoint() -> str:
    """An endpoint on a loopback port nobody listens on: connections are refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def test_second_call_works_with_hub_offline(hub, hf_cache, monkeypatch):
    server, thread = _start(hub)
    try:
        first = download_hub_model("gpt2", None, endpoint=hub.endpoint)
        # Downloaded once: while the hub is still up, the cached copy is used without asking it.
        hub.requests.clear()
        assert download_hub_model("gpt2", None, endpoint=hub.endpoint) == first
        assert hub.requests == []
    finally:
        _stop(server, thread)
    # Same endpoint, server stopped: connection refused, the cache answers.
    assert download_hub_model("gpt2", None, endpoint=hub.endpoint) == first
    # HF_HUB_OFFLINE set: no attempt at all.
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert download_hub_model("gpt2", None, endpoint=hub.endpoint) == first
    assert load_checkpoint(first).config.n_layer == 2


def test_explicit_cache_dir(served, tmp_path, hf_cache):
    elsewhere = tmp_path / "elsewhere"
    folder = download_hub_model("gpt2", None, endpoint=served.endpoint, cache_dir=elsewhere)
    assert folder.is_relative_to(elsewhere)
    assert not hf_cache.exists() or not any(hf_cache.rglob("model.safetensors"))
    served.requests.clear()
    assert download_hub_model("gpt2", None, endpoint=_dead_endpoint(), cache_dir=elsewhere) == folder


def _point_the_hub_at(hub: FakeHub, monkeypatch) -> None:
    from huggingface_hub import constants

    template = hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)


def test_load_model_by_name_through_the_hub(served, checkpoint, monkeypatch):
    """`--model gpt2` end to end, with the hub's URL pointing at the loopback hub."""
    _point_the_hub_at(served, monkeypatch)
    seen: list[tuple[int, int]] = []
    loaded = load_model("gpt2", progress=lambda done, total: seen.append((done, total)))
    assert loaded.name == "gpt2" and loaded.config.name == "gpt2"
    assert "openai-community/gpt2" in loaded.source
    assert seen[-1] == ((checkpoint / "model.safetensors").stat().st_size,) * 2
    assert torch.equal(_logits(loaded.model), _logits(load_checkpoint(checkpoint)))


def test_cancelling_from_the_progress_callback_stops_the_load_cleanly(served, checkpoint, hf_cache, monkeypatch):
    """The app's Cancel raises DownloadCancelled in the progress callback: that is no failure to report."""
    _point_the_hub_at(served, monkeypatch)
    size = (checkpoint / "model.safetensors").stat().st_size
    calls: list[tuple[int, int]] = []

    def cancel(done: int, total: int) -> None:
        calls.append((done, total))
        raise DownloadCancelled()

    with pytest.raises(DownloadCancelled):
        load_model("gpt2", progress=cancel)
    assert len(calls) == 1 and calls[0][1] == size, "the download stopped at the first report"
    _assert_no_complete_weights(hf_cache, size)

    loaded = load_model("gpt2")  # nothing half-done in the way of the next load
    assert torch.equal(_logits(loaded.model), _logits(load_checkpoint(checkpoint)))


def test_a_download_with_a_progress_callback_prints_nothing(served, capfd):
    """The app shows the progress itself: no tqdm bar on the terminal behind the window."""
    seen: list[tuple[int, int]] = []
    download_hub_model("gpt2", lambda done, total: seen.append((done, total)), endpoint=served.endpoint)
    assert seen
    assert capfd.readouterr() == ("", "")


def test_never_downloaded_and_offline_says_so(hf_cache):
    with pytest.raises(ModelLoadError) as info:
        download_hub_model("gpt2", None, endpoint=_dead_endpoint())
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("gpt2: ") and as_sentence(message).startswith("gpt2: ")
    assert "openai-community/gpt2" in message


def test_interrupted_download_leaves_nothing_and_says_why(hub, hf_cache, checkpoint, capfd, caplog):
    repo = HUB_MODELS["gpt2"]
    hub.interrupt.add(f"{repo}/model.safetensors")
    server, thread = _start(hub)
    try:
        seen: list[tuple[int, int]] = []
        with pytest.raises(ModelLoadError) as info:
            download_hub_model("gpt2", lambda done, total: seen.append((done, total)), endpoint=hub.endpoint)
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith("gpt2: ") and "download" in message
        # With a progress callback (the app's), neither a bar nor the retries' warnings reach the terminal.
        assert capfd.readouterr() == ("", "")
        assert [r.getMessage() for r in caplog.records if r.name.startswith("huggingface_hub")] == []
        _assert_no_complete_weights(hf_cache, (checkpoint / "model.safetensors").stat().st_size)

        # The network is back: the next call fetches the whole file.
        hub.interrupt.clear()
        folder = download_hub_model("gpt2", None, endpoint=hub.endpoint)
        assert (folder / "model.safetensors").read_bytes() == (checkpoint / "model.safetensors").read_bytes()
    finally:
        _stop(server, thread)


def _assert_no_complete_weights(cache: Path, size: int) -> None:
    for path in cache.rglob("*"):
        assert path.name != "model.safetensors", f"{path} looks like a complete download"
        assert not path.name.endswith(".incomplete"), f"{path} was left behind"
        if path.is_file():
            assert path.stat().st_size != size, f"{path} has the full size"


def test_missing_file_on_the_hub(hub, hf_cache):
    del hub.files[f"{HUB_MODELS['gpt2']}/model.safetensors"]
    server, thread = _start(hub)
    try:
        with pytest.raises(ModelLoadError) as info:
            download_hub_model("gpt2", None, endpoint=hub.endpoint)
    finally:
        _stop(server, thread)
    message = str(info.value)
    assert "\n" not in message and message.startswith("gpt2: ")


def test_a_reference_that_is_not_text_names_the_file_to_delete(hub, hf_cache):
    server, thread = _start(hub)
    try:
        download_hub_model("gpt2", None, endpoint=hub.endpoint)
    finally:
        _stop(server, thread)
    ref = hf_cache / "models--openai-community--gpt2" / "refs" / "main"
    ref.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ModelLoadError) as info:
        download_hub_model("gpt2", None, endpoint=_dead_endpoint())
    message = str(info.value)
    assert message.startswith(f"gpt2: the Hugging Face cache entry {ref} is damaged (") and "\n" not in message
    assert message.endswith(f"; delete {ref} to download it again")


SMOLLM2_135M_CONFIG = """{
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 0,
  "eos_token_id": 0,
  "hidden_act": "silu",
  "hidden_size": 576,
  "initializer_range": 0.041666666666666664,
  "intermediate_size": 1536,
  "is_llama_config": true,
  "max_position_embeddings": 8192,
  "model_type": "llama",
  "num_attention_heads": 9,
  "num_hidden_layers": 30,
  "num_key_value_heads": 3,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_interleaved": false,
  "rope_scaling": null,
  "rope_theta": 100000,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.42.3",
  "use_cache": true,
  "vocab_size": 49152
}
"""  # HuggingFaceTB/SmolLM2-135M's config.json as published


def smollm2_135m_weights() -> bytes:
    """model.safetensors in the published layout: bfloat16, no lm_head (tied), random values."""
    from safetensors.torch import save

    generator = torch.Generator().manual_seed(135)
    shapes = {"model.embed_tokens.weight": (49152, 576), "model.norm.weight": (576,)}
    for i in range(30):
        layer = f"model.layers.{i}."
        shapes.update({layer + "input_layernorm.weight": (576,), layer + "post_attention_layernorm.weight": (576,),
                       layer + "self_attn.q_proj.weight": (576, 576), layer + "self_attn.k_proj.weight": (192, 576),
                       layer + "self_attn.v_proj.weight": (192, 576), layer + "self_attn.o_proj.weight": (576, 576),
                       layer + "mlp.gate_proj.weight": (1536, 576), layer + "mlp.up_proj.weight": (1536, 576),
                       layer + "mlp.down_proj.weight": (576, 1536)})
    tensors = {name: (torch.randn(shape, generator=generator) * (0.05 if len(shape) > 1 else 1.0)).bfloat16()
               for name, shape in shapes.items()}
    return save(tensors, metadata={"format": "pt"})


def test_smollm2_135m_as_the_hub_publishes_it_downloads_generates_and_shows_30_layers_of_3_kv_heads(
        hf_cache, monkeypatch, kvviz_cli, qtbot):
    """`--model smollm2-135m` through the loopback hub: its config, tokenizer.json and bfloat16 weights are
    fetched once, the prompt is split by its own tokenizer, it runs in float32, and its grid has 30 layer rows
    that open into 3 KV heads of 3 query heads each; 2 x 30 x 3 x 64 x 4 = 46,080 bytes a position."""
    from helpers_checkpoints import byte_level_tokenizer
    from helpers_qt import drawn_left_labels, settle_layouts

    from kvviz.app.views.grid.kv_grid import KVGridView
    from kvviz.engine.engine import Engine

    repo = HUB_MODELS["smollm2-135m"]
    assert repo == "HuggingFaceTB/SmolLM2-135M"
    tokenizer = byte_level_tokenizer().to_str().encode()
    hub = FakeHub(files={f"{repo}/config.json": SMOLLM2_135M_CONFIG.encode(), f"{repo}/tokenizer.json": tokenizer,
                         f"{repo}/model.safetensors": smollm2_135m_weights()})
    server, thread = _start(hub)
    try:
        _point_the_hub_at(hub, monkeypatch)
        seen: list[tuple[int, int]] = []
        loaded = load_model("smollm2-135m", progress=lambda done, total: seen.append((done, total)))
    finally:
        _stop(server, thread)
    assert seen[-1] == (len(hub.files[f"{repo}/model.safetensors"]),) * 2
    assert {(m, p.rsplit("/", 1)[1]) for m, p in hub.requests if m == "GET"} == {
        ("GET", "config.json"), ("GET", "tokenizer.json"), ("GET", "model.safetensors")}
    cfg = loaded.config
    assert (cfg.n_layer, cfg.n_head, cfg.n_kv_head, cfg.head_dim) == (30, 9, 3, 64)
    assert next(loaded.model.parameters()).dtype == torch.float32 and loaded.name == "smollm2-135m"

    engine = Engine(loaded.model, tokenizer=loaded.tokenizer)
    prompt = engine.encode_prompt("Time flies")
    assert prompt[0] == 0 and len(prompt) > 2  # its own tokenizer: <s> first
    plan = plan_ids(engine, prompt, 3)
    records = list(engine.run(plan))
    assert records[-1].cache_bytes == 46_080 * (len(prompt) + 3)
    grid = KVGridView()
    qtbot.addWidget(grid)
    grid.resize(900, 1000)
    grid.show()
    grid.reset(plan)
    grid.apply(records)
    grid.expand_layer(0)
    grid.refresh()
    qtbot.waitExposed(grid)
    settle_layouts()
    rows = grid.display_rows()
    assert rows[:5] == [(0, None), (0, 0), (0, 1), (0, 2), (1, None)] and len(rows) == 30 + 3
    drawn = [text for text, *_ in drawn_left_labels(grid.plot_widget)][:4]
    assert drawn == ["L0", "L0 kv0 \u2190 q0 q1 q2", "L0 kv1 \u2190 q3 q4 q5", "L0 kv2 \u2190 q6 q7 q8"], drawn
    assert "2 \u00d7 3 KV heads \u00d7 64 \u00d7 4 bytes = 1,536 bytes" in grid.cell_info(0, 1)

    folder = download_hub_model("smollm2-135m", None, endpoint=_dead_endpoint())  # cached: offline from now on
    done = kvviz_cli("memory", "--model", str(folder))
    assert done.returncode == 0 and "46,080 bytes per token" in done.stdout, done.stdout + done.stderr
    from safetensors.torch import load_file

    stored = load_file(str(folder / "model.safetensors"))["model.layers.29.mlp.down_proj.weight"]
    kept = load_model(str(folder), dtype=torch.bfloat16).model.blocks[29].mlp.down_proj.weight  # --dtype bfloat16
    assert kept.dtype == torch.bfloat16 and torch.equal(kept, stored)  # the weights as stored, bit for bit
