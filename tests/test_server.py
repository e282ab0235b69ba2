"""connlist.server: the seam any server integration uses, and uvicorn's protocols built on it."""

from __future__ import annotations

import inspect

import pytest

from connlist import server
from connlist import uvicorn as connlist_uvicorn
from connlist.connections import ConnectionHandle
from connlist.enforcer import STATE_KEY, Enforcer


def test_enforcer_in_the_lifespan_state() -> None:
    enforcer = Enforcer()
    assert server.enforcer_in({STATE_KEY: enforcer}) is enforcer
    assert server.enforcer_in({}) is None


def _handle_methods() -> list[str]:
    return [
        name
        for name, _ in inspect.getmembers(ConnectionHandle, inspect.isfunction)
        if name.startswith("connlist_")
    ]


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_uvicorn_protocols_take_the_transport_handle_from_the_seam(parser: str) -> None:
    cls = connlist_uvicorn._integrate(parser)
    assert issubclass(cls, server.TransportHandle), cls
    assert cls.connlist_mode == f"uvicorn-{parser}"
    for name in _handle_methods():
        method = getattr(cls, name)
        assert callable(method), name
    # What is the transport's is written once, in connlist.server; the rest reads uvicorn's state.
    for name in (
        "connlist_close_expired",
        "connlist_abort",
        "connlist_refuse",
        "connlist_pending",
        "connlist_acked",
    ):
        assert getattr(cls, name) is getattr(server.TransportHandle, name), name
    for name in ("connlist_request", "connlist_reading_paused", "_connlist_mark_cut", "_connlist_responding"):
        assert getattr(cls, name) is not getattr(server.TransportHandle, name, None), name


def test_after_cut_leaves_out_the_apps_client_disconnect_only() -> None:
    from starlette.requests import ClientDisconnect

    seen: list[tuple[object, dict[str, object]]] = []

    class Logger:
        level = 10

        def error(self, msg: object, *args: object, **kwargs: object) -> None:
            seen.append((msg, kwargs))

    wrapped = server.AfterCut(Logger())
    wrapped.error("Exception in ASGI application\n", exc_info=ClientDisconnect())
    failure = ValueError("the app's own")
    wrapped.error("Exception in ASGI application\n", exc_info=failure)
    assert seen == [("Exception in ASGI application\n", {"exc_info": failure})]
    assert wrapped.level == 10
