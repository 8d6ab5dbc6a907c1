"""The IPV example: on-device features from raw events equal the cloud-style join, and are far smaller."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from edgerun.cli import main
from edgerun.stream.event_queue import EventEmitter
from edgerun.stream.ipv import (
    IPV_TRIGGER,
    IPV_TRIGGER_SPAN,
    ITEM_PAGE,
    cloud_join_ipv,
    generate_session,
    ipv_feature,
)
from edgerun.stream.pipeline import DevicePipeline


def test_device_ipv_features_equal_the_cloud_join(tmp_path: Path) -> None:
    events = generate_session(random.Random(5), 1_700_000_000_000, 40)
    pipeline = DevicePipeline(tmp_path)
    pipeline.register_task("ipv", [IPV_TRIGGER], lambda match: ipv_feature(match.events))
    pipeline.register_task("ipv_span", [IPV_TRIGGER_SPAN], lambda match: ipv_feature(match.events))
    EventEmitter(tmp_path).emit_events(events)
    pipeline.pump(len(events))
    features = [r.payload for r in pipeline.store.read("ipv")]
    expected = cloud_join_ipv(events)
    assert len(features) == 40
    assert features == json.loads(json.dumps(expected))
    # The page visit from the page-level sequence and the enter..exit span are the same events.
    assert [r.payload for r in pipeline.store.read("ipv_span")] == features
    visit = [e for e in events if e.page_id == ITEM_PAGE][: features[0]["events"]]
    assert features[0]["kind_counts"]["page_enter"] == 1 and features[0]["dwell_ms"] == (
        visit[-1].time_ms - visit[0].time_ms)
    raw = sum(len(e.to_json()) for e in events if e.page_id == ITEM_PAGE)
    assert sum(len(json.dumps(f)) for f in features) < 0.1 * raw  # the paper's "more than 90% saved"
    assert all("device" not in json.dumps(f) for f in features)  # redundant fields filtered out


def test_cli_ipv_demo_emit_stats_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stream", "ipv-demo", "--visits", "10"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["features"] == 10 and report["reduction"] > 0.9
    assert main(["stream", "emit", "--state-dir", str(tmp_path), "--kind", "click", "--page", "home",
                 "--event-id", "click.banner", "--contents", '{"slot": 2}']) == 0
    assert json.loads(capsys.readouterr().out)["contents"] == {"slot": 2}
    assert main(["stream", "stats", "--state-dir", str(tmp_path)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["queue"]["queued"] == 1 and stats["queue"]["events_emitted"] == 1
    assert main(["stream", "read", "--state-dir", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["stream", "emit", "--state-dir", str(tmp_path), "--kind", "click", "--page", "home",
                 "--contents", "[1]"]) == 1
    assert "JSON object" in capsys.readouterr().err
    assert main(["stream", "stats", "--state-dir", str(tmp_path / "missing")]) == 1
