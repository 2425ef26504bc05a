"""What a message too long for any context costs the proxy before its refusal: time and memory.

    python bench/long_prompt.py [--tokenizer DIR] [--sizes-mb 4,60] [--kinds prose,run] [--whole-up-to-mb 8]

Each case runs in a process of its own: the tiny model's tokenizer (or DIR's) renders one user
message of the given size through the proxy's ``Renderer`` (the chat template, then the ids) with
``proxy.max_prompt_tokens`` at its default. ``whole`` tokenizes it whole, as the proxy did before
the prompt was counted piece by piece; ``counted`` is the proxy now (``farm.llm.counting``), which
refuses it once the count passes the limit. Figures: seconds, the process's peak RSS growth over
the call (MB), the outcome; and ``counted``'s ratio to ``whole`` (same run, same machine).
``prose`` is words, spaces and newlines; ``run`` is one character repeated (no place a
pre-tokenizer splits). ``whole`` is measured only up to ``--whole-up-to-mb`` (a 60 MB message
tokenized whole takes minutes and ~12 GB here). The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import emit  # noqa: E402

WORDS = "the model wrote a tool call and the harness sent back what it ran ; def f ( x ) : return x + 1".split()


def _text(kind: str, chars: int) -> str:
    if kind == "run":
        return "x" * chars
    line = " ".join(WORDS) + "\n"
    return (line * (chars // len(line) + 1))[:chars]


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _case(tokenizer_dir: str, kind: str, mb: float, mode: str) -> dict[str, object]:
    """One measurement, in this (fresh) process."""
    from transformers import AutoTokenizer

    from farm.config import ProxySettings
    from farm.errors import ContextLengthExceeded
    from farm.proxy import bounds
    from farm.proxy.continuity import Renderer
    from farm.proxy.conversation import Message

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    settings = ProxySettings()
    bound = bounds.prompt_bound(bounds.longest_token_bytes(tokenizer), settings) if mode == "counted" else None
    renderer = Renderer(cast(Any, tokenizer), bound=bound)
    renderer.fresh([Message(role="user", content="warm up")], [])
    message = Message(role="user", content=_text(kind, int(mb * 1_000_000)))
    Path("/proc/self/clear_refs").write_text("5")  # the peak RSS from here on
    before = _rss_kb("VmRSS")
    start = time.perf_counter()
    try:
        outcome = f"{len(renderer.fresh([message], []))} ids"
    except ContextLengthExceeded as exc:
        outcome = f"refused: {str(exc)[:60]}..."
    seconds = time.perf_counter() - start
    return {"s": round(seconds, 3), "rss_mb": round((_rss_kb("VmHWM") - before) / 1024, 1), "outcome": outcome}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokenizer", default=None, help="a tokenizer folder (default: the tiny model's)")
    parser.add_argument("--sizes-mb", default="4,60")
    parser.add_argument("--kinds", default="prose,run")
    parser.add_argument("--whole-up-to-mb", type=float, default=8.0)
    parser.add_argument("--case", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(_case(args.case[0], args.case[1], float(args.case[2]), args.case[3])))
        return
    tokenizer_dir = args.tokenizer
    if tokenizer_dir is None:
        from farm.llm.builtin.tiny import make_tiny

        tokenizer_dir = str(make_tiny(Path(tempfile.mkdtemp(prefix="bench-long-prompt-"))))
    figures: dict[str, object] = {"tokenizer": tokenizer_dir}
    for kind in args.kinds.split(","):
        for mb in (float(s) for s in args.sizes_mb.split(",")):
            row: dict[str, dict[str, object]] = {}
            modes = ("whole", "counted") if mb <= args.whole_up_to_mb else ("counted",)
            for mode in modes:
                out = subprocess.run(
                    [sys.executable, __file__, "--case", tokenizer_dir, kind, str(mb), mode],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                row[mode] = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"{kind:5} {mb:5.0f} MB {mode:7}: {row[mode]}", flush=True)
            if "whole" not in row:
                figures[f"{kind}_{mb:g}mb"] = row
                continue
            whole, counted = row["whole"], row["counted"]
            ratio = {
                "time_ratio": round(float(str(counted["s"])) / max(float(str(whole["s"])), 1e-9), 4),
                "rss_ratio": round(float(str(counted["rss_mb"])) / max(float(str(whole["rss_mb"])), 0.1), 4),
            }
            print(f"{kind:5} {mb:5.0f} MB counted/whole: {ratio}", flush=True)
            figures[f"{kind}_{mb:g}mb"] = {**row, **ratio}
    emit(figures)


if __name__ == "__main__":
    main()
