from __future__ import annotations

import asyncio
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from farm.constants import Outcome, Stage
from farm.errors import ConfigError, FarmError, HandlerNotFound, InvalidSpec, SandboxError
from farm.handlers.base import StageContext
from farm.handlers.echo import EchoConfig, EchoHandler, EchoState
from farm.handlers.registry import allow_handler_paths, get_config_class, get_handler, known_handlers
from farm.sandbox.base import SandboxSpec
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


@pytest.fixture
def allow() -> Iterator[Callable[..., None]]:
    """Allow ``module:Class`` paths as task types for one test (the ``handler_paths`` setting)."""
    yield lambda *paths: allow_handler_paths(paths)
    allow_handler_paths([])


def test_registry_accepts_a_dotted_path_the_operator_allows(allow):
    allow("farm.handlers.echo:EchoHandler")
    assert known_handlers()["farm.handlers.echo:EchoHandler"] == "farm.handlers.echo:EchoHandler"
    assert isinstance(get_handler("farm.handlers.echo:EchoHandler"), EchoHandler)


def test_a_dotted_path_not_allowed_is_an_unknown_type_and_is_never_imported(tmp_path, monkeypatch):
    _package(tmp_path, "probepkg", handler="raise ImportError('must not be imported')", config=CONFIG)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("probepkg.handler:Probe", "this:Nope", "farm.handlers.echo:EchoHandler"):
        with pytest.raises(HandlerNotFound, match="unknown task type"):
            get_config_class(name)
        with pytest.raises(HandlerNotFound, match="unknown task type"):
            get_handler(name)
    assert "probepkg" not in sys.modules and "this" not in sys.modules


def test_allowed_paths_must_be_module_class_paths(allow):
    with pytest.raises(ConfigError, match="not package.module:Class"):
        allow("echo", "a.b:C")


def test_unknown_handler_lists_known_ones():
    with pytest.raises(HandlerNotFound, match="known types: .*echo"):
        get_handler("no-such-type")


def test_dotted_path_that_is_not_a_handler_is_a_config_error(allow):
    allow("farm.schemas:TaskSpec")
    with pytest.raises(ConfigError, match="not a TaskHandler"):
        get_handler("farm.schemas:TaskSpec")


def _package(root: Path, name: str, *, handler: str, config: str | None) -> None:
    """A handler package ``name`` under ``root``, with ``config.py`` when ``config`` is given."""
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "handler.py").write_text(textwrap.dedent(handler))
    if config is not None:
        (package / "config.py").write_text(textwrap.dedent(config))


CONFIG = """
    from pydantic import BaseModel

    class LightConfig(BaseModel):
        n: int

    config_class = LightConfig
"""


def test_config_class_comes_from_the_light_module_without_importing_the_handler(tmp_path, monkeypatch, allow):
    _package(tmp_path, "lightpkg", handler="raise ImportError('the handler must not be imported')", config=CONFIG)
    monkeypatch.syspath_prepend(str(tmp_path))
    allow("lightpkg.handler:LightHandler")
    config_class = get_config_class("lightpkg.handler:LightHandler")
    assert config_class.__name__ == "LightConfig"
    assert "lightpkg.handler" not in sys.modules


def test_config_class_without_a_light_module_comes_from_the_handler():
    assert get_config_class("echo") is EchoConfig


@pytest.mark.parametrize("name", ["math", "code", "swe", "harbor"])
def test_shipped_config_modules_name_their_handlers_config_class(name):
    assert get_config_class(name) is get_handler(name).config_class


def test_a_light_config_that_is_not_the_handlers_is_a_config_error(tmp_path, monkeypatch, allow):
    handler = """
        from pydantic import BaseModel
        from farm.handlers.base import TaskHandler

        class Other(BaseModel):
            n: int

        class DriftHandler(TaskHandler[Other]):
            config_class = Other
    """
    _package(tmp_path, "driftpkg", handler=handler, config=CONFIG)
    monkeypatch.syspath_prepend(str(tmp_path))
    allow("driftpkg.handler:DriftHandler")
    with pytest.raises(ConfigError, match="is not its config_class"):
        get_handler("driftpkg.handler:DriftHandler")


def test_a_handler_with_a_sync_stage_method_is_a_config_error(tmp_path, monkeypatch, allow):
    handler = """
        from farm.handlers.echo import EchoHandler

        class SyncHandler(EchoHandler):
            def evaluate(self, config, state, trajectory, ctx):
                return None
    """
    _package(tmp_path, "syncpkg", handler=handler, config=None)
    monkeypatch.syspath_prepend(str(tmp_path))
    allow("syncpkg.handler:SyncHandler")
    with pytest.raises(ConfigError, match="must be `async def`: evaluate"):
        get_handler("syncpkg.handler:SyncHandler")


def test_a_context_without_a_resource_says_which():
    with pytest.raises(FarmError, match="no sandboxes resource"):
        ctx(Stage.INIT).sandboxes.create(SandboxSpec())


def test_validate_names_the_bad_field():
    with pytest.raises(InvalidSpec) as info:
        EchoHandler().validate({"text": "x", "sleep_s": {"run": -1}})
    assert info.value.field == "config.sleep_s.run"


def test_echo_runs_all_stages_and_rewards_an_exact_copy():
    h = EchoHandler()
    config = h.validate({"text": "abc", "reverse": True})
    state = asyncio.run(h.init(config, ctx(Stage.INIT)))
    result = asyncio.run(h.run(config, state, ctx(Stage.RUN)))
    t = result.trajectory
    assert t.loss_mask == [0] * len(state.prompt_ids) + [1] * 4  # "cba" + eos
    assert t.turn_offsets == [0, len(state.prompt_ids)]
    reward = asyncio.run(h.evaluate(config, state.updated(result.state), t, ctx(Stage.EVAL)))
    assert reward.reward == 1.0 and reward.metrics["exact"] == 1.0


def test_echo_noise_lowers_reward_deterministically_per_seed():
    h = EchoHandler()
    config = h.validate({"text": "a fairly long sentence to corrupt", "noise": 0.5})
    state = asyncio.run(h.init(config, ctx(Stage.INIT)))

    def score(seed: int) -> float:
        r = asyncio.run(h.run(config, state, ctx(Stage.RUN, seed=seed)))
        return asyncio.run(h.evaluate(config, state.updated(r.state), r.trajectory, ctx(Stage.EVAL))).reward

    assert score(3) == score(3) < 1.0
    assert len({score(s) for s in range(6)}) > 1


def test_echo_simulated_fault_only_on_early_attempts():
    h = EchoHandler()
    config = h.validate({"text": "x", "fail_stage": "init", "fail_attempts": 1})
    with pytest.raises(SandboxError, match="simulated init failure"):
        asyncio.run(h.init(config, ctx(Stage.INIT, attempt=1)))
    assert asyncio.run(h.init(config, ctx(Stage.INIT, attempt=2))).prompt_ids


def test_echo_run_stops_early_when_cancelled():
    h = EchoHandler()
    config = h.validate({"text": "x", "sleep_s": {"run": 30}})
    state = asyncio.run(h.init(config, ctx(Stage.INIT)))
    started = time.monotonic()
    result = asyncio.run(h.run(config, state, ctx(Stage.RUN, cancelled=True)))
    assert result.outcome is Outcome.CANCELLED and time.monotonic() - started < 5


def test_generate_pays_an_exact_reply_and_not_one_that_merely_contains_the_reference():
    from farm.handlers.generate import GenerateConfig, GenerateHandler, GenerateState
    from farm.schemas import TrajectoryData

    handler = GenerateHandler()
    empty = TrajectoryData(token_ids=[1], logprobs=[0.0], loss_mask=[0])
    exact = GenerateConfig(messages=[{"role": "user", "content": "2+2?"}], reference="4")
    contains = exact.model_copy(update={"match": "contains"})

    def reward(config, reply: str) -> float:
        return asyncio.run(handler.evaluate(config, GenerateState(reply=reply), empty, None)).reward  # type: ignore[arg-type]

    assert reward(exact, " 4\n") == 1.0
    assert reward(exact, "1 2 3 4 5 6 7 8 9") == 0.0  # listing candidates earns nothing
    assert reward(contains, "1 2 3 4 5 6 7 8 9") == 1.0  # the opt-in, gameable rule


def test_generate_charset_pays_the_share_of_characters_in_the_set():
    from farm.handlers.generate import GenerateConfig, GenerateHandler, GenerateState
    from farm.schemas import TrajectoryData

    handler = GenerateHandler()
    empty = TrajectoryData(token_ids=[1], logprobs=[0.0], loss_mask=[0])
    vowels = GenerateConfig(messages=[{"role": "user", "content": "vowels"}], reference="aeiou", match="charset")

    def reward(reply: str) -> float:
        return asyncio.run(handler.evaluate(vowels, GenerateState(reply=reply), empty, None)).reward  # type: ignore[arg-type]

    assert reward("aeiou") == 1.0
    assert reward("a b c d") == 0.25  # spaces do not count either way
    assert reward("   ") == 0.0 and reward("") == 0.0


def test_echo_counts_characters_past_the_target_against_the_response():
    import time

    from farm.constants import Stage
    from farm.handlers.base import StageContext
    from farm.handlers.echo import EchoConfig, _encode
    from farm.schemas import SamplingParams, TrajectoryData

    def reward(response: str) -> float:
        ids = _encode(response)
        trajectory = TrajectoryData(token_ids=ids, logprobs=[0.0] * len(ids), loss_mask=[1] * len(ids))
        state = EchoState(target="abcd")
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
        )
        return asyncio.run(EchoHandler().evaluate(EchoConfig(text="dcba"), state, trajectory, ctx)).reward

    assert reward("abcd") == 1.0
    assert reward("abcd" + "x" * 12) == 0.25  # the target followed by junk is not a full answer


@pytest.mark.parametrize(
    ("name", "safe"),
    [("math", True), ("code", True), ("swe", True), ("generate", True), ("harbor", False)],
)
def test_handlers_declare_whether_their_grader_can_score_again(name, safe):
    assert get_handler(name).reverify_safe is safe


@pytest.mark.parametrize(
    ("inner", "config", "safe"),
    [("swe", {"instance_id": "rollout-farm__semver-1"}, True), ("harbor", {"example": "hello-file"}, False)],
)
def test_harness_can_reverify_as_its_inner_task_does(inner, config, safe):
    handler = get_handler("harness")
    assert handler.can_reverify(handler.validate({"task": {"type": inner, "config": config}})) is safe
