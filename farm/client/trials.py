"""Trials in the client: one harness episode behind the farm's proxy, made, ended and read back.

``FarmClient`` and ``AsyncFarmClient`` take these methods from ``TrialCalls`` and
``AsyncTrialCalls``; every request is built in ``farm.client.base`` like the others, and each
client's ``_send`` sends it with its retries (``farm.client.retry``: a trial's end and reads are
retried, its creation only when it never reached the server, since its answer holds the key).

A trial's base URLs name the proxy the client was given (``proxy_url=``: a ``farm proxy``
process), or else the API's own mounted proxy. ``to_arrays(record.segment_tokens)`` gives one row
per segment of the record (docs/trainer.md#harness-runs-trials).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import httpx

from farm.client.base import BaseFarmClient, Call
from farm.schemas import ArrayEncoding, TrialCreated, TrialOut, TrialRecord, TrialSampling
from farm.schemas.trials import TrialHistory

T = TypeVar("T")


class TrialCalls(BaseFarmClient[httpx.Client]):
    """``FarmClient``'s trial methods."""

    def _send(self, call: Call[T]) -> T:
        raise NotImplementedError

    def create_trial(
        self,
        trial_id: str | None = None,
        *,
        history: TrialHistory | None = None,
        sampling: TrialSampling | Mapping[str, Any] | None = None,
        job_id: int | None = None,
        model: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> TrialCreated:
        """A new trial: its id, its key (shown once) and the base URLs a harness points its SDK at.

        ``trial_id``: the farm picks one if unset. ``sampling`` is imposed on every call whatever the
        harness asks for; ``history`` is the policy where a template rewrites earlier turns ("exact",
        the farm's default, or "template"); ``model`` the model name the proxy lists.

        Raises:
            InvalidSpec: a trial the API would refuse (checked before it is sent).
            Conflict: a trial ``trial_id`` exists.
            NotFound: there is no job ``job_id``.
        """
        call = self._build_create_trial(
            trial_id, history=history, sampling=sampling, job_id=job_id, model=model, metadata=metadata
        )
        return self._send(call)

    def trial(self, trial_id: str) -> TrialOut:
        """A trial and its continuity certificate (one entry per call)."""
        return self._send(self._build_trial(trial_id))

    def end_trial(self, trial_id: str) -> TrialOut:
        """End a trial (idempotent): it takes no more calls, and its backend slot is released."""
        return self._send(self._build_end_trial(trial_id))

    def trial_record(self, trial_id: str, *, encoding: ArrayEncoding = "b64") -> TrialRecord:
        """A trial's token-exact record: ``segment_tokens`` holds one token sequence per segment
        (``to_arrays(record.segment_tokens)``), ``certificate`` the calls and what each extends."""
        return self._send(self._build_trial_record(trial_id, encoding))

    def delete_trial(self, trial_id: str) -> None:
        """Delete a trial and its record."""
        self._send(self._build_delete_trial(trial_id))


class AsyncTrialCalls(BaseFarmClient[httpx.AsyncClient]):
    """``AsyncFarmClient``'s trial methods (see ``TrialCalls``)."""

    async def _send(self, call: Call[T]) -> T:
        raise NotImplementedError

    async def create_trial(
        self,
        trial_id: str | None = None,
        *,
        history: TrialHistory | None = None,
        sampling: TrialSampling | Mapping[str, Any] | None = None,
        job_id: int | None = None,
        model: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> TrialCreated:
        """See ``TrialCalls.create_trial``."""
        call = self._build_create_trial(
            trial_id, history=history, sampling=sampling, job_id=job_id, model=model, metadata=metadata
        )
        return await self._send(call)

    async def trial(self, trial_id: str) -> TrialOut:
        return await self._send(self._build_trial(trial_id))

    async def end_trial(self, trial_id: str) -> TrialOut:
        return await self._send(self._build_end_trial(trial_id))

    async def trial_record(self, trial_id: str, *, encoding: ArrayEncoding = "b64") -> TrialRecord:
        return await self._send(self._build_trial_record(trial_id, encoding))

    async def delete_trial(self, trial_id: str) -> None:
        await self._send(self._build_delete_trial(trial_id))
