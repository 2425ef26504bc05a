"""Harbor task directories (instruction.md, task.toml, environment/, tests/test.sh) and their verifier."""

from __future__ import annotations

from farm.errors import VerifierError
from tasks.harbor.dataset import HarborConfig, list_examples, sample_configs
from tasks.harbor.task import HarborTask, HarborTaskConfig, load_dataset, load_task
from tasks.harbor.verifier import VerifierResult, read_reward, run_verifier, seed_workdir

__all__ = [
    "HarborConfig",
    "HarborTask",
    "HarborTaskConfig",
    "VerifierError",
    "VerifierResult",
    "list_examples",
    "load_dataset",
    "load_task",
    "read_reward",
    "run_verifier",
    "sample_configs",
    "seed_workdir",
]
