"""What a stage gets to run an external harness through the proxy: trials and the node's socket.

Handed to handlers as ``ctx.trials`` (the ``Trials`` protocol of ``farm.handlers.base``). A trial
is opened per RUN attempt (a retried RUN starts a new one, as it starts a new sandbox) and closed
at the end of the attempt; closing reads its record back as one trajectory per segment.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from farm.config import Settings
from farm.constants import trial_balancer_key
from farm.db.session import transaction
from farm.handlers.base import OpenTrial
from farm.llm.balancer import Balancer
from farm.schemas import TrajectoryData, TrialRecordData
from farm.trials import record, store


class TrialResources:
    """A worker's trials: opened per RUN attempt, closed into one trajectory per segment."""

    def __init__(self, settings: Settings, *, sessions: sessionmaker[Session], balancer: Balancer) -> None:
        self._settings = settings
        self._sessions = sessions
        self._balancer = balancer

    @property
    def socket(self) -> Path | None:
        return self._settings.proxy.socket

    def open(self, *, job_id: int, attempt: int, sampling: dict[str, Any], history: str = "exact") -> OpenTrial:
        with transaction(self._sessions) as session:
            trial, key = store.new_trial(
                session,
                trial_id=f"job{job_id}-a{attempt}-{secrets.token_hex(4)}",
                model=self._settings.llm.builtin_model_name,
                job_id=job_id,
                sampling=sampling,
                history=history,
            )
            return OpenTrial(id=trial.id, key=key, model=trial.model)

    def close(self, trial_id: str) -> TrialRecordData:
        with transaction(self._sessions) as session:
            trial = store.end(session, trial_id)
            calls = store.calls(session, trial_id)
            segments = record.segments(calls)
            done = [c for c in calls if c.state == "done"]
            last_segment = max(done, key=lambda c: c.seq).segment if done else None
            out = TrialRecordData(
                trial_id=trial_id,
                segments=[
                    TrajectoryData(
                        token_ids=s.token_ids.tolist(),
                        logprobs=s.logprobs.tolist(),
                        loss_mask=s.loss_mask.tolist(),
                        turn_offsets=s.turn_offsets,
                        weight_versions=s.weight_versions,
                        info={"segment": s.index, "calls": s.calls},
                    )
                    for s in segments
                ],
                main=next((i for i, s in enumerate(segments) if s.index == last_segment), None),
                certificate=[record.certificate(c) for c in calls],
                incomplete=trial.incomplete,
            )
        self._balancer.release(trial_balancer_key(trial_id))
        return out
