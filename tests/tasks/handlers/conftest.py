from __future__ import annotations

from pathlib import Path

import pytest

from farm.config import Settings
from farm.worker.sandboxes import SandboxResources
from tests.integration.sandbox.conftest import require_bwrap


@pytest.fixture
def sandboxes(tmp_path: Path) -> SandboxResources:
    require_bwrap()
    settings = Settings(
        data_dir=tmp_path / "data",
        sandbox={"root_dir": tmp_path / "sb", "tool_timeout_s": 30.0, "memory_mb": 2048, "pids": 256},
    )
    return SandboxResources(settings)
