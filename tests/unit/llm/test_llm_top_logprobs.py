"""Top logprobs through the backend clients, on answers shaped as the servers' own code writes them.

vLLM 0.32 ``openai/completion/serving.py`` (``_create_completion_logprobs``): with ``logprobs: k`` each
position's ``top_logprobs`` map holds the sampled token first, then the top k (an id once), named
``token_id:N`` under ``return_tokens_as_token_ids``. ``scale_out/token_in_token_out/serving.py``
(``_create_tokens_logprobs``): each content entry lists the first ``max(k, 1)`` of that map as
``{"token_id", "logprob", "rank"}``. SGLang ``tokenizer_manager.py``: ``meta_info.output_top_logprobs``
holds per position a list of ``[logprob, id, text-or-null]``, most likely first.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from farm.errors import UpstreamError
from farm.llm.client import SGLangClient, VLLMClient
from farm.llm.types import GenerateRequest, GenerateResult, SamplingParams, StreamDelta

PROMPT = [5, 6, 7]
K = 2
#: per sampled id (40, then 41): the model's three most likely ids. 40 is the most likely at its
#: position; 41 was sampled from outside the top 2.
TOP3 = [{40: -0.5, 12: -1.5, 13: -2.5}, {50: -0.25, 51: -1.75, 52: -2.0}]
SAMPLED = [(40, -0.5), (41, -3.0)]
WANT = [{40: -0.5, 12: -1.5}, {50: -0.25, 51: -1.75}]


def request(k=K):
    return GenerateRequest(prompt_token_ids=PROMPT, sampling=SamplingParams(max_tokens=2, seed=1), top_logprobs=k)


def engine_map(position, k):
    """vLLM's per-position map: the sampled id first, then the top k, each id once."""
    tok, lp = SAMPLED[position]
    out = {tok: lp}
    for t, v in list(TOP3[position].items())[:k]:
        out.setdefault(t, v)
    return out


def completion_choice(positions, k, finish):
    ids = [SAMPLED[p][0] for p in positions]
    return {
        "index": 0,
        "text": "x" * len(ids),
        "logprobs": {
            "text_offset": list(range(len(ids))),
            "token_logprobs": [SAMPLED[p][1] for p in positions],
            "tokens": [f"token_id:{t}" for t in ids],
            "top_logprobs": [{f"token_id:{t}": v for t, v in engine_map(p, k).items()} for p in positions],
        },
        "finish_reason": finish,
        "stop_reason": None,
        "token_ids": ids,
    }


def generate_choice(positions, num, finish):
    content = []
    for p in positions:
        tok, lp = SAMPLED[p]
        listed = list(engine_map(p, num).items())[: max(num, 1)]
        tops = [{"token_id": t, "logprob": v, "rank": rank} for rank, (t, v) in enumerate(listed, 1)]
        content.append({"token_id": tok, "logprob": lp, "rank": 1 if p == 0 else 7, "top_logprobs": tops})
    return {
        "index": 0,
        "finish_reason": finish,
        "token_ids": [SAMPLED[p][0] for p in positions],
        "logprobs": {"content": content},
    }


def sse(chunks):
    text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return httpx.Response(200, content=text.encode(), headers={"content-type": "text/event-stream"})


class Recorder:
    def __init__(self, path, answer):
        self.path, self.answer, self.bodies = path, answer, []

    def __call__(self, req: httpx.Request) -> httpx.Response:
        if req.url.path != self.path:
            return httpx.Response(404, json={"detail": "Not Found"})
        body = json.loads(req.content)
        self.bodies.append(body)
        return self.answer(body)


async def _whole(client, req):
    async with client:
        return await client.generate(req)


async def _streamed(client, req):
    async with client:
        return [item async for item in client.generate_stream(req)]


def vllm(api, rec):
    return VLLMClient(base_url="http://b", model="m", api=api, transport=httpx.MockTransport(rec))


def test_vllm_completions_top_logprobs_are_the_k_most_likely_per_sampled_id():
    rec = Recorder(
        "/v1/completions",
        lambda body: httpx.Response(200, json={"choices": [completion_choice([0, 1], body["logprobs"], "length")]}),
    )
    result = asyncio.run(_whole(vllm("completions", rec), request()))
    assert rec.bodies[0]["logprobs"] == K and rec.bodies[0]["return_tokens_as_token_ids"] is True
    assert result.top_logprobs == WANT
    assert [list(m) for m in result.top_logprobs] == [[40, 12], [50, 51]]  # most likely first


def test_vllm_generate_asks_one_more_so_a_sampled_id_outside_the_top_k_pushes_none_out():
    rec = Recorder(
        "/inference/v1/generate",
        lambda body: httpx.Response(
            200, json={"choices": [generate_choice([0, 1], body["sampling_params"]["logprobs"], "length")]}
        ),
    )
    result = asyncio.run(_whole(vllm("generate", rec), request()))
    assert rec.bodies[0]["sampling_params"]["logprobs"] == K + 1
    assert result.top_logprobs == WANT


@pytest.mark.parametrize("api", ["completions", "generate"])
def test_vllm_streamed_top_logprobs_come_with_each_delta_and_the_result(api):
    def answer(body):
        if api == "completions":
            k = body["logprobs"]
            chunks = [
                {"choices": [completion_choice([0], k, None)]},
                {"choices": [completion_choice([1], k, "length")]},
            ]
        else:
            k = body["sampling_params"]["logprobs"]
            chunks = [{"choices": [generate_choice([0], k, None)]}, {"choices": [generate_choice([1], k, "length")]}]
        return sse(chunks)

    path = "/v1/completions" if api == "completions" else "/inference/v1/generate"
    items = asyncio.run(_streamed(vllm(api, Recorder(path, answer)), request()))
    *deltas, final = items
    assert all(isinstance(d, StreamDelta) for d in deltas) and isinstance(final, GenerateResult)
    assert [m for d in deltas for m in d.top_logprobs or []] == WANT
    assert final.top_logprobs == WANT and final.token_ids == [40, 41]


def test_sglang_top_logprobs_from_output_top_logprobs():
    def answer(body):
        k = body["top_logprobs_num"]
        meta = {
            "finish_reason": {"type": "length", "length": 2},
            "output_token_logprobs": [[lp, t, None] for t, lp in SAMPLED],
            "output_top_logprobs": [[[v, t, None] for t, v in list(top.items())[:k]] for top in TOP3],
        }
        return httpx.Response(200, json={"text": "ab", "output_ids": [40, 41], "meta_info": meta})

    rec = Recorder("/generate", answer)
    result = asyncio.run(_whole(SGLangClient(base_url="http://s", transport=httpx.MockTransport(rec)), request()))
    assert rec.bodies[0]["top_logprobs_num"] == K and rec.bodies[0]["return_logprob"] is True
    assert result.top_logprobs == WANT
    items = asyncio.run(_streamed(SGLangClient(base_url="http://s", transport=httpx.MockTransport(rec)), request()))
    assert items[0].top_logprobs == WANT and items[-1].top_logprobs == WANT


def test_no_top_logprobs_asked_sends_and_reads_nothing_extra():
    completions = Recorder(
        "/v1/completions", lambda body: httpx.Response(200, json={"choices": [completion_choice([0, 1], 0, "length")]})
    )
    generate = Recorder(
        "/inference/v1/generate",
        lambda body: httpx.Response(200, json={"choices": [generate_choice([0, 1], 0, "length")]}),
    )
    sglang = Recorder(
        "/generate",
        lambda body: httpx.Response(
            200,
            json={
                "output_ids": [40, 41],
                "meta_info": {"finish_reason": "length", "output_token_logprobs": [[lp, t, None] for t, lp in SAMPLED]},
            },
        ),
    )
    results = [
        asyncio.run(_whole(vllm("completions", completions), request(0))),
        asyncio.run(_whole(vllm("generate", generate), request(0))),
        asyncio.run(_whole(SGLangClient(base_url="http://s", transport=httpx.MockTransport(sglang)), request(0))),
    ]
    assert completions.bodies[0]["logprobs"] == 0
    assert generate.bodies[0]["sampling_params"]["logprobs"] == 0
    assert "top_logprobs_num" not in sglang.bodies[0]
    assert [r.top_logprobs for r in results] == [None, None, None]
    assert all(r.token_ids == [40, 41] for r in results)


def test_top_logprobs_asked_but_not_sent_is_an_upstream_error():
    def answer(body):
        choice = completion_choice([0, 1], body["logprobs"], "length")
        choice["logprobs"]["top_logprobs"] = None
        return httpx.Response(200, json={"choices": [choice]})

    with pytest.raises(UpstreamError, match="top logprobs"):
        asyncio.run(_whole(vllm("completions", Recorder("/v1/completions", answer)), request()))


def test_malformed_top_logprobs_name_is_an_upstream_error():
    def answer(body):
        choice = completion_choice([0, 1], body["logprobs"], "length")
        choice["logprobs"]["top_logprobs"][1] = {"A": -0.1}  # a decoded name: return_tokens_as_token_ids ignored
        return httpx.Response(200, json={"choices": [choice]})

    with pytest.raises(UpstreamError, match="malformed top logprobs"):
        asyncio.run(_whole(vllm("completions", Recorder("/v1/completions", answer)), request()))
