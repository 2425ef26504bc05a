"""The values that cross between the proxy and a trial's statements: what a call's start and
finish record, and what the proxy reads back (a key's credentials, a call's parent, a completion's end)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


@dataclass(frozen=True)
class Credentials:
    """What the proxy needs to let a key into a trial."""

    key_sha256: str
    model: str
    sampling: dict[str, Any]
    ended: bool
    #: the trial's history policy (``farm.proxy.continuity.HISTORY_POLICIES``).
    history: str = "exact"


@dataclass(frozen=True)
class Parent:
    """The recorded call a new request extends, and how many of the request's messages it covers."""

    seq: int
    segment: int
    covered: int
    last_sampled_id: int | None
    #: how many ids it sampled (the end of its ids; None: not read).
    sampled_tokens: int | None = None
    #: when the call began: with the seq, it names this call and no call of an earlier trial of
    #: the same id (a trial deleted and made again, or reset, numbers its calls from 0 again).
    started_at: datetime | None = None


@dataclass(frozen=True)
class LatestCall:
    """The trial's most recent finished call: its seq and per-message hashes (request plus reply)."""

    seq: int
    hashes: list[bytes]


@dataclass(frozen=True)
class CompletionEnd:
    """A finished legacy completion call, as a later completion prompt is compared with it
    (``farm.proxy.completion``)."""

    seq: int
    segment: int
    finish_reason: str | None
    stop_string: str | None
    #: its prompt ids + sampled ids: how many, and their hash (``end_hash``).
    end_tokens: int
    end_hash: bytes
    prompt_hash: bytes
    #: a text prompt's keys (``farm.proxy.completion.text_keys``); None for a prompt of ids.
    text_keys: dict[str, Any] | None
    #: when it started: with the seq, what tells it from a call of an earlier life of the trial id.
    started_at: datetime | None = None


@dataclass(frozen=True)
class CallStart:
    """What a call's pending row records (``statements.add_call``)."""

    parent: Parent | None
    wire: str
    streamed: bool
    #: one 16-byte hash per request message (``farm.proxy.conversation.chain``).
    message_hashes: Sequence[bytes]
    #: the prompt ids beyond the parent's end (all of them without a parent).
    delta_ids: Sequence[int]
    prompt_tokens: int
    #: the call's certificate entry (``farm.proxy.continuity.Continuity.as_dict``).
    continuity: dict[str, Any]
    #: the request messages the call adds (chat formats; None for a legacy completion).
    messages: list[dict[str, Any]] | None = None
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))


@dataclass(frozen=True)
class CallFinish:
    """What a call's finish records (``statements.finish_call``)."""

    sampled_ids: Sequence[int]
    logprobs: Sequence[float]
    finish_reason: str
    #: the reply the harness was given, as JSON, with what the record adds to it.
    reply: dict[str, Any]
    #: the chained hash of the request's messages and the reply (a legacy completion: of its ids).
    end_hash: bytes
    backend_id: str | None
    first_token_s: float | None
    latency_s: float
    #: (version, start, end) over the sampled ids.
    weight_versions: Sequence[Sequence[int]] = ()
    #: replaces the certificate entry the start wrote (None keeps it).
    continuity: dict[str, Any] | None = None
