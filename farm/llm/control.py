"""Weight-update control of one backend: pause, load weights, set the version, resume.

vLLM 0.32 serves these with ``VLLM_SERVER_DEV_MODE=1`` (``vllm/entrypoints/rl/online/api_router.py``
and ``serve/dev/rpc``), and the built-in backend serves the same routes:

- ``POST /pause?mode=wait|keep|abort``: ``wait`` lets in-flight requests finish, ``keep`` freezes
  them until ``/resume``, ``abort`` ends them (their answers say ``finish_reason: "abort"``). New
  requests wait in the server's queue until ``/resume`` in every mode.
- ``POST /resume``, ``GET /is_paused`` -> ``{"is_paused": bool}``.
- ``POST /update_weight_version`` ``{"new_version": "3"}``: the label the engine puts on every token
  it samples from then on (``weight_versions`` spans in ``/inference/v1/generate`` answers).
- ``POST /collective_rpc`` ``{"method": "reload_weights", "kwargs": {"weights_path": DIR}}``: load
  new weights in place from a checkpoint directory the server can read.

SGLang has ``/pause_generation`` (``mode``: ``abort``, ``in_place``: what vLLM calls keep; no
``wait``), ``/continue_generation`` and ``/update_weights_from_disk``.
"""

from __future__ import annotations

from typing import Any, Literal

import httpx

from farm.errors import BackendUnreachable, InvalidSpec, UpstreamError, UpstreamStatusError
from farm.llm.types import BackendKind

PauseMode = Literal["wait", "keep", "abort"]
PAUSE_MODES: tuple[PauseMode, ...] = ("wait", "keep", "abort")
#: a pause in mode wait returns when the backend's in-flight requests have finished: give it time.
DEFAULT_CONTROL_TIMEOUT_S = 600.0
_SGLANG_PAUSE = {"keep": "in_place", "abort": "abort"}


class BackendControl:
    """The weight-update routes of one backend, over a shared ``httpx.Client``."""

    def __init__(self, http: httpx.Client, *, backend_id: str, url: str, kind: BackendKind | str) -> None:
        self.http = http
        self.backend_id = backend_id
        self.url = url.rstrip("/")
        self.kind = BackendKind(kind)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        """Raises: BackendUnreachable (no connection, or no such route), UpstreamError (no answer)
        or UpstreamStatusError (an error answer)."""
        try:
            resp = self.http.request(method, f"{self.url}{path}", **kwargs)
        except (httpx.ConnectError, httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise BackendUnreachable(f"{method} {path}: cannot connect: {exc!r}", backend=self.backend_id) from exc
        except httpx.HTTPError as exc:
            raise UpstreamError(f"{method} {path} failed: {exc!r}", backend=self.backend_id) from exc
        if resp.status_code in (404, 405):
            raise BackendUnreachable(
                f"{method} {path} answered {resp.status_code}: no such route here", backend=self.backend_id
            )
        if resp.status_code >= 400:
            raise UpstreamStatusError(
                f"{method} {path} answered {resp.status_code}: {resp.text[:300]}",
                status=resp.status_code,
                backend=self.backend_id,
            )
        try:
            return resp.json()
        except ValueError:
            return None

    def check_mode(self, mode: PauseMode) -> None:
        """Raises: InvalidSpec when this backend cannot pause in ``mode``."""
        if self.kind is BackendKind.SGLANG and mode not in _SGLANG_PAUSE:
            raise InvalidSpec(
                f"backend {self.backend_id} is SGLang, which has no pause mode {mode!r}: use keep or abort",
                field="mode",
            )

    def pause(self, mode: PauseMode) -> None:
        """Raises: InvalidSpec (a mode the backend lacks), UpstreamError."""
        self.check_mode(mode)
        if self.kind is BackendKind.SGLANG:
            self._call("POST", "/pause_generation", json={"mode": _SGLANG_PAUSE[mode]})
        else:
            self._call("POST", "/pause", params={"mode": mode})

    def resume(self) -> None:
        if self.kind is BackendKind.SGLANG:
            self._call("POST", "/continue_generation", json={})
        else:
            self._call("POST", "/resume")

    def is_paused(self) -> bool | None:
        """The backend's own answer; None where it has no such route (SGLang)."""
        if self.kind is BackendKind.SGLANG:
            return None
        return bool((self._call("GET", "/is_paused") or {}).get("is_paused"))

    def load(self, path: str, version: int) -> None:
        """Load the weights in ``path`` (a directory the backend can read) in place."""
        if self.kind is BackendKind.SGLANG:
            self._call("POST", "/update_weights_from_disk", json={"model_path": path, "weight_version": str(version)})
            return
        body = {"method": "reload_weights", "kwargs": {"weights_path": path}}
        self._call("POST", "/collective_rpc", json=body)

    def set_version(self, version: int) -> None:
        """The label the backend puts on tokens sampled from now on (SGLang: given at load)."""
        if self.kind is not BackendKind.SGLANG:
            self._call("POST", "/update_weight_version", json={"new_version": str(version)})
