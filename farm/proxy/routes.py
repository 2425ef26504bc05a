"""The proxy's HTTP routes under ``/proxy/{trial}/v1``: a harness's base URL.

The trial's key is the harness's API key: ``Authorization: Bearer KEY`` (OpenAI SDKs) or
``x-api-key: KEY`` (Anthropic SDKs). A request for a stream that fails before its first token is
an ordinary error response (status and the format's error body); a failure after that ends the
stream with the format's error event.

A harness that closes its connection before its answer is ready (killed with its sandbox when its
job is cancelled, or its client timing out) ends its call: the backend's request is aborted and the
call is recorded as failed. Starlette would otherwise run the handler to its end for nobody, and a
non-streamed answer would be decoded to its last token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import APIRouter
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from farm.errors import FarmError, ProxyError, TemplateRefused
from farm.proxy import anthropic_messages, bounds
from farm.proxy.anthropic_messages import AnthropicMessagesFormat
from farm.proxy.conversation import ChatRequest, CompletionRequest
from farm.proxy.core import ProxyCore
from farm.proxy.errors import invalid, proxy_error, refused, translated, unexpected
from farm.proxy.events import Event, Finished, TrialContext
from farm.proxy.openai_chat import OpenAIChatFormat
from farm.proxy.openai_completions import OpenAICompletionsFormat
from farm.proxy.openai_responses import OpenAIResponsesFormat
from farm.proxy.wire import Answer, WireFormat

Endpoint = Callable[[str, Request], Awaitable[Response]]
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
#: the status of a call whose harness left before its answer; nobody reads it (nginx's "client closed request").
CLIENT_GONE = 499
T = TypeVar("T")
log = logging.getLogger(__name__)


class HarnessGone(Exception):
    """The harness closed its connection before its answer was ready."""


def api_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key")


#: the formats by their path under a trial's base URL.
FORMATS: dict[str, WireFormat] = {
    "/chat/completions": OpenAIChatFormat(),
    "/completions": OpenAICompletionsFormat(),
    "/responses": OpenAIResponsesFormat(),
    "/messages": AnthropicMessagesFormat(),
}


def error_response(exc: ProxyError, wire: WireFormat) -> JSONResponse:
    return JSONResponse(wire.error_body(exc), status_code=exc.status)


async def read_json(core: ProxyCore, request: Request) -> Any:
    """The request body as JSON, read and checked within the proxy's bounds (``farm.proxy.bounds``);
    a prompt whose text cannot fit the longest context is refused here, before it is tokenized.

    Raises:
        ProxyError: 413 (too large), 408 (too slow), 400 naming the field (see ``bounds.parse_json``).
    """
    raw = await bounds.read_body(request, core.settings)
    value, prompt_bytes = bounds.parse_json(raw, core.settings)
    del raw
    bounds.check_prompt_bytes(
        prompt_bytes, longest_token=await core.longest_token_bytes(), max_prompt_tokens=core.settings.max_prompt_tokens
    )
    return value


def parsed(parse: Callable[[Any], T], raw: Any) -> T:
    """``parse(raw)``; a body the parser cannot read, whatever the reason, is the harness's to fix.

    Raises:
        ProxyError: 400 naming the field where it can.
    """
    try:
        return parse(raw)
    except ProxyError:
        raise
    except ValidationError as exc:  # an internal model built from a field of the wrong type
        raise invalid(exc) from None
    except (TypeError, ValueError, AttributeError, KeyError, RecursionError) as exc:
        log.info("unreadable proxy request: %r", exc)
        raise ProxyError(400, f"invalid request: a field has the wrong type or shape ({exc})") from None


async def open_trial(core: ProxyCore, trial: str, request: Request) -> TrialContext:
    try:
        return await core.open_trial(trial, api_key(request))
    except FarmError as exc:
        raise proxy_error(exc) from exc


async def started(events: AsyncIterator[Event]) -> AsyncIterator[Event]:
    """``events`` with the first one already taken, so a failure before it is raised here, where
    an error response can still be sent."""
    events = translated(events)
    try:
        first = await anext(events)
    except StopAsyncIteration:
        raise ProxyError(500, "the call ended without an answer") from None

    async def chained() -> AsyncIterator[Event]:
        yield first
        async for event in events:
            yield event

    return chained()


async def finished(events: AsyncIterator[Event]) -> Finished:
    async for event in events:
        if isinstance(event, Finished):
            return event
    raise ProxyError(500, "the call ended without an answer")


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_gone(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result; if the harness closes its connection first, ``work`` is cancelled (which
    closes the call's request to the backend: the backend aborts it) and waited for.

    Raises:
        HarnessGone: the harness left first.
        Exception: whatever ``work`` raised.
    """
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            # The call records its failure as it unwinds: the handler ends after that.
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        raise HarnessGone
    return task.result()


async def answer(request: Request, events: AsyncIterator[Event], *, stream: bool) -> AsyncIterator[Event] | Finished:
    """The call's events once the first is there (a stream), or its ``Finished`` (a whole answer),
    unless the harness leaves first.

    Raises:
        HarnessGone: the harness left first.
        ProxyError: the call failed before the first event (a stream) or before its answer.
    """

    async def ready() -> AsyncIterator[Event] | Finished:
        started_events = await started(events)
        return started_events if stream else await finished(started_events)

    return await unless_gone(request, ready())


def make_router(get_core: Callable[[Request], ProxyCore], *, prefix: str = "/proxy/{trial}/v1") -> APIRouter:
    """``proxy_routes`` as a router for the API's FastAPI app."""
    router = APIRouter()
    router.routes.extend(proxy_routes(get_core, prefix=prefix))
    return router


def proxy_routes(get_core: Callable[[Request], ProxyCore], *, prefix: str = "/proxy/{trial}/v1") -> list[Route]:
    """The proxy's routes under ``prefix``, which holds ``{trial}`` (verl's base URL shape is
    ``/{trial}/v1``: ``farm.api.routes.verl_sessions``).

    Plain Starlette routes, not FastAPI's: they read their own bodies and answer in each format's
    shape, so FastAPI's parameter solving and middleware would only cost CPU (``farm proxy`` serves
    them as a Starlette app: ~4% less of its CPU per call, bench/proxy.py). Not in the API's OpenAPI
    document: they have their own (``farm.proxy.openapi``).
    """
    routes: list[Route] = []

    def route(path: str, method: str) -> Callable[[Endpoint], Endpoint]:
        def add(endpoint: Endpoint) -> Endpoint:
            async def serve(request: Request) -> Response:
                return await endpoint(request.path_params["trial"], request)

            routes.append(Route(prefix + path, serve, methods=[method], name=endpoint.__name__))
            return endpoint

        return add

    @route("/models", "GET")
    async def models(trial: str, request: Request) -> Response:
        core = get_core(request)
        try:
            ctx = await open_trial(core, trial, request)
        except ProxyError as exc:
            return error_response(exc, FORMATS["/chat/completions"])
        names = dict.fromkeys([ctx.model, core.served_model])
        data = [{"id": name, "object": "model", "created": int(time.time()), "owned_by": "farm"} for name in names]
        return JSONResponse({"object": "list", "data": data})

    for path, wire in FORMATS.items():
        routes.append(Route(prefix + path, _format_endpoint(get_core, wire), methods=["POST"], name=_name(path)))

    @route("/messages/count_tokens", "POST")
    async def count_tokens(trial: str, request: Request) -> Response:
        core = get_core(request)
        try:
            await core.open_trial(trial, api_key(request), cached=False)  # nothing records this call to refuse it
            chat = parsed(anthropic_messages.parse_count, await read_json(core, request))
            return JSONResponse({"input_tokens": await core.count_tokens(chat)})
        except ProxyError as exc:
            return error_response(exc, FORMATS["/messages"])
        except FarmError as exc:
            return error_response(proxy_error(exc), FORMATS["/messages"])
        except TemplateRefused as exc:
            return error_response(refused(exc), FORMATS["/messages"])
        except Exception as exc:  # a bug
            return error_response(unexpected(exc), FORMATS["/messages"])

    return routes


def _format_endpoint(
    get_core: Callable[[Request], ProxyCore], wire: WireFormat
) -> Callable[[Request], Awaitable[Response]]:
    """One format's route: open the trial, parse, call the core, answer whole or as a stream."""

    async def serve(request: Request) -> Response:
        core = get_core(request)
        try:
            ctx = await open_trial(core, request.path_params["trial"], request)
            parsed_request = parsed(wire.parse, await read_json(core, request))
            call = parsed_request.call
            model = call.model or ctx.model
            answer_id = wire.new_id()
            prompt_text = _prompt_text(core, call) if parsed_request.echo_prompt else None
            reply = Answer(request=parsed_request, model=model, id=answer_id, prompt_text=prompt_text)
            built: list[Response] = []

            def build(done: Finished) -> None:
                # Serialized here, before the call is recorded done: a body that cannot be written
                # makes the call a failed one, not a done one the harness never saw.
                built.append(JSONResponse(wire.response(done, reply)))

            calling = core.call(
                ctx, call, wire=wire.wire, call_id_prefix=wire.call_id_prefix, build=None if call.stream else build
            )
            events = await answer(request, calling, stream=call.stream)
            if isinstance(events, Finished):
                return built[0]
        except ProxyError as exc:
            return error_response(exc, wire)
        except HarnessGone:
            return Response(status_code=CLIENT_GONE)
        except Exception as exc:  # a bug
            return error_response(unexpected(exc), wire)
        return StreamingResponse(wire.stream(events, reply), media_type="text/event-stream", headers=SSE_HEADERS)

    return serve


def _prompt_text(core: ProxyCore, call: ChatRequest | CompletionRequest) -> str | None:
    """A legacy completion's prompt as text (ids decoded), for an answer that repeats it."""
    if not isinstance(call, CompletionRequest):
        return None
    prompt = call.prompt
    return prompt if isinstance(prompt, str) else str(core.renderer.tokenizer.decode(prompt))


def _name(path: str) -> str:
    """A route's name, as the endpoint functions were named (``/chat/completions``: chat_completions)."""
    return path.strip("/").replace("/", "_")
