"""gunicorn: its own ASGI worker's protocol that feeds the list, and the worker classes.

- ``protocol``: the ``class`` statement of connlist's ``ASGIProtocol``;
- ``selfcheck``: gunicorn's protocol driven through a conversation in memory;
- ``start``: the integration at the lifespan startup (a ``Server``);
- ``workers``: the worker classes (``ASGIWorker``; ``UvicornWorker`` for
  uvicorn's protocols under gunicorn).

The public names are ``connlist.gunicorn``'s.
"""
