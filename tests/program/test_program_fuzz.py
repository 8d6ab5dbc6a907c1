"""Fuzz the reader: thousands of mutated files each either load or raise ProgramFormatError, quickly, in bounded memory.

The mutations run in a child process (this file run as a script) under an address-space limit, so a reader
that allocated in proportion to a hostile length would die with MemoryError there rather than go unnoticed.
Half the mutations edit the JSON document or its text and then recompute the checksum, so that the reader's
structural validation is exercised and not only the checksum.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from program_testkit import HEADER_FIELDS, build_sample_graph, reseal, set_header_field, split_program

from edgerun.errors import ProgramFormatError
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program import Program
from edgerun.program.canonical_json import canonical_json_bytes
from edgerun.program.format import CHECKSUM_OFFSET, CHECKSUM_SIZE, HEADER_SIZE, Header

CASES = 2400
SEED = 20261121
MEMORY_HEADROOM = 768 * 1024 * 1024

INTERESTING_INTS = [0, 1, -1, 2, 63, 64, 65, 127, 128, 255, 256, 4096, 2**31 - 1, 2**31, 2**32, 2**48,
                    2**62, 2**63 - 1, 2**63, 2**64, 2**64 + 1, -(2**63), 10**30]
INTERESTING_VALUES: list[Any] = [None, True, False, 0.5, float("nan"), float("inf"), "", "x", "float32", "bool",
                                 "int4", [], {}, [[[[[]]]]], [-1], [0], [2**62, 2**62], "\u00e9" * 3, "a" * 5000]


def _chain_graph(n: int) -> Graph:
    g = Graph()
    v = g.add_input("x", TensorSpec((8,), DType.float16))
    scale = g.add_constant(np.linspace(0, 1, 8).astype(np.float16), name="scale")
    for i in range(n):
        (v,) = g.add_node("mul" if i % 2 else "relu", [v, scale] if i % 2 else [v],
                          [TensorSpec((8,), DType.float16)], attrs={"i": i})
    g.outputs = [v]
    return g


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every location in a JSON document, as a key/index path."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _random_value(rng: random.Random, names: list[str]) -> Any:
    choice = rng.random()
    if choice < 0.4:
        return rng.choice(INTERESTING_INTS)
    if choice < 0.55:  # a name that exists elsewhere: duplicates and mixed-up references
        return rng.choice(names)
    if choice < 0.6:
        depth = rng.choice([5, 40, 500])
        value: Any = 0
        for _ in range(depth):
            value = [value]
        return value
    return copy.deepcopy(rng.choice(INTERESTING_VALUES))


def mutate_document(rng: random.Random, doc: dict[str, Any]) -> dict[str, Any]:
    names = list(doc["graph"]["values"]) or ["x"]
    doc = copy.deepcopy(doc)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        paths = _paths(doc)
        path = rng.choice(paths[1:])
        parent: Any = doc
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        action = rng.random()
        if action < 0.55:
            parent[key] = _random_value(rng, names)
        elif action < 0.7:
            del parent[key]
        elif action < 0.8 and isinstance(parent, list):
            parent.insert(rng.randrange(len(parent) + 1), copy.deepcopy(parent[key]))
        elif action < 0.9 and isinstance(parent, dict):
            parent[rng.choice(["extra", "name", "op", "attrs", "shape", "offset"]) + rng.choice(["", "_"])] = \
                _random_value(rng, names)
        elif isinstance(parent[key], int) and not isinstance(parent[key], bool):
            parent[key] += rng.choice([-64, -1, 1, 64, 2**32])
        else:
            parent[key] = _random_value(rng, names)
    return doc


def rechecksum(raw: bytes) -> bytes:
    """Recompute the header checksum of a (possibly damaged) file when its graph bounds allow it."""
    if len(raw) < HEADER_SIZE:
        return raw
    header = Header.unpack(raw) if raw[:4] == b"EDGR" else None
    if header is None or header.graph_offset + header.graph_length > len(raw):
        return raw
    zeroed = raw[:CHECKSUM_OFFSET] + bytes(CHECKSUM_SIZE) + raw[CHECKSUM_OFFSET + CHECKSUM_SIZE:]
    digest = hashlib.sha256(zeroed[:header.graph_offset + header.graph_length]).digest()
    return raw[:CHECKSUM_OFFSET] + digest + raw[CHECKSUM_OFFSET + CHECKSUM_SIZE:]


class Mutator:
    def __init__(self, bases: list[bytes], rng: random.Random) -> None:
        self.bases = bases
        self.parts = [split_program(b) for b in bases]
        self.rng = rng

    # -- raw bytes (the checksum should catch most of these) -----------------------------------------------
    def flip(self, raw: bytes) -> bytes:
        out = bytearray(raw)
        for _ in range(self.rng.randint(1, 8)):
            out[self.rng.randrange(len(out))] ^= 1 << self.rng.randrange(8)
        return bytes(out)

    def truncate(self, raw: bytes) -> bytes:
        return raw[:self.rng.randrange(len(raw))]

    def splice(self, raw: bytes) -> bytes:
        other = self.rng.choice(self.bases)
        return raw[:self.rng.randrange(len(raw))] + other[self.rng.randrange(len(other)):]

    def insert(self, raw: bytes) -> bytes:
        at = self.rng.randrange(len(raw) + 1)
        return raw[:at] + self.rng.randbytes(self.rng.randint(1, 64)) + raw[at:]

    def delete(self, raw: bytes) -> bytes:
        at = self.rng.randrange(len(raw))
        return raw[:at] + raw[at + self.rng.randint(1, 64):]

    def header_field(self, raw: bytes) -> bytes:
        field = self.rng.choice([f for f, (_, code) in HEADER_FIELDS.items() if not code.endswith("s")])
        code = HEADER_FIELDS[field][1]
        limit = 2 ** (8 * {"<H": 2, "<I": 4, "<Q": 8}[code])
        value = self.rng.choice([v for v in [*INTERESTING_INTS, len(raw), len(raw) - 1] if 0 <= v < limit])
        damaged = set_header_field(raw, field, value)
        return rechecksum(damaged) if self.rng.random() < 0.5 else damaged

    # -- resealed: valid checksum, so the reader's validation has to do the work --------------------------
    def document(self, raw: bytes) -> bytes:
        _, doc, data = self.parts[self.bases.index(raw)]
        return reseal(mutate_document(self.rng, doc), data)

    def json_text(self, raw: bytes) -> bytes:
        _, doc, data = self.parts[self.bases.index(raw)]
        text = bytearray(canonical_json_bytes(doc))
        for _ in range(self.rng.randint(1, 4)):
            at = self.rng.randrange(len(text))
            kind = self.rng.random()
            if kind < 0.4:
                text[at] = ord(self.rng.choice('{}[],:"0123456789-.eEtfn\\ax'))
            elif kind < 0.6:
                del text[at:at + self.rng.randint(1, 16)]
            elif kind < 0.8:
                chunk = text[at:at + self.rng.randint(1, 64)]
                text[at:at] = chunk
            else:
                text[at:at] = self.rng.choice([b"\xff", b"\\ud800", b"1e999", b"-0", b"99999999999999999999",
                                               b'"", ', b"[" * 50, b"null,"])
        return reseal(None, data, graph_section=bytes(text))

    def weights(self, raw: bytes) -> bytes:
        """Change weight bytes and fix their digests: must load (or fail cleanly, e.g. a bool byte of 2)."""
        _, doc, data = self.parts[self.bases.index(raw)]
        doc = copy.deepcopy(doc)
        region = bytearray(data)
        live = [s for s in doc["segments"] if s["nbytes"]]
        if live:
            seg = self.rng.choice(live)
            at = seg["offset"] + self.rng.randrange(seg["nbytes"])
            region[at] = self.rng.randrange(256)
            digest = hashlib.sha256(region[seg["offset"]:seg["offset"] + seg["nbytes"]]).hexdigest()
            for s in doc["segments"]:
                if (s["offset"], s["nbytes"]) == (seg["offset"], seg["nbytes"]):
                    s["sha256"] = digest
        return reseal(doc, bytes(region))

    def version(self, raw: bytes) -> bytes:
        _, doc, data = self.parts[self.bases.index(raw)]
        return reseal(doc, data, major=self.rng.choice([0, 1, 1, 2, 65535]), minor=self.rng.choice([0, 1, 9]),
                      flags=self.rng.choice([0, 0, 1, 2**31]))

    def all(self) -> dict[str, Callable[[bytes], bytes]]:
        return {"flip": self.flip, "truncate": self.truncate, "splice": self.splice, "insert": self.insert,
                "delete": self.delete, "header_field": self.header_field, "document": self.document,
                "json_text": self.json_text, "weights": self.weights, "version": self.version}


RESEALED = {"document", "json_text", "weights", "version"}
WEIGHTS = {"flip": 2, "truncate": 1, "splice": 1, "insert": 1, "delete": 1, "header_field": 2,
           "document": 6, "json_text": 4, "weights": 1, "version": 1}


def run_fuzz(cases: int, seed: int) -> dict[str, Any]:
    bases = [Program(build_sample_graph()).to_bytes(), Program(_chain_graph(40)).to_bytes(),
             Program(_chain_graph(0), {"m": [1, {"k": "v"}]}).to_bytes()]
    status = Path("/proc/self/status").read_text().splitlines()
    vm_kb = int(next(line.split()[1] for line in status if line.startswith("VmSize:")))
    limit = vm_kb * 1024 + MEMORY_HEADROOM
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:  # prove the limit bites: a reader allocating this much for a hostile length would fail the same way
        bytearray(2 * MEMORY_HEADROOM)
        limit_enforced = False
    except MemoryError:
        limit_enforced = True

    rng = random.Random(seed)
    mutator = Mutator(bases, rng)
    kinds = mutator.all()
    names = [k for k in kinds for _ in range(WEIGHTS[k])]
    outcomes: Counter[str] = Counter()
    failures: list[dict[str, Any]] = []
    slowest = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "case.edgr"
        for index in range(cases):
            kind = names[index % len(names)]
            raw = kinds[kind](rng.choice(bases))
            via_mmap = index % 8 == 0
            if via_mmap:
                path.write_bytes(raw)
            start = time.perf_counter()
            try:
                program = Program.read(path) if via_mmap else Program.from_bytes(raw)
                program.program_hash()  # a loaded program must be usable, not just constructed
                outcome = "loaded"
            except ProgramFormatError as e:
                outcome = "checksum" if "checksum mismatch" in str(e) else "rejected"
            except BaseException as e:
                outcome = "FAILED"
                failures.append({"index": index, "kind": kind, "error": repr(e)[:500],
                                 "traceback": traceback.format_exc()[-2000:], "file_hex": raw[:4096].hex()})
            slowest = max(slowest, time.perf_counter() - start)
            outcomes[f"{kind}:{outcome}"] += 1
    return {"cases": cases, "outcomes": dict(outcomes), "failures": failures[:5], "failure_count": len(failures),
            "slowest_s": slowest, "limit_enforced": limit_enforced,
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def test_fuzzed_files_load_or_fail_cleanly_in_bounded_time_and_memory() -> None:
    repo_root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo_root)}
    result = subprocess.run([sys.executable, __file__, "--cases", str(CASES), "--seed", str(SEED)],
                            capture_output=True, text=True, timeout=300, env=env, cwd=repo_root)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout)
    assert report["failure_count"] == 0, json.dumps(report["failures"], indent=1)[:6000]
    assert report["cases"] >= 2000
    assert report["limit_enforced"]
    assert report["slowest_s"] < 1.0, report["slowest_s"]
    outcomes = Counter(report["outcomes"])
    total = sum(outcomes.values())
    assert total == report["cases"]
    resealed_rejected = sum(n for k, n in outcomes.items() if k.split(":")[0] in RESEALED and k.endswith(":rejected"))
    resealed_loaded = sum(n for k, n in outcomes.items() if k.split(":")[0] in RESEALED and k.endswith(":loaded"))
    # Validation, not the checksum, must have done real work, and some mutants must be valid programs.
    assert resealed_rejected >= 600, outcomes
    assert resealed_loaded >= 50, outcomes
    assert outcomes["weights:checksum"] == 0 and outcomes["document:checksum"] == 0, outcomes
    for kind in ("flip", "truncate", "splice", "insert", "delete"):
        assert outcomes[f"{kind}:loaded"] <= outcomes[f"{kind}:checksum"] + outcomes[f"{kind}:rejected"]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", type=int, default=CASES)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    print(json.dumps(run_fuzz(args.cases, args.seed)))
