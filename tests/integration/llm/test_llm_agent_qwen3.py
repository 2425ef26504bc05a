"""The built-in agent loop against the built-in backend serving the qwen3 family's tiny model (real
tokenizer and template) in script mode: a turn with reasoning and a hermes call run by bash in a real
sandbox, a turn without a call, a submit. Under ``exact`` the episode is one sequence: each prompt the
backend got is its prefix, every sampled id and logprob is the backend's, and a teacher-forced pass
over the whole trajectory gives the same logprobs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.agent.loop import Budgets, run_episode
from farm.agent.toolbox import SandboxToolbox
from farm.config import ProxySettings, Settings
from farm.constants import Outcome
from farm.llm.builtin.testing import BuiltinServer
from farm.llm.client import VLLMClient
from farm.llm.trajectory import TrajectoryBuilder
from farm.llm.types import GenerateRequest, GenerateResult, SamplingParams
from farm.proxy.parsers import choose
from farm.sandbox.base import SandboxSpec
from farm.worker.sandboxes import SandboxResources
from tests.conftest import teacher_for
from tests.integration.sandbox.conftest import require_bwrap

TOLERANCE = 1e-4
WORD = "AGENTQWEN3"
TURNS = [
    '<think>\nlook first\n</think>\n\n<tool_call>\n{"name": "bash", "arguments": {"command": "echo hi"}}\n</tool_call>',
    "<think>\nit said hi\n</think>\n\nIt printed hi.",
    '<think>\ndone\n</think>\n\n<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>',
]


class Backend:
    """The loop's ``LLM`` over the built-in server; keeps what the backend answered."""

    def __init__(self, client: VLLMClient) -> None:
        self.client = client
        self.moves: list[tuple[str, str]] = []
        self.backend_id: str | None = "builtin"
        self.prompts: list[list[int]] = []
        self.results: list[GenerateResult] = []

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams | None = None) -> GenerateResult:
        self.prompts.append(list(prompt_ids))
        result = await self.client.generate(GenerateRequest(prompt_token_ids=prompt_ids, sampling=sampling))
        self.results.append(result)
        return result


# The model-family suite (--run-matrix, which .ci/run passes): the default suite keeps to its time.
pytestmark = pytest.mark.matrix


@pytest.fixture(scope="module")
def qwen3_server(
    family_model_dir: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BuiltinServer]:
    log = tmp_path_factory.mktemp("logs") / "qwen3-agent.log"
    script = {"rules": [{"match": WORD, "turns": TURNS}]}
    with BuiltinServer(model_dir=family_model_dir("qwen3"), log_path=log, script=script) as server:
        yield server


def test_agent_loop_on_qwen3_is_one_segment_with_the_backends_ids_and_logprobs(
    qwen3_server: BuiltinServer,
    family_model_dir: Callable[[str], Path],
    family_tokenizer: Callable[[str], Any],
    tmp_path: Path,
) -> None:
    require_bwrap()
    tok = family_tokenizer("qwen3")
    settings = Settings(data_dir=tmp_path / "data", sandbox={"root_dir": tmp_path / "sb", "tool_timeout_s": 30.0})
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    sandbox = SandboxResources(settings).create(SandboxSpec(workspace=workspace, label="qwen3 agent"))
    try:
        tools = SandboxToolbox(sandbox.tools(), ["bash"])
        builder = TrajectoryBuilder(
            tokenizer=tok,
            messages=[{"role": "user", "content": f"{WORD}: print hi"}],
            tools=[{"type": "function", "function": dict(spec)} for spec in tools.specs],
        )

        async def episode() -> tuple[Any, Backend]:
            async with VLLMClient(base_url=qwen3_server.url) as client:
                backend = Backend(client)
                done = await run_episode(
                    llm=backend,
                    builder=builder,
                    tools=tools,
                    sampling=SamplingParams(max_tokens=128, temperature=1.0, seed=0),
                    budgets=Budgets(max_turns=5),
                    parsers=choose(ProxySettings(), tok.chat_template),
                )
                return done, backend

        done, backend = asyncio.run(episode())
    finally:
        sandbox.close()

    assert done.outcome is Outcome.OK and done.turns == 3 and done.tool_calls == 1, done.reason
    assert "<tool_response>\nhi\n</tool_response>" in tok.decode(backend.prompts[1])
    assert builder.messages[1]["reasoning_content"].strip() == "look first"
    trajectory = done.trajectory
    assert trajectory.forks == []  # one segment, though Qwen3's template drops past reasoning
    spans = [span for span in trajectory.turns if span.kind == "model"]
    for span, prompt, result in zip(spans, backend.prompts, backend.results, strict=True):
        assert trajectory.token_ids[: span.start] == prompt
        assert trajectory.token_ids[span.start : span.end] == result.token_ids
        assert trajectory.logprobs[span.start : span.end] == result.logprobs
    texts = [tok.decode(result.token_ids[:-1], skip_special_tokens=False) for result in backend.results]
    assert texts == TURNS
    forced = teacher_for(family_model_dir("qwen3"))(trajectory.token_ids)
    worst = max(abs(trajectory.logprobs[i] - forced[i]) for i, mask in enumerate(trajectory.loss_mask) if mask)
    assert worst <= TOLERANCE
