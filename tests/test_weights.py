"""Model sources: what loads, and the one-line errors for what does not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers_checkpoints import HELLO_IDS, embedded_or_tiny_folder, save_kvviz_folder

from kvviz.core.errors import KvvizError, as_sentence
from kvviz.models.gpt2 import PRESETS
from kvviz.sources.weights import (
    HUB_MODELS,
    RANDOM_SEED,
    ModelLoadError,
    describe_sources,
    load_model,
    random_model,
    save_checkpoint,
)


@pytest.fixture
def folder(tmp_path) -> Path:
    return save_kvviz_folder(tmp_path / "tiny", n_layer=2, n_head=2, n_embd=32, n_ctx=64, seed=11)


def _load_error(source: str, **kwargs) -> str:
    with pytest.raises(ModelLoadError) as info:
        load_model(source, **kwargs)
    message = str(info.value)
    assert message and "\n" not in message, f"not one line: {message!r}"
    assert "Traceback" not in message
    return message


def _logits(model, ids=HELLO_IDS) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids]))


# ----- sources that load -----


def test_folder_round_trip(folder):
    loaded = load_model(str(folder))
    assert loaded.name == "tiny"
    assert loaded.config.n_layer == 2 and loaded.config.n_ctx == 64
    assert Path(loaded.source) == folder.resolve()
    again = load_model(str(folder / "model.safetensors"))
    assert torch.equal(_logits(loaded.model), _logits(again.model))
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"], "no temporary files left"


def test_random_presets_are_seeded_and_named():
    first = load_model("random:gpt2")
    assert first.name == "random:gpt2"
    assert str(RANDOM_SEED) in first.source
    assert first.config.n_layer == 12 and first.config.n_embd == 768 and first.config.n_ctx == 1024
    assert first.num_parameters == 124_439_808  # GPT-2 small with the head tied to wte
    second = random_model("gpt2")
    for a, b in zip(first.model.state_dict().values(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_embedded_default_or_stand_in(tmp_path):
    folder = embedded_or_tiny_folder(tmp_path)
    loaded = load_model(str(folder))
    assert loaded.config.n_ctx >= 64
    assert torch.isfinite(_logits(loaded.model)).all()


def test_dtype_argument(folder):
    loaded = load_model(str(folder), dtype=torch.bfloat16)
    assert loaded.model.transformer.wte.weight.dtype == torch.bfloat16
    assert torch.isfinite(_logits(loaded.model).float()).all()


def test_save_checkpoint_writes_a_transformers_config(folder):
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "gpt2"
    assert config["n_positions"] == 64 and config["n_layer"] == 2 and config["n_head"] == 2
    assert config["tie_word_embeddings"] is True


def test_pth_state_dict_loads_with_weights_only(folder, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    state = load_file(str(folder / "model.safetensors"))
    path = tmp_path / "weights.pth"
    torch.save(state, path)
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())

    seen = {}
    real_load = torch.load

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    loaded = load_model(str(path))
    assert seen.get("weights_only") is True
    assert torch.equal(_logits(loaded.model), _logits(load_model(str(folder)).model))


class Payload:
    """Stands for anything a malicious pickle could construct."""

    def __reduce__(self):
        return (Path.touch, (Path("should-never-exist"),))


def test_pickle_with_arbitrary_objects_is_refused(folder, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    monkeypatch.chdir(tmp_path)
    state = dict(load_file(str(folder / "model.safetensors")))
    state["payload"] = Payload()
    path = tmp_path / "evil.pth"
    torch.save(state, path)
    message = _load_error(str(path))
    assert "evil.pth" in message
    assert not (tmp_path / "should-never-exist").exists()
    assert "corrupt" not in message, "a refused pickle is not a corrupt file: say why it was refused"


def test_pth_that_is_not_a_state_dict(tmp_path):
    path = tmp_path / "list.pth"
    torch.save([torch.zeros(2)], path)
    message = _load_error(str(path))
    assert "list.pth" in message and "state dict" in message


# ----- one-line errors that name the culprit -----


def test_unknown_model_name():
    message = _load_error("gpt3")
    assert message.startswith("gpt3: unknown model")
    for name in HUB_MODELS:
        assert name in message, "the message lists what would work"


def test_unknown_random_preset():
    message = _load_error("random:gpt5")
    assert "gpt5" in message
    for preset in PRESETS:
        assert preset in message


def test_missing_path(tmp_path):
    missing = tmp_path / "nowhere" / "model.safetensors"
    message = _load_error(str(missing))
    assert str(missing) in message


def test_folder_without_weights(tmp_path):
    (tmp_path / "empty").mkdir()
    message = _load_error(str(tmp_path / "empty"))
    assert "empty" in message and "model.safetensors" in message


def test_corrupt_file(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(1),
                                   dtype=torch.uint8).numpy().tobytes())
    message = _load_error(str(path))
    assert str(path) in message and "corrupt" in message


def test_truncated_file(folder, tmp_path):
    raw = (folder / "model.safetensors").read_bytes()
    path = tmp_path / "cut" / "model.safetensors"
    path.parent.mkdir()
    path.write_bytes(raw[: len(raw) // 2])
    message = _load_error(str(path))
    assert str(path) in message and "truncated" in message


def test_empty_file(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"")
    message = _load_error(str(path))
    assert str(path) in message


def test_wrong_shape_names_the_tensor(folder):
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    state["transformer.h.1.mlp.c_fc.weight"] = torch.zeros(32, 100)
    save_file(state, str(folder / "model.safetensors"))
    message = _load_error(str(folder))
    assert "transformer.h.1.mlp.c_fc.weight" in message
    assert "(32, 100)" in message and "(32, 128)" in message


@pytest.mark.parametrize("value, dtype, words", [
    (float("nan"), None, "holds NaN;"),
    (float("inf"), None, "holds infinite values;"),
    (1e6, torch.float16, "holds infinite values once in float16;"),  # beyond float16's 65504
])
def test_weights_that_are_not_finite_are_refused_naming_the_tensor(folder, value, dtype, words):
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    state["transformer.h.0.attn.c_attn.weight"][0, 0] = value
    save_file(state, str(folder / "model.safetensors"))
    message = _load_error(str(folder), **({"dtype": dtype} if dtype else {}))
    assert message.startswith(str(folder / "model.safetensors") + ": tensor transformer.h.0.attn.c_attn.weight")
    assert words in message


def test_missing_tensor_names_it(folder):
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    del state["transformer.h.0.attn.c_proj.bias"]
    save_file(state, str(folder / "model.safetensors"))
    message = _load_error(str(folder))
    assert "transformer.h.0.attn.c_proj.bias" in message and "missing" in message


def test_extra_layer_is_reported(folder):
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    state["transformer.h.2.ln_1.weight"] = torch.ones(32)
    save_file(state, str(folder / "model.safetensors"))
    message = _load_error(str(folder))
    assert "transformer.h.2.ln_1.weight" in message


def test_not_gpt2_without_config(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "other.safetensors"
    save_file({"model.embed_tokens.weight": torch.zeros(10, 4)}, str(path))
    message = _load_error(str(path))
    assert "other.safetensors" in message and "GPT-2" in message


def test_bare_file_whose_width_does_not_tell_the_heads(tmp_path):
    """Without config.json the head count is read off the width; where it cannot be, say what is needed."""
    folder = save_kvviz_folder(tmp_path / "odd", n_layer=2, n_head=4, n_embd=48, n_ctx=64)
    (folder / "config.json").unlink()
    message = _load_error(str(folder / "model.safetensors"))
    assert "model.safetensors" in message and "config.json" in message


def test_state_dict_with_values_that_are_not_tensors(tmp_path):
    path = tmp_path / "mixed.pth"
    torch.save({"transformer.wte.weight": torch.zeros(4, 2), "step": 3}, path)
    message = _load_error(str(path))
    assert "mixed.pth" in message and "state dict" in message


def _edit_config(folder, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def test_a_config_of_a_family_kvviz_does_not_run_is_refused(folder):
    _edit_config(folder, model_type="falcon")
    message = _load_error(str(folder))
    assert message.endswith('config.json: model_type is "falcon", but kvviz runs GPT-2, Llama-family, DeepSeek-V2, '
                            'Gemma 3, Gemma 4, gpt-oss and Qwen3.5 checkpoints only')


@pytest.mark.parametrize("text", ["{not json", "", "[1, 2, 3]", "\xff\xfe"])
def test_config_that_is_not_json(folder, text):
    (folder / "config.json").write_text(text, encoding="latin-1")
    message = _load_error(str(folder))
    assert "config.json" in message


@pytest.mark.parametrize(("changes", "named"), [
    ({"n_head": 3}, "n_head"),  # 32 is not divisible by 3
    ({"n_layer": "two"}, ""),
])
def test_config_with_bad_values(folder, changes, named):
    _edit_config(folder, **changes)
    message = _load_error(str(folder))
    assert "config.json" in message and named in message


def test_unsupported_file_type(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x00" * 16)
    message = _load_error(str(path))
    assert "model.onnx" in message and ".safetensors" in message


def test_unknown_device(folder):
    message = _load_error(str(folder), device="tpu")
    assert "tpu" in message


def test_unavailable_device(folder, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    message = _load_error(str(folder), device="cuda")
    assert "cuda" in message and "not available" in message


def test_messages_start_with_the_source_as_typed(folder, tmp_path, monkeypatch):
    """The app turns messages into sentences with errors.as_sentence: "gpt3: ..." must not become "Gpt3: ..."."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 64)
    for source, kwargs in [("gpt3", {}), ("random:gpt5", {}), ("nowhere/model.safetensors", {}), ("empty", {}),
                           ("junk.safetensors", {}), ("tpu", {"device": "tpu"})]:
        with pytest.raises(ModelLoadError) as info:
            load_model(str(folder) if "device" in kwargs else source, **kwargs)
        assert isinstance(info.value, KvvizError)
        message = str(info.value)
        assert message.startswith(f"{source}: "), message
        assert as_sentence(message).startswith(f"{source}: "), message


def test_describe_sources_lists_every_kind():
    text = describe_sources()
    for name in (*HUB_MODELS, "random:", "safetensors"):
        assert name in text


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder`, hidden ones and those in subfolders included, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def published(folder) -> Path:
    """A saved checkpoint with a file of its own beside it, as `kvviz train` leaves one."""
    (folder / "MODEL_CARD.md").write_text("# tiny\n")
    return folder


def _other_model():
    from helpers_checkpoints import tiny_kvviz_model

    return tiny_kvviz_model(n_layer=3, n_head=2, n_embd=32, n_ctx=64, seed=5)


def test_save_checkpoint_replaces_both_files_and_keeps_the_rest(published):
    model = _other_model()
    before = _snapshot(published)
    save_checkpoint(model, published)
    after = _snapshot(published)
    assert sorted(after) == ["MODEL_CARD.md", "config.json", "model.safetensors"], "no temporary file left"
    assert after["MODEL_CARD.md"] == before["MODEL_CARD.md"]
    assert after["config.json"] != before["config.json"] and after["model.safetensors"] != before["model.safetensors"]
    assert json.loads(after["config.json"])["n_layer"] == 3
    assert torch.equal(_logits(load_model(str(published)).model), _logits(model))


def test_save_checkpoint_failing_mid_write_leaves_the_old_checkpoint(published, monkeypatch):
    """The weights' writer dies halfway through (a full disk): the old pair is intact, nothing else is left."""
    import safetensors.torch

    real_save_file = safetensors.torch.save_file

    def half_then_fail(tensors, filename, metadata=None):
        real_save_file(tensors, filename, metadata=metadata)
        data = Path(filename).read_bytes()
        Path(filename).write_bytes(data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", half_then_fail)
    before = _snapshot(published)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(_other_model(), published)
    assert _snapshot(published) == before
    assert load_model(str(published)).config.n_layer == 2


def test_save_checkpoint_undoes_the_first_rename_if_the_second_fails(published, monkeypatch):
    """Both files land or neither: a failure putting the second in place puts the first one back."""
    import os

    real_replace = os.replace
    landed: list[str] = []

    def replace(src, dst, *args, **kwargs):
        if Path(dst).parent == published:
            landed.append(Path(dst).name)
            if len(landed) == 2:
                raise PermissionError(13, "Permission denied")
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    before = _snapshot(published)
    with pytest.raises(PermissionError):
        save_checkpoint(_other_model(), published)
    assert sorted(landed[:2]) == ["config.json", "model.safetensors"]
    assert _snapshot(published) == before
