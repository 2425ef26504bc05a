"""A closed RL loop on CPU through the farm: GRPO on the tiny model, every rollout done by the farm.

Each step submits a batch (``prompts`` x ``group``) of the shipped ``generate`` task with a shaped
reward (the share of the reply's characters that are vowels, ``match="charset"``), turns the
trajectories into padded arrays with ``to_arrays``, recomputes the policy's logprobs of the sampled
tokens and checks them against the ones the farm recorded (the importance ratio starts at 1), takes
one clipped policy-gradient step with group-relative advantages, saves the weights and hands them to
the backends (pause in mode ``keep``, load, resume at the next version). Batches ask for
``max_staleness=0``: every rollout is sampled by the weights of the step that uses it.

Used by ``farm demo`` (a few steps, to show a reward move) and ``examples/grpo_cpu.py`` (a run).
Needs torch and transformers (the farm's full install).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from farm.client import FarmClient, JobResult

PROMPT = "Answer with vowels only (a, e, i, o, u). Prompt number {i}."
#: a rollout's logprob as the trainer recomputes it may differ from the backend's by float noise only.
LOGPROB_TOLERANCE = 1e-3


@dataclass(frozen=True)
class LoopOptions:
    """How a closed loop runs; the defaults move the tiny model's reward within a few steps."""

    steps: int = 30
    prompts: int = 8
    group: int = 8
    max_tokens: int = 16
    lr: float = 3e-3
    clip: float = 0.2
    seed: int = 0


def vowel_tasks(n: int) -> list[dict[str, Any]]:
    """``n`` prompts of the vowels task (its reward: the share of the reply that is vowels)."""
    return [
        {
            "type": "generate",
            "config": {
                "messages": [{"role": "user", "content": PROMPT.format(i=i)}],
                "reference": "aeiou",
                "match": "charset",
            },
        }
        for i in range(n)
    ]


def grpo_step(policy: Any, optimizer: Any, results: list[JobResult], *, clip: float) -> dict[str, Any]:
    """One clipped policy-gradient step on a batch's trajectories; returns what it measured.

    Raises:
        ValueError: a result has no trajectory."""
    import torch

    from farm.client import to_arrays

    trajectories = [r.trajectory for r in results if r.trajectory is not None]
    if len(trajectories) != len(results):
        raise ValueError("every rollout of the batch needs its trajectory (a group's rows line up with them)")
    arrays = to_arrays(trajectories, pad_side="right", dtype=np.int64, versions=True)
    ids = torch.from_numpy(arrays["input_ids"])
    attention = torch.from_numpy(arrays["attention_mask"])
    mask = torch.from_numpy(arrays["loss_mask"]).float()[:, 1:]
    old = torch.from_numpy(arrays["old_logprobs"])[:, 1:]
    rewards = torch.from_numpy(arrays["rewards"])
    # Group-relative advantages: each rollout against the other samples of its prompt.
    groups: dict[int, list[int]] = {}
    for row, result in enumerate(results):
        groups.setdefault(result.job.group_id, []).append(row)
    advantages = torch.zeros(len(results))
    for rows in groups.values():
        r = rewards[rows]
        advantages[rows] = (r - r.mean()) / (r.std() + 1e-4)

    logits = policy(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
    new = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    gap = float(((new - old).abs() * mask).max().detach())
    ratio = torch.exp((new - old) * mask)
    adv = advantages[:, None]
    objective = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv)
    loss = -(objective * mask).sum() / mask.sum()
    optimizer.zero_grad()
    loss.backward()  # type: ignore[no-untyped-call]
    optimizer.step()
    versions = np.asarray(arrays["weight_versions"])
    return {
        "loss": float(loss.detach()),
        "reward": float(rewards.mean()),
        "logprob_gap": gap,
        "sampled_tokens": float(mask.sum()),
        "versions": sorted({int(v) for v in np.unique(versions) if v >= 0}),
    }


class ClosedLoop:
    """GRPO through a running farm whose backends serve the weights in ``policy_dir``."""

    def __init__(self, farm: FarmClient, *, policy_dir: Path, weights_dir: Path, options: LoopOptions) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.manual_seed(options.seed)
        self.farm = farm
        self.options = options
        self.weights_dir = weights_dir
        self.policy = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=options.lr)
        self.version = farm.weights().version
        self.started = time.monotonic()

    def rollouts(self, step: int) -> list[JobResult]:
        """One batch sampled by the weights the backends serve now.

        Raises:
            RuntimeError: a rollout failed (the loop trains on whole groups only)."""
        o = self.options
        sampling = {"temperature": 1.0, "max_tokens": o.max_tokens, "seed": o.seed * 1000 + step}
        batch = self.farm.submit(vowel_tasks(o.prompts), group_size=o.group, sampling=sampling, max_staleness=0)
        results = list(self.farm.results(batch.id))
        if failed := [r for r in results if r.trajectory is None]:
            raise RuntimeError(f"step {step}: {len(failed)} rollouts failed: {failed[0].job.reason}")
        return results

    def step(self, step: int) -> dict[str, Any]:
        """Sample a batch, train on it, and serve the new weights; returns the step's figures.

        Raises:
            RuntimeError: a rollout failed, or the recomputed logprobs differ from the farm's."""
        figures = grpo_step(self.policy, self.optimizer, self.rollouts(step), clip=self.options.clip)
        if figures["logprob_gap"] > LOGPROB_TOLERANCE:
            raise RuntimeError(f"step {step}: recomputed logprobs differ from the farm's by {figures['logprob_gap']}")
        target = self.weights_dir / f"v{self.version + 1}"
        self.policy.save_pretrained(target, safe_serialization=True)
        update = self.farm.pause(mode="keep")
        self.farm.load_weights(update.id, path=target, version=self.version + 1)
        self.farm.resume(update.id)
        shutil.rmtree(self.weights_dir / f"v{self.version}", ignore_errors=True)
        self.version += 1
        return {"step": step, "seconds": round(time.monotonic() - self.started, 2), **figures}

    def run(self, on_step: Callable[[dict[str, Any]], None] = lambda _: None) -> list[dict[str, Any]]:
        """Every step of the options; ``on_step`` sees each step's figures as it ends."""
        history = []
        for i in range(self.options.steps):
            history.append(figures := self.step(i))
            on_step(figures)
        return history

    def mean_reward(self, step: int) -> float:
        """The mean reward of one batch sampled by the weights served now (no training)."""
        rewards = [r.trajectory.reward or 0.0 for r in self.rollouts(step) if r.trajectory is not None]
        return float(np.mean(rewards))
