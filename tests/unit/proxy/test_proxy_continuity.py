"""Prompt ids for an extending call: the parent's ids + what it sampled + the template's delta."""

from __future__ import annotations

from typing import Any

import pytest

from farm.errors import TemplateFork
from farm.proxy.continuity import Renderer
from farm.proxy.conversation import Message, Tool, ToolCall, chain, extend


def test_delta_is_what_the_template_adds_after_the_sampled_reply(tiny_tokenizer: Any) -> None:
    renderer = Renderer(tiny_tokenizer)
    first = [Message(role="system", content="be brief"), Message(role="user", content="hi")]
    prompt = renderer.fresh(first, [])
    reply_text = "hello there"
    sampled = tiny_tokenizer.encode(reply_text, add_special_tokens=False) + [tiny_tokenizer.eos_token_id]
    history = [*first, Message(role="assistant", content=reply_text), Message(role="user", content="more")]
    delta = renderer.delta(history, [], covered=3, last_sampled_id=sampled[-1])
    # The whole is the template's rendering of the history, as ids: nothing drifted.
    assert tiny_tokenizer.decode(prompt + sampled + delta) == renderer.render(history, [], generation_prompt=True)


def test_delta_adds_the_end_marker_when_the_model_did_not_write_it(tiny_tokenizer: Any) -> None:
    renderer = Renderer(tiny_tokenizer)
    first = [Message(role="user", content="hi")]
    sampled = tiny_tokenizer.encode("cut sho", add_special_tokens=False)  # ran out of max_tokens
    history = [*first, Message(role="assistant", content="cut sho"), Message(role="user", content="go on")]
    delta = renderer.delta(history, [], covered=2, last_sampled_id=sampled[-1])
    assert tiny_tokenizer.decode(delta).startswith("<|im_end|>")


def test_a_template_that_rewrites_earlier_turns_forks(tiny_tokenizer: Any) -> None:
    class DropsOldReplies:
        """Like templates that drop earlier turns' reasoning: the last reply renders differently."""

        eos_token_id = tiny_tokenizer.eos_token_id

        def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
            parts = []
            for i, m in enumerate(conversation):
                content = m["content"] if m["role"] != "assistant" or i == len(conversation) - 1 else "[old]"
                parts.append(f"<{m['role']}>{content}")
            return "".join(parts) + ("<assistant>" if kwargs.get("add_generation_prompt") else "")

        def encode(self, text: str, **kwargs: Any) -> list[int]:
            return list(tiny_tokenizer.encode(text, **kwargs))

        def decode(self, token_ids: Any, **kwargs: Any) -> str:
            return str(tiny_tokenizer.decode(token_ids, **kwargs))

    renderer = Renderer(DropsOldReplies())
    history = [
        Message(role="user", content="a"),
        Message(role="assistant", content="b"),
        Message(role="user", content="c"),
    ]
    with pytest.raises(TemplateFork, match="differently once the new messages follow"):
        renderer.delta(history, [], covered=2, last_sampled_id=None)


def test_hash_chain_tolerates_how_a_harness_echoes_a_reply() -> None:
    tools = [Tool(name="bash")]
    reply = Message(role="assistant", content="ok ", tool_calls=[ToolCall(id="c1", name="bash", arguments='{"a": 1}')])
    echoed = Message(role="assistant", content="ok", tool_calls=[ToolCall(id="c1", name="bash", arguments='{"a":1}')])
    user = Message(role="user", content="x")
    assert extend(chain(tools, [user])[-1], reply) == chain(tools, [user, echoed])[-1]
    # ...but not an edited user message, nor other tools
    assert chain(tools, [user])[-1] != chain(tools, [Message(role="user", content="x ")])[-1]
    assert chain(tools, [user])[-1] != chain([], [user])[-1]


def test_delta_does_not_repeat_the_end_marker_a_cut_answer_sampled(tiny_tokenizer: Any) -> None:
    # A stop string cut the answer, and the chunk of the stream that held it also held the stop id
    # (SGLang streams an answer as one chunk): the record keeps the stop id, so the template's end
    # of the turn is not added again.
    renderer = Renderer(tiny_tokenizer)
    first = [Message(role="user", content="hi")]
    prompt = renderer.fresh(first, [])
    sampled = tiny_tokenizer.encode("Hello there, friend.", add_special_tokens=False) + [tiny_tokenizer.eos_token_id]
    history = [*first, Message(role="assistant", content="Hello there, "), Message(role="user", content="next")]
    delta = renderer.delta(history, [], covered=2, last_sampled_id=sampled[-1])
    stitched = tiny_tokenizer.decode(prompt + sampled + delta)
    assert "friend.<|im_end|>\n<|im_start|>user\nnext<|im_end|>" in stitched


def test_a_template_whose_generation_prompt_is_not_how_it_opens_a_reply_forks(tiny_tokenizer: Any) -> None:
    class PromptsDifferently:
        """Like templates whose generation prompt opens a turn that a stored reply does not have
        (an empty thinking block): the parent's prompt is not a prefix of its history rendered."""

        eos_token_id = tiny_tokenizer.eos_token_id

        def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
            text = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in conversation)
            return text + ("<assistant><think></think>" if kwargs.get("add_generation_prompt") else "")

        def encode(self, text: str, **kwargs: Any) -> list[int]:
            return list(tiny_tokenizer.encode(text, **kwargs))

        def decode(self, token_ids: Any, **kwargs: Any) -> str:
            return str(tiny_tokenizer.decode(token_ids, **kwargs))

    renderer = Renderer(PromptsDifferently())
    history = [
        Message(role="user", content="a"),
        Message(role="assistant", content="b"),
        Message(role="user", content="c"),
    ]
    # The new messages extend the rendered history append-only, so only the check of the reply's
    # own turn can see that the parent's prompt + its reply is not what the template renders.
    assert renderer.render(history, [], generation_prompt=True).startswith(
        renderer.render(history[:2], [], generation_prompt=False)
    )
    with pytest.raises(TemplateFork, match="differently once a reply follows them"):
        renderer.delta(history, [], covered=2, last_sampled_id=None)
