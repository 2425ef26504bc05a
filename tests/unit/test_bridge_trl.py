"""Farm results as TRL's training rows, the worker's production budget, and the CPU attention that
stands in for TRL's FlashAttention-3 kernel. Fast: no farm, no trainer; the two tests that build
TRL's own RolloutSample run with the opt-in TRL suite (--run-trl), since importing TRL imports its trainer."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest

from farm.bridges import trl as trl_bridge
from farm.bridges.samples import group_advantages, to_sequences
from farm.constants import JobState, Outcome
from farm.errors import SampleFailed
from farm.schemas import JobOut, JobResult, TrajectoryOut, TrajectorySegmentOut

# prompt [1 2 3], model turn [4 5], tool observation + generation prompt [6 7], model turn [8 9]
IDS = [1, 2, 3, 4, 5, 6, 7, 8, 9]
MASK = [0, 0, 0, 1, 1, 0, 0, 1, 1]
LOGPROBS = [0.0, 0.0, 0.0, -0.1, -0.2, -9.0, -9.0, -0.3, -0.4]


def result(
    job_id: int = 7,
    *,
    reward: float | None = 0.5,
    versions: list[tuple[int, int, int]] | None = None,
    state: JobState = JobState.DONE,
    segments: list[TrajectorySegmentOut] | None = None,
) -> JobResult:
    job = JobOut(
        id=job_id,
        batch_id=1,
        group_id=11,
        group_index=0,
        sample_index=job_id,
        type="math",
        state=state,
        outcome=Outcome.OK if state is JobState.DONE else Outcome.INFRA_ERROR,
        reason=None if state is JobState.DONE else "sandbox died",
        attempts=3,
        node="n",
        reward=reward if state is JobState.DONE else None,
        created_at=datetime.now(UTC),
        init_at=None,
        run_at=None,
        eval_at=None,
        finished_at=None,
    )
    traj = TrajectoryOut(
        job_id=job_id,
        batch_id=1,
        group_id=11,
        encoding="json",
        num_tokens=len(IDS),
        token_ids=IDS,
        logprobs=LOGPROBS,
        loss_mask=MASK,
        turn_offsets=[0, 3, 5, 7],
        weight_versions=[(3, 3, 5), (4, 7, 9)] if versions is None else versions,
        reward=reward,
        metrics={},
        timings={},
        info={},
        segments=segments or [],
    )
    return JobResult(seq=job_id, job=job, trajectory=traj if state is JobState.DONE else None)


def test_a_multi_turn_trajectory_is_one_row_with_tool_observations_kept_and_masked():
    (row,) = to_sequences(result())
    assert row.input_ids.tolist() == IDS and row.completion_mask.tolist() == MASK
    # the observation's tokens stay in the sequence the model saw, with mask 0 and logprob 0
    assert row.old_log_probs.tolist() == pytest.approx([0, 0, 0, -0.1, -0.2, 0, 0, -0.3, -0.4])
    assert row.input_ids.dtype == np.int64 and row.old_log_probs.dtype == np.float32
    assert (row.oldest_version, row.reward, row.segment, row.segments) == (3, 0.5, 0, 1)


def test_each_segment_of_a_template_history_episode_is_a_row_of_its_own_the_main_one_last():
    earlier = TrajectorySegmentOut(
        num_tokens=3,
        token_ids=[1, 2, 3],
        logprobs=[0.0, 0.0, -0.7],
        loss_mask=[0, 0, 1],
        turn_offsets=[0, 2],
        weight_versions=[(2, 2, 3)],
    )
    first, main = to_sequences(result(segments=[earlier]))
    assert first.input_ids.tolist() == [1, 2, 3] and first.completion_mask.tolist() == [0, 0, 1]
    assert first.oldest_version == 2 and main.input_ids.tolist() == IDS
    assert (first.segment, main.segment, first.segments) == (0, 1, 2) and first.reward == main.reward


def test_a_job_without_a_reward_is_never_a_row():
    with pytest.raises(SampleFailed):
        to_sequences(result(state=JobState.FAILED))


def test_group_advantages_are_each_reward_against_the_group_and_zero_when_all_equal():
    assert group_advantages([1.0, 0.0]).tolist() == pytest.approx([1.0, -1.0])
    assert group_advantages([0.3, 0.3, 0.3]).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.trl  # TRL's own RolloutSample: importing TRL takes its trainer (torch, accelerate, datasets)
def test_a_group_becomes_trl_samples_with_its_advantage_and_the_version_that_sampled_it():
    group = trl_bridge.rollout_samples(
        [
            result(1, reward=1.0),
            result(2, reward=0.0, versions=[(5, 3, 5), (5, 7, 9)]),
            result(3, state=JobState.FAILED),
        ],
        version_offset=10,
        current_version=16,
        prompt=[{"role": "user", "content": "q"}],
    )
    assert group.failed == 1 and group.job_ids == [1, 2]
    first, second = group.samples
    assert first.advantage == pytest.approx(1.0) and second.advantage == pytest.approx(-1.0)
    # the oldest weights of a row, in TRL's numbering (farm version + offset)
    assert (first.model_version, second.model_version) == (13, 15)
    assert first.group_id == 11 and first.metrics["reward"] == 1.0 and first.prompt[0]["content"] == "q"
    assert first.completion_mask.tolist() == MASK and first.input_ids.tolist() == IDS


@pytest.mark.trl
def test_a_row_no_model_sampled_takes_the_current_version():
    group = trl_bridge.rollout_samples(
        [result(1, versions=[]), result(2, versions=[])], version_offset=0, current_version=4
    )
    assert [s.model_version for s in group.samples] == [4, 4]


def test_farm_task_reads_the_rows_column_and_says_what_is_missing():
    task = {"type": "math", "config": {"problem_id": "gsm-1"}}
    assert trl_bridge.farm_task({"farm_task": task}) == task
    assert trl_bridge.farm_task({"farm_task": '{"type": "echo"}'}) == {"type": "echo", "config": {}}
    with pytest.raises(ValueError, match="farm_task column"):
        trl_bridge.farm_task({"prompt": []})


class _NoFarm:
    """The client seam: the budget never calls the farm."""

    def close(self) -> None:
        pass


def worker(**kwargs: Any) -> Any:
    defaults: dict[str, Any] = {"token": None, "dataset": [{"farm_task": {"type": "echo"}}], "num_generations": 4}
    return trl_bridge.FarmRolloutWorker("http://farm", client=cast(Any, _NoFarm()), **(defaults | kwargs))


def test_the_worker_makes_one_step_and_the_loaders_read_ahead_then_waits_for_the_next_version():
    w = worker(samples_per_step=8, max_staleness=0)
    w.model_version = 1
    w._first_version = 1
    assert w._room() == 2  # two groups of 4 at a time (one step's worth per batch)
    w._submitted_samples, w._inflight = 16, 0
    assert w._room() == 0, "a step and the micro-batch read ahead are out: nothing more until the weights move"
    w.model_version = 2
    assert w._room() == 2


def test_staleness_lets_the_worker_run_that_many_steps_ahead_and_failures_are_made_again():
    w = worker(samples_per_step=8, max_staleness=2)
    w.model_version = w._first_version = 1
    w._submitted_samples = 32  # (1 + 2) steps + the read-ahead
    assert w._room() == 0
    w._shortfall = 3  # three jobs without a reward: the step still needs them
    assert w._room() == 1


def test_the_in_flight_bound_holds_whatever_the_budget():
    w = worker(samples_per_step=64, max_staleness=3, max_inflight_groups=5)
    w.model_version = w._first_version = 1
    w._inflight = 4
    assert w._room() == 1


def test_a_sample_the_trainer_takes_too_stale_is_counted_and_made_again():
    w = worker(samples_per_step=8, max_staleness=1)
    w.model_version = 5
    fresh, stale = SimpleNamespace(model_version=4), SimpleNamespace(model_version=3)
    w._taken(fresh)  # version 4: one behind, kept
    w._taken(stale)  # version 3: two behind, TRL drops it
    assert w.ledger.kept_versions == [4] and w.ledger.taken_stale == 1 and w._shortfall == 1


def tree_rows(lengths: list[int], shared: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each sample's own tokens after a shared prefix of ``shared`` tokens."""
    start = shared
    for n in lengths:
        yield start, start + n
        start += n


def test_the_cpu_varlen_attention_is_causal_attention_along_each_segments_path():
    torch = pytest.importorskip("torch")
    from farm.bridges.trl_cpu import varlen_attention

    torch.manual_seed(0)
    heads, kv_heads, dim, shared, lengths = 4, 2, 8, 5, [3, 4]
    total = shared + sum(lengths)
    q, k, v = torch.randn(total, heads, dim), torch.randn(total, kv_heads, dim), torch.randn(total, kv_heads, dim)
    # segments: the shared prefix, then each sample's tail; a tail's path is the prefix and itself
    paths = [list(range(shared))] + [list(range(shared)) + list(range(a, b)) for a, b in tree_rows(lengths, shared)]
    kv_index = torch.tensor([i for path in paths for i in path])
    cu_q = torch.tensor([0, shared, shared + lengths[0], total], dtype=torch.int32)
    cu_k = torch.tensor([0, *np.cumsum([len(p) for p in paths]).tolist()], dtype=torch.int32)
    out = varlen_attention(q, k.index_select(0, kv_index), v.index_select(0, kv_index), cu_q, cu_k, 7, 9)
    for a, b in tree_rows(lengths, shared):
        # the sample alone, unpacked: plain causal attention over prefix + tail
        rows = list(range(shared)) + list(range(a, b))
        qs = q[rows].transpose(0, 1)
        ks, vs = (x[rows].repeat_interleave(heads // kv_heads, dim=1).transpose(0, 1) for x in (k, v))
        plain = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True).transpose(0, 1)
        assert torch.allclose(out[a:b], plain[shared:], atol=1e-6)
        assert torch.allclose(out[:shared], plain[:shared], atol=1e-6)
