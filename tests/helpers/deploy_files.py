"""Reading the deployment artefacts (deploy/ and the runbook in docs/deploying.md) the way each tool would: YAML
manifests, compose with its interpolation, systemd units and env files, and every `genfleet`
command line they run, with its variables filled in."""
from __future__ import annotations

import configparser
import re
import shlex
from pathlib import Path

import yaml

from genfleet.common.queues import PARTITIONS
from helpers.paths import DEPLOY, REPO, TOKENIZER

COMPOSE = DEPLOY / "compose" / "compose.yaml"
COMPOSE_ENV = DEPLOY / "compose" / ".env.example"
DOCKERFILE = DEPLOY / "Dockerfile"
SYSTEMD = DEPLOY / "systemd"
SYSTEMD_ENV = SYSTEMD / "genfleet.env.example"
K8S = DEPLOY / "k8s"
DEPLOYING = REPO / "docs" / "deploying.md"  # the runbook


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
    """Every `genfleet ...` argument list that a deploy file or the runbook runs, with its
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
    commands += [(f"runbook: {' '.join(args)}", args) for args in runbook_commands()]
    return commands


def runbook_section() -> str:
    """docs/deploying.md's "Runbook" section, to the next section or the end."""
    text = DEPLOYING.read_text()
    start = text.index("\n## Runbook\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def runbook_commands() -> list[list[str]]:
    """`genfleet ...` lines of the runbook's shell blocks, up to a redirection or `&`; shell
    variables get plausible values."""
    values = {"MODEL_DIR": str(TOKENIZER), "DATA": "examples/data", "HOME": "/home/op"}
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
                args.append(re.sub(r"\$(\w+)|\$\{(\w+)\}|^~",
                                   lambda m: values.get(m.group(1) or m.group(2) or "HOME", "x"), word))
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
