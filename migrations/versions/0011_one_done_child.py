"""trial calls: at most one finished child of a call per segment, held by the database

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26 23:50:00.000000

A second finished child of the same parent in the same segment is a branch and moves to a segment
of its own (``farm.trials.statements.finish_call``). This unique index makes that rule the database's: a
proxy records a call's finish in one statement, without the trial's lock, and a sibling finishing
at the same moment fails it with a unique violation instead of slipping past the check.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "uq_trial_calls_done_child",
        "trial_calls",
        ["trial_id", "segment", "parent_seq"],
        unique=True,
        postgresql_where=sa.text("state = 'done'"),
        sqlite_where=sa.text("state = 'done'"),
    )


def downgrade() -> None:
    op.drop_index("uq_trial_calls_done_child", table_name="trial_calls")
