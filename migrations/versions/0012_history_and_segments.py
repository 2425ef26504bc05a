"""history and segments: a batch's history policy, and every segment of a trajectory

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27 22:10:00.000000

``batches.history`` is the policy every stage of the batch is handed (``StageContext.history``):
a column of its own, not a key in the ``sampling`` JSON as a trial's is, because every claim
validates that JSON as ``SamplingParams`` (extra keys refused): a worker of the previous release
would fail every job of a batch that carried one. Existing batches are ``exact`` (the default).

``trajectories.segments`` holds an episode's other segments (``TrajectoryData.segments``), packed as
``farm.db.arrays.pack_segments`` does; NULL when there are none, so a one-segment trajectory costs
nothing more to write or read.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("batches", sa.Column("history", sa.String(length=16), server_default="exact", nullable=False))
    op.add_column("trajectories", sa.Column("segments", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    op.drop_column("trajectories", "segments")
    op.drop_column("batches", "history")
