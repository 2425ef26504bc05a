"""A trial's history policy under templates that rewrite earlier turns, with the real families'
tokenizers and templates: Qwen3 drops a past reply's reasoning and its empty ``<think>`` block, so
``exact`` keeps one sequence (the parent's ids + what the template writes for the new messages) and
``template`` starts a segment per turn; Qwen2.5 and Llama 3 rewrite nothing, so both agree."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from farm.config import Settings
from farm.db.session import make_engine, make_session_factory, transaction
from farm.errors import TemplateFork
from farm.proxy.continuity import Renderer
from farm.proxy.conversation import ChatRequest, Message, Tool, ToolCall
from farm.proxy.events import TrialContext
from farm.proxy.prepare import IdCache, Prepared, Preparer
from farm.schemas.trials import TrialCreate
from farm.trials import record, statements, store
from farm.trials.statements import split_settings
from farm.trials.values import Parent
from tasks.harness.config import HarnessSpec

TOOLS = [Tool(name="bash", parameters={"type": "object", "properties": {"cmd": {"type": "string"}}})]
CALL = ToolCall(id="call_1", name="bash", arguments='{"cmd": "ls"}')
THINK = "<think>\nlist them first\n</think>\n\n"
FIRST = [Message(role="system", content="be brief"), Message(role="user", content="list files")]
#: turn 2's messages: the first call's request, its reply (a tool call; the reasoning is not echoed), the result.
SECOND = [*FIRST, Message(role="assistant", tool_calls=[CALL]), Message(role="tool", content="a.txt", name="bash")]
#: turn 3's: the second call's reply (an answer) and a user turn.
THIRD = [*SECOND, Message(role="assistant", content="found a.txt"), Message(role="user", content="thanks")]


@pytest.fixture(scope="module")
def qwen3(family_tokenizer: Callable[[str], Any]) -> Any:
    return family_tokenizer("qwen3")


def _ids(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def _conversation(tok: Any) -> tuple[Renderer, list[int], list[int], list[int], int]:
    """The first prompt, what the model sampled in turns 1 and 2 (reasoning, a call; reasoning, an
    answer), and the end-of-turn id."""
    renderer = Renderer(tok)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    prompt = renderer.fresh(FIRST, TOOLS)
    call = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>'
    return renderer, prompt, [*_ids(tok, THINK + call), end], [*_ids(tok, THINK + "found a.txt"), end], end


def test_history_exact_keeps_every_sampled_id_and_appends_the_new_messages(qwen3: Any) -> None:
    renderer, prompt, sampled1, sampled2, end = _conversation(qwen3)
    # Turn 2: the parent's prompt + every id it sampled (reasoning, call, end of turn) + the tool result.
    second = renderer.exact_delta(SECOND, TOOLS, covered=3, last_sampled_id=end)
    result = "\n<|im_start|>user\n<tool_response>\na.txt\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert second.ids == _ids(qwen3, result)
    # ...which is the template's own text for the new message, in its place.
    assert renderer.render(SECOND, TOOLS, generation_prompt=True).endswith("</tool_call><|im_end|>" + result)
    prompt2 = prompt + sampled1 + second.ids
    # Turn 3: one sequence still, the earlier reasoning and the second's kept as sampled.
    third = renderer.exact_delta(THIRD, TOOLS, covered=5, last_sampled_id=end)
    assert qwen3.decode(third.ids) == "\n<|im_start|>user\nthanks<|im_end|>\n<|im_start|>assistant\n"
    prompt3 = prompt2 + sampled2 + third.ids
    assert prompt3[: len(prompt)] == prompt and qwen3.decode(prompt3).count(THINK) == 2
    # The template would show neither reasoning block: the certificate counts what it drops.
    assert second.rewritten and third.rewritten
    dropped = len(_ids(qwen3, THINK))
    assert second.rewrite(prompt + sampled1, len(sampled1)) == (dropped, 0)
    assert third.rewrite(prompt2 + sampled2, len(sampled2)) == (dropped, 0)


def test_history_template_forks_where_qwen3_drops_the_reasoning(qwen3: Any) -> None:
    renderer, _, _, _, end = _conversation(qwen3)
    for messages, covered in ((SECOND, 3), (THIRD, 5)):
        with pytest.raises(TemplateFork, match="differently once the new messages follow"):
            renderer.delta(messages, TOOLS, covered=covered, last_sampled_id=end)


def test_history_exact_without_reasoning_drops_nothing(qwen3: Any) -> None:
    # A reply without <think>: the template still renders the last turn differently (its empty
    # block), but nothing the model sampled is dropped.
    renderer, prompt, _, _, end = _conversation(qwen3)
    sampled = [*_ids(qwen3, '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>'), end]
    found = renderer.exact_delta(SECOND, TOOLS, covered=3, last_sampled_id=end)
    assert found.rewrite(prompt + sampled, len(sampled)) == (0, 0)


@pytest.mark.parametrize("family", ["qwen2.5", "llama3"])
def test_history_exact_and_template_agree_where_the_template_rewrites_nothing(
    family_tokenizer: Callable[[str], Any], family: str
) -> None:
    tok = family_tokenizer(family)
    renderer = Renderer(tok)
    end = tok.eos_token_id if family == "qwen2.5" else tok.convert_tokens_to_ids("<|eot_id|>")
    for messages, covered in ((SECOND, 3), (THIRD, 5)):
        exact = renderer.exact_delta(messages, TOOLS, covered=covered, last_sampled_id=end)
        assert not exact.rewritten
        assert exact.ids == renderer.delta(messages, TOOLS, covered=covered, last_sampled_id=end)


def test_history_exact_forks_where_the_new_messages_render_differently_after_the_reply(tiny_tokenizer: Any) -> None:
    class AfterACall:
        """Writes a tool result one way after a reply with a call and another after plain text."""

        eos_token_id = tiny_tokenizer.eos_token_id

        def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
            parts, after_call = [], False
            for m in conversation:
                tag = "<result-of-call>" if m["role"] == "tool" and after_call else f"<{m['role']}>"
                parts.append(tag + (m["content"] or ""))
                after_call = bool(m.get("tool_calls"))
            return "".join(parts) + ("<assistant>" if kwargs.get("add_generation_prompt") else "")

        def encode(self, text: str, **kwargs: Any) -> list[int]:
            return list(tiny_tokenizer.encode(text, **kwargs))

        def decode(self, token_ids: Any, **kwargs: Any) -> str:
            return str(tiny_tokenizer.decode(token_ids, **kwargs))

    with pytest.raises(TemplateFork, match="new messages differently after this reply"):
        Renderer(AfterACall()).exact_delta(SECOND, TOOLS, covered=3, last_sampled_id=None)


def _prepare(tok: Any, history: str, messages: list[Message], parent_ids: list[int], sampled: int) -> Prepared:
    renderer = Renderer(tok)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    ids = IdCache()
    ids.put(("t", 0, None), np.asarray(parent_ids, dtype=np.int32))
    parent = Parent(seq=0, segment=0, covered=3, last_sampled_id=end, sampled_tokens=sampled)
    trial = TrialContext(id="t", model="m", sampling={}, history=history)
    request = ChatRequest(messages=messages, tools=TOOLS)
    # The parent's ids are in the cache: nothing is read through the recorder.
    return Preparer(recorder=None, ids=ids).chat(renderer, trial, messages, request, [], parent)  # type: ignore[arg-type]


def test_history_policy_decides_the_prepared_prompt_and_its_certificate(qwen3: Any) -> None:
    renderer, prompt, sampled1, _, end = _conversation(qwen3)
    parent_ids = prompt + sampled1
    exact = _prepare(qwen3, "exact", SECOND, parent_ids, len(sampled1))
    delta = renderer.exact_delta(SECOND, TOOLS, covered=3, last_sampled_id=end).ids
    assert exact.prompt_ids.tolist() == parent_ids + delta and exact.parent is not None
    assert exact.continuity.as_dict() == {
        "extends": 0,
        "reused_tokens": len(parent_ids),
        "template_tokens": len(delta),
        "history": "exact",
        "template_dropped_tokens": len(_ids(qwen3, THINK)),
        "template_inserted_tokens": 0,
    }
    template = _prepare(qwen3, "template", SECOND, parent_ids, len(sampled1))
    assert template.parent is None
    assert template.prompt_ids.tolist() == renderer.fresh(SECOND, TOOLS)
    entry = template.continuity.as_dict()
    assert entry["history"] == "template" and entry["compared_with"] == 0 and entry["extends"] is None
    assert "differently once the new messages follow" in entry["reason"]


def test_history_is_exact_unless_the_trial_says_template() -> None:
    assert TrialCreate().history == "exact"
    assert TrialCreate(history="template").history == "template"
    with pytest.raises(ValidationError):
        TrialCreate(history="rewrite")
    # A trial made before the policy existed stored none: the default.
    assert split_settings({"temperature": 1.0}) == ({"temperature": 1.0}, "exact")
    assert split_settings({"temperature": 1.0, "history": "template"}) == ({"temperature": 1.0}, "template")


@pytest.mark.parametrize("history", [None, "template"])
def test_history_round_trips_through_the_trial(db_url: str, history: str | None) -> None:
    engine = make_engine(Settings(), url=db_url)
    sessions = make_session_factory(engine)
    try:
        with transaction(sessions) as session:
            trial, key = store.new_trial(session, trial_id=None, model="m", sampling={"top_p": 0.5}, history=history)
            summary = record.summary(trial)
        with engine.connect() as conn:
            found = statements.credentials(conn, summary["id"])
    finally:
        engine.dispose()
    # The policy rides with the sampling settings, and is read back apart from them.
    assert summary["sampling"] == {"top_p": 0.5} and summary["history"] == (history or "exact")
    assert found is not None and found.sampling == {"top_p": 0.5} and found.history == (history or "exact")


def test_history_of_a_harness_job_is_in_its_harness_spec() -> None:
    # Unset, the batch's policy applies (StageContext.history, exact unless the batch says otherwise).
    assert HarnessSpec().history is None and HarnessSpec(history="template").history == "template"
    with pytest.raises(ValidationError):
        HarnessSpec(history="rewrite")
