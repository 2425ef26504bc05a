"""A trial's record as a trainer reads it: one token sequence per segment, and the certificate.

A *segment* is a chain of calls in which each extends the one before exactly. Its tokens are its
last call's prompt and sampled ids; the loss mask is 1 on ids sampled by the segment's own calls.
A segment that branched off another (a retry, a second continuation of the same history) starts
with the other's tokens: those are in the record once already, so they are masked 0 here.
Ids the proxy appended to a call's prompt to enforce a tool choice (the opening of a tool call)
were not sampled: they are masked 0 and have a span of their own (``forced``).
The certificate has one entry per call: how it relates to the calls before it (``continuity``),
what it cost, and how it ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from farm.db.arrays import FLOAT32, INT32
from farm.db.models import Trial, TrialCall
from farm.trials.statements import split_settings


@dataclass
class Segment:
    """One chain of calls as a token sequence (see the module docstring)."""

    index: int
    calls: list[int]
    token_ids: np.ndarray
    logprobs: np.ndarray
    loss_mask: np.ndarray
    #: [kind, start, end, call seq] per span; kind is prompt (the segment's first prompt, or
    #: tokens inherited from the call it branched off), env (the template's delta), forced (the
    #: opening of a tool call the proxy appended to the prompt for tool_choice) or model.
    spans: list[list[Any]] = field(default_factory=list)
    #: (version, start, end) over the segment's own model tokens (``farm.schemas.VersionSpan``).
    weight_versions: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def turn_offsets(self) -> list[int]:
        """Span starts as a trajectory's ``turn_offsets`` has them: a forced call opening is part of
        the prompt before it, so spans still alternate prompt or env, then model."""
        return [start for kind, start, _, _ in self.spans if kind != "forced"]


def certificate(call: TrialCall) -> dict[str, Any]:
    sampled = len(call.sampled_ids) // INT32.itemsize
    entry: dict[str, Any] = {
        "seq": call.seq,
        "segment": call.segment,
        "state": call.state,
        "wire": call.wire,
        "prompt_tokens": call.prompt_tokens,
        "completion_tokens": sampled,
        "finish_reason": call.finish_reason,
        "backend": call.backend_id,
        "first_token_s": call.first_token_s,
        "latency_s": call.latency_s,
        **call.continuity,
    }
    if call.error:
        entry["error"] = call.error
    return entry


def segments(calls: list[TrialCall]) -> list[Segment]:
    done = {c.seq: c for c in calls if c.state == "done"}
    last: dict[int, TrialCall] = {}
    for call in done.values():
        if call.segment not in last or call.seq > last[call.segment].seq:
            last[call.segment] = call
    out = []
    for index in sorted(last):
        chain: list[TrialCall] = []
        at: int | None = last[index].seq
        while at is not None:
            chain.append(done[at])
            at = done[at].parent_seq
        chain.reverse()
        ids, lps, mask, spans = [], [], [], []
        versions: list[tuple[int, int, int]] = []
        pos = 0
        for call in chain:
            own = call.segment == index
            delta = np.frombuffer(call.delta_ids, dtype=INT32)
            sampled = np.frombuffer(call.sampled_ids, dtype=INT32)
            kind = "env" if own and call.parent_seq is not None else "prompt"
            cut = len(delta) - (call.continuity.get("forced_prefix_tokens", 0) if own else 0)
            for part, logprob, mask_value, span_kind in (
                (delta[:cut], np.zeros(cut, dtype=FLOAT32), 0, kind),
                (delta[cut:], np.zeros(len(delta) - cut, dtype=FLOAT32), 0, "forced"),
                (sampled, np.frombuffer(call.logprobs, dtype=FLOAT32), 1 if own else 0, "model" if own else "prompt"),
            ):
                ids.append(part)
                lps.append(logprob)
                mask.append(np.full(len(part), mask_value, dtype=np.uint8))
                if len(part):
                    spans.append([span_kind, pos, pos + len(part), call.seq])
                if span_kind == "model":
                    versions += [(v, pos + s, pos + e) for v, s, e in call.weight_versions or []]
                pos += len(part)
        out.append(
            Segment(
                index=index,
                calls=[c.seq for c in chain if c.segment == index],
                token_ids=np.concatenate(ids),
                logprobs=np.concatenate(lps),
                loss_mask=np.concatenate(mask),
                spans=spans,
                weight_versions=versions,
            )
        )
    return out


def summary(trial: Trial) -> dict[str, Any]:
    sampling, history = split_settings(trial.sampling)
    return {
        "id": trial.id,
        "job_id": trial.job_id,
        "model": trial.model,
        "sampling": sampling,
        "history": history,
        "calls": trial.calls,
        "segments": trial.segments,
        "created_at": trial.created_at.isoformat(),
        "ended_at": trial.ended_at.isoformat() if trial.ended_at else None,
        "incomplete": trial.incomplete,
        "metadata": trial.meta,
    }
