"""Prompt ids for a call, drift-free: the template renders only what is new.

A call that *extends* an earlier one (its messages start with that call's messages plus the reply
the proxy gave) gets as its prompt that call's prompt ids + the ids it sampled, reused exactly,
+ the template's delta: what the template writes after an assistant message (the end-of-turn
marker, minus the one the model sampled itself) and the new messages with the next generation
prompt. The reply is never re-rendered or re-tokenized, so the prompt is what the model saw.

Where that cannot hold, the call starts a new *segment* from a fresh rendering, and its
certificate entry says why. History is never silently rewritten.

Some templates rewrite history: Qwen3's renders a reply that is the last message with an empty
``<think>\n\n</think>\n\n`` block and drops it (and any reasoning) once more follows. A trial's
``history`` policy says what then happens (``farm.schemas.trials.TrialHistory``):

- ``exact`` (``Renderer.exact_delta``): the parent's ids are kept as the model sampled them, and only
  the template's rendering of the new messages is appended: one segment. The entry counts the tokens
  the template would have dropped from the reply and written instead (``template_dropped_tokens``,
  ``template_inserted_tokens``);
- ``template`` (``Renderer.delta``): the prompt is what the template renders; where that is not the
  parent's ids + more, the call starts a segment, and the entry says so.

Each call's certificate entry (``Continuity.as_dict``) says: whether it extended its parent,
which call that was, how many tokens were reused and how many the template inserted, and for a
new segment the reason and the message index where the history diverged.

A ``tool_choice`` that demands a call (``required``, or a named tool) is enforced by prefill: the
prompt ends with the opening of a call block as the template writes one (``call_opening``). Those
ids are the prompt's, not the model's: the entry says how many (``forced_prefix_tokens``) and why.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from farm.errors import NoCallOpening
from farm.llm.counting import TokenBound
from farm.llm.rendering import ChatRenderer, ChatTokenizer, ExactDelta
from farm.llm.tokenizer import end_of_turn_ids
from farm.proxy.conversation import Message, Tool, ToolCall
from farm.proxy.toolparse.hermes import OPEN_TAG

#: a tool name and an argument key for a probe call: where the template writes the name and the arguments.
PROBE_NAME = "farm_proxy_probe_3f9c"
PROBE_KEY = "farm_proxy_probe_arg_3f9c"


@dataclass
class Continuity:
    """How a call relates to the calls before it."""

    extends: int | None = None
    reused_tokens: int = 0
    template_tokens: int = 0
    #: a new segment: why, at which message of the request, and relative to which call.
    reason: str | None = None
    diverged_at: int | None = None
    compared_with: int | None = None
    notes: list[str] = field(default_factory=list)
    #: ids appended to the prompt to enforce a tool choice (not sampled), and why.
    forced_prefix_tokens: int = 0
    forced_prefix_reason: str | None = None
    #: the trial's history policy, where the template rewrote the history (None: it did not).
    history: str | None = None
    #: under ``exact``: ids of the parent's reply the template would not show, and ids it writes instead.
    template_dropped_tokens: int = 0
    template_inserted_tokens: int = 0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "extends": self.extends,
            "reused_tokens": self.reused_tokens,
            "template_tokens": self.template_tokens,
        }
        if self.reason is not None:
            out.update(reason=self.reason, diverged_at=self.diverged_at, compared_with=self.compared_with)
        if self.notes:
            out["notes"] = list(self.notes)
        if self.forced_prefix_tokens:
            out.update(forced_prefix_tokens=self.forced_prefix_tokens, forced_prefix_reason=self.forced_prefix_reason)
        if self.history is not None:
            out["history"] = self.history
            if self.reason is None:
                out.update(
                    template_dropped_tokens=self.template_dropped_tokens,
                    template_inserted_tokens=self.template_inserted_tokens,
                )
        return out


class Renderer:
    """Renders the proxy's requests with the policy's chat template into token ids: its messages
    and tools in the template's shape, through the shared ``farm.llm.rendering.ChatRenderer``."""

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        *,
        template_kwargs: dict[str, Any] | None = None,
        bound: TokenBound | None = None,
    ) -> None:
        self.chat = ChatRenderer(tokenizer, template_kwargs=template_kwargs, bound=bound)
        self.bound = bound
        self.tokenizer = tokenizer
        self.template_kwargs = self.chat.template_kwargs
        self.special_ids = self.chat.special_ids
        #: ids the model ends a turn with (``farm.llm.tokenizer.end_of_turn_ids``): never answer text.
        self.end_ids = end_of_turn_ids(tokenizer)

    def render(self, messages: Sequence[Message], tools: Sequence[Tool], *, generation_prompt: bool) -> str:
        return self.chat.render(_messages(messages), _tools(tools), generation_prompt=generation_prompt)

    def encode(self, text: str) -> list[int]:
        return self.chat.encode(text)

    def fresh(self, messages: Sequence[Message], tools: Sequence[Tool]) -> list[int]:
        """The prompt of a call that starts a segment."""
        return self.chat.fresh(_messages(messages), _tools(tools))

    def delta(
        self, messages: Sequence[Message], tools: Sequence[Tool], *, covered: int, last_sampled_id: int | None
    ) -> list[int]:
        """``ChatRenderer.delta`` for the proxy's messages.

        Raises:
            TemplateFork: the template renders the earlier turns differently once more is added.
        """
        return self.chat.delta(_messages(messages), _tools(tools), covered=covered, last_sampled_id=last_sampled_id)

    def exact_delta(
        self, messages: Sequence[Message], tools: Sequence[Tool], *, covered: int, last_sampled_id: int | None
    ) -> ExactDelta:
        """``ChatRenderer.exact_delta`` for the proxy's messages.

        Raises:
            TemplateFork: the template writes the new messages differently after this reply.
        """
        return self.chat.exact_delta(
            _messages(messages), _tools(tools), covered=covered, last_sampled_id=last_sampled_id
        )

    def extension(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool],
        *,
        covered: int,
        last_sampled_id: int | None,
        history: str,
    ) -> tuple[list[int], ExactDelta | None]:
        """``ChatRenderer.extension`` for the proxy's messages.

        Raises:
            TemplateFork: the call cannot extend its parent under ``history`` (a new segment).
        """
        return self.chat.extension(
            _messages(messages), _tools(tools), covered=covered, last_sampled_id=last_sampled_id, history=history
        )

    def call_opening(self, messages: Sequence[Message], tools: Sequence[Tool], *, name: str | None) -> list[int]:
        """Ids that open an assistant tool call after the generation prompt for ``messages``.

        Without a name: through the text before the function's name (``<tool_call>\\n{"name": "`` in
        hermes). With a name: through the name and the text before the arguments object. The text is
        the template's own rendering of such a call, and only whole tokens of that rendering are
        taken: where a token spans the cut it is left to the model, so the model continues at a token
        boundary the tokenizer itself would make.

        Raises:
            NoCallOpening: the template renders the history differently once a call follows, or does
                not open a call with ``<tool_call>`` (the format ``farm.proxy.toolparse`` parses).
        """
        prompted = self.render(messages, tools, generation_prompt=True)
        call = ToolCall(id="call_probe", name=name or PROBE_NAME, arguments=json.dumps({PROBE_KEY: 0}))
        probe = self.render([*messages, Message(role="assistant", tool_calls=[call])], tools, generation_prompt=False)
        if not probe.startswith(prompted):
            raise NoCallOpening("the template renders the earlier turns differently once a tool call follows them")
        written = probe[len(prompted) :]
        if name is None:
            end = written.find(PROBE_NAME)
        else:
            key_at = written.find(json.dumps(PROBE_KEY))
            end = written.rfind("{", 0, key_at) if key_at >= 0 else -1
        if end < 0 or OPEN_TAG not in written[:end]:
            raise NoCallOpening(f"the template does not open a tool call with {OPEN_TAG}")
        ids = self.encode(written)
        forced: list[int] = []
        for k in range(1, len(ids) + 1):
            text = str(self.tokenizer.decode(ids[:k], skip_special_tokens=False))
            if len(text) > end or not written.startswith(text):
                break
            forced = ids[:k]
        return forced


def _messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    return [m.for_template() for m in messages]


def _tools(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    return [t.for_template() for t in tools]
