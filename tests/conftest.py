from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes import FakeClock, MockLoop
from tests.servers import close_sockets

# uvicorn's two HTTP parsers: a test that takes ``parser`` runs on each.
PARSERS = ["httptools", "h11"]


@pytest.fixture(params=PARSERS)
def parser(request: pytest.FixtureRequest) -> str:
    """``"httptools"`` or ``"h11"``: the names of ``tests.servers.PLAIN`` and ``INTEGRATED``."""
    name: str = request.param
    return name


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
