"""``code``: write a Python function; hidden unit tests score it in a fresh sandbox at EVAL.

With ``max_turns`` > 1 (default 4) the agent has bash and an editor in a sandbox to try its
code; it answers with a ```python block in a reply without a tool call (or writes
``solution.py`` in its workspace and calls ``submit``). The solution is the answer's code
block when it defines the entry point, else the workspace's ``solution.py``, else the block
anyway. EVAL never runs in the agent's sandbox: the solution, the hidden tests and the
harness go into a new one, so nothing the agent left behind can touch the tests.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from farm.agent.handler import AgentHandler, AgentState
from farm.agent.loop import Episode
from farm.agent.toolbox import system_prompt
from farm.errors import SandboxError
from farm.handlers.base import StageContext
from farm.sandbox.base import Sandbox, SandboxSpec
from farm.schemas import EvalResult, TrajectoryData
from tasks.code.dataset import CodeConfig
from tasks.code.grader import DEFAULT_PER_TEST_TIMEOUT_S, HARNESS_FILE, extract_code, prepare, score_report

SOLUTION_FILE = "solution.py"
REPORT_FILE = ".farm_report"
STDERR_FILE = ".farm_stderr"
SYSTEM = "You are an expert Python programmer."
SYSTEM_WITH_TOOLS = (
    "You are an expert Python programmer working in /workspace. Try your code with the tools, then reply "
    "without a tool call, giving the complete function in a ```python block."
)


def _defines(source: str, name: str) -> bool:
    return re.search(rf"^\s*(async\s+)?def\s+{re.escape(name)}\s*\(", source, re.MULTILINE) is not None


class CodeState(AgentState):
    """The solution RUN took (from the answer, or the file the agent wrote) for EVAL's hidden tests."""

    solution: str = ""
    #: "answer", or the file it was read from.
    solution_from: str | None = None


class CodeHandler(AgentHandler[CodeConfig, CodeState]):
    config_class = CodeConfig
    state_class = CodeState
    # The solution is kept in the job's state; the hidden tests run in a fresh sandbox.
    reverify_safe = True
    answer_in_text = True

    def sandbox_spec(self, config: CodeConfig) -> SandboxSpec | None:
        return SandboxSpec() if config.max_turns > 1 else None

    def messages(self, config: CodeConfig, state: CodeState, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        system = system_prompt(SYSTEM_WITH_TOOLS, specs) if specs else SYSTEM
        return [{"role": "system", "content": system}, {"role": "user", "content": config.resolve().instruction()}]

    def collect(
        self, config: CodeConfig, state: CodeState, sandbox: Sandbox | None, episode: Episode
    ) -> dict[str, Any]:
        entry = config.resolve().entry_point
        answer = extract_code(self.answer_text(CodeState(final_text=episode.final_text, submitted=episode.submitted)))
        if _defines(answer, entry) or sandbox is None:
            return {"solution": answer, "solution_from": "answer"}
        try:
            written = sandbox.get_file(SOLUTION_FILE).decode("utf-8", errors="replace")
        except SandboxError:
            return {"solution": answer, "solution_from": "answer"}
        return {"solution": written, "solution_from": SOLUTION_FILE}

    async def evaluate(
        self, config: CodeConfig, state: CodeState, trajectory: TrajectoryData, ctx: StageContext
    ) -> EvalResult:
        return await asyncio.to_thread(self._grade, config, state.solution, ctx)

    def _grade(self, config: CodeConfig, solution: str, ctx: StageContext) -> EvalResult:
        problem = config.resolve()
        with ctx.sandboxes.scratch_dir(prefix=f"job{ctx.job_id}-eval-") as dest:
            nonce = prepare(
                problem=problem, solution=solution, workdir=dest, per_test_timeout_s=DEFAULT_PER_TEST_TIMEOUT_S
            )
            (Path(dest) / ".nonce").write_text(nonce + "\n", encoding="utf-8")
            # The nonce file is opened and deleted before the candidate runs.
            command = (
                f"exec 3<.nonce; rm -f .nonce; exec python -I {HARNESS_FILE} <&3 3<&- >{REPORT_FILE} 2>{STDERR_FILE}"
            )
            result, files = self.run_fresh(
                ctx, dest, command, timeout_s=config.timeout_s, outputs=[REPORT_FILE, STDERR_FILE]
            )
        if result.exit_code in (126, 127):  # the shell found no python: the sandbox is broken, not the code
            raise SandboxError(f"the test harness could not run: {result.output[-500:]!r}", job_id=ctx.job_id)
        graded = score_report(
            problem=problem,
            stdout=files.get(REPORT_FILE, b"").decode("utf-8", errors="replace"),
            stderr=files.get(STDERR_FILE, b"").decode("utf-8", errors="replace")[-16_000:],
            nonce=nonce,
            mode=config.reward,
            timed_out=result.timed_out,
            timeout_s=config.timeout_s,
        )
        metrics = {
            "passed": float(graded.passed),
            "total": float(graded.total),
            "all_passed": float(graded.passed == graded.total),
        }
        return EvalResult(reward=graded.reward, metrics=metrics, info={"grade": graded.info()})
