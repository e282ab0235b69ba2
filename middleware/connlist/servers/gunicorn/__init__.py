"""gunicorn: its own ASGI worker's protocol that feeds the list, and the worker classes.

The public names are ``connlist.gunicorn``'s.
"""
