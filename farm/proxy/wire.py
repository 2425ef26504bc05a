"""The seam between the proxy's one core and the wire formats it speaks.

A ``WireFormat`` reads its request body into one ``WireRequest``, and writes the core's events
back as its whole answer, its stream, or its error body. One implementation per format, each in
its module (``openai_chat``, ``openai_responses``, ``anthropic_messages``, ``openai_completions``);
one generic route serves them all (``farm.proxy.routes``), so neither the route nor the core
branches on which format a call came in.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from farm.errors import ProxyError
from farm.proxy.conversation import ChatRequest, CompletionRequest
from farm.proxy.events import Event, Finished


@dataclass(frozen=True)
class WireRequest:
    """A request as every format parses it: the call in the core's terms, and what the format's
    answer needs of the request besides."""

    call: ChatRequest | CompletionRequest
    #: a stream's usage chunk was asked for (OpenAI's ``stream_options.include_usage``).
    include_usage: bool = False
    #: the answer starts with the prompt's text (a legacy completion's ``echo``).
    echo_prompt: bool = False
    #: what the answer repeats of the request as it was sent (a Responses answer's tools, tool
    #: choice and parallel calls).
    echo: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Answer:
    """What a format's answer is made of besides the call's events."""

    request: WireRequest
    #: the model the answer names: the request's, or the trial's.
    model: str
    #: the answer's id, in the format's own shape (``WireFormat.new_id``).
    id: str
    #: the prompt's text, for an answer that starts with it (``WireRequest.echo_prompt``).
    prompt_text: str | None = None


class WireFormat(Protocol):
    """One wire format: how its requests are read and its answers written."""

    #: the format's name in the record (``trial_calls.wire``).
    wire: str
    #: how the ids of the tool calls the answer holds start (``call_``, Anthropic's ``toolu_``).
    call_id_prefix: str

    def parse(self, raw: Any) -> WireRequest:
        """The request body (parsed JSON) in the core's terms.

        Raises:
            ProxyError: 400 naming the field to fix.
        """
        ...

    def new_id(self) -> str: ...

    def response(self, done: Finished, answer: Answer) -> dict[str, Any]:
        """The whole answer's body."""
        ...

    def stream(self, events: AsyncIterator[Event], answer: Answer) -> AsyncIterator[bytes]:
        """The answer's server-sent events as ``events`` come; a failure after the first event ends
        the stream with the format's error event."""
        ...

    def error_body(self, exc: ProxyError) -> dict[str, Any]:
        """The body of an error answer (its status is ``exc.status``)."""
        ...
