"""Run with the `harbor` package's own interpreter (scripts/setup_harbor.sh): read each task directory
given on the command line with Harbor's loader and print what it read, one JSON object per line."""

import json
import sys

from harbor.models.task.task import Task  # type: ignore[import-not-found]

for path in sys.argv[1:]:
    task = Task(path)
    cfg = task.config
    env = cfg.environment
    print(
        json.dumps(
            {
                "path": path,
                "name": task.name,
                "instruction": task.instruction,
                "schema_version": cfg.schema_version,
                "metadata": cfg.metadata,
                "verifier": {"timeout_sec": cfg.verifier.timeout_sec, "env": cfg.verifier.env},
                "agent": {"timeout_sec": cfg.agent.timeout_sec},
                "environment": {
                    "build_timeout_sec": env.build_timeout_sec,
                    "docker_image": env.docker_image,
                    "cpus": env.cpus,
                    "memory_mb": env.memory_mb,
                    "storage_mb": env.storage_mb,
                    "allow_internet": env.allow_internet,
                },
            }
        )
    )
