"""The README's quickstart runs: each of its Python blocks, as written, against a real farm (the
embedded stack with the built-in backend), with only the farm's address and token file moved."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from farm.embedded import EmbeddedStack

ROOT = Path(__file__).resolve().parents[2]
#: what the README's blocks assume of a `farm up` with the defaults.
DEFAULT_URL = "http://127.0.0.1:8700"
DEFAULT_TOKEN_DIR = 'Path.home() / ".rollout-farm"'

pytestmark = pytest.mark.integration


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.DOTALL)


def test_readme_has_the_two_quickstart_blocks():
    blocks = _python_blocks()
    assert len(blocks) == 2
    assert all(DEFAULT_URL in block and DEFAULT_TOKEN_DIR in block for block in blocks)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_readme_quickstart_runs_against_a_farm(
    make_stack: Callable[..., EmbeddedStack], tiny_model_dir: Path, tmp_path: Path
):
    # Given the stack `farm up` starts (its own Valkey, SQLite, the built-in backend), its token in a
    # file as `farm up` writes it
    stack = make_stack(redis=None, database=None, with_llm=True, model_dir=tiny_model_dir)
    token = stack.settings.api.token
    assert token is not None
    (tmp_path / "token").write_text(token.get_secret_value() + "\n")
    for index, block in enumerate(_python_blocks()):
        code = block.replace(DEFAULT_URL, stack.settings.api_url).replace(DEFAULT_TOKEN_DIR, f"Path({str(tmp_path)!r})")
        # When the block runs as a script of its own
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=240, check=False
        )
        # Then it ends cleanly and prints what it says it prints
        assert done.returncode == 0, f"README block {index + 1} failed:\n{done.stdout}\n{done.stderr}"
        assert done.stdout.strip(), f"README block {index + 1} printed nothing"
