"""What connlist writes to the log: addresses, the summary line, and the way to uvicorn's logger.

The summary under a real mass timeout: tests/test_mass_timeouts.py; the
log lines of a real server: tests/test_middleware.py.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from connlist.core.logs import SUMMARY_INTERVAL, Summary, format_address, logger, route_to_server


@pytest.mark.parametrize(
    ("address", "text"),
    [
        (("127.0.0.1", 5000), "127.0.0.1:5000"),
        (["10.0.0.1", 80], "10.0.0.1:80"),  # ASGI servers may give lists
        (("::1", 8000), "[::1]:8000"),
        (("/run/app.sock", None), "/run/app.sock"),  # a unix socket: no port
        ("unix:/run/app.sock", "unix:/run/app.sock"),
        (None, None),
    ],
)
def test_format_address(address: object, text: str | None) -> None:
    assert format_address(address) == text


def test_the_summary_counts_by_kind_names_a_few_clients_and_the_failures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="connlist")
    summary = Summary()
    for port in range(5):
        summary.add("headers", ("127.0.0.1", port), lambda: "never built below DEBUG")
    summary.add("rate", ("::1", 9), str)
    summary.failures = 2
    summary.flush(100.0)
    assert [r.getMessage() for r in caplog.records] == [
        "connlist: 6 connections timed out (5 headers, 1 rate); e.g. 127.0.0.1:0, 127.0.0.1:1, 127.0.0.1:2; "
        "on_timeout raised 2 times"
    ]
    # One line per interval at most; only failures since: they alone are written.
    summary.failures = 1
    summary.flush(100.0 + SUMMARY_INTERVAL / 2)
    assert len(caplog.records) == 1 and summary.pending
    summary.flush(100.0 + SUMMARY_INTERVAL)
    assert caplog.records[-1].getMessage() == "connlist: on_timeout raised 1 time"
    assert not summary.pending


def test_heads_over_max_header_size_are_a_part_of_their_own_not_timeouts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="connlist")
    summary = Summary()
    for port in range(2):
        summary.add("header_overflow", ("127.0.0.1", port), lambda: "request head over 16384 bytes")
    summary.flush(100.0)
    assert [r.getMessage() for r in caplog.records] == [
        "127.0.0.1:0 - header_overflow limit: request head over 16384 bytes",
        "127.0.0.1:1 - header_overflow limit: request head over 16384 bytes",
        "connlist: 2 request heads over max_header_size answered 431; e.g. 127.0.0.1:0, 127.0.0.1:1",
    ]
    # Beside timeouts: each its own count, the examples once.
    summary.add("headers", ("127.0.0.1", 2), str)
    summary.add("header_overflow", ("127.0.0.1", 3), str)
    summary.flush(100.0 + SUMMARY_INTERVAL)
    assert caplog.records[-1].getMessage() == (
        "connlist: 1 connection timed out (1 headers); e.g. 127.0.0.1:2, 127.0.0.1:3; "
        "1 request head over max_header_size answered 431"
    )


@pytest.fixture
def plain_logging() -> Iterator[logging.Logger]:
    """No logging configured, and uvicorn's error logger with a handler, as uvicorn sets it up.

    (The root logger's handlers are pytest's, added as each test begins:
    each test removes them for itself, with ``no_root_handlers``.)
    """
    uvicorn_error = logging.getLogger("uvicorn.error")
    saved = (logger.handlers, logger.level, logger.propagate, uvicorn_error.handlers, uvicorn_error.level)
    logger.handlers, logger.propagate = [], True
    logger.setLevel(logging.NOTSET)
    uvicorn_error.handlers = [logging.NullHandler()]
    uvicorn_error.setLevel(logging.INFO)
    try:
        yield uvicorn_error
    finally:
        logger.handlers, level, logger.propagate, uvicorn_error.handlers, uvicorn_level = saved
        logger.setLevel(level)  # (setLevel also clears the loggers' cached levels)
        uvicorn_error.setLevel(uvicorn_level)


def no_root_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    logging.getLogger().manager._clear_cache()  # levels are cached per logger


def test_route_to_server_hands_records_to_uvicorns_logger_at_its_level(
    plain_logging: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_root_handlers(monkeypatch)
    handled: list[str] = []
    monkeypatch.setattr(plain_logging, "handle", lambda record: handled.append(record.getMessage()))
    route_to_server()
    assert logger.level == logging.INFO and logger.propagate is False
    logger.warning("to uvicorn")
    logger.debug("dropped at uvicorn's level")
    # A record the connlist logger lets through but uvicorn's would not is not handed over.
    logger.setLevel(logging.DEBUG)
    logger.debug("below uvicorn's level")
    assert handled == ["to uvicorn"]


def test_route_to_server_keeps_a_level_set_for_connlist(
    plain_logging: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_root_handlers(monkeypatch)
    logger.setLevel(logging.WARNING)
    route_to_server()
    assert logger.level == logging.WARNING and len(logger.handlers) == 1


def test_route_to_server_leaves_configured_logging_alone(
    plain_logging: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_root_handlers(monkeypatch)
    logging.getLogger().addHandler(logging.NullHandler())  # the app configured logging
    route_to_server()
    assert logger.handlers == [] and logger.propagate is True
    logging.getLogger().handlers[:] = []
    # Not under uvicorn: no handler on its logger or above (uvicorn's servers
    # in this process may have configured the "uvicorn" logger).
    plain_logging.handlers[:] = []
    monkeypatch.setattr(plain_logging, "propagate", False)
    route_to_server()
    assert logger.handlers == []


def test_connlist_follows_uvicorns_logger_when_it_is_renamed(
    plain_logging: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    from connlist.core import logs

    no_root_handlers(monkeypatch)
    monkeypatch.setattr(logs, "_uvicorn_logger_name", "uvicorn.error")
    route_to_server()
    assert logger.level == logging.INFO
    # uvicorn's protocols write to another logger (connlist.uvicorn's self-check tells):
    renamed = logging.getLogger("uvicorn.renamed.error")
    saved = (renamed.handlers, renamed.level)
    handled: list[str] = []
    try:
        renamed.handlers = [logging.NullHandler()]
        renamed.setLevel(logging.DEBUG)
        monkeypatch.setattr(renamed, "handle", lambda record: handled.append(record.getMessage()))
        logs.follow_uvicorn_logger("uvicorn.renamed.error")
        # Its level is taken over (it was uvicorn.error's), and the records go to it.
        assert logs.uvicorn_logger() is renamed and logger.level == logging.DEBUG
        logger.debug("to the renamed logger")
        assert handled == ["to the renamed logger"]
        logs.follow_uvicorn_logger("uvicorn.renamed.error")  # the same name again: nothing changes
        assert logger.level == logging.DEBUG
    finally:
        renamed.handlers, level = saved
        renamed.setLevel(level)


def test_a_level_set_for_connlist_is_kept_when_uvicorns_logger_is_renamed(
    plain_logging: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    from connlist.core import logs

    no_root_handlers(monkeypatch)
    monkeypatch.setattr(logs, "_uvicorn_logger_name", "uvicorn.error")
    logger.setLevel(logging.WARNING)  # the operator's, not uvicorn's
    route_to_server()
    renamed = logging.getLogger("uvicorn.renamed.error")
    saved = renamed.level
    try:
        renamed.setLevel(logging.DEBUG)
        logs.follow_uvicorn_logger("uvicorn.renamed.error")
        assert logs.uvicorn_logger() is renamed
        assert logger.level == logging.WARNING  # not taken from the renamed logger
    finally:
        renamed.setLevel(saved)
