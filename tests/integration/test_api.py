"""The HTTP facade in-process (TestClient) on real PostgreSQL and Redis: auth, bad input,
idempotency, OpenAPI. No worker runs here, so submitted jobs stay queued."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Collection, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import cast

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from farm.api.app import create_app
from farm.client import FarmClient
from farm.config import Settings
from farm.constants import JobState
from farm.errors import ApiError, ConfigError, HandlerNotFound, InvalidSpec, NotFound, Unauthorized

pytestmark = pytest.mark.integration

TOKEN = "api-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def api(tmp_path: Path, pg_url: str, redis_url: str, redis_client: object) -> Iterator[TestClient]:
    settings = Settings(
        data_dir=tmp_path,
        database={"url": pg_url},
        redis={"url": redis_url},
        api={"token": TOKEN, "max_body_bytes": 64 * 1024},
    )
    with TestClient(create_app(settings)) as client:
        yield client


def echo_batch(**extra) -> dict:
    return {"tasks": [{"type": "echo", "config": {"text": "hi"}}], **extra}


def assert_error(response, status: int, code: str, *, field: str | None = None, says: str = "") -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["code"] == code
    assert says in body["detail"]
    if field is not None:
        assert body.get("field") == field


def test_health_needs_no_token(api: TestClient):
    assert api.get("/healthz").json()["status"] == "ok"
    ready = api.get("/readyz").json()
    assert ready["status"] == "ok" and ready["checks"] == {"database": "ok", "redis": "ok"}


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("post", "/v1/batches"),
        ("get", "/v1/batches/1"),
        ("get", "/v1/batches/1/results"),
        ("post", "/v1/batches/1/cancel"),
        ("get", "/v1/jobs/1"),
        ("get", "/v1/jobs/1/trajectory"),
        ("get", "/metrics"),
        ("get", "/v1/handlers"),
    ],
)
def test_every_route_but_health_refuses_without_token(api: TestClient, method: str, path: str):
    response = api.request(method, path, json=echo_batch())
    assert_error(response, 401, "unauthorized", says="bearer token")
    assert response.headers["www-authenticate"] == "Bearer"
    wrong = api.request(method, path, json=echo_batch(), headers={"Authorization": "Bearer nope"})
    assert_error(wrong, 401, "unauthorized", says="invalid bearer token")


def test_app_refuses_to_start_without_a_token(tmp_path: Path):
    with pytest.raises(ConfigError, match="FARM_API__TOKEN"):
        create_app(Settings(data_dir=tmp_path, redis={"url": "redis://127.0.0.1:1/0"}))


def test_unknown_task_type_names_the_known_ones(api: TestClient):
    response = api.post("/v1/batches", json={"tasks": [{"type": "nope", "config": {}}]}, headers=AUTH)
    known = "known types: code, echo, generate, harbor, harness, math, swe"
    assert_error(response, 422, "unknown_task_type", field="tasks.0.type", says=known)


def test_bad_task_config_names_the_field(api: TestClient):
    body = {"tasks": [{"type": "echo", "config": {"text": "ok"}}, {"type": "echo", "config": {"text": ""}}]}
    response = api.post("/v1/batches", json=body, headers=AUTH)
    assert_error(response, 422, "invalid_spec", field="tasks.1.config.text", says="at least 1 character")
    unknown_key = {"tasks": [{"type": "echo", "config": {"text": "x", "colour": 1}}]}
    assert_error(
        api.post("/v1/batches", json=unknown_key, headers=AUTH), 422, "invalid_spec", field="tasks.0.config.colour"
    )


def test_one_answer_lists_every_problem_of_a_batch(api: TestClient):
    # A schema error (sampling) and a handler's (the math config) in one request: both in one answer.
    body = {"tasks": [{"type": "math", "config": {"problem_id": "nope"}}], "sampling": {"temperature": "hot"}}
    response = api.post("/v1/batches", json=body, headers=AUTH)
    assert_error(response, 422, "invalid_request", field="sampling.temperature", says="(and 1 more)")
    problems = {p["field"]: p["detail"] for p in response.json()["errors"]}
    assert set(problems) == {"sampling.temperature", "tasks.0.config.problem_id"}, problems
    # The hint names the API route that lists the shipped problems, not a module of the source.
    assert "GET /v1/tasks?type=math" in problems["tasks.0.config.problem_id"]
    assert api.get("/v1/tasks?type=math", headers=AUTH).status_code == 200


def test_every_problem_of_every_task_is_listed_with_a_readable_field(api: TestClient):
    body = {
        "tasks": [
            {"type": "math", "config": {"problem_id": "nope", "max_turns": 0}},
            {"type": "math", "config": {}},  # neither problem_id nor problem: a model validator's error
            {"type": "nope"},
        ]
    }
    response = api.post("/v1/batches", json=body, headers=AUTH)
    assert_error(response, 422, "invalid_spec", field="tasks.0.config.problem_id", says="(and 3 more)")
    fields = [p["field"] for p in response.json()["errors"]]
    assert fields == ["tasks.0.config.problem_id", "tasks.0.config.max_turns", "tasks.1.config", "tasks.2.type"]
    # One problem alone is a list of one, and the first problem's class still picks the code.
    alone = api.post("/v1/batches", json={"tasks": [{"type": "nope"}]}, headers=AUTH)
    assert_error(alone, 422, "unknown_task_type", field="tasks.0.type")
    assert [p["field"] for p in alone.json()["errors"]] == ["tasks.0.type"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tasks": []}, "tasks"),
        (echo_batch(group_size=0), "group_size"),
        (echo_batch(sampling={"temperature": -1}), "sampling.temperature"),
        ({"task": []}, "tasks"),
        (echo_batch(extra=1), "extra"),
        (echo_batch(history="verbatim"), "history"),
        # found by the fuzz test: a NUL cannot be stored in a text column (was a 500)
        ({"tasks": [{"type": "echo", "config": {"text": "x"}, "name": "a\u0000b"}]}, "tasks.0.name"),
    ],
)
def test_malformed_batch_names_the_field(api: TestClient, body: dict, field: str):
    assert_error(api.post("/v1/batches", json=body, headers=AUTH), 422, "invalid_request", field=field)


@pytest.mark.parametrize("body", [None, b"[]", b"null"], ids=["none", "a list", "null"])
def test_a_body_missing_or_not_an_object_is_named(api: TestClient, body: bytes | None):
    headers = {**AUTH, "content-type": "application/json"}
    assert_error(api.post("/v1/batches", content=body, headers=headers), 422, "invalid_request", field="body")
    assert_error(api.post("/v1/trials", content=body, headers=headers), 422, "invalid_request", field="body")


def test_malformed_json_is_a_clear_422(api: TestClient):
    body = b'{"tasks": [\n  {"type": "echo", "config": {"text": "hi"},}\n]}'
    response = api.post("/v1/batches", content=body, headers={**AUTH, "content-type": "application/json"})
    # The body is named as the culprit, with where it broke; never the offset as if it were a field.
    assert_error(response, 422, "invalid_request", field="body", says="not valid JSON at line 2 column 45")


def test_oversized_body_is_413(api: TestClient):
    body = {"tasks": [{"type": "echo", "config": {"text": "x" * 70_000}}]}
    assert_error(api.post("/v1/batches", json=body, headers=AUTH), 413, "body_too_large", says="split the batch")


def test_oversized_body_sent_without_a_length_is_413(api: TestClient):
    def chunks() -> Iterator[bytes]:
        yield b'{"tasks": [{"type": "echo", "config": {"text": "'
        for _ in range(70):
            yield b"x" * 1024
        yield b'"}}]}'

    response = api.post("/v1/batches", content=chunks(), headers={**AUTH, "content-type": "application/json"})
    assert_error(response, 413, "body_too_large", says="split the batch")


def test_too_many_tasks_in_one_batch_is_a_422_naming_tasks(tmp_path: Path, pg_url: str, redis_url: str, redis_client):
    settings = Settings(
        data_dir=tmp_path,
        database={"url": pg_url},
        redis={"url": redis_url},
        api={"token": TOKEN, "max_tasks_per_batch": 2},
    )
    body = {"tasks": [{"type": "echo", "config": {"text": f"t{i}"}} for i in range(3)]}
    with TestClient(create_app(settings)) as client:
        response = client.post("/v1/batches", json=body, headers=AUTH)
    assert_error(response, 422, "invalid_spec", field="tasks", says="exceed the limit of 2")
    assert redis_client.llen("init") == 0


def test_too_many_jobs_in_one_batch_is_a_422_naming_group_size(tmp_path: Path, pg_url: str, redis_url: str):
    settings = Settings(
        data_dir=tmp_path,
        database={"url": pg_url},
        redis={"url": redis_url},
        api={"token": TOKEN, "max_jobs_per_batch": 10},
    )
    body = {"tasks": [{"type": "echo", "config": {"text": f"t{i}"}} for i in range(3)], "group_size": 4}
    with TestClient(create_app(settings)) as client:
        response = client.post("/v1/batches", json=body, headers=AUTH)
        assert_error(response, 422, "invalid_spec", field="group_size", says="12 jobs exceed the limit of 10")
        assert client.post("/v1/batches", json={**body, "group_size": 3}, headers=AUTH).status_code == 201
        spec = client.get("/openapi.json", headers=AUTH).json()
    assert "at most 10" in spec["components"]["schemas"]["BatchCreate"]["properties"]["group_size"]["description"]


def test_the_client_raises_the_farm_error_of_each_answer(api: TestClient):
    """``except NotFound`` works on the trainer's side of the wire, as it does on the server's."""

    def through_the_app(request: httpx.Request) -> httpx.Response:
        answer = api.request(request.method, str(request.url), headers=request.headers, content=request.content)
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    transport = httpx.MockTransport(through_the_app)
    with FarmClient("http://testserver", token=TOKEN, transport=transport) as client:
        with pytest.raises(NotFound) as missing:
            client.status(987654321)
        assert isinstance(missing.value, ApiError) and missing.value.status == 404
        with pytest.raises(HandlerNotFound):
            client.submit([{"type": "no-such-type"}])
        with pytest.raises(InvalidSpec) as bad:
            client.submit([{"type": "echo", "config": {"text": ""}}])
        assert bad.value.field is not None and "text" in bad.value.field
    with FarmClient("http://testserver", token="wrong", transport=transport) as client:
        with pytest.raises(Unauthorized):
            client.status(1)


def test_unknown_ids_are_404(api: TestClient):
    assert_error(api.get("/v1/batches/999999", headers=AUTH), 404, "not_found", says="no batch with id 999999")
    assert_error(api.get("/v1/jobs/999999", headers=AUTH), 404, "not_found", says="no job with id 999999")
    assert_error(api.get("/v1/jobs/999999/trajectory", headers=AUTH), 404, "not_found")
    assert_error(api.post("/v1/batches/999999/cancel", headers=AUTH), 404, "not_found")
    assert_error(api.get("/v1/batches/abc", headers=AUTH), 422, "invalid_request", field="path.batch_id")


def test_job_without_trajectory_says_why(api: TestClient):
    created = api.post("/v1/batches", json=echo_batch(), headers=AUTH).json()
    response = api.get(f"/v1/jobs/{created['job_ids'][0]}/trajectory", headers=AUTH)
    assert_error(response, 404, "not_found", says="has no trajectory (state queued)")


def test_idempotent_resubmit_returns_the_same_batch(api: TestClient, redis_client):
    headers = {**AUTH, "Idempotency-Key": "step-42"}
    first = api.post("/v1/batches", json=echo_batch(group_size=3), headers=headers)
    again = api.post("/v1/batches", json=echo_batch(group_size=3), headers=headers)
    assert first.status_code == 201 and again.status_code == 200
    assert redis_client.llen("init") == 3  # the batch's messages were sent once
    assert first.json()["id"] == again.json()["id"] and first.json()["job_ids"] == again.json()["job_ids"]
    assert again.json()["created"] is False
    other = api.post("/v1/batches", json=echo_batch(group_size=4), headers=headers)
    assert_error(other, 409, "conflict", says="step-42")


def test_submit_enqueues_one_init_message_per_job(api: TestClient, redis_client):
    created = api.post("/v1/batches", json=echo_batch(group_size=5), headers=AUTH).json()
    assert redis_client.llen("init") == 5
    status = api.get(f"/v1/batches/{created['id']}", headers=AUTH).json()
    assert status["counts"]["queued"] == 5 and status["total_jobs"] == 5 and status["state"] == "running"


def test_results_long_poll_returns_empty_page_after_wait(api: TestClient):
    created = api.post("/v1/batches", json=echo_batch(), headers=AUTH).json()
    page = api.get(f"/v1/batches/{created['id']}/results", params={"wait_s": 0.3}, headers=AUTH).json()
    assert page == {
        "items": [],
        "next_cursor": 0,
        "batch_state": "running",
        "remaining": 1,
        "finished": 0,
        "ready_seq": None,
    }


def test_cancel_then_results_hold_every_job(api: TestClient):
    created = api.post("/v1/batches", json=echo_batch(group_size=2), headers=AUTH).json()
    status = api.post(f"/v1/batches/{created['id']}/cancel", headers=AUTH).json()
    assert status["state"] == "cancelled" and status["counts"]["cancelled"] == 2
    page = api.get(f"/v1/batches/{created['id']}/results", headers=AUTH).json()
    assert [i["job"]["outcome"] for i in page["items"]] == ["cancelled", "cancelled"]
    assert page["remaining"] == 0


def test_openapi_describes_the_routes_and_auth(api: TestClient):
    spec = api.get("/openapi.json").json()
    paths = spec["paths"]
    for path in (
        "/v1/batches",
        "/v1/batches/{batch_id}",
        "/v1/batches/{batch_id}/results",
        "/v1/batches/{batch_id}/cancel",
        "/v1/jobs/{job_id}",
        "/v1/jobs/{job_id}/trajectory",
    ):
        assert path in paths
    post = paths["/v1/batches"]["post"]
    assert post["security"] == [{"HTTPBearer": []}]
    assert {"201", "200", "409", "413", "422"} <= set(post["responses"])
    assert any(p["name"] == "idempotency-key" for p in post["parameters"])
    assert "security" not in paths["/healthz"]["get"]


def test_handlers_lists_echo_with_its_schema(api: TestClient):
    handlers = {h["name"]: h for h in api.get("/v1/handlers", headers=AUTH).json()}
    assert "text" in handlers["echo"]["config_schema"]["properties"]


def test_metrics_are_prometheus_text(api: TestClient):
    def queued() -> int:
        text = api.get("/metrics", headers=AUTH).text
        # Every state is a series, whatever jobs the database holds (a gap would read as "no data"
        # on a dashboard). Counts are not asserted: other tests' jobs share this database.
        for state in JobState:
            assert re.search(rf'^farm_jobs\{{state="{state}"\}} \d+$', text, re.M), state
        assert 'farm_queue_length{queue="init",stage="init",node=""}' in text
        return int(re.search(r'^farm_jobs\{state="queued"\} (\d+)$', text, re.M)[1])  # type: ignore[index]

    before = queued()
    api.post("/v1/batches", json=echo_batch(), headers=AUTH)
    assert queued() == before + 1
    text = api.get("/metrics", headers=AUTH).text
    assert "# TYPE farm_batch_seconds_to gauge" in text and "# TYPE farm_batch_carried_jobs gauge" in text


def test_backends_redis_lost_are_registered_again_from_the_database(tmp_path, pg_url, redis_url, redis_client):
    settings = Settings(
        data_dir=tmp_path,
        database={"url": pg_url},
        redis={"url": redis_url},
        api={"token": TOKEN},
        llm={"health_interval_s": 3600},  # this test runs the checker's rounds itself
    )
    with TestClient(create_app(settings)) as api:
        _check_backends_are_restored(api, redis_client)


def _check_backends_are_restored(api: TestClient, redis_client) -> None:
    # Given a backend registered through the API (and one removed again),
    body = {"id": "gpu-a", "url": "http://127.0.0.1:9/", "kind": "vllm", "capacity": 4}
    assert api.post("/v1/backends", json=body, headers=AUTH).status_code == 201
    assert api.post("/v1/backends", json={**body, "id": "gone"}, headers=AUTH).status_code == 201
    assert api.delete("/v1/backends/gone", headers=AUTH).status_code == 204
    # when Redis loses everything,
    redis_client.flushdb()
    assert api.get("/v1/backends", headers=AUTH).json() == []
    # then the health checker's next round puts back what the database has, and only that.
    checker_restore = cast(FastAPI, api.app).state.farm_checker.restore
    assert checker_restore() == 1
    [backend] = api.get("/v1/backends", headers=AUTH).json()
    assert (backend["id"], backend["url"], backend["capacity"], backend["inflight"]) == (
        "gpu-a",
        "http://127.0.0.1:9",
        4,
        0,
    )
    assert checker_restore() == 0


@pytest.mark.parametrize(
    "path", ["/v1/batches/9223372036854775808", "/v1/batches/99999999999999999999/results", "/v1/jobs/-1"]
)
def test_ids_out_of_range_are_a_clear_422(api: TestClient, path: str):
    response = api.get(path, headers=AUTH)
    assert response.status_code == 422, response.text
    assert response.json()["code"] == "invalid_request" and response.json()["field"].startswith("path.")


def test_backend_url_a_client_cannot_parse_is_a_422_naming_url(api: TestClient):
    for url in ["http://[", "http://a\x13b:80", "http://999.1.1.1", "http://gpu0:70000"]:
        response = api.post("/v1/backends", json={"url": url}, headers=AUTH)
        assert_error(response, 422, "invalid_request", field="url")
    ok = api.post("/v1/backends", json={"url": "http://[::1]:8000/v1"}, headers=AUTH)
    assert ok.status_code == 201 and ok.json()["url"] == "http://[::1]:8000/v1"


def test_tasks_lists_what_each_family_ships_with_the_config_that_submits_it(api: TestClient):
    listed = api.get("/v1/tasks", headers=AUTH)
    assert listed.status_code == 200
    by_type = {family["type"]: family["tasks"] for family in listed.json()}
    assert set(by_type) == {"math", "code", "swe", "harbor"}
    assert len(by_type["math"]) == 120 and all(t["config"] == {"problem_id": t["id"]} for t in by_type["math"])
    assert {t["config"]["example"] for t in by_type["harbor"]} >= {"hello-file"}
    # Each listed config is accepted as it is.
    batch = {"tasks": [{"type": family, "config": tasks[0]["config"]} for family, tasks in by_type.items()]}
    assert api.post("/v1/batches", json=batch, headers=AUTH).status_code == 201
    [only] = api.get("/v1/tasks", params={"type": "swe"}, headers=AUTH).json()
    assert only["type"] == "swe" and only["tasks"] == by_type["swe"]
    assert_error(api.get("/v1/tasks", params={"type": "chess"}, headers=AUTH), 404, "not_found", says="math")
    assert api.get("/v1/tasks").status_code == 401


def test_listing_tasks_imports_no_sandbox_agent_or_tool_code(tmp_path: Path, pg_url: str, redis_url: str):
    import subprocess
    import sys

    script = f"""
import sys
from fastapi.testclient import TestClient
from farm.api.app import create_app
from farm.config import Settings
settings = Settings(data_dir={str(tmp_path)!r}, database={{"url": {pg_url!r}}}, redis={{"url": {redis_url!r}}},
                    api={{"token": "t"}})
with TestClient(create_app(settings)) as api:
    assert api.get("/v1/tasks", headers={{"Authorization": "Bearer t"}}).status_code == 200
print(sorted(m for m in sys.modules if m.startswith(("farm.sandbox", "farm.agent", "farm.tools"))))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_need_no_internet(api: TestClient, page: str):
    html = api.get(page).text
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert assets and not any("//" in a for a in assets), assets  # nothing from a CDN
    for asset in assets:
        response = api.get(asset)
        assert response.status_code == 200 and len(response.content) > 1000, asset


def test_a_query_parameter_given_twice_that_takes_one_value_is_a_422(api: TestClient):
    response = api.get("/v1/pass-rates?type=math&type=code", headers=AUTH)
    assert_error(response, 422, "invalid_request", field="query.type", says="given 2 times")
    # One that takes several may be repeated.
    assert api.get("/v1/pass-rates?key=name:a&key=name:b", headers=AUTH).status_code == 200
    nul = api.get("/v1/pass-rates?key=name:%00a", headers=AUTH)
    assert_error(nul, 422, "invalid_request", field="query.key", says="NUL")


def test_a_backend_with_a_very_long_url_gets_an_id_that_fits(api: TestClient):
    url = "http://gpu0:8000/" + "x/" * 400
    body = api.post("/v1/backends", json={"url": url}, headers=AUTH).json()
    other = api.post("/v1/backends", json={"url": url + "y"}, headers=AUTH).json()
    assert len(body["id"]) <= 200 and len(other["id"]) <= 200 and body["id"] != other["id"]


def test_a_weight_update_goes_on_without_a_backend_it_cannot_reach(api: TestClient):
    # Nothing listens on port 9: the backend is down. It must not hold every other backend (and
    # every new turn) paused for good: it is ejected from the balancer and the update goes on.
    gone = api.post("/v1/backends", json={"id": "gone", "url": "http://127.0.0.1:9"}, headers=AUTH).json()
    paused = api.post("/v1/weights/pause", json={"mode": "keep"}, headers=AUTH)
    assert paused.status_code == 201, paused.text
    update = paused.json()
    row = next(b for b in update["backends"] if b["id"] == gone["id"])
    assert row["error"].startswith("ejected, cannot take part") and row["paused_at"] is None
    assert row["pause_outcome"] == "ejected"
    assert api.get(f"/v1/backends/{gone['id']}", headers=AUTH).json()["healthy"] is False
    resumed = api.post(f"/v1/weights/updates/{update['id']}/resume", json={"version": 1}, headers=AUTH)
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["phase"] == "done"
    weights = api.get("/v1/weights", headers=AUTH).json()
    assert weights["paused"] is False and weights["backends"]["gone"] == 0  # never got version 1


class _Control(BaseHTTPRequestHandler):
    """A backend's weight-update routes: POSTs in ``server.broken`` always answer 500, those in
    ``server.flaky`` once; every POST is recorded in ``server.calls``."""

    server: _ControlServer

    def do_GET(self):  # noqa: N802 - http.server's naming
        self._answer(200)  # /health

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = self.path.split("?")[0]
        self.server.calls.append(path)
        if path in self.server.broken or (path in self.server.flaky and self.server.calls.count(path) == 1):
            self._answer(500)
        else:
            self._answer(200)

    def _answer(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


class _ControlServer(ThreadingHTTPServer):
    def __init__(self, *, broken: Collection[str] = (), flaky: Collection[str] = ()) -> None:
        super().__init__(("127.0.0.1", 0), _Control)
        self.broken, self.flaky = broken, flaky
        self.calls: list[str] = []


@pytest.fixture
def control_server() -> Iterator[Callable[..., _ControlServer]]:
    servers: list[_ControlServer] = []

    def start(**kwargs) -> _ControlServer:
        server = _ControlServer(**kwargs)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_backend_whose_pause_was_refused_is_never_resumed(
    tmp_path: Path, pg_url: str, redis_url: str, redis_client: object, control_server
):
    # Given a backend that answers every control call with an error, and one whose first resume fails
    # (the API's own re-driver is kept out of the way: the trainer rolls back twice itself).
    settings = Settings(
        data_dir=tmp_path,
        database={"url": pg_url},
        redis={"url": redis_url},
        api={"token": TOKEN},
        llm={"weight_redrive_interval_s": 3600},
    )
    broken = control_server(broken={"/pause", "/update_weight_version", "/resume"})
    flaky = control_server(flaky={"/resume"})
    with TestClient(create_app(settings)) as api:
        for name, server in (("broken", broken), ("flaky", flaky)):
            url = f"http://127.0.0.1:{server.server_address[1]}"
            assert api.post("/v1/backends", json={"id": name, "url": url}, headers=AUTH).status_code == 201
        # When the pause is refused by one, and the rollback fails to resume the other
        paused = api.post("/v1/weights/pause", json={"mode": "keep"}, headers=AUTH)
        assert paused.status_code == 502, paused.text
        update = api.get("/v1/weights", headers=AUTH).json()["update"]
        outcomes = {b["id"]: b["pause_outcome"] for b in update["backends"]}  # (and other tests' backends)
        assert update["phase"] == "rolling_back" and (outcomes["broken"], outcomes["flaky"]) == ("refused", "paused")
        # Then rolling back again resumes the one that paused, and never asks the one that refused
        again = api.post(f"/v1/weights/updates/{update['id']}/rollback", headers=AUTH)
        assert again.status_code == 200, again.text
        assert again.json()["phase"] == "rolled_back"
    assert broken.calls == ["/pause"]
    assert flaky.calls.count("/resume") == 2
