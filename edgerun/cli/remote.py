"""`edgerun serve`: run the device server of the remote runtime."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from pathlib import Path

from edgerun.errors import EdgerunError


def _serve(args: argparse.Namespace) -> int:
    from edgerun.remote.server import DeviceServer
    from edgerun.remote.wire import Limits

    try:
        token = Path(args.token_file).read_text().strip()
    except OSError as exc:
        raise EdgerunError(f"cannot read the token file {args.token_file}: {exc.strerror}") from None
    limits = Limits(max_message_bytes=args.max_message_mb << 20, max_tensor_bytes=args.max_message_mb << 20)
    server = DeviceServer(token, host=args.host, port=args.port, backends=args.backends.split(","),
                          limits=limits)
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    # Tests and scripts wait for this line; it carries the real port when --port 0 picked one.
    print(f"edgerun serve: listening on {server.url} with backends {server.backends}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    print("edgerun serve: stopped", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve this device's backends to remote edgerun clients")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    p.add_argument("--port", type=int, default=7000, help="TCP port (0: pick a free one and print it)")
    p.add_argument("--token-file", required=True, help="file holding the shared secret clients must send")
    p.add_argument("--backends", default="reference", help="comma-separated backends to host")
    p.add_argument("--max-message-mb", type=int, default=1024, help="largest message accepted, in MiB")
    p.set_defaults(func=_serve)
