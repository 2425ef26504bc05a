"""The built-in CPU backend: vLLM's HTTP endpoints, with vLLM's request and response shapes, over ``Engine``.

Routes (shapes as in vLLM 0.32's ``openai/completion/protocol.py`` and
``scale_out/token_in_token_out/protocol.py``):

- ``GET /health``, ``GET /v1/models``
- ``POST /v1/completions``: token-id (or text) prompt; ``logprobs``, ``return_token_ids``,
  ``return_tokens_as_token_ids``, ``stop_token_ids``, ``seed``, ``top_k``, ``stream`` (+ ``stream_options``);
  ``n == 1``.
- ``POST /inference/v1/generate``: ``token_ids`` + ``sampling_params`` in, ``choices[].token_ids`` and
  ``choices[].logprobs.content[]`` out, streamed with ``stream`` (vLLM serves it with ``--enable-scale-out``;
  here it is always on). Streams and client disconnects: ``farm.llm.builtin.stream``.
- ``GET /metrics``: Prometheus text with vLLM's metric names (prefix-cache queries and hits, load), plus
  ``farm:`` counters of scripted and sampled requests.
- ``GET /v1/script`` (farm's own): the loaded script's rules and hits per rule.
- Weight updates, as vLLM 0.32 serves them with ``VLLM_SERVER_DEV_MODE=1``: ``POST /pause?mode=abort|wait|keep``,
  ``POST /resume``, ``GET /is_paused``, ``POST /abort_requests``, ``POST /update_weight_version``,
  ``GET /weight_info``, and ``POST /collective_rpc`` with method ``reload_weights`` (kwargs ``weights_path``:
  a checkpoint directory); ``/inference/v1/generate`` choices carry ``weight_versions`` spans.

With a script (``farm.llm.builtin.script``), a prompt that matches one of its rules gets the rule's text as
forced ids; any other prompt is sampled.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import Future
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from farm.errors import EngineRequestError
from farm.llm.builtin.engine import Engine, EngineOutput
from farm.llm.builtin.script import Script, ScriptFile
from farm.llm.builtin.stream import DONE, Feed, TextDelta, deltas, guarded, result_or_abort, sse
from farm.llm.types import DEFAULT_MAX_TOKENS, SamplingParams


class StreamOptions(BaseModel):
    include_usage: bool | None = False


class CompletionBody(BaseModel):
    model: str | None = None
    prompt: list[int] | str
    max_tokens: int | None = DEFAULT_MAX_TOKENS
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    logprobs: int | None = None
    n: int = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None


class GenerateSamplingBody(BaseModel):
    max_tokens: int | None = DEFAULT_MAX_TOKENS
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    logprobs: int | None = None


class RpcBody(BaseModel):
    method: str
    args: list[str] = Field(default_factory=list)
    kwargs: dict[str, str] = Field(default_factory=dict)
    timeout: float | None = None


class VersionBody(BaseModel):
    new_version: str


class GenerateBody(BaseModel):
    model: str | None = None
    token_ids: list[int] = Field(min_length=1)
    sampling_params: GenerateSamplingBody = Field(default_factory=GenerateSamplingBody)
    request_id: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None


def _error(message: str, status: int, err_type: str, param: str | None = None) -> JSONResponse:
    # vLLM's ErrorResponse shape, so clients parse one error format whichever server answers.
    return JSONResponse({"error": {"message": message, "type": err_type, "param": param, "code": status}}, status)


def create_app(
    *, model_dir: Path, model_name: str, engine: Engine | None = None, script: ScriptFile | None = None
) -> FastAPI:
    """Build the app. The engine starts with the app and stops with it.

    Raises:
        OSError: the model folder cannot be loaded.
        ConfigError: a script is given but the tokenizer has no end-of-turn id the engine stops at.
    """
    from transformers import AutoTokenizer

    eng = engine or Engine(model_dir=model_dir)
    tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)
    scripted = Script.for_model(script, tokenizer, stop_ids=eng.eos_ids) if script is not None else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        eng.start()
        try:
            yield
        finally:
            eng.stop()

    app = FastAPI(title="farm built-in LLM backend", lifespan=lifespan)
    app.state.engine = eng
    app.state.script = scripted

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(str(exc.errors()), 400, "BadRequestError")

    def check_model(name: str | None) -> JSONResponse | None:
        if name is None or name == model_name:
            return None
        return _error(f"The model `{name}` does not exist. Valid aliases: {model_name}.", 404, "NotFoundError", "model")

    def start(
        prompt: list[int], params: SamplingParams, num_top: int, listener: Feed | None = None
    ) -> Future[EngineOutput] | JSONResponse:
        # Ids the tokenizer cannot decode are the engine's to reject, scripted or not.
        valid = all(0 <= t < eng.vocab_size for t in prompt)
        reply = scripted.reply(prompt) if scripted is not None and valid else None
        try:
            forced = reply.token_ids if reply is not None else None
            future = eng.submit(prompt, params, num_top_logprobs=num_top, forced=forced, listener=listener)
        except EngineRequestError as exc:
            return _error(str(exc), 400, "BadRequestError")
        if reply is not None and scripted is not None:
            scripted.hit(reply)
        return future

    def stop_reason(out: EngineOutput) -> int | None:
        # vLLM: the stop token id that ended generation; None for EOS, length and abort.
        return out.stop_token_id if out.stop_token_id not in eng.eos_ids else None

    @app.get("/health")
    async def health() -> Response:
        # On the event loop, not the thread pool: under load a probe must not queue behind threads.
        return Response(status_code=200)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        card = {
            "id": model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "farm",
            "root": str(model_dir),
            "max_model_len": eng.max_model_len,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionBody, request: Request) -> Response | dict[str, Any]:
        if (err := check_model(body.model)) is not None:
            return err
        if body.n != 1:
            return _error("the built-in backend serves n=1", 400, "BadRequestError", "n")
        prompt = body.prompt if isinstance(body.prompt, list) else tokenizer.encode(body.prompt)
        params = SamplingParams(
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=-1 if body.top_k is None else body.top_k,
            max_tokens=body.max_tokens or DEFAULT_MAX_TOKENS,
            stop_token_ids=body.stop_token_ids or [],
            seed=body.seed,
        )
        as_ids = bool(body.return_tokens_as_token_ids)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": rid, "object": "text_completion", "created": created, "model": model_name}
        if body.stream:
            feed = Feed(asyncio.get_running_loop())
            started = start(prompt, params, body.logprobs or 0, feed)
            if isinstance(started, JSONResponse):
                return started
            future = started
            usage = bool(body.stream_options and body.stream_options.include_usage)

            async def chunks() -> AsyncIterator[str]:
                text, offset = TextDelta(tokenizer), 0
                async for d in deltas(feed, future):
                    out = d.output
                    choice: dict[str, Any] = {
                        "index": 0,
                        "text": text.push(d.token_ids, final=out is not None),
                        "logprobs": None,
                        "finish_reason": out.finish_reason.value if out else None,
                        "stop_reason": stop_reason(out) if out else None,
                    }
                    if body.logprobs is not None:
                        lp = _completion_logprobs(d.token_ids, d.logprobs, d.tops, tokenizer, as_ids, offset)
                        choice["logprobs"] = lp
                        offset += sum(len(t) for t in lp["tokens"])
                    if body.return_token_ids:
                        choice["token_ids"] = d.token_ids
                        if d.start == 0:
                            choice["prompt_token_ids"] = prompt
                    if d.token_ids or out is not None:
                        yield sse({**head, "choices": [choice]})
                    if out is not None and usage:
                        yield sse({**head, "choices": [], "usage": _usage(out)})
                yield DONE

            return StreamingResponse(guarded(eng, future, chunks()), media_type="text/event-stream")
        once = start(prompt, params, body.logprobs or 0)
        if isinstance(once, JSONResponse):
            return once
        out = await result_or_abort(request, eng, once)
        if out is None:
            return Response(status_code=499)  # the client is gone: nobody reads this
        choice = {
            "index": 0,
            "text": tokenizer.decode(out.token_ids, skip_special_tokens=True),
            "logprobs": None,
            "finish_reason": out.finish_reason.value,
            "stop_reason": stop_reason(out),
        }
        if body.logprobs is not None:
            choice["logprobs"] = _completion_logprobs(
                out.token_ids, out.logprobs, out.top_logprobs, tokenizer, as_ids, 0
            )
        if body.return_token_ids:
            choice["token_ids"] = out.token_ids
            choice["prompt_token_ids"] = prompt
        return {
            **head,
            "choices": [choice],
            "usage": _usage(out),
            "metrics": {"queue_time_ms": out.queue_s * 1000.0},
        }

    @app.post("/inference/v1/generate", response_model=None)
    async def generate(body: GenerateBody, request: Request) -> Response | dict[str, Any]:
        if (err := check_model(body.model)) is not None:
            return err
        sp = body.sampling_params
        params = SamplingParams(
            temperature=sp.temperature,
            top_p=sp.top_p,
            top_k=sp.top_k,
            max_tokens=sp.max_tokens or DEFAULT_MAX_TOKENS,
            stop_token_ids=sp.stop_token_ids or [],
            seed=sp.seed,
        )
        rid = body.request_id or uuid.uuid4().hex

        def choice(
            ids: list[int], lps: list[float], tops: list[dict[int, float]], out: EngineOutput | None
        ) -> dict[str, Any]:
            return {
                "index": 0,
                "finish_reason": out.finish_reason.value if out else None,
                "stop_reason": stop_reason(out) if out else None,
                "token_ids": ids,
                "logprobs": None if sp.logprobs is None else _generate_logprobs(ids, lps, tops, sp.logprobs),
                # As vLLM's: contiguous spans over the output ids, versions as strings; on the last chunk.
                "weight_versions": None
                if out is None
                else [{"version": str(v), "start": s, "end": e} for v, s, e in out.weight_versions],
            }

        if body.stream:
            feed = Feed(asyncio.get_running_loop())
            started = start(body.token_ids, params, sp.logprobs or 0, feed)
            if isinstance(started, JSONResponse):
                return started
            stream_future = started
            usage = bool(body.stream_options and body.stream_options.include_usage)

            async def chunks() -> AsyncIterator[str]:
                head = {"request_id": rid, "output_mode": "tokens"}
                async for d in deltas(feed, stream_future):
                    if d.token_ids or d.output is not None:
                        yield sse({**head, "choices": [choice(d.token_ids, d.logprobs, d.tops, d.output)]})
                    if d.output is not None and usage:
                        yield sse({**head, "choices": [], "usage": _usage(d.output)})
                yield DONE

            return StreamingResponse(guarded(eng, stream_future, chunks()), media_type="text/event-stream")
        future = start(body.token_ids, params, sp.logprobs or 0)
        if isinstance(future, JSONResponse):
            return future
        out = await result_or_abort(request, eng, future)
        if out is None:
            return Response(status_code=499)
        return {
            "request_id": rid,
            "model": model_name,
            "created": int(time.time()),
            "output_mode": "tokens",
            "usage": _usage(out),
            "choices": [choice(out.token_ids, out.logprobs, out.top_logprobs, out)],
            "metrics": {"queue_time_ms": out.queue_s * 1000.0},
        }

    @app.post("/pause")
    async def pause(mode: Literal["abort", "wait", "keep"] = "abort") -> dict[str, str]:
        await asyncio.wrap_future(eng.pause(mode))
        return {"status": "paused"}

    @app.post("/resume")
    async def resume() -> dict[str, str]:
        await asyncio.wrap_future(eng.resume())
        return {"status": "resumed"}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> Response:
        # vLLM's route (its dev mode): every prompt after this is prefilled in full, as on a fresh start.
        eng.prefix_cache.clear()
        return Response(status_code=200)

    @app.get("/is_paused")
    async def is_paused() -> dict[str, bool]:
        return {"is_paused": eng.paused}

    @app.post("/abort_requests")
    async def abort_requests() -> dict[str, Any]:
        # Everything in flight, as vLLM's route without request_ids; the engine keeps serving.
        count = await asyncio.wrap_future(eng.abort_all())
        return {"status": "aborted", "aborted": count}

    @app.post("/update_weight_version", response_model=None)
    async def update_weight_version(body: VersionBody) -> dict[str, Any] | JSONResponse:
        if not body.new_version.isdigit():
            return _error("the built-in backend's versions are integers >= 0", 400, "BadRequestError", "new_version")
        await asyncio.wrap_future(eng.set_weight_version(int(body.new_version)))
        return {"success": True, "new_version": body.new_version}

    @app.get("/weight_info")
    async def weight_info() -> dict[str, str]:
        return {"weight_version": str(eng.weight_version)}

    @app.post("/collective_rpc", response_model=None)
    async def collective_rpc(body: RpcBody) -> dict[str, Any] | JSONResponse:
        if body.method != "reload_weights" or "weights_path" not in body.kwargs:
            return _error(
                "the built-in backend serves only reload_weights with kwargs weights_path", 400, "BadRequestError"
            )
        try:
            await asyncio.wrap_future(eng.load_weights(Path(body.kwargs["weights_path"])))
        except (OSError, ValueError) as exc:
            return _error(f"cannot load weights: {exc}", 400, "BadRequestError", "kwargs.weights_path")
        return {"results": [None]}

    @app.get("/v1/script")
    def script_report() -> dict[str, Any]:
        rules = scripted.report() if scripted is not None else []
        s = eng.stats
        return {
            "enabled": scripted is not None,
            "rule_count": len(rules),
            "rules": rules,
            "requests": {"scripted": s["scripted_requests"], "sampled": s["requests"] - s["scripted_requests"]},
        }

    @app.get("/metrics")
    def metrics() -> PlainTextResponse:
        s = eng.stats
        lines = [
            ("vllm:num_requests_running", "gauge", eng.num_running),
            ("vllm:num_requests_waiting", "gauge", eng.num_waiting),
            ("vllm:prefix_cache_queries_total", "counter", s["prompt_tokens"]),
            ("vllm:prefix_cache_hits_total", "counter", s["cached_tokens"]),
            ("vllm:prompt_tokens_total", "counter", s["prompt_tokens"]),
            ("vllm:generation_tokens_total", "counter", s["generation_tokens"]),
            ("vllm:request_success_total", "counter", s["requests"]),
            ("farm:prefix_cache_hit_requests_total", "counter", s["cache_hits"]),
            ("farm:prefix_cache_tokens", "gauge", eng.prefix_cache.tokens),
            ("farm:forward_passes_total", "counter", s["forward_passes"]),
            ("farm:scripted_requests_total", "counter", s["scripted_requests"]),
            ("farm:sampled_requests_total", "counter", s["requests"] - s["scripted_requests"]),
        ]
        label = f'{{model_name="{model_name}"}}'
        text = "".join(f"# TYPE {name} {kind}\n{name}{label} {value}\n" for name, kind, value in lines)
        return PlainTextResponse(text)

    return app


def _usage(out: EngineOutput) -> dict[str, Any]:
    return {
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": len(out.token_ids),
        "total_tokens": out.prompt_tokens + len(out.token_ids),
        "prompt_tokens_details": {"cached_tokens": out.cached_tokens},
    }


def _completion_logprobs(
    ids: list[int], lps: list[float], tops: list[dict[int, float]], tokenizer: Any, as_ids: bool, offset: int
) -> dict[str, Any]:
    """vLLM's completions ``logprobs`` for these ids; ``offset``: the text offset of the first."""

    def name(token_id: int) -> str:
        return f"token_id:{token_id}" if as_ids else str(tokenizer.decode([token_id]))

    tokens = [name(t) for t in ids]
    offsets, pos = [], offset
    for tok in tokens:
        offsets.append(pos)
        pos += len(tok)
    # As vLLM: each position's top dict holds the sampled token first, then the requested top-N.
    top: list[dict[str, float] | None] = []
    for i, (tok_id, lp) in enumerate(zip(ids, lps, strict=True)):
        entry = {name(tok_id): lp}
        for t, v in (tops[i] if i < len(tops) else {}).items():
            entry.setdefault(name(t), v)
        top.append(entry)
    return {"text_offset": offsets, "token_logprobs": lps, "tokens": tokens, "top_logprobs": top}


def _generate_logprobs(ids: list[int], lps: list[float], tops: list[dict[int, float]], num: int) -> dict[str, Any]:
    content = []
    for i, (tok, lp) in enumerate(zip(ids, lps, strict=True)):
        # As vLLM: one map per position, the sampled id first and then the top ids (an id once), of
        # which the first max(num, 1) are listed: a sampled id outside the top num pushes the last out.
        candidates = {tok: lp}
        for t, v in (tops[i] if i < len(tops) else {}).items():
            candidates.setdefault(t, v)
        listed = [{"token_id": t, "logprob": v} for t, v in list(candidates.items())[: max(num, 1)]]
        content.append({"token_id": tok, "logprob": lp, "top_logprobs": listed})
    return {"content": content}
