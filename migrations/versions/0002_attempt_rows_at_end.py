"""stage_runs rows are written when an attempt ends; the attempt in progress lives on the job

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 03:05:00.000000

``jobs.current_run_id`` pointed at a RUNNING row inserted by the claim and updated at the end
of the attempt; ``jobs.stage_started_at`` replaces it, and the row is inserted once, at the end.
Attempts in progress at upgrade time move from their RUNNING rows onto their jobs (and back on
downgrade), so a stage that is running while the database is migrated is still recorded once.

Columns are added and dropped with plain ALTER TABLE (SQLite >= 3.35 has DROP COLUMN), not
Alembic's batch mode: that copies the table and drops the old one, and with SQLite's foreign
keys on, dropping ``jobs`` cascades to every stage_runs and trajectories row.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from farm.db.base import UTCDateTime

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: the job states in which an attempt can be in progress (each named like its stage).
_STAGE_STATES = "('init', 'run', 'eval')"


def upgrade() -> None:
    op.add_column("jobs", sa.Column("stage_started_at", UTCDateTime(), nullable=True))
    op.execute(
        f"""
        UPDATE jobs SET stage_started_at = (
            SELECT r.started_at FROM stage_runs r WHERE r.id = jobs.current_run_id AND r.status = 'running'
        )
        WHERE current_run_id IS NOT NULL AND NOT stage_done AND state IN {_STAGE_STATES}
        """
    )
    op.execute(
        "DELETE FROM stage_runs WHERE id IN (SELECT current_run_id FROM jobs WHERE stage_started_at IS NOT NULL)"
    )
    # What is still RUNNING belongs to a job that ended under it (cancelled, or given up): the
    # attempt ended with the job.
    op.execute(
        """
        UPDATE stage_runs SET
            status = CASE WHEN (SELECT j.state FROM jobs j WHERE j.id = stage_runs.job_id) = 'cancelled'
                          THEN 'cancelled' ELSE 'lost' END,
            finished_at = (SELECT j.finished_at FROM jobs j WHERE j.id = stage_runs.job_id)
        WHERE status = 'running'
        """
    )
    op.drop_column("jobs", "current_run_id")


def downgrade() -> None:
    op.add_column(
        "jobs", sa.Column("current_run_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True)
    )
    op.execute(
        f"""
        INSERT INTO stage_runs (job_id, stage, attempt, status, node, worker, started_at)
        SELECT id, state, stage_attempts, 'running', node, worker, stage_started_at FROM jobs
        WHERE stage_started_at IS NOT NULL AND state IN {_STAGE_STATES}
        """
    )
    op.execute("UPDATE jobs SET current_run_id = (SELECT max(r.id) FROM stage_runs r WHERE r.job_id = jobs.id)")
    op.drop_column("jobs", "stage_started_at")
