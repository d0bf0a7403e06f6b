"""Each package's errors hang from one root (`ProducerError`, `WorkerError`, `SimError`,
`ToolError`, and `GenfleetError` itself for the contracts), all under `GenfleetError`: a caller
catches a package's failures, or all of genfleet's, with one name. Checked on every exception
class defined in the product (importing every module)."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import genfleet
from genfleet import ToolError
from genfleet.common import GenfleetError
from genfleet.producer import ProducerError
from genfleet.sim import SimError
from genfleet.workers.errors import WorkerError

ROOTS = {"genfleet.common": GenfleetError, "genfleet.producer": ProducerError,
         "genfleet.workers": WorkerError, "genfleet.sim": SimError, "genfleet": ToolError}


def product_modules() -> list[str]:
    names = []
    for package in ("genfleet", *[name for name in ROOTS if name != "genfleet"]):
        module = importlib.import_module(package)
        names += [info.name for info in pkgutil.walk_packages(module.__path__, f"{package}.")
                  if not info.name.endswith("__main__")]
    return sorted(set(names))


def root_of(module: str) -> type[Exception]:
    return next(root for prefix, root in sorted(ROOTS.items(), key=lambda item: -len(item[0]))
                if module == prefix or module.startswith(prefix + "."))


def test_every_package_root_is_a_genfleet_error():
    assert all(issubclass(root, GenfleetError) for root in ROOTS.values())
    assert genfleet.ToolError is ToolError


@pytest.mark.parametrize("name", product_modules())
def test_every_exception_a_module_defines_is_under_its_packages_root(name):
    module = importlib.import_module(name)
    defined = [cls for _, cls in inspect.getmembers(module, inspect.isclass)
               if issubclass(cls, BaseException) and cls.__module__ == name]
    root = root_of(name)
    wrong = [cls.__name__ for cls in defined if not issubclass(cls, root)]
    assert not wrong, f"{name}: {wrong} not under {root.__name__}"


def test_every_worker_error_is_defined_in_one_module():
    """`workers/errors.py` is the one place to find a worker's errors: no other worker module defines one."""
    elsewhere = [f"{name}.{cls.__name__}" for name in product_modules() if name.startswith("genfleet.workers.")
                 and name != "genfleet.workers.errors"
                 for _, cls in inspect.getmembers(importlib.import_module(name), inspect.isclass)
                 if issubclass(cls, BaseException) and cls.__module__ == name]
    assert not elsewhere, f"define these in genfleet/workers/errors.py: {elsewhere}"
