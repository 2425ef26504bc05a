"""TRL's AsyncGRPOTrainer on a laptop CPU, with the farm as its rollout worker and weight transfer.

The trainer is TRL's own (``trl.experimental.async_grpo``, 1.16): its loss, prefix-trie packing,
batcher, AdamW and weight-sync schedule. The farm replaces its vLLM rollout worker and NCCL weight
transfer (``farm.bridges.trl``): every rollout runs in the farm on the built-in backend, and after each
optimizer step the weights go to the backends as a checkpoint (pause, load, resume at the next version).
``farm.bridges.trl_cpu.enable_cpu_training`` supplies the two pieces of TRL that assume CUDA (its
docstring says which and why).

Same task and shape as ``examples/grpo_cpu.py``: ``generate`` with ``match="charset"`` (the share of
the reply's characters that are vowels), 8 prompts x 8 samples per step, lr 3e-3, clip 0.2, no
gradient clipping. Every trained token's logprob as TRL's forward recomputes it (read off the
trainer's own forward, on samples it takes fresh) is checked against the farm's.

    python examples/trl_grpo_cpu.py                     # an embedded farm of its own (Valkey, SQLite)
    python examples/trl_grpo_cpu.py --steps 40 --max-staleness 1 --out runs/trl

It ends with one JSON line: ``reward_first``, ``reward_last``, ``steps``, ``seconds``,
``max_logprob_gap``, and the ledger: ``samples_lost``, ``samples_duplicated``, ``weight_updates``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

PROMPT = "Answer with vowels only (a, e, i, o, u). Prompt number {i}."
#: a rollout's logprob as the trainer recomputes it may differ from the backend's by float noise only.
LOGPROB_TOLERANCE = 1e-3


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (GRPO groups)")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--clip", type=float, default=0.2)
    parser.add_argument("--max-staleness", type=int, default=0, help="TRL's and the farm's (0: every step on-policy)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("trl-grpo-run"))
    return parser.parse_args()


def dataset_rows(n: int) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        messages = [{"role": "user", "content": PROMPT.format(i=i)}]
        task = {"type": "generate", "config": {"messages": messages, "reference": "aeiou", "match": "charset"}}
        rows.append({"prompt": messages, "farm_task": json.dumps(task)})
    return rows


class GapProbe:
    """Every trained token's logprob, recomputed by the trainer's own model on the trainer's own packed
    micro-batch (TRL's tree packing, its fused log-prob head) with the weights that sampled it, against
    the farm's ``old_log_probs``.

    With the weights that sampled it, not the current ones: TRL's data loader (accelerate's dispatcher)
    reads one micro-batch ahead, so from the second step on a batch is trained one version after it
    was sampled, even at ``max_staleness=0`` (TRL checks staleness when it dequeues). The weights of
    each version are kept as the trainer sends them; each micro-batch's version is the one its samples
    carried when the trainer took them (``worker.ledger.kept_versions``, in the order it took them)."""

    def __init__(self, trainer: Any, worker: Any, samples_per_batch: int) -> None:
        self.trainer, self.worker, self.samples_per_batch = trainer, worker, samples_per_batch
        self.max_gap, self.batches, self.tokens, self.mixed_batches = 0.0, 0, 0, 0
        self.snapshots: dict[int, dict[str, Any]] = {}
        inner_send, inner_loss = trainer.weight_transfer.send_weights, trainer.compute_loss

        def send_weights(iterator: Any) -> None:
            kept: dict[str, Any] = {}

            def tee() -> Any:
                for name, tensor in iterator:
                    kept[name] = tensor.detach().clone()
                    yield name, tensor

            inner_send(tee())
            self.snapshots[trainer.model_version + 1] = kept  # the version this sync makes live

        def compute_loss(model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            self._check(model, inputs)
            return inner_loss(model, inputs, *args, **kwargs)

        trainer.weight_transfer.send_weights = send_weights
        trainer.compute_loss = compute_loss

    def _check(self, model: Any, inputs: dict[str, Any]) -> None:
        import torch

        start = self.batches * self.samples_per_batch
        versions = set(self.worker.ledger.kept_versions[start : start + self.samples_per_batch])
        self.batches += 1
        if len(versions) != 1:
            self.mixed_batches += 1  # samples of several versions in one packed row: not checked here
            return
        # TRL's compute_loss drops the rows' padding, then forwards the packed row with its tree layout.
        real = inputs["attention_mask"].bool()
        picked = inputs["token_index"] >= 0
        tree = {
            key: inputs[key][inputs[key] >= 0] for key in ("tree_kv_index", "tree_cu_seqlens_q", "tree_cu_seqlens_k")
        }
        tree["tree_max_seqlen_q"], tree["tree_max_seqlen_k"] = inputs["tree_max_seqlens"][0].tolist()
        with torch.no_grad():
            out = torch.func.functional_call(
                model,
                self.snapshots[versions.pop()],
                args=(),
                kwargs={
                    "input_ids": inputs["input_ids"][real][None],
                    "position_ids": inputs["position_ids"][real][None],
                    "shift_labels": inputs["shift_labels"][real][None],
                    "fused_lm_head": True,
                    **tree,
                },
                strict=False,
            )
        recomputed = out.log_probs.flatten()[inputs["token_index"][picked]]
        gaps = (recomputed - inputs["old_log_probs"][picked]).abs()
        self.tokens += int(gaps.numel())
        self.max_gap = max(self.max_gap, float(gaps.max()))


def main() -> None:
    args = parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    warnings.filterwarnings("ignore", category=FutureWarning)
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    from farm.bridges.trl import FarmRolloutWorker, FarmWeightTransfer
    from farm.bridges.trl_cpu import enable_cpu_training
    from farm.config import Settings
    from farm.embedded import EmbeddedStack
    from farm.llm.builtin.tiny import make_tiny

    enable_cpu_training()
    torch.manual_seed(args.seed)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    policy_dir = out / "policy"
    if not (policy_dir / "config.json").is_file():
        make_tiny(policy_dir, seed=args.seed)
    shutil.rmtree(out / "weights", ignore_errors=True)
    rows = dataset_rows(args.prompts)
    samples_per_step = args.prompts * args.group
    config = AsyncGRPOConfig(
        output_dir=str(out / "trainer"),
        max_steps=args.steps,
        learning_rate=args.lr,
        epsilon=args.clip,
        max_grad_norm=0.0,  # as grpo_cpu.py: no gradient clipping
        num_generations=args.group,
        per_device_train_batch_size=samples_per_step,
        token_budget=0,  # a fixed count of samples per step, as grpo_cpu.py
        max_completion_length=args.max_tokens,
        max_staleness=args.max_staleness,
        use_cpu=True,
        bf16=False,  # TRL's default is bf16 autocast; the backend samples in float32, as the trainer must recompute
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        seed=args.seed,
        disable_tqdm=True,
    )
    history: list[dict[str, Any]] = []
    started = time.monotonic()

    class Record(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            logs = kwargs.get("logs")
            if logs and "reward" in logs:
                record = {"step": state.global_step, "seconds": round(time.monotonic() - started, 2), **logs}
                history.append(record)
                print(
                    f"step {state.global_step:3d}  reward {logs['reward']:.3f}  loss {logs.get('loss', 0):+.4f}  "
                    f"staleness {logs.get('sample/staleness_max', 0):.0f}",
                    flush=True,
                )

    settings = Settings(data_dir=out / "farm", llm={"builtin_model_dir": policy_dir})
    with EmbeddedStack(settings, with_flower=False) as stack:
        token = stack.settings.api.token
        assert token is not None
        url, secret = stack.settings.api_url, token.get_secret_value()
        worker = FarmRolloutWorker(
            url,
            token=secret,
            dataset=rows,
            num_generations=args.group,
            samples_per_step=samples_per_step,
            max_staleness=args.max_staleness,
            sampling={"temperature": 1.0, "max_tokens": args.max_tokens, "seed": args.seed},
        )
        transfer = FarmWeightTransfer(url, token=secret, model_dir=policy_dir, checkpoint_dir=out / "weights")
        trainer = AsyncGRPOTrainer(
            model=str(policy_dir),
            args=config,
            train_dataset=Dataset.from_list(rows),
            callbacks=[Record()],
            rollout_worker=worker,
            weight_transfer=transfer,
        )
        probe = GapProbe(trainer, worker, samples_per_step)
        trainer.train()
        ledger = worker.ledger
        buffered, taken = worker.rollout_buffer.qsize(), worker.rollout_buffer.taken
    with open(out / "metrics.jsonl", "w") as log:
        for record in history:
            log.write(json.dumps(record) + "\n")
    rewards = [h["reward"] for h in history]
    summary = {
        "reward_first": rewards[0],
        "reward_last": rewards[-1],
        "steps": len(rewards),
        "seconds": round(time.monotonic() - started, 1),
        "max_logprob_gap": probe.max_gap,
        "max_staleness": args.max_staleness,
        "weight_updates": transfer.updates,
        # every job the farm finished was seen once and made its samples once; the trainer took or
        # left buffered every sample made (TRL drops stale ones it takes: counted, never silently).
        "samples_lost": ledger.lost(taken=taken, buffered=buffered),
        "samples_duplicated": ledger.duplicated(),
        "taken_stale": ledger.taken_stale,
        "failed_jobs": ledger.failed_jobs,
    }
    summary["checked_tokens"], summary["unchecked_batches"] = probe.tokens, probe.mixed_batches
    if probe.max_gap > LOGPROB_TOLERANCE:
        raise SystemExit(f"recomputed logprobs differ from the farm's by {probe.max_gap}: {json.dumps(summary)}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
