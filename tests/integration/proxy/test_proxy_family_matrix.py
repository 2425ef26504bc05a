"""The family matrix (``farm.testing.family_matrix``): every model family's three-call conversation
(reasoning and a tool call in the family's own format, the tool's result, a user turn) through the
proxy on Chat Completions, Responses and Anthropic Messages, streamed and not, under both history
policies, with the real ``openai`` and ``anthropic`` SDKs and the built-in backend scripted on the
family's real tokenizer. Each cell requires: the SDK reads the reasoning, the answer and the tool
calls; drift 0 (every model id is the script's); every recorded logprob within 1e-4 of a
teacher-forced recompute; one segment under ``exact``, one per template rewrite under ``template``.

One stack per family (module-scoped, grouped by pytest). The default suite runs one cell (Chat
Completions, whole, ``exact``) of two families whose formats differ most from the tiny model's
(``DEFAULT_FAMILIES``: a stack and a tokenizer cost ~25 s each); ``--run-matrix`` runs the rest."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from farm.llm.builtin.script import template_markers
from farm.llm.families import FAMILIES
from farm.testing.family_matrix import FORMATS, Plan, check_record, converse, plan_for, read_problems
from tests.conftest import teacher_for
from tests.integration.conftest import scripted_stack
from tests.integration.proxy.conftest import TOKEN

pytestmark = pytest.mark.integration


@dataclass
class FamilyFarm:
    api: httpx.Client
    plan: Plan
    tokenizer: Any
    end_id: int
    teacher: Callable[[list[int]], list[float]]


def _stop_ids(model_dir: Path) -> frozenset[int]:
    from transformers import GenerationConfig

    eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    return frozenset(eos if isinstance(eos, list) else [eos])


#: families whose default cell the default suite runs (qwen3 has tests of its own there).
DEFAULT_FAMILIES = ("qwen3-coder", "llama3")


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(family, marks=() if family in DEFAULT_FAMILIES else pytest.mark.matrix) for family in FAMILIES
    ],
)
def farm(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    module_pg_url: str,
    redis_url: str,
    family_model_dir: Callable[[str], Path],
) -> Iterator[FamilyFarm]:
    from transformers import AutoTokenizer

    family = str(request.param)
    model_dir = family_model_dir(family)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    stop_ids = _stop_ids(model_dir)
    plan = plan_for(family, tokenizer, stop_ids)
    markers = template_markers(tokenizer, stop_ids)
    assert markers is not None
    with (
        scripted_stack(
            tmp_path_factory.mktemp(f"matrix-{family}"),
            redis_url=redis_url,
            redis_offset=0,
            database_url=module_pg_url,
            model_dir=model_dir,
            node=f"matrix{family.replace('.', '').replace('-', '')}",
            rules=plan.script(),
            stages=(),  # trials through the API's proxy only: no workers
        ) as stack,
        httpx.Client(base_url=stack.settings.api_url, headers=TOKEN, timeout=120) as api,
    ):
        yield FamilyFarm(api, plan, tokenizer, markers[2], teacher_for(model_dir))


CELLS = [
    pytest.param(fmt, streamed, history, id=f"{fmt}-{'streamed' if streamed else 'whole'}-{history}")
    if (fmt, streamed, history) == ("chat", False, "exact")
    else pytest.param(
        fmt, streamed, history, id=f"{fmt}-{'streamed' if streamed else 'whole'}-{history}", marks=pytest.mark.matrix
    )
    for fmt in FORMATS
    for streamed in (False, True)
    for history in ("exact", "template")
]


@pytest.mark.parametrize(("fmt", "streamed", "history"), CELLS)
def test_family_conversation_is_token_exact(farm: FamilyFarm, fmt: str, streamed: bool, history: str) -> None:
    resp = farm.api.post("/v1/trials", json={"history": history})
    assert resp.status_code == 201, resp.text
    trial = resp.json()
    reads = converse(fmt, streamed, farm.plan, trial)
    assert read_problems(farm.plan, reads, farm.tokenizer) == []
    if fmt == "responses" or (fmt == "chat" and not streamed):
        # The usage counts the reasoning's tokens (Chat Completions: where a reasoning parser reads, as vLLM).
        reported = fmt == "responses" or FAMILIES[farm.plan.family].reasoning_parser is not None
        assert all((r.reasoning_tokens is not None) == reported for r in reads)
    assert farm.api.post(f"/v1/trials/{trial['id']}/end").status_code == 200
    record = farm.api.get(f"/v1/trials/{trial['id']}/record").json()
    fidelity = check_record(record, farm.plan, farm.tokenizer, farm.end_id, farm.teacher)
    assert fidelity.drifted == 0 and fidelity.tokens == sum(
        len(farm.tokenizer.encode(t.text, add_special_tokens=False)) + 1 for t in farm.plan.turns
    )
    assert fidelity.max_logprob_diff < 1e-4
    later = record["certificate"][1:]
    if history == "exact":
        assert record["segments"] == 1, later
    else:
        # Each new segment is a template rewrite, and says so.
        new = [c for c in later if c["extends"] is None]
        assert record["segments"] == 1 + len(new)
        assert all(c["reason"].startswith("the template renders") for c in new), new


def _two_calls(fmt: str) -> dict[str, Any]:
    """A history whose assistant reply made two tool calls at once, as ``fmt`` writes it."""
    args = '{"command": "ls"}'
    if fmt == "chat/completions":
        calls = [{"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": args}} for i in (1, 2)]
        results = [{"role": "tool", "tool_call_id": f"c{i}", "content": "ok"} for i in (1, 2)]
        return {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": calls}, *results]}
    if fmt == "responses":
        items: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
        items += [{"type": "function_call", "call_id": f"c{i}", "name": "bash", "arguments": args} for i in (1, 2)]
        items += [{"type": "function_call_output", "call_id": f"c{i}", "output": "ok"} for i in (1, 2)]
        return {"input": items}
    uses = [{"type": "tool_use", "id": f"c{i}", "name": "bash", "input": {"command": "ls"}} for i in (1, 2)]
    results = [{"type": "tool_result", "tool_use_id": f"c{i}", "content": "ok"} for i in (1, 2)]
    return {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": uses},
            {"role": "user", "content": results},
        ]
    }


@pytest.mark.parametrize("fmt", ["chat/completions", "responses", "messages", "messages/count_tokens"])
def test_a_conversation_the_template_refuses_is_the_format_s_400(farm: FamilyFarm, fmt: str) -> None:
    # Llama 3.1's template raises on a reply with two tool calls: the harness's to change, not a 500.
    if farm.plan.family != "llama3":
        pytest.skip("only Llama 3.1's template refuses two tool calls in one reply")
    resp = farm.api.post("/v1/trials", json={})
    assert resp.status_code == 201, resp.text
    trial = resp.json()
    answer = farm.api.post(
        f"{trial['openai_base_url']}/{fmt}",
        json={"model": "m", "max_tokens": 4, **_two_calls(fmt)},
        headers={"Authorization": f"Bearer {trial['key']}"},
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()
    assert "template refuses" in error["error"]["message"] and "tool" in error["error"]["message"], error
    if fmt.startswith("messages"):
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
    else:
        assert error["error"]["type"] == "invalid_request_error" and error["error"]["code"] == "template_refused"
    assert farm.api.post(f"/v1/trials/{trial['id']}/end").status_code == 200
