"""ConnectionsMiddleware: owns the worker's ConnectionsList, enforces the timeouts, serves the view.

With the server integration (turned on at the lifespan startup where the
server is uvicorn: ``connlist.servers.uvicorn.start``; or named by ``--http
connlist.uvicorn:HttpToolsProtocol``) the protocol feeds the list, and the
middleware only hands it over (``connlist.core.handover``) and serves the
debug endpoint: from its first request with the integration the middleware's
route hands the request to the app, with nothing else per request (``_pass``,
or ``_pass_nested`` inside another app).  A handler that was
awaiting the body of a request connlist cut off gets Starlette's
``ClientDisconnect``; the server integration keeps that from the server log
(``connlist.servers.uvicorn.protocols``).  At the lifespan shutdown the middleware writes the
log summary still pending.

Without it (plain uvicorn, hypercorn, ...) the middleware runs in ASGI-only
mode: it sees a request only once its headers are parsed, so it cannot enforce
the headers timeout, and it cannot see connections, only requests, which
``connlist.asgi.asgi_only`` feeds to the list (from its first request in that mode the
middleware's route is that feeder's, ``AsgiOnly``).  See
``docs/how-it-works.md`` ("ASGI-only mode") for what each mode enforces.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import sys
from collections.abc import Awaitable, Callable
from types import FrameType, MemberDescriptorType
from typing import TYPE_CHECKING, Any, NoReturn, ParamSpec, cast

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from connlist.asgi.asgi_only import AsgiOnly
from connlist.core.checks import nearest
from connlist.core.connections import ConnectionsList
from connlist.core.enforcer import Enforcer, OnTimeout
from connlist.core.handover import HANDOVER
from connlist.core.kinds import OPTIONS, Options, Settings, option_parameters, resolve
from connlist.core.logs import PREFIX, log, route_to_server
from connlist.observe.debug import DEFAULT_LIMIT, DebugEndpoint, not_found, snapshot, snapshot_cooperatively
from connlist.observe.workers import WorkerGroup
from connlist.servers import integration, selection
from connlist.servers.seam import ListOwner
from connlist.servers.supervisor import supervised_by

if TYPE_CHECKING:
    # Annotations only (typing.Unpack is Python 3.11+).
    from typing_extensions import Unpack

__all__ = ["ConnectionsMiddleware"]


_P = ParamSpec("_P")


def _named_options(init: Callable[_P, None]) -> Callable[_P, None]:
    """``__init__``, with a misspelled option answered by the nearest known one.

    Python's own error is a bare "unexpected keyword argument".  It runs
    once per middleware built, never per request.  Type checkers read the
    kinds' options from ``**options: Unpack[Options]``; ``inspect`` and
    ``help()`` read them from the signature given here, each with its
    default (``connlist.core.kinds.option_parameters``), so the signature still
    shows every option.
    """
    # The explicit keywords, and the kinds' options (connlist.core.kinds.Options) that ``**options`` takes.
    signature = inspect.signature(init)
    parameters = list(signature.parameters.values())
    explicit = [p for p in parameters if p.kind is p.KEYWORD_ONLY]
    options = sorted([*(p.name for p in explicit), *OPTIONS])
    shown = [p for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD] + option_parameters() + explicit

    @functools.wraps(init)
    def checked(*args: _P.args, **kwargs: _P.kwargs) -> None:
        try:
            for name in kwargs:
                if name not in options and name != "app":
                    owner = type(args[0]).__name__ if args else "ConnectionsMiddleware"
                    raise TypeError(
                        f"{owner}() got an unexpected keyword argument {name!r}; {nearest(name, options)}"
                    )
            init(*args, **kwargs)
        except (TypeError, ValueError) as exc:
            middleware = args[0] if args else None
            if isinstance(middleware, ConnectionsMiddleware) and _built_lazily(sys._getframe(1), middleware):
                _defer(middleware, exc)
                return
            _refused(exc)

    checked.__signature__ = signature.replace(parameters=shown)  # type: ignore[attr-defined]
    return checked


# Where a bad option goes.  Built directly (``ConnectionsMiddleware(app,
# ...)``, at import), the middleware raises its ValueError or TypeError,
# which stops any server that imports the app.  Starlette and FastAPI build
# their declared middleware lazily, inside the app's first call, which is
# the lifespan: an exception raised there reaches the server, whose default
# lifespan (uvicorn's and gunicorn's ``auto``, which ``uvicorn app:app``,
# ``fastapi run`` and gunicorn's workers run) takes it for an app without a
# lifespan and serves on, every request a 500.  So there the error is kept
# (``_defer``) and told to the server in the words of the lifespan protocol:
# the startup answers ``lifespan.startup.failed`` with the error, and every
# server stops at start, whatever its lifespan setting, with the message in
# its log as one ERROR line.  With the lifespan off, the first request logs
# that line and every request raises the error.


def _built_lazily(frame: FrameType | None, middleware: object) -> bool:
    """Whether the middleware is being built by an app's ``build_middleware_stack`` (Starlette's, FastAPI's).

    ``frame`` is the caller of ``__init__``; a subclass's ``__init__`` calling
    ``super().__init__`` is looked through.  Another builder (a Starlette
    that renamed the method, say) gets the error raised, as a direct call does.
    """
    while frame is not None and frame.f_code.co_name == "__init__":
        if frame.f_locals.get("self") is not middleware:
            break
        frame = frame.f_back
    return frame is not None and frame.f_code.co_name == "build_middleware_stack"


def _refusal(exc: TypeError | ValueError) -> str:
    """The bad option's error, as the server's log and the lifespan startup's failure give it."""
    return f"ConnectionsMiddleware cannot be built, so the app cannot run: {type(exc).__name__}: {exc}"


def _refused(exc: TypeError | ValueError) -> NoReturn:
    """Raise a bad option's error (the middleware built directly), said first in the server's log."""
    route_to_server()
    log.error("%s", _refusal(exc))
    raise exc


def _defer(middleware: ConnectionsMiddleware, exc: TypeError | ValueError) -> None:
    """The middleware, built by Starlette's stack, becomes one that fails the lifespan startup with ``exc``.

    Its route is the refusal (the rest of ``__init__`` did not run).
    """
    told = False

    async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal told
        if scope["type"] == "lifespan":
            message = await receive()
            if message["type"] == "lifespan.startup":
                # The server logs the message (uvicorn, gunicorn's workers) and stops.  Then the
                # error is raised, as Starlette's router does after a failed startup: a server
                # that answered the failure ignores it, and Starlette's TestClient raises it.
                await send({"type": "lifespan.startup.failed", "message": f"{PREFIX}{_refusal(exc)}"})
        elif not told:
            # The lifespan is off: nothing stopped the server, so say it once.
            told = True
            route_to_server()
            log.error("%s", _refusal(exc))
        raise exc.with_traceback(None)

    _route(middleware, refuse)


class ConnectionsMiddleware(ListOwner):
    """Track connections, cut off slow clients with 408, and serve a live view of them.

    The timeouts' and the budget's options are keywords too (``**options``:
    ``connlist.core.kinds.Options``, checked by ``connlist.core.kinds.resolve``, each
    declared beside the kind it turns on); their effective values are
    ``mw.settings``.  ``headers_timeout`` defaults to ``min(60, request_timeout)``;
    ``send_timeout`` bounds a response the client stopped taking;
    ``body_min_rate`` (bytes/s) applies to a body once ``body_grace`` has
    passed.  0 disables each; times are in seconds (docs/settings.md).
    ``max_connections`` is the worker's connection budget (None: derived
    from ``ulimit -n``; 0: none): at it, a new connection makes room by
    closing the longest-idle keep-alive connection, else the oldest one
    still sending its headers, else the slowest body, and is refused with
    ``503`` only when every connection is a request being served.
    ``max_upgraded`` is the websockets' share of it (None: half of it; 0:
    none of their own): past it an upgrade request is refused with ``503``
    before its handshake; no websocket is ever cut.
    ``debug_path=None`` turns the endpoint off; it is served to loopback
    clients only, or, with ``debug_token``, to clients presenting
    ``Authorization: Bearer <token>``.  ``on_timeout(connection, kind)`` is
    called for each connection a timeout cuts off (``kind`` is
    ``"headers"``, ``"request"``, ``"rate"`` or ``"send"``) before it is closed.
    With the endpoint on, the worker also serves its view to its sibling
    workers (``?workers=all``, ``connlist.observe.workers``) from the lifespan startup
    to its shutdown.
    """

    # Slots: ``__call__`` is one (the mode's route, see below), the
    # per-request paths read ``debug_path`` and ``app``, and slot loads are
    # the cheapest there are.  ``__dict__`` stays for what a subclass or a
    # user gives the instance besides.
    __slots__ = (
        "__call__",
        "__dict__",
        "__weakref__",
        "_asgi_only",
        "_endpoint",
        "_enforcer",
        "_first_request_seen",
        "_passing",
        "_policy",
        "_starting",
        "_unconfirmed",
        "_workers",
        "app",
        "debug_path",
    )

    @_named_options
    def __init__(
        self,
        app: ASGIApp,
        *,
        debug_path: str | None = "/_connections",
        debug_token: str | None = None,
        on_timeout: OnTimeout | None = None,
        server_integration: str = "auto",
        **options: Unpack[Options],
    ) -> None:
        settings = resolve(**options)
        self._policy = integration.check_policy(server_integration)
        if debug_path is not None and not isinstance(debug_path, str):
            raise TypeError(f"debug_path must be None or a str, got {type(debug_path).__name__}")
        if debug_path is not None and not debug_path.startswith("/"):
            raise ValueError(f"debug_path must be None or a path starting with '/', got {debug_path!r}")
        if debug_token is not None and not isinstance(debug_token, str):
            raise TypeError(f"debug_token must be None or a str, got {type(debug_token).__name__}")
        if debug_token == "":
            raise ValueError("debug_token must not be empty (None turns the token off)")
        if on_timeout is not None and not callable(on_timeout):
            raise TypeError("on_timeout must be callable or None")
        if inspect.iscoroutinefunction(on_timeout):
            # It is called from the timer callback, which cannot await.
            raise TypeError("on_timeout must be a plain function, not a coroutine function")
        self.app = app
        self.debug_path = debug_path
        self._enforcer = Enforcer(settings, on_timeout=on_timeout)
        self._enforcer.server_integration = server_integration
        # The mode the last lifespan startup found on, and the connections
        # counted then, until a request confirms it (_confirm).
        self._unconfirmed: tuple[str, int, integration.Server] | None = None
        # The sibling workers' view (workers=all): only with the endpoint on.
        self._workers = (
            None
            if debug_path is None
            else WorkerGroup(lambda limit: snapshot_cooperatively(self._enforcer, limit=limit))
        )
        self._endpoint = DebugEndpoint(lambda: self._enforcer, token=debug_token, workers=self._workers)
        self._first_request_seen = False
        self._starting: asyncio.Task[None] | None = None
        # ASGI-only mode's path, made at its first request (see _general).
        self._asgi_only: AsgiOnly | None = None
        # The general route until a request tells the mode (see __call__),
        # and the one with the server integration.
        _route(self, self._general)
        self._passing: Callable[[Scope, Receive, Send], Awaitable[None]] = self._pass
        # inspect.signature(middleware) looks for a __call__ function on
        # the class, and finds the route's slot: it reads this instead.
        self.__signature__ = inspect.signature(self._general)

    # -- public API ------------------------------------------------------------

    @property
    def connections(self) -> ConnectionsList:
        """This worker's ConnectionsList."""
        return self._enforcer.connections

    @property
    def settings(self) -> Settings:
        """Every option's effective value (``mw.settings.headers_timeout``, ...)."""
        return self._enforcer.settings

    @property
    def mode(self) -> str:
        """``"uvicorn-httptools"``, ``"uvicorn-h11"`` or ``"asgi"``."""
        return self._enforcer.mode

    @property
    def enforcer(self) -> Enforcer:
        return self._enforcer

    def snapshot(self, *, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
        """What the debug endpoint serves, as JSON-ready data."""
        return snapshot(self._enforcer, limit=limit)

    # -- ASGI ------------------------------------------------------------------

    # Calling the middleware calls its ``__call__`` slot, the route of its
    # mode:
    #
    # * ``_general``: a lifespan, and the first request in a mode, which
    #   sets the route (the other routes hand it the endpoint, and the
    #   lifespan);
    # * with the server integration, ``_passing`` (``_pass``, or inside
    #   another app ``_pass_nested``): the app, for a request not for the
    #   endpoint;
    # * in ASGI-only mode, the feeder's path (``connlist.asgi.asgi_only.AsgiOnly``).
    #
    # The next lifespan startup sets ``_general`` again (a server with the
    # integration may serve the app next).  A slot rather than a method:
    # the server's call finds the slot on the class and calls what it holds,
    # all in C, where a method that called the route would be one more
    # Python frame per request.
    # A subclass may still define its own ``__call__`` and call
    # ``super().__call__``, which reads the slot (see _route).  Servers tell
    # ASGI 3 apps from ASGI 2 ones by whether ``app.__call__`` is a coroutine
    # function (uvicorn's Config.load, hypercorn's _is_asgi_2, Starlette's
    # is_async_callable), which reads the route: each is an ``async def``,
    # but where the server asks another app (``_pass_nested``).
    __call__: Callable[[Scope, Receive, Send], Awaitable[None]]

    async def _general(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The general route: a lifespan, the endpoint, the first request in a mode (which sets the route)."""
        scope_type = scope["type"]
        if scope_type == "http":
            if not self._first_request_seen:
                self._first_request(scope)
            if self._unconfirmed is not None:
                self._confirm()
            if self.debug_path is not None and scope["path"] == self.debug_path:
                if self._endpoint.allowed(scope):
                    await self._endpoint(scope, receive, send)
                else:
                    await not_found(send)
                return
            enforcer = self._enforcer
            if enforcer.mode != "asgi":
                # The server integration feeds the list: from now on, pass
                # requests straight through.
                _route(self, self._passing)
                await self.app(scope, receive, send)
                return
            # ASGI-only mode: from now on, its feeder's path.
            asgi_only = self._asgi_only
            if asgi_only is None or asgi_only.enforcer is not enforcer:
                asgi_only = self._asgi_only = AsgiOnly(self.app, self.debug_path, enforcer, self._general)
            _route(self, asgi_only.__call__)
            await asgi_only(scope, receive, send)
            return
        if scope_type == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _pass_nested(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """The route with the server integration: a request not for the endpoint goes to the app.

        It returns the app's awaitable, with no coroutine of its own: the route as it is inside
        another app, which servers ask instead (see ``__call__``; under Starlette, Starlette).
        """
        # HTTP and websocket scopes have a path (a websocket passes through
        # on either path); a lifespan scope has none, and a try costs
        # nothing until it raises.
        try:
            path = scope["path"]
        except KeyError:
            return self._general(scope, receive, send)
        if path != self.debug_path:
            app = self.app  # a slot; ``self.app(...)`` would be an unspecialized method call (see AsgiOnly)
            return app(scope, receive, send)
        return self._general(scope, receive, send)

    async def _pass(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``_pass_nested`` as an ``async def``: the outermost app's route, which servers ask about."""
        await self._pass_nested(scope, receive, send)

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A server is starting: forget a timer left on the loop of an earlier run, hand the enforcer over.

        The server's protocols find it in the worker's hand-over
        (``HANDOVER``) and announce their mode before the first request.
        Nothing of connlist's goes into the lifespan state: it is the app's.
        """
        _route(self, self._general)
        # Starlette puts itself in ``scope["app"]``: the middleware is one of its.
        self._passing = self._pass if scope.get("app", self) is self else self._pass_nested
        self._enforcer.cancel()
        HANDOVER.enforcer = self._enforcer
        state = scope.get("state")
        route_to_server()
        refusal = self._integration_at_start(receive, state)
        if refusal is not None:
            await self._refuse_start(refusal, receive, send)
            return
        receive = self._lifespan_receive(receive)
        workers = self._workers
        if workers is None:
            await self.app(scope, receive, send)
            return
        # This worker's socket for its siblings, for as long as the server runs.
        await workers.start()
        try:
            await self.app(scope, receive, send)
        finally:
            workers.stop()

    def _integration_at_start(self, receive: Receive, state: object) -> str | None:
        """Turn the server integration on, or tell why it is off (servers.integration); a refusal if due.

        uvicorn has loaded its protocol class (and ``connlist.servers.uvicorn.protocols`` checked
        a class given by ``--http``) before the lifespan began, and has not
        accepted a connection yet.
        """
        enforcer = self._enforcer
        try:
            policy = integration.effective_policy(self._policy)
        except ValueError as exc:
            return f"{PREFIX}{exc}"  # (an exception here would only turn the lifespan off)
        enforcer.server_integration = policy
        server, config = selection.find(receive, state)
        master = server.gunicorn_master(config)
        if master is not None:
            # gunicorn's usual worker: its siblings' views (workers=all), as connlist's workers tell.
            supervised_by(master)
        start = server.turn_on(config, policy)
        # What an earlier server of this app had does not hold for this one.
        enforcer.mode = "asgi" if start.mode is None else start.mode
        enforcer.fed_by = None  # its protocols tell it their mode again
        enforcer.integration_off = start.reason
        enforcer.asgi_told = False
        self._unconfirmed = None if start.mode is None else (start.mode, enforcer.totals.connections, server)
        if start.refusal is not None:
            return f"{PREFIX}{start.refusal}"
        if start.reason is not None:
            self._tell_asgi_only(start.advice)
        return None

    async def _refuse_start(self, refusal: str, receive: Receive, send: Send) -> None:
        """The lifespan startup fails: uvicorn (and gunicorn's uvicorn worker) log the message and exit."""
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.failed", "message": refusal})

    def _tell_asgi_only(self, advice: str | None) -> None:
        """The one WARNING of ASGI-only mode: what is enforced, what is not, why, and what to do."""
        enforcer = self._enforcer
        enforcer.asgi_told = True
        log.warning(
            "%s. Why it is off: %s. To turn it on: %s",
            integration.asgi_only(),
            enforcer.integration_off,
            advice or integration.FELL_BACK,
        )

    def _lifespan_receive(self, receive: Receive) -> Receive:
        """The app's lifespan receive; at shutdown, what the log summary still holds is written."""

        async def receive_lifespan() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                self._enforcer.summary.flush(self._enforcer.clock(), force=True)
            return message

        return receive_lifespan

    def _first_request(self, scope: Scope) -> None:
        self._first_request_seen = True
        workers = self._workers
        if workers is not None and not workers.started:
            # The lifespan is off: serve the siblings from now on.
            self._starting = asyncio.get_running_loop().create_task(workers.start())
        found = HANDOVER.enforcer
        if found is not None and found is not self._enforcer:
            # The lifespan was off, so the protocol made a fallback enforcer
            # of its own: give it our settings and serve its list.
            found.configure(self._enforcer.settings, on_timeout=self._enforcer.on_timeout)
            self._enforcer = found
            log.warning(
                "the ASGI lifespan is off, so the server integration ran with the default "
                "timeouts until this first request; turn the lifespan on to apply them from the start"
            )
        enforcer = self._enforcer
        if enforcer.mode == "asgi" and not enforcer.asgi_told:
            # Not told at the start (the lifespan is off, or the server did
            # not say which protocol it uses): no connection announced the
            # integration before this request.
            advice = None
            if enforcer.integration_off is None:
                enforcer.integration_off = integration.NO_LIFESPAN
                advice = selection.servers()[0].advice_without_lifespan()
            route_to_server()  # (the lifespan, which does it otherwise, did not run)
            self._tell_asgi_only(advice)

    def _confirm(self) -> None:
        """The first request since the lifespan found the integration on: it came through connlist's protocol.

        Every connection of connlist's protocol is counted as it is made, so
        a request with none counted came through another: the server did not
        take the class the lifespan gave it (a uvicorn that reads its
        protocol class before the lifespan, say).  Then the truth is
        ASGI-only mode, said loudly.
        """
        unconfirmed, self._unconfirmed = self._unconfirmed, None
        assert unconfirmed is not None
        mode, counted, server = unconfirmed
        enforcer = self._enforcer
        if enforcer.totals.connections > counted or enforcer.mode != mode:
            return
        reason, advice = server.unconfirmed(mode)
        enforcer.mode = "asgi"
        enforcer.integration_off = reason
        enforcer.asgi_told = True
        log.error(
            "the server integration is off: %s. connlist runs in %s. %s",
            reason,
            integration.asgi_only(),
            advice,
        )


def _route(
    middleware: ConnectionsMiddleware, route: Callable[[Scope, Receive, Send], Awaitable[None]]
) -> None:
    """Set the middleware's route (its ``__call__`` slot), also under a subclass that defines ``__call__``.

    There, ``middleware.__call__ = route`` would go to the instance's dict.
    """
    _CALL_SLOT.__set__(middleware, route)


_CALL_SLOT = cast(MemberDescriptorType, ConnectionsMiddleware.__dict__["__call__"])
