"""batch limits and quorum: what a batch says about time, and when it was ready

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28 01:30:00.000000

``batches.limits`` (per-stage limits, a job's wall budget, attempts) and ``batches.quorum`` (a share
of the batch and a deadline, and what happens to the rest) are what the trainer asked, as JSON; NULL
for the farm's defaults and no quorum, as every existing batch. ``ready_at``/``ready_reason``/
``ready_seq`` are written by the one commit that makes a batch ready (and cancels its rest, where it
asked for that): finish positions 1..ready_seq are its step, later ones were carried or cut.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from farm.db.base import UTCDateTime

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("batches", sa.Column("limits", sa.JSON(none_as_null=True), nullable=True))
    op.add_column("batches", sa.Column("quorum", sa.JSON(none_as_null=True), nullable=True))
    op.add_column("batches", sa.Column("ready_at", UTCDateTime(), nullable=True))
    op.add_column("batches", sa.Column("ready_reason", sa.String(length=16), nullable=True))
    op.add_column("batches", sa.Column("ready_seq", sa.Integer(), nullable=True))


def downgrade() -> None:
    for column in ("ready_seq", "ready_reason", "ready_at", "quorum", "limits"):
        op.drop_column("batches", column)
