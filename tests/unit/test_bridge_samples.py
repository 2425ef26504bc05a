"""A farm result as one RL sample: the split trainers' rollout workers (verl's) use."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from farm.bridges.samples import to_sample, to_samples
from farm.constants import JobState, Outcome
from farm.errors import SampleFailed
from farm.schemas import JobOut, JobResult, TrajectoryOut, TrajectorySegmentOut


def result(*, reward: float | None = 0.5, outcome: Outcome = Outcome.OK, state: JobState = JobState.DONE) -> JobResult:
    # prompt [1 2 3], model turn [4 5], tool result + generation prompt [6 7], model turn [8 9]
    ids = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    mask = [0, 0, 0, 1, 1, 0, 0, 1, 1]
    logprobs = [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.3, -0.4]
    job = JobOut(
        id=7,
        batch_id=1,
        group_id=1,
        group_index=0,
        sample_index=0,
        type="math",
        state=state,
        outcome=outcome,
        reason=None,
        attempts=3,
        node="n",
        reward=reward,
        created_at=datetime.now(UTC),
        init_at=None,
        run_at=None,
        eval_at=None,
        finished_at=None,
    )
    traj = TrajectoryOut(
        job_id=7,
        batch_id=1,
        group_id=1,
        encoding="json",
        num_tokens=9,
        token_ids=ids,
        logprobs=logprobs,
        loss_mask=mask,
        turn_offsets=[0, 3, 5, 7],
        weight_versions=[(2, 3, 5), (3, 7, 9)],
        reward=reward,
        metrics={},
        timings={},
        info={},
    )
    return JobResult(seq=1, job=job, trajectory=traj if state is JobState.DONE else None)


def test_sample_splits_prompt_from_response_with_masks_and_logprobs_aligned():
    sample = to_sample(result())
    assert sample.prompt_ids == [1, 2, 3]
    assert sample.response_ids == [4, 5, 6, 7, 8, 9]
    assert sample.response_mask == [1, 1, 0, 0, 1, 1]
    assert sample.response_logprobs == pytest.approx([-0.1, -0.2, 0.0, 0.0, -0.3, -0.4])
    assert (sample.reward, sample.num_turns) == (0.5, 4)
    assert sample.extra["weight_versions"] == [[2, 3, 5], [3, 7, 9]] and sample.extra["farm_job_id"] == 7


def test_sample_longer_than_the_trainers_response_length_keeps_its_first_tokens():
    sample = to_sample(result(), max_response_tokens=3)
    assert sample.response_ids == [4, 5, 6] and sample.response_mask == [1, 1, 0]
    assert len(sample.response_logprobs) == 3 and sample.extra["truncated"] is True


@pytest.mark.parametrize(
    "bad",
    [
        {"reward": None, "outcome": Outcome.INFRA_ERROR, "state": JobState.FAILED},
        {"reward": None, "outcome": Outcome.CANCELLED, "state": JobState.CANCELLED},
    ],
)
def test_a_job_without_a_reward_is_never_a_sample_with_reward_zero(bad):
    with pytest.raises(SampleFailed):
        to_sample(result(**bad))


def with_an_earlier_segment(r: JobResult) -> JobResult:
    """``r`` as an episode of two segments: an earlier one (prompt [1 2], model turn [3]) and its main one."""
    assert r.trajectory is not None
    earlier = TrajectorySegmentOut(
        num_tokens=3, token_ids=[1, 2, 3], logprobs=[0.0, 0.0, -0.7], loss_mask=[0, 0, 1], turn_offsets=[0, 2]
    )
    return r.model_copy(update={"trajectory": r.trajectory.model_copy(update={"segments": [earlier]})})


def test_samples_of_every_segment_carry_the_reward_and_end_with_the_main_one():
    first, last = to_samples(with_an_earlier_segment(result()))
    assert (first.prompt_ids, first.response_ids, first.response_mask) == ([1, 2], [3], [1])
    assert first.response_logprobs == pytest.approx([-0.7]) and first.reward == last.reward == 0.5
    assert last.response_ids == [4, 5, 6, 7, 8, 9] and last.extra["farm_segment"] == 1
    assert first.extra["farm_segments"] == last.extra["farm_segments"] == 2


def test_the_main_sample_of_a_segmented_episode_says_how_many_segments_it_has():
    (sample,) = to_samples(with_an_earlier_segment(result()), segments="main")
    assert sample.response_ids == [4, 5, 6, 7, 8, 9] and sample.extra["farm_segments"] == 2
    assert to_sample(result()).extra["farm_segments"] == 1
