"""Deployment (deploy/ and the README runbook): every artefact parses and agrees with the CLI and the
settings; a two-host rehearsal where a third host joins mid-run; Redis over TLS with a password; and
a pickle message on a queue is rejected, never executed."""
from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import httpx
import promql_parser
import pytest
import redis
import yaml
from fleet import Fleet, WorkerProcess
from prometheus_client.parser import text_string_to_metric_families
from sim_process import SimProcess, free_port
from typer.main import get_command
from typer.testing import CliRunner

from common.queues import GENERATE_TASK, LONG, PARTITIONS, SHORT
from common.settings import Settings
from genfleet.cli import app as cli_app

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
COMPOSE = DEPLOY / "compose" / "compose.yaml"
COMPOSE_ENV = DEPLOY / "compose" / ".env.example"
DOCKERFILE = DEPLOY / "Dockerfile"
SYSTEMD = DEPLOY / "systemd"
SYSTEMD_ENV = SYSTEMD / "genfleet.env.example"
K8S = DEPLOY / "k8s"
README = REPO / "README.md"

# Env vars a deploy file may set that are not genfleet settings, each for a reason.
OTHER_ENV = {
    "REDIS_PASSWORD",            # Redis containers: written into requirepass
    "REDIS_MEMORY_LIMIT",        # k8s Redis: maxmemory from the container's memory limit
    "PYTHONDONTWRITEBYTECODE",   # image: no .pyc next to the installed package
    "PIP_DISABLE_PIP_VERSION_CHECK",
}
PYTHON_WHEEL_PACKAGES = ("genfleet", "common", "producer", "workers", "sim")

# Near-constant completions of ~1 s: a run of a few hundred lasts long enough to add a host.
ONE_SECOND = ("--rate", "40", "--knee", "100000", "--length-median", "40", "--length-mean", "41")


# --- reading the artefacts ------------------------------------------------------------------------
def yaml_docs(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def k8s_docs() -> list[tuple[Path, dict]]:
    """Every object of every manifest (kustomization.yaml is kustomize's, not an object)."""
    return [(path, doc) for path in sorted(K8S.glob("*.yaml")) if path.name != "kustomization.yaml"
            for doc in yaml_docs(path)]


def env_file(path: Path) -> dict[str, str]:
    """KEY=value lines (systemd EnvironmentFile and compose .env syntax; comments skipped)."""
    values = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", key), f"{path.name}:{number}: not KEY=value: {line}"
        values[key] = value
    return values


def systemd_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """Sections of a unit file; a key may repeat (EnvironmentFile=), so each maps to its values."""
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",),
                                       comment_prefixes=("#", ";"), empty_lines_in_values=False,
                                       dict_type=_MultiDict)
    parser.optionxform = str  # keys are case-sensitive
    parser.read_string(path.read_text())
    return {section: {key: value.split("\n") for key, value in parser[section].items()}
            for section in parser.sections()}


class _MultiDict(dict):
    """Lets configparser keep every value of a repeated key (joined by newlines)."""

    def __setitem__(self, key: str, value: object) -> None:
        if isinstance(value, list) and key in self:
            self[key].extend(value)
        else:
            super().__setitem__(key, value)


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def interpolate_compose(value: str, env: dict[str, str]) -> str:
    """docker compose's ${VAR}, ${VAR:-default} and ${VAR:?error}, nested defaults included."""
    pattern = re.compile(r"\$\{([A-Z0-9_]+)(?::?([-?])((?:[^{}]|\{[^{}]*\})*))?\}")
    while (match := pattern.search(value)) is not None:
        name, op, arg = match.groups()
        if env.get(name):
            replacement = env[name]
        elif op == "-":
            replacement = arg
        else:
            raise AssertionError(f"${{{name}}} is not set in .env.example")
        value = value[:match.start()] + replacement + value[match.end():]
    return value.replace("$$", "$")


def genfleet_services() -> dict[str, dict]:
    """Compose services that run the genfleet image."""
    return {name: service for name, service in compose()["services"].items()
            if service.get("image") == "genfleet:local"}


def genfleet_containers() -> list[tuple[str, dict, dict[str, str]]]:
    """(where, container, its env from ConfigMaps) for every k8s container running the genfleet image."""
    configmaps = {doc["metadata"]["name"]: doc.get("data", {}) for _, doc in k8s_docs() if doc["kind"] == "ConfigMap"}
    found = []
    for path, doc in k8s_docs():
        spec = pod_spec(doc)
        for container in (spec or {}).get("containers", []):
            if container["image"].split(":")[0] == "genfleet":
                env = {}
                for source in container.get("envFrom", []):
                    env.update(configmaps[source["configMapRef"]["name"]])
                found.append((f"{path.name}:{doc['metadata'].get('name', doc['kind'])}", container, env))
    return found


def pod_spec(doc: dict) -> dict | None:
    if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
        return doc["spec"]["template"]["spec"]
    return None


def deploy_commands() -> list[tuple[str, list[str]]]:
    """Every `genfleet ...` argument list that a deploy file or the README runbook runs, with its
    variables filled in the way the deployment would fill them."""
    commands = []
    dotenv = env_file(COMPOSE_ENV)
    for name, service in genfleet_services().items():
        command = service.get("command") or ["--help"]
        commands.append((f"compose {name}", [interpolate_compose(str(arg), dotenv) for arg in command]))
    systemd_env = env_file(SYSTEMD_ENV)
    for unit in sorted(SYSTEMD.glob("*.service")):
        for line in systemd_unit(unit)["Service"]["ExecStart"]:
            binary, *args = shlex.split(line)
            assert binary.endswith("/genfleet"), f"{unit.name} runs {binary}"
            instances = PARTITIONS if "%i" in line else ("",)
            for instance in instances:
                filled = [re.sub(r"\$\{(\w+)\}", lambda m: systemd_env[m.group(1)], arg).replace("%i", instance)
                          for arg in args]
                commands.append((f"{unit.name}{'@' + instance if instance else ''}", filled))
    for where, container, env in genfleet_containers():
        args = [re.sub(r"\$\((\w+)\)", lambda m, env=env: env[m.group(1)], arg) for arg in container.get("args", [])]
        commands.append((f"k8s {where}", args))
    commands += [(f"README: {' '.join(args)}", args) for args in runbook_commands()]
    return commands


def runbook_section() -> str:
    text = README.read_text()
    start = text.index("\n## Deploying\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def runbook_commands() -> list[list[str]]:
    """`genfleet ...` lines of the runbook's shell blocks, up to a redirection or `&`; shell
    variables get plausible values."""
    values = {"MODEL_DIR": str(REPO / "sim" / "model"), "DATA": "examples/data", "HOME": "/home/op"}
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", runbook_section(), re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["nohup"]:
                words = words[1:]
            if words[:1] != ["genfleet"]:
                continue
            args = []
            for word in words[1:]:
                if word in (">", "&", "|", ";", "&&") or word.startswith(">"):
                    break
                args.append(re.sub(r"\$(\w+)|\$\{(\w+)\}|^~", lambda m: values.get(m.group(1) or m.group(2) or "HOME", "x"),
                                   word))
            commands.append(args)
    assert len(commands) >= 8, "the runbook's commands were not found"
    return commands


def seconds(value: str | int) -> float:
    """`60`, `60s`, `1m30s` (compose durations and systemd time spans)."""
    if isinstance(value, int):
        return value
    total, found = 0.0, False
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|min|sec)?", value):
        total += float(number) * {"ms": 0.001, "h": 3600, "m": 60, "min": 60}.get(unit, 1)
        found = True
    assert found, f"not a duration: {value}"
    return total


# --- static checks --------------------------------------------------------------------------------
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
    pyproject = (REPO / "pyproject.toml").read_text()
    assert all(f'"{package}*"' in pyproject for package in PYTHON_WHEEL_PACKAGES)
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


# --- on this machine ------------------------------------------------------------------------------
def write_prompts(path: Path, count: int, words: str) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"{words} {i}"}) + "\n" for i in range(count)))
    return path


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).raise_for_status().text
    samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append((sample.labels, sample.value))
    return samples


def keda_work(scrapes: list[dict], partition: str) -> tuple[float, float]:
    """What keda.yaml's query computes, from the workers' own /metrics: (queue depth, in flight)."""
    depth = max(value for s in scrapes for labels, value in s["genfleet_queue_depth"] if labels["queue"] == partition)
    in_flight = sum(value for s in scrapes for labels, value in s.get("genfleet_tasks_in_flight", [])
                    if labels["partition"] == partition)
    return depth, in_flight


def start_flower(fleet: Fleet, auth: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    with open(fleet.workdir / "flower.log", "w") as log:  # the child keeps its own descriptor
        process = subprocess.Popen([sys.executable, "-m", "genfleet", "flower", "--port", str(port)],
                                   env={**fleet.env, "GENFLEET_FLOWER_AUTH": auth}, cwd=fleet.workdir,
                                   stdout=log, stderr=subprocess.STDOUT)
    return process, port


def test_two_hosts_rehearsal_where_a_third_host_added_mid_run_takes_work_at_once(fleet, tmp_path):
    """Two simulated SGLang hosts with a worker pair each, one producer, one Redis, Flower with auth;
    a third host's pair joins mid-run. Small per-host caps keep a backlog long enough to watch."""
    short_data = write_prompts(tmp_path / "s.jsonl", 240, "a short question")
    long_data = write_prompts(tmp_path / "l.jsonl", 36, "a long question")
    caps = {SHORT: 6, LONG: 2}
    by_pid: dict[str, tuple[str, str]] = {}  # a record's worker ends in its pid -> (host, pool)
    metrics_ports: list[int] = []

    def start_pair(host: str, url: str) -> list[WorkerProcess]:
        started = []
        for pool in PARTITIONS:
            port = free_port()
            fleet.configure(metrics_port=port)
            worker = fleet.start_worker(pool, url, concurrency=caps[pool], wait=False)
            by_pid[str(worker.process.pid)] = (host, pool)
            metrics_ports.append(port)
            started.append(worker)
        return started

    with SimProcess(*ONE_SECOND) as gpu1, SimProcess(*ONE_SECOND) as gpu2, SimProcess(*ONE_SECOND) as gpu3:
        auth = f"ops:{uuid.uuid4().hex}"
        flower, flower_port = start_flower(fleet, auth)
        try:
            pairs = start_pair("gpu1", gpu1.url) + start_pair("gpu2", gpu2.url)
            for worker in pairs:
                worker.wait_ready()
            fleet.enqueue("rehearsal", f"s={short_data}", f"l={long_data}:long")
            time.sleep(4)  # mid-run: the backlog is still there
            assert fleet.progress("rehearsal").totals().pending > 100
            joined_at = time.time()
            third = start_pair("gpu3", gpu3.url)
            for worker in third:
                worker.wait_ready()
            ready_at = time.time()

            # Flower with auth: refuses anonymous calls, lists the fleet's workers.
            api = f"http://127.0.0.1:{flower_port}/api/workers"
            anonymous = wait_for(lambda: httpx.get(api, timeout=5).status_code, timeout=30)
            assert anonymous == 401
            user, password = auth.split(":")
            listed = httpx.get(api, params={"status": "1"}, auth=(user, password), timeout=15).raise_for_status().json()
            assert len(listed) >= 4, listed

            # KEDA's inputs on the workers' /metrics: at the tail of the run the queue is empty while
            # streams still run, and the scaled quantity must still count them.
            query_names = set(re.findall(r"genfleet_\w+", (K8S / "keda.yaml").read_text()))
            tail = None
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and tail is None:
                scrapes = [scrape(port) for port in metrics_ports]
                assert query_names <= set().union(*scrapes), "keda.yaml asks for metrics no worker exports"
                depth, in_flight = keda_work(scrapes, SHORT)
                if depth == 0 and in_flight > 0:
                    tail = (depth, in_flight)
                time.sleep(0.2)
            assert tail is not None, "never saw an empty short queue with streams in flight"
            fleet.wait_finished("rehearsal", timeout=90)
        finally:
            flower.terminate()
            flower.wait(timeout=15)

    records = fleet.records("rehearsal")
    ids = Counter(r["id"] for r in records)
    assert set(ids) == {f"s/{i}" for i in range(240)} | {f"l/{i}" for i in range(36)}
    hosts = {"gpu1": gpu1.url, "gpu2": gpu2.url, "gpu3": gpu3.url}
    first_start: dict[str, float] = {}
    for record in records:
        host, pool = by_pid[record["worker"].rsplit("-", 1)[1]]
        # Each pair streams only from its own host, each pool only from its own queue.
        assert record["upstream"] == hosts[host], record["worker"]
        assert record["partition"] == pool
        first_start[host] = min(first_start.get(host, float("inf")), record["timing"]["started_at"])
    per_host = Counter(by_pid[r["worker"].rsplit("-", 1)[1]][0] for r in records)
    print(f"rehearsal: records per host {dict(per_host)}; third host joined {ready_at - joined_at:.1f} s "
          f"after start, first task {first_start['gpu3'] - ready_at:+.1f} s after ready; "
          f"KEDA work at the tail: queue {tail[0]:.0f} + in flight {tail[1]:.0f}")
    assert per_host["gpu3"] >= 20, per_host  # a fair share of what was left, not a straggler
    assert first_start["gpu3"] - ready_at < 3.0, "the third host did not take work at once"


def wait_for(probe, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return probe()
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class _LeavesATrace:
    """Unpickling this opens (creates) a file: visible proof that a payload was deserialised."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickle_message_on_a_queue_is_rejected_never_executed_and_the_worker_carries_on(fleet, tmp_path):
    from kombu import Connection, Exchange, Producer
    from kombu.serialization import dumps, loads

    trace = tmp_path / "pickle-was-executed"
    task_id = str(uuid.uuid4())
    # A well-formed protocol-2 task message for genfleet's task, except for its pickle body.
    body = ((_LeavesATrace(trace),), {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None})
    headers = {"lang": "py", "task": GENERATE_TASK, "id": task_id, "root_id": task_id, "parent_id": None,
               "group": None, "retries": 0, "eta": None, "expires": None, "argsrepr": "(...)",
               "kwargsrepr": "{}", "origin": "attacker@nowhere"}

    # The payload is live: wherever pickle is accepted, merely decoding it leaves the trace.
    control = tmp_path / "control"
    content_type, encoding, data = dumps(((_LeavesATrace(control),), {}, {}), serializer="pickle")
    assert content_type == "application/x-python-serialize"
    loads(data, content_type, encoding, accept={content_type})
    assert control.exists()

    with SimProcess(*ONE_SECOND) as sim:
        fleet.configure(metrics_port=0)
        worker = fleet.start_worker(SHORT, sim.url, concurrency=2)
        with Connection(fleet.redis_url) as connection:
            Producer(connection).publish(body, exchange=Exchange(SHORT, type="direct"), routing_key=SHORT,
                                         serializer="pickle", headers=headers)
        wait_until(lambda: "ContentDisallowed" in worker.log.read_text(errors="replace"), timeout=30)
        # Then a normal prompt, through the same queue and worker.
        data_file = write_prompts(tmp_path / "after.jsonl", 1, "a normal question")
        fleet.enqueue("after-pickle", f"after={data_file}")
        progress = fleet.wait_finished("after-pickle", timeout=60)

    log = worker.log.read_text(errors="replace")
    assert "Refusing to deserialize untrusted content of type pickle" in log
    assert not trace.exists(), "the pickle payload was deserialised by the worker"
    assert progress.totals().done == 1
    assert f"{GENERATE_TASK}[{task_id}] received" not in log, "the pickle task reached the pool"
    # Discarded, not parked: nothing of it left in the queue or among unacknowledged messages.
    assert fleet.redis.llen(SHORT) == 0
    assert not any(task_id.encode() in value for value in fleet.redis.hvals("unacked"))
    assert worker.process.poll() is None, "the worker died"


def wait_until(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.1)


# --- Redis over TLS, with a password ----------------------------------------------------------------
def make_certificates(directory: Path) -> dict[str, Path]:
    """A CA and a server certificate for localhost/127.0.0.1 signed by it, plus an unrelated CA."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed")
    names = ("ca", "ca_key", "other_ca", "other_key", "cert", "key", "csr")
    paths = {name: directory / f"{name}.pem" for name in names}

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, timeout=60)

    for ca, key in (("ca", "ca_key"), ("other_ca", "other_key")):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN=genfleet test {ca}",
            "-keyout", str(paths[key]), "-out", str(paths[ca]))
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", str(paths["key"]),
        "-out", str(paths["csr"]))
    extensions = directory / "san.ext"
    extensions.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run("x509", "-req", "-in", str(paths["csr"]), "-CA", str(paths["ca"]), "-CAkey", str(paths["ca_key"]),
        "-CAcreateserial", "-days", "2", "-extfile", str(extensions), "-out", str(paths["cert"]))
    return paths


@pytest.fixture
def tls_redis(tmp_path):
    certs = make_certificates(tmp_path)
    password = uuid.uuid4().hex
    auth = tmp_path / "auth.conf"
    auth.write_text(f"requirepass {password}\n")
    port = free_port()
    # deploy/redis.conf as deployed, the password from an included file, TLS only (no plain port).
    process = subprocess.Popen(
        ["redis-server", str(DEPLOY / "redis.conf"), "--include", str(auth), "--dir", str(tmp_path),
         "--port", "0", "--tls-port", str(port), "--tls-cert-file", str(certs["cert"]),
         "--tls-key-file", str(certs["key"]), "--tls-ca-cert-file", str(certs["ca"]), "--tls-auth-clients", "no"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"rediss://:{password}@localhost:{port}/0?ssl_ca_certs={certs['ca']}"
    try:
        wait_until(lambda: _pings(url) or process.poll() is not None, timeout=10)
        if process.poll() is not None:
            output = process.stdout.read().decode(errors="replace") if process.stdout else ""
            if "tls" in output.lower():
                pytest.skip(f"this redis-server has no TLS: {output[-300:]}")
            pytest.fail(f"redis-server did not start:\n{output}")
        yield url, certs, password, port
    finally:
        process.terminate()
        process.wait(timeout=10)


def _pings(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def test_redis_tls_with_a_password_runs_a_job_and_the_broker_verifies_the_certificate(tls_redis, tmp_path):
    from workers.app import create_app

    url, certs, password, port = tls_redis

    def broker_connects(redis_url: str, settings: Settings | None = None) -> bool:
        connection = create_app(settings or Settings(redis_url=redis_url)).connection_for_write()
        try:
            connection.ensure_connection(max_retries=0)
            connection.default_channel.client.ping()
            return True
        except Exception:  # noqa: BLE001 - any failure to connect or verify counts
            return False
        finally:
            connection.release()

    # The URL as documented: rediss://, the password, the private CA; verification is on by default.
    assert "ssl_cert_reqs=required" in Settings(redis_url=url).redis_url
    assert broker_connects(url)
    # A bare rediss:// URL: this server's certificate is not trusted by the system's CAs, so it must
    # be refused. kombu on its own would accept any certificate here (CERT_NONE, a log warning).
    bare = f"rediss://:{password}@localhost:{port}/0"
    unverified = Settings.model_construct(**{**Settings().model_dump(), "redis_url": bare})
    assert broker_connects(bare, unverified), "kombu verifies by itself now: the default can go"
    assert not broker_connects(bare)
    assert broker_connects(bare + "?ssl_cert_reqs=none"), "the explicit opt-out no longer works"
    assert not broker_connects(f"{bare}?ssl_ca_certs={certs['other_ca']}")
    assert not _pings(f"rediss://:wrong@localhost:{port}/0?ssl_ca_certs={certs['ca']}")

    # A real job over it: worker, producer and status all on the rediss:// URL.
    (tmp_path / "fleet").mkdir()
    with Fleet(url, tmp_path / "fleet", metrics_port=0) as fleet, SimProcess(*ONE_SECOND) as sim:
        fleet.start_worker(SHORT, sim.url, concurrency=4)
        data_file = write_prompts(tmp_path / "tls.jsonl", 6, "a question over TLS")
        fleet.enqueue("tls", f"tls={data_file}")
        progress = fleet.wait_finished("tls", timeout=60)
        assert progress.totals().done == 6
        status = fleet.genfleet("status", "--run", "tls", "--json")
        assert json.loads(status.stdout)["run"] == "tls"
