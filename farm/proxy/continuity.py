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

from farm.errors import NoCallOpening, TemplateFork
from farm.llm.tokenizer import end_of_turn_ids
from farm.llm.trajectory import ChatTokenizer
from farm.proxy.conversation import Message, Tool, ToolCall
from farm.proxy.toolparse.hermes import OPEN_TAG

#: content for an assistant message whose rendering shows what the template writes after one.
SENTINEL = "FARM-PROXY-SENTINEL-3f9c"
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


@dataclass(frozen=True)
class ExactDelta:
    """What ``Renderer.exact_delta`` appends to the parent's ids, and how the template would have
    written the parent's reply instead (None: the template renders it where the model's ids are)."""

    ids: list[int]
    #: the template's ids for the reply as it renders it now, before the new messages (None: unknown,
    #: the template also renders turns before the reply differently).
    reply_as_rendered: list[int] | None
    #: False when the template renders the history as the parent's prompt and reply, the new part after.
    rewritten: bool
    #: the parent's last sampled id ended its turn where the template writes that end (not appended again).
    turn_ended: bool

    def rewrite(self, end_ids: Sequence[int], sampled: int) -> tuple[int, int] | None:
        """(ids of the reply the template would drop, ids it would write instead), from the parent's
        ``end_ids`` of which the last ``sampled`` were sampled; None when not known.

        The two are aligned from the end: what the template writes before the reply's common tail
        with the model's ids is what it changed (Qwen3: the ``<think>`` block). Forced ids (a
        ``tool_choice`` prefill) precede the sampled ones in ``end_ids`` and so align as they are.
        """
        rendered = self.reply_as_rendered
        if rendered is None:
            return None
        ids = list(end_ids[:-1] if self.turn_ended and end_ids else end_ids)
        reply = sampled - (1 if self.turn_ended and sampled else 0)
        common = 0
        while common < min(len(rendered), len(ids)) and rendered[-1 - common] == ids[-1 - common]:
            common += 1
        return max(0, reply - common), len(rendered) - common


class Renderer:
    """Renders requests with the policy's chat template into token ids."""

    def __init__(self, tokenizer: ChatTokenizer, *, template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.template_kwargs = template_kwargs or {}
        special = set(getattr(tokenizer, "all_special_ids", None) or [])
        eos = getattr(tokenizer, "eos_token_id", None)
        #: ids a template writes as markers (the end of a turn...), never as text.
        self.special_ids = frozenset(special | ({eos} if eos is not None else set()))
        #: ids the model ends a turn with (``farm.llm.tokenizer.end_of_turn_ids``): never answer text.
        self.end_ids = end_of_turn_ids(tokenizer)

    def render(self, messages: Sequence[Message], tools: Sequence[Tool], *, generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(
            [m.for_template() for m in messages],
            tools=[t.for_template() for t in tools] or None,
            tokenize=False,
            add_generation_prompt=generation_prompt,
            **self.template_kwargs,
        )
        return str(text)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def fresh(self, messages: Sequence[Message], tools: Sequence[Tool]) -> list[int]:
        """The prompt of a call that starts a segment."""
        return self.encode(self.render(messages, tools, generation_prompt=True))

    def delta(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool],
        *,
        covered: int,
        last_sampled_id: int | None,
    ) -> list[int]:
        """Ids to append to the parent's ids (its prompt + sampled ids) for ``messages``.

        ``messages[:covered]`` is the parent's request plus its reply (``messages[covered - 1]``).
        When the last id the parent sampled is a special token the template writes right after a
        reply (the end of the turn), it is not added twice. That holds however the answer ended:
        by that stop id, or cut by a stop string or after its first tool call in the same chunk of
        the stream that carried the stop id (the record keeps every id sampled).

        Raises:
            TemplateFork: the template renders the earlier turns differently once more is added.
        """
        earlier = list(messages[: covered - 1])
        prompted = self.render(earlier, tools, generation_prompt=True)
        probe = self.render([*earlier, Message(role="assistant", content=SENTINEL)], tools, generation_prompt=False)
        at = probe.find(SENTINEL)
        if not probe.startswith(prompted) or at < 0:
            raise TemplateFork("the template renders the earlier turns differently once a reply follows them")
        after_reply = probe[at + len(SENTINEL) :]
        if last_sampled_id in self.special_ids:
            marker = self.tokenizer.decode([last_sampled_id], skip_special_tokens=False)
            if marker and after_reply.startswith(marker):
                after_reply = after_reply[len(marker) :]
        with_reply = self.render(messages[:covered], tools, generation_prompt=False)
        full = self.render(messages, tools, generation_prompt=True)
        if not full.startswith(with_reply):
            raise TemplateFork("the template renders the earlier turns differently once the new messages follow")
        return self.encode(after_reply + full[len(with_reply) :])

    def exact_delta(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool],
        *,
        covered: int,
        last_sampled_id: int | None,
    ) -> ExactDelta:
        """Ids to append to the parent's ids for ``messages``, whatever the template does to earlier turns.

        The new messages' text is the template's, in their place: the whole history rendered with a
        sentinel for the reply, from just after the sentinel (the end of the reply's turn, the new
        messages, the generation prompt). It must also end the history as rendered with the reply
        itself, so a template that writes the new messages differently after this reply (after a tool
        call, say) is caught rather than given text it would not write there.

        Raises:
            TemplateFork: the template writes the new messages differently after this reply, or its
                text for them cannot be told apart.
        """
        earlier, added = list(messages[: covered - 1]), list(messages[covered:])
        probe = self.render(
            [*earlier, Message(role="assistant", content=SENTINEL), *added], tools, generation_prompt=True
        )
        at = probe.find(SENTINEL)
        full = self.render(messages, tools, generation_prompt=True)
        tail = probe[at + len(SENTINEL) :] if at >= 0 else ""
        if at < 0 or not full.endswith(tail):
            raise TemplateFork("the template renders the new messages differently after this reply")
        written, turn_ended = tail, False
        if last_sampled_id in self.special_ids:
            marker = self.tokenizer.decode([last_sampled_id], skip_special_tokens=False)
            if marker and written.startswith(marker):
                written, turn_ended = written[len(marker) :], True
        prompted = self.render(earlier, tools, generation_prompt=True)
        reply = full[len(prompted) : len(full) - len(tail)] if full.startswith(prompted) else None
        with_reply = self.render(messages[:covered], tools, generation_prompt=False)
        rewritten = not (full.startswith(with_reply) and probe.startswith(prompted))
        return ExactDelta(
            ids=self.encode(written),
            reply_as_rendered=self.encode(reply) if reply is not None else None,
            rewritten=rewritten,
            turn_ended=turn_ended,
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
