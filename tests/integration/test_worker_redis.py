"""A worker process's parts that talk to the real Redis: the sweep turn and the broker channel."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


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
