"""The benchmarks' free ports of 127.0.0.1: each given once per run.

A script that starts two servers one after the other (a pair, or the
servers of an attack) asks for a port for each.  A port is free from the
moment the kernel gives it until its server binds it, and the kernel may
give it again meanwhile: the second server would then fail to start, or
the first would answer for it.  So a port is never given twice in a run.
"""

from __future__ import annotations

import socket
import threading

__all__ = ["free_port"]

_given: set[int] = set()
_lock = threading.Lock()


def free_port() -> int:
    """A port of 127.0.0.1 nothing listens on now, and not given before in this run."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        with _lock:
            if port not in _given:
                _given.add(port)
                return port
