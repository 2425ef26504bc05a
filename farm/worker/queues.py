"""What waits in a stage queue: the job ids of the messages in its Redis list.

The reconciler asks before it re-sends an owed stage, so a long queue is not flooded with
copies of messages that are merely waiting their turn: only a message that is nowhere in its
queue (lost with a Redis restart, reserved by a worker that was killed, never sent because a
process died between its commit and its send) is sent again.
"""

from __future__ import annotations

import re
from typing import cast

from redis import Redis

#: list entries read per LRANGE.
SCAN_CHUNK = 1000
# Every stage message carries its argument repr "[<job id>]" (farm.worker.enqueue; Celery's
# own retries render the same list): a byte search is ~20x cheaper than decoding the message.
_JOB_ID = re.compile(rb'"argsrepr":\s*"\[(\d+)\]"')


def waiting_jobs(client: Redis, queue: str) -> set[int]:
    """Job ids of the messages waiting in ``queue`` (kombu keeps a queue as a Redis list of the
    same name, newest first). A message popped meanwhile may be missed, one pushed meanwhile
    read twice: either way the worst outcome is one harmless extra copy."""
    found: set[int] = set()
    start = 0
    while True:
        chunk = cast(list[bytes], client.lrange(queue, start, start + SCAN_CHUNK - 1))
        for raw in chunk:
            if match := _JOB_ID.search(raw):
                found.add(int(match.group(1)))
        if len(chunk) < SCAN_CHUNK:
            return found
        start += SCAN_CHUNK
