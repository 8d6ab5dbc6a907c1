"""The model zoo: plain-torch models (no torchvision) with deterministic weights and real-looking inputs.

    edgerun.zoo.list_models() -> ["din", "llama_small", ...]
    model = edgerun.zoo.get("resnet18"); module = model.build(); args = model.example_inputs()
"""

from edgerun.zoo.registry import ZooModel, get, list_models

__all__ = ["ZooModel", "get", "list_models"]
