"""A standalone cloud end: the stream router alone in a FastAPI app, for the tunnel tests and local demos.

    python -m edgerun.stream.cloud_app --db sqlite:///cloud.db --port 8765 \
        [--device-tokens-file F] [--admin-token-file F]

Tokens come from files (mode 0600; DEVICE=TOKEN lines for the devices) or $EDGERUN_STREAM_ADMIN_TOKEN,
never from argv: `ps` and /proc/PID/cmdline show every process's arguments to every user.

In production the fleet server mounts the same router (edgerun/fleet/stream_mount.py).
"""

from __future__ import annotations

import argparse
import hmac
import sys

import sqlalchemy as sa
from fastapi import FastAPI

from edgerun.errors import EdgerunError
from edgerun.secret_files import read_secret_file, secret_from
from edgerun.stream.body_limit import BodyLimit, BodyRule, Scope, bearer
from edgerun.stream.cloud import MAX_BATCH_BYTES, build_router
from edgerun.stream.large_records import MAX_PART_BODY

SMALL_BODY = 64 * 1024
ADMIN_TOKEN_ENV = "EDGERUN_STREAM_ADMIN_TOKEN"


def sqlite_engine(url: str) -> sa.Engine:
    engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @sa.event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection, _record):  # type: ignore[no-untyped-def]
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    return engine


def create_app(db_url: str, device_tokens: dict[str, str] | None = None, admin_token: str | None = None) -> FastAPI:
    """`device_tokens` (device id → token) turns authentication on, as the fleet server has it."""
    engine = sqlite_engine(db_url) if db_url.startswith("sqlite") else sa.create_engine(db_url)
    verify_device = verify_admin = None
    if device_tokens is not None:
        tokens = dict(device_tokens)

        def verify_device(device_id: str, token: str) -> bool:
            expected = tokens.get(device_id)
            return expected is not None and hmac.compare_digest(expected, token)

        def verify_admin(token: str) -> bool:
            return admin_token is not None and hmac.compare_digest(admin_token, token)

    app = FastAPI(title="edgerun stream cloud end")
    app.include_router(build_router(engine, verify_device, verify_admin), prefix="/v1/stream")
    known = set(device_tokens.values()) if device_tokens is not None else None

    def upload_caller(scope: Scope) -> tuple[int, str] | None:
        """Before a byte of a batch is read: some device's token (the batch names which device)."""
        if known is None:
            return None
        token = bearer(scope)
        if token is None:
            return 401, "missing bearer token"
        return None if any(hmac.compare_digest(token, t) for t in known) else (403, "unknown device token")

    def body_rule(scope: Scope) -> BodyRule:
        if scope["path"] == "/v1/stream/batches":
            return BodyRule(MAX_BATCH_BYTES, upload_caller)
        if scope["path"].startswith("/v1/stream/large/parts/"):
            return BodyRule(MAX_PART_BODY, upload_caller)
        return BodyRule(SMALL_BODY)

    app.add_middleware(BodyLimit, rule_for=body_rule)
    return app


def read_device_tokens(path: str) -> dict[str, str]:
    """The devices file: one `DEVICE=TOKEN` a line; blank lines and `#` comments skipped. Errors name the
    line, never its text (it holds a token)."""
    tokens: dict[str, str] = {}
    for number, line in enumerate(read_secret_file(path).splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        device, sep, token = (part.strip() for part in line.partition("="))
        if not (sep and device and token):
            raise EdgerunError(f"{path} line {number}: expected DEVICE=TOKEN")
        tokens[device] = token
    if not tokens:
        raise EdgerunError(f"{path} holds no DEVICE=TOKEN line")
    return tokens


def tokens_from_args(args: argparse.Namespace) -> tuple[dict[str, str] | None, str | None]:
    """(device tokens or None, admin token or None) as `create_app` takes them."""
    devices = read_device_tokens(args.device_tokens_file) if args.device_tokens_file else None
    return devices, secret_from(args.admin_token_file, ADMIN_TOKEN_ENV) or None


def main() -> None:
    import uvicorn

    # allow_abbrev=False: `--admin-token SECRET` must fail, not pass as `--admin-token-file SECRET`.
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", required=True, help="SQLAlchemy URL, e.g. sqlite:////tmp/cloud.db")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--device-tokens-file", metavar="FILE",
                        help="file of DEVICE=TOKEN lines, mode 600: accept these devices (turns authentication on)")
    parser.add_argument("--admin-token-file", metavar="FILE",
                        help=f"file holding the token that may read every record, mode 600 (default: ${ADMIN_TOKEN_ENV})")
    args = parser.parse_args()
    try:
        devices, admin = tokens_from_args(args)
    except EdgerunError as exc:
        sys.exit(f"edgerun.stream.cloud_app: error: {exc}")
    uvicorn.run(create_app(args.db, devices, admin), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
