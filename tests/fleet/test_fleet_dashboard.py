"""The dashboard at / in headless Chromium: releases, their stage, failure rate by version, devices."""

from __future__ import annotations

from pathlib import Path

import pytest
from fleet_helpers import FAILING_BODY, FleetServer, make_task

pytestmark = [pytest.mark.chromium, pytest.mark.xdist_group("fleet-dashboard")]



@pytest.fixture(scope="module")
def server(shared_server: FleetServer) -> FleetServer:
    return shared_server



def test_dashboard_shows_releases_stages_failure_rates_and_devices(server: FleetServer, tmp_path: Path,
                                                                    browser) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    admin = server.admin()
    good = admin.publish(make_task(tmp_path, "dash", 2), server.keys, {"steps": [100], "min_reports": 2})
    agents = [server.agent(f"dash-{i}", tmp_path / f"dash-{i}", app_version="3.1", device_groups=("lab",))
              for i in range(3)]
    for a in agents:
        a.check_in()
        a.run_task("dash")
        a.flush_reports()
    bad = admin.publish(make_task(tmp_path, "dash", 4, body=FAILING_BODY), server.keys,
                        {"steps": [100], "min_reports": 5, "error_min_reports": 2, "error_threshold": 0.5})
    for a in agents:
        a.check_in()
        a.run_task("dash")
        a.flush_reports()
    for a in agents:
        a.check_in()  # everyone now runs the rollback version v5
    for a in agents:
        a.check_in()  # the server's device table gets the latest profile on the next flush
    server.wait_seen()  # that flush, before the page first reads the table (dash-2 had v5 one flush earlier)

    browser.get(server.url + "/")
    assert browser.find_element(By.ID, "status").text == "not connected"
    assert browser.find_elements(By.CSS_SELECTOR, "#releases tbody tr") == []
    browser.find_element(By.ID, "token").send_keys(server.admin_token)
    browser.find_element(By.ID, "connect").click()
    WebDriverWait(browser, 15).until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, "#devices tbody tr")) >= 3
        and "dash@5" in d.find_element(By.ID, "devices").text)

    # The page redraws its tables every 2 s; read each table in one script call, which cannot interleave
    # with a redraw (the page's JavaScript is single-threaded).
    def table(table_id: str) -> dict[str, list[str]]:
        rows = browser.execute_script(
            "return Array.from(document.querySelectorAll('#' + arguments[0] + ' tbody tr'))"
            ".map(tr => Array.from(tr.cells).map(td => td.textContent));", table_id)
        return {"/".join(r[:2]) if table_id == "versions" else r[0]: r for r in rows}

    releases = table("releases")
    good_row, bad_row = releases[str(good["id"])], releases[str(bad["id"])]
    assert good_row[1:4] == ["dash", "2", "completed"]
    assert bad_row[1:4] == ["dash", "4", "rolled_back"] and "failure rate" in bad_row[9]
    assert bad_row[8] == "100.0%"
    versions = table("versions")
    assert versions["dash/2"][2:5] == ["3", "0", "0.0%"]
    # The breach came after two failures; the third device checked in after it and never ran v4.
    assert versions["dash/4"][2:5] == ["2", "2", "100.0%"]
    device = table("devices")["dash-0"]
    assert device[1] == "3.1" and device[3] == "lab" and "dash@5" in device[4]
    # A wrong token shows an error, not data.
    browser.execute_script("sessionStorage.clear()")
    browser.refresh()
    browser.find_element(By.ID, "token").send_keys("wrong")
    browser.find_element(By.ID, "connect").click()
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "status").text == "error 403")
