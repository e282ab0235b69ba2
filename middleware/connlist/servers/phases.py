"""Where the message being received on a connection stands: a server protocol's ``_connlist_phase``.

One value per connection, written by the protocol's read path after each
read (``connlist.servers.seam.Tracking._connlist_settle``) and by the
events that end HTTP on it (an upgrade, a refusal, a head too long).  Every
phase from ``UPGRADED`` on is final: no HTTP event of the list follows.
"""

from __future__ import annotations

__all__ = ["BETWEEN", "BODY", "HEADERS", "OVERFLOWED", "UPGRADED", "UPGRADE_REFUSED"]

# Where the message being received on a connection stands (``Tracking._connlist_phase``).
BETWEEN = 0  # no message open: a new or idle connection
HEADERS = 1  # message begun, headers incomplete
BODY = 2  # headers complete, message incomplete
UPGRADED = 3  # handed over to another protocol (a websocket): no HTTP event follows
UPGRADE_REFUSED = 4  # an upgrade refused with 503 at max_upgraded: closing, no HTTP event follows
OVERFLOWED = 5  # a head past max_header_size, answered 431: closing, no HTTP event follows
