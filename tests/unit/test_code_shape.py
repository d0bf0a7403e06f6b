"""No module over 300 lines and no function over 60, in the product, the benchmarks, the oracle and
the tests. A function is measured from its first body statement (its docstring, if it has one) to
its end: a CLI command's option declarations are its signature and do not count."""
from __future__ import annotations

import ast

import pytest
from helpers.sources import modules

PACKAGES = ("common", "producer", "workers", "sim", "genfleet", "bench", "oracle", "tests")
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 60


def function_lengths(tree: ast.Module) -> list[tuple[str, int, int]]:
    """(name, first line, length) of every function and method, nested ones included."""
    return [(node.name, node.lineno, node.end_lineno - node.body[0].lineno + 1) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_is_over_300_lines(package):
    too_long = [f"{module.path}: {lines} lines" for module in modules(package)
                if (lines := len(module.text.splitlines())) > MAX_MODULE_LINES]
    assert not too_long, "\n".join(too_long)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_function_is_over_60_lines(package):
    too_long = [f"{module.path}:{line} {name}: {length} lines" for module in modules(package)
                for name, line, length in function_lengths(module.tree) if length > MAX_FUNCTION_LINES]
    assert not too_long, "\n".join(too_long)
