"""The carved-test bundle: a directory of raw arrays plus one JSON index. No pickle anywhere.

    tests.bundle/
      index.json            format, version, size policy, the program's hash, every case
      arrays/<sha256>.npy   one file per distinct array (np.save, allow_pickle=False), named by content

A case is one op instance's call: op, attrs, input and output specs, and the content hashes of its input
and output arrays. Arrays are deduplicated by the SHA-256 of (dtype, shape, bytes), so the weights a node
reads and the activations two cases share are stored once.

Size policy (BundlePolicy): at most `max_cases_per_signature` cases per signature (op, attrs, input specs),
and at most `max_bytes` of arrays in all. Cases past either bound are dropped and counted in the index, so a
checker can say that coverage was cut. Among equal signatures the first calls are kept, since they come
from the first input sets, which the user lists first.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError

FORMAT = "edgerun-carved-tests"
VERSION = 1


@dataclass(frozen=True)
class BundlePolicy:
    max_cases_per_signature: int = 4
    max_bytes: int = 512 << 20

    def to_json(self) -> dict[str, int]:
        return {"max_cases_per_signature": self.max_cases_per_signature, "max_bytes": self.max_bytes}


@dataclass(frozen=True)
class ArrayRef:
    hash: str | None  # None: an omitted optional input
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict[str, Any]:
        return {"hash": self.hash, "shape": list(self.shape), "dtype": self.dtype}

    @staticmethod
    def from_json(d: dict[str, Any]) -> ArrayRef:
        return ArrayRef(d["hash"], tuple(d["shape"]), d["dtype"])


@dataclass(frozen=True)
class CarvedCase:
    id: str  # "<node>#<call>": unique in the bundle and stable across re-carving the same program
    op: str
    node: str
    attrs: dict[str, Any]
    inputs: tuple[ArrayRef, ...]
    outputs: tuple[ArrayRef, ...]
    signature: str
    sample: int  # which input set produced it

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "op": self.op, "node": self.node, "attrs": self.attrs,
                "inputs": [a.to_json() for a in self.inputs], "outputs": [a.to_json() for a in self.outputs],
                "signature": self.signature, "sample": self.sample}

    @staticmethod
    def from_json(d: dict[str, Any]) -> CarvedCase:
        return CarvedCase(d["id"], d["op"], d["node"], d["attrs"],
                          tuple(ArrayRef.from_json(a) for a in d["inputs"]),
                          tuple(ArrayRef.from_json(a) for a in d["outputs"]), d["signature"], d["sample"])


def array_hash(a: np.ndarray) -> str:
    h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
    h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def signature_of(op: str, attrs: dict[str, Any], inputs: list[ArrayRef]) -> str:
    text = json.dumps([op, attrs, [[list(i.shape), i.dtype] for i in inputs]], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class TestBundle:
    """Carved cases and their arrays. Arrays live in memory while carving and on disk once saved."""

    __test__ = False  # not a pytest class, whatever its name says

    cases: list[CarvedCase] = field(default_factory=list)
    policy: BundlePolicy = field(default_factory=BundlePolicy)
    meta: dict[str, Any] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)  # op -> cases dropped by the size policy
    path: Path | None = None
    _arrays: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    _per_signature: dict[str, int] = field(default_factory=dict, repr=False)
    _bytes: int = 0

    # -- building --------------------------------------------------------------------------------------
    def add_case(self, op: str, node: str, attrs: dict[str, Any], inputs: list[np.ndarray | None],
                 outputs: list[np.ndarray], call: int, sample: int) -> CarvedCase | None:
        """Record one call; None when the size policy drops it."""
        in_refs = [ArrayRef(None, (), "") if a is None else ArrayRef(array_hash(a), a.shape, str(a.dtype))
                   for a in inputs]
        sig = signature_of(op, attrs, in_refs)
        new = {r.hash: a for r, a in zip(in_refs, inputs)
               if a is not None and r.hash is not None and r.hash not in self._arrays}
        out_refs = []
        for a in outputs:
            ref = ArrayRef(array_hash(a), a.shape, str(a.dtype))
            out_refs.append(ref)
            if ref.hash is not None and ref.hash not in self._arrays:
                new[ref.hash] = a
        added = sum(int(a.nbytes) for a in new.values())
        if self._per_signature.get(sig, 0) >= self.policy.max_cases_per_signature \
                or self._bytes + added > self.policy.max_bytes:
            self.dropped[op] = self.dropped.get(op, 0) + 1
            return None
        for h, a in new.items():
            self._arrays[h] = np.array(a, copy=True)
        self._bytes += added
        self._per_signature[sig] = self._per_signature.get(sig, 0) + 1
        case = CarvedCase(f"{node}#{call}", op, node, attrs, tuple(in_refs), tuple(out_refs), sig, sample)
        self.cases.append(case)
        return case

    # -- reading ---------------------------------------------------------------------------------------
    def array(self, ref: ArrayRef) -> np.ndarray:
        if ref.hash is None:
            raise EdgerunError("an omitted optional input has no array")
        a = self._arrays.get(ref.hash)
        if a is None:
            if self.path is None:
                raise EdgerunError(f"array {ref.hash[:12]} is missing from the bundle")
            file = self.path / "arrays" / f"{ref.hash}.npy"
            try:
                a = np.load(file, allow_pickle=False, mmap_mode="r")
            except FileNotFoundError:
                raise EdgerunError(f"bundle {self.path} lacks array file {file.name}") from None
            if a.shape != ref.shape or str(a.dtype) != ref.dtype:
                raise EdgerunError(f"bundle array {file.name} is {a.dtype}{a.shape}, index says "
                                   f"{ref.dtype}{ref.shape}")
            self._arrays[ref.hash] = a
        return a

    def case_arrays(self, case: CarvedCase) -> tuple[list[np.ndarray | None], list[np.ndarray]]:
        ins = [None if r.hash is None else self.array(r) for r in case.inputs]
        return ins, [self.array(r) for r in case.outputs]

    def select(self, ops: list[str] | None = None, nodes: list[str] | None = None,
               case_ids: list[str] | None = None) -> list[CarvedCase]:
        return [c for c in self.cases if (not ops or c.op in ops) and (not nodes or c.node in nodes)
                and (not case_ids or c.id in case_ids)]

    def ops(self) -> list[str]:
        return list(dict.fromkeys(c.op for c in self.cases))

    def __iter__(self) -> Iterator[CarvedCase]:
        return iter(self.cases)

    def __len__(self) -> int:
        return len(self.cases)

    @property
    def array_bytes(self) -> int:
        return self._bytes

    # -- files -----------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> Path:
        root = Path(path)
        (root / "arrays").mkdir(parents=True, exist_ok=True)
        used = {r.hash: r for c in self.cases for r in (*c.inputs, *c.outputs) if r.hash}
        for h, ref in used.items():
            file = root / "arrays" / f"{h}.npy"
            if not file.exists():
                np.save(file, np.array(self.array(ref), order="C"), allow_pickle=False)
        index = {"format": FORMAT, "version": VERSION, "policy": self.policy.to_json(), "meta": self.meta,
                 "array_bytes": self._bytes, "dropped": self.dropped,
                 "cases": [c.to_json() for c in self.cases]}
        tmp = root / "index.json.tmp"
        tmp.write_text(json.dumps(index, indent=1, sort_keys=True))
        os.replace(tmp, root / "index.json")
        self.path = root
        return root

    @staticmethod
    def read(path: str | os.PathLike[str]) -> TestBundle:
        root = Path(path)
        try:
            index = json.loads((root / "index.json").read_text())
        except FileNotFoundError:
            if not root.exists():
                raise EdgerunError(f"no test bundle at {root}") from None
            raise EdgerunError(f"{root} is not a test bundle (no index.json)") from None
        except NotADirectoryError:
            raise EdgerunError(f"{root} is a file, not a test bundle (the folder `edgerun carve` writes)") from None
        except json.JSONDecodeError as exc:
            raise EdgerunError(f"{root}/index.json is not valid JSON: {exc}") from None
        if index.get("format") != FORMAT or index.get("version") != VERSION:
            raise EdgerunError(f"{root} is not a version-{VERSION} {FORMAT} bundle")
        policy = BundlePolicy(**index["policy"])
        bundle = TestBundle([CarvedCase.from_json(c) for c in index["cases"]], policy, index.get("meta", {}),
                            dict(index.get("dropped", {})), root)
        bundle._bytes = int(index.get("array_bytes", 0))
        return bundle
