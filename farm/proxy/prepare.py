"""A call's first step: its sampling, and its prompt ids, before anything is recorded.

A chat call that extends an earlier one gets that call's ids (from this process's cache, or
rebuilt from the record) and the template's delta for the new messages; any other starts a
segment from a fresh rendering (``farm.proxy.continuity``). A legacy completion is matched
against the trial's earlier completions (``farm.proxy.completion``). A ``tool_choice`` that
demands a call appends the opening of one. Runs on a worker thread: it tokenizes and reads.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

import numpy as np
from pydantic import ValidationError

from farm.errors import InvalidSpec, NoCallOpening, TemplateFork
from farm.llm.types import SamplingParams
from farm.proxy import completion
from farm.proxy.continuity import Continuity, Renderer
from farm.proxy.conversation import ChatRequest, CompletionRequest, Message
from farm.proxy.events import TrialContext
from farm.trials import statements
from farm.trials.recorder import CallRecorder, Explain
from farm.trials.values import LatestCall, Parent

#: token ids of recent calls kept in memory per process (int32: 4 bytes each).
CACHE_TOKENS = 8_000_000

#: a call, for the id cache: its trial, seq and start (a trial deleted and made again under the
#: same id, or reset, numbers its calls from 0 again: its calls are not the old ones).
CallKey = tuple[str, int, datetime | None]


class IdCache:
    """(trial, seq, start) -> the call's full ids, least recently used out first."""

    def __init__(self, max_tokens: int = CACHE_TOKENS) -> None:
        self.max_tokens = max_tokens
        self._items: OrderedDict[CallKey, np.ndarray] = OrderedDict()
        self._tokens = 0

    def get(self, key: CallKey) -> np.ndarray | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: CallKey, ids: np.ndarray) -> None:
        if key in self._items:
            return
        self._items[key] = ids
        self._tokens += len(ids)
        while self._tokens > self.max_tokens and len(self._items) > 1:
            _, old = self._items.popitem(last=False)
            self._tokens -= len(old)


@dataclass
class Prepared:
    """A call's prompt, before anything is recorded: the backend starts on it while its pending
    row commits."""

    prompt_ids: np.ndarray
    #: the ids the call adds to its parent's (all of them without a parent), forced ones included.
    delta: list[int]
    parent: Parent | None
    hashes: list[bytes]
    continuity: Continuity
    #: the end of ``prompt_ids`` that opens a tool call (a tool_choice that demands one): not sampled.
    forced_ids: list[int] = field(default_factory=list)
    #: the request messages the call adds (chat formats; None for a legacy completion).
    messages: list[dict[str, Any]] | None = None
    #: a legacy completion's (``farm.proxy.completion``): its end is keyed by its ids, not messages.
    completion: bool = False
    #: a legacy completion's prompt text (None for its ids, and for every other format).
    prompt_text: str | None = None
    #: a chat call's messages when it starts a segment for no reason found yet: the record explains
    #: it against the trial's latest call (a read that need not delay the backend).
    unexplained: list[Message] | None = None

    def explain(self) -> Explain | None:
        """What the record runs to say why the call starts a segment (None: nothing to explain)."""
        messages = self.unexplained
        if messages is None:
            return None

        def explain(latest: LatestCall | None) -> dict[str, Any]:
            _explain_new_segment(latest, self.hashes, messages, self.continuity)
            return self.continuity.as_dict()

        return explain


class Preparer:
    """Prepares the calls of one proxy process: reads through ``recorder`` and ``ids``."""

    def __init__(self, *, recorder: CallRecorder, ids: IdCache) -> None:
        self.recorder = recorder
        self.ids = ids

    def chat(
        self,
        renderer: Renderer,
        trial: TrialContext,
        messages: list[Message],
        request: ChatRequest,
        hashes: list[bytes],
        parent: Parent | None,
    ) -> Prepared:
        """The call's prompt: its parent's ids and the template's delta for the new messages when
        the request extends an earlier call, else the whole history rendered (a new segment)."""
        continuity = Continuity()
        prompt: np.ndarray | None = None
        delta: list[int] = []
        if parent is not None:
            parent_ids = self.ids.get((trial.id, parent.seq, parent.started_at))
            if parent_ids is None:
                with self.recorder.reading() as conn:
                    parent_ids = statements.end_ids(conn, trial.id, parent.seq)
            try:
                delta = _extend(renderer, trial, messages, request, parent, parent_ids, continuity)
            except TemplateFork as exc:
                continuity.reason, continuity.diverged_at, continuity.compared_with = (
                    str(exc),
                    parent.covered,
                    parent.seq,
                )
                continuity.history = trial.history
                parent = None
            else:
                prompt = np.concatenate([parent_ids, np.asarray(delta, dtype=np.int32)])
                continuity.extends = parent.seq
                continuity.reused_tokens, continuity.template_tokens = len(parent_ids), len(delta)
        unexplained: list[Message] | None = None
        if prompt is None:
            delta = renderer.fresh(messages, request.tools)
            prompt = np.asarray(delta, dtype=np.int32)
            unexplained = messages if continuity.reason is None else None
        forced = _force_call(renderer, messages, request, continuity)
        if forced:
            prompt = np.concatenate([prompt, np.asarray(forced, dtype=np.int32)])
            delta = [*delta, *forced]
        added = messages[parent.covered :] if parent is not None else messages
        return Prepared(
            prompt_ids=prompt,
            delta=delta,
            parent=parent,
            hashes=hashes,
            continuity=continuity,
            forced_ids=forced,
            messages=[m.for_template() for m in added],
            unexplained=unexplained,
        )

    def completion(self, renderer: Renderer, trial: TrialContext, request: CompletionRequest, wire: str) -> Prepared:
        """A legacy completion's prompt ids (no template: see ``farm.proxy.completion``).

        Raises:
            InvalidSpec: an empty prompt, or ids outside the vocabulary.
        """
        given = request.prompt
        if not given:
            raise InvalidSpec("prompt must not be empty", field="prompt")
        if not isinstance(given, str):
            vocab = len(cast(Any, renderer.tokenizer))  # Hugging Face tokenizers: the vocabulary with added tokens
            bad = next((t for t in given if not 0 <= t < vocab), None)
            if bad is not None:
                raise InvalidSpec(f"prompt holds the id {bad}, outside the vocabulary (0..{vocab - 1})", field="prompt")
        with self.recorder.reading() as conn:
            ends = statements.completion_ends(conn, trial.id, wire)
            match = completion.find(ends, given if isinstance(given, str) else np.asarray(given, dtype=np.int32))
            continuity = Continuity()
            parent: Parent | None = None
            if match.parent is not None:
                end = match.parent
                parent = Parent(seq=end.seq, segment=end.segment, covered=0, last_sampled_id=None)
                if isinstance(given, str):
                    parent_ids = self.ids.get((trial.id, end.seq, end.started_at))
                    if parent_ids is None:
                        parent_ids = statements.end_ids(conn, trial.id, end.seq)
                    delta = renderer.encode(given[match.covered :]) if match.covered < len(given) else []
                    prompt = np.concatenate([parent_ids, np.asarray(delta, dtype=np.int32)])
                else:
                    delta = list(given[match.covered :])
                    prompt = np.asarray(given, dtype=np.int32)
                continuity.extends = end.seq
                continuity.reused_tokens, continuity.template_tokens = end.end_tokens, len(delta)
            else:
                delta = renderer.encode(given) if isinstance(given, str) else list(given)
                prompt = np.asarray(delta, dtype=np.int32)
                continuity.compared_with = match.compared_with
                continuity.reason = match.reason
                if continuity.reason is None:
                    earlier = statements.latest_call(conn, trial.id)
                    continuity.reason = "first call" if earlier is None else "the trial's first completion call"
                    continuity.compared_with = earlier.seq if earlier is not None else None
        return Prepared(
            prompt_ids=prompt,
            delta=delta,
            parent=parent,
            hashes=[completion.ids_hash(prompt)],
            continuity=continuity,
            completion=True,
            prompt_text=given if isinstance(given, str) else None,
        )


def sampling_params(
    trial: TrialContext, request: ChatRequest | CompletionRequest, *, default_max_tokens: int
) -> SamplingParams:
    """What the backend samples with: the request's settings, the trial's over them.

    Raises:
        InvalidSpec: a setting out of range (named as the request spelled it).
    """
    asked = request.sampling
    values: dict[str, Any] = {"max_tokens": asked.max_tokens or default_max_tokens}
    for name in ("temperature", "top_p", "top_k", "seed"):
        if getattr(asked, name) is not None:
            values[name] = getattr(asked, name)
    values.update(trial.sampling)  # the trainer's settings win over the harness's
    try:
        return SamplingParams(**values)
    except ValidationError as exc:
        # Name the parameter (max_tokens past the limit...), not pydantic's whole dump.
        first = exc.errors()[0]
        name = ".".join(str(p) for p in first["loc"]) or "sampling"
        if name == "max_tokens" and "max_tokens" not in trial.sampling:
            name = asked.max_tokens_field
        raise InvalidSpec(f"{name}: {first['msg']}", field=name) from exc
    except ValueError as exc:
        raise InvalidSpec(f"invalid sampling parameters: {exc}", field="sampling") from exc


def check_chat(request: ChatRequest) -> None:
    """Raises InvalidSpec: no messages, or a tool_choice that none of the request's tools can meet."""
    if not request.messages:
        raise InvalidSpec("messages must not be empty", field="messages")
    choice = request.tool_choice
    if choice in ("auto", "none"):
        return
    names = [t.name for t in request.tools]
    if not names:
        # Not the choice's value: each format spells it its own way (Anthropic's any is required here).
        raise InvalidSpec("tool_choice demands a tool call, but the request offers no tools", field="tool_choice")
    if choice != "required" and choice not in names:
        raise InvalidSpec(f"tool_choice names {choice!r}, which is not among the tools {names}", field="tool_choice")


def with_tool_names(messages: list[Message]) -> list[Message]:
    """The messages, each tool message named after the call it answers where its format left it out."""
    names = {call.id: call.name for m in messages for call in m.tool_calls}
    out = []
    for m in messages:
        if m.role == "tool" and m.name is None and m.tool_call_id in names:
            m = m.model_copy(update={"name": names[m.tool_call_id]})
        out.append(m)
    return out


def _extend(
    renderer: Renderer,
    trial: TrialContext,
    messages: list[Message],
    request: ChatRequest,
    parent: Parent,
    parent_ids: np.ndarray,
    continuity: Continuity,
) -> list[int]:
    """The ids a call that extends ``parent`` appends to its ids, as the trial's history policy says.

    Raises:
        TemplateFork: the call cannot extend its parent under that policy (a new segment).
    """
    ids, found = renderer.extension(
        messages,
        request.tools,
        covered=parent.covered,
        last_sampled_id=parent.last_sampled_id,
        history=trial.history,
    )
    if found is not None and found.rewritten:
        continuity.history = "exact"
        counts = found.rewrite(parent_ids.tolist(), parent.sampled_tokens or 0)
        if counts is None:
            continuity.notes.append("the template renders turns before the reply differently too: not counted")
        else:
            continuity.template_dropped_tokens, continuity.template_inserted_tokens = counts
    return ids


def _force_call(renderer: Renderer, messages: list[Message], request: ChatRequest, continuity: Continuity) -> list[int]:
    """The ids that open a tool call, for a tool_choice that demands one (none otherwise)."""
    choice = request.tool_choice
    if choice in ("auto", "none"):
        return []
    name: str | None = choice
    if choice == "required":
        # With one tool, "required" can only mean that tool: its name is forced too.
        name = request.tools[0].name if len(request.tools) == 1 else None
    try:
        forced = renderer.call_opening(messages, request.tools, name=name)
    except NoCallOpening as exc:
        continuity.notes.append(f"tool_choice={choice} not enforced: {exc}")
        return []
    continuity.forced_prefix_tokens = len(forced)
    continuity.forced_prefix_reason = f"tool_choice={choice}"
    return forced


def _explain_new_segment(
    latest: LatestCall | None, hashes: list[bytes], messages: list[Message], continuity: Continuity
) -> None:
    if latest is None:
        continuity.reason = "first call"
        return
    seq, previous = latest.seq, latest.hashes
    continuity.compared_with = seq
    same = 0
    while same < min(len(previous), len(hashes)) and previous[same] == hashes[same]:
        same += 1
    continuity.diverged_at = same
    if same == len(hashes):
        if same == len(previous) - 1:
            continuity.reason = f"repeats call {seq}'s request (a retry, or another sample of it)"
        else:
            continuity.reason = f"the history is shorter than call {seq}'s (compaction or dropped messages)"
    elif same == len(previous) - 1 and messages[same].role == "assistant":
        continuity.reason = f"message {same} is not the reply call {seq} gave (the harness changed it)"
    elif same == len(previous) - 1:
        role = messages[same].role
        continuity.reason = f"the harness dropped call {seq}'s reply (message {same} is a {role} message)"
    else:
        role = messages[same].role
        continuity.reason = (
            f"message {same} ({role}) differs from call {seq}'s history (edited, dropped, or another conversation)"
        )
