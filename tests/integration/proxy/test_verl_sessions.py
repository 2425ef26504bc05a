"""verl-recipe's RemoteAgentLoop session calls against the farm, made as verl makes them.

verl's loop (verl-project/verl-recipe ``agentic/agent_loop/remote_agent_loop.py``) sends bodiless
requests to ``{proxy_url}/sessions/{trial_id}`` and hands its harness the base URL
``http://{LLM_PROXY_IP}:{port of proxy_url}/{trial_id}/v1``; here the harness is the real openai SDK.
The proxy URL carries the farm's token as userinfo, which aiohttp (verl's client) and httpx both
send as Basic auth.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import httpx
import openai
import pytest

from farm.embedded import EmbeddedStack
from tests.integration.proxy.conftest import BASH_TOOL, FINAL_TEXT, TOOL_WORD

pytestmark = pytest.mark.integration


@pytest.fixture
def verl(proxy_stack: EmbeddedStack) -> Iterator[tuple[httpx.Client, str]]:
    """verl's side: a client for the proxy URL (token as userinfo) and the URL's port."""
    port = urlparse(proxy_stack.settings.api_url).port
    with httpx.Client(base_url=f"http://verl:e2e-token@127.0.0.1:{port}", timeout=60) as client:
        yield client, str(port)


def _trial_id() -> str:
    # verl's id: the dataset row's instance_id, "-", a shortuuid.
    return "astropy__astropy-12907-" + secrets.token_urlsafe(16).replace("-", "x").replace("_", "y")


def _ok(resp: httpx.Response) -> dict[str, Any]:
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def test_verl_sessions_record_a_multi_turn_harness_token_exact(
    verl: tuple[httpx.Client, str], api: httpx.Client
) -> None:
    client, port = verl
    trial_id = _trial_id()
    # Given a session registered as verl registers it
    registered = _ok(client.post(f"/sessions/{trial_id}"))
    assert registered["session_id"] == trial_id and registered["status"] == "created"
    # When the harness runs a tool call round and a plain turn at the base URL verl forms
    harness = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/{trial_id}/v1", api_key=registered["api_key"])
    messages: list[Any] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": f"{TOOL_WORD}: list the files"},
    ]
    first = harness.chat.completions.create(model="farm-tiny", messages=messages, tools=[BASH_TOOL])
    (call,) = first.choices[0].message.tool_calls or []
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "a.txt\nb.txt"},
    ]
    second = harness.chat.completions.create(model="farm-tiny", messages=messages, tools=[BASH_TOOL])
    assert second.choices[0].message.content == FINAL_TEXT
    # And verl completes the session, then reads it (its order), then deletes it
    assert _ok(client.post(f"/sessions/{trial_id}/complete")) == {"session_id": trial_id, "status": "completed"}
    session = _ok(client.get(f"/sessions/{trial_id}"))
    farm_record = _ok(api.get(f"/v1/trials/{trial_id}/record"))
    assert _ok(client.delete(f"/sessions/{trial_id}"))["status"] == "deleted"

    # Then the record is verl's SessionRecord: one turn per call, whole requests, the reply given
    assert session["session_id"] == trial_id and session["completed"] is True
    turn0, turn1 = session["turns"]
    assert turn0["request_messages"] == messages[:2]
    assert [m["role"] for m in turn1["request_messages"]] == ["system", "user", "assistant", "tool"]
    assert turn1["request_messages"][2]["tool_calls"][0]["function"] == {
        "name": "bash",
        "arguments": {"command": "ls -la"},
    }
    assert turn0["finish_reason"] == "tool_calls" and turn0["tool_calls"][0]["id"] == call.id
    assert turn1["completion_text"] == FINAL_TEXT and turn1["tool_calls"] is None
    # And its token ids and logprobs are exactly the model spans of the farm's own record
    (segment,) = farm_record["segment_tokens"]
    model_spans = [span for span in segment["spans"] if span[0] == "model"]
    assert len(model_spans) == 2
    for turn, (_, start, end, _seq) in zip(session["turns"], model_spans, strict=True):
        assert turn["completion_token_ids"] == segment["token_ids"][start:end]
        assert turn["completion_logprobs"] == segment["logprobs"][start:end]
    assert first.usage is not None and len(turn0["completion_token_ids"]) == first.usage.completion_tokens
    # And the farm's token-exact record comes along whole
    assert session["farm"]["segment_tokens"] == farm_record["segment_tokens"]
    assert session["farm"]["certificate"] == farm_record["certificate"]
    # And a deleted session is gone for verl and for its harness (a 401, or a 404 while the proxy
    # still trusts the key it checked)
    assert client.get(f"/sessions/{trial_id}").status_code == 404
    with pytest.raises((openai.AuthenticationError, openai.NotFoundError)):
        harness.chat.completions.create(model="farm-tiny", messages=messages[:2], max_tokens=4)


def test_verl_sessions_reset_before_a_retry_and_delta_messages(verl: tuple[httpx.Client, str]) -> None:
    client, port = verl
    trial_id = _trial_id()
    key = _ok(client.post(f"/sessions/{trial_id}"))["api_key"]
    harness = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/{trial_id}/v1", api_key=key)
    asked: list[Any] = [{"role": "user", "content": "first attempt"}]
    harness.chat.completions.create(model="farm-tiny", messages=asked, max_tokens=4)
    # When verl resets the session before retrying its runner (the remote_agent recipe's order)
    assert _ok(client.post(f"/sessions/{trial_id}/reset")) == {"session_id": trial_id, "status": "reset"}
    retry: list[Any] = [{"role": "user", "content": "second attempt"}]
    reply = harness.chat.completions.create(model="farm-tiny", messages=retry, max_tokens=4)
    retry += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
    harness.chat.completions.create(model="farm-tiny", messages=retry, max_tokens=4)
    # Then the record holds only the retry, and ?messages=delta stores each turn's new messages
    session = _ok(client.get(f"/sessions/{trial_id}", params={"messages": "delta"}))
    turn0, turn1 = session["turns"]
    assert turn0["request_messages"] == [{"role": "user", "content": "second attempt"}]
    assert [m["role"] for m in turn1["request_messages"]] == ["assistant", "user"]
    assert turn1["request_messages"][1]["content"] == "more"
    assert session["farm"]["calls"] == 2 and session["completed"] is False
    assert _ok(client.post(f"/sessions/{trial_id}/complete"))["status"] == "completed"
    assert client.post(f"/sessions/{trial_id}/reset").status_code == 409
    assert _ok(client.delete(f"/sessions/{trial_id}"))["status"] == "deleted"
    # And a delete of what is gone succeeds, as verl's own proxy answers it
    assert _ok(client.delete(f"/sessions/{trial_id}"))["status"] == "deleted"


def test_verl_sessions_refuse_bad_requests_with_4xx(
    verl: tuple[httpx.Client, str], proxy_stack: EmbeddedStack, new_trial: Any
) -> None:
    client, port = verl
    trial_id = _trial_id()
    assert client.post(f"/sessions/{trial_id}").status_code == 200
    again = client.post(f"/sessions/{trial_id}")
    assert again.status_code == 409 and "exists" in again.text
    # No token, a wrong one: 401 saying how to send it
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as anonymous:
        resp = anonymous.get(f"/sessions/{trial_id}")
        assert resp.status_code == 401 and "http://verl:<FARM_API__TOKEN>@" in resp.text
    with httpx.Client(base_url=f"http://verl:wrong@127.0.0.1:{port}", timeout=30) as wrong:
        assert wrong.get(f"/sessions/{trial_id}").status_code == 401
    # An id verl could not have made, an unknown session
    assert client.post("/sessions/bad%20id").status_code == 422
    assert client.get("/sessions/never-registered").status_code == 404
    assert client.post("/sessions/never-registered/complete").status_code == 404
    # A trial of the farm's own API is not a verl session to reset or delete
    own = new_trial()
    resp = client.post(f"/sessions/{own['id']}/reset")
    assert resp.status_code == 409 and "/v1/trials" in resp.text
    # A harness without the session's key is refused in OpenAI's shape
    harness = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/{trial_id}/v1", api_key=own["key"])
    with pytest.raises(openai.AuthenticationError):
        harness.chat.completions.create(model="farm-tiny", messages=[{"role": "user", "content": "hi"}])
    assert client.delete(f"/sessions/{trial_id}").status_code == 200


def test_verl_sessions_take_the_configured_harness_key(tmp_path: Any, sqlite_url: str, isolated_redis_url: str) -> None:
    from fastapi.testclient import TestClient

    from farm.api.app import create_app
    from farm.config import Settings
    from farm.db.models import Trial
    from farm.trials import store

    settings = Settings(
        data_dir=tmp_path,
        database={"url": sqlite_url},
        # A database of its own: flushing the module stack's would drop its backend.
        redis={"url": isolated_redis_url},
        api={"token": "t"},
        proxy={"verl_harness_key": "verl-proxy-secret"},
    )
    with TestClient(create_app(settings), base_url="http://verl:t@farm") as client:
        # verl's client never reads the answer's key: the harness has the configured one
        registered = client.post("/sessions/swe-1-abc").json()
        assert "api_key" not in registered and registered["base_url"] == "http://farm/swe-1-abc/v1"
        with client.app.state.farm.sessions() as session:  # type: ignore[attr-defined]
            trial = session.get(Trial, "swe-1-abc")
            assert trial is not None and store.key_matches(trial.key_sha256, "verl-proxy-secret")
            assert trial.meta == {"verl_session": True}


def test_verl_sessions_a_session_made_again_after_delete_records_its_own_tokens(
    verl: tuple[httpx.Client, str], teacher: Any
) -> None:
    # verl's agentic recipe retries a failed runner by deleting the session and registering the
    # same id again: the new calls are numbered from 0 again and must not reuse the old ones' ids.
    client, port = verl
    trial_id = _trial_id()

    def harness() -> openai.OpenAI:
        key = _ok(client.post(f"/sessions/{trial_id}"))["api_key"]
        return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/{trial_id}/v1", api_key=key)

    harness().chat.completions.create(
        model="farm-tiny", messages=[{"role": "user", "content": "an attempt that fails"}], max_tokens=6
    )
    assert _ok(client.delete(f"/sessions/{trial_id}"))["status"] == "deleted"
    retry = harness()
    messages: list[Any] = [{"role": "user", "content": "the retry"}]
    first = retry.chat.completions.create(model="farm-tiny", messages=messages, max_tokens=6)
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "on"}]
    retry.chat.completions.create(model="farm-tiny", messages=messages, max_tokens=6)
    session = _ok(client.get(f"/sessions/{trial_id}"))
    (segment,) = session["farm"]["segment_tokens"]
    assert [c["extends"] for c in session["farm"]["certificate"]] == [None, 0]
    # The second call was sampled after the retry's own first call: the teacher agrees on every id
    recomputed = teacher(segment["token_ids"])
    for i, m in enumerate(segment["loss_mask"]):
        if m:
            assert abs(recomputed[i] - segment["logprobs"][i]) < 1e-4, i
    client.delete(f"/sessions/{trial_id}")
