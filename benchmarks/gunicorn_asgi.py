"""How ``attacks.py`` and ``flood.py`` start gunicorn's own ASGI worker (``gunicorn -k asgi``).

One worker, as the uvicorn servers they compare it with are one process,
and gunicorn's defaults otherwise (``--keep-alive 2``, ``--timeout 30``, the
backlog), with two exceptions that change nothing a client meets:

- the parser is named, ``--http-parser python`` (what a plain ``pip install
  gunicorn`` runs; ``auto`` picks ``fast`` where gunicorn_h1c is installed),
  so that bare gunicorn and connlist on it run the same one;
- gunicorn's control socket is off where gunicorn has one (25.1 and newer
  open it at one path under ``$HOME``, which servers started side by side
  would share).

connlist is given no flag: the app's middleware turns the integration on at
the lifespan startup, as under ``gunicorn -k asgi app:app``.
"""

from __future__ import annotations

import importlib.util
import sys

# What the gunicorn servers need: gunicorn's ASGI worker (gunicorn 24.0 and newer).
MODULE = "gunicorn.workers.gasgi"
PARSER = "python"
# The connlist mode the debug endpoint reports on it, with PARSER.
MODE = f"gunicorn-{PARSER}"


def installed() -> bool:
    """Whether gunicorn's ASGI worker can be imported (False too without gunicorn at all)."""
    try:
        return importlib.util.find_spec(MODULE) is not None
    except ModuleNotFoundError:
        return False


def command(app: str, port: int, *options: str, parser: str = PARSER) -> list[str]:
    """``gunicorn -k asgi`` serving ``app`` on 127.0.0.1:``port``, one worker, warnings and errors logged."""
    import gunicorn.config

    line = [
        sys.executable, "-m", "gunicorn", "-k", "asgi", "-w", "1", "--http-parser", parser,
        "--bind", f"127.0.0.1:{port}", "--log-level", "warning", *options,
    ]  # fmt: skip
    if "control_socket_disable" in gunicorn.config.make_settings():
        line.append("--no-control-socket")
    return [*line, app]
