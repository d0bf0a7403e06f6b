"""genfleet: run large prompt datasets through SGLang servers as a Celery fleet.

The repository keeps `common/`, `producer/`, `workers/` and `sim/` at its top, beside this folder;
they are this package's subpackages (`genfleet.common`, ...). A wheel has them inside it
(pyproject.toml's `package-dir`), and so does an editable install's finder. Run from a source
checkout, though, this folder is found first (the current directory leads `sys.path`), and its
`__path__` holds only itself: the checkout's four folders are added to it here, by name.
"""
from __future__ import annotations

from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent
_SUBPACKAGES = ("common", "producer", "workers", "sim")


def _in_checkout() -> bool:
    return (_CHECKOUT / "pyproject.toml").is_file() and all(
        (_CHECKOUT / name / "__init__.py").is_file() for name in _SUBPACKAGES)


if _in_checkout():
    import importlib.abc
    import importlib.util
    import sys

    class _CheckoutFinder(importlib.abc.MetaPathFinder):
        """Finds `genfleet.<name>` for the four folders at the checkout's top, and nothing else."""

        def find_spec(self, fullname, path=None, target=None):
            package, _, name = fullname.partition(".")
            if package != __name__ or name not in _SUBPACKAGES:
                return None
            folder = _CHECKOUT / name
            return importlib.util.spec_from_file_location(
                fullname, folder / "__init__.py", submodule_search_locations=[str(folder)])

    sys.meta_path.insert(0, _CheckoutFinder())


# After the finder above: in a checkout it is what finds `genfleet.common`.
from genfleet.common import GenfleetError  # noqa: E402


class ToolError(GenfleetError):
    """The root of the operator tools' errors (doctor, export, demo)."""
