"""Token-in/token-out clients for vLLM (and the built-in backend, which speaks vLLM) and SGLang.

Shapes are taken from the servers' own protocol modules (vLLM 0.32 ``openai/completion/protocol.py``
and ``scale_out/token_in_token_out/protocol.py``; SGLang ``tokenizer_manager.py``):

- vLLM ``POST /v1/completions``: ``prompt`` as a list of ids, ``logprobs: 0`` (the sampled token's
  logprob only; ``k`` for ``top_logprobs``), ``return_token_ids: true`` (adds ``choices[0].token_ids``) and
  ``return_tokens_as_token_ids: true`` (names ``logprobs.tokens`` ``"token_id:N"``), so a server
  too old for ``return_token_ids`` still yields the ids.
- vLLM ``POST /inference/v1/generate``: ``token_ids`` + ``sampling_params`` in;
  ``choices[0].token_ids`` and ``choices[0].logprobs.content[].logprob`` out. vLLM serves it only
  with ``--enable-scale-out``; in ``auto`` mode the client tries it once and falls back for good.
- SGLang ``POST /generate``: ``input_ids`` + ``sampling_params`` + ``return_logprob``; ``output_ids``
  and ``meta_info.output_token_logprobs`` (``[logprob, id, text]`` triples) out (with
  ``top_logprobs_num``, ``meta_info.output_top_logprobs``: such triples per position).

Top logprobs (``GenerateRequest.top_logprobs``) are asked for only when wanted; how each route
answers them: ``farm.llm.parse`` and ``_generate_logprobs``.

Only failures before the request reached the server (connect errors) are retried: a generation
that may have started is never sent twice.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal, Self

import httpx

from farm.errors import (
    ContextLengthExceeded,
    UpstreamConnectError,
    UpstreamError,
    UpstreamStatusError,
    UpstreamTimeout,
)
from farm.llm.parse import parse_completion, parse_generate, parse_sglang
from farm.llm.sse import Collected, events
from farm.llm.transport import LeanTransport
from farm.llm.transport import usable as transport_usable
from farm.llm.types import BackendKind, GenerateRequest, GenerateResult, StreamDelta

#: what a streamed generation yields: the ids as they are sampled, then the whole result.
StreamItem = StreamDelta | GenerateResult

#: longest a generation may take before the client gives up (read timeout per response).
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0
#: extra attempts after a connect error, with a doubling delay starting at CONNECT_RETRY_DELAY_S.
DEFAULT_CONNECT_RETRIES = 2
CONNECT_RETRY_DELAY_S = 0.2
DEFAULT_MAX_CONNECTIONS = 256
HEALTH_TIMEOUT_S = 2.0
#: idle connections are dropped before the server's keep-alive timeout (uvicorn's, so vLLM's and the
#: built-in backend's: 5 s) closes them: a request sent on a connection the server is closing fails
#: with a read error, and a generation is never sent twice.
KEEPALIVE_EXPIRY_S = 3.0
#: statuses with which a vLLM server says it has no /inference/v1/generate route.
_NO_GENERATE_ROUTE = frozenset({403, 404, 405, 501})

VLLMApi = Literal["auto", "completions", "generate"]
_JSON = {"Content-Type": "application/json", "Accept": "application/json"}


class _HttpBackend:
    kind: BackendKind

    def __init__(
        self,
        *,
        base_url: str,
        backend_id: str | None = None,
        model: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        connect_retries: int = DEFAULT_CONNECT_RETRIES,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.backend_id = backend_id or self.base_url
        self.model = model
        self.connect_retries = connect_retries
        if transport is None and transport_usable(self.base_url):
            transport = LeanTransport(max_connections=max_connections, keepalive_expiry=KEEPALIVE_EXPIRY_S)
        # Requests to the lean transport are built here and sent to it straight: httpx's client
        # (URL merging, cookies, auth and redirect handling) cost ~0.1 ms of CPU per request,
        # which the proxy pays on every call. Other transports go through the client.
        self._lean = transport if isinstance(transport, LeanTransport) else None
        self._timeouts = httpx.Timeout(timeout_s, connect=connect_timeout_s).as_dict()
        self._urls: dict[str, httpx.URL] = {}
        # One pooled keep-alive client per backend: each turn reuses a warm connection.
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(
                max_connections=max_connections,
                max_keepalive_connections=max_connections,
                keepalive_expiry=KEEPALIVE_EXPIRY_S,
            ),
            transport=transport,
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def health(self) -> bool:
        """True when ``GET /health`` answers 200 within HEALTH_TIMEOUT_S."""
        try:
            resp = await self._http.get("/health", timeout=HEALTH_TIMEOUT_S)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    def _build(self, method: str, path: str, payload: dict[str, Any] | None) -> httpx.Request:
        if self._lean is None:
            return self._http.build_request(method, path, json=payload)
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = self._http.build_request(method, path).url
        if payload is None:
            return httpx.Request(method, url, extensions={"timeout": self._timeouts})
        # As httpx's json= writes it.
        body = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        return httpx.Request(method, url, content=body, headers=_JSON, extensions={"timeout": self._timeouts})

    async def _send(self, request: httpx.Request, *, stream: bool) -> httpx.Response:
        if self._lean is None:
            return await self._http.send(request, stream=stream)
        response = await self._lean.handle_async_request(request)
        response.request = request
        if not stream:
            try:
                await response.aread()  # which gives the connection back
            except BaseException:
                await response.aclose()  # as httpx's client does: the connection is not kept
                raise
        return response

    async def _connected(
        self, method: str, path: str, payload: dict[str, Any] | None, *, stream: bool
    ) -> httpx.Response:
        """The answer to one request, retrying only a failed connect (``connect_retries`` times,
        backing off from ``CONNECT_RETRY_DELAY_S``): then nothing was sent, so sending again is safe.

        Raises:
            UpstreamConnectError: no connection after the retries.
            UpstreamTimeout: no answer in time (the request may be running: it is not retried).
            UpstreamError: any other transport failure.
        """
        ctx = {"backend": self.backend_id, "path": path}
        delay = CONNECT_RETRY_DELAY_S
        for attempt in range(self.connect_retries + 1):
            try:
                return await self._send(self._build(method, path, payload), stream=stream)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if attempt == self.connect_retries:
                    raise UpstreamConnectError(
                        f"cannot connect to LLM backend after {attempt + 1} attempts: {exc!r}; is it running?", **ctx
                    ) from exc
                await asyncio.sleep(delay)
                delay *= 2
            except httpx.TimeoutException as exc:
                raise UpstreamTimeout(f"LLM backend did not answer in time ({type(exc).__name__})", **ctx) from exc
            except httpx.HTTPError as exc:
                raise UpstreamError(f"LLM backend request failed: {exc!r}", **ctx) from exc
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _request(self, method: str, path: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send one request; returns the JSON object the server answered with.

        Raises:
            UpstreamTimeout: no answer in time (the request may be running: it is not retried).
            UpstreamStatusError: the server answered with an HTTP error (its message included).
            UpstreamError: no connection after the retries, or an answer that is not a JSON object.
        """
        ctx = {"backend": self.backend_id, "path": path}
        resp = await self._connected(method, path, payload, stream=False)
        if resp.status_code >= 400:
            raise UpstreamStatusError(
                f"LLM backend answered {resp.status_code}: {_error_message(resp)}", status=resp.status_code, **ctx
            )
        try:
            data = resp.json()
        except ValueError as exc:
            raise UpstreamError(f"LLM backend sent malformed JSON: {resp.text[:200]!r}", **ctx) from exc
        if not isinstance(data, dict):
            raise UpstreamError(f"LLM backend sent JSON that is not an object: {resp.text[:200]!r}", **ctx)
        return data

    @asynccontextmanager
    async def _stream(self, path: str, payload: dict[str, Any]) -> AsyncIterator[httpx.Response]:
        """A streamed POST, open while the caller reads it; closing it closes the request (which
        aborts the generation on vLLM and the built-in backend).

        Raises:
            UpstreamConnectError: no connection after the retries (nothing was sent).
            UpstreamTimeout, UpstreamStatusError, UpstreamError: as ``_request``.
        """
        ctx = {"backend": self.backend_id, "path": path}
        response = await self._connected("POST", path, payload, stream=True)
        try:
            if response.status_code >= 400:
                await response.aread()
                raise UpstreamStatusError(
                    f"LLM backend answered {response.status_code}: {_error_message(response)}",
                    status=response.status_code,
                    **ctx,
                )
            try:
                yield response
            except httpx.TimeoutException as exc:
                raise UpstreamTimeout(f"LLM backend stopped streaming ({type(exc).__name__})", **ctx) from exc
            except httpx.HTTPError as exc:
                raise UpstreamError(f"LLM backend stream broke: {exc!r}", **ctx) from exc
        finally:
            await response.aclose()


class VLLMClient(_HttpBackend):
    """vLLM (and the built-in CPU backend). ``api="auto"`` prefers ``/inference/v1/generate`` where served."""

    kind = BackendKind.VLLM

    def __init__(self, *, base_url: str, api: VLLMApi = "auto", **kwargs: Any) -> None:
        super().__init__(base_url=base_url, **kwargs)
        self.api: VLLMApi = api
        #: the served model's context length, from ``GET /v1/models`` (None: not listed).
        self.max_model_len: int | None = None
        self._listed = False

    async def resolve_model(self) -> str:
        """The served model name: the one given, else the first of ``GET /v1/models``.

        The listing is read once either way, for the model's ``max_model_len``.

        Raises:
            UpstreamError: the server lists no model.
        """
        if not self._listed:
            try:
                data = await self._request("GET", "/v1/models")
            except UpstreamStatusError:
                if self.model is None:
                    raise
                data = {}  # a server without the listing: the model name is known, the context is not
            listed = data.get("data")
            entries: list[Any] = listed if isinstance(listed, list) else []
            if self.model is None:
                try:
                    self.model = str(entries[0]["id"])
                except (KeyError, IndexError, TypeError) as exc:
                    raise UpstreamError("LLM backend lists no model at /v1/models", backend=self.backend_id) from exc
            for entry in entries:
                if isinstance(entry, dict) and entry.get("id") == self.model:
                    length = entry.get("max_model_len")
                    self.max_model_len = length if isinstance(length, int) and length > 0 else None
            self._listed = True
        assert self.model is not None
        return self.model

    def _fit(self, request: GenerateRequest) -> GenerateRequest:
        """Clamp max_tokens to the context left, as vLLM once did (it now refuses the request).

        Raises:
            ContextLengthExceeded: the prompt alone fills the context.
        """
        if self.max_model_len is None:
            return request
        room = self.max_model_len - len(request.prompt_token_ids)
        if room <= 0:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {self.max_model_len} tokens; "
                f"the prompt has {len(request.prompt_token_ids)}",
                status=400,
                backend=self.backend_id,
            )
        if request.sampling.max_tokens <= room:
            return request
        return request.model_copy(update={"sampling": request.sampling.model_copy(update={"max_tokens": room})})

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Sample a continuation of ``request.prompt_token_ids``.

        Raises:
            UpstreamError: see ``_request``; also a response without ids or logprobs.
        """
        model = await self.resolve_model()
        request = self._fit(request)
        sp = request.sampling
        start = time.perf_counter()
        if self.api in ("auto", "generate"):
            sampling = {**sp.model_dump(exclude_none=True), "logprobs": _generate_logprobs(request)}
            payload: dict[str, Any] = {
                "model": model,
                "token_ids": request.prompt_token_ids,
                "sampling_params": sampling,
            }
            try:
                data = await self._request("POST", "/inference/v1/generate", payload)
            except UpstreamStatusError as exc:
                # A 404 about the model is the model's fault, not a missing route.
                no_route = exc.status in _NO_GENERATE_ROUTE and "does not exist" not in exc.message
                if self.api == "generate" or not no_route:
                    raise
                self.api = "completions"  # this server has no tokens-in/out route; don't ask again
            else:
                self.api = "generate"
                return parse_generate(data, request, self.backend_id, time.perf_counter() - start)
        payload = {
            "model": model,
            "prompt": request.prompt_token_ids,
            **sp.model_dump(exclude_none=True),
            "logprobs": request.top_logprobs,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }
        data = await self._request("POST", "/v1/completions", payload)
        return parse_completion(data, request, self.backend_id, time.perf_counter() - start)

    async def generate_stream(self, request: GenerateRequest) -> AsyncGenerator[StreamItem, None]:
        """Sample as ``generate`` does, yielding the ids as the backend samples them (``StreamDelta``)
        and then the same ``GenerateResult`` ``generate`` would give. Closing the iterator early
        closes the request, which aborts the generation on the server.

        Raises:
            UpstreamError: see ``generate``; also a stream that breaks or ends without a finish reason.
        """
        model = await self.resolve_model()
        request = self._fit(request)
        sp = request.sampling
        start = time.perf_counter()
        if self.api in ("auto", "generate"):
            sampling = {**sp.model_dump(exclude_none=True), "logprobs": _generate_logprobs(request)}
            payload: dict[str, Any] = {
                "model": model,
                "token_ids": request.prompt_token_ids,
                "sampling_params": sampling,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            try:
                async with self._stream("/inference/v1/generate", payload) as response:
                    self.api = "generate"
                    async for item in self._read(response, "generate", request, start):
                        yield item
                    return
            except UpstreamStatusError as exc:
                no_route = exc.status in _NO_GENERATE_ROUTE and "does not exist" not in exc.message
                if self.api == "generate" or not no_route:
                    raise
                self.api = "completions"
        payload = {
            "model": model,
            "prompt": request.prompt_token_ids,
            **sp.model_dump(exclude_none=True),
            "logprobs": request.top_logprobs,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with self._stream("/v1/completions", payload) as response:
            async for item in self._read(response, "completions", request, start):
                yield item

    async def _read(
        self, response: httpx.Response, api: str, request: GenerateRequest, start: float
    ) -> AsyncGenerator[StreamItem, None]:
        collected = Collected(api=api, top_logprobs=request.top_logprobs)
        async for chunk in events(response, self.backend_id):
            delta = collected.add(chunk, self.backend_id)
            if delta is not None:
                yield delta
        yield collected.result(request, self.backend_id, time.perf_counter() - start)


class SGLangClient(_HttpBackend):
    """SGLang's native ``/generate`` with ``input_ids``."""

    kind = BackendKind.SGLANG

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Sample a continuation of ``request.prompt_token_ids``.

        Raises:
            UpstreamError: see ``_request``; also a response without ids or logprobs.
        """
        sp = request.sampling
        sampling: dict[str, Any] = {
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "top_k": sp.top_k,
            "max_new_tokens": sp.max_tokens,
            "stop_token_ids": sp.stop_token_ids,
        }
        if sp.seed is not None:
            sampling["sampling_seed"] = sp.seed
        payload = {
            "input_ids": request.prompt_token_ids,
            "sampling_params": sampling,
            "return_logprob": True,
            "logprob_start_len": -1,  # output tokens only
        }
        if request.top_logprobs:
            payload["top_logprobs_num"] = request.top_logprobs
        start = time.perf_counter()
        data = await self._request("POST", "/generate", payload)
        return parse_sglang(data, request, self.backend_id, time.perf_counter() - start)

    async def generate_stream(self, request: GenerateRequest) -> AsyncGenerator[StreamItem, None]:
        """SGLang's ``/generate`` streams text with cumulative output, not ids per chunk as vLLM's
        routes do: the generation is taken whole and handed out as one delta and the result."""
        result = await self.generate(request)
        yield StreamDelta(
            token_ids=list(result.token_ids), logprobs=list(result.logprobs), top_logprobs=result.top_logprobs
        )
        yield result


BackendClient = VLLMClient | SGLangClient


def _generate_logprobs(request: GenerateRequest) -> int:
    """``sampling_params.logprobs`` for vLLM's tokens route.

    Each position there lists the first ``logprobs`` entries of the engine's map, which holds the
    sampled id first and then the top ids: asked for k, a position whose sampled id is not among
    the top k would list only k - 1 of them. Asked for k + 1, every position lists all of the top k
    (the parser keeps the k most likely). vLLM's ``--max-logprobs`` (20 by default) bounds it.
    """
    return request.top_logprobs + 1 if request.top_logprobs else 0


def make_client(*, kind: BackendKind | str, base_url: str, **kwargs: Any) -> BackendClient:
    """The client for a backend kind (``builtin`` speaks vLLM's protocol)."""
    if BackendKind(kind) is BackendKind.SGLANG:
        kwargs.pop("api", None)  # a vLLM-only choice
        return SGLangClient(base_url=base_url, **kwargs)
    return VLLMClient(base_url=base_url, **kwargs)


def _error_message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:300] or resp.reason_phrase
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if "detail" in body:
            return str(body["detail"])
        if "message" in body:
            return str(body["message"])
    return str(body)[:300]
