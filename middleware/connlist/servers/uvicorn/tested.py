"""The uvicorn releases connlist is tested with, as the advice of a failed check names them.

CI tests the oldest supported (the first whose ``--http`` takes an import string) and the newest.
There is no upper bound in pyproject.toml: the self-check decides, and a newer release gets a WARNING.
"""

__all__ = ["TESTED_RANGE", "TESTED_UVICORN"]

TESTED_UVICORN = ("0.36.0", "0.55.0")
TESTED_RANGE = f"{TESTED_UVICORN[0]} to {TESTED_UVICORN[1]}"
