"""The uvicorn protocols that feed the list, by their public names.

    uvicorn app:app --http connlist.uvicorn:HttpToolsProtocol
    uvicorn.run(app, http=connlist.uvicorn.H11Protocol)

``ConnectionsMiddleware`` puts them in place by itself at the lifespan
startup; these names are for naming them outright.  Each is checked when
first looked up (``connlist.servers.uvicorn.protocols``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from connlist.servers.uvicorn import protocols as _protocols

__all__ = ["AutoProtocol", "H11Protocol", "HttpToolsProtocol"]

if TYPE_CHECKING:
    from connlist.servers.uvicorn.protocols import AutoProtocol, H11Protocol, HttpToolsProtocol
else:

    def __getattr__(name: str) -> Any:
        if name in __all__:
            return getattr(_protocols, name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
