"""Wire models shared by the API, the client and the workers, one module per resource:

- ``batches``: what a trainer submits (tasks, sampling, dynamic sampling) and a batch's status
- ``jobs``: a job, its trajectory, and the pages of results and informative groups
- ``arrays``: token arrays as JSON lists, base64 or a binary page's bytes; the binary page's constants
- ``stages``: what a handler's RUN and EVAL hand on (``TrajectoryData``, ``RunResult``, ``EvalResult``)
- ``trials``: a harness episode behind the proxy and its record
- ``backends``, ``weights``: LLM servers and the weight updates between training steps
- ``tasks``, ``overview``: installed task families, the farm at a glance, health and the error body
- ``stored``: the types every stored request field is (text, JSON, integers the farm can keep and serve back)

Import from here (``from farm.schemas import BatchCreate``): the modules are an internal layout.
Only pydantic and the standard library: ``farm.client`` imports this package and must stay
installable without the server's dependencies.
"""

from __future__ import annotations

from farm.schemas.arrays import (
    RESULTS_ALIGN,
    RESULTS_MAGIC,
    RESULTS_MEDIA_TYPE,
    ArrayDtype,
    ArrayEncoding,
    B64Array,
    RawArray,
    VersionSpan,
)
from farm.schemas.backends import BACKEND_ID_PATTERN, BACKEND_URL_PATTERN, BackendCreate, BackendOut
from farm.schemas.batches import (
    BUILTIN_FILTERS,
    BatchCreate,
    BatchCreated,
    BatchStatus,
    DynamicSampling,
    DynamicStatus,
    PassRate,
    PassRateSkip,
    SamplingParams,
    TaskSpec,
    task_key,
)
from farm.schemas.deadlines import BatchLimits, BatchTail, Quorum, Readiness, TailShare, TaskTail
from farm.schemas.jobs import (
    GroupResult,
    GroupsPage,
    JobOut,
    JobResult,
    ResultsPage,
    StageRunOut,
    TrajectoryOut,
    TrajectorySegmentOut,
)
from farm.schemas.overview import DatabaseOut, ErrorOut, FieldProblem, Health, Overview, QueueOut, WorkerOut
from farm.schemas.stages import EvalResult, RunResult, SegmentData, TrajectoryData
from farm.schemas.tasks import HandlerInfo, ShippedTask, TaskSet
from farm.schemas.trials import (
    TRIAL_ID_PATTERN,
    SegmentOut,
    TrialCallOut,
    TrialCreate,
    TrialCreated,
    TrialOut,
    TrialRecord,
    TrialRecordData,
    TrialSampling,
)
from farm.schemas.weights import (
    PauseMode,
    WeightLoad,
    WeightPause,
    WeightResume,
    WeightsOut,
    WeightUpdateBackendOut,
    WeightUpdateOut,
)

__all__ = [
    "BatchLimits",
    "BatchTail",
    "Quorum",
    "Readiness",
    "TailShare",
    "TaskTail",
    "ArrayDtype",
    "ArrayEncoding",
    "B64Array",
    "BACKEND_ID_PATTERN",
    "BACKEND_URL_PATTERN",
    "BUILTIN_FILTERS",
    "BackendCreate",
    "BackendOut",
    "BatchCreate",
    "BatchCreated",
    "BatchStatus",
    "DynamicSampling",
    "DynamicStatus",
    "ErrorOut",
    "FieldProblem",
    "EvalResult",
    "GroupResult",
    "GroupsPage",
    "HandlerInfo",
    "Health",
    "JobOut",
    "JobResult",
    "Overview",
    "DatabaseOut",
    "PassRate",
    "PassRateSkip",
    "PauseMode",
    "QueueOut",
    "RESULTS_ALIGN",
    "RESULTS_MAGIC",
    "RESULTS_MEDIA_TYPE",
    "RawArray",
    "ResultsPage",
    "RunResult",
    "SamplingParams",
    "SegmentData",
    "SegmentOut",
    "ShippedTask",
    "StageRunOut",
    "TRIAL_ID_PATTERN",
    "TaskSet",
    "TaskSpec",
    "TrajectoryData",
    "TrajectoryOut",
    "TrajectorySegmentOut",
    "TrialCallOut",
    "TrialCreate",
    "TrialCreated",
    "TrialOut",
    "TrialRecord",
    "TrialRecordData",
    "TrialSampling",
    "VersionSpan",
    "WeightLoad",
    "WeightPause",
    "WeightResume",
    "WeightUpdateBackendOut",
    "WeightUpdateOut",
    "WeightsOut",
    "WorkerOut",
    "task_key",
]
