"""Small frozen descriptions that cross from the worker thread to the views: the model and the run."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelInfo:
    """The loaded model, for the title bar, Help > About and the views."""

    name: str
    source: str
    num_parameters: int
    n_layer: int
    n_head: int
    n_embd: int
    n_ctx: int


@dataclass(frozen=True)
class RunRequest:
    """What the GUI asks the worker to prepare; `run_id` tags every record of that run."""

    run_id: int
    prompt: str
    use_cache: bool = True
    max_new_tokens: int = 12
    temperature: float = 0.0
    top_k: int | None = None
    seed: int | None = None


@dataclass(frozen=True)
class RunInfo:
    """A prepared run: what the views need before the first record arrives.

    Views take it in `reset(info)`. Build one headless with `RunInfo.from_engine`.
    """

    run_id: int
    prompt: str
    prompt_ids: tuple[int, ...]
    prompt_labels: tuple[str, ...]  # one readable label per prompt token
    model_name: str
    n_layer: int
    n_ctx: int
    use_cache: bool
    max_new_tokens: int  # as requested
    budget: int  # tokens this run can really generate: min(max_new_tokens, n_ctx - P)
    sampling: str  # "greedy" or "temperature 0.8, top-k 40, seed 1"

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def width(self) -> int:
        """Positions the run can reach: prompt plus every token it may generate."""
        return self.prompt_tokens + self.budget

    @staticmethod
    def describe_sampling(temperature: float, top_k: int | None, seed: int | None) -> str:
        if temperature == 0:
            return "greedy"
        parts = [f"temperature {temperature:g}"]
        if top_k:
            parts.append(f"top-k {top_k}")
        if seed is not None:
            parts.append(f"seed {seed}")
        return ", ".join(parts)

    @classmethod
    def from_engine(
        cls,
        engine,  # kvviz.engine.Engine (not imported here: torch stays out of the GUI's first import)
        prompt: str,
        prompt_ids: list[int],
        max_new_tokens: int,
        use_cache: bool = True,
        model_name: str = "",
        sampling: str = "greedy",
        run_id: int = 0,
    ) -> RunInfo:
        """The RunInfo for `engine.generate(prompt_ids, max_new_tokens, use_cache, ...)`."""
        n_ctx = engine.n_ctx
        return cls(
            run_id=run_id,
            prompt=prompt,
            prompt_ids=tuple(prompt_ids),
            prompt_labels=tuple(engine.tokenizer.token_label(i) for i in prompt_ids),
            model_name=model_name or engine.model.config.name,
            n_layer=engine.model.config.n_layer,
            n_ctx=n_ctx,
            use_cache=use_cache,
            max_new_tokens=max_new_tokens,
            budget=max(0, min(max_new_tokens, n_ctx - len(prompt_ids))),
            sampling=sampling,
        )


def chip_text(label: str) -> str:
    """A token label with its whitespace made visible, for chips, ticks and tooltips."""
    if label == "":
        return "\u2205"
    return label.replace(" ", "\u00b7").replace("\n", "\u21b5").replace("\t", "\u21e5").replace("\r", "\u240d")
