"""Append-only token trajectories: what the model saw and sampled, as ids, never re-tokenized.

The first prompt is the chat template's rendering of the first messages. After that, each model
turn appends the sampled ids exactly as the backend returned them (loss mask 1, logprobs kept), and
each batch of new messages (tool results, user turns) appends only the template's text for them,
tokenized on its own (loss mask 0, logprob 0.0). That text also carries what the template writes
after an assistant message and the next generation prompt.

Templates that rewrite earlier turns (Qwen3 drops a past reply's reasoning) are handled as the
history policy says (``farm.llm.rendering``, the proxy's rules, docs/proxy.md#history-exact-or-template):
``exact`` (the default) keeps every sampled id and appends the template's text for the new
messages, one segment; ``template`` makes the next prompt the template's rendering, so a rewrite
starts a new segment. Where the policy cannot extend the history, the builder records a ``Fork``
(keeping the history so far) and starts a new segment from a fresh rendering: history is never
silently rewritten.

The assistant message recorded for a model turn is what the caller read from it (reasoning split
out, tool calls structured: ``farm.agent.turns``), or its text as content.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from farm.errors import TemplateFork
from farm.llm.rendering import ChatRenderer, ChatTokenizer
from farm.llm.tokenizer import end_of_turn_ids
from farm.llm.types import FinishReason, GenerateResult
from farm.schemas.trials import DEFAULT_HISTORY, TrialHistory

__all__ = ["ChatTokenizer", "Fork", "Span", "TokenSegment", "TokenTrajectory", "TrajectoryBuilder"]

Message = dict[str, Any]
SpanKind = Literal["prompt", "model", "env"]


class Span(BaseModel):
    """Tokens ``[start, end)`` of one turn: the rendered prompt, a model turn, or new messages."""

    kind: SpanKind
    start: int
    end: int


class TokenSegment(BaseModel):
    """Ids in which every model turn extended the one before: what the model saw and sampled."""

    token_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    loss_mask: list[int] = Field(default_factory=list)
    turns: list[Span] = Field(default_factory=list)
    #: ``(version, start, end)`` over the segment's model tokens (``farm.schemas.VersionSpan``).
    weight_versions: list[tuple[int, int, int]] = Field(default_factory=list)

    def append(self, kind: SpanKind, ids: Sequence[int], logprobs: Sequence[float] | None, mask: int) -> None:
        start = len(self.token_ids)
        self.token_ids.extend(ids)
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        self.loss_mask.extend([mask] * len(ids))
        self.turns.append(Span(kind=kind, start=start, end=len(self.token_ids)))

    def has_model_turn(self) -> bool:
        return any(span.kind == "model" for span in self.turns)

    def through_last_model_turn(self) -> int:
        """Drop what follows the last model turn (observations and a generation prompt the model
        never saw: an episode that ran out of turns, time or context); returns how many tokens
        went. A segment without a model turn is left whole."""
        last = next((span for span in reversed(self.turns) if span.kind == "model"), None)
        if last is None or last.end == len(self.token_ids):
            return 0
        dropped = len(self.token_ids) - last.end
        del self.token_ids[last.end :], self.logprobs[last.end :], self.loss_mask[last.end :]
        self.turns = [span for span in self.turns if span.start < last.end]
        return dropped


class Fork(BaseModel):
    """The template could not extend the history; ``before`` is the history up to that point."""

    at_message: int
    reason: str
    before: TokenSegment


class TokenTrajectory(TokenSegment):
    """The current segment's ids, logprobs, mask and turns; ``forks`` holds earlier segments, oldest first."""

    forks: list[Fork] = Field(default_factory=list)

    def through_last_model_turn(self) -> int:
        """As ``TokenSegment.through_last_model_turn``; a current segment the model never saw (a fresh
        rendering after a fork, no model turn yet) goes whole, and the segment before it is cut."""
        dropped = 0
        while self.forks and not self.has_model_turn():
            dropped += len(self.token_ids)
            before = self.forks.pop().before
            self.token_ids, self.logprobs, self.loss_mask = before.token_ids, before.logprobs, before.loss_mask
            self.turns, self.weight_versions = before.turns, before.weight_versions
        return dropped + super().through_last_model_turn()

    def segments(self) -> tuple[TokenSegment, list[TokenSegment]]:
        """(the main segment: the one holding the last model turn, the others in the order they were
        made); with no model turn at all, the current segment is the main one."""
        everything = [*(fork.before for fork in self.forks), self.as_segment()]
        main = next((i for i in reversed(range(len(everything))) if everything[i].has_model_turn()), None)
        main = len(everything) - 1 if main is None else main
        return everything[main], everything[:main] + everything[main + 1 :]

    def as_segment(self) -> TokenSegment:
        return TokenSegment(
            token_ids=self.token_ids,
            logprobs=self.logprobs,
            loss_mask=self.loss_mask,
            turns=self.turns,
            weight_versions=self.weight_versions,
        )


class TrajectoryBuilder:
    """Builds a ``TokenTrajectory`` turn by turn. ``prompt_ids`` is what to send to the backend next.

    ``tools`` are in the template's shape (``{"type": "function", "function": {...}}``): a family's
    template writes them, and its own instructions for calling them, into the prompt.
    ``eos_token_ids`` end a turn and are not its text; by default the tokenizer's eos and the ids its
    folder's ``generation_config.json`` ends a turn with (``farm.llm.tokenizer.end_of_turn_ids``).
    """

    def __init__(
        self,
        *,
        tokenizer: ChatTokenizer,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        eos_token_ids: Sequence[int] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        history: TrialHistory = DEFAULT_HISTORY,
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = tools
        self.history = history
        self.renderer = ChatRenderer(tokenizer, template_kwargs=chat_template_kwargs)
        # By default the ids the model ends a turn with: the tokenizer's eos and its generation
        # config's (Phi-3's <|end|>), as the proxy reads them; none of them is reply text.
        default_eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        default_eos |= end_of_turn_ids(tokenizer)
        self.eos_token_ids = frozenset(eos_token_ids if eos_token_ids is not None else default_eos)
        self.messages: list[Message] = list(messages)
        self._last_sampled: list[int] | None = None
        self._traj = TokenTrajectory()
        self._traj.append("prompt", self.renderer.fresh(self.messages, self.tools), None, 0)

    @property
    def prompt_ids(self) -> list[int]:
        return list(self._traj.token_ids)

    def text_of(self, result: GenerateResult) -> str:
        """A model turn's text: its sampled ids decoded, less the end-of-turn id it stopped on (the
        end of the turn is the template's to write, not message content)."""
        ids = result.token_ids
        if result.finish_reason is FinishReason.STOP and ids and ids[-1] in self.eos_token_ids:
            ids = ids[:-1]
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def add_completion(self, result: GenerateResult, message: Message | None = None) -> str:
        """Append a model turn's sampled ids and logprobs unchanged; returns its text (``text_of``).

        ``message`` is the assistant message to record for it, as read by the caller (reasoning,
        content, tool calls); by default the text as its content.

        Raises:
            ValueError: two model turns in a row (add the new messages in between).
        """
        if self._last_sampled is not None:
            raise ValueError("add_messages() must come between two model turns")
        start = len(self._traj.token_ids)
        self._traj.append("model", result.token_ids, result.logprobs, 1)
        for version, begin, end in result.weight_versions:
            self._traj.weight_versions.append((version, start + begin, start + end))
        text = self.text_of(result)
        self.messages.append(message if message is not None else {"role": "assistant", "content": text})
        self._last_sampled = list(result.token_ids)
        return text

    def add_messages(self, messages: list[Message]) -> None:
        """Append new messages (tool results, user turns) and the next generation prompt, as the
        history policy says; where it cannot extend the history, a new segment starts (a ``Fork``)."""
        if self._last_sampled is None:
            raise ValueError("add_messages() needs a model turn before it (the first messages go to the constructor)")
        sampled, covered = self._last_sampled, len(self.messages)
        self._last_sampled = None
        self.messages = self.messages + messages
        try:
            ids, _ = self.renderer.extension(
                self.messages,
                self.tools,
                covered=covered,
                last_sampled_id=sampled[-1] if sampled else None,
                history=self.history,
            )
        except TemplateFork as exc:
            self._fork(str(exc))
            return
        self._traj.append("env", ids, None, 0)

    def _fork(self, reason: str) -> None:
        old = self._traj
        self._traj = TokenTrajectory(
            forks=[*old.forks, Fork(at_message=len(self.messages), reason=reason, before=old.as_segment())]
        )
        self._traj.append("prompt", self.renderer.fresh(self.messages, self.tools), None, 0)

    def build(self) -> TokenTrajectory:
        return self._traj.model_copy(deep=True)
