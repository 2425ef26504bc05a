"""The shipped harness presets: how each is pointed at its trial, and the harness config's checks."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from farm.errors import InvalidSpec
from farm.handlers.base import validate_config
from farm.schemas import SegmentData, TrajectoryData, TrialRecordData
from tasks.harness import presets
from tasks.harness.config import HarnessConfig, HarnessSpec
from tasks.harness.handler import _main

ENDPOINT = presets.Endpoint(
    openai_base_url="http://127.0.0.1:18080/proxy/t1/v1",
    anthropic_base_url="http://127.0.0.1:18080/proxy/t1",
    api_key="farm-trial-secret",
    model="farm-tiny",
)


def test_mini_swe_agent_reads_its_model_settings_from_a_yaml_file() -> None:
    launch = presets.launch(
        HarnessSpec(preset="mini-swe-agent", max_turns=7), ENDPOINT, instruction="fix it", workdir="/w"
    )
    assert launch.argv[0] == "mini" and "fix it" in launch.argv
    (path,) = launch.files
    assert path.endswith(".yaml")
    config = json.loads(launch.files[path])
    assert config["agent"]["step_limit"] == 7
    assert config["model"]["model_kwargs"]["api_base"] == ENDPOINT.openai_base_url
    assert launch.env["OPENAI_API_KEY"] == "farm-trial-secret"


def test_claude_code_talks_anthropic_to_the_trial() -> None:
    launch = presets.launch(HarnessSpec(preset="claude-code"), ENDPOINT, instruction="x", workdir="/w")
    assert launch.env["ANTHROPIC_BASE_URL"] == ENDPOINT.anthropic_base_url
    assert launch.env["ANTHROPIC_API_KEY"] == "farm-trial-secret"


def test_codex_gets_a_responses_provider() -> None:
    launch = presets.launch(HarnessSpec(preset="codex"), ENDPOINT, instruction="x", workdir="/w")
    (toml,) = launch.files.values()
    assert 'wire_api = "responses"' in toml and ENDPOINT.openai_base_url in toml
    assert launch.env["FARM_TRIAL_KEY"] == "farm-trial-secret"


def test_command_preset_fills_placeholders() -> None:
    spec = HarnessSpec(preset="command", command=["my-agent", "--url={openai_base_url}", "{instruction}"])
    launch = presets.launch(spec, ENDPOINT, instruction="do it", workdir="/w")
    assert launch.argv == ["my-agent", f"--url={ENDPOINT.openai_base_url}", "do it"]


def test_harness_config_checks_the_inner_task_and_the_command() -> None:
    HarnessConfig.model_validate({"task": {"type": "harbor", "config": {"example": "hello-file"}}})
    with pytest.raises(ValidationError, match="harbor task"):
        HarnessConfig.model_validate({"task": {"type": "harbor", "config": {"nope": 1}}})
    # A 422 names the inner config, not "(config)": the inner field is in the message.
    with pytest.raises(InvalidSpec, match="swe task's config.instance_id") as info:
        validate_config(HarnessConfig, {"task": {"type": "swe", "config": {"instance_id": "nope"}}})
    assert info.value.field == "config.task.config"
    with pytest.raises(ValidationError, match="command is given exactly"):
        HarnessSpec(preset="command")


def test_harness_history_is_unset_unless_given_so_the_batchs_applies() -> None:
    task = {"type": "harbor", "config": {"example": "hello-file"}}
    assert HarnessConfig.model_validate({"task": task}).harness.history is None
    given = HarnessConfig.model_validate({"task": task, "harness": {"history": "template"}})
    assert given.harness.history == "template"


def test_a_harness_jobs_trajectory_is_the_main_segment_with_every_other_segment() -> None:
    def segment(first: int) -> TrajectoryData:
        return TrajectoryData(token_ids=[first, first + 1], logprobs=[0.0, -0.5], loss_mask=[0, 1], info={"x": 1})

    record = TrialRecordData(trial_id="t", segments=[segment(1), segment(3), segment(5)], main=1, certificate=[])
    trajectory = _main(record, {"trial": "t"})
    assert trajectory.token_ids == [3, 4] and trajectory.info == {"x": 1, "trial": "t"}
    # The others in the record's order, as plain segments (no info of their own).
    assert [s.token_ids for s in trajectory.segments] == [[1, 2], [5, 6]]
    assert all(type(s) is SegmentData for s in trajectory.segments)
    assert TrajectoryData.model_validate_json(trajectory.model_dump_json()) == trajectory
