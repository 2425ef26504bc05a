"""owed stages carry their resend time; owed teardowns; nodes report signs of life; jobs count
node-loss restarts; LLM backends are registered in the database

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 23:30:00.000000

A job whose next stage is owed (``stage_done`` and not final) now keeps in ``lease_until`` the
time its message is sent again if nobody claimed it (``farm.worker.reconciler``). Jobs owed a
stage at upgrade time get "now": the reconciler re-sends them at once (a duplicate of a message
still in the queue is harmless). ``teardowns`` holds the sandboxes of cancelled jobs not yet torn
down; ``nodes`` each node's last sign of life, for node loss; ``backends`` the registered LLM
backends, from which the balancer's set in Redis is rebuilt when Redis comes back empty.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from farm.db.base import UTCDateTime

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("seen_at", UTCDateTime(), nullable=False),
        sa.Column("beating_since", UTCDateTime(), nullable=False),
        sa.Column("lost_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_nodes")),
    )
    op.create_table(
        "backends",
        sa.Column("id", sa.String(length=200), nullable=False),
        sa.Column("url", sa.String(length=2000), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("model", sa.String(length=500), nullable=True),
        sa.Column("capacity", sa.Integer(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_backends")),
    )
    op.create_table(
        "teardowns",
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("node", sa.String(length=200), nullable=False),
        sa.Column("stage", sa.Enum("init", "run", "eval", name="stage", native_enum=False, length=32), nullable=False),
        sa.Column("due_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_teardowns_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_teardowns")),
    )
    op.add_column("jobs", sa.Column("restarts", sa.Integer(), server_default="0", nullable=False))
    op.execute(
        "UPDATE jobs SET lease_until = CURRENT_TIMESTAMP "
        "WHERE stage_done AND state IN ('queued', 'init', 'run') AND lease_until IS NULL"
    )


def downgrade() -> None:
    op.execute("UPDATE jobs SET lease_until = NULL WHERE stage_done AND state IN ('queued', 'init', 'run')")
    op.drop_column("jobs", "restarts")
    op.drop_table("teardowns")
    op.drop_table("backends")
    op.drop_table("nodes")
