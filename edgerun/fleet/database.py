"""Engine creation and migrations: SQLite file by default, PostgreSQL (or any SQLAlchemy URL) for scale."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

MIGRATIONS = Path(__file__).with_name("migrations")


def sqlite_url(data_dir: str | Path) -> str:
    return f"sqlite:///{Path(data_dir).resolve() / 'fleet.db'}"


def _sqlite_pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
    cur = dbapi_conn.cursor()
    # WAL lets several server processes read while one writes; busy_timeout makes writers queue, not fail.
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def create_engine(url: str, pool_size: int = 10, max_overflow: int = 20, statement_timeout_ms: int = 30_000) -> sa.Engine:
    """An engine for the fleet database. On PostgreSQL each server process keeps up to `pool_size` connections
    (plus `max_overflow` under bursts), so a replica count × that must stay under the server's
    max_connections; a statement running past `statement_timeout_ms` (a lock wait included) is cancelled and
    its request fails, instead of holding a connection and a worker thread forever. 0 turns it off."""
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        sa.event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return sa.create_engine(url, pool_size=pool_size, max_overflow=max_overflow, pool_pre_ping=True,
                            connect_args={"options": f"-c statement_timeout={int(statement_timeout_ms)}"})


def migrations_head() -> str:
    """The newest Alembic revision: what `upgrade` brings a database to."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return str(ScriptDirectory.from_config(cfg).get_current_head())


def upgrade(engine: sa.Engine) -> None:
    """Bring the schema to the newest Alembic revision; safe to call from several processes at start."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # Serialise concurrent upgrades from several server processes starting together.
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(7007001)"))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
