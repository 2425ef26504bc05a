"""One conversation model for every wire format: what the proxy renders, hashes and records.

OpenAI Chat Completions, OpenAI Responses and Anthropic Messages each parse their request into a
``ChatRequest`` and turn the proxy's ``Reply`` back into their own shapes; everything between
(template, continuity, generation, record) sees only these types.

Two messages are the *same* for continuity when their canonical forms are equal
(``canonical``): exact text for system, user and tool messages (a harness that edits them has
changed the history), while an assistant message is compared as the harness may echo the reply it
was given: surrounding whitespace ignored and tool-call arguments compared as JSON values.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, Field

Role = Literal["system", "user", "assistant", "tool"]
ToolChoice = Literal["auto", "none", "required"] | str
HASH_BYTES = 16


class ToolCall(BaseModel):
    """A call the model wrote. ``arguments`` is the JSON text of the arguments object."""

    id: str
    name: str
    arguments: str = "{}"

    def arguments_value(self) -> Any:
        try:
            return json.loads(self.arguments)
        except ValueError:
            return self.arguments


class Message(BaseModel):
    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    #: on a tool message: the call it answers.
    tool_call_id: str | None = None
    #: on a tool message: the tool's name, where the format says it (filled from the call otherwise).
    name: str | None = None

    def canonical(self) -> dict[str, Any]:
        if self.role == "assistant":
            calls = [[c.id, c.name, _json_key(c.arguments_value())] for c in self.tool_calls]
            return {"role": "assistant", "content": self.content.strip(), "tool_calls": calls}
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.role == "tool":
            out["tool_call_id"] = self.tool_call_id
        return out

    def for_template(self) -> dict[str, Any]:
        """The message as Hugging Face chat templates read it (OpenAI shape, arguments as objects)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_value()}}
                for c in self.tool_calls
            ]
        if self.role == "tool":
            out["tool_call_id"] = self.tool_call_id
            if self.name is not None:
                out["name"] = self.name
        return out


class Tool(BaseModel):
    """A function the harness offers, in the OpenAI function shape."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    def for_template(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description is not None:
            function["description"] = self.description
        return {"type": "function", "function": function}


class Sampling(BaseModel):
    """What the harness asked for; the trial's own settings override these (``farm.proxy.prepare.sampling_params``)."""

    max_tokens: int | None = None
    #: what the request called ``max_tokens`` (max_completion_tokens, max_output_tokens), for its errors.
    max_tokens_field: str = "max_tokens"
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    #: a signed 64-bit integer, as backends hold a seed (torch's generator refuses a bigger one).
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stop: list[str] = Field(default_factory=list)


class ChatRequest(BaseModel):
    """A model call in the proxy's terms, whichever format it came in."""

    model: str | None = None
    messages: list[Message]
    tools: list[Tool] = Field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    sampling: Sampling = Field(default_factory=Sampling)
    stream: bool = False
    #: the format asked for per-token logprobs in its answer (they are recorded either way).
    logprobs: bool = False
    #: with ``logprobs``: how many of the most likely tokens to list at each position (not recorded).
    top_logprobs: int = 0
    #: False: the answer ends with its first tool call (OpenAI's ``parallel_tool_calls``, Anthropic's
    #: ``disable_parallel_tool_use``); the generation is stopped there.
    parallel_tool_calls: bool = True
    #: the chat template's extra variables for this request (``farm.proxy.template_kwargs``: the
    #: formats' thinking switches); part of the hash chain.
    template_kwargs: dict[str, Any] = Field(default_factory=dict)


class CompletionRequest(BaseModel):
    """A legacy completion (``/v1/completions``): a prompt continued as it is, no chat template.
    ``prompt`` is text (tokenized as it is, no special tokens added) or the ids themselves."""

    model: str | None = None
    prompt: str | list[int]
    sampling: Sampling = Field(default_factory=Sampling)
    stream: bool = False
    #: the answer carries per-token logprobs (they are recorded either way).
    logprobs: bool = False
    #: with ``logprobs``: how many of the most likely tokens to list at each position (not recorded).
    top_logprobs: int = 0
    #: the answer carries the prompt's ids (vLLM's ``return_token_ids``).
    prompt_ids: bool = False


class Reply(BaseModel):
    """What the model wrote, as the harness receives it."""

    content: str
    tool_calls: list[ToolCall] = Field(default_factory=list)
    #: stop (end of turn or a stop string), length (max_tokens or context), tool_calls.
    finish_reason: Literal["stop", "length", "tool_calls"]
    #: the stop string that ended the turn, if one did.
    stop_string: str | None = None
    #: the generation was stopped after its first tool call (``ChatRequest.parallel_tool_calls``):
    #: the model did not end its turn itself.
    cut_after_call: bool = False

    def message(self) -> Message:
        return Message(role="assistant", content=self.content, tool_calls=self.tool_calls)


def _json_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _digest(previous: bytes, item: Any) -> bytes:
    return hashlib.blake2b(previous + _json_key(item).encode(), digest_size=HASH_BYTES).digest()


def root_hash(tools: list[Tool], template_kwargs: dict[str, Any] | None = None) -> bytes:
    """The chain's start: the tools are part of the history (a template renders them into it), and so
    are the template's kwargs (a conversation rendered with others is another prompt; none: the
    hashes of before they existed)."""
    root = _digest(b"farm.proxy/1", [t.for_template() for t in tools])
    return _digest(root, {"template_kwargs": template_kwargs}) if template_kwargs else root


def chain(tools: list[Tool], messages: list[Message], template_kwargs: dict[str, Any] | None = None) -> list[bytes]:
    """``out[i]`` is the hash of the tools, the template kwargs and ``messages[: i + 1]``."""
    hashes, previous = [], root_hash(tools, template_kwargs)
    for message in messages:
        previous = _digest(previous, message.canonical())
        hashes.append(previous)
    return hashes


def extend(previous: bytes, message: Message) -> bytes:
    return _digest(previous, message.canonical())
