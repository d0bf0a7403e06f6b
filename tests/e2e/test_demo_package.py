"""genfleet as a user gets it from `pip install .`: the wheel is built from the source tree, installed
into a fresh virtualenv outside the repository, and its `genfleet` console script runs the demo,
prints its version and its shell completion, from a directory that is not the repository.

Installing every dependency from PyPI would take minutes, so the fresh virtualenv sees the test
environment's installed libraries through a `.pth` file pointing at a folder of links to them,
leaving out genfleet's own editable-install hooks and metadata: genfleet itself comes only from the
wheel. The first test proves it (where each package is imported from, and that no path on
`sys.path` is inside the repository)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.paths import REPO

from genfleet.demo import BAD_LINES, DATASETS, rows_at

VERSION = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.MULTILINE).group(1)
# The one namespace, a folder of its own; and the packages a user imports from it.
FOLDERS = ("genfleet",)
PACKAGES = ("genfleet", "genfleet.common", "genfleet.producer", "genfleet.workers", "genfleet.sim")
# Quick: 29 prompts, no Flower, a simulator that decodes 2,000 tokens/s per request.
QUICK_DEMO = ("--scale", "0.02", "--no-flower", "--sim-rate", "2000")


def good_rows(scale: float) -> int:
    """How many prompts the demo's datasets written at `scale` hold (the rejected rows not counted)."""
    return sum(rows_at(rows, scale) for _, _, rows, _ in DATASETS)


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    home: Path  # the working directory of every command: not the repository

    @property
    def genfleet(self) -> str:
        return str(self.venv / "bin" / "genfleet")

    def env(self, path: str | None = None) -> dict[str, str]:
        """The user's environment: no PYTHONPATH, no active virtualenv; PATH finds the venv first."""
        env = {key: value for key, value in os.environ.items()
               if not key.startswith("PYTHON") and key != "VIRTUAL_ENV"}
        env["PATH"] = path if path is not None else f"{self.venv / 'bin'}{os.pathsep}{os.environ['PATH']}"
        return env

    def run(self, *args: str, timeout: float = 30, path: str | None = None,
            extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(args, cwd=self.home, env={**self.env(path), **(extra_env or {})},
                              capture_output=True, text=True, timeout=timeout)


def _build_wheel(out: Path) -> Path:
    """`pip wheel` of a copy of the tree setuptools packages (no stale build/ from an earlier build,
    nothing written into the repository). No build isolation: offline, the test environment's
    setuptools (pyproject.toml's test extra)."""
    source = _copy_source(out / "source")
    # -v shows the build backend's own output, where setuptools warns (e.g. a data folder that is not
    # in `packages`: `BuildBackendWarning: Package 'genfleet.sim.model' is absent ...`).
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "--no-index", "-v", "-w", str(out / "wheel"), str(source)],
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, f"pip wheel failed:\n{built.stdout}\n{built.stderr}"
    warned = [line for line in (built.stdout + built.stderr).splitlines()
              if re.search(r"Warning:|absent from|deprecat", line) and "byte-compiling is disabled" not in line]
    assert not warned, "setuptools warned while building the wheel:\n" + "\n".join(warned)
    (wheel,) = (out / "wheel").glob("genfleet-*.whl")
    return wheel


def test_an_editable_install_is_quiet_and_a_plain_path(tmp_path: Path) -> None:
    """`make install`'s `pip install -e`: no warning from setuptools, and the package found through a
    .pth naming the tree, not setuptools' meta path finder (an import hook static tools cannot read,
    which also printed "BuildBackendWarning: Editable installation")."""
    source = _copy_source(tmp_path / "source")
    environment, site = _venv_with_dependencies(tmp_path)
    # The build runs in the new venv (`pip --python`): it sees the test environment's setuptools.
    pip = _pip_install(environment, "--no-build-isolation", "-e", str(source))
    assert pip.returncode == 0, f"pip install -e failed:\n{pip.stdout}\n{pip.stderr}"
    warned = [line for line in (pip.stdout + pip.stderr).splitlines() if re.search(r"Warning|!!", line)]
    assert not warned, "pip install -e warned:\n" + "\n".join(warned)
    assert not list(site.glob("__editable__*finder*.py")), "setuptools installed its import hook"
    (pth,) = site.glob("__editable__.genfleet-*.pth")
    assert pth.read_text().split() == [str(source.resolve())]


def _copy_source(source: Path) -> Path:
    """A copy of the tree setuptools packages (no stale build/, nothing written into the repository)."""
    _mkdir(source)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for folder in FOLDERS:
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return source


def _venv_with_dependencies(root: Path) -> tuple[Path, Path]:
    """A fresh virtualenv at root/venv that sees this environment's libraries (not genfleet), and its
    site-packages."""
    environment = root / "venv"
    venv.EnvBuilder(with_pip=False).create(environment)
    site = Path(subprocess.check_output(
        [str(environment / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        text=True).strip())
    _link_dependencies(root / "dependencies")
    (site / "test-dependencies.pth").write_text(f"{root / 'dependencies'}\n")
    return environment, site


def _pip_install(environment: Path, *args: str) -> subprocess.CompletedProcess:
    """This environment's pip, installing into `environment`: offline, no dependencies, quiet."""
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(environment / "bin" / "python"), "install",
                           "--no-deps", "--no-index", "-q", *args], capture_output=True, text=True, timeout=120)


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def _link_dependencies(links: Path) -> None:
    """A link to every entry of this environment's site-packages except genfleet's own: its editable
    finder and .pth (which would map the packages to the repository) and its dist-info."""
    links.mkdir()
    for site_packages in {Path(sysconfig.get_path(kind)).resolve() for kind in ("purelib", "platlib")}:
        for entry in site_packages.iterdir():
            if entry.name.startswith(("__editable__", "genfleet-", "genfleet.")) or entry.suffix == ".pth":
                continue
            (links / entry.name).symlink_to(entry)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("installed")
    wheel = _build_wheel(root)
    environment, _ = _venv_with_dependencies(root)
    pip = _pip_install(environment, str(wheel))
    assert pip.returncode == 0, f"pip install failed:\n{pip.stdout}\n{pip.stderr}"
    return Installed(wheel, environment, _mkdir(root / "home"))


def test_the_installed_genfleet_comes_from_the_wheel_not_the_repository(installed: Installed) -> None:
    probe = ("import importlib, importlib.metadata as m, json, sys; print(json.dumps({"
             f"'files': {{name: importlib.import_module(name).__file__ for name in {PACKAGES!r}}}, "
             "'metadata': str(m.distribution('genfleet')._path), 'path': sys.path}))")
    result = installed.run(str(installed.venv / "bin" / "python"), "-c", probe)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    site_packages = str(installed.venv / "lib")
    for name, file in seen["files"].items():
        assert file.startswith(site_packages), f"{name} imported from {file}, not the fresh virtualenv"
    assert seen["metadata"].startswith(site_packages), seen["metadata"]
    assert not [path for path in seen["path"] if path.startswith(str(REPO))], seen["path"]


def test_the_wheel_installs_one_top_level_package_and_nothing_of_the_old_names(installed: Installed) -> None:
    top_level = {name.split("/")[0] for name in zipfile.ZipFile(installed.wheel).namelist()}
    assert {name for name in top_level if not name.endswith(".dist-info")} == {"genfleet"}
    for old in ("common", "producer", "workers", "sim"):
        result = installed.run(str(installed.venv / "bin" / "python"), "-c", f"import {old}")
        assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr, (old, result.stderr)


def test_the_wheel_holds_every_file_the_packages_read_at_run_time(installed: Installed) -> None:
    data_files = {path.relative_to(REPO).as_posix() for folder in FOLDERS for path in (REPO / folder).rglob("*")
                  if path.is_file() and path.suffix not in (".py", ".pyc") and not path.name.startswith(".")
                  and "__pycache__" not in path.parts}
    assert {"genfleet/common/publish.lua", "genfleet/sim/model/tokenizer.json"} <= data_files  # the walk finds them
    in_wheel = set(zipfile.ZipFile(installed.wheel).namelist())
    assert data_files - in_wheel == set(), "add them to [tool.setuptools.package-data] in pyproject.toml"


@pytest.mark.timeout(240)
def test_genfleet_demo_runs_the_sample_data_from_the_installed_package(installed: Installed) -> None:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: `apt-get install redis-server` (make test does it as root)")
    result = installed.run(installed.genfleet, "demo", *QUICK_DEMO, timeout=200)
    assert result.returncode == 0, f"genfleet demo failed:\n{result.stdout[-6000:]}\n{result.stderr[-4000:]}"

    prompts = good_rows(0.02)
    assert re.search(rf"done: {prompts} prompts, 0 failed", result.stdout), result.stdout[-3000:]
    # `genfleet run`'s layout: the run's shards beside its logs and the embedded Redis.
    (shards,) = (installed.home / ".demo" / "output").glob("demo-*")
    assert (installed.home / ".demo" / "output" / ".genfleet-redis").is_dir()
    records = [json.loads(line) for shard in shards.rglob("*.jsonl") for line in shard.read_text().splitlines()]
    assert len({record["id"] for record in records}) == prompts
    assert {record["dataset"] for record in records} == {name for name, *_ in DATASETS}
    # The two bad sample rows were reported with file and line, and not enqueued.
    rejected = re.findall(r"rejected .*B7_sharegpt\.jsonl:\d+", result.stdout + result.stderr)
    assert len(rejected) == len(BAD_LINES["B7_sharegpt"])


def test_genfleet_demo_without_redis_server_says_how_to_install_it(installed: Installed) -> None:
    result = installed.run(installed.genfleet, "demo", *QUICK_DEMO, path=str(installed.venv / "bin"))

    assert result.returncode == 1
    assert "redis-server is not on PATH" in result.stderr and "apt-get install redis-server" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_genfleet_version_prints_the_version_pyproject_declares(installed: Installed) -> None:
    result = installed.run(installed.genfleet, "--version")

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"genfleet {VERSION}\n"


def test_show_completion_prints_the_script_for_the_shell_it_runs_in(installed: Installed) -> None:
    # typer detects the shell from the parent processes (shellingham): run it from bash, as a user would.
    # `; exit $?` keeps bash as its parent: bash execs a lone command in place, which left the test's
    # own ancestors to find a shell in (none when pytest runs detached, under init).
    result = installed.run("bash", "-c", "genfleet --show-completion; exit $?")

    assert result.returncode == 0, result.stderr
    assert "complete -o default -F _genfleet_completion genfleet" in result.stdout


def test_the_completion_script_completes_commands_and_options(installed: Installed) -> None:
    # What the bash script asks when Tab is pressed (typer's `complete_bash` instruction).
    def complete(words: str) -> list[str]:
        result = installed.run(installed.genfleet, extra_env={
            "_GENFLEET_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - 1)})
        assert result.returncode == 0, result.stderr
        return result.stdout.split()

    assert complete("genfleet de") == ["demo"]
    assert complete("genfleet demo --no") == ["--no-flower", "--no-hold"]
