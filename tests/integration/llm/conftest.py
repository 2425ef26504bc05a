from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from farm.llm.builtin.testing import BuiltinServer


@pytest.fixture(scope="session")
def builtin_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltinServer]:
    """One built-in backend subprocess for the whole session (tests must not depend on its cache state)."""
    log = tmp_path_factory.mktemp("logs") / "builtin.log"
    with BuiltinServer(model_dir=tiny_model_dir, log_path=log) as server:
        yield server
