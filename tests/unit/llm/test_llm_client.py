"""Backend clients against httpx.MockTransport: the request shapes they send and how they read answers."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from farm.errors import UpstreamConnectError, UpstreamError, UpstreamStatusError, UpstreamTimeout
from farm.llm.client import SGLangClient, VLLMClient, make_client
from farm.llm.types import FinishReason, GenerateRequest, SamplingParams

PROMPT = [5, 6, 7]
REQUEST = GenerateRequest(
    prompt_token_ids=PROMPT,
    sampling=SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_tokens=3, stop_token_ids=[2], seed=11),
)


def completion_body(token_ids=True, names=True):
    choice = {
        "index": 0,
        "text": "abc",
        "finish_reason": "stop",
        "stop_reason": None,
        "logprobs": {
            "text_offset": [0, 1, 2],
            "token_logprobs": [-0.5, -1.25, -0.125],
            "tokens": [f"token_id:{t}" for t in (40, 41, 2)] if names else ["a", "b", "<|im_end|>"],
            "top_logprobs": [],
        },
    }
    if token_ids:
        choice["token_ids"] = [40, 41, 2]
        choice["prompt_token_ids"] = PROMPT
    return {"id": "cmpl-1", "object": "text_completion", "model": "m", "choices": [choice], "usage": {}}


def generate_body():
    content = [{"token_id": t, "logprob": lp, "top_logprobs": []} for t, lp in ((40, -0.5), (41, -1.0))]
    return {
        "request_id": "r",
        "choices": [{"index": 0, "finish_reason": "length", "token_ids": [40, 41], "logprobs": {"content": content}}],
        "metrics": {"queue_time_ms": 250.0},
    }


class Recorder:
    """A MockTransport handler that records requests and answers from a route table."""

    def __init__(self, routes):
        self.routes = routes
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.routes.get(request.url.path, httpx.Response(404, json={"detail": "Not Found"}))
        return answer(request) if callable(answer) else answer

    def bodies(self, path):
        return [json.loads(r.content) for r in self.requests if r.url.path == path]


def run(coro):
    return asyncio.run(coro)


async def generate(client, request=REQUEST):
    async with client:
        return await client.generate(request)


def test_vllm_completions_request_shape():
    rec = Recorder({"/v1/completions": httpx.Response(200, json=completion_body())})
    client = VLLMClient(base_url="http://b1", model="m", api="completions", transport=httpx.MockTransport(rec))
    result = run(generate(client))
    (body,) = rec.bodies("/v1/completions")
    assert body["prompt"] == PROMPT
    assert body["model"] == "m"
    assert body["logprobs"] == 0
    assert body["return_token_ids"] is True and body["return_tokens_as_token_ids"] is True
    assert (body["temperature"], body["top_p"], body["top_k"], body["max_tokens"]) == (0.7, 0.9, 20, 3)
    assert (body["stop_token_ids"], body["seed"]) == ([2], 11)
    assert result.token_ids == [40, 41, 2]
    assert result.logprobs == [-0.5, -1.25, -0.125]
    assert result.finish_reason is FinishReason.STOP
    assert result.backend_id == "http://b1"


def test_vllm_completions_falls_back_to_token_id_names_when_token_ids_missing():
    body = completion_body(token_ids=False, names=True)
    rec = Recorder({"/v1/completions": httpx.Response(200, json=body)})
    client = VLLMClient(base_url="http://b1", model="m", api="completions", transport=httpx.MockTransport(rec))
    assert run(generate(client)).token_ids == [40, 41, 2]


def test_vllm_completions_without_any_ids_is_an_upstream_error():
    body = completion_body(token_ids=False, names=False)
    rec = Recorder({"/v1/completions": httpx.Response(200, json=body)})
    client = VLLMClient(base_url="http://b1", model="m", api="completions", transport=httpx.MockTransport(rec))
    with pytest.raises(UpstreamError, match="neither token_ids nor token_id:N"):
        run(generate(client))


def test_vllm_completions_ids_disagreeing_with_names_is_an_upstream_error():
    body = completion_body()
    body["choices"][0]["token_ids"] = [40, 99, 2]
    rec = Recorder({"/v1/completions": httpx.Response(200, json=body)})
    client = VLLMClient(base_url="http://b1", model="m", api="completions", transport=httpx.MockTransport(rec))
    with pytest.raises(UpstreamError, match="disagree"):
        run(generate(client))


def test_vllm_generate_endpoint_request_shape_and_queue_time():
    rec = Recorder({"/inference/v1/generate": httpx.Response(200, json=generate_body())})
    client = VLLMClient(base_url="http://b1", model="m", api="generate", transport=httpx.MockTransport(rec))
    result = run(generate(client))
    (body,) = rec.bodies("/inference/v1/generate")
    assert body["token_ids"] == PROMPT
    assert body["sampling_params"]["logprobs"] == 0
    assert body["sampling_params"]["max_tokens"] == 3 and body["sampling_params"]["seed"] == 11
    assert result.token_ids == [40, 41] and result.logprobs == [-0.5, -1.0]
    assert result.finish_reason is FinishReason.LENGTH
    assert result.queue_s == 0.25


def test_vllm_auto_falls_back_to_completions_once_when_generate_is_not_served():
    rec = Recorder(
        {
            "/inference/v1/generate": httpx.Response(403, json={"error": {"message": "Scale-out disabled"}}),
            "/v1/completions": httpx.Response(200, json=completion_body()),
        }
    )
    client = VLLMClient(base_url="http://b1", model="m", transport=httpx.MockTransport(rec))

    async def twice():
        async with client:
            await client.generate(REQUEST)
            return await client.generate(REQUEST)

    assert run(twice()).token_ids == [40, 41, 2]
    assert len(rec.bodies("/inference/v1/generate")) == 1
    assert len(rec.bodies("/v1/completions")) == 2


def test_vllm_resolves_model_from_v1_models():
    rec = Recorder(
        {
            "/v1/models": httpx.Response(200, json={"object": "list", "data": [{"id": "served-name"}]}),
            "/v1/completions": httpx.Response(200, json=completion_body()),
        }
    )
    client = VLLMClient(base_url="http://b1", api="completions", transport=httpx.MockTransport(rec))
    run(generate(client))
    assert rec.bodies("/v1/completions")[0]["model"] == "served-name"


def test_vllm_unknown_model_is_a_status_error_with_the_servers_message():
    error = {"error": {"message": "The model `nope` does not exist.", "type": "NotFoundError", "code": 404}}
    rec = Recorder({"/v1/completions": httpx.Response(404, json=error)})
    client = VLLMClient(base_url="http://b1", model="nope", api="completions", transport=httpx.MockTransport(rec))
    with pytest.raises(UpstreamStatusError, match="does not exist") as info:
        run(generate(client))
    assert info.value.status == 404
    assert info.value.context["backend"] == "http://b1"


def test_malformed_json_is_an_upstream_error_naming_the_backend():
    rec = Recorder({"/v1/completions": httpx.Response(200, content=b"{not json")})
    client = VLLMClient(
        base_url="http://b1", backend_id="gpu-3", model="m", api="completions", transport=httpx.MockTransport(rec)
    )
    with pytest.raises(UpstreamError, match="malformed JSON") as info:
        run(generate(client))
    assert "gpu-3" in str(info.value)


def test_connect_errors_are_retried_then_raised_as_connect_errors():
    calls = []

    def refuse(request):
        calls.append(request)
        raise httpx.ConnectError("connection refused", request=request)

    client = VLLMClient(
        base_url="http://b1", model="m", api="completions", connect_retries=2, transport=httpx.MockTransport(refuse)
    )
    with pytest.raises(UpstreamConnectError, match="cannot connect"):
        run(generate(client))
    assert len(calls) == 3


def test_read_timeout_is_not_retried():
    calls = []

    def slow(request):
        calls.append(request)
        raise httpx.ReadTimeout("timed out", request=request)

    client = VLLMClient(base_url="http://b1", model="m", api="completions", transport=httpx.MockTransport(slow))
    with pytest.raises(UpstreamTimeout):
        run(generate(client))
    assert len(calls) == 1


def test_sglang_request_shape_and_parsing():
    body = {
        "text": "ab",
        "output_ids": [40, 41],
        "meta_info": {
            "finish_reason": {"type": "stop", "matched": 41},
            "prompt_tokens": 3,
            "completion_tokens": 2,
            "cached_tokens": 2,
            "output_token_logprobs": [[-0.5, 40, None], [-2.0, 41, None]],
        },
    }
    rec = Recorder({"/generate": httpx.Response(200, json=body)})
    result = run(generate(SGLangClient(base_url="http://s1", transport=httpx.MockTransport(rec))))
    (sent,) = rec.bodies("/generate")
    assert sent["input_ids"] == PROMPT
    assert sent["return_logprob"] is True
    sp = sent["sampling_params"]
    assert (sp["max_new_tokens"], sp["temperature"], sp["top_p"], sp["top_k"]) == (3, 0.7, 0.9, 20)
    assert (sp["stop_token_ids"], sp["sampling_seed"]) == ([2], 11)
    assert result.token_ids == [40, 41] and result.logprobs == [-0.5, -2.0]
    assert result.finish_reason is FinishReason.STOP and result.cached_tokens == 2


def test_sglang_without_logprobs_is_an_upstream_error():
    rec = Recorder({"/generate": httpx.Response(200, json={"text": "x", "meta_info": {"finish_reason": None}})})
    with pytest.raises(UpstreamError, match="output_token_logprobs"):
        run(generate(SGLangClient(base_url="http://s1", transport=httpx.MockTransport(rec))))


def test_make_client_picks_the_protocol_by_kind():
    async def kinds():
        clients = [make_client(kind=k, base_url="http://x", api="completions") for k in ("vllm", "builtin", "sglang")]
        for c in clients:
            await c.aclose()
        return [type(c) for c in clients]

    assert run(kinds()) == [VLLMClient, VLLMClient, SGLangClient]


def test_vllm_auto_does_not_mistake_an_unknown_model_for_a_missing_route():
    error = {"error": {"message": "The model `nope` does not exist.", "type": "NotFoundError", "code": 404}}
    rec = Recorder({"/inference/v1/generate": httpx.Response(404, json=error)})
    client = VLLMClient(base_url="http://b1", model="nope", transport=httpx.MockTransport(rec))
    with pytest.raises(UpstreamStatusError, match="does not exist"):
        run(generate(client))
    assert client.api == "auto"


def test_vllm_max_tokens_is_clamped_to_the_context_left():
    """vLLM refuses prompt + max_tokens > max_model_len (it used to clamp): the client clamps,
    and a prompt that alone fills the context is a ContextLengthExceeded, not an infra error."""
    from farm.errors import ContextLengthExceeded

    models = {"object": "list", "data": [{"id": "m", "max_model_len": 5}]}
    rec = Recorder(
        {"/v1/models": httpx.Response(200, json=models), "/v1/completions": httpx.Response(200, json=completion_body())}
    )
    client = VLLMClient(base_url="http://b1", model="m", api="completions", transport=httpx.MockTransport(rec))
    run(generate(client))  # prompt 3 + max_tokens 3 > 5
    (body,) = rec.bodies("/v1/completions")
    assert body["max_tokens"] == 2 and client.max_model_len == 5
    long_prompt = GenerateRequest(prompt_token_ids=[1] * 5, sampling=REQUEST.sampling)
    client = VLLMClient(base_url="http://b1", model="m", api="completions", transport=httpx.MockTransport(rec))
    with pytest.raises(ContextLengthExceeded) as caught:
        run(generate(client, long_prompt))
    assert caught.value.status == 400 and "maximum context length is 5" in str(caught.value)
