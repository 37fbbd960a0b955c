"""The model families kvviz runs, one line each in FAMILIES.

A family is three files: its teaching model (nanoGPT-shaped, plain torch: the lesson), its checkpoint format
(transformers' `config.json` fields and tensor names), and, where there is one, its fast file, which runs every
pass the engine takes (prefill, uncached, one token) on the products that run fast on a CPU, checked against the
teaching model token for token and logit for logit. Loading dispatches on the checkpoint's `model_type`; the
engine on the model's class.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from torch import nn

from kvviz.core.errors import ModelLoadError
from kvviz.models import (
    deepseek,
    deepseek_fast,
    deepseek_format,
    gemma3,
    gemma3_format,
    gemma4,
    gemma4_format,
    gpt2,
    gpt2_fast,
    gpt2_format,
    gpt_oss,
    gpt_oss_format,
    llama,
    llama_fast,
    llama_format,
    qwen3_5,
    qwen3_5_format,
    spread,
)
from kvviz.models.config_json import read_config, shown


@dataclass(frozen=True)
class Family:
    """One model family. `checkpoint` reads and writes its checkpoints (`config_from_json`, `config_to_json`,
    `normalize_keys`, `infer_config`, `check_config_fits`, `column_major_keys`); `fast` holds `decode_weights`,
    `forward` and `decode_one`, or is None and every pass runs the teaching forward."""

    model_types: tuple[str, ...]  # config.json's model_type values
    title: str  # for messages: "GPT-2"
    model: type[nn.Module]  # the teaching model; its instances have a `config`
    checkpoint: ModuleType
    fast: ModuleType | None = None


FAMILIES: dict[str, Family] = {model_type: family for family in (
    Family(("gpt2",), "GPT-2", gpt2.GPT, gpt2_format, gpt2_fast),
    Family(llama_format.MODEL_TYPES, "Llama-family", llama.Llama, llama_format, llama_fast),
    Family(deepseek_format.MODEL_TYPES, "DeepSeek-V2", deepseek.Deepseek, deepseek_format, deepseek_fast),
    Family(gemma3_format.MODEL_TYPES, "Gemma 3", gemma3.Gemma3, gemma3_format, spread),
    Family(gemma4_format.MODEL_TYPES, "Gemma 4", gemma4.Gemma4, gemma4_format, spread),
    Family(gpt_oss_format.MODEL_TYPES, "gpt-oss", gpt_oss.GptOss, gpt_oss_format, spread),
    Family(qwen3_5_format.MODEL_TYPES, "Qwen3.5", qwen3_5.Qwen35, qwen3_5_format, spread),
) for model_type in family.model_types}
DEFAULT_FAMILY = FAMILIES["gpt2"]  # what a weights file without a config.json is read as
PRESETS: dict[str, tuple[Family, object]] = {  # random:<name>: a family and one of its published shapes
    **{name: (FAMILIES["gpt2"], config) for name, config in gpt2.PRESETS.items()},
    **{name: (FAMILIES["llama"], config) for name, config in llama.PRESETS.items()},
    **{name: (FAMILIES["deepseek_v2"], config) for name, config in deepseek.PRESETS.items()},
    **{name: (FAMILIES["gemma3_text"], config) for name, config in gemma3.PRESETS.items()},
    **{name: (FAMILIES["gemma4_text"], config) for name, config in gemma4.PRESETS.items()},
    **{name: (FAMILIES["gpt_oss"], config) for name, config in gpt_oss.PRESETS.items()},
    **{name: (FAMILIES["qwen3_5_text"], config) for name, config in qwen3_5.PRESETS.items()},
}


def family_of(model: nn.Module) -> Family:
    """The family `model` belongs to."""
    for family in FAMILIES.values():
        if isinstance(model, family.model):
            return family
    raise TypeError(f"{type(model).__name__} is no model family kvviz knows")


def family_of_config(path: Path) -> Family:
    """The family of the checkpoint whose transformers `config.json` is `path` (ModelLoadError if kvviz runs
    none of that model_type, or the file is no JSON object)."""
    model_type = read_config(path).get("model_type")
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        *others, last = dict.fromkeys(f.title for f in FAMILIES.values())
        titles = f"{', '.join(others)} and {last}" if others else last
        raise ModelLoadError(f"{path}: model_type is {shown(model_type)}, but kvviz runs {titles} checkpoints only")
    return family


def read_family_config(path: Path) -> tuple[Family, object]:
    """The family of the checkpoint whose `config.json` is `path`, and the config it reads from it."""
    family = family_of_config(path)
    return family, family.checkpoint.config_from_json(path)
