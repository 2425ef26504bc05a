"""Shared fixtures. Service fixtures skip when a service is missing locally and fail in CI.

Environment knobs (tests are an entry point, so they may read the environment):
- ``FARM_TEST_REDIS_URL``   default ``redis://127.0.0.1:6379/9``; tests flush this database.
- ``FARM_TEST_DATABASE_URL`` default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``.
- ``FARM_FAMILIES_DIR``     the real model families cache (scripts/setup_families.sh; default
  ``~/.cache/rollout-farm/families``).
- ``CI``                    when set, a missing service is a failure, not a skip.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.config import Settings
from farm.llm.families import DEFAULT_CACHE_DIR, is_ready

REDIS_URL = os.environ.get("FARM_TEST_REDIS_URL", "redis://127.0.0.1:6379/9")
DATABASE_URL = os.environ.get("FARM_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
IN_CI = bool(os.environ.get("CI"))
FAMILIES_DIR = Path(os.environ.get("FARM_FAMILIES_DIR") or DEFAULT_CACHE_DIR)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-vllm", action="store_true", help="run tests against a real vLLM CPU server")
    parser.addoption("--run-fuzz", action="store_true", help="fuzz the API with schemathesis (minutes)")
    parser.addoption(
        "--run-proxy-fuzz", action="store_true", help="the proxy's fuzzer and hostile-input tests (minutes)"
    )
    parser.addoption("--run-crash", action="store_true", help="run the crash tests (tests/crash: real faults, minutes)")
    parser.addoption(
        "--run-matrix",
        action="store_true",
        help="run the model-family suite: every cell of the proxy's family matrix (two run anyway) and the qwen3 tests",
    )
    parser.addoption("--run-verl", action="store_true", help="run the verl bridge against verl in its own venv")
    parser.addoption(
        "--run-trl", action="store_true", help="run TRL's AsyncGRPOTrainer through the farm (scripts/setup_trl.sh)"
    )
    parser.addoption(
        "--run-slurm",
        action="store_true",
        help="run the farm on a one-node Slurm cluster of the test's own (installs slurm-wlm, root)",
    )
    parser.addoption(
        "--run-compose",
        action="store_true",
        help="bring docker-compose.yml up for real (root; installs and starts Docker if needed, minutes)",
    )
    parser.addoption(
        "--run-pgbouncer",
        action="store_true",
        help="run a real farm end to end behind a PgBouncer of the test's own (apt-get install pgbouncer)",
    )
    parser.addoption(
        "--run-images",
        action="store_true",
        help="run Harbor and SWE-style tasks end to end in their own images (bwrap, root; a minute)",
    )
    parser.addoption(
        "--run-docker",
        action="store_true",
        help="the sandbox contract suite under the docker driver (root; starts Docker with scripts/setup_docker.sh)",
    )
    parser.addoption(
        "--run-harness",
        action="store_true",
        help="run real harnesses (mini-swe-agent, Claude Code, Codex) through the farm",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        # By marker, not keyword: keywords include folder names (a checkout in .../vllm/ would match).
        if item.get_closest_marker("vllm") and not config.getoption("--run-vllm"):
            item.add_marker(pytest.mark.skip(reason="vLLM test: opt in with --run-vllm (docs/operations.md, Tests)"))
        if item.get_closest_marker("fuzz") and not config.getoption("--run-fuzz"):
            item.add_marker(pytest.mark.skip(reason="fuzz test: opt in with --run-fuzz (docs/operations.md, Tests)"))
        if item.get_closest_marker("proxy_fuzz") and not config.getoption("--run-proxy-fuzz"):
            item.add_marker(pytest.mark.skip(reason="proxy fuzz or hostile-input test: opt in with --run-proxy-fuzz"))
        if item.get_closest_marker("harness") and not config.getoption("--run-harness"):
            item.add_marker(
                pytest.mark.skip(reason="real harness test (installs it, minutes): opt in with --run-harness")
            )
        if item.get_closest_marker("matrix") and not config.getoption("--run-matrix"):
            item.add_marker(pytest.mark.skip(reason="model-family suite: opt in with --run-matrix"))
        if item.get_closest_marker("verl") and not config.getoption("--run-verl"):
            item.add_marker(pytest.mark.skip(reason="verl test: opt in with --run-verl (scripts/setup_verl.sh)"))
        if item.get_closest_marker("trl") and not config.getoption("--run-trl"):
            item.add_marker(pytest.mark.skip(reason="TRL test: opt in with --run-trl (scripts/setup_trl.sh)"))
        if item.get_closest_marker("slurm") and not config.getoption("--run-slurm"):
            item.add_marker(pytest.mark.skip(reason="Slurm test (a cluster of its own): opt in with --run-slurm"))
        if item.get_closest_marker("compose") and not config.getoption("--run-compose"):
            item.add_marker(pytest.mark.skip(reason="compose test (Docker, minutes): opt in with --run-compose"))
        if item.get_closest_marker("pgbouncer") and not config.getoption("--run-pgbouncer"):
            item.add_marker(pytest.mark.skip(reason="farm behind PgBouncer end to end: opt in with --run-pgbouncer"))
        if item.get_closest_marker("images") and not config.getoption("--run-images"):
            item.add_marker(pytest.mark.skip(reason="task-image test (a minute): opt in with --run-images"))
        if item.get_closest_marker("docker") and not config.getoption("--run-docker"):
            item.add_marker(pytest.mark.skip(reason="docker driver test (needs a dockerd): opt in with --run-docker"))
        if item.get_closest_marker("crash") and not config.getoption("--run-crash"):
            item.add_marker(pytest.mark.skip(reason="crash test (minutes of real faults): opt in with --run-crash"))


def service_missing(what: str, exc: BaseException) -> None:
    """Skip locally, fail in CI: a missing service must never turn a CI run green."""
    message = f"{what} is not reachable: {exc}"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(autouse=True)
def _clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    # Settings must come from the fixtures, never from the developer's shell.
    for key in list(os.environ):
        if key.startswith("FARM_") and not key.startswith("FARM_TEST_"):
            monkeypatch.delenv(key)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings for unit tests: SQLite in a temp dir, no Redis."""
    return Settings(data_dir=tmp_path / "farm-data", api={"token": "test-token"})


@pytest.fixture(scope="session")
def redis_url() -> str:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        service_missing(f"Redis at {REDIS_URL}", exc)
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[object]:
    """A client on the test database, flushed before and after."""
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture(scope="session")
def postgres_url() -> str:
    import sqlalchemy as sa

    engine = sa.create_engine(DATABASE_URL)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))
    except sa.exc.OperationalError as exc:
        service_missing(f"PostgreSQL at {DATABASE_URL}", exc)
    finally:
        engine.dispose()
    return DATABASE_URL


@pytest.fixture(scope="session")
def pg_url(postgres_url: str) -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, migrated to head, dropped after. The
    server is never killed here (the crash suite has its own), so commits need not wait for the
    disk: this file's PostgreSQL databases all skip that wait (a third of the state machine
    table's time)."""
    from farm.testing import temporary_database

    with temporary_database(postgres_url, prefix="farm_test", wait_for_disk=False) as url:
        yield url


@pytest.fixture(scope="module")
def module_pg_url(postgres_url: str) -> Iterator[str]:
    """A migrated PostgreSQL database for one test module's farm. One database is one farm: its
    workers re-send whatever the database owes, and its API registers the backends every farm
    on that database routes to."""
    from farm.testing import temporary_database

    with temporary_database(postgres_url, prefix="farm_mod", wait_for_disk=False) as url:
        yield url


@pytest.fixture
def own_pg_url(postgres_url: str) -> Iterator[str]:
    """A migrated PostgreSQL database of the test's own. For a farm whose stages must be re-sent
    by its own sweepers: a sweeper re-sends through its own broker, so another farm on another
    Redis database that shares the database can take the re-send and lose it, again and again
    (the sweeper that re-sent last is the first to see the next window lapse)."""
    from farm.testing import temporary_database

    with temporary_database(postgres_url, prefix="farm_own", wait_for_disk=False) as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    from farm.db import migrate
    from farm.db.session import make_engine

    url = f"sqlite:///{tmp_path / 'farm.db'}"
    engine = make_engine(Settings(), url=url)
    migrate.upgrade(engine)
    engine.dispose()
    return url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def db_url(request: pytest.FixtureRequest) -> str:
    """Both databases farm supports: tests using this run once on each."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def sessions(db_url: str) -> Iterator[object]:
    from farm.db.session import make_engine, make_session_factory

    engine = make_engine(Settings(), url=db_url)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from farm.llm.builtin.tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("tiny-model"), seed=0)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def teacher(tiny_model_dir: Path) -> Callable[[list[int]], list[float]]:
    """Teacher-forced logprobs of a whole sequence with a plain transformers forward pass."""
    return teacher_for(tiny_model_dir)


def teacher_for(model_dir: Path) -> Callable[[list[int]], list[float]]:
    """The ``teacher`` fixture's function for any model directory."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def logprobs(token_ids: list[int]) -> list[float]:
        with torch.inference_mode():
            logits = model(torch.tensor([token_ids])).logits[0].float()
        lp = torch.log_softmax(logits, dim=-1)
        picked = lp[torch.arange(len(token_ids) - 1), torch.tensor(token_ids[1:])]
        return [0.0, *picked.tolist()]

    def argmax(token_ids: list[int]) -> list[int]:
        """The most likely next token after each prefix ``token_ids[: i + 1]``."""
        with torch.inference_mode():
            return model(torch.tensor([token_ids])).logits[0].argmax(dim=-1).tolist()

    def top(token_ids: list[int], k: int) -> list[dict[int, float]]:
        """The ``k`` most likely next tokens (id -> logprob, most likely first) after each prefix."""
        with torch.inference_mode():
            lp = torch.log_softmax(model(torch.tensor([token_ids])).logits[0].float(), dim=-1)
        values, ids = torch.topk(lp, k, dim=-1)
        return [dict(zip(i.tolist(), v.tolist(), strict=True)) for i, v in zip(ids, values, strict=True)]

    logprobs.argmax = argmax  # type: ignore[attr-defined]
    logprobs.top = top  # type: ignore[attr-defined]
    return logprobs


@pytest.fixture(scope="session")
def families_dir() -> Path:
    """The real model families' vocabularies and templates (scripts/setup_families.sh); like a missing
    service, their absence skips locally and fails in CI."""
    if not is_ready(FAMILIES_DIR):
        message = (
            f"the model families cache {FAMILIES_DIR} is not set up: run scripts/setup_families.sh "
            "(it downloads llama-cpp-python's source distribution from PyPI once)"
        )
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return FAMILIES_DIR


@pytest.fixture(scope="session")
def family_model_dir(families_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``family_model_dir(name)``: the tiny random model of a real family, built once per session."""
    from farm.llm.builtin.tiny import make_tiny

    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            built[name] = make_tiny(tmp_path_factory.mktemp(f"family-{name}"), family=name, families_dir=families_dir)
        return built[name]

    return get


@pytest.fixture(scope="session")
def family_tokenizer(family_model_dir: Callable[[str], Path]) -> Callable[[str], Any]:
    """``family_tokenizer(name)``: the tokenizer the built-in backend loads from the family's model
    folder, loaded once per session (a Qwen one takes seconds). Do not change it: it is shared."""
    from transformers import AutoTokenizer

    loaded: dict[str, Any] = {}

    def get(name: str) -> Any:
        if name not in loaded:
            loaded[name] = AutoTokenizer.from_pretrained(family_model_dir(name))
        return loaded[name]

    return get
