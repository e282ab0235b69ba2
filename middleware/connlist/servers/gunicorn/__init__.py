"""gunicorn: connlist's protocol for gunicorn's ASGI worker, and worker classes (``connlist.gunicorn``)."""
