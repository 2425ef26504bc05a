"""A farm with its built-in backend, for the proxy: trials are made through the API, and the
harness side is the real openai and anthropic SDKs pointed at the trial's base URL."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest

from farm.constants import Stage
from farm.embedded import EmbeddedStack
from tests.integration.conftest import scripted_stack

pytestmark = pytest.mark.integration

TOKEN = {"Authorization": "Bearer e2e-token"}
#: ``qwen3_scripted(node, rules, stages=None)``: a farm on the qwen3 tiny model whose backend answers by ``rules``.
Qwen3Scripted = Callable[..., AbstractContextManager[EmbeddedStack]]


@pytest.fixture(scope="module")
def qwen3_scripted(
    tmp_path_factory: pytest.TempPathFactory,
    module_pg_url: str,
    redis_url: str,
    family_model_dir: Callable[[str], Path],
) -> Qwen3Scripted:
    """Starts the module's farm on the qwen3 tiny model (the real Qwen3 tokenizer and template), its
    built-in backend scripted by the module's rules; ``stages=()`` starts no workers."""

    def start(node: str, rules: Any, stages: tuple[Stage, ...] | None = None) -> AbstractContextManager[EmbeddedStack]:
        return scripted_stack(
            tmp_path_factory.mktemp(node),
            redis_url=redis_url,
            redis_offset=0,
            database_url=module_pg_url,
            model_dir=family_model_dir("qwen3"),
            node=node,
            rules=rules,
            stages=stages,
        )

    return start


#: a prompt holding this word gets scripted replies: a tool call, then a final answer.
TOOL_WORD = "TOOLTEST"
TOOL_CALL_TEXT = 'Let me look.<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
FINAL_TEXT = "There are two files."
#: a prompt holding this word gets a reply with two tool calls, then a final answer.
PARALLEL_WORD = "TWOCALLS"
PARALLEL_TEXT = (
    'Let me look.<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "bash", "arguments": {"command": "cat notes.txt"}}\n</tool_call>'
)
#: a prompt holding this word gets a long forced answer (seconds of decoding: time to kill a process).
SLOW_WORD = "SLOWTEST"
#: prompts for tool_choice tests: the scripted text continues the call opening the proxy forced.
REQUIRED_WORD = "CHOICEREQUIRED"  # after '<tool_call>\n{"name": "' (required, several tools)
NAMED_WORD = "CHOICENAMED"  # after '<tool_call>\n{"name": "bash", "arguments":' (named, or required with one tool)
UNMET_WORD = "CHOICEUNMET"  # not a call: the choice is unmet
RULES = {
    "rules": [
        {"match": TOOL_WORD, "turns": [TOOL_CALL_TEXT, FINAL_TEXT]},
        {"match": PARALLEL_WORD, "turns": [PARALLEL_TEXT, FINAL_TEXT]},
        {"match": REQUIRED_WORD, "turns": ['bash", "arguments": {"command": "ls -la"}}\n</tool_call>', FINAL_TEXT]},
        {"match": NAMED_WORD, "turns": [' {"command": "pwd"}}\n</tool_call>', FINAL_TEXT]},
        {"match": UNMET_WORD, "turns": ["I would rather talk.", FINAL_TEXT]},
        {"match": SLOW_WORD, "turns": ["and so on " * 1200]},
    ]
}
BASH_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}


class _SharedStack:
    """The one farm of this folder's proxy tests: started by the first module that asks for it, stopped
    when the run leaves the folder (``pytest_runtest_teardown``) or at the session's end. A farm with
    its built-in backend takes ~20 s to start: one per module cost minutes. (pytest's package scope
    would need an ``__init__.py``, which would rename these modules.)"""

    def __init__(self) -> None:
        self.stack: EmbeddedStack | None = None
        self._exit = contextlib.ExitStack()

    def get(self, start: Callable[[contextlib.ExitStack], EmbeddedStack]) -> EmbeddedStack:
        if self.stack is None:
            self.stack = start(self._exit)
        return self.stack

    def stop(self) -> None:
        self.stack = None
        self._exit.close()


_SHARED = _SharedStack()


@pytest.fixture(scope="session")
def _shared_proxy_stack() -> Iterator[_SharedStack]:
    yield _SHARED
    _SHARED.stop()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if nextitem is None or Path(__file__).parent not in nextitem.path.parents:
        _SHARED.stop()


@pytest.fixture(scope="module")
def proxy_stack(
    _shared_proxy_stack: _SharedStack,
    tmp_path_factory: pytest.TempPathFactory,
    postgres_url: str,
    redis_url: str,
    tiny_model_dir: Path,
) -> EmbeddedStack:
    """A farm whose built-in backend samples, except for prompts holding TOOL_WORD (scripted), shared
    by this folder's modules: a database of its own, and the Redis database 2 past the test one (the
    modules here with farms of their own use the others)."""
    from farm.testing import temporary_database

    def start(exit: contextlib.ExitStack) -> EmbeddedStack:
        database_url = exit.enter_context(temporary_database(postgres_url, prefix="farm_proxy", wait_for_disk=False))
        return exit.enter_context(
            scripted_stack(
                tmp_path_factory.mktemp("proxy-stack"),
                redis_url=redis_url,
                redis_offset=2,
                database_url=database_url,
                model_dir=tiny_model_dir,
                node="proxytest",
                rules=RULES,
            )
        )

    return _shared_proxy_stack.get(start)


@pytest.fixture
def api(proxy_stack: EmbeddedStack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=proxy_stack.settings.api_url, headers=TOKEN, timeout=60) as client:
        yield client


@pytest.fixture
def new_trial(api: httpx.Client) -> Any:
    def make(**body: Any) -> dict[str, Any]:
        resp = api.post("/v1/trials", json=body)
        assert resp.status_code == 201, resp.text
        return dict(resp.json())

    return make


@pytest.fixture(autouse=True)
def _close_sdk_clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every sync SDK client a test makes is closed after it: an open one leaks its sockets into a
    later test's ResourceWarning."""
    import anthropic
    import openai

    made: list[Any] = []
    for cls in (openai.OpenAI, anthropic.Anthropic):

        def init(self: Any, *args: Any, __original: Any = cls.__init__, **kwargs: Any) -> None:
            __original(self, *args, **kwargs)
            made.append(self)

        monkeypatch.setattr(cls, "__init__", init)
    yield
    for client in made:
        client.close()
