"""The OpenAPI spec's shape: every error status a route answers is documented with the farm's one
error body, 401 wherever the token is required, no FastAPI ``HTTPValidationError``. (The opt-in
fuzz test, tests/integration/test_fuzz.py, checks the answers against it.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from farm.api.app import create_app
from farm.config import Settings
from farm.dynamic.filters import known_filters
from farm.handlers.registry import allow_handler_paths, known_handlers
from farm.schemas.stored import NO_NUL_PATTERN

ERROR_REF = "#/components/schemas/ErrorOut"
#: routes anyone may call; every other one requires the bearer token.
OPEN = {("get", "/healthz"), ("get", "/readyz")}


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # Nothing connects while the spec is built: no Redis or database is needed.
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("spec"),
        redis={"url": "redis://127.0.0.1:1/0"},
        api={"token": "t", "max_tasks_per_batch": 77},
    )
    return create_app(settings).openapi()


def operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method, path, op) for path, ops in spec["paths"].items() for method, op in ops.items()]


def test_spec_has_no_fastapi_validation_error(spec: dict[str, Any]):
    text = json.dumps(spec)
    assert "HTTPValidationError" not in text and "#/components/schemas/ValidationError" not in text


def test_spec_documents_401_on_every_protected_route(spec: dict[str, Any]):
    for method, path, op in operations(spec):
        if (method, path) in OPEN:
            assert "401" not in op["responses"] and "security" not in op, (method, path)
        else:
            assert op["security"] == [{"HTTPBearer": []}], (method, path)
            assert "401" in op["responses"], (method, path)


def test_spec_error_statuses_use_the_farm_error_body(spec: dict[str, Any]):
    for method, path, op in operations(spec):
        for status, response in op["responses"].items():
            if int(status) < 400 or (path, status) == ("/readyz", "503"):  # readyz: its Health body says why
                continue
            if status == "400":  # the HTTP server's own answer to a request it cannot parse
                assert response["content"] == {"text/plain": {"schema": {"type": "string"}}}, (method, path)
                continue
            assert response["content"] == {"application/json": {"schema": {"$ref": ERROR_REF}}}, (method, path, status)


def test_spec_documents_422_where_input_is_validated(spec: dict[str, Any]):
    for method, path, op in operations(spec):
        if op.get("parameters") or op.get("requestBody"):
            assert "422" in op["responses"], (method, path)
    assert {"409", "413", "422", "503"} <= set(spec["paths"]["/v1/batches"]["post"]["responses"])


def test_spec_ids_are_bounded_to_64_bits(spec: dict[str, Any]):
    param = spec["paths"]["/v1/jobs/{job_id}"]["get"]["parameters"][0]["schema"]
    assert param["minimum"] == 1 and param["maximum"] == 2**63 - 1


def test_spec_task_types_are_the_installed_handlers(spec: dict[str, Any]):
    schemas = spec["components"]["schemas"]
    branches = schemas["TaskSpec"]["oneOf"]
    # Every branch is one installed type: no pattern lets a request name a module to import.
    consts = [b["properties"]["type"].get("const") for b in branches]
    assert None not in consts and set(consts) == set(known_handlers())
    echo = next(b for b in branches if b["properties"]["type"].get("const") == "echo")
    assert echo["required"] == ["type", "config"] and "text" in echo["properties"]["config"]["required"]
    assert schemas["BatchCreate"]["properties"]["tasks"]["maxItems"] == 77


def test_spec_filters_and_integers_are_what_the_api_accepts(spec: dict[str, Any]):
    schemas = spec["components"]["schemas"]
    assert schemas["DynamicSampling"]["properties"]["filter"]["enum"] == known_filters()
    for model in ("SamplingParams", "TrialSampling"):
        assert schemas[model]["properties"]["top_k"]["not"] == {"const": 0}, model
    model = schemas["BackendCreate"]["properties"]["model"]["anyOf"][0]
    assert model["pattern"] == NO_NUL_PATTERN and model["maxLength"] == 500


def test_a_spec_branch_per_allowed_handler_path(tmp_path: Path):
    settings = Settings(
        data_dir=tmp_path,
        redis={"url": "redis://127.0.0.1:1/0"},
        api={"token": "t"},
        handler_paths=["farm.handlers.echo:EchoHandler"],
    )
    try:
        spec = create_app(settings).openapi()
    finally:
        allow_handler_paths([])
    branches = spec["components"]["schemas"]["TaskSpec"]["oneOf"]
    path = next(b for b in branches if b["properties"]["type"]["const"] == "farm.handlers.echo:EchoHandler")
    assert path["title"] == "Farm.handlers.echo_EchoHandlerTaskSpec"


def test_spec_links_a_submitted_batch_to_its_reads(spec: dict[str, Any]):
    links = spec["paths"]["/v1/batches"]["post"]["responses"]["201"]["links"]
    targets = {link["operationId"] for link in links.values()}
    assert targets == {"get_batch", "get_results", "cancel_batch", "get_job", "get_trajectory"}
    ids = {op["operationId"] for _, _, op in operations(spec)}
    assert targets <= ids


def test_undeclared_method_is_405_with_every_allowed_method(tmp_path: Path):
    settings = Settings(data_dir=tmp_path, redis={"url": "redis://127.0.0.1:1/0"}, api={"token": "t"})
    client = TestClient(create_app(settings))  # not entered: no lifespan, nothing connects
    response = client.put("/v1/backends")
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, POST"
    assert response.json()["code"] == "method_not_allowed"
    assert client.patch("/v1/backends/gpu0").headers["allow"] == "DELETE, GET"
