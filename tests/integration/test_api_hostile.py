"""Hostile input at the API's door (issue 30): whatever a request holds, the API answers 422 naming
the field or stores what it can serve back; a task type never imports a module a request names; and
the OpenAPI schema accepts what the validator accepts. In-process (TestClient) on real PostgreSQL
and Redis, as tests/integration/test_api.py."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from farm.api.app import create_app
from farm.config import Settings

pytestmark = pytest.mark.integration

TOKEN = "hostile-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RAW_JSON = {**AUTH, "content-type": "application/json"}
ECHO = '{"type": "echo", "config": {"text": "hi"}}'


@pytest.fixture
def api(tmp_path: Path, pg_url: str, redis_url: str, redis_client: object) -> Iterator[TestClient]:
    settings = Settings(data_dir=tmp_path, database={"url": pg_url}, redis={"url": redis_url}, api={"token": TOKEN})
    # raise_server_exceptions=False: a 500 is answered as the real server would, not raised here.
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield client


def assert_422(response: Any, field: str, says: str = "") -> None:
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["field"] == field, body
    assert says in body["detail"], body


def nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


@pytest.mark.parametrize(
    "metadata",
    ['{"x": NaN}', '{"x": Infinity}', '{"x": -Infinity}', '{"x": 1e400}', '{"x": [1, {"y": NaN}]}'],
    ids=["nan", "infinity", "minus-infinity", "1e400", "nan-inside"],
)
def test_metadata_with_a_number_json_cannot_hold_is_a_422(api: TestClient, metadata: str):
    body = f'{{"tasks": [{ECHO}], "metadata": {metadata}}}'
    assert_422(api.post("/v1/batches", content=body, headers=RAW_JSON), "metadata", says="finite")


@pytest.mark.parametrize(
    "metadata",
    [r'{"s": "\udfff\ud800"}', r'{"\ud800": 1}', r'{"s": ["ok", "a\u0000b"]}'],
    ids=["lone-surrogates", "surrogate-key", "nul"],
)
def test_metadata_that_could_not_be_served_back_is_refused_and_the_batch_stays_readable(api: TestClient, metadata: str):
    body = f'{{"tasks": [{ECHO}], "metadata": {metadata}}}'
    assert_422(api.post("/v1/batches", content=body, headers=RAW_JSON), "metadata")
    # A valid pair of escapes is one character, and is kept and served back.
    pair = f'{{"tasks": [{ECHO}], "metadata": {{"s": "\\ud83d\\ude00"}}}}'
    created = api.post("/v1/batches", content=pair, headers=RAW_JSON)
    assert created.status_code == 201, created.text
    status = api.get(f"/v1/batches/{created.json()['id']}", headers=AUTH)
    assert status.status_code == 200 and status.json()["metadata"] == {"s": "\U0001f600"}


def test_a_batch_and_a_trial_poisoned_before_the_rules_are_served_with_replacement(api: TestClient, pg_url: str):
    # Given a batch and a trial whose metadata holds lone surrogates, as stored before the API refused them
    # (PostgreSQL's json keeps the escapes as written)
    created = api.post("/v1/batches", json={"tasks": [{"type": "echo", "config": {"text": "hi"}}]}, headers=AUTH)
    trial = api.post("/v1/trials", json={}, headers=AUTH)
    assert created.status_code == 201 and trial.status_code == 201, (created.text, trial.text)
    poison = r'{"s": "a\udfff\ud800b", "\udc00": [1], "pair": "\ud83d\ude00"}'
    engine = create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE batches SET metadata = :m WHERE id = :id"), {"m": poison, "id": created.json()["id"]})
        conn.execute(text("UPDATE trials SET metadata = :m WHERE id = :id"), {"m": poison, "id": trial.json()["id"]})
    engine.dispose()
    # When they are read, then each lone surrogate is served as U+FFFD and the rest as stored
    served = {"s": "a\ufffd\ufffdb", "\ufffd": [1], "pair": "\U0001f600"}
    batch = api.get(f"/v1/batches/{created.json()['id']}", headers=AUTH)
    assert batch.status_code == 200 and batch.json()["metadata"] == served, batch.text
    read = api.get(f"/v1/trials/{trial.json()['id']}", headers=AUTH)
    assert read.status_code == 200 and read.json()["metadata"] == served, read.text


def test_deeply_nested_metadata_is_a_422(api: TestClient):
    body = f'{{"tasks": [{ECHO}], "metadata": {nested(500)}}}'
    assert_422(api.post("/v1/batches", content=body, headers=RAW_JSON), "metadata", says="deep")
    assert api.post(
        "/v1/batches", content=f'{{"tasks": [{ECHO}], "metadata": {nested(20)}}}', headers=RAW_JSON
    ).is_success


def test_oversized_metadata_is_a_422(api: TestClient):
    body = {"tasks": [{"type": "echo", "config": {"text": "hi"}}], "metadata": {"x": "y" * 100_000}}
    assert_422(api.post("/v1/batches", json=body, headers=AUTH), "metadata", says="bytes")


@pytest.mark.parametrize(
    ("task", "field"),
    [
        ('{"type": "echo", "config": {"text": "hi", "noise": NaN}}', "tasks.0.config"),
        ('{"type": "echo", "config": {"text": "a\\udfffb"}}', "tasks.0.config"),
        ('{"type": "echo", "config": {"text": "a\\u0000b"}}', "tasks.0.config"),
        (f'{{"type": "echo", "config": {{"text": "hi", "x": {nested(500)}}}}}', "tasks.0.config"),
        ('{"type": "echo\\u0000", "config": {"text": "hi"}}', "tasks.0.type"),
        ('{"type": "echo\\ud800", "config": {"text": "hi"}}', "tasks.0.type"),
        ('{"type": "echo", "config": {"text": "hi"}, "name": "\\udfff"}', "tasks.0.name"),
    ],
    ids=["config-nan", "config-surrogate", "config-nul", "config-deep", "type-nul", "type-surrogate", "name-surrogate"],
)
def test_a_task_spec_that_could_not_be_stored_names_its_field(api: TestClient, task: str, field: str):
    response = api.post("/v1/batches", content=f'{{"tasks": [{task}]}}', headers=RAW_JSON)
    assert_422(response, field)


def test_a_backend_model_with_a_nul_is_a_422(api: TestClient):
    response = api.post("/v1/backends", json={"url": "http://127.0.0.1:9", "model": "m\u0000odel"}, headers=AUTH)
    assert_422(response, "model", says="NUL")
    lone = api.post("/v1/backends", content=r'{"url": "http://127.0.0.1:9", "model": "\udfff"}', headers=RAW_JSON)
    assert_422(lone, "model", says="surrogate")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (r'{"model": "a\u0000b"}', "model"),
        (r'{"metadata": {"s": "\udfff\ud800"}}', "metadata"),
        ('{"metadata": {"x": Infinity}}', "metadata"),
        ('{"sampling": {"temperature": NaN}}', "sampling.temperature"),
    ],
    ids=["model-nul", "metadata-surrogates", "metadata-infinity", "temperature-nan"],
)
def test_a_trial_that_could_not_be_stored_names_its_field(api: TestClient, body: str, field: str):
    assert_422(api.post("/v1/trials", content=body, headers=RAW_JSON), field)


def test_a_weight_load_path_with_a_nul_is_a_422(api: TestClient):
    response = api.post("/v1/weights/updates/1/load", json={"path": "/ckpt\u0000", "version": 1}, headers=AUTH)
    assert_422(response, "path", says="NUL")


@pytest.mark.parametrize("module", ["this", "curses", "farm_hostile_probe"])
def test_a_task_type_never_imports_the_module_it_names(
    api: TestClient, module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # A module of our own whose import would be seen, next to two from the standard library.
    (tmp_path / "farm_hostile_probe.py").write_text("import sys\nsys.farm_hostile_probe_imported = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    response = api.post("/v1/batches", json={"tasks": [{"type": f"{module}:Nope", "config": {}}]}, headers=AUTH)
    assert_422(response, "tasks.0.type", says="unknown task type")
    assert module not in sys.modules
    assert not hasattr(sys, "farm_hostile_probe_imported")
    # Nor does listing the handlers or building the spec.
    assert f"{module}:" not in api.get("/openapi.json").text


def test_the_spec_offers_no_import_path_task_type(api: TestClient):
    spec = api.get("/openapi.json").json()
    branches = spec["components"]["schemas"]["TaskSpec"]["oneOf"]
    assert all("const" in branch["properties"]["type"] for branch in branches)


def test_trial_top_k_zero_is_refused_by_the_schema_as_by_the_validator(api: TestClient):
    spec = api.get("/openapi.json").json()
    top_k = spec["components"]["schemas"]["TrialSampling"]["properties"]["top_k"]
    assert top_k.get("not") == {"const": 0}
    assert_422(api.post("/v1/trials", json={"sampling": {"top_k": 0}}, headers=AUTH), "sampling")


def test_whole_number_floats_are_integers_as_json_schema_says(api: TestClient):
    # JSON Schema's "integer" is any number with no fractional part: 445.0 is one.
    added = api.post("/v1/backends", content='{"url": "http://127.0.0.1:9", "weight_version": 445.0}', headers=RAW_JSON)
    assert added.status_code == 201, added.text
    assert added.json()["weight_version"] == 445
    # The database is the session's: leave no backend for the next module to find.
    assert api.delete(f"/v1/backends/{added.json()['id']}", headers=AUTH).status_code == 204
    batch = api.post("/v1/batches", content=f'{{"tasks": [{ECHO}], "group_size": 2.0}}', headers=RAW_JSON)
    assert batch.status_code == 201 and len(batch.json()["job_ids"]) == 2
    trial = api.post("/v1/trials", content='{"sampling": {"top_k": 5.0, "max_tokens": 1e2}}', headers=RAW_JSON)
    assert trial.status_code == 201, trial.text
    # What is no integer stays refused: a fraction, a string, a boolean, a number too big for a float.
    for value in ("445.5", '"445"', "true", "1e400"):
        body = f'{{"url": "http://127.0.0.1:9", "weight_version": {value}}}'
        assert_422(api.post("/v1/backends", content=body, headers=RAW_JSON), "weight_version")
