"""Refusals are counted per listener and reason and said at most once a second, nothing lost; a port's
connections that never finish a handshake are found from this process's own sockets (TCP_INFO)."""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter

from forge_nb.runtime.refusals import Refusals, StalledHandshakes, describe


def test_refusals_are_said_at_most_once_a_second_and_none_is_lost():
    said: list[tuple[float, str]] = []
    counted = Refusals(report=lambda what: said.append((time.monotonic(), what)), every_s=0.3)
    for _ in range(5):
        counted.refused("weights stream 10.0.0.1:5000", "no secret", "10.0.0.9:4321")
    counted.refused("session socket", "no key")
    time.sleep(0.6)
    assert [what for _, what in said] == [
        "refused 1 connection: weights stream 10.0.0.1:5000: no secret x1 (last from 10.0.0.9:4321)",
        "refused 5 connections: weights stream 10.0.0.1:5000: no secret x4; session socket: no key x1 "
        "(last from 10.0.0.9:4321)",
    ]
    assert said[1][0] - said[0][0] >= 0.29
    assert counted.totals() == {"weights stream 10.0.0.1:5000: no secret": 5, "session socket: no key": 1}


def test_totals_a_process_reports_again_count_only_what_grew():
    said: list[str] = []
    counted, seen = Refusals(report=said.append, every_s=0.0), {}
    counted.add({"worker 10.0.0.2:26600: handshake not finished": 3}, seen)
    counted.add({"worker 10.0.0.2:26600: handshake not finished": 3}, seen)  # another proc on that host: the same
    counted.add({"worker 10.0.0.2:26600: handshake not finished": 5}, seen)
    assert said == [
        "refused 3 connections: worker 10.0.0.2:26600: handshake not finished x3",
        "refused 2 connections: worker 10.0.0.2:26600: handshake not finished x2",
    ]
    assert describe(Counter({"a: b": 1})) == "refused 1 connection: a: b x1"


def test_connections_that_never_finish_a_handshake_are_found_and_counted_once():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: [accepted.append(listener.accept()[0]) for _ in range(3)], daemon=True).start()
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    talker = socket.create_connection(("127.0.0.1", port))
    talker.sendall(b"x" * 2000)  # a TLS client's handshake sends this much at least
    counted = Refusals()
    watcher = StalledHandshakes(port, "worker 127.0.0.1", counted, after_s=0.3, every_s=0.1).start()
    try:
        deadline = time.monotonic() + 5
        while not counted.totals() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.4)  # more rounds: each connection counts once
        assert counted.totals() == {"worker 127.0.0.1: handshake not finished": 2}
    finally:
        watcher.stop()
        for s in [*silent, talker, *accepted, listener]:
            s.close()
