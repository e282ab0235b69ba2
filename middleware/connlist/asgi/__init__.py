"""The ASGI side: ``ConnectionsMiddleware``, which owns the list, and ASGI-only mode's feeder.

The middleware is the highest part but for the public names: it builds the
list and the enforcer, starts the server integration, and serves the
observers' endpoint.
"""
