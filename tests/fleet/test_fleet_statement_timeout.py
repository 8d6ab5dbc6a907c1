"""PostgreSQL cancels a server's statement that runs past `--db-statement-timeout-ms` (a lock wait included):
the request gets a clean, retryable 503 that says so, its connection goes back to the pool, and the process
keeps serving. The limit is the server's option: a replica with a longer one, on the same database and behind
the same held lock, keeps waiting and is answered once the lock is let go."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from fleet_helpers import database_url, start_server, wait_until

from edgerun.fleet.database import create_engine
from edgerun.fleet.signing import KeyDir

pytestmark = pytest.mark.xdist_group("fleet-replicas")

SHORT_MS = 300

# Backends of the fleet database waiting for a lock on the audit table, and for how long their statement has run.
LOCK_WAITS = sa.text("""
    SELECT extract(epoch FROM now() - a.query_start) AS waited_s
    FROM pg_locks l JOIN pg_class c ON c.oid = l.relation JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE c.relname = 'audit' AND NOT l.granted""")


def lock_waits(engine: sa.Engine) -> list[float]:
    with engine.connect() as conn:  # a transaction of its own: now() and pg_stat_activity are read afresh
        return [float(s) for (s,) in conn.execute(LOCK_WAITS)]


def test_a_statement_past_the_timeout_is_cancelled_and_the_server_keeps_serving(
        request: pytest.FixtureRequest, tmp_path: Path) -> None:
    url = database_url(request, "postgresql")
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    short = start_server(tmp_path / "short", keys, "--db-statement-timeout-ms", str(SHORT_MS), db_url=url)
    patient = start_server(tmp_path / "patient", keys, "--db-statement-timeout-ms", "600000", db_url=url)
    outside = create_engine(url)
    try:
        with outside.connect() as conn:
            assert conn.execute(sa.text("SHOW statement_timeout")).scalar() == "30s"  # the default
        tuned = create_engine(url, statement_timeout_ms=250)
        with tuned.connect() as conn:
            assert conn.execute(sa.text("SHOW statement_timeout")).scalar() == "250ms"
        tuned.dispose()

        admin = {"Authorization": f"Bearer {short.admin_token}"}
        holder = outside.connect()
        try:
            # An operator's transaction holds the audit table: every read of it waits behind the lock.
            holder.execute(sa.text("LOCK TABLE audit IN ACCESS EXCLUSIVE MODE"))
            refused = httpx.get(short.url + "/v1/admin/audit", headers=admin, timeout=60)
            assert refused.status_code == 503, refused.text
            assert refused.headers["retry-after"] == "1"
            assert "ran past the server's time limit" in refused.json()["detail"]

            with ThreadPoolExecutor(1) as pool:
                waiting = pool.submit(httpx.get, patient.url + "/v1/admin/audit", headers=admin, timeout=120)
                # The patient replica's read is still queued on the lock well past the short replica's limit.
                wait_until(lambda: any(s > 3 * SHORT_MS / 1000 for s in lock_waits(outside)))
                assert not waiting.done()
                holder.commit()  # the lock is let go
                assert waiting.result().status_code == 200
        finally:
            holder.close()

        # The short replica is still up, its pool still works, and it serves the same read now.
        assert short.proc.poll() is None
        assert httpx.get(short.url + "/v1/admin/audit", headers=admin, timeout=60).status_code == 200
        assert httpx.get(short.url + "/v1/ready", timeout=60).status_code == 200
        log = short.log.read_text()
        assert "database statement timed out" in log and "Traceback" not in log
    finally:
        outside.dispose()
        short.stop()
        patient.stop()
