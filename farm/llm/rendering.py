"""A chat template as a renderer of token ids, and how a conversation's next prompt extends the last.

Shared by the proxy (``farm.proxy.continuity``, which renders its own message types through this) and
the built-in agent loop's ``farm.llm.trajectory``: both follow a history policy
(``farm.schemas.trials.TrialHistory``) to turn the ids of a model turn plus the new messages after
it (tool results, a user turn) into the next prompt, without re-tokenizing what the model sampled.

Messages and tools are in the shape Hugging Face chat templates read (OpenAI's, tool-call arguments
as objects). Two deltas:

- ``delta``: the template's own continuation, where the template renders the history so far
  unchanged once more follows (both policies use it then);
- ``exact_delta``: under ``exact``, for templates that rewrite earlier turns (Qwen3 drops a past
  reply's reasoning): the template's text for the new messages only, found by rendering the history
  with a sentinel for the reply and taking what follows it.

``extension`` applies a policy: the template's delta where it exists, else the exact one or a
``TemplateFork`` (a new segment), as docs/proxy.md#history-exact-or-template describes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from farm.errors import TemplateFork, TemplateRefused
from farm.llm.counting import TokenBound

#: content for an assistant message whose rendering shows what the template writes after one.
SENTINEL = "FARM-PROXY-SENTINEL-3f9c"
#: a tool name whose presence in a rendering shows that the template writes the tools it is given.
PROBE_TOOL = "farm_probe_tool_3f9c"

Message = Mapping[str, Any]
Tools = Sequence[Mapping[str, Any]]


class ChatTokenizer(Protocol):
    """What rendering needs from a Hugging Face tokenizer."""

    eos_token_id: int | None

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...
    def encode(self, text: str, **kwargs: Any) -> list[int]: ...
    def decode(self, token_ids: Any, **kwargs: Any) -> str: ...


@dataclass(frozen=True)
class ExactDelta:
    """What ``ChatRenderer.exact_delta`` appends to the parent's ids, and how the template would have
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


class ChatRenderer:
    """Renders template-shaped messages with the policy's chat template into text and token ids."""

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        *,
        template_kwargs: dict[str, Any] | None = None,
        bound: TokenBound | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.template_kwargs = template_kwargs or {}
        #: what one text may hold before it is tokenized (None: any length; the proxy's harnesses are bounded).
        self.bound = bound
        special = set(getattr(tokenizer, "all_special_ids", None) or [])
        eos = getattr(tokenizer, "eos_token_id", None)
        #: ids a template writes as markers (the end of a turn...), never as text.
        self.special_ids = frozenset(special | ({eos} if eos is not None else set()))

    def render(self, messages: Sequence[Message], tools: Tools | None, *, generation_prompt: bool) -> str:
        """The conversation as the template writes it.

        Raises:
            TemplateRefused: the template raised (the conversation is not one it renders).
        """
        from jinja2 import TemplateError  # what chat templates need anyway; transformers does not require it

        try:
            text = self.tokenizer.apply_chat_template(
                list(messages),
                tools=list(tools) if tools else None,
                tokenize=False,
                add_generation_prompt=generation_prompt,
                **self.template_kwargs,
            )
        except TemplateError as exc:
            raise TemplateRefused(f"the chat template refuses the conversation: {exc}") from exc
        return str(text)

    def encode(self, text: str) -> list[int]:
        """``text``'s ids, tokenized whole.

        Raises:
            ContextLengthExceeded: it holds more tokens than ``bound`` allows (counted, not tokenized whole).
        """
        if self.bound is not None:
            self.bound.check(self.tokenizer, text)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if self.bound is not None:
            self.bound.check_ids(len(ids), len(text))
        return ids

    def fresh(self, messages: Sequence[Message], tools: Tools | None) -> list[int]:
        """The prompt of a conversation that starts a segment."""
        return self.encode(self.render(messages, tools, generation_prompt=True))

    def renders_tools(self) -> bool:
        """Whether the template writes the tools it is given into the prompt (with its own
        instructions for calling them); a template that ignores ``tools`` needs them described."""
        probe = {"type": "function", "function": {"name": PROBE_TOOL, "description": "", "parameters": {}}}
        return PROBE_TOOL in self.render([{"role": "user", "content": "hi"}], [probe], generation_prompt=True)

    def _end_marker(self, last_sampled_id: int | None, text: str) -> str:
        """The end-of-turn marker the model sampled itself where the template writes it next ("" if not)."""
        if last_sampled_id not in self.special_ids:
            return ""
        marker = str(self.tokenizer.decode([last_sampled_id], skip_special_tokens=False))
        return marker if marker and text.startswith(marker) else ""

    def delta(
        self, messages: Sequence[Message], tools: Tools | None, *, covered: int, last_sampled_id: int | None
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
        probe = self.render([*earlier, {"role": "assistant", "content": SENTINEL}], tools, generation_prompt=False)
        at = probe.find(SENTINEL)
        if not probe.startswith(prompted) or at < 0:
            raise TemplateFork("the template renders the earlier turns differently once a reply follows them")
        after_reply = probe[at + len(SENTINEL) :]
        after_reply = after_reply[len(self._end_marker(last_sampled_id, after_reply)) :]
        with_reply = self.render(messages[:covered], tools, generation_prompt=False)
        full = self.render(messages, tools, generation_prompt=True)
        if not full.startswith(with_reply):
            raise TemplateFork("the template renders the earlier turns differently once the new messages follow")
        return self.encode(after_reply + full[len(with_reply) :])

    def exact_delta(
        self, messages: Sequence[Message], tools: Tools | None, *, covered: int, last_sampled_id: int | None
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
            [*earlier, {"role": "assistant", "content": SENTINEL}, *added], tools, generation_prompt=True
        )
        at = probe.find(SENTINEL)
        full = self.render(messages, tools, generation_prompt=True)
        tail = probe[at + len(SENTINEL) :] if at >= 0 else ""
        if at < 0 or not full.endswith(tail):
            raise TemplateFork("the template renders the new messages differently after this reply")
        marker = self._end_marker(last_sampled_id, tail)
        prompted = self.render(earlier, tools, generation_prompt=True)
        reply = full[len(prompted) : len(full) - len(tail)] if full.startswith(prompted) else None
        with_reply = self.render(messages[:covered], tools, generation_prompt=False)
        rewritten = not (full.startswith(with_reply) and probe.startswith(prompted))
        return ExactDelta(
            ids=self.encode(tail[len(marker) :]),
            reply_as_rendered=self.encode(reply) if reply is not None else None,
            rewritten=rewritten,
            turn_ended=bool(marker),
        )

    def extension(
        self,
        messages: Sequence[Message],
        tools: Tools | None,
        *,
        covered: int,
        last_sampled_id: int | None,
        history: str,
    ) -> tuple[list[int], ExactDelta | None]:
        """The ids that extend the parent's for ``messages`` under ``history``, and, where the
        template rewrote the history and ``exact`` kept the model's ids, what it found (else None).

        Where the template rewrites nothing, both policies are its delta (the same ids either way).

        Raises:
            TemplateFork: the conversation cannot extend its parent under that policy (a new segment).
        """
        try:
            return self.delta(messages, tools, covered=covered, last_sampled_id=last_sampled_id), None
        except TemplateFork:
            if history != "exact":
                raise
        found = self.exact_delta(messages, tools, covered=covered, last_sampled_id=last_sampled_id)
        return found.ids, found
