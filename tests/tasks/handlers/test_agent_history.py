"""An agent handler on the qwen3 family (its real tokenizer and template, which drops past reasoning
once a user turn follows): the batch's history policy decides the segments, and RUN hands every one
on (the main segment's arrays, the others in ``TrajectoryData.segments``). Real sandbox and bash; the
model is scripted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import BaseModel

from farm.agent.handler import AgentHandler, AgentState
from farm.agent.toolbox import system_prompt
from farm.constants import Outcome
from farm.handlers.base import StageContext
from farm.schemas import EvalResult, TrajectoryData
from farm.testing import run_stages
from farm.worker.sandboxes import SandboxResources

CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "echo hi"}}\n</tool_call>'
TURNS = [
    f"<think>\nrun it\n</think>\n\n{CALL}",
    "<think>\nit said hi\n</think>\n\nIt printed hi.",  # no call: the loop answers with a user turn
    '<think>\nsubmit\n</think>\n\n<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>',
]


class BashConfig(BaseModel):
    task: str = "print hi"


class BashHandler(AgentHandler[BashConfig, AgentState]):
    config_class: ClassVar[type[BaseModel]] = BashConfig

    def tool_names(self, config: BashConfig) -> list[str]:
        return ["bash"]

    def messages(self, config: BashConfig, state: AgentState, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": system_prompt("Use bash.", specs)},
            {"role": "user", "content": config.task},
        ]

    async def evaluate(
        self, config: BashConfig, state: AgentState, trajectory: TrajectoryData, ctx: StageContext
    ) -> EvalResult:
        return EvalResult(reward=1.0)


def _model_ids(segment: Any) -> list[int]:
    return [t for t, mask in zip(segment.token_ids, segment.loss_mask, strict=True) if mask]


def test_agent_handler_hands_on_every_segment(
    family_tokenizer: Callable[[str], Any], sandboxes: SandboxResources
) -> None:
    tok = family_tokenizer("qwen3")
    sampled = [t for text in TURNS for t in [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]]
    runs = {
        history: run_stages(BashHandler(), {}, TURNS, sandboxes=sandboxes, tokenizer=tok, history=history)
        for history in ("exact", "template")
    }
    for run in runs.values():
        assert run.run.outcome is Outcome.OK, run.run.reason
        # Qwen3's template describes the tools: the system prompt is the intro alone.
        first = tok.decode(run.llm.prompts[0])
        assert "<tools>" in first and "To use a tool" not in first
        assert "<tool_response>\nhi\n</tool_response>" in tok.decode(run.llm.prompts[1])
    exact = runs["exact"].run.trajectory
    assert exact.segments == [] and exact.info["forks"] == 0
    assert _model_ids(exact) == sampled
    template = runs["template"].run.trajectory
    # The user turn made the template drop the earlier reasoning: the first two turns are a segment of
    # their own, the main one holds the last turn; together they hold every sampled id.
    assert len(template.segments) == 1 and template.info["forks"] == 1
    assert [*_model_ids(template.segments[0]), *_model_ids(template)] == sampled
    assert template.token_ids[: len(runs["template"].llm.prompts[2])] == runs["template"].llm.prompts[2]
