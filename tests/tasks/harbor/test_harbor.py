from __future__ import annotations

import shutil
import subprocess

import pytest

from farm.errors import InvalidSpec, VerifierError
from farm.handlers.base import validate_config
from tasks.harbor.dataset import EXAMPLES_DIR, HarborConfig, list_examples, sample_configs
from tasks.harbor.task import load_dataset, load_task
from tasks.harbor.verifier import read_reward, run_verifier, seed_workdir


def copy_example(tmp_path, name):
    return shutil.copytree(EXAMPLES_DIR / name, tmp_path / name)


def verify(tmp_path, task, *, solve, **kwargs):
    workdir = tmp_path / "work"
    seed_workdir(task, workdir)
    if solve:
        subprocess.run(["bash", str(task.solution_script)], cwd=workdir, check=True)
    return run_verifier(task, workdir=workdir, scratch_dir=tmp_path / "scratch", **kwargs)


def test_load_task_reads_limits_and_metadata():
    task = load_task(EXAMPLES_DIR / "hello-file")
    assert task.name == "hello-file" and "Hello, farm!" in task.instruction
    assert task.config.schema_version == "1.0"  # read from the old `version` key
    assert task.config.verifier.timeout_sec == 30.0 and task.config.agent.timeout_sec == 120.0
    assert (task.config.environment.cpus, task.config.environment.memory_mb) == (1, 512)
    assert task.config.metadata["difficulty"] == "easy"
    assert task.dockerfile is not None and task.solution_script is not None


def test_load_task_newer_schema_and_old_size_spellings():
    task = load_task(EXAMPLES_DIR / "fix-count-lines")
    assert task.name == "rollout-farm/fix-count-lines" and task.config.schema_version == "1.1"
    env = task.config.environment
    assert (env.memory_mb, env.storage_mb, env.allow_internet) == (512, 1024, False)
    assert task.config.verifier.env == {"LC_ALL": "C"}


def test_load_task_keeps_unknown_keys(tmp_path):
    task_dir = copy_example(tmp_path, "hello-file")
    toml = task_dir / "task.toml"
    toml.write_text(toml.read_text() + "\n[agent.extra]\nx = 1\n\n[solution]\nenv = {}\n")
    assert load_task(task_dir).config.unknown_keys == ["AgentConfig.extra", "HarborTaskConfig.solution"]


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda d: (d / "instruction.md").unlink(), "instruction.md is missing"),
        (lambda d: (d / "tests" / "test.sh").unlink(), "tests/test.sh is missing"),
        (lambda d: (d / "task.toml").write_text("[verifier\n"), "not valid TOML"),
        (lambda d: (d / "task.toml").write_text("[environment]\ncpus = -1\n"), "environment.cpus"),
        (lambda d: (d / "task.toml").write_text("[verifier]\ntimeout_sec = 'soon'\n"), "verifier.timeout_sec"),
    ],
)
def test_load_task_errors_say_what_is_wrong(tmp_path, breakage, message):
    task_dir = copy_example(tmp_path, "hello-file")
    breakage(task_dir)
    with pytest.raises(InvalidSpec, match=message):
        load_task(task_dir)


def test_load_dataset_finds_examples():
    assert [t.path.name for t in load_dataset(EXAMPLES_DIR)] == list_examples() == ["fix-count-lines", "hello-file"]


@pytest.mark.parametrize(("name", "unsolved"), [("hello-file", 0.0), ("fix-count-lines", 0.0)])
def test_run_verifier_unsolved_task_scores_low(tmp_path, name, unsolved):
    result = verify(tmp_path, load_task(EXAMPLES_DIR / name), solve=False)
    assert result.reward == unsolved


@pytest.mark.parametrize("name", ["hello-file", "fix-count-lines"])
def test_run_verifier_reference_solution_scores_one(tmp_path, name):
    result = verify(tmp_path, load_task(EXAMPLES_DIR / name), solve=True)
    assert result.reward == 1.0


def test_run_verifier_reward_json_metrics(tmp_path):
    result = verify(tmp_path, load_task(EXAMPLES_DIR / "fix-count-lines"), solve=False)
    assert result.source == "reward.json" and result.metrics["cases_passed"] == 0.0


def test_run_verifier_uses_fresh_tests_not_the_agents(tmp_path):
    task = load_task(EXAMPLES_DIR / "hello-file")
    workdir = tmp_path / "work"
    seed_workdir(task, workdir)
    (workdir / "tests").mkdir()
    (workdir / "tests" / "test.sh").write_text("echo 1 > reward.txt\n")
    assert run_verifier(task, workdir=workdir, scratch_dir=tmp_path / "scratch").reward == 0.0


def test_run_verifier_missing_reward_file_is_an_infrastructure_error(tmp_path):
    task_dir = copy_example(tmp_path, "hello-file")
    (task_dir / "tests" / "test.sh").write_text("#!/usr/bin/env bash\necho crashed >&2\nexit 3\n")
    with pytest.raises(VerifierError) as info:
        verify(tmp_path, load_task(task_dir), solve=False)
    assert info.value.kind == "no_reward_file" and "exited with 3" in info.value.message
    assert "crashed" in info.value.output


@pytest.mark.parametrize(
    ("script", "kind"),
    [
        ('echo "zero" > "$HARBOR_VERIFIER_DIR/reward.txt"', "bad_reward"),
        ('echo "nan" > "$HARBOR_VERIFIER_DIR/reward.txt"', "bad_reward"),
        ('echo "{bad" > "$HARBOR_VERIFIER_DIR/reward.json"', "bad_reward"),
        ('echo \'{"a": 1, "b": 2}\' > "$HARBOR_VERIFIER_DIR/reward.json"', "bad_reward"),
    ],
)
def test_run_verifier_garbled_reward_is_an_error(tmp_path, script, kind):
    task_dir = copy_example(tmp_path, "hello-file")
    (task_dir / "tests" / "test.sh").write_text(f"#!/usr/bin/env bash\n{script}\n")
    with pytest.raises(VerifierError) as info:
        verify(tmp_path, load_task(task_dir), solve=False)
    assert info.value.kind == kind


def test_run_verifier_timeout_is_an_error(tmp_path):
    task_dir = copy_example(tmp_path, "hello-file")
    (task_dir / "tests" / "test.sh").write_text("#!/usr/bin/env bash\nsleep 30\n")
    with pytest.raises(VerifierError) as info:
        verify(tmp_path, load_task(task_dir), solve=False, timeout_s=0.5)
    assert info.value.kind == "timeout"


def test_read_reward_single_metric_json(tmp_path):
    (tmp_path / "reward.json").write_text('{"accuracy": 0.5}')
    assert read_reward(tmp_path) == (0.5, {"accuracy": 0.5}, "reward.json")


def test_harbor_config_example_and_path(tmp_path):
    assert validate_config(HarborConfig, {"example": "hello-file"}).resolve().name == "hello-file"
    task_dir = copy_example(tmp_path, "fix-count-lines")
    assert validate_config(HarborConfig, {"path": str(task_dir)}).resolve().path == task_dir
    assert all(validate_config(HarborConfig, c) for c in sample_configs(4, seed=0))


@pytest.mark.parametrize(
    ("config", "message", "field"),
    [
        ({"example": "nope"}, "unknown example", "config.example"),
        ({}, "exactly one of example or path", "config"),
        ({"path": "relative/dir"}, "path must be absolute", "config.path"),
        ({"path": "/nonexistent/task"}, "is not a directory", "config.path"),
        ({"example": "hello-file", "max_turns": 0}, "max_turns", "config.max_turns"),
    ],
)
def test_harbor_config_rejects_bad_specs(config, message, field):
    with pytest.raises(InvalidSpec, match=message) as info:
        validate_config(HarborConfig, config)
    assert info.value.field == field


def test_harbor_config_rejects_dir_that_is_not_a_task(tmp_path):
    with pytest.raises(InvalidSpec, match="task.toml is missing|instruction.md is missing"):
        validate_config(HarborConfig, {"path": str(tmp_path)})
