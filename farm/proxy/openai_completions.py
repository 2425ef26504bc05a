"""OpenAI legacy Completions (``POST /v1/completions``): a prompt continued as it is.

The prompt is text (tokenized as it is: no chat template, no special tokens added) or token ids
(verl-style clients), or a list holding one of those. What the proxy cannot honour without lying
is a 400 naming the field: several prompts, ``n`` or ``best_of`` above 1, ``suffix``, and ``echo``
together with ``logprobs`` (that needs the prompt's logprobs, which no backend returns here).
``echo`` alone prepends the prompt's text to the answer.

``logprobs`` (an int k) answers in the legacy shape ``{tokens, token_logprobs, top_logprobs,
text_offset}``; each ``top_logprobs`` entry holds the sampled token (its logprob is exact: the
recorded one) and the k most likely tokens, as vLLM lists them. vLLM's ``return_token_ids`` adds
``prompt_token_ids`` and ``token_ids`` to the choice. Streaming sends a chunk per text delta as the
model decodes, then a chunk with ``finish_reason`` (and, asked for, the logprobs and ids of the
whole answer), the usage chunk with empty ``choices`` only when ``stream_options.include_usage``
asks for it, and ``data: [DONE]``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from farm.errors import ProxyError
from farm.proxy.conversation import CompletionRequest, Sampling
from farm.proxy.errors import CONTEXT_LENGTH, validated
from farm.proxy.events import Event, Finished, Started, TextDelta
from farm.proxy.openai_chat import StreamOptions, error_body, sse, usage_body
from farm.proxy.wire import Answer, WireRequest

WIRE = "openai.completions"
#: OpenAI's (and vLLM's) max_tokens when a completion request does not say.
DEFAULT_MAX_TOKENS = 16

__all__ = ["WIRE", "OpenAICompletionsFormat", "error_body", "for_prompt", "new_id", "parse", "response", "stream"]


class CompletionBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: Any = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool | None = False
    n: int | None = None
    best_of: int | None = None
    suffix: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = None


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _prompt(value: Any) -> str | list[int]:
    """The one prompt of a request: text or ids, bare or as a list of one.

    Raises:
        ProxyError: no prompt, several, or not text or ids.
    """
    if isinstance(value, str):
        return value
    if _is_ids(value) and value:
        return list(value)
    if isinstance(value, list) and len(value) > 1 and all(isinstance(p, str) or _is_ids(p) for p in value):
        raise ProxyError(
            400,
            f"prompt holds {len(value)} prompts: the proxy answers one prompt per request (send them one by one)",
            param="prompt",
        )
    if isinstance(value, list) and len(value) == 1 and (isinstance(value[0], str) or _is_ids(value[0])):
        return _prompt(value[0])
    raise ProxyError(400, "prompt must be a string, a list of token ids, or a list of one of those", param="prompt")


def parse(raw: Any) -> WireRequest:
    """The request in the proxy's terms, whether to echo the prompt, and whether the usage chunk
    was asked for.

    Raises:
        ProxyError: 400 naming the field to fix.
    """
    body = validated(CompletionBody, raw)
    prompt = _prompt(body.prompt)
    if body.n not in (None, 1):
        raise ProxyError(400, "n must be 1: the proxy samples one answer per request", param="n")
    if body.best_of not in (None, 1):
        raise ProxyError(400, "best_of must be 1: the proxy samples one answer per request", param="best_of")
    if body.suffix:
        raise ProxyError(400, "suffix (insertion) is not supported: the model continues the prompt", param="suffix")
    if body.echo and body.logprobs is not None:
        raise ProxyError(
            400, "echo with logprobs is not supported: the prompt's logprobs are not computed", param="echo"
        )
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    request = CompletionRequest(
        model=body.model,
        prompt=prompt,
        sampling=Sampling(
            max_tokens=body.max_tokens or DEFAULT_MAX_TOKENS,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            seed=body.seed,
            stop=stop,
        ),
        stream=bool(body.stream),
        logprobs=body.logprobs is not None,
        top_logprobs=body.logprobs or 0,
        prompt_ids=bool(body.return_token_ids),
    )
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return WireRequest(request, include_usage=include_usage, echo_prompt=bool(body.echo))


def for_prompt(exc: ProxyError) -> ProxyError:
    """A context-length error names ``prompt``, the field a completion request sends."""
    if exc.code == CONTEXT_LENGTH:
        exc.param = "prompt"
    return exc


def new_id() -> str:
    return f"cmpl-{secrets.token_hex(12)}"


def _logprobs(done: Finished, *, offset: int) -> dict[str, Any]:
    """The legacy shape over the tokens whose text the answer shows (not the hidden end-of-text
    id, nor ids past a stop string)."""
    shown = len(done.reply.content)
    tokens: list[str] = []
    token_logprobs: list[float] = []
    offsets: list[int] = []
    at = 0
    tops: list[dict[str, float]] = []
    for i, (text, logprob) in enumerate(zip(done.token_texts, done.logprobs, strict=True)):
        if at >= shown:
            break
        tokens.append(text)
        token_logprobs.append(logprob)
        offsets.append(offset + at)
        at += len(text)
        # The sampled token first, then the k most likely, as vLLM lists them (keyed by text, so
        # tokens that read alike share an entry: the legacy shape cannot tell them apart).
        top = {text: logprob}
        for token, lp in done.top_logprobs[i] if i < len(done.top_logprobs) else []:
            top.setdefault(token, lp)
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


def _choice(done: Finished | None, *, text: str, offset: int, logprobs: bool, finish: str | None) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "text": text,
        "index": 0,
        "logprobs": _logprobs(done, offset=offset) if done is not None and logprobs else None,
        "finish_reason": finish,
    }
    if done is not None and done.prompt_ids:
        choice.update(prompt_token_ids=done.prompt_ids, token_ids=done.token_ids)
    return choice


def _finish_reason(done: Finished) -> str:
    return "length" if done.reply.finish_reason == "length" else "stop"


def response(done: Finished, *, model: str, completion_id: str, echo: str | None, logprobs: bool) -> dict[str, Any]:
    """``echo``: the prompt's text, to prepend (None: not asked for)."""
    prefix = echo or ""
    choice = _choice(
        done, text=prefix + done.reply.content, offset=len(prefix), logprobs=logprobs, finish=_finish_reason(done)
    )
    return {
        "id": completion_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage_body(done.usage),
        "system_fingerprint": None,
    }


async def stream(
    events: AsyncIterator[Event],
    *,
    model: str,
    completion_id: str,
    echo: str | None,
    include_usage: bool,
    logprobs: bool,
) -> AsyncIterator[bytes]:
    """Chunks as ``events`` come. An error after the first chunk ends the stream with an error event."""
    created = int(time.time())

    def chunk(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
        body: dict[str, Any] = {
            "id": completion_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": choices,
            "system_fingerprint": None,
        }
        if include_usage:
            body["usage"] = usage
        return sse(body)

    if echo:
        yield chunk([_choice(None, text=echo, offset=0, logprobs=False, finish=None)])
    try:
        async for event in events:
            if isinstance(event, Started):
                continue
            if isinstance(event, TextDelta):
                if event.text:
                    yield chunk([_choice(None, text=event.text, offset=0, logprobs=False, finish=None)])
            elif isinstance(event, Finished):
                offset = len(echo or "")
                yield chunk([_choice(event, text="", offset=offset, logprobs=logprobs, finish=_finish_reason(event))])
                if include_usage:
                    yield chunk([], usage_body(event.usage))
    except ProxyError as exc:
        exc = for_prompt(exc)
        yield sse(error_body(exc.status, exc.message, param=exc.param, code=exc.code))
        return
    yield sse("[DONE]")


class OpenAICompletionsFormat:
    """OpenAI legacy Completions, a ``farm.proxy.wire.WireFormat``."""

    wire = WIRE
    call_id_prefix = "call_"

    def parse(self, raw: Any) -> WireRequest:
        return parse(raw)

    def new_id(self) -> str:
        return new_id()

    def response(self, done: Finished, answer: Answer) -> dict[str, Any]:
        logprobs = answer.request.call.logprobs
        return response(done, model=answer.model, completion_id=answer.id, echo=answer.prompt_text, logprobs=logprobs)

    def stream(self, events: AsyncIterator[Event], answer: Answer) -> AsyncIterator[bytes]:
        request = answer.request
        return stream(
            events,
            model=answer.model,
            completion_id=answer.id,
            echo=answer.prompt_text,
            include_usage=request.include_usage,
            logprobs=request.call.logprobs,
        )

    def error_body(self, exc: ProxyError) -> dict[str, Any]:
        exc = for_prompt(exc)
        return error_body(exc.status, exc.message, param=exc.param, code=exc.code)
