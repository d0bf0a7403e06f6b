"""An import-only stand-in for `torchvision` (the CPU torch on this machine has none, and PyPI's
does not load beside it). SGLang 0.5.23 imports `torchvision.transforms` at module level in a
multimodal helper (`multimodal/internvl_utils.py`) that text-only serving never calls, and
transformers imports a few names from `torchvision.io` once it sees the package. Every
`torchvision.*` module resolves to a stub whose names are placeholders that raise if used."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+stand-in"


class _PlaceholderType(type):
    """Any attribute of a placeholder is a placeholder (`InterpolationMode.NEAREST_EXACT`)."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _PlaceholderType(name, (_Placeholder,), {})


class _Placeholder(metaclass=_PlaceholderType):
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("torchvision is a stand-in in the real-server tier")


def _stub_getattr(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _PlaceholderType(name, (_Placeholder,), {})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _stub_getattr
        return module

    def exec_module(self, module):
        pass


__getattr__ = _stub_getattr
sys.meta_path.append(_StubFinder())
