"""trial calls: the request messages each call added to its conversation

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 07:00:00.000000

A call stores the messages its request added beyond what its parent covered (the whole request
when it starts a segment), so a call's full request is rebuilt by walking its ancestors, as its
ids are. verl's session record (``farm.api.routes.verl_sessions``) hands these back to trainers
that re-render them. Calls recorded before this revision have none (NULL).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("trial_calls", sa.Column("messages", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trial_calls") as batch:
        batch.drop_column("messages")
