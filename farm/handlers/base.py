"""The handler interface: one async method per stage, plain data in and out.

A handler never opens database sessions, reads settings or calls Celery: the pipeline
hands it what it needs through ``StageContext`` (the job's facts, and typed resources:
``ctx.llm`` for LLM sessions and the policy's tokenizer, ``ctx.sandboxes`` for sandboxes on
this node), and stores what it returns. What one stage hands on to the next is the handler's
``state_class`` (a :class:`HandlerState`), stored as JSON between them: the stages of a job may run
in different processes, on different nodes. Every stage method is a coroutine function, run on
the worker process's event loop (as arq runs its jobs): blocking work goes through
``asyncio.to_thread``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, Protocol, Self, cast

from pydantic import BaseModel, ConfigDict, ValidationError
from typing_extensions import TypeVar

from farm.constants import Stage
from farm.errors import FarmError, InvalidSpec, Problem
from farm.schemas import EvalResult, RunResult, SamplingParams, TrajectoryData, TrialRecordData
from farm.schemas.trials import DEFAULT_HISTORY, TrialHistory

if TYPE_CHECKING:  # types only: importing this module must not load sandboxes or the LLM layer
    from farm.llm.trajectory import ChatTokenizer
    from farm.llm.types import GenerateResult
    from farm.proxy.parsers import ParserNames
    from farm.sandbox.base import Sandbox, SandboxSpec
    from farm.sandbox.prepared import Prepared

ConfigT = TypeVar("ConfigT", bound=BaseModel)


class HandlerState(BaseModel):
    """What a handler's INIT hands on to RUN, and RUN (with INIT's) to EVAL and teardown.

    Stored as the job's ``stage_data["state"]`` JSON: each handler declares its own subclass as
    ``state_class`` (as it declares ``config_class``), one field per key it keeps, and the pipeline
    validates the state where a stage hands it on and where the next one reads it back. Keys a
    subclass does not declare are kept as they are (``extra="allow"``): a state another version of
    the handler wrote still loads, and a handler without a ``state_class`` of its own keeps any JSON.
    """

    model_config = ConfigDict(extra="allow")

    def stored(self) -> dict[str, Any]:
        """The JSON kept for this state: the keys that were set (a default never set is not written)."""
        return self.model_dump(mode="json", exclude_unset=True)

    def updated(self, changes: Mapping[str, Any]) -> Self:
        """This state with ``changes`` (what a later stage adds) on top, validated again.

        Raises:
            ValidationError: a change does not fit the state's fields.
        """
        return self.model_validate({**self.stored(), **changes})

    # Read access by key, for handlers written when the state was a plain dict.
    def __getitem__(self, key: str) -> Any:
        return self.stored()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.stored().get(key, default)

    def keys(self) -> Iterator[str]:
        return iter(self.stored())

    def __contains__(self, key: object) -> bool:
        return key in self.stored()


StateT = TypeVar("StateT", bound=HandlerState, default=HandlerState)

#: the names of a handler's stage methods, each an ``async def``.
STAGE_METHODS = ("init", "run", "evaluate", "teardown")


class LLMSession(Protocol):
    """A job's sticky link to one backend (:class:`farm.llm.session.LLMSession`); ``async with`` it."""

    #: (from, to) backend ids of every re-route.
    moves: list[tuple[str, str]]
    backend_id: str | None
    #: turns re-issued after a weight update aborted them, and seconds turns waited for one.
    aborted_turns: int
    paused_s: float

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams | None = None) -> GenerateResult: ...

    async def __aenter__(self) -> LLMSession: ...

    async def __aexit__(self, *exc: object) -> None: ...


class LLM(Protocol):
    """What a stage may ask of the LLM layer (:class:`farm.worker.llm.LLMResources`)."""

    @property
    def tokenizer(self) -> ChatTokenizer:
        """The policy's tokenizer, loaded on first use (blocking: call through a thread)."""
        ...

    @property
    def parsers(self) -> ParserNames:
        """How the policy writes tool calls and reasoning (``farm.proxy.parsers.choose``: the proxy's
        settings, else its template's family); blocking, it may load the tokenizer."""
        ...

    def session(self, job_id: int) -> AbstractAsyncContextManager[LLMSession]:
        """The job's session on its balancer-chosen backend; enter it on the worker's event loop."""
        ...

    def release(self, job_id: int) -> None:
        """Give the job's backend slot back (idempotent; blocking)."""
        ...


class Sandboxes(Protocol):
    """Sandboxes on this node (:class:`farm.worker.sandboxes.SandboxResources`); every method blocks."""

    def create(self, spec: SandboxSpec) -> Sandbox:
        """Start a sandbox owned by this process.

        Raises:
            SandboxUnavailable: the runtime is missing or the sandbox did not come up.
        """
        ...

    def attach(self, sandbox_id: str) -> Sandbox:
        """The sandbox another stage of the job made on this node.

        Raises:
            SandboxError: no such sandbox here.
        """
        ...

    def destroy(self, sandbox_id: str) -> None:
        """Close a sandbox by id; one already gone is not an error."""
        ...

    def environment(self, kind: Literal["venv", "npm"], packages: tuple[str, ...]) -> Path:
        """A Python venv or npm tree holding ``packages``, built once per node, to bind read-only.

        Raises:
            SandboxUnavailable: the build failed.
        """
        ...

    def scratch_dir(self, prefix: str = "scratch-") -> AbstractContextManager[Path]:
        """A host directory for files a sandbox starts from (removed on exit)."""
        ...

    def prepared(
        self, recipe: dict[str, Any], build: Callable[[Path], dict[str, Any]]
    ) -> AbstractContextManager[Prepared]:
        """The starting workspace ``recipe`` names (JSON), built by ``build(dest)`` once per node and
        shared by every stage that asks for the same recipe; not removed while the context is open."""
        ...


@dataclass(frozen=True)
class OpenTrial:
    """A trial a harness may call the proxy in: its id (in the base URL) and its key."""

    id: str
    key: str
    model: str


class Trials(Protocol):
    """External harnesses behind the proxy (:class:`farm.trials.resources.TrialResources`); every method blocks."""

    @property
    def socket(self) -> Path | None:
        """The Unix socket of this node's proxy (``proxy.socket``), or None when none is configured."""
        ...

    def open(self, *, job_id: int, attempt: int, sampling: dict[str, Any], history: str = "exact") -> OpenTrial:
        """A new trial for this attempt of the job; ``sampling`` overrides what the harness asks for,
        ``history`` is its history policy (``farm.schemas.trials.TrialHistory``)."""
        ...

    def close(self, trial_id: str) -> TrialRecordData:
        """End the trial and read its record: one trajectory per segment."""
        ...


class _Missing:
    """A resource the context was not given: using it says so (contexts built by tests often need none)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):  # protocols probed by copy, pickle, hasattr: plainly absent
            raise AttributeError(attr)
        raise FarmError(f"this stage context has no {self._name} resource (pass {self._name}= to StageContext)")


@dataclass(frozen=True)
class StageContext:
    """What one stage of one job may use."""

    job_id: int
    batch_id: int
    stage: Stage
    attempt: int
    node: str
    sampling: SamplingParams
    seed: int | None
    #: time.monotonic() after which the stage must give up (agent_timeout for RUN).
    deadline: float
    #: the batch's history policy (``farm.schemas.trials.TrialHistory``): what the next prompt is when
    #: the chat template rewrites earlier turns; the built-in loop and harness trials both follow it.
    history: TrialHistory = DEFAULT_HISTORY
    #: true once the job's batch was cancelled: agent loops check it every turn.
    is_cancelled: Callable[[], bool] = lambda: False
    #: LLM sessions and the policy's tokenizer.
    llm: LLM = field(default=cast("LLM", _Missing("llm")))
    #: sandboxes on this node.
    sandboxes: Sandboxes = field(default=cast("Sandboxes", _Missing("sandboxes")))
    #: trials for external harnesses behind the proxy.
    trials: Trials = field(default=cast("Trials", _Missing("trials")))

    def remaining_s(self) -> float:
        return self.deadline - time.monotonic()


def field_path(loc: Sequence[int | str], prefix: str = "") -> str:
    """A pydantic error location as the dotted path a user reads (``config.tools.0.name``): the
    names pydantic gives a union's members or a validator (``function-after[...]``, ``list[int]``)
    are left out; an empty location is ``prefix`` itself (a model validator's error, about the whole)."""
    parts = [str(p) for p in loc if not (isinstance(p, str) and ("[" in p or "(" in p))]
    return ".".join([prefix, *parts] if prefix else parts)


def error_message(error: Any) -> str:
    """pydantic's message for one error, without the ``Value error, `` it puts before a validator's own."""
    return str(error.get("msg", "invalid")).removeprefix("Value error, ")


def problems_of(exc: ValidationError, prefix: str = "") -> list[Problem]:
    """Every error of ``exc`` as ``{field, detail}``, fields under ``prefix``."""
    seen: list[Problem] = []
    for error in exc.errors():
        problem = {"field": field_path(error["loc"], prefix), "detail": error_message(error)}
        if problem not in seen:  # a union's members each report the same input
            seen.append(problem)
    return seen


def validate_config(config_class: type[ConfigT], config: dict[str, Any]) -> ConfigT:
    """Validate a task config, raising InvalidSpec that names the first bad field and lists every
    problem (``errors``), fields under ``config``."""
    try:
        # As JSON, strictly: a config arrives as JSON, where `false` is no integer and `1` no boolean.
        return config_class.model_validate_json(json.dumps(config), strict=True)
    except ValidationError as exc:
        problems = problems_of(exc, "config")
        first = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InvalidSpec(f"{first['field']}: {first['detail']}{more}", field=first["field"], errors=problems) from exc


class TaskHandler(Generic[ConfigT, StateT]):
    """Base class of every handler. Subclasses set ``config_class`` and ``state_class`` and
    implement the stages.

    ``init`` returns the state RUN needs (a ``state_class``); ``run`` returns the episode, and in
    ``RunResult.state`` the keys it adds to the state (``state_class(...).stored()``); ``evaluate``
    scores it. ``teardown`` is always called once the job leaves its node (after EVAL, on failure,
    on cancel); it is a no-op here. Each is an ``async def``.
    """

    config_class: ClassVar[type[BaseModel]]
    #: the state the stages hand on (see :class:`HandlerState`).
    state_class: ClassVar[type[HandlerState]] = HandlerState
    #: ``evaluate`` can score a finished rollout again from what the job stored alone (its state
    #: from RUN, its trajectory, its config), without the model or the agent's environment:
    #: ``farm reverify`` refuses the others unless forced. False unless a handler says so: a
    #: grader that reads the sandbox the agent left (harbor's verifier) has nothing to read later.
    reverify_safe: ClassVar[bool] = False

    def can_reverify(self, config: ConfigT) -> bool:
        """Whether a rollout of ``config`` can be scored again (``reverify_safe`` unless a wrapper knows better)."""
        return self.reverify_safe

    def validate(self, config: dict[str, Any]) -> ConfigT:
        return validate_config(self.config_class, config)  # type: ignore[return-value]

    def load_state(self, data: Mapping[str, Any] | None) -> StateT:
        """The state stored as ``data`` (JSON), as this handler's ``state_class``.

        Raises:
            ValidationError: ``data`` does not fit the state's fields.
        """
        return self.state_class.model_validate(dict(data or {}))  # type: ignore[return-value]

    def stored_state(self, state: object) -> dict[str, Any]:
        """The JSON to keep for what ``init`` returned: its ``state_class``, or (a handler written
        before ``state_class``) a dict, validated as one.

        Raises:
            TypeError: a state of another handler's class.
            ValidationError: a dict that does not fit the state's fields.
        """
        if isinstance(state, HandlerState):
            if not isinstance(state, self.state_class):
                raise TypeError(f"{type(self).__name__} returned a {type(state).__name__}, not its state_class")
            return state.stored()
        return self.load_state(cast("Mapping[str, Any] | None", state)).stored()

    async def init(self, config: ConfigT, ctx: StageContext) -> StateT:
        return self.load_state({})

    async def run(self, config: ConfigT, state: StateT, ctx: StageContext) -> RunResult:
        raise NotImplementedError(f"{type(self).__name__} has no RUN stage")

    async def evaluate(
        self, config: ConfigT, state: StateT, trajectory: TrajectoryData, ctx: StageContext
    ) -> EvalResult:
        raise NotImplementedError(f"{type(self).__name__} has no EVAL stage")

    async def teardown(self, config: ConfigT, state: StateT, ctx: StageContext) -> None:
        return None
