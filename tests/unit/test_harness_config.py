"""The shipped harness presets: how each is pointed at its trial, and the harness config's checks."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from farm.errors import InvalidSpec
from farm.handlers.base import validate_config
from tasks.harness import presets
from tasks.harness.config import HarnessConfig, HarnessSpec

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
