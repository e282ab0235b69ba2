"""What connlist writes to the log, kept readable under attack.

A timeout (or any other cut) is one DEBUG line per connection.  At WARNING
there is at most one summary line per ``SUMMARY_INTERVAL`` seconds while cuts
happen: counts by kind and a few example clients.  A flood of ten thousand
slow clients is therefore one line every ten seconds, not ten thousand
lines, and writing the log is no longer most of the cost of cutting them
off.  The enforcer calls ``Summary.flush`` from its one timer, so nothing
else is scheduled.

The ``connlist`` logger is the public name.  Nothing configures it in a
plain ``uvicorn app:app``, where its records would reach Python's last-resort
handler (no level, no time).  ``route_to_server`` sends them through the
server's own error log instead when the application has configured no
logging of its own, so they share the format, the handlers and the level of
the server's lines: uvicorn's ``uvicorn.error`` (also under gunicorn's
uvicorn workers, which hand it gunicorn's error log's handlers and level),
else gunicorn's ``gunicorn.error`` (gunicorn's own ASGI worker, ``-k asgi``,
where uvicorn's logger has no handlers).  uvicorn's name is the one its
protocols write to: ``connlist.servers.uvicorn.protocols``'s self-check reads it from the
protocol it builds (``follow_uvicorn_logger``), so a uvicorn that renames its
logger keeps connlist's lines beside its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, Any

__all__ = [
    "PREFIX",
    "SUMMARY_INTERVAL",
    "Summary",
    "follow_uvicorn_logger",
    "format_address",
    "log",
    "logger",
    "route_to_server",
    "uvicorn_logger",
]

# gunicorn's error log (its ``glogging.Logger`` gives it gunicorn's handlers, format and level).
GUNICORN_LOGGER = "gunicorn.error"

logger = logging.getLogger("connlist")

# What starts connlist's lines that stand on their own in a server's log
# (the per-connection DEBUG lines start with the client instead).  The one
# place of the log's format: ``log`` writes it, and the start-up refusals,
# which are messages rather than log calls, begin with it.
PREFIX = "connlist: "

if TYPE_CHECKING:
    _Adapter = logging.LoggerAdapter[logging.Logger]
else:
    _Adapter = logging.LoggerAdapter  # subscriptable at run time only from Python 3.11


class _Prefixed(_Adapter):
    """The ``connlist`` logger, with ``PREFIX`` before each message."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        return f"{PREFIX}{msg}", kwargs


log = _Prefixed(logger, {})

# The logger uvicorn writes its error log to (its protocols' ``logger``).
_uvicorn_logger_name = "uvicorn.error"


def uvicorn_logger() -> logging.Logger:
    """uvicorn's error logger, under the name uvicorn's protocols use."""
    return logging.getLogger(_uvicorn_logger_name)


def follow_uvicorn_logger(name: str) -> None:
    """uvicorn's protocols write to ``name``: connlist's routed lines go there too."""
    global _uvicorn_logger_name
    if name == _uvicorn_logger_name:
        return
    _uvicorn_logger_name = name
    for handler in logger.handlers:
        if isinstance(handler, _ToServer) and not handler.gunicorn and logger.level == handler.level_taken:
            # The level taken from the old name; take the new one's.
            level = uvicorn_logger().getEffectiveLevel()
            logger.setLevel(level)
            handler.level_taken = level


SUMMARY_INTERVAL = 10.0
# Example clients named in one summary line.
EXAMPLES = 3
# The kind of a request head past max_header_size (``kinds.HEADER_OVERFLOW``): added without
# ``room``, yet no timeout, so it has a part of the summary and a word in the DEBUG line of its own.
OVERFLOW = "header_overflow"


def format_address(address: object) -> str | None:
    """``("127.0.0.1", 5000)`` -> ``"127.0.0.1:5000"``; None stays None."""
    if isinstance(address, (tuple, list)) and len(address) == 2:
        host, port = address
        if port is None:
            return str(host)
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return None if address is None else str(address)


class _ToServer(logging.Handler):
    """Hands connlist's records to the server's error logger, whose handlers and format apply."""

    # The level route_to_server gave the connlist logger (from the server's), if it did.
    level_taken: int | None = None

    def __init__(self, *, gunicorn: bool) -> None:
        super().__init__()
        # gunicorn's own logger, or uvicorn's (under whatever name its protocols use).
        self.gunicorn = gunicorn

    def emit(self, record: logging.LogRecord) -> None:
        target = logging.getLogger(GUNICORN_LOGGER) if self.gunicorn else uvicorn_logger()
        if target.isEnabledFor(record.levelno):
            target.handle(record)


def route_to_server() -> None:
    """Send the ``connlist`` logger's records through the server's error log, unless logging is configured.

    Called when a server starts.  Leaves everything alone if the
    ``connlist`` logger has handlers, or if the root logger has handlers
    (the application configured logging: its records reach them already).
    The server's log is uvicorn's if its logger has handlers anywhere up its
    chain, else gunicorn's if its has; else (neither server) nothing changes.
    """
    if logger.handlers or logging.getLogger().handlers:
        return
    if uvicorn_logger().hasHandlers():
        handler = _ToServer(gunicorn=False)
    elif logging.getLogger(GUNICORN_LOGGER).hasHandlers():
        handler = _ToServer(gunicorn=True)
    else:
        return
    logger.addHandler(handler)
    # The server's level (uvicorn's --log-level, gunicorn's --log-level)
    # applies; taking it over here means a DEBUG line that the server would
    # drop is never built (a mass timeout makes thousands).
    if logger.level == logging.NOTSET:
        target = logging.getLogger(GUNICORN_LOGGER) if handler.gunicorn else uvicorn_logger()
        logger.setLevel(target.getEffectiveLevel())
        handler.level_taken = logger.level
    logger.propagate = False


class Summary:
    """Counts the timeouts of one worker and writes them as one WARNING line per interval."""

    __slots__ = ("_counts", "_examples", "_interval", "_room", "due", "failures")

    def __init__(self, interval: float = SUMMARY_INTERVAL) -> None:
        self._interval = interval
        self._counts: dict[str, int] = {}
        # Connections let go at the budget, by kind (Enforcer.admit).
        self._room: dict[str, int] = {}
        self._examples: list[str] = []
        # Clock value before which no summary is written (the last one plus the interval).
        self.due = 0.0
        # on_timeout calls that raised, since the last summary.
        self.failures = 0

    @property
    def pending(self) -> bool:
        """Whether something waits to be written."""
        return bool(self._counts) or bool(self._room) or bool(self.failures)

    def add(self, kind: str, client: object, detail: Callable[[], str], *, room: bool = False) -> None:
        """One timeout (or, with ``room``, one connection let go to make room): counted, and a DEBUG line.

        ``client`` is the peer's address as the server has it; it is
        formatted, and ``detail()`` called, only if they are written (a mass
        timeout adds thousands).  The kinds of ``room`` are ``idle``,
        ``headers`` and ``body`` (closed to make room), ``refused`` and ``upgrade_refused``; a
        keep-alive close under pressure is a timeout kind (``keepalive``).  A
        head past max_header_size (``OVERFLOW``) is neither: a limit.
        """
        counts = self._room if room else self._counts
        counts[kind] = counts.get(kind, 0) + 1
        debug = logger.isEnabledFor(logging.DEBUG)
        if debug or len(self._examples) < EXAMPLES:
            name = format_address(client) or "unknown client"
            if len(self._examples) < EXAMPLES and name not in self._examples:
                self._examples.append(name)
            if debug:
                what = "budget" if room else "limit" if kind == OVERFLOW else "timeout"
                logger.debug("%s - %s %s: %s", name, kind, what, detail())

    def flush(self, now: float, *, force: bool = False) -> None:
        """Write the summary if one is pending and the interval since the last one passed (or ``force``)."""
        if not self.pending or (now < self.due and not force):
            return
        counts, self._counts = self._counts, {}
        room, self._room = self._room, {}
        examples, self._examples = self._examples, []
        failures, self.failures = self.failures, 0
        log.warning("%s", "; ".join(_summary_parts(counts, room, examples, failures)))
        self.due = now + self._interval


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _summary_parts(
    counts: dict[str, int], room: dict[str, int], examples: list[str], failures: int
) -> list[str]:
    """The parts of one summary line: timeouts, room made, refusals, heads too long, failed callbacks."""
    overflows = counts.pop(OVERFLOW, 0)
    total = sum(counts.values())
    parts = []
    if total:
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
        parts.append(f"{_plural(total, 'connection')} timed out ({kinds}); e.g. {', '.join(examples)}")
    refused = room.pop("refused", 0)
    upgrades_refused = room.pop("upgrade_refused", 0)
    made = sum(room.values())
    if made:
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(room.items()))
        parts.append(f"{_plural(made, 'connection')} closed for max_connections ({kinds})")
    if refused:
        parts.append(f"{_plural(refused, 'new connection')} refused with 503 (every connection busy serving)")
    if upgrades_refused:
        parts.append(f"{_plural(upgrades_refused, 'websocket upgrade')} refused with 503 (max_upgraded)")
    if overflows:
        parts.append(f"{_plural(overflows, 'request head')} over max_header_size answered 431")
    if failures:
        parts.append(f"on_timeout raised {_plural(failures, 'time')}")
    if not total and examples and (made or refused or upgrades_refused or overflows):
        parts[0] += f"; e.g. {', '.join(examples)}"
    return parts
