"""Models inside tasks: a task package carries an edgerun program that its script loads inside the compute
container; a program two tasks share is downloaded once (by digest), private files are not shared."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fleet_helpers import FleetServer, make_task

import edgerun
from edgerun.fleet.package import read_package, sha256_hex

POLICY = {"steps": [100], "min_reports": 100}

# The task script: the model is loaded from the task's own files, with the edgerun runtime and numpy the
# container makes importable read-only.
MODEL_TASK = """\
import numpy as np
import edgerun

def run(inputs):
    model = edgerun.load("models/din.edgerun")
    args = [np.asarray(a, dtype=d) for a, d in zip(inputs["args"], inputs["dtypes"])]
    out = np.asarray(model(*args))
    return {"score": out.tolist(), "tag": open("tag.txt").read()}
"""


@pytest.fixture(scope="module")
def din_program(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, list[np.ndarray]]:
    import edgerun.zoo

    zoo = edgerun.zoo.get("din")
    path = tmp_path_factory.mktemp("din") / "din.edgerun"
    edgerun.export(zoo.build(), zoo.example_inputs()).save(path)
    return path.read_bytes(), [np.asarray(a) for a in zoo.example_inputs()]


def _inputs(args: list[np.ndarray]) -> dict[str, Any]:
    return {"args": [a.tolist() for a in args], "dtypes": [str(a.dtype) for a in args]}


def test_model_task_runs_on_the_agent_and_shared_model_downloads_once(
        server: FleetServer, tmp_path: Path, din_program: tuple[bytes, list[np.ndarray]]) -> None:
    program, args = din_program
    admin = server.admin()
    packages = {}
    for task in ("recommend-home", "recommend-cart"):
        packages[task] = make_task(tmp_path, task, 2, body=MODEL_TASK, limits={"timeout_s": 30},
                                   files={"models/din.edgerun": program, "tag.txt": task.encode()})
        admin.publish(packages[task], server.keys, POLICY)
    shared = sha256_hex(program)
    private = {t: sha256_hex(t.encode()) for t in packages}
    for pkg in packages.values():  # the same program file, by digest, in both packages
        assert {f.path: f.sha256 for f in read_package(pkg).files}["models/din.edgerun"] == shared

    agent = server.agent("walle-phone", tmp_path / "agent")
    agent.check_in()
    assert set(agent.installer.active()) >= set(packages), agent.errors

    expected = np.asarray(edgerun.load(tmp_path / "recommend-home-v2-src" / "models" / "din.edgerun")(*args))
    for task in packages:
        result = agent.run_task(task, _inputs(args))
        assert result.ok, result.error
        assert result.output["tag"] == task
        np.testing.assert_allclose(np.asarray(result.output["score"]), expected, rtol=1e-6, atol=1e-7)
    assert agent.flush_reports() == 2
    assert admin.device("walle-phone")["reports"] == {"success": 2}

    counts = httpx.get(server.url + "/v1/admin/blob-downloads",
                       headers={"Authorization": f"Bearer {server.admin_token}"}, timeout=10).json()
    assert counts[shared] == 1  # one download for both tasks: stored once by digest on the device
    for task, digest in private.items():
        assert counts[digest] == 1, task  # each task's own file, fetched for that task alone
    # Both version folders hold their own copy of the model, built from the one verified blob.
    folders = {t: agent.installer.active()[t][1] for t in packages}
    assert all((f / "models" / "din.edgerun").read_bytes() == program for f in folders.values())
    admin.close()


def test_model_task_sees_the_search_cache_read_only(server: FleetServer, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "search-cache"
    (cache / "tuned").mkdir(parents=True)
    (cache / "tuned" / "entry.json").write_text('{"placement": "cached"}')
    cache.chmod(0o755)
    monkeypatch.setenv("EDGERUN_CACHE_DIR", str(cache))
    body = """\
import os
from edgerun.search import cache_dir

def run(inputs):
    root = cache_dir()
    seen = open(os.path.join(root, "tuned", "entry.json")).read()
    try:
        open(os.path.join(root, "tuned", "mine.json"), "w").write("x")
        wrote = True
    except OSError:
        wrote = False
    return {"root": str(root), "seen": seen, "wrote": wrote}
"""
    admin = server.admin()
    admin.publish(make_task(tmp_path, "cache-reader", 2, body=body, limits={"timeout_s": 30}), server.keys, POLICY)
    agent = server.agent("cache-phone", tmp_path / "agent")
    agent.check_in()
    result = agent.run_task("cache-reader")
    assert result.ok, result.error
    assert result.output == {"root": str(cache.resolve()), "seen": '{"placement": "cached"}', "wrote": False}
    assert not (cache / "tuned" / "mine.json").exists()
    admin.close()
