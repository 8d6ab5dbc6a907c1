"""A federated round's running sum (edgerun/fleet/federated/running_sum.py): the name of the checkpoint file
that holds the sum of the round's recorded updates (NULL: nothing added yet). A round open before the upgrade
starts with none, so it is best closed and run again: its accepted updates were files that the running sum
does not read."""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("fed_rounds") as batch:
        batch.add_column(sa.Column("sum_checkpoint", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("fed_rounds") as batch:
        batch.drop_column("sum_checkpoint")
