"""Memory tuning of the API process (glibc ``mallopt``)."""

from __future__ import annotations

import ctypes
import ctypes.util

#: glibc ``mallopt`` parameters, and what the API sets them to (see ``keep_freed_memory``).
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_API_MALLOC = {_M_MMAP_THRESHOLD: 32 << 20, _M_TRIM_THRESHOLD: 256 << 20, _M_TOP_PAD: 64 << 20}


def keep_freed_memory() -> None:
    """Let the API process reuse the memory it frees instead of handing it back to the kernel.

    A results page moves megabytes through several buffers (libpq's, the rows', the socket's);
    with glibc's defaults each buffer that size is fresh memory, page-faulted in again on every
    page, and that costs the API more CPU than the rest of the page together. The price is up
    to 256 MB the process keeps after a burst. Not glibc (musl, macOS): nothing to do.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    for param, value in _API_MALLOC.items():
        mallopt(param, value)
