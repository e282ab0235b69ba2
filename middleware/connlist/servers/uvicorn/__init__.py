"""uvicorn: connlist's protocols built on uvicorn's (``protocols``), put in place at startup (``start``)."""
