"""The release server's tables (SQLAlchemy Core). Changes go through an Alembic revision in migrations/."""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

roots = sa.Table(
    "roots", metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("envelope", sa.JSON, nullable=False),
)

releases = sa.Table(
    "releases", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("task", sa.String(64), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("envelope", sa.JSON, nullable=False),           # release manifest, signed offline
    sa.Column("rollback_envelope", sa.JSON, nullable=False),  # pre-signed version+1 pointing at old files
    sa.Column("targeting", sa.JSON, nullable=False),
    sa.Column("policy", sa.JSON, nullable=False),
    sa.Column("stage", sa.String(16), nullable=False),
    sa.Column("step", sa.Integer, nullable=False, default=0),
    sa.Column("paused", sa.Boolean, nullable=False, default=False),
    sa.Column("exposed", sa.Boolean, nullable=False, default=False),
    sa.Column("step_success", sa.Integer, nullable=False, default=0),
    sa.Column("step_failure", sa.Integer, nullable=False, default=0),
    sa.Column("total_success", sa.Integer, nullable=False, default=0),
    sa.Column("total_failure", sa.Integer, nullable=False, default=0),
    sa.Column("reason", sa.Text, nullable=False, default=""),
    sa.Column("sim_lease_until", sa.Float, nullable=False, default=0.0),
    sa.Column("step_population", sa.Integer, nullable=False, default=0, server_default="0"),  # rev 0002
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.UniqueConstraint("task", "version", name="uq_release_task_version"),
)

devices = sa.Table(
    "devices", metadata,
    sa.Column("id", sa.String(128), primary_key=True),
    sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("profile", sa.JSON, nullable=False),
    sa.Column("registered_at", sa.Float, nullable=False),
    sa.Column("last_seen", sa.Float, nullable=False),
    # rev 0003: the hardware class, set by the admin (enrolment token or admin API), never by a check-in
    sa.Column("device_groups", sa.JSON, nullable=False, server_default="[]"),
    # rev 0005: targeting.device_bucket(id), so a step's population is a count over a bucket range
    sa.Column("bucket", sa.Integer, nullable=False, server_default="0"),
    sa.Index("ix_devices_bucket_seen", "bucket", "last_seen"),
)

enrolment_tokens = sa.Table(  # rev 0003
    "enrolment_tokens", metadata,
    sa.Column("token_hash", sa.String(64), primary_key=True),
    sa.Column("label", sa.String(64), nullable=False),
    sa.Column("device_id", sa.String(128), nullable=True),  # scope: only this id may enrol with it
    sa.Column("device_groups", sa.JSON, nullable=False),     # the groups a device enrolled with it gets
    sa.Column("max_uses", sa.Integer, nullable=True),        # None: any number of new devices
    sa.Column("uses", sa.Integer, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
)

deliveries = sa.Table(  # rev 0003: which device was assigned which release version; only their reports count
    "deliveries", metadata,
    sa.Column("device_id", sa.String(128), primary_key=True),
    sa.Column("task", sa.String(64), primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("issued_at", sa.Float, nullable=False),
)

reports = sa.Table(
    "reports", metadata,
    # (device, run id): the device chooses the run id, so a resent report is a no-op, and one device's ids
    # can never shadow another's (rev 0003)
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("device_id", sa.String(128), primary_key=True, index=True),
    sa.Column("task", sa.String(64), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("outcome", sa.String(16), nullable=False),
    sa.Column("latency_ms", sa.Float, nullable=False),
    sa.Column("error", sa.Text, nullable=False, default=""),
    sa.Column("received_at", sa.Float, nullable=False),
    # rev 0003: False for a report of a release version this device was never assigned (kept, never counted)
    sa.Column("counted", sa.Boolean, nullable=False, server_default=sa.true()),
    sa.Index("ix_reports_task_version", "task", "version"),
)

audit = sa.Table(
    "audit", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("actor", sa.String(64), nullable=False),
    sa.Column("release_id", sa.Integer, nullable=True, index=True),
    sa.Column("action", sa.String(64), nullable=False),
    sa.Column("detail", sa.Text, nullable=False, default=""),
)

server_secrets = sa.Table(  # rev 0004: the hashes of the server's own tokens, one set for every replica
    "server_secrets", metadata,
    sa.Column("name", sa.String(32), primary_key=True),
    sa.Column("token_hash", sa.String(64), nullable=False),
    sa.Column("set_at", sa.Float, nullable=False),
)
