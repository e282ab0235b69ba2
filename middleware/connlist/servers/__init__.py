"""The servers that feed the list: a subpackage each, on the neutral ``seam``, below the ASGI side."""
