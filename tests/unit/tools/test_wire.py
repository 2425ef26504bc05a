from __future__ import annotations

import socket
import struct
import threading

import pytest

from farm.errors import WireError
from farm.tools.wire import bind_unix, connect_unix, recv_msg, send_msg


def test_wire_round_trip_small_and_large_frames() -> None:
    a, b = socket.socketpair()
    with a, b:
        send_msg(a, {"op": "ping", "args": {}})
        assert recv_msg(b) == {"op": "ping", "args": {}}
        big = {"data": "x" * 3_000_000}
        sender = threading.Thread(target=send_msg, args=(a, big))
        sender.start()
        assert recv_msg(b) == big
        sender.join()


def test_wire_closed_peer_raises_wire_error() -> None:
    a, b = socket.socketpair()
    a.close()
    with b, pytest.raises(WireError):
        recv_msg(b)


def test_wire_refuses_oversized_frame() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(struct.pack(">I", 2**31))
        with pytest.raises(WireError, match="exceeds"):
            recv_msg(b)


def test_unix_socket_with_path_longer_than_sun_path(tmp_path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = str(deep / "server.sock")
    assert len(path) > 108
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bind_unix(listener, path)
    listener.listen(1)
    client = connect_unix(path)
    conn, _ = listener.accept()
    with listener, client, conn:
        send_msg(client, {"hi": 1})
        assert recv_msg(conn) == {"hi": 1}


def test_wire_lone_surrogate_survives_the_round_trip() -> None:
    a, b = socket.socketpair()
    with a, b:
        send_msg(a, {"command": "echo \ud800"})
        assert recv_msg(b) == {"command": "echo \ud800"}


def test_wire_garbage_frame_is_a_wire_error() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(struct.pack(">I", 5) + b"{nope")
        with pytest.raises(WireError, match="not JSON"):
            recv_msg(b)
