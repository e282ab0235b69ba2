"""A gunicorn whose ASGI protocol changed, in the worker that imports this app (tests/test_gunicorn_asgi.py).

``CONNLIST_TEST_DRIFT`` says how, each a change a gunicorn release could
make, done on the installed gunicorn's class in this process only:

* ``renamed`` (the default): ``_arm_keepalive_timer`` is called
  ``_start_keepalive_timer``, everywhere gunicorn's protocol names it;
* ``bypassed``: the method is still there, but gunicorn's connection loop
  no longer calls it (it calls a copy of its own): a hook's body changed.

gunicorn keeps working either way; connlist's class must not be used.
"""

from __future__ import annotations

import os
import types

from gunicorn.asgi.protocol import ASGIProtocol

from tests.gunicorn_asgi_app import app

__all__ = ["app", "rename_calls"]


def rename_calls(cls: type, old: str, new: str, only: tuple[str, ...] = ()) -> None:
    """Make the methods of ``cls`` (or ``only`` these) call ``self.new`` where they called ``self.old``."""
    for name, value in list(vars(cls).items()):
        if only and name not in only:
            continue
        function = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
        if isinstance(function, types.FunctionType) and old in function.__code__.co_names:
            names = tuple(new if n == old else n for n in function.__code__.co_names)
            function.__code__ = function.__code__.replace(co_names=names)


DRIFT = os.environ.get("CONNLIST_TEST_DRIFT", "renamed")
if DRIFT == "renamed":
    rename_calls(ASGIProtocol, "_arm_keepalive_timer", "_start_keepalive_timer")
    ASGIProtocol._start_keepalive_timer = ASGIProtocol._arm_keepalive_timer
    del ASGIProtocol._arm_keepalive_timer
elif DRIFT == "bypassed":
    rename_calls(ASGIProtocol, "_arm_keepalive_timer", "_own_keepalive_timer", only=("_handle_connection",))
    ASGIProtocol._own_keepalive_timer = ASGIProtocol._arm_keepalive_timer
else:
    raise ValueError(f"CONNLIST_TEST_DRIFT must be renamed or bypassed, got {DRIFT!r}")
