"""Settings: the one place configuration comes from.

Built once per entry point (``farm`` CLI, ``migrations/env.py``, the Celery module used by
Flower, tests) and passed down. Nothing below the entry points reads ``os.environ``.
Environment variables use the ``FARM_`` prefix and ``__`` between nested names, e.g.
``FARM_DATABASE__URL``, ``FARM_API__TOKEN``, ``FARM_WORKER__NODE``.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from farm.constants import DEFAULT_DATA_DIR


class DatabaseSettings(BaseModel):
    """SQLAlchemy URL. ``None`` means SQLite in the data directory (embedded mode)."""

    url: str | None = None
    echo: bool = False
    #: connections the API process's engine keeps open once used (``farm proxy``'s engines too), and
    #: how many more it may open for a burst (closed when returned). See docs/operations.md,
    #: "Database connections": what each process kind may open, and a deployment in all.
    pool_size: int = Field(default=5, ge=1)
    max_overflow: int = Field(default=5, ge=0)
    #: a worker process's pools: one connection per this many of its slots (at least one) for its
    #: claims and completions, one more for its own upkeep (leases, sweeps). A stage holds a
    #: connection only while its statements run, not while its episode does.
    worker_slots_per_connection: int = Field(default=32, ge=1)
    #: a checkout waits this long for a free connection of its pool before the caller treats the
    #: database as unavailable (and, in a worker, waits and tries again).
    pool_timeout_s: float = Field(default=10.0, gt=0)
    #: the proxy's routes (served by the API and by ``farm proxy``): their engine keeps this many
    #: connections and as many more for a burst; the recorder's two async pools up to twice this each.
    proxy_pool_size: int = Field(default=2, ge=1)
    #: how long a worker's claim or completion keeps trying while the database is unavailable
    #: (full, restarting, pool exhausted) before it hands the stage back to its queue. Waiting
    #: costs time, never an attempt. Retries back off up to unavailable_backoff_s apart.
    unavailable_wait_s: float = Field(default=600.0, ge=0)
    unavailable_backoff_s: float = Field(default=2.0, gt=0)
    pool_pre_ping: bool = False
    #: server-side prepared statements: psycopg prepares a statement on a connection after 5
    #: executions there, and the proxy's recorder prepares its three at once. Off behind PgBouncer in
    #: transaction mode before 1.21 (Debian 12 ships 1.18): it hands each transaction whichever server
    #: connection is free, which may not hold the statement (``prepared statement "_pg3_0" does not
    #: exist``). See docs/operations.md, "PgBouncer".
    prepared_statements: bool = True
    #: connections say, as they open, who holds them (``application_name``, as ``pg_stat_activity``
    #: shows it) and, for the writes a database crash may lose without harm (claims, INIT and RUN
    #: completions, a proxy call's pending row), not to wait for the disk (``options=-c
    #: synchronous_commit=off``). PgBouncer refuses the latter (``unsupported startup parameter:
    #: options``) and replays the former with a ``SET`` whenever a server connection changes hands
    #: (~6 statements a job): off behind it, and those commits wait for the disk like the rest.
    startup_options: bool = True
    #: SQLite waits this long for another process's write lock before failing.
    sqlite_busy_timeout_s: float = 30.0


class RedisSettings(BaseModel):
    """Broker, balancer heap, cancel flags. ``None`` means an embedded Valkey (``farm up`` only)."""

    url: str | None = None


class ApiSettings(BaseModel):
    host: str = "127.0.0.1"
    port: int = 8700
    #: bearer token every route but the health checks requires; ``farm up`` makes one if unset.
    token: SecretStr | None = None
    max_body_bytes: int = 32 * 1024 * 1024
    #: a request whose headers, or whose body, have not all come within this many seconds is closed
    #: (headers) or answered 408 (body): a client trickling its bytes (its proxy routes included).
    read_timeout_s: float = Field(default=30.0, gt=0)
    max_tasks_per_batch: int = 100_000
    #: tasks x group_size of a batch whose jobs are all made at submit (a dynamic batch makes its
    #: groups as it goes, so only its tasks count): every job is a row written before the answer.
    max_jobs_per_batch: int = 200_000
    #: longest a results long-poll may hold a request open.
    max_wait_s: float = 60.0
    #: a results long-poll that finds fewer results than its page holds waits this much longer
    #: for more, so a page carries many results instead of each finish costing a request and a
    #: query. It bounds the delay it adds; a request with ``wait_s=0`` never waits.
    results_linger_s: float = Field(default=0.1, ge=0.0, le=5.0)


class WorkerSettings(BaseModel):
    #: the node a worker runs on: RUN and EVAL of a job go to the node that ran its INIT.
    node: str = Field(default_factory=socket.gethostname)
    init_concurrency: int = 4
    run_concurrency: int = 32
    eval_concurrency: int = 2
    #: Celery pool per worker process: threads suit I/O-bound stages (LLM waits, sandbox I/O).
    pool: str = "threads"
    #: messages a worker reserves per slot on the shared ``init`` queue: 1, so a node never holds
    #: new jobs another node has room for.
    prefetch_multiplier: int = 1
    #: the same for workers that consume only their node's ``run``/``eval`` queues. Nothing else can
    #: take those messages, so reserving one more per slot costs nothing and hands a freed slot its
    #: next stage without a broker round trip (EVAL-bound pipelines: idle slot time -40%).
    node_prefetch_multiplier: int = 2
    init_timeout_s: float = 600.0
    run_timeout_s: float = 3600.0
    eval_timeout_s: float = 1200.0
    #: a job's wall budget from its first INIT to its end (every stage and attempt): past it the
    #: job ends with outcome ``timeout``. A batch's ``limits`` may set this and the three above.
    job_wall_s: float = Field(default=7200.0, gt=0)
    #: how long past its limit a stage that ignores its deadline is left before the farm stops it
    #: (the handler may end on its own at the deadline: an agent_timeout, which is scored).
    limit_grace_s: float = Field(default=5.0, ge=0)
    #: attempts per stage before the job fails with an infrastructure outcome.
    max_attempts: int = 3
    retry_delay_s: float = 2.0
    #: a running stage holds a lease it renews every lease_s/3; when it lapses (worker killed)
    #: the sweeper re-sends the stage. A stage owed to a job (its next stage, a retry) whose
    #: message nobody claimed within lease_s is sent again, unless it is still waiting in its queue.
    lease_s: float = Field(default=30.0, gt=0)
    #: how often each worker process reports its node alive, and one of them sweeps and reconciles.
    sweep_interval_s: float = Field(default=5.0, gt=0)
    #: a node none of whose worker processes has reported for this long is lost: its jobs past
    #: INIT (their sandboxes lived there) start over from INIT elsewhere, or fail, as on_node_lost says.
    node_lost_s: float = Field(default=120.0, gt=0)
    #: ``restart``: a lost node's jobs start over from INIT (at most max_attempts times each, then
    #: they fail); ``fail``: they end failed, outcome infra_error, reason "node lost: ...".
    on_node_lost: Literal["restart", "fail"] = "restart"
    #: a worker starts a sandbox with the configured driver before it takes any job, and refuses to
    #: start (saying why; /readyz shows it too) when that fails. Off only for a farm whose task types
    #: use no sandbox.
    check_sandbox: bool = True
    #: Celery's two INFO lines per task (received, succeeded). Off by default: at hundreds of
    #: stages a second they cost ~0.7 ms of worker CPU per stage, and farm logs every stage that
    #: does not simply complete (skipped, discarded, retried, failed) on its own.
    log_each_task: bool = False


class CelerySettings(BaseModel):
    #: unacked messages of a dead worker return to the queue after this long. Must exceed the
    #: longest stage; the lease sweeper recovers lost stages much sooner.
    visibility_timeout_s: int = 4 * 3600


class LLMSettings(BaseModel):
    """LLM backends, balancer and the built-in CPU backend."""

    #: a job keeps its backend this long after its last turn; an abandoned job's slot is reclaimed after it.
    lease_ttl_s: float = 900.0
    #: health probes of every backend's GET /health: interval, per-probe timeout, failures before ejection.
    health_interval_s: float = 5.0
    probe_timeout_s: float = 2.0
    failures_to_eject: int = 2
    #: a job's model call that finds no healthy backend waits this long for one before its stage fails
    #: (a Redis that came back empty is refilled from PostgreSQL by the next health round; a backend
    #: that restarts is re-admitted by a probe). The proxy does not wait: a harness gets a 503 at once.
    backend_wait_s: float = Field(default=30.0, ge=0)
    #: per generation request; connect errors (request never sent) are retried connect_retries times.
    request_timeout_s: float = 600.0
    connect_timeout_s: float = 5.0
    connect_retries: int = 2
    #: vLLM endpoint: "auto" tries /inference/v1/generate once and falls back to /v1/completions.
    vllm_api: Literal["auto", "completions", "generate"] = "auto"
    #: the policy's tokenizer (chat template) used to build prompts; None means the built-in model's.
    tokenizer_dir: Path | None = None
    #: built-in CPU backend (`farm llm serve`); model_dir None means `<data_dir>/tiny-model`.
    builtin_model_dir: Path | None = None
    builtin_model_name: str = "farm-tiny"
    builtin_host: str = "127.0.0.1"
    builtin_port: int = 8800
    builtin_max_batch: int = 16
    #: scripted replies for the built-in backend (`farm llm serve --script`, see docs/llm.md); None samples always.
    builtin_script: Path | None = None
    #: each decode step of the built-in backend lasts at least this long (a bigger model's pace; 0: full speed).
    builtin_step_time_ms: float = 0.0
    #: a weight update the trainer leaves open this long (no load or resume) is rolled back by the farm.
    weight_update_timeout_s: float = 900.0
    #: how often an API process looks for a weight update to finish, roll back or re-announce.
    weight_redrive_interval_s: float = 2.0
    #: per backend call of a weight update (a pause in mode wait lasts until in-flight turns end).
    weight_control_timeout_s: float = 600.0


class SandboxSettings(BaseModel):
    """Sandbox drivers and tools. Per-sandbox ``SandboxSpec.limits`` override the default limits."""

    #: ``bwrap`` (rootless, default), ``docker`` (where Docker runs), ``singularity`` (HPC), ``local``
    #: (development only: NOT isolated).
    driver: str = "bwrap"
    #: sandboxes, their registry and snapshots; ``None`` means ``<data_dir>/sandboxes``.
    root_dir: Path | None = None
    #: default limits; 0 or ``None`` means unlimited.
    memory_mb: int | None = 4096
    pids: int | None = 512
    cpu_time_s: int | None = None
    wall_time_s: float | None = 4 * 3600.0
    cpus: float | None = None
    #: per tool call, distinct from the episode budget.
    tool_timeout_s: float = 60.0
    #: output kept per tool call (head and tail, middle cut).
    output_cap_bytes: int = 16 * 1024
    #: bytes one tool call may print before it is stopped (the reply still keeps head and tail).
    output_limit_bytes: int = 64 * 1024 * 1024
    #: disk quota of a sandbox's workspace, /tmp and logs together (MiB); 0 or ``None``: unlimited.
    disk_mb: int | None = 4096
    #: ``auto``: a loop-mounted ext4 image when this process may mount (root), else ``rlimit``;
    #: ``loop``: refuse to start a sandbox without it; ``rlimit``: RLIMIT_FSIZE (per file only).
    disk_quota: Literal["auto", "loop", "rlimit"] = "auto"
    #: how long the execution server may take to come up.
    start_timeout_s: float = 30.0
    #: limits via cgroups (needed for process counts as root); falls back to rlimits when not writable.
    use_cgroups: bool = True
    cgroup_root: Path = Path("/sys/fs/cgroup")
    #: the unprivileged user sandboxed commands run as when the worker is root.
    sandbox_uid: int = 65534
    sandbox_gid: int = 65534
    bwrap_path: str = "bwrap"
    #: seccomp filter in bwrap sandboxes: no new user namespaces, keyrings, eBPF, userfaultfd (x86_64).
    bwrap_seccomp: bool = True
    #: host directories bound read-only (those that exist); the Python running farm is added.
    bwrap_system_dirs: list[str] = Field(default_factory=lambda: ["/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64"])
    #: unpacked task images (``SandboxSpec.image``), one per image; ``None`` means ``<root_dir>/images``.
    #: A cache: remove an image's directory by hand when no sandbox runs over it.
    image_cache_dir: Path | None = None
    #: ``docker build --network`` (``none`` for builds that need no network); ``None``: Docker's default.
    image_build_network: str | None = None
    #: the Docker client and the engine it talks to (``-H``; None: the client's default): the ``docker``
    #: driver's containers, and the builds of images a spec names by Dockerfile (nothing else needs Docker).
    docker_path: str = "docker"
    docker_host: str | None = None
    #: ``singularity`` or ``apptainer``.
    singularity_path: str = "singularity"
    #: the image of sandboxes whose spec names none (every shipped task): a .sif file or a directory
    #: made by ``apptainer build --sandbox``, on a file system the node reads.
    singularity_image: str | None = None
    #: Python inside a Singularity image; ``None`` binds the host's Python (same glibc needed).
    singularity_python: str | None = None
    #: writable overlay size for Singularity instances (an ext3 image is made per sandbox); 0: none.
    singularity_overlay_mb: int = 0
    #: the reaper's period in workers that run it.
    reap_interval_s: float = 30.0
    #: a task's starting workspace (its files and setup) is built once per node and copied for
    #: each sample of it; False builds it for every sample (as before; for comparison).
    share_preparation: bool = True
    #: a prepared workspace nobody used for this long is removed by the reaper (built again if needed).
    prepared_ttl_s: float = Field(default=3600.0, gt=0)
    #: warm pool (``farm.sandbox.pool``): sandboxes of each spec INIT asked for lately, started ahead
    #: and handed out at once. Most kept per spec when the node's INIT queue holds that many; 0: no pool.
    pool_size: int = Field(default=0, ge=0)
    #: kept per spec even with an empty queue (up to ``pool_size``).
    pool_min: int = Field(default=1, ge=0)
    #: most warm sandboxes on the node, every spec together.
    pool_max_total: int = Field(default=128, ge=0)
    #: a spec nobody asked for in this long is no longer kept warm.
    pool_idle_s: float = Field(default=900.0, gt=0)
    #: a warm sandbox unclaimed this long is replaced (its hard lifetime counts from its hand-out).
    pool_max_age_s: float = Field(default=1800.0, gt=0)
    #: sandboxes the pool starts side by side while it refills.
    pool_fill_parallel: int = Field(default=2, ge=1)
    #: node-wide sandbox creations per second (a token bucket shared by every process on the node;
    #: a hand-out from the pool is not a creation); 0: unlimited.
    max_creates_per_s: float = Field(default=0.0, ge=0)
    #: creations allowed at once before ``max_creates_per_s`` applies.
    create_burst: int = Field(default=10, ge=1)
    #: a reaper process of the node's own (``farm reap --watch``), started by the first worker and
    #: outliving any worker, so a SIGKILLed worker's sandboxes and their hard lifetimes are enforced
    #: even when no worker is left; False: only the workers' reaper threads.
    node_reaper: bool = True
    #: how often the node's reaper looks (owner deaths, lifetimes); it exits after
    #: ``node_reaper_idle_s`` with nothing to watch.
    node_reaper_interval_s: float = Field(default=1.0, gt=0)
    node_reaper_idle_s: float = Field(default=30.0, gt=0)


class ProxySettings(BaseModel):
    """The OpenAI/Anthropic-compatible proxy that records what an external harness samples."""

    #: where ``farm proxy`` listens (the API process serves the same routes on its own port).
    host: str = "127.0.0.1"
    port: int = 8701
    #: a Unix socket ``farm proxy`` also listens on, for harnesses in sandboxes without a network.
    socket: Path | None = None
    #: max_tokens when a request sets none; clamped to the context the backend has left.
    default_max_tokens: int = Field(default=4096, gt=0)
    #: the served model's family (``farm.llm.families``: qwen3, llama3, ...), whose tool-call and
    #: reasoning parsers read its answers. Unset: the family whose published chat template the
    #: tokenizer carries, if any.
    family: str | None = None
    #: how tool calls are written in the model's text, by vLLM's ``--tool-call-parser`` name
    #: (``hermes`` is ``<tool_call>{json}</tool_call>``; qwen3_coder, llama3_json, ...). Unset: the
    #: family's, else ``hermes`` (the tiny model's template).
    tool_parser: str | None = None
    #: how the model writes its reasoning, by vLLM's ``--reasoning-parser`` name (qwen3, deepseek_r1,
    #: ...; ``none``: it writes none). Unset: the family's, else ``none``.
    reasoning_parser: str | None = None
    #: longest request body the proxy reads (a harness's long history with tool outputs).
    max_body_bytes: int = 64 * 1024 * 1024
    #: a body not fully received within this many seconds is a 408 (a client trickling its bytes).
    read_timeout_s: float = Field(default=30.0, gt=0)
    #: most messages (Responses: input items) one request may hold.
    max_messages: int = Field(default=10_000, gt=0)
    #: most tools one request may offer.
    max_tools: int = Field(default=1_000, gt=0)
    #: deepest nesting of objects and arrays in a request body (a tool's schema included).
    max_json_depth: int = Field(default=64, gt=0)
    #: the longest context any backend serves, in tokens: a prompt whose text cannot fit it is refused
    #: from its length, or once its tokens, counted piece by piece, pass it: before it is tokenized
    #: whole (``farm.proxy.bounds``, ``farm.llm.counting``).
    max_prompt_tokens: int = Field(default=262_144, gt=0)
    #: processes ``farm proxy`` serves with, sharing its sockets (each is one event loop, about 6 ms of
    #: CPU per call): a node running many harnesses wants about one per core the backend leaves free.
    processes: int = Field(default=1, ge=1)
    #: the API key of every trial a verl ``RemoteAgentLoop`` registers (``POST /sessions/{id}``):
    #: verl hands its harnesses one configured key, never a per-trial one. Unset: each such trial
    #: gets a key of its own, returned by the register call only (verl ignores it).
    verl_harness_key: SecretStr | None = None


class FlowerSettings(BaseModel):
    port: int = 5555


class Settings(BaseSettings):
    """Everything farm can be told. See the module docstring for the environment names."""

    model_config = SettingsConfigDict(env_prefix="FARM_", env_nested_delimiter="__", extra="ignore")

    data_dir: Path = DEFAULT_DATA_DIR
    #: `package.module:Class` paths that are task types too (each named by its path), for a handler
    #: no package registers as a `farm.handlers` entry point (tests, one under development); a JSON
    #: list. No other path is ever imported for a request's task type.
    handler_paths: list[str] = Field(default_factory=list)
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    celery: CelerySettings = Field(default_factory=CelerySettings)
    llm: LLMSettings = Field(default_factory=LLMSettings)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    flower: FlowerSettings = Field(default_factory=FlowerSettings)
    proxy: ProxySettings = Field(default_factory=ProxySettings)

    @property
    def database_url(self) -> str:
        return self.database.url or f"sqlite:///{self.data_dir / 'farm.db'}"

    @property
    def redis_url(self) -> str:
        if not self.redis.url:
            raise RuntimeError("no Redis URL: set FARM_REDIS__URL, or use `farm up` for an embedded one")
        return self.redis.url

    @property
    def api_url(self) -> str:
        return f"http://{self.api.host}:{self.api.port}"
