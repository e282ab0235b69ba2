from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers import close_sockets


@pytest.fixture(autouse=True)
def _close_client_sockets() -> Iterator[None]:
    yield
    close_sockets()
