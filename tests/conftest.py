"""Fixtures shared across areas. Each area's own fixtures live in its folder's conftest.py."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--numpy-only", action="store_true",
                     help="the numpy-only tier (make test-fast): skip what imports torch, onnx, transformers, ...")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--numpy-only"):
        from numpy_only import install

        install()


@pytest.fixture(autouse=True)
def _no_machine_load_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """The search retakes a measurement taken while the machine was busy once a load finds it quiet
    (edgerun/search/machine_load.py); on a shared CI machine that would happen whenever it went quiet
    mid-suite. Tests that check it inject their own probe."""
    monkeypatch.setenv("EDGERUN_PROBE_MACHINE_LOAD", "0")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """Debian's headless Chromium driven by selenium, with a fresh profile and no background networking
    (the machine's network is closed; without these flags Chromium keeps trying to reach Google)."""
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.skip("Debian's chromium and chromium-driver are not installed")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    yield driver
    driver.quit()
    shutil.rmtree(tmp_path / "chromium-profile", ignore_errors=True)
