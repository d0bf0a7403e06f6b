"""An import-only stand-in for `sgl_kernel` (PyPI has no CPU build of it). SGLang 0.5.23's CPU
engine imports names from it at module level that the path this tier runs never calls: any name
resolves to a function that raises if it ever is called."""


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def not_available(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} is a stand-in: the real-server tier must never call it")

    not_available.__name__ = name
    return not_available
