from __future__ import annotations

from pathlib import Path

import pytest

from farm.config import Settings
from farm.embedded import EmbeddedStack, ensure_token, settings_env, token_hint


def test_settings_read_nested_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FARM_DATABASE__URL", "postgresql+psycopg://u@h/db")
    monkeypatch.setenv("FARM_WORKER__RUN_CONCURRENCY", "64")
    monkeypatch.setenv("FARM_API__TOKEN", "s3cret")
    s = Settings()
    assert s.database_url == "postgresql+psycopg://u@h/db"
    assert s.worker.run_concurrency == 64
    assert s.api.token is not None and s.api.token.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(s)


def test_default_database_is_sqlite_in_the_data_dir(tmp_path):
    assert Settings(data_dir=tmp_path).database_url == f"sqlite:///{tmp_path}/farm.db"


def test_settings_env_round_trips_through_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path):
    original = Settings(
        data_dir=tmp_path,
        redis={"url": "redis://x:1/2"},
        api={"token": "tok", "port": 9999},
        worker={"node": "n7", "lease_s": 2.5},
        llm={"builtin_script": tmp_path / "script.json"},
    )
    for key, value in settings_env(original).items():
        monkeypatch.setenv(key, value)
    rebuilt = Settings()
    assert rebuilt.model_dump() == original.model_dump()
    assert rebuilt.api.token is not None and rebuilt.api.token.get_secret_value() == "tok"


def test_ensure_token_makes_one_and_keeps_it(tmp_path):
    first = ensure_token(Settings(data_dir=tmp_path))
    second = ensure_token(Settings(data_dir=tmp_path))
    assert first.api.token is not None and second.api.token is not None
    assert first.api.token.get_secret_value() == second.api.token.get_secret_value()
    assert (tmp_path / "token").stat().st_mode & 0o777 == 0o600


def test_token_hint_names_the_file_only_when_it_holds_the_token(tmp_path):
    made = ensure_token(Settings(data_dir=tmp_path))
    assert token_hint(made) == f"token in {tmp_path / 'token'}"
    # FARM_API__TOKEN is served as set and never written: the file (stale here) is not the token.
    configured = ensure_token(Settings(data_dir=tmp_path, api={"token": "from-env"}))
    assert token_hint(configured) == "token from FARM_API__TOKEN"
    assert token_hint(ensure_token(Settings(data_dir=tmp_path / "fresh", api={"token": "t"}))) == (
        "token from FARM_API__TOKEN"
    )


def test_builtin_script_setting_reaches_the_backend_command(monkeypatch: pytest.MonkeyPatch, tmp_path):
    assert "--script" not in EmbeddedStack(Settings(data_dir=tmp_path), with_flower=False).builtin_args()
    monkeypatch.setenv("FARM_LLM__BUILTIN_SCRIPT", str(tmp_path / "script.json"))
    monkeypatch.setenv("FARM_LLM__BUILTIN_MODEL_DIR", str(tmp_path / "model"))
    args = EmbeddedStack(Settings(), with_flower=False).builtin_args()
    assert args[:3] == ["llm", "serve", str(tmp_path / "model")]
    assert args[args.index("--script") + 1] == str(tmp_path / "script.json")


def test_the_stack_refuses_to_start_on_a_taken_port(tmp_path: Path) -> None:
    import socket

    from farm.errors import ConfigError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = Settings(data_dir=tmp_path, llm={"builtin_port": port})
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port} is taken.*FARM_LLM__BUILTIN_PORT"):
            EmbeddedStack(settings, with_flower=False).start()
    assert not (tmp_path / "logs").exists(), "nothing was started"
