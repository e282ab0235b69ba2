"""Where the worker's enforcer passes from ``ConnectionsMiddleware`` to the server's protocols.

What belongs here: ``HandOver``, the one place an enforcer is handed over,
and ``HANDOVER``, this worker's.  Nothing else.

Why it is not the ASGI lifespan state: that dict is the app's.  The server
copies it into every request's ``scope["state"]``, so a key of connlist's
there would show in every request, and the servers' own tests of the state
would see it.  There is one enforcer per worker process, so the rule is one
hand-over per worker:

* the middleware hands its enforcer over at its lifespan startup
  (``HANDOVER.enforcer = enforcer``), before the server accepts a
  connection, and at its first request adopts the enforcer found there if
  a protocol put a fallback in it (the lifespan was off);
* each server protocol reads its class's ``connlist_handover`` (this
  worker's, ``HANDOVER``) when a connection is set up
  (``connlist.servers.seam.Tracking._connlist_setup``) and, with nothing
  handed over, puts the fallback enforcer it makes there, where later
  connections and the middleware find it;
* the observers (``connlist.observe``) read it when they collect.

A self-check, which can run while a real server of the process serves,
gives its check protocols a ``HandOver`` of their own (their class's
``connlist_handover``: ``connlist.servers.selfcheck.handed_over``) and never
touches ``HANDOVER``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from connlist.core.enforcer import Enforcer

__all__ = ["HANDOVER", "HandOver"]


class HandOver:
    """Where one worker's enforcer is handed over: ``enforcer`` (None until it is)."""

    __slots__ = ("enforcer",)

    def __init__(self, enforcer: Enforcer | None = None) -> None:
        self.enforcer = enforcer

    def __repr__(self) -> str:
        return f"HandOver({self.enforcer!r})"


# This worker's (this process's): the middleware's, and its server's protocols'.
HANDOVER = HandOver()
