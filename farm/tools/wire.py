"""The execution server's wire format: a 4-byte big-endian length, then a UTF-8 JSON object.

Request:  ``{"op": "bash", "args": {...}}``
Response: ``{"ok": true, "result": {...}}`` or ``{"ok": false, "error": "...", "kind": "..."}``

One request at a time per connection; the client opens one connection per thread that
needs concurrency. JSON keeps the server stdlib-only and debuggable with ``socat``; a call
costs a few microseconds of framing next to the pty round trip.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from typing import Any

from farm.errors import WireError

_HEADER = struct.Struct(">I")
# Built once: json.dumps with arguments builds a new encoder per call (~2 us each on this box).
_ENCODER = json.JSONEncoder(separators=(",", ":"))
_DECODER = json.JSONDecoder()

_orjson: Any
try:  # orjson, where installed, cuts ~15 us of a ~40 us round trip; stdlib json is the fallback.
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised where orjson is absent
    _orjson = None


def encode(msg: dict[str, Any]) -> bytes:
    if _orjson is not None:
        try:
            data: bytes = _orjson.dumps(msg)
            return data
        except TypeError:  # e.g. a lone surrogate in a model-written string: json escapes it
            pass
    return _ENCODER.encode(msg).encode()


def decode(body: bytes) -> Any:
    if _orjson is not None:
        try:
            return _orjson.loads(body)
        except ValueError:
            pass
    try:
        return _DECODER.decode(body.decode())
    except ValueError as exc:
        raise WireError(f"frame is not JSON: {exc}") from exc


#: refuse frames larger than this: a corrupt length must not allocate gigabytes.
MAX_FRAME_BYTES = 256 * 1024 * 1024
_FIRST_READ_BYTES = 4096


def send_msg(sock: socket.socket, msg: dict[str, Any]) -> None:
    body = encode(msg)
    sock.sendall(_HEADER.pack(len(body)) + body)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise WireError("connection closed")
        buf += chunk
    return bytes(buf)


def recv_msg(sock: socket.socket) -> dict[str, Any]:
    # One recv usually brings header and body together: a second syscall only for big frames.
    first = sock.recv(_FIRST_READ_BYTES)
    if len(first) < _HEADER.size:
        first += _recv_exact(sock, _HEADER.size - len(first)) if first else b""
        if len(first) < _HEADER.size:
            raise WireError("connection closed")
    (size,) = _HEADER.unpack_from(first)
    if size > MAX_FRAME_BYTES:
        raise WireError(f"frame of {size} bytes exceeds {MAX_FRAME_BYTES}")
    body = first[_HEADER.size :]
    if len(body) > size:
        raise WireError("peer sent a second frame before the answer (one request at a time)")
    if len(body) < size:
        body += _recv_exact(sock, size - len(body))
    msg = decode(body)
    if not isinstance(msg, dict):
        raise WireError("frame is not a JSON object")
    return msg


def connect_unix(path: str, *, timeout_s: float | None = None) -> socket.socket:
    """Connect to a Unix socket, also when its path is longer than sun_path's 108 bytes.

    A long path is reached through ``/proc/self/fd/N/`` of its opened directory.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        if len(path.encode()) < 100:
            sock.connect(path)
        else:
            directory, name = os.path.split(path)
            fd = os.open(directory, os.O_PATH)
            try:
                sock.connect(f"/proc/self/fd/{fd}/{name}")
            finally:
                os.close(fd)
    except OSError:
        sock.close()
        raise
    return sock


def bind_unix(sock: socket.socket, path: str) -> None:
    """``sock.bind(path)`` that also works for paths longer than sun_path (see connect_unix)."""
    if len(path.encode()) < 100:
        sock.bind(path)
        return
    directory, name = os.path.split(path)
    fd = os.open(directory, os.O_PATH)
    try:
        sock.bind(f"/proc/self/fd/{fd}/{name}")
    finally:
        os.close(fd)
