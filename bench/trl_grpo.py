"""TRL's AsyncGRPOTrainer through the farm against the hand-written GRPO loop, in the same run.

Runs ``examples/grpo_cpu.py`` (the baseline) and then ``examples/trl_grpo_cpu.py`` with the same
steps, prompts, group size, tokens, learning rate and seed, each with an embedded farm of its own,
and prints both JSON lines and the ratios: seconds per step (TRL / baseline) and reward gain
(last - first) of each.

    python bench/trl_grpo.py --steps 30
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def run(example: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    command = [sys.executable, str(REPO / "examples" / example), "--out", str(out)]
    command += ["--steps", str(args.steps), "--prompts", str(args.prompts), "--group", str(args.group)]
    command += ["--max-tokens", str(args.max_tokens), "--seed", str(args.seed)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{example} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trl-bench-") as tmp:
        base = run("grpo_cpu.py", args, Path(tmp) / "grpo")
        trl = run("trl_grpo_cpu.py", args, Path(tmp) / "trl")
    print(json.dumps({"grpo_cpu": base}))
    print(json.dumps({"trl_grpo_cpu": trl}))
    per_step = (trl["seconds"] / trl["steps"]) / (base["seconds"] / base["steps"])
    print(
        json.dumps(
            {
                "steps": args.steps,
                "seconds_per_step_grpo": round(base["seconds"] / base["steps"], 2),
                "seconds_per_step_trl": round(trl["seconds"] / trl["steps"], 2),
                "seconds_per_step_ratio": round(per_step, 3),
                "reward_gain_grpo": round(base["reward_last"] - base["reward_first"], 4),
                "reward_gain_trl": round(trl["reward_last"] - trl["reward_first"], 4),
                "max_logprob_gap_trl": trl["max_logprob_gap"],
                "samples_lost": trl["samples_lost"],
                "samples_duplicated": trl["samples_duplicated"],
            }
        )
    )


if __name__ == "__main__":
    main()
