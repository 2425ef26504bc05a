"""jobs: no index on the columns every stage changes, and room on each page for updated rows

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 07:00:00.000000

A job row is updated six times (a claim and a completion per stage). ``ix_jobs_state_lease``
indexed ``state`` and ``lease_until``, which all six change, so none could be a HOT update:
each wrote a new entry into every index of the table and left dead ones behind. Without it
(the lease sweeper now finds lapsed leases among the jobs of running batches, through
``ix_jobs_batch_finish``), and with a fill factor that leaves room on the page for the new
row version, PostgreSQL updates the row in place. ``ix_jobs_batch_id`` is dropped too: the
leading column of ``ix_jobs_batch_finish`` serves every query it served.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: percent of each heap page new rows may fill; the rest is for updated versions of them.
JOBS_FILLFACTOR = 60


def upgrade() -> None:
    op.drop_index("ix_jobs_state_lease", table_name="jobs")
    op.drop_index("ix_jobs_batch_id", table_name="jobs")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE jobs SET (fillfactor = {JOBS_FILLFACTOR})")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE jobs RESET (fillfactor)")
    op.create_index("ix_jobs_batch_id", "jobs", ["batch_id"])
    op.create_index("ix_jobs_state_lease", "jobs", ["state", "lease_until"])
