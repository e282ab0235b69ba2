"""uvicorn: its protocols that feed the list, checked in memory, and put in place at the lifespan startup.

- ``protocols``: the decision, once per process: connlist's class built on
  uvicorn's and checked, or uvicorn's own, and the lines that say so;
- ``classes``: the ``class`` statement of each parser's protocol;
- ``cycle``, ``httptools_impl``, ``h11_impl``: what the protocols read of
  uvicorn's state to tell the list's events;
- ``keepalive``: uvicorn's keep-alive timed by the list (a loop stand-in);
- ``websocket``: the hand-over of an upgraded connection;
- ``selfcheck``: the protocols driven through a conversation in memory;
- ``start``: the integration at the lifespan startup (a ``Server``);
- ``tested``: the uvicorn releases connlist is tested with.

The public names are ``connlist.uvicorn``'s.
"""
