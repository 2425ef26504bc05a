"""A node-wide limit on sandbox creations: one token bucket in a file, shared by every process.

Hosted sandbox services limit creations (5/s is common) and so should a node: a burst of INITs
after a batch lands would otherwise start dozens of sandboxes at once on a few cores, and every
one of them would come up slower than if they had queued. The bucket (``tokens last``) lives in
``<sandbox root>/create-rate`` under an flock, so worker processes, the pool's keeper and
``farm`` commands on the node draw from the same budget.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

#: the bucket's file under the sandbox root.
BUCKET_FILE = "create-rate"


class CreateRateLimit:
    """``acquire()`` blocks until a creation is allowed (``rate`` per second, ``burst`` at once)."""

    def __init__(self, root: Path, *, rate: float, burst: int) -> None:
        self.path = root / BUCKET_FILE
        self.rate = rate
        self.burst = burst

    def acquire(self) -> float:
        """Take one token; returns the seconds waited (0.0 when unlimited)."""
        if self.rate <= 0:
            return 0.0
        waited = 0.0
        while True:
            wait = self._try_take()
            if wait <= 0:
                return waited
            time.sleep(wait)
            waited += wait

    def _try_take(self) -> float:
        """Take a token if one is there (returns 0), else how long until one is."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            now = time.time()
            try:
                tokens_s, last_s = os.pread(fd, 64, 0).decode().split()
                tokens, last = float(tokens_s), float(last_s)
            except ValueError:  # new or unreadable: a full bucket
                tokens, last = float(self.burst), now
            tokens = min(float(self.burst), tokens + max(now - last, 0.0) * self.rate)
            if tokens >= 1.0:
                tokens -= 1.0
                wait = 0.0
            else:
                wait = (1.0 - tokens) / self.rate
            data = f"{tokens:.6f} {now:.6f}".encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            return wait
        finally:
            os.close(fd)
