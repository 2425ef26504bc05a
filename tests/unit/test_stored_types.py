"""farm.schemas.stored at its bounds: the types every request model stores through."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, Field, ValidationError

from farm.schemas.stored import (
    MAX_JSON_DEPTH,
    MAX_METADATA_BYTES,
    StoredJson,
    StoredMetadata,
    StoredStr,
    WholeInt,
)


class Model(BaseModel):
    text: StoredStr | None = Field(default=None, max_length=10)
    config: StoredJson = Field(default_factory=dict)
    metadata: StoredMetadata = Field(default_factory=dict)
    count: WholeInt | None = Field(default=None, ge=0, le=100)


def nested(depth: int) -> dict[str, Any]:
    """An object ``depth`` levels of objects deep (the outermost is level 1)."""
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def refused(**fields: Any) -> str:
    with pytest.raises(ValidationError) as info:
        Model(**fields)
    return str(info.value.errors()[0]["msg"])


def test_json_nesting_is_bounded_at_the_depth_stated():
    assert Model(config=nested(MAX_JSON_DEPTH))
    assert "nested too deep" in refused(config=nested(MAX_JSON_DEPTH + 1))
    assert "nested too deep" in refused(config={"list": [[[[]]]] * 2, "deep": nested(MAX_JSON_DEPTH)})


def test_metadata_is_bounded_at_the_size_stated():
    fits = {"x": "y" * (MAX_METADATA_BYTES - len(json.dumps({"x": ""}, separators=(",", ":"))))}
    assert Model(metadata=fits)
    assert f"at most {MAX_METADATA_BYTES} bytes" in refused(metadata={"x": fits["x"] + "y"})
    # A config is bounded only by the body's limit.
    assert Model(config={"x": "y" * 2 * MAX_METADATA_BYTES})


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({"a": [1.0, float("nan")]}, "at a.1 is nan"),
        ({"a": float("-inf")}, "finite"),
        ({"a": {"b": "x\x00"}}, "at a.b holds a NUL"),
        ({"a": {"\ud800": 1}}, "surrogate"),
        ({"a": "\udc00\ud800"}, "surrogate"),
    ],
)
def test_json_that_cannot_be_stored_says_where(value: dict[str, Any], says: str):
    assert says in refused(config=value)
    assert says in refused(metadata=value)


def test_text_refuses_nul_and_lone_surrogates_and_keeps_its_length_limit():
    assert Model(text="caf\u00e9\U0001f600").text == "caf\u00e9\U0001f600"
    assert "pattern" in refused(text="a\x00")
    assert "valid string" in refused(text="\udfff")
    assert "at most 10 characters" in refused(text="x" * 11)


def test_whole_int_is_json_schemas_integer():
    assert Model(count=45.0).count == 45 and isinstance(Model(count=45.0).count, int)
    assert Model.model_validate_json('{"count": 4.5e1}').count == 45
    for value in (45.5, "45", True, float("inf"), float("nan")):
        refused(count=value)
    assert "less than or equal to 100" in refused(count=101.0)
