"""Where kvviz's shipped files live, from a wheel or from a source checkout."""

from __future__ import annotations

from pathlib import Path

DEFAULT_MODEL_NAME = "kvviz-shakespeare"
# shipped in resources/models/, the default first (the last: the draft for speculative decoding)
EMBEDDED_MODELS = (DEFAULT_MODEL_NAME, "kvviz-shakespeare-gqa", "kvviz-shakespeare-draft")


def resources_dir() -> Path:
    """The `resources/` folder: inside the installed package, or beside it in a checkout."""
    package_dir = Path(__file__).resolve().parents[1]  # kvviz/, this file being kvviz/sources/resources.py
    for candidate in (package_dir / "resources", package_dir.parent / "resources"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"kvviz resources not found next to {package_dir}; reinstall kvviz")


def resource_path(*parts: str) -> Path:
    return resources_dir().joinpath(*parts)


def default_model_dir() -> Path:
    return resource_path("models", DEFAULT_MODEL_NAME)


def embedded_model_dir(name: str) -> Path:
    return resource_path("models", name)


def icon_path() -> Path:
    return resource_path("icons", "kvviz.svg")
