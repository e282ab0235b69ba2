"""connlist's version, where every part can read it (the package's ``__version__``)."""

__version__ = "0.1.0"
