"""genfleet: run large prompt datasets through SGLang servers as a Celery fleet.

Its subpackages are real folders here (`genfleet/common`, `genfleet/producer`, `genfleet/workers`,
`genfleet/sim`), found by every tool as they install; the repository's top links to them by their
product-card names (`common/`, ...), for readers only.
"""
from __future__ import annotations

from genfleet.common import GenfleetError


class ToolError(GenfleetError):
    """The root of the operator tools' errors (doctor, export, demo)."""
