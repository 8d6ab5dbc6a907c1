"""`edgerun serve` runs the device server of the remote runtime; `edgerun remote keys init` makes CURVE keys."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from pathlib import Path

from edgerun.errors import EdgerunError


def read_tokens(path: str) -> list[str]:
    """The token file: one token a line, each naming its own client (for per-client quotas)."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise EdgerunError(f"cannot read the token file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    tokens = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if not tokens:
        raise EdgerunError(f"the token file {path} holds no token")
    return tokens


def read_program_digests(path: str) -> set[str]:
    """The --allow-programs file: SHA-256 digests (hex) of the program files clients may upload, one a line
    (`sha256sum *.erp` output works: the first word of each line counts)."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise EdgerunError(f"cannot read the program list {path}: {getattr(exc, 'strerror', None) or exc}") from None
    digests = {line.split()[0].lower() for line in lines if line.strip() and not line.startswith("#")}
    bad = sorted(d for d in digests if len(d) != 64 or any(c not in "0123456789abcdef" for c in d))
    if bad:
        raise EdgerunError(f"{path}: {bad[0][:80]!r} is not a SHA-256 digest (64 hex characters)")
    return digests


def _serve(args: argparse.Namespace) -> int:
    from edgerun.remote.keys import read_allowed_keys, read_key_pair
    from edgerun.remote.wire import Limits
    from edgerun.remote_server.server import DeviceServer
    from edgerun.remote_server.sessions import SessionLimits, default_total_bytes

    tokens = read_tokens(args.token_file) if args.token_file else None
    curve_secret = read_key_pair(args.curve_secret) if args.curve_secret else None
    curve_allow = read_allowed_keys(args.curve_allow) if args.curve_allow else None
    limits = Limits(max_message_bytes=args.max_message_mb << 20, max_tensor_bytes=args.max_message_mb << 20)
    mb = 1 << 20
    quotas = SessionLimits(
        max_sessions=args.max_sessions, max_sessions_per_client=args.max_sessions_per_client,
        max_bytes=args.max_session_mb * mb, max_client_bytes=args.max_client_mb * mb,
        max_total_bytes=args.max_total_mb * mb if args.max_total_mb else default_total_bytes())
    allowed = read_program_digests(args.allow_programs) if args.allow_programs else None
    server = DeviceServer(tokens, host=args.host, port=args.port, backends=args.backends.split(","),
                          limits=limits, session_limits=quotas, curve_secret=curve_secret,
                          curve_allow=curve_allow, allow_plaintext=args.insecure_plaintext,
                          allowed_programs=allowed, handshake_burst=args.handshake_burst,
                          handshake_refill_s=args.handshake_refill_s)
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    # Tests and scripts wait for this line; it carries the real port when --port 0 picked one.
    security = "CURVE" if curve_secret else "token (PLAIN, not encrypted)"
    print(f"edgerun serve: listening on {server.url} with backends {server.backends}, {security}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    print("edgerun serve: stopped", file=sys.stderr)
    return 0


def _keys_init(args: argparse.Namespace) -> int:
    from edgerun.remote.keys import init_keys

    public, secret = init_keys(args.dir, args.name)
    print(f"wrote {public} (public: give it to the other side) and {secret} (secret, mode 0600)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve this device's backends to remote edgerun clients")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    p.add_argument("--port", type=int, default=7000, help="TCP port (0: pick a free one and print it)")
    p.add_argument("--token-file", help="file of client tokens, one a line (with CURVE: a second factor)")
    p.add_argument("--curve-secret", metavar="FILE", help="this server's secret key file (NAME.key_secret): "
                                                          "CURVE encryption and client keys")
    p.add_argument("--curve-allow", nargs="+", metavar="PATH",
                   help="client public key files (NAME.key), or folders of them, allowed to connect")
    p.add_argument("--insecure-plaintext", action="store_true",
                   help="allow a token-only server beyond loopback (token and tensors travel in the clear)")
    p.add_argument("--backends", default="reference", help="comma-separated backends to host")
    p.add_argument("--allow-programs", metavar="FILE",
                   help="SHA-256 digests of the program files clients may upload, one a line (default: any)")
    p.add_argument("--handshake-burst", type=int, default=10,
                   help="failed handshakes a peer address may make at once before it is throttled")
    p.add_argument("--handshake-refill-s", type=float, default=6.0,
                   help="seconds per further failed handshake allowed to a throttled peer address")
    p.add_argument("--max-message-mb", type=int, default=1024,
                   help="largest message accepted, all its frames together, in MiB")
    p.add_argument("--max-sessions", type=int, default=16, help="sessions on this device, all clients")
    p.add_argument("--max-sessions-per-client", type=int, default=4, help="sessions one client may hold")
    p.add_argument("--max-session-mb", type=int, default=4096,
                   help="declared bytes per session (tensors, program files, arenas), in MiB")
    p.add_argument("--max-client-mb", type=int, default=8192, help="declared bytes of one client's sessions, MiB")
    p.add_argument("--max-total-mb", type=int, default=0,
                   help="declared bytes of all sessions, MiB (default: 75%% of available memory at start)")
    p.set_defaults(func=_serve)

    p = sub.add_parser("remote", help="remote runtime tools: `remote keys init DIR` makes a CURVE key pair")
    remote = p.add_subparsers(dest="remote_command", metavar="COMMAND", required=True)
    keys = remote.add_parser("keys", help="CURVE key pairs").add_subparsers(dest="keys_command", metavar="COMMAND",
                                                                            required=True)
    k = keys.add_parser("init", help="write DIR/NAME.key (public) and DIR/NAME.key_secret (0600)")
    k.add_argument("dir")
    k.add_argument("--name", default="server", help="file name stem (default: server)")
    k.set_defaults(func=_keys_init)
