"""uvicorn: its protocols that feed the list, checked in memory, and put in place at the lifespan startup.

The public names are ``connlist.uvicorn``'s.
"""
