"""Handler state: each shipped handler declares its own ``state_class``, a state stored by the
dict-state version of a handler loads and is written back as the same JSON (jobs in flight across
an upgrade), and a state that does not fit is refused."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from farm.handlers.base import HandlerState
from farm.handlers.echo import EchoHandler
from farm.handlers.generate import GenerateState
from farm.handlers.registry import get_handler

SHIPPED = ["echo", "generate", "math", "code", "swe", "harbor", "harness"]
_PREPARED = {"key": "3f2a", "built": True, "build_s": 0.412}
_ACTIONS = [{"turn": 1, "tool": "bash", "arguments": {"command": "ls"}, "output": "a.py\n"}]
_AGENT = {"final_text": "done", "submitted": None, "actions": _ACTIONS}

#: states as the handlers wrote them while the state was a plain dict (INIT's and RUN's keys).
STORED: dict[str, dict[str, Any]] = {
    "echo": {"prompt_ids": [1, 101, 102, 3], "target": "ab"},
    "generate": {"reply": "4"},
    "math": {"final_text": "\\boxed{4}", "submitted": {"answer": "4"}, "actions": []},
    "code": {"sandbox": "sb-1", "prepared": _PREPARED, "solution": "def f(): ...", "solution_from": "answer", **_AGENT},
    "swe": {
        "base_commit": "abc123",
        "sandbox": "sb-2",
        "prepared": _PREPARED,
        "patch": None,
        "patch_error": "x",
        **_AGENT,
    },
    "harbor": {"sandbox": "sb-3", "prepared": _PREPARED, **_AGENT},
    # A harness keeps its inner task's keys (a swe base commit here) next to its own.
    "harness": {"sandbox": "sb-4", "prepared": _PREPARED, "harness_path": "/env/bin:/usr/bin", "base_commit": "abc"},
}


@pytest.mark.parametrize("name", SHIPPED)
def test_state_every_shipped_handler_declares_its_own_state_class(name):
    handler = get_handler(name)
    declared = [cls for cls in type(handler).__mro__ if "state_class" in vars(cls)]
    assert declared[0] is type(handler) and issubclass(handler.state_class, HandlerState)
    assert handler.state_class is not HandlerState


@pytest.mark.parametrize("name", SHIPPED)
def test_state_stored_by_the_dict_version_loads_and_is_written_back_unchanged(name):
    handler = get_handler(name)
    state = handler.load_state(STORED[name])
    assert isinstance(state, handler.state_class)
    assert handler.stored_state(state) == STORED[name]


def test_state_that_does_not_fit_its_fields_is_refused():
    with pytest.raises(ValidationError):
        EchoHandler().load_state({"prompt_ids": "not ids"})
    with pytest.raises(ValidationError):
        EchoHandler().load_state({}).updated({"target": 5})


def test_state_of_another_handler_is_refused():
    with pytest.raises(TypeError, match="not its state_class"):
        EchoHandler().stored_state(GenerateState(reply="4"))


def test_state_a_default_never_set_is_not_written():
    assert GenerateState().stored() == {}
    assert get_handler("code").load_state({"solution": "x"}).stored() == {"solution": "x"}
