"""The zoo's models: each entry names a builder, example inputs and the accuracy the tests hold it to."""

from __future__ import annotations

from typing import Any

from edgerun.zoo.registry import ZooModel, register


def _cnn(factory_path: str, seed: int) -> Any:
    def build() -> Any:
        import importlib

        import torch

        from edgerun.zoo.calibration import build_seeded, calibrate_batchnorm, init_convs_from_data
        from edgerun.zoo.cnn_blocks import image_classifier_batches

        module, name = factory_path.split(":")
        factory = getattr(importlib.import_module(module), name)
        model = build_seeded(factory, seed)
        batches = image_classifier_batches()
        init_convs_from_data(model, torch.cat(batches), seed)
        return calibrate_batchnorm(model, batches)
    return build


def _image() -> tuple[Any, ...]:
    from edgerun.zoo.inputs import natural_image

    return (natural_image(224, seed=0),)


def _seeded(factory_path: str, seed: int) -> Any:
    def build() -> Any:
        import importlib

        from edgerun.zoo.calibration import build_seeded

        module, name = factory_path.split(":")
        return build_seeded(getattr(importlib.import_module(module), name), seed).eval()
    return build


def _mlp_inputs() -> tuple[Any, ...]:
    from edgerun.zoo.mlp import example_inputs

    return example_inputs()


def _din_inputs() -> tuple[Any, ...]:
    from edgerun.zoo.din import example_inputs

    return example_inputs()


def _llama_inputs() -> tuple[Any, ...]:
    from edgerun.zoo.inputs import token_ids
    from edgerun.zoo.llama import LlamaConfig

    cfg = LlamaConfig()
    return (token_ids(cfg.seq, cfg.vocab, seed=5),)


def _minilm_build() -> Any:
    from edgerun.zoo.minilm import build

    return build()


def _minilm_inputs() -> tuple[Any, ...]:
    from edgerun.zoo.minilm import example_inputs

    return example_inputs()


_CNNS = [
    ("mobilenet_v2", "edgerun.zoo.mobilenet:MobileNetV2", "MobileNetV2 1.0, 224x224, ImageNet head; data-initialised"),
    ("resnet18", "edgerun.zoo.resnet:resnet18", "ResNet-18, 224x224, ImageNet head; data-initialised"),
    ("resnet50", "edgerun.zoo.resnet:resnet50", "ResNet-50, 224x224, ImageNet head; data-initialised"),
    ("squeezenet1_1", "edgerun.zoo.squeezenet:SqueezeNet11", "SqueezeNet 1.1, 224x224, ImageNet head"),
    ("shufflenet_v2", "edgerun.zoo.shufflenet:ShuffleNetV2", "ShuffleNetV2 x1.0, 224x224; data-initialised"),
]
for _i, (_name, _path, _desc) in enumerate(_CNNS):
    register(ZooModel(_name, _desc, _cnn(_path, 10 + _i), _image, family="cnn"))

register(ZooModel("mlp", "3-layer MLP on a 28x28 grey picture, softmax output",
                  _seeded("edgerun.zoo.mlp:MLP", 1), _mlp_inputs, family="mlp"))
register(ZooModel("vit_tiny", "ViT-Tiny/16: 224x224, dim 192, 12 layers, 3 heads",
                  _seeded("edgerun.zoo.vit:ViT", 2), _image, family="transformer"))
register(ZooModel("din", "DIN recommendation model: behaviour-sequence embeddings, local activation unit, MLP",
                  _seeded("edgerun.zoo.din:DIN", 3), _din_inputs, family="recsys"))
register(ZooModel("llama_small", "Llama-style decoder (RMSNorm, RoPE, SwiGLU, causal attention): dim 256, "
                  "4 layers, 4 heads, vocab 1000, 32 tokens -> logits; random weights",
                  _seeded("edgerun.zoo.llama:LlamaDecoder", 4), _llama_inputs, family="llm"))
register(ZooModel("minilm_l6", "all-MiniLM-L6-v2 (real weights): 32 tokens -> normalised sentence embedding",
                  _minilm_build, _minilm_inputs, checks={"cosine_distance": 1e-5}, family="transformer"))
