"""Serve the example app as users serve theirs, and say where to look.

python3 examples/serve.py [--host 127.0.0.1] [--port 8000] [--http auto|httptools|h11]

It runs ``uvicorn.run`` with uvicorn's own protocol and lifespan settings,
as ``uvicorn examples.app:app`` does: the middleware turns the server
integration on at the lifespan startup, and a bad setting stops the server
there.  It also gives the example's logger (``on_timeout``'s lines) uvicorn's
handler.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

import uvicorn
from uvicorn.config import LOGGING_CONFIG

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def log_config() -> dict[str, object]:
    """uvicorn's logging, plus the example's logger, at INFO on uvicorn's handler.

    Without it the example's on_timeout message (INFO, logger "example")
    would go nowhere: uvicorn configures only its own loggers.  (connlist's
    own lines go through uvicorn's logger by themselves.)
    """
    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["example"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return config


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--http", choices=["auto", "httptools", "h11"], default="auto")
    args = parser.parse_args()
    base = f"http://{args.host}:{args.port}"
    print(f"connlist example: app at {base}/ , debug endpoint at {base}/_connections", flush=True)
    uvicorn.run("app:app", host=args.host, port=args.port, http=args.http, log_config=log_config())


if __name__ == "__main__":
    main()
