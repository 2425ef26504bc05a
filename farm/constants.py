"""Queue names, Redis keys and the str-Enums shared by every part of farm."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

#: where the embedded stack keeps its SQLite file, token and logs (``FARM_DATA_DIR``).
DEFAULT_DATA_DIR = Path.home() / ".rollout-farm"
#: the API token's file in the data directory: the CLI and the client read it when no token is given.
TOKEN_FILE_NAME = "token"


class Stage(StrEnum):
    """One Celery unit of a job; each has its own queue and worker pool."""

    INIT = "init"
    RUN = "run"
    EVAL = "eval"


class JobState(StrEnum):
    """Where a job is. ``init``/``run``/``eval`` cover both waiting for and running that stage."""

    QUEUED = "queued"
    INIT = "init"
    RUN = "run"
    EVAL = "eval"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED})


class Outcome(StrEnum):
    """How a job ended. Only ``ok`` and the agent_* / context_overflow outcomes carry a reward:
    the others are infrastructure failures and are never reported as a reward of 0."""

    OK = "ok"
    AGENT_ERROR = "agent_error"
    AGENT_TIMEOUT = "agent_timeout"
    CONTEXT_OVERFLOW = "context_overflow"
    SANDBOX_ERROR = "sandbox_error"
    INFRA_ERROR = "infra_error"
    HANDLER_ERROR = "handler_error"
    CANCELLED = "cancelled"
    #: a limit the batch set (a stage's, the job's wall budget, its attempts) ended the job.
    TIMEOUT = "timeout"


#: outcomes of an episode the policy is responsible for; these jobs are scored.
POLICY_OUTCOMES = frozenset({Outcome.OK, Outcome.AGENT_ERROR, Outcome.AGENT_TIMEOUT, Outcome.CONTEXT_OVERFLOW})


class StageStatus(StrEnum):
    """The end of one attempt at one stage."""

    RUNNING = "running"
    OK = "ok"
    ERROR = "error"
    RETRY = "retry"
    LOST = "lost"
    CANCELLED = "cancelled"


class PauseOutcome(StrEnum):
    """How a backend's pause ended in a weight update. ``refused`` and ``ejected`` say it never
    paused, so it is not resumed: resuming it would fail for ever and hold the update open."""

    PAUSED = "paused"
    #: it answered the pause with an error status (or the pause was never sent: a mode it lacks).
    REFUSED = "refused"
    #: it cannot take part (no connection, or no such route): left out of the update.
    EJECTED = "ejected"
    #: the call got no answer (a timeout): the pause may have taken effect, so it is resumed.
    NO_ANSWER = "no_answer"
    #: it was no longer registered when the pause was sent: nothing was asked of it.
    REMOVED = "removed"


#: pause outcomes after which the backend is not paused.
NEVER_PAUSED = frozenset({PauseOutcome.REFUSED, PauseOutcome.EJECTED})


class BatchState(StrEnum):
    RUNNING = "running"
    COMPLETE = "complete"
    CANCELLED = "cancelled"


# Celery task names.
TASK_INIT = "farm.stage.init"
TASK_RUN = "farm.stage.run"
TASK_EVAL = "farm.stage.eval"
TASK_FOR_STAGE: dict[Stage, str] = {Stage.INIT: TASK_INIT, Stage.RUN: TASK_RUN, Stage.EVAL: TASK_EVAL}


def queue_name(stage: Stage, node: str | None = None) -> str:
    """INIT is shared by every node; RUN and EVAL go to the node that holds the job's sandbox."""
    if stage is Stage.INIT:
        return "init"
    if not node:
        raise ValueError(f"stage {stage.value} needs the node that ran INIT")
    return f"{stage.value}.{node}"


# Redis keys: built here and nowhere else.
REDIS_PREFIX = "farm:"


def batch_cancel_key(batch_id: int) -> str:
    return f"{REDIS_PREFIX}batch:{batch_id}:cancelled"


def sweep_turn_key() -> str:
    """Held for one sweep interval by the worker process whose turn it is to sweep leases."""
    return f"{REDIS_PREFIX}sweep:turn"


def epoch_key() -> str:
    """Set once by the first worker that finds it missing: a Redis that lost it (restarted empty,
    flushed) lost every queued message too, and that worker re-sends everything owed."""
    return f"{REDIS_PREFIX}epoch"


def sandbox_checks_key() -> str:
    """Hash node -> JSON {"ok", "detail", "at"}: each worker's sandbox self-check at start, for /readyz."""
    return f"{REDIS_PREFIX}sandbox:checks"


def batch_events_channel(batch_id: int) -> str:
    return f"{REDIS_PREFIX}batch:{batch_id}:events"


BATCH_EVENTS_PATTERN = f"{REDIS_PREFIX}batch:*:events"


# LLM balancer (farm.llm.balancer). A backend's hash holds its url, kind, model, capacity, in-flight
# count and health; the heap orders healthy backends by in-flight / capacity.
LLM_PREFIX = f"{REDIS_PREFIX}llm:"


def llm_heap_key() -> str:
    return f"{LLM_PREFIX}heap"


def llm_backend_key(backend_id: str) -> str:
    return f"{LLM_PREFIX}backend:{backend_id}"


def llm_backends_key() -> str:
    return f"{LLM_PREFIX}backends"


def llm_jobs_key() -> str:
    """Hash job id -> backend id: the sticky assignments."""
    return f"{LLM_PREFIX}jobs"


def llm_leases_key() -> str:
    """Sorted set job id -> lease expiry (ms): an abandoned job's slot is reclaimed after it."""
    return f"{LLM_PREFIX}leases"


def llm_choice_seq_key() -> str:
    return f"{LLM_PREFIX}seq"


def llm_last_chosen_key() -> str:
    """Hash backend id -> the choice sequence number it was last given a new job at (breaks ties)."""
    return f"{LLM_PREFIX}last_chosen"


def llm_moves_key() -> str:
    """Capped list of JSON records of jobs re-routed off a dead or removed backend."""
    return f"{LLM_PREFIX}moves"


def llm_paused_key() -> str:
    """While the backends are paused for a weight update: the update's id. New turns wait for it to
    go (the balancer's acquire says so); rebuilt from PostgreSQL if Redis loses it."""
    return f"{LLM_PREFIX}paused"


def trial_balancer_key(trial_id: str) -> str:
    """The balancer's sticky key for a proxy trial (job ids are plain integers: no clash)."""
    return f"trial:{trial_id}"
