"""Worker start-up choices that need no running worker."""

from __future__ import annotations

import logging

import pytest

from farm.config import Settings
from farm.worker.process import CELERY_TASK_LOGGERS, quiet_task_logs


@pytest.fixture
def celery_task_loggers():
    levels = {name: logging.getLogger(name).level for name in CELERY_TASK_LOGGERS}
    yield [logging.getLogger(name) for name in CELERY_TASK_LOGGERS]
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def test_quiet_task_logs_drops_celerys_per_task_lines_by_default(celery_task_loggers):
    quiet_task_logs(Settings())
    assert all(not logger.isEnabledFor(logging.INFO) for logger in celery_task_loggers)


def test_quiet_task_logs_keeps_them_when_asked(celery_task_loggers):
    for logger in celery_task_loggers:
        logger.setLevel(logging.NOTSET)
    quiet_task_logs(Settings(worker={"log_each_task": True}))
    assert all(logger.level == logging.NOTSET for logger in celery_task_loggers)


def test_only_workers_of_the_shared_init_queue_keep_prefetch_at_one():
    from farm.constants import Stage
    from farm.worker.process import prefetch_multiplier

    settings = Settings()
    assert prefetch_multiplier(settings, [Stage.INIT]) == 1
    assert prefetch_multiplier(settings, [Stage.INIT, Stage.RUN, Stage.EVAL]) == 1
    assert prefetch_multiplier(settings, [Stage.RUN]) == prefetch_multiplier(settings, [Stage.EVAL]) == 2


def test_no_tokenizer_warmup_without_a_policy(tmp_path):
    """Importing transformers holds the GIL for seconds and stalled the consumer of LLM-less farms."""
    from types import SimpleNamespace

    from farm.worker.process import _warm_tokenizer

    class NoLLM:
        settings = Settings(data_dir=tmp_path)

        @property
        def llm(self):
            raise AssertionError("the tokenizer must not be loaded")

    _warm_tokenizer(SimpleNamespace(farm=NoLLM()))


def test_one_worker_process_sweeps_per_interval(redis_url, redis_client):
    """Every worker process runs a sweeper; the first to take the turn sweeps, the rest wait
    for the next interval."""
    import time

    from farm.config import Settings
    from farm.worker.app import FarmRuntime
    from farm.worker.sweeper import take_turn

    settings = Settings(redis={"url": redis_url}, worker={"sweep_interval_s": 0.3})
    runtimes = [FarmRuntime(settings) for _ in range(3)]
    try:
        assert [take_turn(rt) for rt in runtimes] == [True, False, False]
        time.sleep(0.4)
        assert [take_turn(rt) for rt in runtimes[::-1]] == [True, False, False]
    finally:
        for rt in runtimes:
            rt.close()


def test_broker_channel_reuses_one_redis_client_and_still_delivers(redis_url, redis_client):
    from farm.config import Settings
    from farm.constants import Stage, queue_name
    from farm.worker.app import make_celery_app
    from farm.worker.enqueue import send_stage
    from farm.worker.transport import Channel

    app = make_celery_app(Settings(redis={"url": redis_url}))
    try:
        with app.connection_for_write() as conn:
            channel = conn.default_channel
            assert isinstance(channel, Channel)
            assert channel._create_client() is channel._create_client()
        for job_id in (1, 2, 3):
            send_stage(app, job_id=job_id, stage=Stage.RUN, node="n1", task_id=f"t{job_id}")
        assert redis_client.llen(queue_name(Stage.RUN, "n1")) == 3
    finally:
        app.farm.close()
