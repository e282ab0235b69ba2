"""connlist's gunicorn class against gunicorn's own: no difference in what clients see.

Both classes are driven through the same seeded conversations, in memory,
on one event loop: requests of every kind (bodies by length and chunked,
``Expect: 100-continue``, a response before the body, ``Connection: close``,
HTTP/1.0, blank lines between requests, a malformed request), concatenated
and split into reads at random points, each read followed by a few turns of
the loop.  The timeouts are far longer than a conversation, so nothing is
cut: what each client receives (the ``Date`` header aside) and whether the
connection was closed must be byte for byte the same, on both of gunicorn's
parsers.
"""

from __future__ import annotations

import asyncio
import random
import re
import sys
from typing import Any

import pytest

pytest.importorskip("gunicorn.workers.gasgi")

from gunicorn.asgi.protocol import ASGIProtocol as Gunicorns
from gunicorn.config import Config

from connlist.core.enforcer import Enforcer
from connlist.core.handover import HANDOVER
from connlist.core.kinds import resolve
from connlist.servers.gunicorn import start as gunicorn_asgi_start
from connlist.servers.gunicorn.selfcheck import _SilentLog, _Transport

CONVERSATIONS = 40
H = b"Host: x\r\n"
REQUESTS = [
    b"GET / HTTP/1.1\r\n" + H + b"\r\n",
    b"GET /a?b=c HTTP/1.1\r\n" + H + b"Accept: */*\r\n\r\n",
    b"POST /echo HTTP/1.1\r\n" + H + b"Content-Length: 11\r\n\r\nhello world",
    b"POST /echo HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    b"POST /echo HTTP/1.1\r\n" + H + b"Content-Length: 5\r\nExpect: 100-continue\r\n\r\nhello",
    b"POST /early HTTP/1.1\r\n" + H + b"Content-Length: 4\r\n\r\nbody",
    b"HEAD / HTTP/1.1\r\n" + H + b"\r\n",
    b"GET / HTTP/1.0\r\n\r\n",
    b"\r\n",
]
CLOSE = b"GET /last HTTP/1.1\r\n" + H + b"Connection: close\r\n\r\n"
BAD = b"GET / HTTP/1.1\r\nHost x\r\n\r\n"


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    if scope["path"] != "/early":
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
    answer = b"%s %s %d" % (scope["method"].encode(), scope["path"].encode(), len(body))
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(answer))]}
    )
    await send({"type": "http.response.body", "body": answer})


class Worker:
    def __init__(self, parser: str, loop: asyncio.AbstractEventLoop) -> None:
        self.cfg = Config()
        self.cfg.set("http_parser", parser)
        self.cfg.set("keepalive", 30)
        self.log = _SilentLog()
        self.asgi = app
        self.loop = loop
        self.state: dict[str, Any] = {}
        # A fresh enforcer for each conversation's worker, handed over as the middleware's lifespan does.
        HANDOVER.enforcer = Enforcer(resolve(headers_timeout=300, request_timeout=600))
        self.nr_conns = 0
        self.nr = 0
        self.max_requests = sys.maxsize
        self.alive = True


def conversation(rng: random.Random) -> tuple[list[bytes], int]:
    """A stream of requests split into reads at random points, and the loop's turns after each read."""
    stream = b"".join(rng.choice(REQUESTS) for _ in range(rng.randint(1, 6)))
    ending = rng.random()
    if ending < 0.2:
        stream += CLOSE
    elif ending < 0.3:
        stream += BAD
    cuts = sorted(rng.sample(range(1, len(stream)), min(len(stream) - 1, rng.randint(0, 8))))
    reads = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    return reads, rng.choice([1, 3, 20])


_DATE = re.compile(rb"Date: [^\r]*\r\n")


async def client_sees(cls: type, parser: str, reads: list[bytes], turns: int) -> tuple[bytes, bool]:
    protocol = cls(Worker(parser, asyncio.get_running_loop()))
    transport = _Transport()
    transport.protocol = protocol
    protocol.connection_made(transport)
    for data in reads:
        if transport.closing:
            break
        protocol.data_received(data)
        for _ in range(turns):
            await asyncio.sleep(0)
    for _ in range(100):
        await asyncio.sleep(0)
    closing = transport.closing
    protocol.connection_lost(None)
    task = protocol._task
    if task is not None and not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return _DATE.sub(b"", bytes(transport.written)), closing


def test_clients_see_what_gunicorn_shows_them(gunicorn_parser: str) -> None:
    parser = gunicorn_parser
    ours, _, result = gunicorn_asgi_start.checked()
    assert ours is not None, result.failure

    async def main() -> int:
        answered = 0
        for seed in range(CONVERSATIONS):
            reads, turns = conversation(random.Random(seed))
            theirs = await client_sees(Gunicorns, parser, reads, turns)
            mine = await client_sees(ours, parser, reads, turns)
            assert mine == theirs, (seed, reads, turns)
            answered += theirs[0].startswith(b"HTTP/1.")
        return answered

    # (A conversation of blank lines only is answered by nothing.)
    assert asyncio.run(main()) >= CONVERSATIONS * 3 // 4
