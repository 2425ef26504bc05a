"""Does the configured sandbox driver work on this node? Asked once when a worker starts.

A worker whose driver cannot start a sandbox would take jobs and fail each of them with
``sandbox_error`` after its retries; it refuses to start instead, saying what is missing and
how to fix it, and the API's ``/readyz`` shows the same reason (``farm.worker.readiness``).
"""

from __future__ import annotations

import time

from farm.config import Settings
from farm.errors import SandboxCheckFailed
from farm.sandbox import create_sandbox
from farm.sandbox.base import SandboxSpec

#: how long the check's one command may take.
CHECK_TIMEOUT_S = 30.0

_HINTS = {
    "bwrap": (
        "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`; scripts/install does it as root), "
        "or choose another driver with FARM_SANDBOX__DRIVER (singularity on HPC; local runs commands "
        "on the host, NOT isolated)"
    ),
    "docker": (
        "install Docker (Debian/Ubuntu: `apt-get install docker.io`; scripts/setup_docker.sh starts a daemon), "
        "point FARM_SANDBOX__DOCKER_HOST at a running one, or choose another driver with FARM_SANDBOX__DRIVER"
    ),
    "singularity": (
        "install Apptainer/Singularity or point FARM_SANDBOX__SINGULARITY_PATH at it, or choose another "
        "driver with FARM_SANDBOX__DRIVER"
    ),
}


def check_sandbox_driver(settings: Settings) -> float:
    """Start a minimal sandbox with the configured driver and run ``true`` in it; returns the
    seconds it took.

    Raises:
        SandboxCheckFailed: naming the driver, what failed, and how to fix it.
    """
    driver = settings.sandbox.driver
    hint = _HINTS.get(driver, "choose a working driver with FARM_SANDBOX__DRIVER")
    started = time.monotonic()
    try:
        with create_sandbox(settings, SandboxSpec(label="worker self-check")) as sandbox:
            result = sandbox.run("true", timeout_s=CHECK_TIMEOUT_S)
    except Exception as exc:  # any failure to start is the answer the check exists to give
        raise SandboxCheckFailed(f"sandbox driver {driver!r} cannot start a sandbox: {exc}; {hint}") from exc
    if not result.ok:
        detail = result.error or f"exit code {result.exit_code}: {result.output[-500:]}"
        raise SandboxCheckFailed(f"sandbox driver {driver!r} started a sandbox but cannot run in it ({detail}); {hint}")
    return time.monotonic() - started
