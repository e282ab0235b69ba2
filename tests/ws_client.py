"""A websocket client on a raw socket (RFC 6455, stdlib only), for the tests that need a real one.

``upgrade`` sends an upgrade request and reads the answer's head (its status:
``101``, or ``503`` past ``max_upgraded``); ``send_text`` sends a masked text
frame, ``receive`` reads one frame; ``close`` does the closing handshake.
"""

from __future__ import annotations

import base64
import os
import socket
import struct

__all__ = ["WebSocket", "upgrade"]

_TEXT = 0x1
_CLOSE = 0x8


class WebSocket:
    """One client connection, after its upgrade request was answered."""

    def __init__(self, sock: socket.socket, status: int, rest: bytes) -> None:
        self.sock = sock
        self.status = status
        self._buffer = rest

    def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed by the server")
            self._buffer += chunk
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def send(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        else:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def send_text(self, text: str) -> None:
        self.send(_TEXT, text.encode())

    def receive(self) -> tuple[int, bytes]:
        """One frame from the server: its opcode and payload (the server sends them unmasked)."""
        first, second = self._read(2)
        n = second & 0x7F
        if n == 126:
            n = struct.unpack("!H", self._read(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", self._read(8))[0]
        return first & 0x0F, self._read(n)

    def echo(self, text: str) -> bool:
        """Whether the echo route sends ``text`` back."""
        self.send_text(text)
        return self.receive() == (_TEXT, text.encode())

    def close(self) -> None:
        """The closing handshake (1000), then the socket; a server that went first is fine too."""
        try:
            self.send(_CLOSE, struct.pack("!H", 1000))
            while self.receive()[0] != _CLOSE:
                pass
        except OSError:
            pass
        finally:
            self.sock.close()


def upgrade(port: int, path: str = "/ws", timeout: float = 5.0) -> WebSocket:
    """Connect and ask to upgrade ``path``; the answer's status is ``.status`` (the socket stays open)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        key = base64.b64encode(os.urandom(16))
        sock.sendall(
            b"GET " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed after {data!r}")
            data += chunk
    except BaseException:
        sock.close()
        raise
    head, _, rest = data.partition(b"\r\n\r\n")
    return WebSocket(sock, int(head.split(b" ", 2)[1]), rest)
