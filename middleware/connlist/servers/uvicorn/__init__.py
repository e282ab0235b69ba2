"""uvicorn: connlist's protocols built on uvicorn's, checked in memory, put in place at the lifespan startup.

``protocols`` decides which class each name and server gets; ``start`` is the lifespan startup's
``Server``. The public names are ``connlist.uvicorn``'s.
"""
