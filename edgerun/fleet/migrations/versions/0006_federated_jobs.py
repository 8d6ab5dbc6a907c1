"""Federated jobs' state (edgerun/fleet/federated/round_store.py): jobs, rounds, received updates, the
stream records a collector handled, and the global weights of every version."""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fed_jobs",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("round", sa.Integer, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("best_metric", sa.Float, nullable=True),
    )
    op.create_table(
        "fed_rounds",
        sa.Column("job", sa.String(128), primary_key=True),
        sa.Column("round", sa.Integer, primary_key=True),
        sa.Column("sampled", sa.JSON, nullable=False),
        sa.Column("opened_at", sa.Float, nullable=False),
        sa.Column("deadline_at", sa.Float, nullable=False),
        sa.Column("duplicates", sa.Integer, nullable=False),
        sa.Column("outcome", sa.String(16), nullable=True),
        sa.Column("summary", sa.JSON, nullable=True),
    )
    op.create_table(
        "fed_updates",
        sa.Column("job", sa.String(128), primary_key=True),
        sa.Column("round", sa.Integer, primary_key=True),
        sa.Column("device", sa.String(128), primary_key=True),
        sa.Column("samples", sa.Integer, nullable=False),
        sa.Column("verdict", sa.String(32), nullable=False),
        sa.Column("received_at", sa.Float, nullable=False),
    )
    op.create_table(
        "fed_records",
        sa.Column("job", sa.String(128), primary_key=True),
        sa.Column("device", sa.String(128), primary_key=True),
        sa.Column("record_id", sa.String(256), primary_key=True),
        sa.Column("verdict", sa.String(32), nullable=False),
    )
    op.create_table(
        "fed_weights",
        sa.Column("job", sa.String(128), primary_key=True),
        sa.Column("version", sa.Integer, primary_key=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )


def downgrade() -> None:
    for table in ("fed_weights", "fed_records", "fed_updates", "fed_rounds", "fed_jobs"):
        op.drop_table(table)
