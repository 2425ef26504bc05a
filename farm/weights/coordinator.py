"""Weight updates between training steps: pause the backends, load new weights, resume at a new version.

Each step writes its phase to PostgreSQL (``farm.weights.rows``) before it acts, and every backend
call is idempotent, so a step can be driven again by any API process:

- ``pause``: the update is opened (``pausing``), the balancer holds new turns (a Redis flag every
  acquire reads), every healthy backend pauses in the update's mode, then ``paused``. A backend that
  cannot be paused rolls the whole update back: the trainer gets a 502 and nothing stays paused.
- ``load`` (optional: a trainer may push weights its own way): ``loading``, each backend loads from
  the directory, ``loaded``.
- ``resume``: ``resuming`` is committed first (from then on the farm owes the resume), then each
  backend gets its version and resumes, the balancer learns the versions, the flag goes, ``done``.
- ``rollback``, or an update the trainer left past its deadline: ``rolling_back``, then every backend
  resumes with the version of the weights it holds (a backend that loaded the new weights serves
  them under the new version), ``rolled_back``.

``redrive`` runs every ``llm.weight_redrive_interval_s`` in each API process: it finishes an update
left in ``resuming``/``rolling_back`` by a process that died, rolls back one past its deadline, and
puts the pause flag back if Redis lost it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import TypeVar

import httpx
from sqlalchemy.orm import Session, sessionmaker

from farm.config import LLMSettings
from farm.constants import NEVER_PAUSED, PauseOutcome
from farm.db import backends as registry
from farm.db.base import utcnow
from farm.db.models import WeightUpdate, WeightUpdateBackend
from farm.db.session import transaction
from farm.errors import (
    BackendCallFailed,
    BackendUnreachable,
    Conflict,
    FarmError,
    InvalidSpec,
    UpstreamError,
    UpstreamStatusError,
)
from farm.llm.balancer import Balancer
from farm.llm.control import BackendControl, PauseMode
from farm.periodic import Periodic
from farm.schemas import WeightsOut, WeightUpdateOut
from farm.weights import rows

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_PARALLEL_CALLS = 32


class WeightUpdater:
    """The weight-update steps over the registered backends (one per API process)."""

    def __init__(self, *, sessions: sessionmaker[Session], balancer: Balancer, settings: LLMSettings) -> None:
        self.sessions = sessions
        self.balancer = balancer
        self.settings = settings
        self._http = httpx.Client(timeout=httpx.Timeout(settings.weight_control_timeout_s, connect=5.0))
        self._redrive = Periodic(
            self.redrive,
            interval_s=settings.weight_redrive_interval_s,
            name="farm-weights",
            what="weight update re-drive",
            log=log,
        )

    # ---- reading -------------------------------------------------------------------------------
    def status(self) -> WeightsOut:
        with transaction(self.sessions) as session:
            update = rows.current(session) or rows.latest(session)
            out = None if update is None else WeightUpdateOut.model_validate(rows.view(update))
            version = rows.farm_version(session)
        return WeightsOut(
            version=version,
            backends={b.id: b.weight_version for b in self.balancer.backends()},
            paused=self.balancer.paused() is not None,
            update=out,
        )

    def get(self, update_id: int) -> WeightUpdateOut:
        with transaction(self.sessions) as session:
            return WeightUpdateOut.model_validate(rows.view(rows.get(session, update_id)))

    # ---- the trainer's steps ---------------------------------------------------------------------
    def pause(self, *, mode: PauseMode, proxy: str, timeout_s: float) -> WeightUpdateOut:
        """Raises: Conflict (an update is open), InvalidSpec (a mode some backend lacks),
        BackendCallFailed (a backend did not pause: the update was rolled back)."""
        healthy = [b for b in self.balancer.backends() if b.healthy]
        for backend in healthy:
            self._control(backend.id, backend.url, str(backend.kind)).check_mode(mode)
        with transaction(self.sessions) as session:
            update = rows.begin(
                session,
                mode=mode,
                proxy=proxy,
                deadline=utcnow() + timedelta(seconds=timeout_s),
                backends=[(b.id, b.weight_version) for b in healthy],
            )
            update_id = update.id
        self.balancer.pause(_flag(update_id, proxy))
        failures, _ = self._each(update_id, lambda c, b: c.pause(mode), stamp="paused_at", pausing=True)
        if failures:
            self.rollback(update_id, reason=f"pause failed: {failures}")
            raise BackendCallFailed(f"weight update {update_id} rolled back: a backend did not pause: {failures}")
        with transaction(self.sessions) as session:
            update = rows.get(session, update_id, lock=True)
            if update.phase == "pausing":
                rows.set_phase(update, "paused")
            return WeightUpdateOut.model_validate(rows.view(update))

    def load(self, update_id: int, *, path: str, version: int) -> WeightUpdateOut:
        """Raises: WeightUpdateNotFound, Conflict (not paused), InvalidSpec (an old version),
        BackendCallFailed (the update stays ``loading``: call again, or roll back)."""
        with transaction(self.sessions) as session:
            update = rows.get(session, update_id, lock=True)
            if update.phase not in ("paused", "loading", "loaded"):
                raise Conflict(f"weight update {update_id} is {update.phase}: load needs it paused")
            if version <= update.from_version:
                raise InvalidSpec(
                    f"version {version} is not newer than the version paused ({update.from_version})", field="version"
                )
            if update.to_version not in (None, version):
                raise Conflict(f"weight update {update_id} is loading version {update.to_version}, not {version}")
            rows.set_phase(update, "loading", to_version=version, load_path=path)

        def load_one(control: BackendControl, row: WeightUpdateBackend) -> None:
            control.load(path, version)

        failures, _ = self._each(update_id, load_one, stamp="loaded_at", version=version)
        with transaction(self.sessions) as session:
            update = rows.get(session, update_id, lock=True)
            if failures:
                update.error = f"load failed: {failures}"
            elif update.phase == "loading":
                rows.set_phase(update, "loaded", error=None)
            out = WeightUpdateOut.model_validate(rows.view(update))
        if failures:
            raise BackendCallFailed(f"weight update {update_id}: a backend did not load {path!r}: {failures}")
        return out

    def resume(self, update_id: int, *, version: int | None) -> WeightUpdateOut:
        """Raises: WeightUpdateNotFound, Conflict (not paused, or already over), InvalidSpec (no
        version to serve), BackendCallFailed (the farm keeps trying: the update stays ``resuming``)."""
        with transaction(self.sessions) as session:
            update = rows.get(session, update_id, lock=True)
            if update.phase not in ("paused", "loaded", "resuming"):
                raise Conflict(f"weight update {update_id} is {update.phase}: only a paused update resumes")
            target = version if version is not None else update.to_version
            if target is None:
                raise InvalidSpec("give the version the backends now serve (nothing was loaded)", field="version")
            if update.to_version is not None and target != update.to_version:
                raise Conflict(f"weight update {update_id} loaded version {update.to_version}, not {target}")
            if target < update.from_version:
                raise InvalidSpec(f"version {target} is older than the paused {update.from_version}", field="version")
            rows.set_phase(update, "resuming", to_version=target)
        return self._finish(update_id)

    def rollback(self, update_id: int, *, reason: str = "rolled back by the trainer") -> WeightUpdateOut:
        """Every backend resumes with the weights it holds. Raises: WeightUpdateNotFound, Conflict."""
        with transaction(self.sessions) as session:
            update = rows.get(session, update_id, lock=True)
            if not update.is_open:
                raise Conflict(f"weight update {update_id} is already over ({update.phase})")
            if update.phase != "resuming":
                rows.set_phase(update, "rolling_back", error=reason)
        return self._finish(update_id)

    # ---- the farm's part -------------------------------------------------------------------------
    def _finish(self, update_id: int) -> WeightUpdateOut:
        """Resume every backend of an update in ``resuming`` or ``rolling_back`` with its version."""
        with transaction(self.sessions) as session:
            update = rows.get(session, update_id)
            phase, targets = update.phase, {b.backend_id: self._target(update, b) for b in update.backends}
            # Backends that never paused keep the weights and the label they had.
            never = {b.backend_id for b in update.backends if b.pause_outcome in NEVER_PAUSED}

        def resume_one(control: BackendControl, row: WeightUpdateBackend) -> None:
            if row.backend_id in never:
                return
            control.set_version(targets[row.backend_id])
            control.resume()

        failures, ejected = self._each(update_id, resume_one, stamp="resumed_at", versions=targets)
        resumed = {backend_id: v for backend_id, v in targets.items() if backend_id not in ejected | never}
        with transaction(self.sessions) as session:
            for backend_id, version in resumed.items():
                registry.set_version(session, backend_id, version)
        for backend_id, version in resumed.items():
            self.balancer.set_version(backend_id, version)
        with transaction(self.sessions) as session:
            update = rows.get(session, update_id, lock=True)
            if failures:
                # Resuming stays owed: redrive tries again. New turns keep waiting meanwhile, rather
                # than pile onto a backend still paused.
                update.error = f"resume failed: {failures}"
                out = WeightUpdateOut.model_validate(rows.view(update))
            else:
                if update.is_open:
                    rows.set_phase(update, "done" if phase == "resuming" else "rolled_back")
                out = WeightUpdateOut.model_validate(rows.view(update))
        if failures:
            raise BackendCallFailed(f"weight update {update_id}: a backend did not resume: {failures}")
        if self.balancer.paused() in (_flag(update_id, "wait"), _flag(update_id, "reject")):
            self.balancer.resume()
        return out

    @staticmethod
    def _target(update: WeightUpdate, row: WeightUpdateBackend) -> int:
        """The version of the weights a backend holds at the end of ``update``."""
        if update.phase == "resuming" and update.to_version is not None and update.load_path is None:
            return update.to_version  # the trainer loaded them itself, into every paused backend
        return row.version  # moved to to_version when (and only when) this backend loaded them

    def redrive(self) -> str | None:
        """One look at the open update; returns what was done (for logs and tests)."""
        with transaction(self.sessions) as session:
            update = rows.current(session, lock=True, skip_locked=True)
            if update is None:
                return None
            update_id, phase, proxy = update.id, update.phase, update.proxy
            if phase in rows.TRAINER_PHASES and update.deadline <= utcnow():
                rows.set_phase(update, "rolling_back", error="the trainer left it open past its deadline")
                phase = "rolling_back"
        if phase in rows.OWED_PHASES:
            try:
                self._finish(update_id)
            except FarmError as exc:
                log.warning("weight update %s: %s", update_id, exc)
            return phase
        if self.balancer.paused() is None:
            self.balancer.pause(_flag(update_id, proxy))  # Redis lost it: hold new turns again
            return "repaused"
        return None

    def start(self) -> None:
        """``redrive`` every ``weight_redrive_interval_s`` on a daemon thread until ``stop``."""
        self._redrive.start()

    def stop(self) -> None:
        self._redrive.stop()
        self._http.close()

    # ---- backend calls -----------------------------------------------------------------------------
    def _control(self, backend_id: str, url: str, kind: str) -> BackendControl:
        return BackendControl(self._http, backend_id=backend_id, url=url, kind=kind)

    def _each(
        self,
        update_id: int,
        call: Callable[[BackendControl, WeightUpdateBackend], None],
        *,
        stamp: str,
        pausing: bool = False,
        version: int | None = None,
        versions: dict[str, int] | None = None,
    ) -> tuple[dict[str, str], set[str]]:
        """Run ``call`` on every backend of the update (in parallel); stamp each success (and its
        version) in its row, and with ``pausing`` record how each pause ended. Returns the failures
        (backend id -> error) and the backends ejected because they cannot take part (left out of
        the update from then on)."""
        with transaction(self.sessions) as session:
            update = rows.get(session, update_id)
            todo = [(b.backend_id, b) for b in update.backends]
        known = {b.id: b for b in self.balancer.backends()}

        def one(item: tuple[str, WeightUpdateBackend]) -> tuple[str, FarmError | None]:
            backend_id, row = item
            backend = known.get(backend_id)
            if backend is None:
                return backend_id, None  # removed since: nothing of it to pause or resume
            try:
                call(self._control(backend.id, backend.url, str(backend.kind)), row)
            except BackendUnreachable as exc:
                # Gone, or never able to (no such route): it takes no work once ejected, so the update
                # goes on without it instead of holding every other backend paused for good. The
                # health checker re-admits it when it answers again, at the version it had.
                self.balancer.set_healthy(backend_id, False)
                log.warning("weight update %s: backend %s ejected: %s", update_id, backend_id, exc)
                return backend_id, exc
            except FarmError as exc:
                return backend_id, exc
            return backend_id, None

        failures: dict[str, str] = {}
        ejected: set[str] = set()
        if not todo:
            return failures, ejected
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_CALLS, len(todo))) as pool:
            results = list(pool.map(one, todo))
        with transaction(self.sessions) as session:
            update = rows.get(session, update_id, lock=True)
            by_id = {b.backend_id: b for b in update.backends}
            now = utcnow()
            for backend_id, exc in results:
                row = by_id[backend_id]
                if pausing:
                    row.pause_outcome = _pause_outcome(exc, registered=backend_id in known)
                if isinstance(exc, BackendUnreachable):
                    row.error = f"ejected, cannot take part: {exc}"
                    ejected.add(backend_id)
                    continue
                row.error = None if exc is None else str(exc)
                if exc is not None:
                    failures[backend_id] = str(exc)
                    continue
                setattr(row, stamp, now)
                if version is not None:
                    row.version = version
                if versions is not None:
                    row.version = versions[backend_id]
        return failures, ejected


def _flag(update_id: int, proxy: str) -> str:
    """The pause flag's value: the update and what proxy calls do meanwhile."""
    return f"{update_id}:{proxy}"


def _pause_outcome(exc: FarmError | None, *, registered: bool) -> PauseOutcome:
    """How a pause that ended with ``exc`` (None: it succeeded) ended."""
    if exc is None:
        return PauseOutcome.PAUSED if registered else PauseOutcome.REMOVED
    if isinstance(exc, BackendUnreachable):
        return PauseOutcome.EJECTED
    if isinstance(exc, UpstreamError) and not isinstance(exc, UpstreamStatusError):
        return PauseOutcome.NO_ANSWER  # a timeout: the backend may have paused all the same
    return PauseOutcome.REFUSED
