"""The end-to-end benchmark's setups serve requests, and connlist is really in the ones that name it."""

from __future__ import annotations

import asyncio
import importlib
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import e2e  # noqa: E402
import e2e_apps  # noqa: E402
import per_request  # noqa: E402


@pytest.mark.parametrize("setup", e2e.SETUPS, ids=lambda setup: setup.key)
def test_each_setup_serves_keep_alive_requests_in_process(setup: e2e.Setup) -> None:
    # Each benchmark server is a process of its own: give each setup fresh apps
    # (a middleware keeps the mode it last saw).
    importlib.reload(e2e_apps)
    state: dict[str, object] = {}

    async def run() -> None:
        await per_request.drive(setup.app, setup.http, 5, state)

    asyncio.run(run())
    assert state["responses"] == 5
    enforcer = state["enforcer"]
    if setup.mode is None:
        assert enforcer is None
    else:
        # The mode the e2e benchmark checks over HTTP, seen from inside.
        assert enforcer is not None and enforcer.mode == setup.mode  # type: ignore[attr-defined]
        assert enforcer.totals.requests == 5  # type: ignore[attr-defined]
