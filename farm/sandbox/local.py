"""LocalSandbox: a plain workspace folder on the host. NOT ISOLATED.

For development and tests of task handlers only: commands run on the host, as the worker's
user, with the host's network and file system. The workspace and tmp folders are private
but nothing stops a command from leaving them. A cgroup (when writable) still applies the
memory/process limits and lets close() find every process, including ones that ``setsid``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from farm.sandbox.base import SandboxSpec
from farm.sandbox.disk import fs_dir
from farm.sandbox.procs import ProcRef, enter_cgroups_argv
from farm.sandbox.server_sandbox import FARM_SOURCE_DIR, ServerSandbox, server_pythonpath

log = logging.getLogger(__name__)


class LocalSandbox(ServerSandbox):
    """Not a sandbox: a folder. Never use it for untrusted agents."""

    driver = "local"
    isolated = False

    @classmethod
    def _workdir(cls, spec: SandboxSpec, sdir: Path) -> str:
        return str(fs_dir(sdir) / "workspace")

    def _tool_env(self, spec: SandboxSpec) -> dict[str, str]:
        tmp = str(self.fs / "tmp")
        env = {
            "PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin",
            "HOME": tmp,
            "TMPDIR": tmp,
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "IPYTHONDIR": f"{tmp}/.ipython",
            "JUPYTER_RUNTIME_DIR": f"{tmp}/.jupyter-runtime",
        }
        return {**env, **spec.env}

    def _launch(self, spec: SandboxSpec, limits: dict[str, Any]) -> None:
        log.warning("sandbox %s uses the LOCAL driver: commands run on the host, NOT ISOLATED", self.id)
        config = self._server_config(spec, limits, socket_path=self.record.socket_path)
        argv = enter_cgroups_argv(self._cgroups.procs_files, self._server_argv(sys.executable, config))
        with open(self._log_path(), "ab") as out:
            self._popen = subprocess.Popen(
                argv,
                cwd=self.workdir,
                env={**self._tool_env(spec), "PYTHONPATH": server_pythonpath(str(FARM_SOURCE_DIR))},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server = ProcRef.of(self._popen.pid)
        self.record.procs = [server] if server is not None else []
        self.record.pgids = [self._popen.pid]
