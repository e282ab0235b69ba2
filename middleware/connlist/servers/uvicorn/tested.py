"""The uvicorn releases connlist is tested with (CI: the oldest supported and the newest), as a failed
check's advice names them.  No upper bound in pyproject.toml: the self-check decides.
"""

__all__ = ["TESTED_RANGE", "TESTED_UVICORN"]

TESTED_UVICORN = ("0.36.0", "0.55.0")
TESTED_RANGE = f"{TESTED_UVICORN[0]} to {TESTED_UVICORN[1]}"
