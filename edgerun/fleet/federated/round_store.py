"""The federated job's state in the fleet database: jobs, rounds, received updates and the global weights
of every version, so a server restart between rounds (or inside one) loses nothing.

The tables are the job's own (`fed_*`) in the fleet database (SQLite or PostgreSQL), created by the fleet's
Alembic migration 0006 like every other table: `database.upgrade`, which the server runs at start.
An update's row is keyed by (job, round, device): a second copy of an update cannot be inserted, so it is
applied at most once whatever crashes in between. Accepted updates are added to the round's running sum
as they arrive and not kept; the sum is a file beside the database that the round's row names
(running_sum.py; the column came with migration 0007).
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import numpy as np
import sqlalchemy as sa

from edgerun.fleet.errors import FleetError

metadata = sa.MetaData()

jobs = sa.Table(
    "fed_jobs", metadata,
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("config", sa.JSON, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),        # running | stopped | done
    sa.Column("round", sa.Integer, nullable=False),             # the open or next round
    sa.Column("version", sa.Integer, nullable=False),           # the current global weights' version
    sa.Column("best_metric", sa.Float, nullable=True),          # the best held-out metric published so far
)

rounds = sa.Table(
    "fed_rounds", metadata,
    sa.Column("job", sa.String(128), primary_key=True),
    sa.Column("round", sa.Integer, primary_key=True),
    sa.Column("sampled", sa.JSON, nullable=False),              # device ids asked to train
    sa.Column("opened_at", sa.Float, nullable=False),
    sa.Column("deadline_at", sa.Float, nullable=False),
    sa.Column("duplicates", sa.Integer, nullable=False, default=0),  # copies of updates already recorded
    # the file of the open round's running sum (running_sum.py); None: nothing added yet
    sa.Column("sum_checkpoint", sa.String(64), nullable=True),
    sa.Column("outcome", sa.String(16), nullable=True),         # None while open; published | rolled_back | empty
    sa.Column("summary", sa.JSON, nullable=True),
)

updates = sa.Table(
    "fed_updates", metadata,
    sa.Column("job", sa.String(128), primary_key=True),
    sa.Column("round", sa.Integer, primary_key=True),
    sa.Column("device", sa.String(128), primary_key=True),
    sa.Column("samples", sa.Integer, nullable=False),
    sa.Column("verdict", sa.String(32), nullable=False),        # accepted, or the reason it was refused
    sa.Column("received_at", sa.Float, nullable=False),
)

records = sa.Table(  # the stream records a collector has handed to the job (collector.py)
    "fed_records", metadata,
    sa.Column("job", sa.String(128), primary_key=True),
    sa.Column("device", sa.String(128), primary_key=True),
    sa.Column("record_id", sa.String(256), primary_key=True),
    sa.Column("verdict", sa.String(32), nullable=False),
)

weights = sa.Table(
    "fed_weights", metadata,
    sa.Column("job", sa.String(128), primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("data", sa.LargeBinary, nullable=False),          # np.savez of name -> array
)


def require_tables(engine: sa.Engine) -> None:
    """Refuse, in one line, a database the fleet's migrations have not brought to the federated tables."""
    if not sa.inspect(engine).has_table(jobs.name):
        raise FleetError(f"the fleet database {engine.url.render_as_string(hide_password=True)} has no federated "
                         "tables: start the fleet server on it once (it migrates the schema)")


def to_npz(arrays: Mapping[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    named: dict[str, Any] = {name: np.asarray(a) for name, a in arrays.items()}
    np.savez(buffer, **named)
    return buffer.getvalue()


def from_npz(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}
