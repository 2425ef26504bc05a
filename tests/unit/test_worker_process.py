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

    asked = []

    class NoLLM:
        settings = Settings(data_dir=tmp_path)

        @property
        def llm(self):
            # Recorded, not raised: _warm_tokenizer swallows what loading the tokenizer raises.
            asked.append("llm")
            raise RuntimeError("no policy")

    _warm_tokenizer(SimpleNamespace(farm=NoLLM()))
    assert asked == [], "the tokenizer must not be loaded without a policy"
