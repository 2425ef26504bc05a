"""The farm's tool-call and reasoning parsers read every model output of ``parser_cases`` as vLLM's do.

Opt-in (``--run-vllm``; build the environment with ``scripts/setup_vllm.sh``): vLLM's own parsers run
in vLLM's environment (``vllm_parsers_probe.py``) on the same texts, with the farm's tiny tokenizer
given every format's special tokens. Calls are compared by name and arguments (as parsed JSON),
reasoning and answer text as strings; the sampled answers (``parser_samples``) too. A case where
the farm reads the text otherwise (on purpose, or where vLLM has a bug) says so (``ToolCase.vllm``)
and must differ in exactly that way. Run with ``-s`` to see the tally per format.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from tests.unit.proxy.parser_cases import TOOL_CASES
from tests.unit.proxy.parser_samples import SAMPLES
from tests.unit.proxy.reasoning_cases import REASONING_CASES
from tests.unit.proxy.test_reasoning_formats import answer_text, split
from tests.unit.proxy.test_toolparse_formats import calls_and_prose, parse

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[3]
VENV = Path(os.environ.get("FARM_VLLM_VENV", REPO / ".venv-vllm"))
PROBE = Path(__file__).with_name("vllm_parsers_probe.py")


def run_probe(tokenizer_dir: Path, cases: list[dict]) -> list[dict]:
    python = VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no vLLM environment at {VENV}: run scripts/setup_vllm.sh")
    job = json.dumps({"tokenizer_dir": str(tokenizer_dir), "cases": cases})
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([str(python), str(PROBE)], input=job, capture_output=True, text=True, env=env, timeout=500)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


def test_parsers_agree_with_vllms_on_every_case(tiny_model_dir: Path) -> None:
    tool_jobs = [
        {"kind": "tool", "parser": c.parser, "text": c.text, "tools": c.tools, "mistral_v11": c.mistral_v11}
        for c in TOOL_CASES + SAMPLES
    ]
    reasoning_jobs = [
        {"kind": "reasoning", "parser": c.parser, "text": c.text, "thinking": c.thinking} for c in REASONING_CASES
    ]
    results = run_probe(tiny_model_dir, tool_jobs + reasoning_jobs)
    tool_results, reasoning_results = results[: len(tool_jobs)], results[len(tool_jobs) :]

    tally: Counter[tuple[str, str, str]] = Counter()
    unexpected: list[str] = []
    for case, got in zip(TOOL_CASES + SAMPLES, tool_results, strict=True):
        farm = [list(call) for call in calls_and_prose(parse(case, [case.text]))[0]]
        vllm = [[c["name"], c["arguments"]] for c in got.get("calls", [])] if "error" not in got else got
        expected = [list(call) for call in case.vllm[0]] if case.vllm else farm
        outcome = "documented difference" if case.vllm else "agree"
        if vllm != expected:
            unexpected.append(f"{case.parser}:{case.name}: farm {farm}, vLLM {vllm}")
            outcome = "DISAGREE"
        kind = "sampled" if case.name.startswith("sample") else "tool calls"
        tally[(kind, case.parser, outcome)] += 1
    for rcase, got in zip(REASONING_CASES, reasoning_results, strict=True):
        reasoning, content = split(rcase, [rcase.text])
        farm_split = {"reasoning": reasoning, "content": answer_text(rcase, content)}
        expected_split = {"reasoning": rcase.vllm[0], "content": rcase.vllm[1]} if rcase.vllm else farm_split
        outcome = "documented difference" if rcase.vllm else "agree"
        if got != expected_split:
            outcome = "DISAGREE"
            unexpected.append(f"{rcase.parser}:{rcase.name}: farm {farm_split}, vLLM {got}")
        tally[("reasoning", rcase.parser, outcome)] += 1

    print("\nparser agreement with vLLM (cases per format and outcome):")
    for (kind, parser, outcome), count in sorted(tally.items()):
        print(f"  {kind:10s} {parser:14s} {outcome:22s} {count}")
    assert not unexpected, "\n".join(unexpected)
