"""Wire models shared by the API, the client and the workers.

Only pydantic and the standard library here: ``farm.client`` imports this module and
must stay installable without the server's dependencies.
"""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_serializer, model_validator
from pydantic.json_schema import SkipJsonSchema

from farm.constants import BatchState, JobState, Outcome, PauseOutcome, Stage, StageStatus

ArrayEncoding = Literal["b64", "json"]
ArrayDtype = Literal["int32", "float32", "uint8"]
_ITEMSIZE: dict[str, int] = {"int32": 4, "float32": 4, "uint8": 1}

#: the binary results page (``Accept: application/vnd.farm.results``), laid out as the README's
#: "Binary results pages" says: MAGIC, a uint32 LE header length, the JSON header, the array bytes.
RESULTS_MEDIA_TYPE = "application/vnd.farm.results"
RESULTS_MAGIC = b"FRP1"
#: every array in a binary page starts at a multiple of this many bytes from the page's start.
RESULTS_ALIGN = 8


def _backend_url_pattern() -> str:
    """``http(s)://host[:port][/path]`` where host is a DNS name, an IPv4 address or a bracketed IPv6
    address (RFC 3986 forms), the port 1-65535, and the path plain or percent-encoded characters:
    exactly the URLs an HTTP client can parse, so a registered backend can always be probed."""
    h16 = "[0-9A-Fa-f]{1,4}"
    octet = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
    ipv4 = rf"{octet}(?:\.{octet}){{3}}"
    ls32 = rf"(?:{h16}:{h16}|{ipv4})"
    ipv6 = [rf"(?:{h16}:){{6}}{ls32}", rf"::(?:{h16}:){{5}}{ls32}"]
    tails = [rf"(?:{h16}:){{4}}{ls32}", rf"(?:{h16}:){{3}}{ls32}", rf"(?:{h16}:){{2}}{ls32}", rf"{h16}:{ls32}"]
    for k, tail in enumerate([*tails, ls32, h16, ""]):
        head = rf"(?:(?:{h16}:){{0,{k}}}{h16})?" if k else rf"(?:{h16})?"
        ipv6.append(rf"{head}::{tail}")
    label = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    # The last label starts with a letter, so a name is never mistaken for a malformed IPv4 address.
    hostname = rf"(?:{label}\.)*[A-Za-z](?:[A-Za-z0-9-]{{0,61}}[A-Za-z0-9])?"
    host = rf"(?:{hostname}|{ipv4}|\[(?:{'|'.join(ipv6)})\])"
    port = "(?::(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?"
    path = "(?:/(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})*)*"
    return f"^https?://{host}{port}{path}$"


#: ``(version, start, end)``: tokens ``[start, end)`` were sampled by the weights of ``version``.
#: A trajectory's spans cover exactly its model tokens (loss mask 1), in order; a model turn that a
#: weight update reached mid-decode (pause mode ``keep``) has one span per version.
VersionSpan = tuple[int, int, int]

#: the URLs ``POST /v1/backends`` accepts (see ``_backend_url_pattern``).
BACKEND_URL_PATTERN = _backend_url_pattern()
#: a backend id: letters, digits and ``._:@-``.
BACKEND_ID_PATTERN = r"^[A-Za-z0-9._:@-]+$"


class SamplingParams(BaseModel):
    """Sampling for every LLM turn of a job, as the backends understand it."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(default=1.0, ge=0.0, le=10.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1, strict=True, json_schema_extra={"not": {"const": 0}}, description="-1: off")
    max_tokens: int = Field(default=1024, ge=1, le=1_000_000, strict=True, description="per LLM turn")
    stop_token_ids: list[StrictInt] = Field(default_factory=list)
    seed: StrictInt | None = Field(default=None, description="per-job seeds are derived from it")

    @model_validator(mode="after")
    def _top_k_not_zero(self) -> SamplingParams:
        if self.top_k == 0:
            raise ValueError("top_k must be -1 (off) or >= 1")
        return self


class TaskSpec(BaseModel):
    """One prompt of a batch: a task type (handler name) and its config, validated by that handler."""

    model_config = ConfigDict(extra="forbid")

    type: str = Field(min_length=1, max_length=200, description="handler name, e.g. 'math' or 'echo'")
    config: dict[str, Any] = Field(default_factory=dict, description="validated by the handler's config_class")
    name: str | None = Field(default=None, max_length=500, description="the trainer's own id for this prompt")

    @field_validator("name")
    @classmethod
    def _storable(cls, value: str | None) -> str | None:
        # A database text column holds neither a NUL nor half of a UTF-16 surrogate pair.
        if value is not None and any(c == "\x00" or "\ud800" <= c <= "\udfff" for c in value):
            raise ValueError("name must not contain NUL characters or unpaired surrogates")
        return value


#: the group filters every farm has (more come from the ``farm.filters`` entry points).
BUILTIN_FILTERS = ("std", "mixed", "min_spread")


class PassRateSkip(BaseModel):
    """Leave out prompts the pass-rate ledger says teach nothing."""

    model_config = ConfigDict(extra="forbid")

    after_tries: int = Field(
        ge=1,
        le=1_000_000,
        strict=True,
        description="skip a prompt whose pass rate is exactly 0 or 1 after at least this many scored samples",
    )


class DynamicSampling(BaseModel):
    """DAPO dynamic sampling: the batch's tasks are a pool; groups are started from it, a few at a
    time, until ``target_groups`` groups pass the filter (their rewards differ); the rest stop."""

    model_config = ConfigDict(extra="forbid")

    target_groups: int = Field(ge=1, le=1_000_000, strict=True, description="informative groups wanted")
    max_groups_in_flight: int | None = Field(
        default=None, ge=1, le=100_000, strict=True, description="groups running at once (default: target_groups)"
    )
    filter: str = Field(
        default="std",
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description="std: rewards not all equal; mixed: at least one success and one failure; min_spread: "
        "max - min reward >= min_spread; or a filter another package registers (entry points farm.filters)",
    )
    min_spread: float = Field(default=0.0, ge=0.0, le=1e9, description="for filter min_spread")
    success_at: float = Field(
        default=1.0, ge=-1e9, le=1e9, description="a sample with at least this reward is a success (mixed, pass rates)"
    )
    skip: PassRateSkip | None = Field(default=None, description="leave out prompts stuck at a pass rate of 0 or 1")


def task_key(task_type: str, config: dict[str, Any], name: str | None = None) -> str:
    """A prompt's key in the pass-rate ledger: the trainer's ``name`` for it, else a hash of what it is
    (type and config, canonical JSON), so the same prompt has the same key in every batch."""
    if name:
        return f"name:{name}"[:200]
    body = json.dumps({"type": task_type, "config": config}, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


class BatchCreate(BaseModel):
    """What a trainer submits: each task becomes one group of ``group_size`` jobs."""

    model_config = ConfigDict(extra="forbid")

    tasks: list[TaskSpec] = Field(min_length=1)
    group_size: int = Field(default=1, ge=1, le=1024, strict=True)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    metadata: dict[str, Any] = Field(default_factory=dict)
    max_staleness: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        strict=True,
        description="a rollout whose oldest sampled token is more than this many weight versions behind the "
        "newest when its RUN ends is handled as `on_stale` says; unset: no bound",
    )
    on_stale: Literal["rerun", "mark"] = Field(
        default="rerun",
        description="rerun: RUN again on the newest weights (up to the worker's max_attempts, then kept "
        "marked); mark: keep it, with `stale` true on the job",
    )
    dynamic: DynamicSampling | None = Field(
        default=None, description="DAPO dynamic sampling: the tasks are a pool to draw informative groups from"
    )


class BatchCreated(BaseModel):
    id: int
    job_ids: list[int]
    created: bool = Field(description="false when an earlier submission with the same idempotency key is returned")


class DynamicStatus(BaseModel):
    """Where a dynamic batch stands."""

    target_groups: int
    pool: int = Field(description="tasks in the pool")
    started: int = Field(description="groups started so far")
    running: int
    informative: int
    uninformative: int
    failed: int = Field(description="groups with fewer than two scored samples (infrastructure failures)")
    skipped: int = Field(description="prompts left out by the pass-rate ledger")
    end_reason: Literal["target_reached", "pool_exhausted"] | None


class BatchStatus(BaseModel):
    id: int
    state: BatchState
    created_at: datetime
    finished_at: datetime | None
    group_size: int
    total_jobs: int
    finished_jobs: int
    counts: dict[JobState, int] = Field(description="jobs per state")
    outcomes: dict[Outcome, int] = Field(description="finished jobs per outcome")
    metadata: dict[str, Any]
    dynamic: DynamicStatus | None = None


class StageRunOut(BaseModel):
    stage: Stage
    attempt: int
    status: StageStatus
    node: str | None
    worker: str | None
    started_at: datetime
    finished_at: datetime | None
    error: str | None


class JobOut(BaseModel):
    id: int
    batch_id: int
    group_id: int
    group_index: int = Field(description="position of the task in the batch")
    sample_index: int = Field(description="position of the job in its group")
    type: str
    state: JobState
    outcome: Outcome | None
    reason: str | None
    attempts: int
    node: str | None
    reward: float | None
    stale: bool = Field(
        default=False,
        description="RUN ended more than the batch's max_staleness weight versions behind (and was not re-run)",
    )
    created_at: datetime
    init_at: datetime | None
    run_at: datetime | None
    eval_at: datetime | None
    finished_at: datetime | None
    stages: list[StageRunOut] = Field(default_factory=list)


class B64Array(BaseModel):
    """A little-endian array as base64: ~10x smaller and 50x faster to load than a JSON list."""

    dtype: ArrayDtype
    b64: str

    @classmethod
    def encode(cls, raw: bytes, dtype: ArrayDtype) -> B64Array:
        return cls(dtype=dtype, b64=base64.b64encode(raw).decode("ascii"))


class RawArray(BaseModel):
    """A little-endian array's bytes as a binary results page carries them. Only ``farm.client``
    makes these (``encoding`` "binary"); no JSON answer holds one. Dumped, it is a ``B64Array``."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    dtype: ArrayDtype
    data: memoryview

    @model_serializer
    def _as_b64(self) -> dict[str, str]:
        return {"dtype": self.dtype, "b64": base64.b64encode(self.data).decode("ascii")}

    def __len__(self) -> int:
        return len(self.data) // _ITEMSIZE[self.dtype]

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> Any:
        """``np.asarray(raw)``: a read-only view of the page's bytes (a copy with another dtype)."""
        import numpy as np

        array = np.frombuffer(self.data, dtype=np.dtype(self.dtype).newbyteorder("<"))
        if dtype is None and not copy:
            return array
        return array.astype(dtype or array.dtype, copy=True)


class TrajectoryOut(BaseModel):
    """A finished rollout, token-exact. Arrays are JSON lists or ``B64Array`` (see ``encoding``)."""

    # Read by farm.client from a binary results page, the arrays are RawArray and ``encoding``
    # is "binary": kept out of the JSON schema, since no JSON answer holds them.

    job_id: int
    batch_id: int
    group_id: int
    encoding: ArrayEncoding | SkipJsonSchema[Literal["binary"]]
    num_tokens: int
    token_ids: list[int] | B64Array | SkipJsonSchema[RawArray]
    logprobs: list[float] | B64Array | SkipJsonSchema[RawArray] = Field(description="0.0 where loss_mask is 0")
    loss_mask: list[int] | B64Array | SkipJsonSchema[RawArray] = Field(description="1 on tokens the model sampled")
    turn_offsets: list[int] = Field(description="start offset of each turn in token_ids")
    weight_versions: list[VersionSpan] = Field(
        default_factory=list,
        description="[version, start, end]: tokens start..end-1 were sampled by weight version `version`; "
        "the spans cover the model tokens (loss_mask 1) in order",
    )
    reward: float | None
    metrics: dict[str, float]
    timings: dict[str, float]
    info: dict[str, Any] = Field(default_factory=dict)


class JobResult(BaseModel):
    """One finished job (done, failed or cancelled) in the results stream."""

    seq: int = Field(description="position in the batch's finish order; pass the last one as `after`")
    job: JobOut
    trajectory: TrajectoryOut | None


class ResultsPage(BaseModel):
    items: list[JobResult]
    next_cursor: int = Field(description="pass as `after` to get the results that finish next")
    batch_state: BatchState
    remaining: int = Field(description="jobs of the batch not finished yet")
    finished: int = Field(description="jobs of the batch finished so far: finish positions 1 to `finished` are taken")


class GroupResult(BaseModel):
    """One informative group of a dynamic batch: every sample's result, and the rewards' spread."""

    seq: int = Field(description="position among the batch's informative groups; pass the last as `after`")
    group_id: int
    index: int = Field(description="the task's position in the pool")
    name: str | None
    reward_mean: float
    reward_std: float
    rewards: list[float]
    results: list[JobResult]


class GroupsPage(BaseModel):
    items: list[GroupResult]
    next_cursor: int
    batch_state: BatchState
    informative: int = Field(description="informative groups found so far")
    target_groups: int
    end_reason: Literal["target_reached", "pool_exhausted"] | None


class PassRate(BaseModel):
    """A prompt's record across batches: scored samples and how many were successes."""

    task_key: str
    type: str
    tries: int
    successes: int
    rate: float


class ErrorOut(BaseModel):
    """Every error answer has this shape."""

    code: str
    detail: str
    field: str | None = None


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    checks: dict[str, str] = Field(default_factory=dict)
    version: str


class ShippedTask(BaseModel):
    """One task a task family ships: submit ``{"type": <family>, "config": config}``."""

    id: str
    config: dict[str, Any]
    about: str | None = None


class TaskSet(BaseModel):
    """The tasks one installed task family ships with it."""

    type: str
    tasks: list[ShippedTask]


class BackendCreate(BaseModel):
    """An LLM inference server to add to the balancer."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        pattern=BACKEND_ID_PATTERN,
        description="stable name; default: derived from the URL. Re-adding an id updates that backend in place",
    )
    url: str = Field(
        pattern=BACKEND_URL_PATTERN,
        max_length=2000,
        examples=["http://gpu0:8000"],
        description="http(s)://host[:port][/path]: a DNS name, IPv4 or [IPv6] address; no query or fragment",
    )
    kind: Literal["vllm", "sglang", "builtin"] = "vllm"
    model: str | None = Field(default=None, max_length=500, description="served model name, sent with each request")
    capacity: int = Field(
        default=1, ge=1, le=100_000, strict=True, description="relative weight: concurrent jobs it is sized for"
    )
    weight_version: int | None = Field(
        default=None,
        ge=0,
        le=2**31 - 1,
        strict=True,
        description="the weights it serves; unset: 0 for a new backend, unchanged for a known one",
    )


class BackendOut(BaseModel):
    id: str
    url: str
    kind: str
    model: str | None
    capacity: int
    inflight: int
    healthy: bool
    weight_version: int


class WorkerOut(BaseModel):
    name: str = Field(description="the Celery hostname, `<stages>@<node>`")
    node: str
    stages: list[Stage]
    slots: int = Field(description="stages it runs at once")
    pid: int


class QueueOut(BaseModel):
    name: str
    stage: Stage
    node: str | None = Field(description="RUN and EVAL queues belong to a node; INIT is shared")
    length: int = Field(description="messages waiting")


class Overview(BaseModel):
    """The farm at a glance (``farm status``): pools, queues, backends, the batches running."""

    workers: list[WorkerOut] = Field(description="worker processes heard from lately")
    queues: list[QueueOut]
    backends: list[BackendOut]
    sandboxes: dict[str, int] = Field(description="live sandboxes per node")
    batches: list[BatchStatus] = Field(description="running batches, newest first (at most 20)")


PauseMode = Literal["wait", "keep", "abort"]


class WeightPause(BaseModel):
    """Pause every healthy backend for a weight update."""

    model_config = ConfigDict(extra="forbid")

    mode: PauseMode = Field(
        default="keep",
        description="wait: in-flight turns finish first; keep: they freeze and continue after resume (on the "
        "new weights); abort: they stop and the farm sends each again after resume (the agent never sees it)",
    )
    proxy: Literal["wait", "reject"] = Field(
        default="wait",
        description="harness calls through the proxy while paused: wait for resume, or get a retryable 503",
    )
    timeout_s: float = Field(
        default=900.0,
        gt=0,
        le=86_400,
        description="the farm rolls the update back if it is neither resumed nor rolled back by then",
    )


class WeightLoad(BaseModel):
    """Have every paused backend load new weights from a directory it can read."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1, max_length=4096, description="a checkpoint directory (safetensors + config)")
    version: int = Field(ge=0, le=2**31 - 1, strict=True, description="the version these weights are")


class WeightResume(BaseModel):
    """Resume the backends, serving ``version`` (the loaded one if unset)."""

    model_config = ConfigDict(extra="forbid")

    version: int | None = Field(
        default=None,
        ge=0,
        le=2**31 - 1,
        strict=True,
        description="the weights the backends now hold (required when the trainer loaded them itself)",
    )


class WeightUpdateBackendOut(BaseModel):
    id: str
    version: int = Field(description="the version of the weights it holds")
    paused_at: datetime | None
    loaded_at: datetime | None
    resumed_at: datetime | None
    pause_outcome: PauseOutcome | None = Field(
        description="how its pause ended: paused; refused (an error answer) or ejected (it cannot take part: no "
        "connection, or no such route), and then it is never resumed; no_answer (it may have paused: it is resumed); "
        "removed (no longer registered: nothing was asked of it); null until the pause's answers are recorded"
    )
    error: str | None


class WeightUpdateOut(BaseModel):
    id: int
    mode: PauseMode
    phase: Literal["pausing", "paused", "loading", "loaded", "resuming", "done", "rolling_back", "rolled_back"]
    open: bool
    proxy: Literal["wait", "reject"]
    from_version: int
    to_version: int | None
    load_path: str | None
    deadline: datetime
    error: str | None
    created_at: datetime
    finished_at: datetime | None
    backends: list[WeightUpdateBackendOut]


class WeightsOut(BaseModel):
    """The farm's weights: the newest version served, each backend's, and the update in progress."""

    version: int = Field(description="the newest weight version any backend serves")
    backends: dict[str, int] = Field(description="backend id -> the weight version it serves")
    paused: bool = Field(description="new turns are held for a weight update")
    update: WeightUpdateOut | None = Field(description="the open update, else the last one")


class HandlerInfo(BaseModel):
    name: str
    target: str
    config_schema: dict[str, Any] | None


class TrajectoryData(BaseModel):
    """What a handler's RUN produces: the token-exact episode."""

    token_ids: list[int]
    logprobs: list[float]
    loss_mask: list[int]
    turn_offsets: list[int] = Field(default_factory=list)
    #: which weights sampled which tokens (see ``VersionSpan``); empty when nothing was sampled.
    weight_versions: list[VersionSpan] = Field(default_factory=list)
    info: dict[str, Any] = Field(default_factory=dict)

    @field_validator("loss_mask")
    @classmethod
    def _mask_is_binary(cls, value: list[int]) -> list[int]:
        if any(m not in (0, 1) for m in value):
            raise ValueError("loss_mask holds only 0 and 1")
        return value

    @model_validator(mode="after")
    def _one_entry_per_token(self) -> TrajectoryData:
        n = len(self.token_ids)
        if len(self.logprobs) != n or len(self.loss_mask) != n:
            raise ValueError(
                f"token_ids, logprobs and loss_mask must have one entry per token "
                f"(got {n}, {len(self.logprobs)}, {len(self.loss_mask)})"
            )
        at = 0
        for version, start, end in self.weight_versions:
            if not at <= start < end <= n or version < 0:
                raise ValueError(f"weight_versions: span {[version, start, end]} is not in order within {n} tokens")
            at = end
        return self


class RunResult(BaseModel):
    """What RUN hands on: the trajectory, how the episode ended, and state for EVAL."""

    trajectory: TrajectoryData
    outcome: Outcome = Outcome.OK
    reason: str | None = None
    state: dict[str, Any] = Field(default_factory=dict)


class EvalResult(BaseModel):
    reward: float
    metrics: dict[str, float] = Field(default_factory=dict)
    info: dict[str, Any] = Field(default_factory=dict)


#: a trial id appears in the proxy's URLs.
TRIAL_ID_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"


class TrialSampling(BaseModel):
    """Sampling a trial imposes on every call, whatever the harness asks for (unset: the harness's)."""

    model_config = ConfigDict(extra="forbid")

    temperature: float | None = Field(default=None, ge=0.0, le=10.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: StrictInt | None = Field(default=None, ge=-1)
    max_tokens: StrictInt | None = Field(default=None, ge=1, le=1_000_000)
    seed: StrictInt | None = None

    @model_validator(mode="after")
    def _top_k_not_zero(self) -> TrialSampling:
        if self.top_k == 0:
            raise ValueError("top_k must be -1 (off) or >= 1")
        return self


class TrialCreate(BaseModel):
    """A trial: one harness episode behind the proxy, with a key of its own."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(default=None, pattern=TRIAL_ID_PATTERN, description="default: a random id")
    job_id: StrictInt | None = Field(default=None, ge=1, le=2**63 - 1, description="the job whose rollout this is")
    model: str | None = Field(default=None, min_length=1, max_length=500, description="the model name to list")
    sampling: TrialSampling = Field(default_factory=TrialSampling)
    metadata: dict[str, Any] = Field(default_factory=dict)


class TrialCreated(BaseModel):
    id: str
    key: str = Field(description="the harness's API key for this trial; shown once")
    openai_base_url: str = Field(description="OPENAI_BASE_URL for the harness")
    anthropic_base_url: str = Field(description="ANTHROPIC_BASE_URL for the harness")


class TrialOut(BaseModel):
    """A trial and its continuity certificate: one entry per call."""

    id: str
    job_id: int | None
    model: str
    sampling: dict[str, Any]
    calls: int
    segments: int
    created_at: str
    ended_at: str | None
    incomplete: str | None = Field(description="why the record is not whole; such a trial is not trainable")
    metadata: dict[str, Any]
    certificate: list[dict[str, Any]] = Field(default_factory=list)


class TrialCallOut(BaseModel):
    """One call of a trial: its certificate entry and the reply the harness was given."""

    model_config = ConfigDict(extra="allow")

    seq: int
    segment: int
    state: str
    reply: dict[str, Any] | None


class SegmentOut(BaseModel):
    """One segment of a trial's record: a token sequence in which every call extended the one before."""

    index: int
    calls: list[int]
    num_tokens: int
    token_ids: list[int] | B64Array
    logprobs: list[float] | B64Array
    loss_mask: list[int] | B64Array
    spans: list[list[Any]] = Field(description="[kind, start, end, call] per span; kind is prompt, env or model")
    weight_versions: list[VersionSpan] = Field(
        default_factory=list, description="[version, start, end] over the segment's own model tokens"
    )


class TrialRecord(TrialOut):
    encoding: ArrayEncoding
    segment_tokens: list[SegmentOut] = Field(default_factory=list)


class TrialRecordData(BaseModel):
    """A finished trial's record as a stage reads it: one trajectory per segment, oldest first."""

    trial_id: str
    segments: list[TrajectoryData]
    #: the segment that holds the trial's last answered call: the harness's final conversation.
    main: int | None
    certificate: list[dict[str, Any]]
    incomplete: str | None = None
