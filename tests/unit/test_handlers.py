from __future__ import annotations

import time

import pytest

from farm.constants import Outcome, Stage
from farm.errors import ConfigError, HandlerNotFound, InvalidSpec, SandboxError
from farm.handlers.base import StageContext
from farm.handlers.echo import EchoHandler
from farm.handlers.registry import get_handler, known_handlers
from farm.schemas import SamplingParams


def ctx(stage: Stage, *, attempt: int = 1, seed: int = 1, cancelled: bool = False) -> StageContext:
    return StageContext(
        job_id=1,
        batch_id=1,
        stage=stage,
        attempt=attempt,
        node="n",
        sampling=SamplingParams(),
        seed=seed,
        deadline=time.monotonic() + 60,
        is_cancelled=lambda: cancelled,
    )


def test_registry_finds_echo_by_entry_point():
    assert known_handlers()["echo"] == "farm.handlers.echo:EchoHandler"
    assert isinstance(get_handler("echo"), EchoHandler)


def test_registry_accepts_a_dotted_path():
    assert isinstance(get_handler("farm.handlers.echo:EchoHandler"), EchoHandler)


def test_unknown_handler_lists_known_ones():
    with pytest.raises(HandlerNotFound, match="known types: .*echo"):
        get_handler("no-such-type")


def test_dotted_path_that_is_not_a_handler_is_a_config_error():
    with pytest.raises(ConfigError, match="not a TaskHandler"):
        get_handler("farm.schemas:TaskSpec")


def test_validate_names_the_bad_field():
    with pytest.raises(InvalidSpec) as info:
        EchoHandler().validate({"text": "x", "sleep_s": {"run": -1}})
    assert info.value.field == "config.sleep_s.run"


def test_echo_runs_all_stages_and_rewards_an_exact_copy():
    h = EchoHandler()
    config = h.validate({"text": "abc", "reverse": True})
    state = h.init(config, ctx(Stage.INIT))
    result = h.run(config, state, ctx(Stage.RUN))
    t = result.trajectory
    assert t.loss_mask == [0] * len(state["prompt_ids"]) + [1] * 4  # "cba" + eos
    assert t.turn_offsets == [0, len(state["prompt_ids"])]
    reward = h.evaluate(config, {**state, **result.state}, t, ctx(Stage.EVAL))
    assert reward.reward == 1.0 and reward.metrics["exact"] == 1.0


def test_echo_noise_lowers_reward_deterministically_per_seed():
    h = EchoHandler()
    config = h.validate({"text": "a fairly long sentence to corrupt", "noise": 0.5})
    state = h.init(config, ctx(Stage.INIT))

    def score(seed: int) -> float:
        r = h.run(config, state, ctx(Stage.RUN, seed=seed))
        return h.evaluate(config, {**state, **r.state}, r.trajectory, ctx(Stage.EVAL)).reward

    assert score(3) == score(3) < 1.0
    assert len({score(s) for s in range(6)}) > 1


def test_echo_simulated_fault_only_on_early_attempts():
    h = EchoHandler()
    config = h.validate({"text": "x", "fail_stage": "init", "fail_attempts": 1})
    with pytest.raises(SandboxError, match="simulated init failure"):
        h.init(config, ctx(Stage.INIT, attempt=1))
    assert h.init(config, ctx(Stage.INIT, attempt=2))["prompt_ids"]


def test_echo_run_stops_early_when_cancelled():
    h = EchoHandler()
    config = h.validate({"text": "x", "sleep_s": {"run": 30}})
    state = h.init(config, ctx(Stage.INIT))
    started = time.monotonic()
    result = h.run(config, state, ctx(Stage.RUN, cancelled=True))
    assert result.outcome is Outcome.CANCELLED and time.monotonic() - started < 5


def test_generate_pays_an_exact_reply_and_not_one_that_merely_contains_the_reference():
    from farm.handlers.generate import GenerateConfig, GenerateHandler
    from farm.schemas import TrajectoryData

    handler = GenerateHandler()
    empty = TrajectoryData(token_ids=[1], logprobs=[0.0], loss_mask=[0])
    exact = GenerateConfig(messages=[{"role": "user", "content": "2+2?"}], reference="4")
    contains = exact.model_copy(update={"match": "contains"})

    def reward(config, reply: str) -> float:
        return handler.evaluate(config, {"reply": reply}, empty, None).reward  # type: ignore[arg-type]

    assert reward(exact, " 4\n") == 1.0
    assert reward(exact, "1 2 3 4 5 6 7 8 9") == 0.0  # listing candidates earns nothing
    assert reward(contains, "1 2 3 4 5 6 7 8 9") == 1.0  # the opt-in, gameable rule


def test_echo_counts_characters_past_the_target_against_the_response():
    import time

    from farm.constants import Stage
    from farm.handlers.base import StageContext
    from farm.handlers.echo import EchoConfig, _encode
    from farm.schemas import SamplingParams, TrajectoryData

    def reward(response: str) -> float:
        ids = _encode(response)
        trajectory = TrajectoryData(token_ids=ids, logprobs=[0.0] * len(ids), loss_mask=[1] * len(ids))
        state = {"target": "abcd"}
        ctx = StageContext(
            job_id=1,
            batch_id=1,
            stage=Stage.EVAL,
            attempt=1,
            node="n",
            sampling=SamplingParams(),
            seed=0,
            deadline=time.monotonic() + 60,
            is_cancelled=lambda: False,
            resources={},
        )
        return EchoHandler().evaluate(EchoConfig(text="dcba"), state, trajectory, ctx).reward

    assert reward("abcd") == 1.0
    assert reward("abcd" + "x" * 12) == 0.25  # the target followed by junk is not a full answer
