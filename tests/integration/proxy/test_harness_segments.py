"""A batch's history policy end to end: real queues and workers, a bwrap sandbox, the built-in backend
serving the qwen3 family's tiny model (its real template drops past reasoning) and an unmodified
harness in three turns. Under the batch's ``template`` every turn is a segment of its own, and every
segment comes back: stored with the trajectory, in the binary and JSON results pages, and as rows of
``to_arrays(segments="all")``; a harness config's own ``harness.history`` wins over the batch's."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from farm.client import FarmClient, to_arrays
from farm.embedded import EmbeddedStack
from farm.schemas import JobResult, TrajectoryOut, TrajectorySegmentOut
from tests.integration.proxy.conftest import Qwen3Scripted

#: A stack of its own with the qwen3 model, two harness jobs in bwrap sandboxes: ~70 s on an idle
#: machine, past the default 120 s limit on a busy one.
# The model-family suite (--run-matrix, which .ci/run passes): the default suite keeps to its time.
pytestmark = [pytest.mark.integration, pytest.mark.matrix, pytest.mark.timeout(360)]

WORD = "SEGMENTSTEST"
TURNS = [
    "<think>\nplan the file\n</think>\n\nwriting it",
    "<think>\ncheck it\n</think>\n\nwritten",
    "<think>\nwrap up\n</think>\n\nbye",
]
#: The harness: three calls, each reply echoed as the API gave it (reasoning too), a user turn after
#: each of the first two, then the task's file written.
HARNESS = textwrap.dedent(
    f"""
    import json, os, urllib.request
    base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]

    def chat(messages):
        body = json.dumps({{"model": "m", "messages": messages, "max_tokens": 64}}).encode()
        req = urllib.request.Request(base + "/chat/completions", body, {{
            "Authorization": "Bearer " + key, "Content-Type": "application/json"}})
        return json.load(urllib.request.urlopen(req))["choices"][0]["message"]

    messages = [{{"role": "user", "content": "{WORD}: write the file"}}]
    for follow in ("go on", "thanks", None):
        reply = chat(messages)
        keep = ("role", "content", "reasoning_content")
        messages.append({{k: v for k, v in reply.items() if k in keep and v is not None}})
        if follow:
            messages.append({{"role": "user", "content": follow}})
    open("hello.txt", "w").write("Hello, farm!\\n")
    """
)


@pytest.fixture(scope="module")
def qwen3_harness_stack(qwen3_scripted: Qwen3Scripted) -> Iterator[EmbeddedStack]:
    with qwen3_scripted("segmentstest", {"rules": [{"match": WORD, "turns": TURNS}]}) as stack:
        yield stack


def harness_task(history: str | None = None) -> dict[str, Any]:
    harness: dict[str, Any] = {"preset": "command", "command": ["python3", "-c", HARNESS]}
    if history is not None:
        harness["history"] = history
    return {
        "type": "harness",
        "config": {"task": {"type": "harbor", "config": {"example": "hello-file"}}, "harness": harness},
    }


def segments_of(traj: TrajectoryOut) -> list[tuple[list[int], list[int], list[float]]]:
    """Every segment of a trajectory (the others oldest first, then the main one), as lists."""
    every: list[TrajectorySegmentOut | TrajectoryOut] = [*traj.segments, traj]
    return [
        (np.asarray(s.token_ids).tolist(), np.asarray(s.loss_mask).tolist(), np.asarray(s.logprobs).tolist())
        for s in every
    ]


def test_a_template_batch_returns_every_segment_and_a_harness_config_overrides_it(
    qwen3_harness_stack: EmbeddedStack, family_model_dir: Callable[[str], Path]
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(family_model_dir("qwen3"))
    url = qwen3_harness_stack.settings.api_url
    with FarmClient(url, token="e2e-token") as client:
        # The first task follows the batch's policy; the second's config says exact, which wins.
        batch = client.submit([harness_task(), harness_task("exact")], history="template")
        assert client.status(batch.id).history == "template"
        results: dict[str, list[JobResult]] = {
            enc: sorted(client.results(batch.id, encoding=enc), key=lambda r: r.job.group_index)
            for enc in ("binary", "json")
        }
    for result in results["json"]:
        assert result.job.outcome == "ok" and result.job.reward == 1.0, (result.job.reason, result.job)
    template, exact = (r.trajectory for r in results["json"])
    assert template is not None and exact is not None

    # exact: one segment, every sampled id kept.
    assert exact.info["segments"] == 1 and exact.segments == []
    # template: the Qwen3 template rewrote each earlier turn (its reasoning dropped), so each turn is a
    # segment with its own prompt; the job keeps all three, the main one (the last call's) last.
    assert template.info["segments"] == 3 and template.info["main_segment"] == 2 and len(template.segments) == 2
    stored = segments_of(template)
    with httpx.Client(base_url=url, headers={"Authorization": "Bearer e2e-token"}) as api:
        record = api.get(f"/v1/trials/{template.info['trial']}/record", params={"encoding": "json"}).json()
    assert record["history"] == "template"
    assert [ids for ids, _, _ in stored] == [s["token_ids"] for s in record["segment_tokens"]]
    assert [mask for _, mask, _ in stored] == [s["loss_mask"] for s in record["segment_tokens"]]
    for (ids, mask, _), turn in zip(stored, TURNS, strict=True):
        assert tok.decode([t for t, m in zip(ids, mask, strict=True) if m]) == turn + "<|im_end|>"
    assert "plan the file" not in tok.decode(stored[2][0]), "a later prompt is the template's: reasoning dropped"

    # The binary page carries the same segments, arrays and all.
    binary = results["binary"][0].trajectory
    assert binary is not None and binary.encoding == "binary"
    assert [[np.asarray(a).tolist() for a in s] for s in segments_of(binary)] == [list(s) for s in stored]
    assert [s.turn_offsets for s in binary.segments] == [s.turn_offsets for s in template.segments]

    # to_arrays: a row per segment, the reward on each, and each row's trajectory.
    for trajs in ([r.trajectory for r in results["binary"]], [template, exact]):
        rows = to_arrays([t for t in trajs if t is not None], segments="all", pad_side="left")
        assert rows["trajectory_index"].tolist() == [0, 0, 0, 1]
        assert rows["main_segment"].tolist() == [False, False, True, True]
        assert rows["rewards"].tolist() == [1.0] * 4
        assert rows["lengths"].tolist() == [len(ids) for ids, _, _ in stored] + [exact.num_tokens]
        for row, (ids, mask, logprobs) in enumerate(stored):
            n = len(ids)
            assert rows["input_ids"][row, -n:].tolist() == ids and rows["loss_mask"][row, -n:].tolist() == mask
            expected = np.asarray(logprobs, dtype=np.float32) * np.asarray(mask, dtype=np.float32)
            np.testing.assert_allclose(np.asarray(rows["old_logprobs"][row, -n:], dtype=np.float32), expected)
    # The default is unchanged: one row per trajectory, its main segment.
    main_rows = to_arrays([template, exact])
    assert main_rows["lengths"].tolist() == [template.num_tokens, exact.num_tokens]
