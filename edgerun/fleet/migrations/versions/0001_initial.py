"""Initial fleet schema: roots, releases, devices, reports, audit."""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "roots",
        sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("envelope", sa.JSON, nullable=False),
    )
    op.create_table(
        "releases",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("task", sa.String(64), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("envelope", sa.JSON, nullable=False),
        sa.Column("rollback_envelope", sa.JSON, nullable=False),
        sa.Column("targeting", sa.JSON, nullable=False),
        sa.Column("policy", sa.JSON, nullable=False),
        sa.Column("stage", sa.String(16), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("paused", sa.Boolean, nullable=False),
        sa.Column("exposed", sa.Boolean, nullable=False),
        sa.Column("step_success", sa.Integer, nullable=False),
        sa.Column("step_failure", sa.Integer, nullable=False),
        sa.Column("total_success", sa.Integer, nullable=False),
        sa.Column("total_failure", sa.Integer, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("sim_lease_until", sa.Float, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.UniqueConstraint("task", "version", name="uq_release_task_version"),
    )
    op.create_table(
        "devices",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("profile", sa.JSON, nullable=False),
        sa.Column("registered_at", sa.Float, nullable=False),
        sa.Column("last_seen", sa.Float, nullable=False),
    )
    op.create_table(
        "reports",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("task", sa.String(64), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("latency_ms", sa.Float, nullable=False),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("received_at", sa.Float, nullable=False),
    )
    op.create_index("ix_reports_device_id", "reports", ["device_id"])
    op.create_index("ix_reports_task_version", "reports", ["task", "version"])
    op.create_table(
        "audit",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("release_id", sa.Integer, nullable=True),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
    )
    op.create_index("ix_audit_release_id", "audit", ["release_id"])


def downgrade() -> None:
    for table in ("audit", "reports", "devices", "releases", "roots"):
        op.drop_table(table)
