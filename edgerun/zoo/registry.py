"""The zoo's registry: named models, each a builder plus real-looking example inputs and a tolerance."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgerun.errors import EdgerunError


@dataclass(frozen=True)
class ZooModel:
    name: str
    description: str
    build: Callable[[], Any]  # -> torch.nn.Module in eval mode, deterministic weights
    example_inputs: Callable[[], tuple[Any, ...]]  # -> tuple of torch tensors
    # Largest accepted relative error of the reference backend against torch eager, fp32:
    # max|ours - torch| / max(max|torch|, tiny), per output.
    tolerance: float = 1e-4
    # Extra checks a test may apply (e.g. {"cosine_distance": 1e-5} for sentence embeddings).
    checks: dict[str, float] = field(default_factory=dict)
    family: str = ""


_MODELS: dict[str, ZooModel] = {}


def register(model: ZooModel) -> ZooModel:
    if model.name in _MODELS:
        raise ValueError(f"zoo model {model.name!r} registered twice")
    _MODELS[model.name] = model
    return model


def list_models() -> list[str]:
    _load_all()
    return sorted(_MODELS)


def get(name: str) -> ZooModel:
    _load_all()
    try:
        return _MODELS[name]
    except KeyError:
        raise EdgerunError(f"no zoo model named {name!r}; known models: {', '.join(sorted(_MODELS))}") from None


def _load_all() -> None:
    # Importing the family modules registers their models; deferred so `import edgerun.zoo` stays cheap.
    from edgerun.zoo import catalog  # noqa: F401
