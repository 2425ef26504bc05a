"""A trainer of harness runs: each rollout is a trial, an episode of a harness of your own (here a
two-turn chat through the openai SDK) behind the farm's proxy, read back token-exact as arrays.

For each of ``--trials`` trials: ``create_trial`` gives a key and a base URL, the harness talks to
it as to any OpenAI server, ``end_trial`` closes it, ``trial_record`` reads its segments, and a
reward of the harness's own (the share of vowels in its last reply) scores it. ``to_arrays`` makes
one row per segment; the advantages are group-relative, per trial, as GRPO takes them.

    python examples/harness_trials.py                        # an embedded farm of its own
    python examples/harness_trials.py --url http://farm:8700 --token ... [--proxy-url http://node:8710]

It ends with one JSON line: ``trials``, ``rows``, ``tokens``, ``sampled_tokens``, ``mean_reward``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

VOWELS = "aeiouAEIOU"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--url", help="a running farm's API (default: start an embedded one)")
    parser.add_argument("--token", help="the farm's API token (with --url)")
    parser.add_argument("--proxy-url", help="a `farm proxy` process to send the harness to")
    parser.add_argument("--out", type=Path, default=Path("runs/harness-trials"))
    return parser.parse_args()


@contextlib.contextmanager
def farm_api(args: argparse.Namespace) -> Iterator[tuple[str, str | None]]:
    """The API's URL and token: the one given, or an embedded farm's (Valkey, SQLite, tiny model)."""
    if args.url:
        yield args.url, args.token
        return
    from farm.config import Settings
    from farm.embedded import EmbeddedStack

    with EmbeddedStack(Settings(data_dir=args.out.resolve() / "farm"), with_flower=False) as stack:
        token = stack.settings.api.token
        yield stack.settings.api_url, token.get_secret_value() if token else None


def harness(base_url: str, key: str, model: str) -> str:
    """Any harness: it knows only an OpenAI base URL and a key. Returns its last reply."""
    import openai

    with openai.OpenAI(base_url=base_url, api_key=key) as llm:
        messages: list[Any] = [{"role": "user", "content": "Say a word made of vowels."}]
        first = llm.chat.completions.create(model=model, messages=messages, max_tokens=12)
        messages += [{"role": "assistant", "content": first.choices[0].message.content or ""}]
        messages += [{"role": "user", "content": "Another, longer."}]
        second = llm.chat.completions.create(model=model, messages=messages, max_tokens=12)
        return second.choices[0].message.content or ""


def main() -> None:
    args = parse_args()
    from farm.client import FarmClient, to_arrays

    with farm_api(args) as (url, token), FarmClient(url, token=token, proxy_url=args.proxy_url) as farm:
        segments: list[Any] = []
        owners: list[int] = []
        rewards: list[float] = []
        for i in range(args.trials):
            trial = farm.create_trial(sampling={"temperature": 1.0, "seed": i})
            reply = harness(trial.openai_base_url, trial.key, model="farm")
            farm.end_trial(trial.id)
            record = farm.trial_record(trial.id)
            if record.incomplete:  # a record that is not whole is not trainable
                continue
            segments += record.segment_tokens
            owners += [len(rewards)] * len(record.segment_tokens)
            rewards.append(sum(c in VOWELS for c in reply) / max(len(reply), 1))
    rows = to_arrays(segments, versions=True)
    scores = np.asarray(rewards, dtype=np.float32)
    advantages = ((scores - scores.mean()) / (scores.std() + 1e-6))[np.asarray(owners)]
    assert advantages.shape == (len(rows["input_ids"]),)
    summary = {
        "trials": len(rewards),
        "rows": int(rows["input_ids"].shape[0]),
        "tokens": int(rows["lengths"].sum()),
        "sampled_tokens": int(rows["loss_mask"].sum()),
        "mean_reward": round(float(scores.mean()), 4),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
