"""Token fidelity per model family: the family matrix's conversations, one line per family.

    python bench/fidelity.py [--families qwen3,llama3] [--formats chat,responses,anthropic]

For each family (``farm.llm.families``; its tiny model built from the families cache, which
``scripts/setup_families.sh`` fills) one embedded farm whose built-in backend is scripted with the
family's conversation (``farm.testing.family_matrix``: reasoning and a tool call in the family's own
format, the tool's result, a user turn), driven through the proxy by the real ``openai`` and
``anthropic`` SDKs on every format, streamed and not, under both history policies. Per family:
the model tokens checked, drifted tokens (a recorded id that is not the script's), the largest
difference between a recorded logprob and a teacher-forced recompute (plain transformers forward
pass), segments per conversation under ``exact`` and under ``template``, and whether every SDK read
the reasoning and tool calls as scripted. The bars: drift 0, max difference < 1e-4, ``exact`` one
segment. The last lines are JSON, one per family.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from bench._common import emit, flushed_redis, free_port, fresh_database  # noqa: E402
from farm.config import Settings  # noqa: E402
from farm.embedded import EmbeddedStack  # noqa: E402
from farm.llm.builtin.script import template_markers  # noqa: E402
from farm.llm.families import DEFAULT_CACHE_DIR, FAMILIES  # noqa: E402
from farm.testing.family_matrix import (  # noqa: E402
    FORMATS,
    Fidelity,
    check_record,
    converse,
    plan_for,
    read_problems,
    teacher_logprobs,
)

HISTORIES = ("exact", "template")


def _settings(data_dir: Path, *, redis_url: str, database_url: str, model_dir: Path, script: Path) -> Settings:
    return Settings(
        data_dir=data_dir,
        redis={"url": redis_url},
        database={"url": database_url},
        api={"token": "bench", "port": free_port()},
        llm={"builtin_port": free_port(), "builtin_model_dir": model_dir, "builtin_script": script},
        proxy={"port": free_port()},
        worker={"node": "bench"},
    )


def run_family(family: str, formats: list[str], work: Path, redis_url: str) -> dict[str, Any]:
    import json

    from transformers import AutoTokenizer, GenerationConfig

    from farm.llm.builtin.tiny import make_tiny

    model_dir = make_tiny(work / f"model-{family}", family=family, families_dir=DEFAULT_CACHE_DIR)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    stop_ids = frozenset(eos if isinstance(eos, list) else [eos])
    plan = plan_for(family, tokenizer, stop_ids)
    markers = template_markers(tokenizer, stop_ids)
    assert markers is not None
    script = work / f"script-{family}.json"
    script.write_text(json.dumps(plan.script()))
    teacher = teacher_logprobs(model_dir)
    totals = Fidelity()
    segments: dict[str, list[int]] = {h: [] for h in HISTORIES}
    problems: list[str] = []
    start = time.perf_counter()
    with fresh_database() as database_url:
        settings = _settings(
            work / f"farm-{family}", redis_url=redis_url, database_url=database_url, model_dir=model_dir, script=script
        )
        stack = EmbeddedStack(settings, with_flower=False, with_llm=True, stages=())
        stack.start()
        try:
            with httpx.Client(base_url=settings.api_url, headers={"Authorization": "Bearer bench"}, timeout=120) as api:
                for fmt in formats:
                    for streamed in (False, True):
                        for history in HISTORIES:
                            trial = api.post("/v1/trials", json={"history": history}).json()
                            reads = converse(fmt, streamed, plan, trial)
                            problems += [
                                f"{fmt}/{streamed}/{history} {p}" for p in read_problems(plan, reads, tokenizer)
                            ]
                            api.post(f"/v1/trials/{trial['id']}/end")
                            record = api.get(f"/v1/trials/{trial['id']}/record").json()
                            fidelity = check_record(record, plan, tokenizer, markers[2], teacher)
                            segments[history].append(fidelity.segments)
                            totals.add(fidelity)
        finally:
            stack.stop()
    return {
        "family": family,
        "tool_parser": FAMILIES[family].tool_call_parser,
        "reasoning_parser": FAMILIES[family].reasoning_parser,
        "thinks": plan.thinks,
        "calls_tools": plan.calls_tools,
        "conversations": sum(len(v) for v in segments.values()),
        "tokens_checked": totals.tokens,
        "drifted_tokens": totals.drifted,
        "max_logprob_diff": totals.max_logprob_diff,
        "segments_exact": sorted(set(segments["exact"])),
        "segments_template": sorted(set(segments["template"])),
        "sdk_read_problems": len(problems),
        "problems": problems[:5],
        "seconds": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--formats", default=",".join(FORMATS))
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="farm-fidelity-") as tmp, flushed_redis() as redis_url:
        for family in args.families.split(","):
            line = run_family(family, args.formats.split(","), Path(tmp), redis_url)
            results.append(line)
            print(
                f"{family:12} tokens {line['tokens_checked']:5}  max |dlogprob| {line['max_logprob_diff']:.2e}  "
                f"drifted {line['drifted_tokens']}  segments exact {line['segments_exact']} "
                f"template {line['segments_template']}  SDK problems {line['sdk_read_problems']}  "
                f"({line['conversations']} conversations, {line['seconds']} s)",
                flush=True,
            )
    for line in results:
        emit(line)


if __name__ == "__main__":
    main()
