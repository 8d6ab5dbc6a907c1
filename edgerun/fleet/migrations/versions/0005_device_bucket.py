"""Each device's gray-step bucket, stored and indexed with its last check-in time, so the population of a
step is counted in SQL (a range of buckets, seen within the liveness window) instead of in Python."""

import sqlalchemy as sa
from alembic import op

from edgerun.fleet.targeting import device_bucket

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("devices") as batch:
        batch.add_column(sa.Column("bucket", sa.Integer, nullable=False, server_default="0"))
    conn = op.get_bind()
    devices = sa.table("devices", sa.column("id", sa.String), sa.column("bucket", sa.Integer))
    ids = [r.id for r in conn.execute(sa.select(devices.c.id))]
    for start in range(0, len(ids), 10_000):
        conn.execute(devices.update().where(devices.c.id == sa.bindparam("b_id")).values(bucket=sa.bindparam("b_bucket")),
                     [{"b_id": i, "b_bucket": device_bucket(i)} for i in ids[start:start + 10_000]])
    op.create_index("ix_devices_bucket_seen", "devices", ["bucket", "last_seen"])


def downgrade() -> None:
    op.drop_index("ix_devices_bucket_seen", "devices")
    with op.batch_alter_table("devices") as batch:
        batch.drop_column("bucket")
