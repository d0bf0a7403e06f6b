"""Deployment artefacts (deploy/ and the runbook in docs/deploying.md): every file parses, is valid
for its tool, and agrees with the CLI and the settings: commands exist, env vars are settings, stop
timeouts exceed the graceful shutdown, the Kubernetes objects hang together, the image is built as
it should be, and Flower needs auth wherever it listens beyond loopback."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import promql_parser
import pytest
import tomllib
import yaml
from helpers.deploy_files import (
    COMPOSE,
    COMPOSE_ENV,
    DOCKERFILE,
    K8S,
    SYSTEMD,
    SYSTEMD_ENV,
    compose,
    deploy_commands,
    env_file,
    genfleet_containers,
    genfleet_services,
    interpolate_compose,
    k8s_docs,
    pod_spec,
    seconds,
    systemd_unit,
)
from helpers.paths import DEPLOY, REPO
from helpers.sim_process import free_port
from typer.main import get_command
from typer.testing import CliRunner

from genfleet.cli import app as cli_app
from genfleet.common.queues import LONG, PARTITIONS, SHORT
from genfleet.common.settings import Settings

# Env vars a deploy file may set that are not genfleet settings, each for a reason.
OTHER_ENV = {
    "REDIS_PASSWORD",            # Redis containers: written into requirepass
    "REDIS_MEMORY_LIMIT",        # k8s Redis: maxmemory from the container's memory limit
    "PYTHONDONTWRITEBYTECODE",   # image: no .pyc next to the installed package
    "PIP_DISABLE_PIP_VERSION_CHECK",
}
PYTHON_WHEEL_PACKAGES = ("genfleet",)


def test_every_deploy_file_parses():
    assert compose()["services"], "compose.yaml has no services"
    for path, doc in k8s_docs():
        assert doc.get("apiVersion") and doc.get("kind"), f"{path.name}: not a Kubernetes object"
        assert doc["metadata"].get("name") or doc["metadata"].get("generateName"), f"{path.name}: unnamed {doc['kind']}"
    for unit in SYSTEMD.glob("*.service"):
        sections = systemd_unit(unit)
        assert {"Unit", "Service", "Install"} <= set(sections), f"{unit.name}: sections {sorted(sections)}"
    for path in (COMPOSE_ENV, SYSTEMD_ENV):
        assert env_file(path)
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (K8S / resource).is_file(), f"kustomization lists a missing {resource}"


def test_compose_file_is_valid_against_the_compose_spec():
    checker = Path(sys.executable).with_name("check-jsonschema")
    result = subprocess.run([str(checker), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
                            check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_systemd_units_have_no_unknown_or_malformed_directives(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    for unit in SYSTEMD.glob("*.service"):
        shutil.copy(unit, tmp_path / unit.name)
    names = [str(tmp_path / u.name.replace("@.", "@short.")) for u in SYSTEMD.glob("*.service")]
    result = subprocess.run([analyze, "verify", *names], check=False, capture_output=True, text=True, timeout=60)
    # The genfleet binary is not installed at /opt/genfleet here; anything else is a real problem.
    problems = [line for line in (result.stdout + result.stderr).splitlines()
                if line.strip() and "is not executable" not in line]
    assert not problems, "\n".join(problems)


def test_every_genfleet_command_they_run_exists_in_the_cli():
    runner = CliRunner()
    commands = get_command(cli_app).commands
    for where, args in deploy_commands():
        if args == ["--help"]:
            continue
        help_result = runner.invoke(cli_app, [*args, "--help"])
        assert help_result.exit_code == 0, f"{where}: genfleet {' '.join(args)} --help:\n{help_result.output}"
        # --help stops before values are checked: also parse them all, without running the command.
        name, *rest = args
        assert name in commands, f"{where}: no command {name}"
        try:
            commands[name].make_context(name, list(rest))
        except Exception as error:  # noqa: BLE001 - only a site's own missing paths are acceptable here
            assert "does not exist" in str(error), f"{where}: genfleet {' '.join(args)}: {error}"
        if name == "worker":
            assert rest[rest.index("--pool") + 1] in PARTITIONS, f"{where}: unknown pool"


def test_every_env_var_they_set_is_a_real_setting(monkeypatch):
    fields = set(Settings.model_fields)
    found: dict[str, dict[str, str]] = defaultdict(dict)  # where -> name -> value

    dotenv = env_file(COMPOSE_ENV)
    compose_text = COMPOSE.read_text()
    for name in dotenv:
        # A .env entry is either a setting or a compose variable that compose.yaml uses.
        if not name.startswith("GENFLEET_"):
            assert "${" + name in compose_text, f".env.example: {name} is used nowhere in compose.yaml"
    for name, service in compose()["services"].items():
        for key, value in (service.get("environment") or {}).items():
            found[f"compose {name}"][key] = interpolate_compose(str(value), dotenv)
    found["genfleet.env.example"] = env_file(SYSTEMD_ENV)
    for unit in SYSTEMD.glob("*.service"):
        for line in systemd_unit(unit)["Service"].get("Environment", []):
            for assignment in shlex.split(line):
                key, _, value = assignment.partition("=")
                found[unit.name][key] = value
    for path, doc in k8s_docs():
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "genfleet-config":
            found[f"{path.name} ConfigMap"] = dict(doc["data"])
        for container in (pod_spec(doc) or {}).get("containers", []):
            for var in container.get("env", []):
                found[f"{path.name} {container['name']}"][var["name"]] = var.get("value", "from a secret")
    for line in DOCKERFILE.read_text().replace("\\\n", " ").splitlines():
        if line.startswith("ENV "):
            for assignment in shlex.split(line[4:]):
                key, _, value = assignment.partition("=")
                found["Dockerfile"][key] = value

    for where, variables in found.items():
        for name in variables:
            if name.startswith("GENFLEET_"):
                assert name.removeprefix("GENFLEET_").lower() in fields, f"{where}: {name} is not a setting"
            else:
                assert name in OTHER_ENV, f"{where}: {name} is neither a setting nor whitelisted"
        # And each value is one the settings accept (secrets aside).
        settings_env = {k: v for k, v in variables.items() if k.startswith("GENFLEET_") and v != "from a secret"}
        with monkeypatch.context() as patch:
            for key in [k for k in os.environ if k.startswith("GENFLEET_")]:
                patch.delenv(key)
            for key, value in settings_env.items():
                patch.setenv(key, value)
            Settings()


def test_stop_timeouts_exceed_the_graceful_shutdown_everywhere():
    grace = max([Settings().shutdown_grace_s]
                + [float(v) for path in (COMPOSE_ENV, SYSTEMD_ENV)
                   for k, v in env_file(path).items() if k == "GENFLEET_SHUTDOWN_GRACE_S"]
                + [float(doc["data"]["GENFLEET_SHUTDOWN_GRACE_S"]) for _, doc in k8s_docs()
                   if doc["kind"] == "ConfigMap" and "GENFLEET_SHUTDOWN_GRACE_S" in doc.get("data", {})])
    margin = 15  # after the grace: re-queue the rest, seal shards, withdraw the beacon
    for name, service in genfleet_services().items():
        if (service.get("command") or [""])[0] == "worker":
            assert seconds(service["stop_grace_period"]) >= grace + margin, f"compose {name}"
    unit = systemd_unit(SYSTEMD / "genfleet-worker@.service")["Service"]
    assert seconds(unit["TimeoutStopSec"][0]) >= grace + margin
    assert unit["KillSignal"] == ["SIGTERM"] and unit["Restart"] == ["on-failure"]
    assert "/etc/genfleet/genfleet.env" in unit["EnvironmentFile"]
    flower_unit = systemd_unit(SYSTEMD / "genfleet-flower.service")["Service"]
    assert flower_unit["Restart"] == ["on-failure"] and flower_unit["KillSignal"] == ["SIGTERM"]
    assert "/etc/genfleet/genfleet.env" in flower_unit["EnvironmentFile"]
    for where, container, _ in genfleet_containers():
        if container["args"][0] == "worker":
            doc = next(d for p, d in k8s_docs() if container in (pod_spec(d) or {}).get("containers", []))
            assert pod_spec(doc)["terminationGracePeriodSeconds"] >= grace + margin, where


def test_kubernetes_manifests_hang_together():
    docs = [doc for _, doc in k8s_docs()]
    by_kind: dict[str, dict[str, dict]] = defaultdict(dict)
    for doc in docs:
        by_kind[doc["kind"]][doc["metadata"].get("name") or doc["metadata"]["generateName"]] = doc
    # The ConfigMap'd redis.conf is deploy/redis.conf.
    assert by_kind["ConfigMap"]["redis-conf"]["data"]["redis.conf"] == (DEPLOY / "redis.conf").read_text()
    redis_set = by_kind["StatefulSet"]["redis"]
    assert redis_set["spec"]["volumeClaimTemplates"], "Redis without a PVC"
    policy = by_kind["NetworkPolicy"]["redis-clients-only"]["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= redis_set["spec"]["template"]["metadata"]["labels"].items()
    allowed = policy["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    for name, doc in {**by_kind["Deployment"], **by_kind["StatefulSet"], **by_kind["Job"]}.items():
        template = doc["spec"]["template"]
        if "selector" in doc["spec"]:
            assert doc["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items(), name
        for container in template["spec"]["containers"]:
            for var in container.get("env", []):
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if ref:  # every secret a pod reads is documented with that key
                    assert ref["key"] in by_kind["Secret"][ref["name"]]["stringData"], f"{name}: {ref}"
                if var["name"] == "GENFLEET_REDIS_URL":  # a Redis client the NetworkPolicy lets in
                    assert allowed.items() <= template["metadata"]["labels"].items(), f"{name} cannot reach Redis"
            for source in container.get("envFrom", []):
                assert source["configMapRef"]["name"] in by_kind["ConfigMap"], name
    for partition, slots in ((SHORT, 150), (LONG, 32)):
        deployment = by_kind["Deployment"][f"genfleet-worker-{partition}"]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["args"][:3] == ["worker", "--pool", partition]
        scaled = by_kind["ScaledObject"][f"genfleet-worker-{partition}"]["spec"]
        assert scaled["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
        assert scaled["minReplicaCount"] >= 1, "the queue-depth gauge comes from the workers themselves"
        trigger = scaled["triggers"][0]
        assert trigger["type"] == "prometheus" and float(trigger["metadata"]["threshold"]) == slots
        query = trigger["metadata"]["query"]
        # Backlog and in-flight both, for this partition: LLEN alone would scale a busy pool in.
        assert f'genfleet_queue_depth{{namespace="genfleet", queue="{partition}"}}' in query
        assert f'genfleet_tasks_in_flight{{namespace="genfleet", partition="{partition}"}}' in query
        promql_parser.parse(query)  # raises on a syntax error


def test_dockerfile_builds_the_package_as_a_non_root_genfleet_entrypoint():
    instructions = [line.split(None, 1) for line in DOCKERFILE.read_text().replace("\\\n", " ").splitlines()
                    if line.strip() and not line.startswith("#")]
    froms = [arg for op, arg in instructions if op == "FROM"]
    assert all(re.match(r"python:3\.\d+-slim\b", image) for image in froms), froms
    user = [arg for op, arg in instructions if op == "USER"][-1]
    assert user.split(":")[0] not in ("root", "0")
    assert json.loads([arg for op, arg in instructions if op == "ENTRYPOINT"][-1]) == ["genfleet"]
    assert any(op == "RUN" and "pip install" in arg for op, arg in instructions)
    copied = {source for op, arg in instructions if op == "COPY" and "--from" not in arg
              for source in arg.split()[:-1]}
    # The image copies exactly what the wheel is built from: pyproject's packages and its readme.
    assert copied == {"pyproject.toml", "README.md", *PYTHON_WHEEL_PACKAGES}
    # ... the one folder pyproject.toml finds every package in.
    found = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert found["include"] == [f"{package}*" for package in PYTHON_WHEEL_PACKAGES]
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert ignore[ignore.index("*") + 1:] and all(f"!{path}" in ignore for path in copied)


def test_flower_needs_auth_beyond_loopback_wherever_it_is_deployed(monkeypatch):
    monkeypatch.delenv("GENFLEET_FLOWER_AUTH", raising=False)
    result = CliRunner().invoke(cli_app, ["flower", "--address", "0.0.0.0", "--port", str(free_port())])
    assert result.exit_code != 0 and "GENFLEET_FLOWER_AUTH" in result.output
    for where, args in deploy_commands():
        if args[:1] == ["flower"] and args[args.index("--address") + 1] not in ("127.0.0.1", "localhost"):
            if where.startswith("compose"):
                service = compose()["services"][where.split()[1]]
                assert "${GENFLEET_FLOWER_AUTH:?" in str(service["environment"]["GENFLEET_FLOWER_AUTH"]), where
            elif where.startswith("k8s"):
                container = next(c for w, c, _ in genfleet_containers() if f"k8s {w}" == where)
                assert any(v["name"] == "GENFLEET_FLOWER_AUTH" and "secretKeyRef" in v.get("valueFrom", {})
                           for v in container["env"]), where
            elif ".service" in where:
                assert env_file(SYSTEMD_ENV).get("GENFLEET_FLOWER_AUTH"), where

