"""tool_choice required / named: the prompt ends with the opening of a call, as the template writes it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from farm.db.arrays import FLOAT32, INT32
from farm.db.models import TrialCall
from farm.errors import NoCallOpening
from farm.proxy.continuity import Renderer
from farm.proxy.conversation import Message, Tool, ToolCall
from farm.proxy.toolparse import CallPiece
from farm.proxy.toolparse.hermes import HermesToolCallParser
from farm.trials import record

TOOLS = [Tool(name="bash"), Tool(name="read_file")]
HISTORY = [Message(role="system", content="be brief"), Message(role="user", content="list the files")]


def _text(tokenizer: Any, ids: list[int]) -> str:
    return str(tokenizer.decode(ids, skip_special_tokens=False))


def test_call_opening_for_required_stops_before_the_name(tiny_tokenizer: Any) -> None:
    forced = Renderer(tiny_tokenizer).call_opening(HISTORY, TOOLS, name=None)
    assert _text(tiny_tokenizer, forced) == '<tool_call>\n{"name": "'


def test_call_opening_for_a_named_tool_ends_on_a_token_boundary_before_the_arguments(tiny_tokenizer: Any) -> None:
    renderer = Renderer(tiny_tokenizer)
    forced = renderer.call_opening(HISTORY, TOOLS, name="bash")
    # The tokenizer writes ' {"' as one token: the cut is left to the model, so it stops at the colon.
    assert _text(tiny_tokenizer, forced) == '<tool_call>\n{"name": "bash", "arguments":'
    # The forced ids are the template's own ids for such a call: prompt + forced + the rest is its rendering.
    call = Message(role="assistant", tool_calls=[ToolCall(id="c", name="bash", arguments='{"command": "ls"}')])
    whole = renderer.render([*HISTORY, call], TOOLS, generation_prompt=False)
    prompt = renderer.fresh(HISTORY, TOOLS)
    assert renderer.encode(whole)[: len(prompt) + len(forced)] == prompt + forced
    assert whole[len(_text(tiny_tokenizer, prompt + forced)) :].startswith(' {"command"')


def test_forced_opening_and_the_sampled_rest_parse_as_one_call() -> None:
    splitter = HermesToolCallParser()
    assert splitter.push('<tool_call>\n{"name": "bash", "arguments":') == []
    assert splitter.push(' {"command": "ls"}}\n</tool_call>') == [CallPiece(name="bash", arguments='{"command": "ls"}')]


def test_follow_up_extends_prompt_forced_and_sampled_ids_exactly(tiny_tokenizer: Any) -> None:
    # Given a call whose prompt ends with the forced opening and whose model wrote the rest
    renderer = Renderer(tiny_tokenizer)
    forced = renderer.call_opening(HISTORY, TOOLS, name=None)
    prompt = renderer.fresh(HISTORY, TOOLS) + forced
    sampled = renderer.encode('bash", "arguments": {"command": "ls"}}\n</tool_call>') + [tiny_tokenizer.eos_token_id]
    # When the harness sends the call back with the tool's result
    reply = Message(role="assistant", tool_calls=[ToolCall(id="c1", name="bash", arguments='{"command": "ls"}')])
    history = [*HISTORY, reply, Message(role="tool", content="a.txt", tool_call_id="c1", name="bash")]
    delta = renderer.delta(history, TOOLS, covered=3, last_sampled_id=sampled[-1])
    # Then the stitched ids are the template's rendering of the whole history: nothing drifted
    assert _text(tiny_tokenizer, prompt + sampled + delta) == renderer.render(history, TOOLS, generation_prompt=True)


def test_a_template_without_hermes_calls_cannot_force_one(tiny_tokenizer: Any) -> None:
    class PlainCalls:
        eos_token_id = tiny_tokenizer.eos_token_id

        def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
            out = ""
            for m in conversation:
                calls = "".join(f"CALL {c['function']['name']}" for c in m.get("tool_calls", []))
                out += f"<{m['role']}>{m['content']}{calls}"
            return out + ("<assistant>" if kwargs.get("add_generation_prompt") else "")

        def encode(self, text: str, **kwargs: Any) -> list[int]:
            return list(tiny_tokenizer.encode(text, **kwargs))

        def decode(self, token_ids: Any, **kwargs: Any) -> str:
            return str(tiny_tokenizer.decode(token_ids, **kwargs))

    with pytest.raises(NoCallOpening, match="<tool_call>"):
        Renderer(PlainCalls()).call_opening(HISTORY, TOOLS, name="bash")


def _call(seq: int, parent: int | None, delta: list[int], sampled: list[int], continuity: dict[str, Any]) -> Any:
    return TrialCall(
        trial_id="t",
        seq=seq,
        segment=0,
        parent_seq=parent,
        state="done",
        delta_ids=np.asarray(delta, dtype=INT32).tobytes(),
        sampled_ids=np.asarray(sampled, dtype=INT32).tobytes(),
        logprobs=np.full(len(sampled), -0.5, dtype=FLOAT32).tobytes(),
        continuity=continuity,
    )


def test_record_masks_the_forced_ids_and_trainer_offsets_keep_them_with_the_prompt() -> None:
    # Given a call whose prompt (5 ids) ends with 2 forced ids, and a call extending it
    first = _call(0, None, [1, 2, 3, 40, 41], [50, 51, 52], {"forced_prefix_tokens": 2})
    second = _call(1, 0, [6, 7], [60, 61], {"extends": 0})
    (segment,) = record.segments([first, second])
    # Then the forced ids are a span of their own, masked 0, between the prompt and the model's ids
    assert [s[:3] for s in segment.spans] == [
        ["prompt", 0, 3],
        ["forced", 3, 5],
        ["model", 5, 8],
        ["env", 8, 10],
        ["model", 10, 12],
    ]
    assert segment.loss_mask.tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    assert segment.logprobs[3:5].tolist() == [0.0, 0.0]
    # And the trainer's turn offsets count them with the prompt: spans still alternate
    assert segment.turn_offsets == [0, 5, 8, 10]
