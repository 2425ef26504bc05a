"""Sandbox start time, the three modes of computesdk/benchmarks, cold (no pool) and warm (pool).

    python bench/sandbox_start.py [--n 100] [--image PATH|NAME [--image-driver bwrap|docker]]

Each sample is the time from ``create`` to the end of a first command (``echo``, through the
sandbox's bash tool, as an agent's first command goes), through ``SandboxResources.create`` as
INIT calls it: sequential (n one at a time), staggered (n, one
every 200 ms) and burst (n at once; all-ready is the last one's time). Cold has no pool; warm
has a pool of n per node filled before each mode (as a hosted service's is), and refilling in
the background while the mode runs. The sandbox is the default one: the host's root file system
under bwrap, with the default limits (cgroups, a loop-mounted disk quota). ``--image`` runs the
warm burst again for a sandbox of that image with ``--image-driver`` (bwrap: a ``docker save``
archive or OCI layout on the node, see docs/sandbox.md; docker: an image the engine has). The
floor is a bare ``bwrap ... echo`` (no server, no limits), measured in this run.

Reference (computesdk/benchmarks, 100 sandboxes): Daytona 186 ms median one at a time, 367 ms
median and 0.9 s all-ready in a burst. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._common import emit  # noqa: E402
from farm.config import Settings  # noqa: E402
from farm.sandbox import SandboxSpec, driver_class  # noqa: E402
from farm.sandbox.registry import Registry  # noqa: E402
from farm.sandbox.server_sandbox import ServerSandbox  # noqa: E402
from farm.worker.sandboxes import SandboxResources  # noqa: E402

DAYTONA = {"sequential_median_ms": 186.0, "burst_median_ms": 367.0, "burst_all_ready_ms": 900.0}
FILL_TIMEOUT_S = 900.0


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def _start_one(resources: SandboxResources, spec: SandboxSpec, t0: float) -> tuple[float, ServerSandbox]:
    sandbox = resources.create(spec)
    # The first command goes where an agent's does: the sandbox's bash tool (started with the sandbox).
    result = sandbox.tools().bash("echo ready")
    elapsed = time.perf_counter() - t0
    if result.output != "ready\n":
        raise RuntimeError(f"first command failed in {sandbox.id}: {result}")
    return elapsed, sandbox


def sequential(resources: SandboxResources, spec: SandboxSpec, n: int) -> list[float]:
    out = []
    for _ in range(n):
        elapsed, sandbox = _start_one(resources, spec, time.perf_counter())
        out.append(elapsed)
        sandbox.close()  # not timed: a caller gives it back later
    return out


def staggered(resources: SandboxResources, spec: SandboxSpec, n: int, gap_s: float) -> list[float]:
    made: list[ServerSandbox] = []
    times: list[float] = []
    lock = threading.Lock()

    def one() -> None:
        elapsed, sandbox = _start_one(resources, spec, time.perf_counter())
        with lock:
            times.append(elapsed)
            made.append(sandbox)

    threads = []
    for _ in range(n):
        t = threading.Thread(target=one)
        t.start()
        threads.append(t)
        time.sleep(gap_s)
    for t in threads:
        t.join()
    _close_all(made)
    return times


def burst(resources: SandboxResources, spec: SandboxSpec, n: int) -> list[float]:
    barrier = threading.Barrier(n + 1)
    results: list[tuple[float, ServerSandbox]] = []
    lock = threading.Lock()
    start = [0.0]

    def one() -> None:
        barrier.wait()
        got = _start_one(resources, spec, start[0])
        with lock:
            results.append(got)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    start[0] = time.perf_counter()
    barrier.wait()
    for t in threads:
        t.join()
    _close_all([s for _, s in results])
    if len(results) != n:
        raise RuntimeError(f"only {len(results)} of {n} sandboxes started")
    return [e for e, _ in results]


def _close_all(sandboxes: list[ServerSandbox]) -> None:
    with ThreadPoolExecutor(4) as ex:
        list(ex.map(lambda s: s.close(), sandboxes))


def _summary(name: str, times: list[float], *, all_ready: bool = False) -> dict[str, float]:
    out = {f"{name}_median_ms": _ms(statistics.median(times)), f"{name}_p95_ms": _ms(_p95(times))}
    if all_ready:
        out[f"{name}_all_ready_ms"] = _ms(max(times))
    print(f"  {name:28s} median {out[f'{name}_median_ms']:8.1f} ms  p95 {out[f'{name}_p95_ms']:8.1f} ms", end="")
    print(f"  all-ready {out[f'{name}_all_ready_ms']:8.1f} ms" if all_ready else "", flush=True)
    return out


def run_modes(
    settings: Settings, spec: SandboxSpec, *, n: int, gap_s: float, warm: bool, modes: tuple[str, ...]
) -> dict[str, float]:
    resources = SandboxResources(settings)
    keeper = resources.start_pool() if warm else None

    def filled() -> None:
        if keeper is None:
            return
        if resources.pool is not None and not resources.pool.ready_count():
            resources.create(spec).close()  # the first ask: from here on the keeper warms this shape
        started = time.monotonic()
        if not keeper.wait_full(timeout_s=FILL_TIMEOUT_S):
            raise RuntimeError("the warm pool did not fill")
        print(f"  (pool of {n} filled in {time.monotonic() - started:.1f} s)", flush=True)

    prefix = "warm" if warm else "cold"
    runs: dict[str, Callable[[], list[float]]] = {
        "sequential": lambda: sequential(resources, spec, n),
        "staggered": lambda: staggered(resources, spec, n, gap_s),
        "burst": lambda: burst(resources, spec, n),
    }
    out: dict[str, float] = {}
    try:
        for mode in modes:
            filled()
            out |= _summary(f"{prefix}_{mode}", runs[mode](), all_ready=mode == "burst")
    finally:
        resources.stop_pool()
    return out


def bwrap_floor(runs: int = 20) -> float | None:
    """A bare bwrap over the host's / running echo: what no driver built on bwrap can beat."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return None
    argv = [bwrap, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--unshare-all", "echo", "ready"]
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return _ms(statistics.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--stagger-ms", type=float, default=200.0)
    parser.add_argument("--image", help="also a warm burst of sandboxes of this image")
    parser.add_argument("--image-driver", default="bwrap", choices=("bwrap", "docker"))
    parser.add_argument("--docker-host", help="the dockerd of the docker driver (-H); default: the client's")
    parser.add_argument("--skip-cold", action="store_true")
    parser.add_argument("--modes", default="sequential,staggered,burst", help="comma-separated")
    args = parser.parse_args()
    n, gap = args.n, args.stagger_ms / 1000
    data = Path(tempfile.mkdtemp(prefix="farm-bench-start-"))
    pool = {"pool_size": n, "pool_min": n, "pool_max_total": n, "pool_fill_parallel": 2}
    figures: dict[str, Any] = {"n": n, "loadavg_1m_at_start": os.getloadavg()[0], "floor_bwrap_echo_ms": bwrap_floor()}
    print(
        f"sandbox start, n={n} (create to the end of a first echo); floor bare bwrap echo: "
        f"{figures['floor_bwrap_echo_ms']} ms",
        flush=True,
    )
    try:
        base = Settings(data_dir=data / "data", sandbox={"root_dir": data / "sb", "reap_interval_s": 3600})
        spec = SandboxSpec()
        modes = tuple(args.modes.split(","))
        figures |= run_modes(
            base.model_copy(update={"sandbox": base.sandbox.model_copy(update=pool)}),
            spec,
            n=n,
            gap_s=gap,
            warm=True,
            modes=modes,
        )
        if not args.skip_cold:
            figures |= run_modes(base, spec, n=n, gap_s=gap, warm=False, modes=modes)
        figures["image_warm_burst_median_ms"] = None
        figures["image_warm_burst_all_ready_ms"] = None
        if args.image:
            if getattr(driver_class(args.image_driver), "supports_images", False):
                image_settings = base.model_copy(
                    update={
                        "sandbox": base.sandbox.model_copy(
                            update={**pool, "driver": args.image_driver, "docker_host": args.docker_host}
                        )
                    }
                )
                got = run_modes(
                    image_settings, SandboxSpec(image=args.image), n=n, gap_s=gap, warm=True, modes=("burst",)
                )
                figures["image_warm_burst_median_ms"] = got["warm_burst_median_ms"]
                figures["image_warm_burst_all_ready_ms"] = got["warm_burst_all_ready_ms"]
            else:
                print(f"  the {args.image_driver} driver takes no images here: image figures are null", flush=True)
        for key, ref in DAYTONA.items():
            if f"warm_{key}" in figures:
                figures[f"warm_{key}_vs_daytona"] = round(figures[f"warm_{key}"] / ref, 3)
        if "cold_burst_median_ms" in figures:
            figures["warm_over_cold_burst_median"] = round(
                figures["warm_burst_median_ms"] / figures["cold_burst_median_ms"], 3
            )
    finally:
        # Whatever is left (a mode that failed halfway) is torn down properly: mounts, cgroups, processes.
        Registry(root=data / "sb").reap(now=float("inf"))
        shutil.rmtree(data, ignore_errors=True)
    # Other work on the machine slows every figure: the load it had says how much.
    figures["loadavg_1m_at_end"] = os.getloadavg()[0]
    emit(figures)


if __name__ == "__main__":
    main()
