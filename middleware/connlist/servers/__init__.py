"""The servers connlist feeds its list from, one subpackage each, beside the neutral seam.

- ``seam``: what any server's protocol needs and is not the server's (the
  feeder's contract, the handle's transport methods, the fallback enforcer);
- ``integration``: the start-up policy (``server_integration``), for any server;
- ``selection``: the servers connlist knows, in the order they are asked;
- ``selfcheck``: what every server's in-memory self-check shares;
- ``supervisor``: which server master supervises this worker;
- ``uvicorn``: uvicorn's protocols (httptools and h11), its keep-alive timed
  by the list, their self-check and the start at the lifespan;
- ``gunicorn``: gunicorn's own ASGI worker, and the worker classes.

A server imports the list (``connlist.core``) and the seam, never the ASGI
side or the observers.
"""
