from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from connlist.core.handover import HANDOVER
from connlist.servers import integration
from tests.fakes import FakeClock, MockLoop
from tests.servers import GUNICORN_PARSERS, PARSERS, close_sockets


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (scripts/test): three workers per core, as most tests wait on real servers' clocks."""
    return 3 * len(os.sched_getaffinity(0))


@pytest.fixture
def tmp_dir() -> Iterator[Path]:
    """A temporary directory short enough for the workers' unix sockets (107 bytes), whatever pytest's."""
    with tempfile.TemporaryDirectory(prefix="cl-") as path:
        yield Path(path)


# The parsers, each once: a test that takes ``parser`` (uvicorn's) or
# ``gunicorn_parser`` runs on each; a test that needs the list itself (a
# module-scoped fixture's params, a product with another parameter) takes
# ``tests.servers.PARSERS`` or ``GUNICORN_PARSERS``.
@pytest.fixture(params=PARSERS)
def parser(request: pytest.FixtureRequest) -> str:
    """uvicorn's ``"httptools"`` or ``"h11"``: the names of ``tests.servers.PLAIN`` and ``INTEGRATED``."""
    name: str = request.param
    return name


@pytest.fixture(params=GUNICORN_PARSERS)
def gunicorn_parser(request: pytest.FixtureRequest) -> str:
    """gunicorn's ``--http-parser``: ``"python"``, and ``"fast"`` where gunicorn_h1c is installed."""
    name: str = request.param
    return name


@pytest.fixture
def fresh_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process's records of the servers' self-checks, empty for the test (and restored after).

    ``connlist.servers.integration``'s: gunicorn's build and check
    (``check_once``), the classes that passed, and the failures.  uvicorn's
    outcomes are its protocols' (``tests/test_selfcheck.py``'s ``fresh``).
    """
    monkeypatch.setattr(integration, "_checked", {})
    monkeypatch.setattr(integration, "_passed", set())
    monkeypatch.setattr(integration, "_failures", {})


@pytest.fixture
def clock() -> FakeClock:
    """A clock that moves only when the test moves it (``tests.fakes.FakeClock``), at ``T0``."""
    return FakeClock()


@pytest.fixture
def loop(clock: FakeClock) -> MockLoop:
    """An event loop that runs nothing by itself, on ``clock`` (``tests.fakes.MockLoop``)."""
    return MockLoop(clock)


@pytest.fixture(autouse=True)
def _close_client_sockets() -> Iterator[None]:
    yield
    close_sockets()


@pytest.fixture(autouse=True)
def _own_handover() -> Iterator[None]:
    """The worker's hand-over (``HANDOVER``) as it was before the test, after it (in any order of tests).

    A middleware's lifespan, or a protocol's fallback, hands an enforcer over
    for the process; the next test must not find it.
    """
    saved = HANDOVER.enforcer
    try:
        yield
    finally:
        HANDOVER.enforcer = saved


@pytest.fixture(autouse=True, scope="module")
def _own_handover_per_module() -> Iterator[None]:
    """The same around a module: a module's server (a module-scoped fixture) hands over past its tests."""
    saved = HANDOVER.enforcer
    try:
        yield
    finally:
        HANDOVER.enforcer = saved
