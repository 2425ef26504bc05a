from __future__ import annotations

import numpy as np
import pytest

from farm.client import decode_trajectory, to_arrays
from farm.db.arrays import encode_ids, encode_logprobs, encode_mask, pack_ids, pack_logprobs, pack_mask
from farm.schemas import ArrayEncoding, RawArray, TrajectoryOut, TrajectorySegmentOut


def traj(
    ids: list[int], mask: list[int], logprobs: list[float], reward: float | None, encoding: ArrayEncoding
) -> TrajectoryOut:
    return TrajectoryOut(
        job_id=1,
        batch_id=1,
        group_id=1,
        encoding=encoding,
        num_tokens=len(ids),
        token_ids=encode_ids(pack_ids(ids), encoding),
        logprobs=encode_logprobs(pack_logprobs(logprobs), encoding),
        loss_mask=encode_mask(pack_mask(mask), encoding),
        turn_offsets=[0],
        reward=reward,
        metrics={},
        timings={},
    )


@pytest.fixture(params=["b64", "json"])
def pair(request) -> list[TrajectoryOut]:
    return [
        traj([5, 6, 7, 8], [0, 0, 1, 1], [0.0, 0.0, -0.5, -0.25], 1.0, request.param),
        traj([9, 10], [0, 1], [0.0, -1.5], None, request.param),
    ]


def test_b64_and_json_decode_to_the_same_arrays():
    ids, mask, lps = [3, 2**31 - 1, 0], [0, 1, 1], [0.0, -0.1, -20.5]
    a = decode_trajectory(traj(ids, mask, lps, 0.5, "b64"))
    b = decode_trajectory(traj(ids, mask, lps, 0.5, "json"))
    assert a.token_ids.tolist() == b.token_ids.tolist() == ids
    assert np.allclose(a.logprobs, lps) and np.array_equal(a.logprobs, b.logprobs)
    assert a.loss_mask.tolist() == mask


def test_right_padding(pair):
    out = to_arrays(pair, pad_side="right", pad_token_id=-1)
    assert out["input_ids"].tolist() == [[5, 6, 7, 8], [9, 10, -1, -1]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert out["loss_mask"].tolist() == [[0, 0, 1, 1], [0, 1, 0, 0]]
    assert np.allclose(out["old_logprobs"], [[0, 0, -0.5, -0.25], [0, -1.5, 0, 0]])
    assert out["lengths"].tolist() == [4, 2]
    assert out["rewards"][0] == 1.0 and np.isnan(out["rewards"][1])
    assert out["old_logprobs"].dtype == np.float32


def test_integer_arrays_are_int32_unless_asked(pair):
    # Token ids are stored int32: the default loses nothing; a trainer that wants int64 asks.
    names = ("input_ids", "attention_mask", "loss_mask")
    assert {to_arrays(pair)[name].dtype for name in names} == {np.dtype(np.int32)}
    wide = to_arrays(pair, dtype=np.int64, pad_token_id=-1)
    assert {wide[name].dtype for name in names} == {np.dtype(np.int64)}
    assert wide["input_ids"].tolist() == to_arrays(pair, pad_token_id=-1)["input_ids"].tolist()


def test_left_padding(pair):
    out = to_arrays(pair, pad_side="left")
    assert out["input_ids"].tolist() == [[5, 6, 7, 8], [0, 0, 9, 10]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]
    assert out["loss_mask"].tolist() == [[0, 0, 1, 1], [0, 0, 0, 1]]


def test_max_len_truncates_and_flags(pair):
    out = to_arrays(pair, max_len=3)
    assert out["input_ids"].shape == (2, 3)
    assert out["truncated"].tolist() == [True, False]


def test_logprobs_are_zero_outside_the_loss_mask():
    t = traj([1, 2], [0, 1], [-3.0, -1.0], 0.0, "b64")  # a prompt token with a (bogus) logprob
    assert to_arrays([t])["old_logprobs"].tolist() == [[0.0, -1.0]]


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="at least one"):
        to_arrays([])
    with pytest.raises(ValueError, match="pad_side"):
        to_arrays([traj([1], [0], [0.0], 0.0, "json")], pad_side="middle")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="integer"):
        to_arrays([traj([1], [0], [0.0], 0.0, "json")], dtype=np.float32)


def test_a_binary_pages_raw_array_is_array_like():
    data = np.array([3, -1, 7], dtype="<i4").tobytes()
    raw = RawArray(dtype="int32", data=memoryview(data))
    assert len(raw) == 3
    view = np.asarray(raw)
    assert view.tolist() == [3, -1, 7] and view.dtype == np.int32 and not view.flags.writeable
    assert np.array(raw).flags.writeable  # np.array copies, as for any array-like
    assert np.asarray(raw, dtype=np.int64).dtype == np.int64
    assert np.asarray(
        RawArray(dtype="float32", data=memoryview(np.array([0.5], dtype=np.float32).tobytes()))
    ).tolist() == [0.5]


def with_segments(main: TrajectoryOut, *others: TrajectoryOut) -> TrajectoryOut:
    """``main`` with ``others``' arrays as its other segments (oldest first)."""
    fields = ("num_tokens", "token_ids", "logprobs", "loss_mask", "turn_offsets", "weight_versions")
    segments = [TrajectorySegmentOut(**{name: getattr(o, name) for name in fields}) for o in others]
    return main.model_copy(update={"segments": segments})


@pytest.fixture(params=["b64", "json"])
def episodes(request) -> list[TrajectoryOut]:
    """Two episodes: the first of three segments (two rewrites under ``template``), the second of one."""
    enc = request.param
    first = with_segments(
        traj([1, 2, 3], [0, 1, 1], [0.0, -0.1, -0.2], 1.0, enc),
        traj([1, 4], [0, 1], [0.0, -0.3], None, enc),
        traj([1, 5, 6, 7, 8], [0, 0, 1, 1, 1], [0.0, 0.0, -0.4, -0.5, -0.6], None, enc),
    )
    return [first, traj([9, 10], [0, 1], [0.0, -0.7], 0.0, enc)]


def test_to_arrays_defaults_to_each_trajectorys_main_segment(episodes):
    out = to_arrays(episodes)
    assert out["input_ids"].tolist() == [[1, 2, 3], [9, 10, 0]]
    assert out["rewards"].tolist() == [1.0, 0.0] and "trajectory_index" not in out


def test_to_arrays_all_segments_is_a_row_per_segment_with_its_trajectory(episodes):
    out = to_arrays(episodes, segments="all")
    # The other segments in the order they were made, then the main one; rewards repeated.
    assert out["input_ids"].tolist() == [[1, 4, 0, 0, 0], [1, 5, 6, 7, 8], [1, 2, 3, 0, 0], [9, 10, 0, 0, 0]]
    assert out["loss_mask"].tolist()[1] == [0, 0, 1, 1, 1]
    np.testing.assert_allclose(out["old_logprobs"][1], [0.0, 0.0, -0.4, -0.5, -0.6])
    assert out["rewards"].tolist() == [1.0, 1.0, 1.0, 0.0] and out["lengths"].tolist() == [2, 5, 3, 2]
    assert out["trajectory_index"].tolist() == [0, 0, 0, 1]
    assert out["main_segment"].tolist() == [False, False, True, True]
    # GRPO: an advantage per trajectory, from its main row, broadcast to each of its rows.
    rewards = out["rewards"][out["main_segment"]]
    advantages = (rewards - rewards.mean())[out["trajectory_index"]]
    assert advantages.tolist() == [0.5, 0.5, 0.5, -0.5]


def test_to_arrays_refuses_an_unknown_segments_choice(episodes):
    with pytest.raises(ValueError, match="segments"):
        to_arrays(episodes, segments="split")  # type: ignore[arg-type]
