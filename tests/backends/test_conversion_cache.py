"""Converted partitions kept on disk (edgerun.backends.conversion_cache): keyed by content, converted once,
bounded, and never in the way when the cache cannot be written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")

from backends_testkit import one_node_graph

from edgerun.backends import conversion_cache
from edgerun.backends.conversion_cache import CACHE_ENV, conversion_key, converted_file
from edgerun.backends.onnxruntime import build_model
from edgerun.errors import EdgerunError

RNG = np.random.default_rng(5)


def conv_partition(weight: np.ndarray) -> tuple[object, dict[str, np.ndarray]]:
    x = RNG.standard_normal((1, 16, 8, 8)).astype(np.float32)
    return build_model(one_node_graph("conv2d", [x, weight], constant=[False, True], padding=[1, 1, 1, 1]))


class Converter:
    """Writes the model's bytes to the target, counting its calls (a converter whose output is checkable)."""

    def __init__(self, model: object) -> None:
        self.model = model
        self.calls = 0

    def __call__(self, target: Path) -> None:
        self.calls += 1
        target.write_bytes(self.model.SerializeToString())  # type: ignore[attr-defined]


def test_the_key_follows_the_content_weights_included() -> None:
    w = RNG.standard_normal((16, 16, 3, 3)).astype(np.float32)
    model, external = conv_partition(w)
    assert external, "the conv weight should travel outside the model: the key must read it there"
    key = conversion_key(model, external, "mnn", "3.6.1")
    assert key == conversion_key(*conv_partition(w.copy()), "mnn", "3.6.1")
    changed = w.copy()
    changed[0, 0, 0, 0] += 1.0
    assert key != conversion_key(*conv_partition(changed), "mnn", "3.6.1")
    assert key != conversion_key(model, external, "mnn", "3.7.0")


def test_a_partition_is_converted_once_and_read_back_from_disk(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    model, external = conv_partition(RNG.standard_normal((16, 16, 3, 3)).astype(np.float32))
    key = conversion_key(model, external, "test")
    convert = Converter(model)
    with converted_file("mnn", key, convert, ".mnn") as first:
        made = first.read_bytes()
    with converted_file("mnn", key, convert, ".mnn") as again:
        assert again.read_bytes() == made
    assert convert.calls == 1 and first == again and first.parent == tmp_path / "conversions" / "mnn"
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no staging folder left behind


def test_a_failed_conversion_leaves_nothing_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    with pytest.raises(EdgerunError, match="mnn conversion wrote nothing"), \
            converted_file("mnn", "k1", lambda target: None, ".mnn"):
        pass
    assert list((tmp_path / "conversions" / "mnn").iterdir()) == []


def test_an_unwritable_cache_still_converts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv(CACHE_ENV, str(blocker))  # mkdir under a file fails: there is no cache here
    model, _ = conv_partition(RNG.standard_normal((16, 16, 3, 3)).astype(np.float32))
    convert = Converter(model)
    for _ in range(2):
        with converted_file("mnn", "k2", convert, ".mnn") as path:
            assert path.read_bytes() == model.SerializeToString()
    assert convert.calls == 2


def test_least_recently_used_conversions_are_evicted_past_the_bound(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(conversion_cache, "MAX_BYTES", 2500)

    def write(size: int) -> Callable[[Path], None]:
        return lambda target: target.write_bytes(b"x" * size)

    for key in ("a", "b"):
        with converted_file("kind", key, write(1000)):
            pass
    with converted_file("kind", "a", write(1000)):  # a used again: b is now the oldest
        pass
    with converted_file("kind", "c", write(1000)):
        pass
    assert sorted(p.name for p in (tmp_path / "conversions" / "kind").iterdir()) == ["a", "c"]
