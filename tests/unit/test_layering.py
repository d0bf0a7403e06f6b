"""The layering rule (docs/ARCHITECTURE.md), checked on every module's imports, those inside
functions included, by the layer a name imports (`genfleet.workers.x` is `workers`): `common`
imports nothing first-party; `producer`, `workers` and `sim` import
`common` and themselves only, never each other; `genfleet` (the operator tools) may import any
product package. The tests, the benchmarks and the oracle are never imported by product code."""
from __future__ import annotations

import ast

import pytest
from helpers.paths import REPO
from helpers.sources import LAYERS, Module, folder, modules

SUBPACKAGES = LAYERS
PRODUCT = (*SUBPACKAGES, "genfleet")
FIRST_PARTY = (*PRODUCT, "bench", "oracle", "tests", "examples")
ALLOWED = {
    "common": {"common"},
    "producer": {"common", "producer"},
    "workers": {"common", "workers"},
    "sim": {"common", "sim"},
    "genfleet": set(PRODUCT),
}


def imported(module: Module) -> list[tuple[int, str]]:
    """(line, top-level package) of every first-party import, `importlib.import_module("...")` too."""
    found = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [f"genfleet.{module.package}"] if node.level else [node.module or ""]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)):
            names = [str(node.args[0].value)]
        else:
            continue
        found += [(node.lineno, target) for name in names if (target := package_of(name)) is not None]
    return found


def package_of(name: str) -> str | None:
    """The layer a dotted import names: `genfleet.workers.tasks` is `workers`, `genfleet.cli` is
    `genfleet` (the operator tools), `helpers.x` is None (not first-party)."""
    parts = name.split(".")
    if parts[0] == "genfleet":
        return parts[1] if len(parts) > 1 and parts[1] in SUBPACKAGES else "genfleet"
    return parts[0] if parts[0] in FIRST_PARTY else None


def test_every_first_party_package_is_where_the_rule_expects_it():
    assert all(folder(package).is_dir() for package in FIRST_PARTY)
    # The product card's names at the repository's top lead to the layers' folders.
    assert all((REPO / layer).resolve() == folder(layer) for layer in LAYERS)


@pytest.mark.parametrize("package", PRODUCT)
def test_each_package_imports_only_what_the_layering_allows(package):
    checked, wrong = 0, []
    for module in modules(package):
        checked += 1
        wrong += [f"{module.path}:{line} imports {target}" for line, target in imported(module)
                  if target not in ALLOWED[package]]
    assert checked, f"no modules found under {package}/"
    assert not wrong, f"{package} may import only {sorted(ALLOWED[package])}:\n" + "\n".join(wrong)


# The command-line modules: a command's flags, messages and exit codes. What another module needs
# of one (a setting's rule, a URL check) lives with its concept instead.
CLI_NAMES = ("cli", "command", "__main__")


def imported_modules(module: Module) -> list[tuple[int, str]]:
    """(line, dotted module) of every `genfleet` import, those inside functions included."""
    found = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [(node.lineno, node.module)]
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return [(line, name) for line, name in found if name.startswith("genfleet.")]


def test_no_cli_module_is_imported_by_a_module_that_is_not_one():
    wrong = []
    for package in PRODUCT:
        for module in modules(package):
            if module.path.stem in CLI_NAMES:
                continue
            wrong += [f"{module.path}:{line} imports {name}" for line, name in imported_modules(module)
                      if name.rsplit(".", 1)[-1] in CLI_NAMES]
    assert not wrong, "a command-line module serves as a library:\n" + "\n".join(wrong)


def test_every_test_file_name_is_unique_across_the_tiers():
    """A name says what it tests: one file per name, whichever tier (unit, e2e, sglang_real) it is in."""
    names: dict[str, list[str]] = {}
    for path in (REPO / "tests").rglob("test_*.py"):
        names.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert not {name: paths for name, paths in names.items() if len(paths) > 1}


def test_no_two_benchmark_modules_import_each_other():
    """A cycle between bench modules (once `admission` ↔ `real_server`, `figures` ↔ `target_notes`)
    means a concept split across them: what both need gets its own module."""
    def bench_imports(module: Module) -> set[str]:
        found = set()
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ImportFrom) and node.module == "bench":
                found |= {f"bench.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bench."):
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names if alias.name.startswith("bench.")}
        return found

    graph = {f"bench.{module.path.stem}": bench_imports(module) for module in modules("bench")}
    assert graph["bench.real_server"] >= {"bench.admission", "bench.real_tier"}  # the walk sees imports

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(step == goal or (step not in seen and reaches(step, goal, seen | {step}))
                   for step in graph.get(start, ()))

    assert not [name for name in graph if reaches(name, name, {name})]
