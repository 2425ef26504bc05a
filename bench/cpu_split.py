"""Where the CPU of a no-op farm job goes: milliseconds of CPU per job in each process of the
stack (the worker of each queue, the API, PostgreSQL, Redis, this client), over the same jobs
as bench/overhead.py.

    python bench/cpu_split.py [--jobs 600] [--concurrency 4] [--rounds 3]

On a 2-core machine the farm is CPU-bound, so jobs/s is about 2000 / (total ms per job): this
says which part to make cheaper. Per-operation CPU drifts by a third from minute to minute on
a shared machine, so compare splits taken in the same run, not across runs.
"""

from __future__ import annotations

import statistics
import sys
from collections import Counter
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import emit  # noqa: E402
from bench.overhead import farm_side, round_arguments  # noqa: E402

#: a process's part of the stack, from its command line.
PARTS = (
    ("--queues init", "worker init"),
    ("--queues run", "worker run"),
    ("--queues eval", "worker eval"),
    ("farm api", "api"),
    ("postgres", "postgres"),
    ("redis", "redis"),
)


def part_of(process: psutil.Process) -> str | None:
    if process.pid == psutil.Process().pid:
        return "client"
    try:
        command = " ".join(process.cmdline()) or process.name()
    except psutil.Error:
        return None
    return next((part for key, part in PARTS if key in command), None)


def cpu_by_part() -> Counter[str]:
    seconds: Counter[str] = Counter()
    for process in psutil.process_iter():
        part = part_of(process)
        if part is None:
            continue
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        seconds[part] += times.user + times.system
    return seconds


def main() -> None:
    args = round_arguments(__doc__)
    splits: list[dict[str, float]] = []
    rates: list[float] = []
    with farm_side(args.concurrency) as farm:
        for _ in range(args.rounds):
            before = cpu_by_part()
            rates.append(farm(args.jobs))
            after = cpu_by_part()
            splits.append({part: (after[part] - before[part]) * 1000 / args.jobs for part in after})
    medians = {part: statistics.median(s.get(part, 0.0) for s in splits) for split in splits for part in split}
    figures = {part: round(ms, 2) for part, ms in sorted(medians.items(), key=lambda item: -item[1])}
    for part, ms in figures.items():
        print(f"{part:12s} {ms:6.2f} ms CPU per job")
    total = round(sum(figures.values()), 2)
    rate = round(statistics.median(rates), 1)
    print(f"{'total':12s} {total:6.2f} ms CPU per job   ({rate} jobs/s; medians of {args.rounds} rounds)")
    emit({"ms_cpu_per_job": figures, "total_ms_cpu_per_job": total, "jobs_per_s": rate})


if __name__ == "__main__":
    main()
