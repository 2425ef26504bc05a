"""Starting a worker process for some stages on this node (``farm worker``): the Celery worker,
its sandbox self-check and its log set-up."""

from __future__ import annotations

import gc
import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from celery import signals
from redis import Redis
from redis.exceptions import RedisError

from farm import metrics
from farm.config import Settings
from farm.constants import Stage, queue_name, sandbox_checks_key
from farm.sandbox import start_reaper
from farm.worker.app import make_celery_app
from farm.worker.stages import register_stages
from farm.worker.sweeper import Sweeper

log = logging.getLogger(__name__)

#: where Celery logs each task it receives and each one that succeeds.
CELERY_TASK_LOGGERS = ("celery.worker.strategy", "celery.app.trace")


def queues_for(stages: Sequence[Stage], node: str) -> list[str]:
    return [queue_name(stage, node) for stage in stages]


def default_concurrency(settings: Settings, stages: Sequence[Stage]) -> int:
    per_stage = {
        Stage.INIT: settings.worker.init_concurrency,
        Stage.RUN: settings.worker.run_concurrency,
        Stage.EVAL: settings.worker.eval_concurrency,
    }
    return sum(per_stage[s] for s in stages)


def prefetch_multiplier(settings: Settings, stages: Sequence[Stage]) -> int:
    w = settings.worker
    return w.prefetch_multiplier if Stage.INIT in stages else w.node_prefetch_multiplier


def _warm_tokenizer(app: Any) -> None:
    from farm.llm.tokenizer import tokenizer_dir

    # Importing transformers holds the GIL for seconds: only worth it where there is a policy.
    if not (tokenizer_dir(app.farm.settings) / "tokenizer_config.json").is_file():
        return
    try:
        _ = app.farm.llm.tokenizer
    except Exception as exc:  # noqa: BLE001 - a farm without a model has nothing to warm
        log.info("no tokenizer preloaded: %s", exc)


def quiet_task_logs(settings: Settings) -> None:
    """Drop Celery's per-task INFO lines unless ``worker.log_each_task`` asks for them."""
    if not settings.worker.log_each_task:
        for logger in CELERY_TASK_LOGGERS:
            logging.getLogger(logger).setLevel(logging.WARNING)


def check_sandbox(settings: Settings, redis_client: Redis) -> None:
    """Refuse to start where the sandbox driver cannot work (see ``farm.sandbox.selfcheck``), and
    leave the answer where the API's /readyz reads it.

    Raises:
        SandboxCheckFailed: the driver cannot start a sandbox here.
    """
    from farm.errors import SandboxCheckFailed
    from farm.sandbox.selfcheck import check_sandbox_driver

    try:
        seconds = check_sandbox_driver(settings)
    except SandboxCheckFailed as exc:
        _report_check(settings, redis_client, ok=False, detail=exc.message)
        raise
    log.info("sandbox driver %s works here (self-check %.2fs)", settings.sandbox.driver, seconds)
    _report_check(settings, redis_client, ok=True, detail="ok")


def _report_check(settings: Settings, redis_client: Redis, *, ok: bool, detail: str) -> None:
    record = json.dumps({"ok": ok, "detail": detail, "at": time.time()})
    try:
        redis_client.hset(sandbox_checks_key(), settings.worker.node, record)
    except RedisError:  # the worker's own log and exit status still say it
        log.warning("cannot report the sandbox self-check to Redis", exc_info=True)


def run_worker(
    settings: Settings,
    stages: Sequence[Stage],
    *,
    concurrency: int | None = None,
    pool: str | None = None,
    loglevel: str = "INFO",
    name: str | None = None,
) -> None:
    """Block in a Celery worker consuming ``stages`` for this node, with a lease sweeper."""
    app = make_celery_app(settings)
    register_stages(app)
    if settings.worker.check_sandbox:
        check_sandbox(settings, app.farm.redis)
    node = settings.worker.node
    label = name or "-".join(s.value for s in stages)
    slots = concurrency or default_concurrency(settings, stages)
    pools = app.farm.size_pools(slots, name=f"farm-worker-{label}@{node}")
    identity = metrics.WorkerProcess(
        name=f"{label}@{node}",
        node=node,
        stages=tuple(s.value for s in stages),
        slots=slots,
        pid=os.getpid(),
        db_connections=pools.total,
    )
    sweeper = Sweeper(app.farm, app, identity)
    stop_reaper = threading.Event()

    def _start(**_: Any) -> None:
        log.info("database connections of this worker (%s slots): %s", slots, pools.describe())
        sweeper.start()
        # Sandboxes of a worker that was killed on this node are found by their owner pid and removed.
        start_reaper(settings, stop=stop_reaper)
        if Stage.INIT in stages:
            # Warm sandboxes for the INITs to come, as many as the shared queue holds (within the pool's size).
            app.farm.sandboxes.start_pool(demand=lambda: int(app.farm.redis.llen(queue_name(Stage.INIT))))
        if Stage.RUN in stages:
            # Loading the policy's tokenizer (and importing transformers) takes seconds: do it now,
            # not while the first batch's episodes wait for it.
            threading.Thread(target=_warm_tokenizer, args=(app,), name="farm-warmup", daemon=True).start()

    def _stop(**_: Any) -> None:
        stop_reaper.set()
        app.farm.sandboxes.stop_pool()
        sweeper.stop()
        app.farm.close()
        # The interpreter's last collection walks the whole heap (torch and transformers where a
        # tokenizer was loaded): seconds on a small node at every stop. Nothing left needs it.
        gc.freeze()

    quiet_task_logs(settings)
    signals.worker_ready.connect(_start, weak=False)
    signals.worker_shutdown.connect(_stop, weak=False)
    argv = [
        "worker",
        f"--queues={','.join(queues_for(stages, node))}",
        f"--concurrency={slots}",
        f"--pool={pool or settings.worker.pool}",
        f"--prefetch-multiplier={prefetch_multiplier(settings, stages)}",
        f"--hostname={label}@{node}",
        f"--loglevel={loglevel}",
        "--without-gossip",
        "--without-mingle",
    ]
    app.worker_main(argv)
