"""GRPO on a laptop CPU, with the farm doing every rollout: the proof that the token ids, loss masks
and logprobs the farm serves are what a trainer needs.

Each step submits a batch (8 prompts x 8 samples) through ``farm.client``, trains on it and hands
the new weights to the backends: ``farm.learning`` holds the loop (``farm demo`` runs a few steps of
the same one).

The task ships with the farm: ``generate`` with ``match="charset"``, a shaped reward (the share of
the reply's characters that are vowels) that a random tiny model moves within minutes on 2 cores.

    python examples/grpo_cpu.py                     # an embedded farm of its own (Valkey, SQLite)
    python examples/grpo_cpu.py --steps 40 --out runs/grpo

It writes ``reward.png`` (mean reward per step) and ``metrics.jsonl`` in ``--out``, and ends with one
JSON line: ``reward_first``, ``reward_last``, ``steps``, ``seconds``, ``max_logprob_gap``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per batch (GRPO groups)")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--clip", type=float, default=0.2, help="PPO clip range of the importance ratio")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("grpo-run"))
    return parser.parse_args()


def plot(rewards: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.plot(range(len(rewards)), rewards, marker="o", markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.set_title("GRPO through the farm, tiny model on CPU")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    args = parse_args()
    from farm.client import FarmClient
    from farm.config import Settings
    from farm.embedded import EmbeddedStack
    from farm.learning import ClosedLoop, LoopOptions
    from farm.llm.builtin.tiny import make_tiny

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    policy_dir = out / "policy"
    if not (policy_dir / "config.json").is_file():
        make_tiny(policy_dir, seed=args.seed)
    settings = Settings(data_dir=out / "farm", llm={"builtin_model_dir": policy_dir})
    options = LoopOptions(
        steps=args.steps,
        prompts=args.prompts,
        group=args.group,
        max_tokens=args.max_tokens,
        lr=args.lr,
        clip=args.clip,
        seed=args.seed,
    )

    started = time.monotonic()
    with EmbeddedStack(settings, with_flower=False) as stack:
        token = stack.settings.api.token
        assert token is not None
        with (
            FarmClient(stack.settings.api_url, token=token.get_secret_value(), timeout_s=120) as farm,
            open(out / "metrics.jsonl", "w") as log,
        ):
            loop = ClosedLoop(farm, policy_dir=policy_dir, weights_dir=out / "weights", options=options)

            def report(step: dict[str, object]) -> None:
                log.write(json.dumps(step) + "\n")
                log.flush()
                print(
                    f"step {step['step']:3d}  reward {step['reward']:.3f}  loss {step['loss']:+.4f}  "
                    f"logprob gap {step['logprob_gap']:.1e}  versions {step['versions']}",
                    flush=True,
                )

            try:
                history = loop.run(report)
            except RuntimeError as exc:
                raise SystemExit(str(exc)) from None
    rewards = [float(h["reward"]) for h in history]
    plot(rewards, out / "reward.png")
    print(
        json.dumps(
            {
                "reward_first": rewards[0],
                "reward_last": rewards[-1],
                "steps": len(rewards),
                "seconds": round(time.monotonic() - started, 1),
                "max_logprob_gap": max(float(h["logprob_gap"]) for h in history),
                "plot": str(out / "reward.png"),
            }
        )
    )


if __name__ == "__main__":
    main()
