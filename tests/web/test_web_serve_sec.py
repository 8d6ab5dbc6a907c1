"""`edgerun web serve` shows the bundle and nothing else: no folder listings, no links followed out of it
(docs/security.md, row W1)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from edgerun.web.server import REQUIRED, make_server


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("the machine's secret")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    for name in REQUIRED:
        (bundle / name).write_text(f"contents of {name}")
    (bundle / "assets").mkdir()
    (bundle / "assets" / "a.js").write_text("a")
    os.symlink(outside / "secret.txt", bundle / "link.txt")
    os.symlink(outside, bundle / "linked-folder")
    os.symlink(tmp_path / "bundle", tmp_path / "bundle-link")
    server = make_server(tmp_path / "bundle-link", port=0)  # named through a link: fine
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_bundle_files_are_served(served: str) -> None:
    assert httpx.get(served + "/").text == "contents of index.html"
    assert httpx.get(served + "/plan.json").text == "contents of plan.json"
    assert httpx.get(served + "/assets/a.js").text == "a"


@pytest.mark.parametrize("path", ["/assets/", "/assets", "/link.txt", "/linked-folder/secret.txt", "/linked-folder/",
                                  "/../outside/secret.txt", "/%2e%2e/outside/secret.txt"])
def test_no_listings_and_no_links_out(served: str, path: str) -> None:
    r = httpx.get(served + path)
    assert r.status_code == 404, (path, r.text[:200])
    assert "secret" not in r.text and "a.js" not in r.text
