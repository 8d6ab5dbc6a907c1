"""Trustworthy enrolment and reports: scoped enrolment tokens, admin-set device groups, the deliveries
that decide whose reports count, and reports keyed by (device, run id)."""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

REPORT_COLUMNS = ("id", "device_id", "task", "version", "outcome", "latency_ms", "error", "received_at")


def _reports_table(name: str, with_counted: bool) -> None:
    op.create_table(
        name,
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("task", sa.String(64), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("latency_ms", sa.Float, nullable=False),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("received_at", sa.Float, nullable=False),
        *([sa.Column("counted", sa.Boolean, nullable=False, server_default=sa.true())] if with_counted else []),
    )


def upgrade() -> None:
    with op.batch_alter_table("devices") as batch:
        batch.add_column(sa.Column("device_groups", sa.JSON, nullable=False, server_default="[]"))
    op.create_table(
        "enrolment_tokens",
        sa.Column("token_hash", sa.String(64), primary_key=True),
        sa.Column("label", sa.String(64), nullable=False),
        sa.Column("device_id", sa.String(128), nullable=True),
        sa.Column("device_groups", sa.JSON, nullable=False),
        sa.Column("max_uses", sa.Integer, nullable=True),
        sa.Column("uses", sa.Integer, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "deliveries",
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("task", sa.String(64), primary_key=True),
        sa.Column("version", sa.Integer, primary_key=True),
        sa.Column("issued_at", sa.Float, nullable=False),
    )
    # A new primary key: rebuild the table (the same statements on SQLite and PostgreSQL). Reports stored
    # before this revision predate deliveries; they stay counted, as they were.
    _reports_table("reports_v3", with_counted=True)
    cols = ", ".join(REPORT_COLUMNS)
    op.execute(f"INSERT INTO reports_v3 ({cols}) SELECT {cols} FROM reports")
    op.drop_index("ix_reports_task_version", table_name="reports")
    op.drop_index("ix_reports_device_id", table_name="reports")
    op.drop_table("reports")
    op.rename_table("reports_v3", "reports")
    op.create_index("ix_reports_device_id", "reports", ["device_id"])
    op.create_index("ix_reports_task_version", "reports", ["task", "version"])


def downgrade() -> None:
    op.drop_index("ix_reports_task_version", table_name="reports")
    op.drop_index("ix_reports_device_id", table_name="reports")
    op.rename_table("reports", "reports_v3")
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
    cols = ", ".join(REPORT_COLUMNS)
    op.execute(f"INSERT INTO reports ({cols}) SELECT {cols} FROM reports_v3 ON CONFLICT DO NOTHING")
    op.drop_table("reports_v3")
    op.create_index("ix_reports_device_id", "reports", ["device_id"])
    op.create_index("ix_reports_task_version", "reports", ["task", "version"])
    op.drop_table("deliveries")
    op.drop_table("enrolment_tokens")
    with op.batch_alter_table("devices") as batch:
        batch.drop_column("device_groups")
