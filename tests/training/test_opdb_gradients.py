"""The op_db gradient check (bench/torch_opdb_gradients.py runs it over every claimed OpInfo) on two ops."""

from __future__ import annotations

import warnings

from edgerun.frontends.torch.conformance import claimed_opinfos
from edgerun.training.opdb_gradients import run_opinfo


def test_torch_samples_of_embedding_and_max_pool_match_torch_autograd() -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)
    ops = claimed_opinfos({"nn.functional.embedding", "nn.functional.max_pool2d"})
    assert len(ops) == 2
    results = [r for op in ops for r in run_opinfo(op, max_samples=4)]
    outcomes = {(r.op, r.index): r.outcome for r in results}
    assert "wrong" not in outcomes.values(), [r for r in results if r.outcome == "wrong"]
    assert outcomes[("nn.functional.embedding", 3)] == "pass"  # padding_idx: that row takes no gradient
    assert sum(o == "pass" for o in outcomes.values()) >= 6
