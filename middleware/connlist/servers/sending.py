"""What a connection still has to send, as its transport and the kernel say: the send timeout's readings.

Asked only of a connection that stalls or closes with bytes unsent, never on a request's path.
"""

from __future__ import annotations

import socket
import struct
import sys
from typing import Any

try:  # Linux: the bytes in a socket's send queue that the peer has not acknowledged
    import fcntl
    import termios

    _OUTQ: int | None = termios.TIOCOUTQ  # SIOCOUTQ
except (ImportError, AttributeError):  # pragma: no cover - not Linux
    _OUTQ = None

__all__ = ["acked", "pending", "unsent"]

# The offsets of tcpi_bytes_acked and tcpi_snd_wnd in Linux's struct tcp_info.
_TCP_INFO: int | None = getattr(socket, "TCP_INFO", None) if sys.platform == "linux" else None
_TCP_INFO_LEN = 232
_BYTES_ACKED = struct.Struct("=Q")
_BYTES_ACKED_AT = 120
_SND_WND = struct.Struct("=I")
_SND_WND_AT = 228


def unsent(transport: Any) -> int:
    """The bytes ``transport`` holds unsent; 0 where it cannot say (a test's transport, as uvicorn's)."""
    try:
        size: int = transport.get_write_buffer_size()
    except (AttributeError, NotImplementedError):
        return 0
    return size


def pending(transport: Any) -> int:
    """The bytes not yet acknowledged: the transport's, and its socket's send queue where Linux tells."""
    if transport is None:
        return 0
    held = unsent(transport)
    if _OUTQ is not None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                queued = fcntl.ioctl(sock.fileno(), _OUTQ, b"\0\0\0\0")
            except (OSError, ValueError):  # closed meanwhile (fileno() is -1), or no send queue
                pass
            else:
                held += struct.unpack("i", queued)[0]
    return held


def acked(transport: Any) -> tuple[int, int] | None:
    """The bytes the peer acknowledged, and the window it advertises now; None without Linux's TCP_INFO."""
    if _TCP_INFO is None:
        return None
    sock = None if transport is None else transport.get_extra_info("socket")
    if sock is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _TCP_INFO_LEN)
    except (OSError, AttributeError, TypeError):  # closed meanwhile, or a socket without TCP_INFO
        return None
    if len(info) < _BYTES_ACKED_AT + 8:
        return None  # a kernel before 4.1
    window = _SND_WND.unpack_from(info, _SND_WND_AT)[0] if len(info) >= _SND_WND_AT + 4 else 0
    return _BYTES_ACKED.unpack_from(info, _BYTES_ACKED_AT)[0], window
