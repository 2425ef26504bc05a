"""The built-in backend's scripted mode over HTTP through farm's VLLMClient: forced ids, real logprobs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from farm.llm.builtin.testing import BuiltinServer
from farm.llm.builtin.tiny import EOS_TOKEN
from farm.llm.client import VLLMClient
from farm.llm.trajectory import TrajectoryBuilder
from farm.llm.types import FinishReason, GenerateRequest, SamplingParams

TOLERANCE = 1e-4

TEXTS = {
    "prose": "The answer is four.",
    "code": "def add(a, b):\n    return a + b\n\nprint(add(2, 2))\n",
    "json": '{"answer": 4, "steps": ["2 + 2", "= 4"], "note": "a \\"quoted\\" word", "empty": {}}',
    "latex": r"Adding the halves: $\frac{1}{2} + \frac{1}{4}$ gives \boxed{3/4}.",
    "tool": '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls -la"}}\n</tool_call>',
}
MULTI_TURN = ["I will look first.", "Now I know: \\boxed{4}", "Done."]
SCRIPT = {
    "rules": [
        *({"match": f"case-{name}\\b", "turns": [text]} for name, text in TEXTS.items()),
        {"match": "multi-turn task", "turns": MULTI_TURN},
        {"match": "case-early-end", "turns": ["first part<|im_end|>never sent"]},
    ]
}


def run(coro):
    return asyncio.run(coro)


async def generate(server, prompt, sampling, api="auto"):
    async with VLLMClient(base_url=server.url, api=api) as client:
        return await client.generate(GenerateRequest(prompt_token_ids=prompt, sampling=sampling))


def prompt_of(tokenizer, text):
    messages = [{"role": "user", "content": text}]
    return tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)


def forced_ids(tokenizer, text):
    return [*tokenizer.encode(text, add_special_tokens=False), tokenizer.convert_tokens_to_ids(EOS_TOKEN)]


def assert_matches_teacher(teacher, prompt, result):
    forced = teacher(prompt + result.token_ids)[len(prompt) :]
    assert len(forced) == len(result.logprobs)
    for i, (got, want) in enumerate(zip(result.logprobs, forced, strict=True)):
        assert abs(got - want) <= TOLERANCE, f"position {i}: {got} vs teacher {want}"


@pytest.fixture(scope="module")
def scripted_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltinServer]:
    log = tmp_path_factory.mktemp("logs") / "scripted.log"
    with BuiltinServer(model_dir=tiny_model_dir, log_path=log, script=SCRIPT) as server:
        yield server


@pytest.mark.parametrize("api", ["completions", "generate"])
@pytest.mark.parametrize("case", sorted(TEXTS))
def test_scripted_reply_is_the_forced_ids_with_teacher_logprobs(scripted_server, tiny_tokenizer, teacher, case, api):
    prompt = prompt_of(tiny_tokenizer, f"case-{case}: answer it")
    result = run(generate(scripted_server, prompt, SamplingParams(max_tokens=200, temperature=1.0), api=api))
    assert result.token_ids == forced_ids(tiny_tokenizer, TEXTS[case])
    assert result.finish_reason is FinishReason.STOP
    assert tiny_tokenizer.decode(result.token_ids[:-1], skip_special_tokens=False) == TEXTS[case]
    assert_matches_teacher(teacher, prompt, result)


def test_scripted_turns_follow_the_assistant_turns_in_the_prompt(scripted_server, tiny_tokenizer, teacher):
    # Given a conversation built append-only, as a handler builds it
    builder = TrajectoryBuilder(tokenizer=tiny_tokenizer, messages=[{"role": "user", "content": "multi-turn task"}])
    results = []

    async def conversation():
        async with VLLMClient(base_url=scripted_server.url) as client:
            for turn in range(4):
                sampling = SamplingParams(max_tokens=64, seed=turn)
                result = await client.generate(GenerateRequest(prompt_token_ids=builder.prompt_ids, sampling=sampling))
                results.append(result)
                builder.add_completion(result)
                builder.add_messages([{"role": "user", "content": f"observation {turn}"}])

    # When every turn is answered by the script
    run(conversation())

    # Then turn i gets turns[i] (the last one reused), the trajectory matches teacher forcing
    texts = [tiny_tokenizer.decode(r.token_ids[:-1], skip_special_tokens=False) for r in results]
    assert texts == [*MULTI_TURN, MULTI_TURN[-1]]
    traj = builder.build()
    assert traj.forks == []
    forced = teacher(traj.token_ids)
    for i, mask in enumerate(traj.loss_mask):
        if mask:
            assert abs(traj.logprobs[i] - forced[i]) <= TOLERANCE, f"position {i}"
    # and later turns reuse the previous turn's KV state from the prefix cache.
    assert all(r.cached_tokens and r.cached_tokens > 0 for r in results[1:])


def test_scripted_unmatched_prompt_is_sampled_as_without_a_script(
    scripted_server, builtin_server, tiny_tokenizer, teacher
):
    prompt = prompt_of(tiny_tokenizer, "nothing in the script mentions this")
    sampling = SamplingParams(max_tokens=24, temperature=1.0, seed=7)
    scripted = run(generate(scripted_server, prompt, sampling))
    plain = run(generate(builtin_server, prompt, sampling))
    assert scripted.token_ids == plain.token_ids
    assert_matches_teacher(teacher, prompt, scripted)


@pytest.mark.parametrize("api", ["completions", "generate"])
def test_scripted_reply_cut_at_max_tokens_finishes_with_length(scripted_server, tiny_tokenizer, teacher, api):
    prompt = prompt_of(tiny_tokenizer, "case-code")
    result = run(generate(scripted_server, prompt, SamplingParams(max_tokens=5), api=api))
    assert result.token_ids == forced_ids(tiny_tokenizer, TEXTS["code"])[:5]
    assert result.finish_reason is FinishReason.LENGTH
    assert_matches_teacher(teacher, prompt, result)


def test_scripted_reply_stops_at_a_requested_stop_id(scripted_server, tiny_tokenizer):
    prompt = prompt_of(tiny_tokenizer, "case-json")
    ids = forced_ids(tiny_tokenizer, TEXTS["json"])
    stop_id = ids[3]
    result = run(generate(scripted_server, prompt, SamplingParams(max_tokens=200, stop_token_ids=[stop_id])))
    assert result.token_ids == ids[: ids.index(stop_id) + 1]
    assert result.finish_reason is FinishReason.STOP


def test_scripted_reply_ends_at_an_end_of_turn_inside_its_text(scripted_server, tiny_tokenizer):
    prompt = prompt_of(tiny_tokenizer, "case-early-end")
    result = run(generate(scripted_server, prompt, SamplingParams(max_tokens=200)))
    assert result.token_ids == forced_ids(tiny_tokenizer, "first part")
    assert result.finish_reason is FinishReason.STOP


def test_scripted_and_sampled_requests_batch_together_and_stay_exact(scripted_server, tiny_tokenizer, teacher):
    # Scripted and free prompts interleaved, all in flight at once: they share prefill and decode steps.
    cases = [(f"case-{name}", TEXTS[name]) for name in TEXTS] + [(f"free text {i} " * (i + 1), None) for i in range(5)]
    cases = cases[::2] + cases[1::2]
    prompts = [prompt_of(tiny_tokenizer, text) for text, _ in cases]
    sampling = SamplingParams(max_tokens=100, temperature=1.0)

    async def all_at_once():
        async with VLLMClient(base_url=scripted_server.url) as client:
            requests = [GenerateRequest(prompt_token_ids=p, sampling=sampling) for p in prompts]
            return await asyncio.gather(*(client.generate(r) for r in requests))

    for (_, expected), prompt, result in zip(cases, prompts, run(all_at_once()), strict=True):
        if expected is not None:
            assert result.token_ids == forced_ids(tiny_tokenizer, expected)
        assert_matches_teacher(teacher, prompt, result)


def test_scripted_hits_are_reported_and_counted_in_metrics(scripted_server, tiny_tokenizer):
    def report():
        return httpx.get(f"{scripted_server.url}/v1/script").json()

    def metric(name):
        for line in httpx.get(f"{scripted_server.url}/metrics").text.splitlines():
            if line.startswith(f"{name}{{"):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"{name} not in /metrics")

    before, scripted, sampled = report(), metric("farm:scripted_requests_total"), metric("farm:sampled_requests_total")
    run(generate(scripted_server, prompt_of(tiny_tokenizer, "case-prose"), SamplingParams(max_tokens=8)))
    run(generate(scripted_server, prompt_of(tiny_tokenizer, "no rule here"), SamplingParams(max_tokens=2)))
    after = report()

    assert after["enabled"] and after["rule_count"] == len(SCRIPT["rules"])
    prose = list(TEXTS).index("prose")
    assert [r["match"] for r in after["rules"]] == [r["match"] for r in SCRIPT["rules"]]
    assert after["rules"][prose]["hits"] == before["rules"][prose]["hits"] + 1
    assert after["requests"]["scripted"] == before["requests"]["scripted"] + 1
    assert after["requests"]["sampled"] == before["requests"]["sampled"] + 1
    assert metric("farm:scripted_requests_total") == scripted + 1
    assert metric("farm:sampled_requests_total") == sampled + 1


def test_builtin_without_a_script_reports_it_disabled(builtin_server):
    assert httpx.get(f"{builtin_server.url}/v1/script").json()["enabled"] is False


def test_builtin_server_rejects_an_invalid_script_before_starting(tiny_model_dir):
    from farm.errors import ConfigError

    with pytest.raises(ConfigError, match="regular expression"):
        BuiltinServer(model_dir=tiny_model_dir, script={"rules": [{"match": "[", "turns": ["x"]}]})


def test_builtin_server_takes_a_script_file_relative_to_the_caller(tiny_model_dir, tmp_path, monkeypatch):
    (tmp_path / "script.json").write_text('{"rules": [{"match": "x", "turns": ["y"]}]}')
    monkeypatch.chdir(tmp_path)
    with BuiltinServer(model_dir=tiny_model_dir, script=Path("script.json"), log_path=tmp_path / "log") as server:
        assert httpx.get(f"{server.url}/v1/script").json()["rule_count"] == 1
