"""At-least-once delivery + idempotent storage = every record in the cloud exactly once, through kill -9.

50 trials: a forked device process stores new records and uploads them; the test SIGKILLs it at a random
moment, and in every third trial exactly between the cloud's 200 and the device marking the batch (the
child SIGSTOPs itself there). Every tenth trial the cloud end is killed with SIGKILL too and restarted.
At the end one clean upload runs, and the cloud must hold exactly the records the device committed.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from stream_helpers import CloudServer

from edgerun.stream.storage import CollectiveStore
from edgerun.stream.uploader import Backoff, Uploader

TRIALS = 50
RECORDS_PER_TRIAL = 8


def device_process(db: Path, url: str, trial: int, ack_fd: int, stop_after_send: bool) -> None:
    """The device: store a trial's records (flushing in small transactions), then upload; never returns."""
    try:
        store = CollectiveStore(db, flush_threshold=3)
        for i in range(RECORDS_PER_TRIAL):
            store.put("feature", {"trial": trial, "i": i, "pad": "x" * 200}, record_id=f"t{trial}-r{i}")
            if store.flush():
                os.write(ack_fd, f"t{trial}-r{i}\n".encode())  # durable from here on
        store.flush()

        def stop_here(_records: object) -> None:
            os.kill(os.getpid(), signal.SIGSTOP)

        uploader = Uploader(store, url, "dev-kill", batch_records=4, backoff=Backoff(base_s=0.02, cap_s=0.1),
                            after_send=stop_here if stop_after_send else None)
        uploader.upload_all(timeout_s=30)
    finally:
        os._exit(0)


def committed_ids(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        return {rid for (rid,) in conn.execute("SELECT record_id FROM outputs")}


@pytest.mark.slow
def test_kill_9_mid_upload_loses_nothing_and_duplicates_nothing(tmp_path: Path) -> None:
    cloud = CloudServer(tmp_path).start_forked()
    db = tmp_path / "device" / "outputs.db"
    CollectiveStore(db).close()
    rng = random.Random(794)
    acked: set[str] = set()
    kills_after_send = 0
    try:
        for trial in range(TRIALS):
            cloud_down = trial % 10 == 5  # five restarts of the cloud end
            if cloud_down:
                cloud.kill()
            stop_after_send = trial % 3 == 0 and not cloud_down
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read_fd)
                device_process(db, cloud.url, trial, write_fd, stop_after_send)
            os.close(write_fd)
            if cloud_down:
                cloud.start_forked(wait=False)  # the device retries with backoff while the cloud boots
            if stop_after_send:
                _, status = os.waitpid(pid, os.WUNTRACED)
                if os.WIFSTOPPED(status):
                    kills_after_send += 1
            else:
                time.sleep(rng.uniform(0.0, 0.06))
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            with os.fdopen(read_fd) as acks:
                acked.update(acks.read().split())
            if cloud_down:
                cloud.wait_ready()

        committed = committed_ids(db)
        assert acked <= committed, "a record acknowledged as durable was lost by kill -9"
        assert len(committed) >= TRIALS  # the trials got far enough to store something each time

        store = CollectiveStore(db)
        Uploader(store, cloud.url, "dev-kill", backoff=Backoff(base_s=0.02, cap_s=0.1)).upload_all(timeout_s=30)
        assert store.counters()["pending"] == 0

        received = cloud.records(device_id="dev-kill")
        counts = collections.Counter(r["record_id"] for r in received)
        assert set(counts) == committed, "the cloud must hold exactly the records the device committed"
        assert max(counts.values()) == 1
        for record in received:
            trial, i = record["record_id"][1:].split("-r")
            assert record["payload"] == {"trial": int(trial), "i": int(i), "pad": "x" * 200}
        # The stop-after-send trials made the device resend batches the cloud had already stored.
        assert kills_after_send >= 10
        assert cloud.stats()["duplicates_received"] >= kills_after_send
    finally:
        cloud.stop()
