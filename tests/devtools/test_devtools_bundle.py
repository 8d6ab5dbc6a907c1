"""carve and the bundle format: every op instance recorded, arrays deduplicated, size bounded, no pickle."""

import json
from pathlib import Path

import numpy as np
from devtools_testkit import npy_is_plain

from edgerun.devtools.bundle import BundlePolicy, TestBundle
from edgerun.devtools.carve import carve
from edgerun.devtools.check import case_graph
from edgerun.devtools.fault_proof import proof_loaded, realistic_inputs
from edgerun.oracle import interpret


def test_carve_records_every_op_instance_and_round_trips(tmp_path: Path) -> None:
    loaded = proof_loaded()
    inputs = realistic_inputs(2)
    bundle = carve(loaded, inputs, BundlePolicy(max_cases_per_signature=10))
    assert len(bundle) == 2 * len(loaded.graph.nodes)
    assert {c.node for c in bundle} == {n.name for n in loaded.graph.nodes}
    bundle.save(tmp_path / "b")
    back = TestBundle.read(tmp_path / "b")
    assert [c.id for c in back] == [c.id for c in bundle]
    # Each carved case replays to its own recorded output through the reference interpreter.
    for case in back.cases[:10]:
        ins, outs = back.case_arrays(case)
        got = interpret(case_graph(case), [a for a in ins if a is not None], decompose=False)
        for g, o in zip(got, outs):
            np.testing.assert_array_equal(g, o)


def test_bundle_stores_no_pickle_and_dedupes_by_content(tmp_path: Path) -> None:
    loaded = proof_loaded()
    same = realistic_inputs(1)
    bundle = carve(loaded, same + same, BundlePolicy(max_cases_per_signature=10))
    bundle.save(tmp_path / "b")
    index = json.loads((tmp_path / "b" / "index.json").read_text())
    files = list((tmp_path / "b" / "arrays").iterdir())
    assert all(f.suffix == ".npy" and npy_is_plain(f) for f in files)
    hashes = {r["hash"] for c in index["cases"] for r in c["inputs"] + c["outputs"] if r["hash"]}
    assert len(files) == len(hashes)
    once = carve(loaded, same, BundlePolicy(max_cases_per_signature=10))
    assert bundle.array_bytes == once.array_bytes  # the second identical run added no array bytes
    assert sum(f.stat().st_size for f in files) < 1.2 * bundle.array_bytes + 200 * len(files)
    assert all(b"pickle" not in f.read_bytes()[:128] for f in files)


def test_size_policy_bounds_cases_and_bytes() -> None:
    loaded = proof_loaded()
    inputs = realistic_inputs(3)
    per_sig = carve(loaded, inputs, BundlePolicy(max_cases_per_signature=1))
    assert len({c.signature for c in per_sig}) == len(per_sig)
    assert sum(per_sig.dropped.values()) == 3 * len(loaded.graph.nodes) - len(per_sig)
    capped = carve(loaded, inputs, BundlePolicy(max_cases_per_signature=10, max_bytes=100_000))
    assert capped.array_bytes <= 100_000 and sum(capped.dropped.values()) > 0
