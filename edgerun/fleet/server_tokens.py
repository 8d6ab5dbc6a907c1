"""The server's own tokens (admin, and its enrolment token), one pair for every replica, kept in the database.

Each replica reads its tokens from files or the environment (given), or generates them once into its data
folder. The database holds their hashes, so every replica accepts the same tokens whichever host answers:
- a given token is the operator's word and replaces the stored one (a changed token file, rolled out to
  the hosts, takes the old token out of service everywhere at the first restart);
- a generated token is only a convenience of a first, single host: when the database already holds another
  one (a second host started with its own data folder and no token files), the server refuses to start and
  says which files to copy, instead of silently putting the first host's tokens out of service.
Concurrent first starts are serialised by a lock, so exactly one generated token wins.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import sqlalchemy as sa

from edgerun.fleet import releases as rel
from edgerun.fleet.errors import FleetError
from edgerun.fleet.schema import enrolment_tokens, server_secrets

ADMIN = "admin"
SERVER_TOKEN_LABEL = "server"  # the label of the server's own enrolment token in `enrolment_tokens`


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _conflict(name: str, generated_at: Path, option: str) -> FleetError:
    return FleetError(f"this database already holds another {name} token (made by another server): give every "
                      f"server the same token files ({option} FILE; copy {generated_at.name} from the first "
                      f"host's data folder), see docs/fleet.md 'Several hosts'")


def install_admin_token(engine: sa.Engine, token: str, given: bool, generated_at: Path) -> None:
    h = token_hash(token)
    with engine.begin() as conn:
        rel.write_lock(conn, "server-tokens")
        stored = conn.execute(sa.select(server_secrets.c.token_hash).where(server_secrets.c.name == ADMIN)).scalar()
        if stored == h:
            return
        if stored is not None and not given:
            raise _conflict("admin", generated_at, "--admin-token-file")
        conn.execute(server_secrets.delete().where(server_secrets.c.name == ADMIN))
        conn.execute(server_secrets.insert().values(name=ADMIN, token_hash=h, set_at=time.time()))


def install_enrolment_token(engine: sa.Engine, token: str, given: bool, generated_at: Path,
                            max_uses: int | None = None) -> None:
    """The server's own enrolment token: new devices only, no device groups, `max_uses` of them in all (None:
    any number; uses survive restarts)."""
    h = token_hash(token)
    with engine.begin() as conn:
        rel.write_lock(conn, "enrolment")
        stored = conn.execute(sa.select(enrolment_tokens.c.token_hash)
                              .where(enrolment_tokens.c.label == SERVER_TOKEN_LABEL)).scalars().all()
        if not given and any(s != h for s in stored):
            raise _conflict("enrolment", generated_at, "--enroll-token-file")
        conn.execute(enrolment_tokens.delete().where(enrolment_tokens.c.label == SERVER_TOKEN_LABEL,
                                                     enrolment_tokens.c.token_hash != h))
        if h in stored:
            conn.execute(enrolment_tokens.update().where(enrolment_tokens.c.token_hash == h).values(max_uses=max_uses))
        else:
            conn.execute(enrolment_tokens.insert().values(
                token_hash=h, label=SERVER_TOKEN_LABEL, device_id=None, device_groups=[], max_uses=max_uses,
                uses=0, expires_at=None, created_at=time.time()))


def admin_token_hash(engine: sa.Engine) -> str | None:
    with engine.connect() as conn:
        return conn.execute(sa.select(server_secrets.c.token_hash).where(server_secrets.c.name == ADMIN)).scalar()
