"""`edgerun web serve DIR`: the bundle's files over HTTP on loopback, the chat page at /.

WebGPU needs a secure context; http://127.0.0.1 and http://localhost are secure, so no certificate is needed
for a local page. Static files only: the page does all the work in the browser. Only regular files reached
without a link are served: no folder listings (404), and a link in the bundle (to a file or folder
outside it, or anywhere) answers 404, so the server shows the bundle and nothing else of the machine.
"""

from __future__ import annotations

import functools
import os
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from edgerun.errors import EdgerunError

REQUIRED = ("index.html", "runtime.js", "plan.json", "weights.bin", "model.json")


class _Handler(SimpleHTTPRequestHandler):
    extensions_map = {**SimpleHTTPRequestHandler.extensions_map, ".js": "text/javascript",
                      ".json": "application/json", ".bin": "application/octet-stream"}

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the page fetches a handful of files
        pass

    def send_head(self) -> Any:
        path = self.translate_path(self.path)  # under the bundle's real folder; `..` segments are dropped
        if os.path.isdir(path):
            path = os.path.join(path, "index.html")
        # A link anywhere on the way makes the real path differ from the spelled one.
        if os.path.realpath(path) != os.path.abspath(path) or not os.path.isfile(path):
            self.send_error(404, "File not found")
            return None
        return super().send_head()

    def list_directory(self, path: Any) -> None:
        self.send_error(404, "File not found")  # never a listing (reached only for a folder without index.html)
        return None


def check_bundle(folder: str) -> None:
    missing = [f for f in REQUIRED if not os.path.isfile(os.path.join(folder, f))]
    if missing:
        raise EdgerunError(f"{folder!r} is not a web bundle (missing {missing}); write one with "
                           "`edgerun web export MODEL -o DIR`")


def make_server(folder: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 8080) -> ThreadingHTTPServer:
    """The server, bound (port 0 picks a free one); call serve_forever() on it."""
    folder = os.path.realpath(os.fspath(folder))  # the bundle may be named through a link; inside it, none
    check_bundle(folder)
    return ThreadingHTTPServer((host, port), functools.partial(_Handler, directory=folder))


def serve(folder: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 8080) -> None:
    server = make_server(folder, host, port)
    print(f"edgerun web: http://{host}:{server.server_address[1]}/ (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
