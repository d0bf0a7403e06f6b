"""Flower is never open to other origins: `genfleet flower` runs only behind basic auth (one
`user:password`, no commas), a web page on another origin cannot make it publish a task even in a
browser that holds the password, and every deploy file gives it one."""
from __future__ import annotations

import subprocess
import sys
import uuid

import httpx
import pytest
from helpers.deploy_files import (
    COMPOSE_ENV,
    SYSTEMD_ENV,
    compose,
    deploy_commands,
    env_file,
    genfleet_containers,
    runbook_section,
)
from helpers.flower import FlowerProcess
from helpers.sim_process import free_port
from typer.testing import CliRunner

from genfleet.cli import app as cli_app
from genfleet.common.queues import GENERATE_TASK, PARTITIONS
from genfleet.common.settings import flower_auth_problem

EVIL = "http://evil.example"
# What the page would have Flower send: a task whose names leave the output root (see test_names).
FORGED = {"args": [{"run": "../../trav", "id": "../x/0", "dataset": "..", "row": 0, "partition": "short",
                    "prompt_tokens": 1, "max_new_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}]}


def queued(fleet) -> int:
    return sum(fleet.redis.llen(queue) for queue in (*PARTITIONS, "celery"))


def test_a_cross_site_post_to_send_task_is_refused_and_nothing_is_enqueued(fleet):
    # Flower's own switch for an open API, set as an operator might: it must open nothing.
    fleet.env["FLOWER_UNAUTHENTICATED_API"] = "true"
    flower = FlowerProcess(fleet, f"ops:{uuid.uuid4().hex}")
    send = f"{flower.url}/api/task/send-task/{GENERATE_TASK}"
    try:
        # A browser on evil.example holding the password (basic auth is cached per site) ...
        cross_site = httpx.post(send, json=FORGED, auth=flower.auth, timeout=10,
                                headers={"Origin": EVIL, "Sec-Fetch-Site": "cross-site"})
        # ... an older one that sends no fetch metadata, only Origin ...
        cross_origin = httpx.post(send, json=FORGED, auth=flower.auth, timeout=10, headers={"Origin": EVIL})
        # ... and one without the password.
        anonymous = httpx.post(send, json=FORGED, timeout=10)
        preflight = httpx.options(send, timeout=10, headers={
            "Origin": EVIL, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type"})
        assert (cross_site.status_code, cross_origin.status_code, anonymous.status_code) == (403, 403, 401)
        assert "access-control-allow-origin" not in {k.lower() for k in preflight.headers}
        assert queued(fleet) == 0, "a refused request published a task"

        # The same request from Flower's own origin, with the password, goes through: what was refused
        # above was the other origin, not the endpoint.
        own = httpx.post(send, json=FORGED, auth=flower.auth, timeout=10,
                         headers={"Origin": flower.url, "Sec-Fetch-Site": "same-origin"})
        assert own.status_code == 200, own.text
        assert queued(fleet) == 1
        print(f"flower cross-site POST: {cross_site.status_code}, without fetch metadata: "
              f"{cross_origin.status_code}, without the password: {anonymous.status_code}; tasks they enqueued: 0")
    finally:
        flower.stop()


@pytest.mark.parametrize("auth", [None, "", "admin:abc,xyz", "admin", ":secret", "admin:", "admin:two words",
                                  "a,b:c"])
def test_flower_refuses_to_start_without_one_user_password(auth, monkeypatch):
    monkeypatch.delenv("GENFLEET_FLOWER_AUTH", raising=False)
    if auth is not None:
        monkeypatch.setenv("GENFLEET_FLOWER_AUTH", auth)
    result = CliRunner().invoke(cli_app, ["flower", "--port", str(free_port())])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: GENFLEET_FLOWER_AUTH"), lines


def test_a_bad_flower_auth_exits_2_with_one_line_as_a_process(fleet):
    env = {**fleet.env, "GENFLEET_FLOWER_AUTH": "admin:abc,xyz"}
    result = subprocess.run([sys.executable, "-m", "genfleet", "flower", "--port", str(free_port())], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "GENFLEET_FLOWER_AUTH" in result.stderr and "comma" in result.stderr


def test_every_deploy_file_runs_flower_behind_a_valid_password():
    flowers = [(where, args) for where, args in deploy_commands() if args[:1] == ["flower"]]
    assert len(flowers) == 4, flowers  # compose, systemd, Kubernetes, the runbook
    for where, _ in flowers:
        if where.startswith("compose"):
            service = compose()["services"][where.split()[1]]
            assert "${GENFLEET_FLOWER_AUTH:?" in str(service["environment"]["GENFLEET_FLOWER_AUTH"]), where
            assert flower_auth_problem(env_file(COMPOSE_ENV)["GENFLEET_FLOWER_AUTH"]) is None
        elif where.startswith("k8s"):
            container = next(c for w, c, _ in genfleet_containers() if f"k8s {w}" == where)
            assert any(v["name"] == "GENFLEET_FLOWER_AUTH" and "secretKeyRef" in v.get("valueFrom", {})
                       for v in container["env"]), where
        elif where.startswith("runbook"):
            assert 'export GENFLEET_FLOWER_AUTH="admin:$(openssl rand -hex 16)"' in runbook_section()
        else:
            assert ".service" in where
            assert flower_auth_problem(env_file(SYSTEMD_ENV).get("GENFLEET_FLOWER_AUTH")) is None, where
