"""Serve the example app with connlist's server integration and say where to look.

python3 examples/serve.py [--host 127.0.0.1] [--port 8000] [--http h11|httptools]

It names connlist's protocol outright (``--http connlist.uvicorn:...``) and
configures connlist's logger and the example's; ``uvicorn examples.app:app``
gets the same integration with no flag (the middleware turns it on at the
lifespan startup).
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
    """uvicorn's logging, plus connlist's logger and the example's, at INFO on uvicorn's handler.

    Without it the example's on_timeout message (INFO, logger "example")
    would go nowhere: uvicorn configures only its own loggers.
    """
    config = copy.deepcopy(LOGGING_CONFIG)
    for name in ("connlist", "example"):
        config["loggers"][name] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return config


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--http", choices=["auto", "httptools", "h11"], default="auto")
    args = parser.parse_args()
    http = {
        "auto": "connlist.uvicorn:AutoProtocol",
        "httptools": "connlist.uvicorn:HttpToolsProtocol",
        "h11": "connlist.uvicorn:H11Protocol",
    }[args.http]
    base = f"http://{args.host}:{args.port}"
    print(f"connlist example: app at {base}/ , debug endpoint at {base}/_connections", flush=True)
    print(f"  integration on: --http {http}", flush=True)
    # lifespan "on": the middleware hands its list to the protocol in the
    # lifespan state, and a bad setting then fails the start-up loudly.
    uvicorn.run("app:app", host=args.host, port=args.port, http=http, lifespan="on", log_config=log_config())


if __name__ == "__main__":
    main()
