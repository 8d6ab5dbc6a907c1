"""The database restarting under a running server: requests that need it fail cleanly meanwhile (503, one
line, retryable), an up-to-date device is still answered, and afterwards everything works again with exact
counts: reports kept by agents during the outage count once, the step monitor leads again."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from fleet_helpers import leads_step_monitor, make_task, wait_until

from edgerun.fleet.local_postgres import LocalPostgres, postgres_bin_dir
from edgerun.fleet.local_server import start_server
from edgerun.fleet.signing import KeyDir

pytestmark = [pytest.mark.xdist_group("fleet-replicas"),
              pytest.mark.skipif(postgres_bin_dir() is None, reason="PostgreSQL binaries not installed")]


def test_the_server_survives_a_database_restart(tmp_path: Path) -> None:
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    with LocalPostgres() as pg:
        server = start_server(tmp_path, keys, db_url=pg.url)
        try:
            admin = server.admin()
            agents = [server.agent(f"pgr-{i}", tmp_path / f"pgr-{i}") for i in range(4)]
            for a in agents:
                a.check_in()
            server.wait_seen()
            rel = admin.publish(make_task(tmp_path, "pgr", 2), keys, {"steps": [100], "min_reports": 4})
            for a in agents:
                a.check_in()
                assert a.profile().tasks["pgr"] == 2
                assert a.run_task("pgr").outcome == "success"
            for a in agents[:2]:
                assert a.flush_reports() == 1
            wait_until(lambda: leads_step_monitor(server.url))

            pg.shut_down()
            ready = httpx.get(server.url + "/v1/ready", timeout=10)
            assert ready.status_code == 503 and any(p.startswith("database") for p in ready.json()["problems"])
            # An up-to-date device is still answered: nothing can change a release while the database is away.
            assert agents[0].check_in() is False
            # What needs the database gets a clean, retryable 503; the agent keeps its report.
            with pytest.raises(httpx.HTTPStatusError) as refused:
                agents[2].flush_reports()
            assert refused.value.response.status_code == 503
            assert refused.value.response.headers["retry-after"] == "1"
            assert "database is unavailable" in refused.value.response.json()["detail"]
            assert len(agents[2].state.pending_reports()) == 1
            answer = httpx.get(f"{server.url}/v1/admin/releases/{rel['id']}",
                               headers={"Authorization": f"Bearer {server.admin_token}"}, timeout=10)
            assert answer.status_code == 503

            pg.start_again()
            wait_until(lambda: httpx.get(server.url + "/v1/ready", timeout=10).status_code == 200)
            batch = agents[3].state.pending_reports()
            for a in agents[2:]:
                assert a.flush_reports() == 1
            # A report resent after the restart (as if its answer had been lost) is not counted again.
            resent = httpx.post(f"{server.url}/v1/devices/pgr-3/reports", json={"reports": batch},
                                headers=agents[3]._auth(), timeout=10)
            assert resent.json() == {"accepted": 0}
            state = admin.release(rel["id"])
            assert (state["stage"], state["total_success"], state["total_failure"]) == ("completed", 4, 0)
            # The step monitor's leadership ended with its connection; it takes it again.
            wait_until(lambda: leads_step_monitor(server.url))
            late = server.agent("pgr-late", tmp_path / "pgr-late")
            late.check_in()
            assert late.profile().tasks["pgr"] == 2
            admin.close()
        finally:
            server.stop()
