from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest

from farm.llm.builtin.testing import BuiltinServer, free_port

REPO = Path(__file__).resolve().parents[3]
#: the vLLM CPU environment scripts/setup_vllm.sh builds.
VLLM_VENV = Path(os.environ.get("FARM_VLLM_VENV", REPO / ".venv-vllm"))
#: cold start plus the first request's JIT on two shared cores.
VLLM_START_TIMEOUT_S = 600.0


@pytest.fixture(scope="session")
def builtin_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltinServer]:
    """One built-in backend subprocess for the whole session (tests must not depend on its cache state)."""
    log = tmp_path_factory.mktemp("logs") / "builtin.log"
    with BuiltinServer(model_dir=tiny_model_dir, log_path=log) as server:
        yield server


@contextlib.contextmanager
def running_vllm(
    model_dir: Path,
    *,
    name: str,
    tmp_path_factory: pytest.TempPathFactory,
    extra_args: Sequence[str] = (),
    extra_env: dict[str, str] | None = None,
) -> Iterator[str]:
    """A vLLM CPU server on ``model_dir`` (served as ``name``) for the duration; yields its URL.

    Skips when the vLLM environment is missing; fails with the log's tail when vLLM exits or does
    not start in time. A request is made before yielding: the first one compiles kernels."""
    python = VLLM_VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no vLLM environment at {VLLM_VENV}: run scripts/setup_vllm.sh")
    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(tmp_path_factory.mktemp("vllm-cache")),
        # The weight-update routes (/pause, /resume, /collective_rpc, ...) are served in dev mode only.
        "VLLM_SERVER_DEV_MODE": "1",
        **(extra_env or {}),
    }
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
    cmd += ["--served-model-name", name, "--dtype", "float32", "--max-model-len", "1024"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--enable-scale-out", *extra_args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + VLLM_START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited with {proc.returncode}: {log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM did not start in {VLLM_START_TIMEOUT_S} s: {log_path.read_text()[-3000:]}")
            time.sleep(1)
        # The first request compiles kernels; keep that out of the tests.
        warm = {"prompt": [1, 2, 3], "max_tokens": 2}
        httpx.post(f"{url}/v1/completions", json=warm, timeout=VLLM_START_TIMEOUT_S)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
