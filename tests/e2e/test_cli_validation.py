"""Every bad command-line value is refused at once: one line on stderr naming the flag, exit status
2, nothing enqueued. `genfleet status` on an unreachable Redis fails in seconds with one line."""
from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
from helpers.data import write_prompts
from helpers.producer_cli import enqueue
from helpers.sim_process import free_port
from typer.testing import CliRunner

from genfleet.cli import app as cli_app


@pytest.mark.parametrize(("flag", "value"), [
    ("--max-new-tokens", "-5"), ("--max-new-tokens-short", "0"), ("--max-new-tokens-long", "-1"),
    ("--sampling", "temperature=hot"), ("--sampling", "top_p=2"), ("--sampling", "top_k=0"),
    ("--temperature", "-1"), ("--top-p", "0"), ("--top-k", "-2"), ("--min-p", "1.5"),
    ("--batch-size", "0"), ("--max-prompts", "0"), ("--max-queue-depth", "-1"), ("--context-length", "0"),
    ("--long-threshold", "0"), ("--max-tokens-per-dataset", "0"),
])
def test_enqueue_refuses_a_bad_value_naming_its_flag(flag, value, redis_url, redis_client, tmp_path):
    data = write_prompts(tmp_path / "p.jsonl", 3)
    result = enqueue(redis_url, flag, value, f"d={data}", expect_exit=2)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {flag}"), lines
    assert redis_client.dbsize() == 0, "something was enqueued"


def test_enqueue_refuses_a_bad_setting_naming_its_variable(redis_url, redis_client, tmp_path, monkeypatch):
    monkeypatch.setenv("GENFLEET_ENQUEUE_BATCH_ROWS", "0")
    result = enqueue(redis_url, f"d={write_prompts(tmp_path / 'p.jsonl', 3)}", expect_exit=2)
    assert result.stderr.strip() == "error: GENFLEET_ENQUEUE_BATCH_ROWS must be at least 1, got 0"
    assert redis_client.dbsize() == 0


def test_a_run_file_sampling_value_is_checked_too(redis_url, redis_client, tmp_path):
    data = write_prompts(tmp_path / "p.jsonl", 3)
    run_file = tmp_path / "run.toml"
    run_file.write_text(f'[sampling]\ntemperature = "hot"\n[datasets.d]\npath = "{data}"\n')
    result = enqueue(redis_url, "--run-file", str(run_file), expect_exit=2)
    assert "temperature must be a number" in result.stderr and redis_client.dbsize() == 0


def test_the_dry_run_shows_the_redis_memory_the_default_queue_depth_implies(redis_url, tmp_path):
    result = enqueue(redis_url, "--dry-run", f"d={write_prompts(tmp_path / 'p.jsonl', 20)}")
    assert "queues at --max-queue-depth" in result.stdout
    row = next(line for line in result.stdout.splitlines() if line.startswith("│ short"))
    cells = [cell.strip() for cell in row.strip("│").split("│")]
    assert cells[1] == "15,000" and cells[2].endswith("KiB") and cells[3].endswith("MiB"), cells


@pytest.mark.parametrize("upstream", ["ftp://gpu1:30000", "gpu1:30000", "localhost", "http://", "http://gpu1:port"])
def test_worker_refuses_an_upstream_that_is_not_an_http_url(upstream, monkeypatch):
    monkeypatch.delenv("GENFLEET_UPSTREAMS", raising=False)
    result = CliRunner().invoke(cli_app, ["worker", "--pool", "short", "--upstream", upstream,
                                          "--redis-url", f"redis://127.0.0.1:{free_port()}/0"])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith(f"error: --upstream {upstream!r}"), lines


def test_worker_refuses_a_zero_concurrency():
    result = CliRunner().invoke(cli_app, ["worker", "--pool", "short", "--upstream", "http://gpu1:30000",
                                          "--concurrency", "0"])
    assert result.exit_code == 2 and result.stderr == "error: --concurrency must be at least 1, got 0\n", result.output


@pytest.mark.parametrize(("variable", "value", "error"), [
    ("GENFLEET_REASONING_PARSER", "qwen4", "error: --reasoning-parser / GENFLEET_REASONING_PARSER: unknown reasoning "
                                           "parser 'qwen4'; choose one of "),
    ("GENFLEET_API", "bogus", "error: --api / GENFLEET_API: Input should be 'generate' or 'chat'"),
])
def test_worker_refuses_a_bad_setting_in_one_line_naming_its_flag_and_variable(variable, value, error, monkeypatch):
    # An unknown parser used to start a worker that failed every prompt's split; a bad API, a traceback.
    monkeypatch.setenv(variable, value)
    result = CliRunner().invoke(cli_app, ["worker", "--pool", "short", "--upstream", "http://gpu1:30000",
                                          "--redis-url", f"redis://127.0.0.1:{free_port()}/0"])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith(error), result.output


def status_of(redis_url: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "genfleet", "status", "--run", "r", "--redis-url", redis_url],
                            capture_output=True, text=True, timeout=60)
    return result, time.monotonic() - started


def test_status_fails_fast_with_one_line_when_redis_is_unreachable():
    refused, refused_s = status_of(f"redis://:hunter2@127.0.0.1:{free_port()}/0")
    # A host that takes the connection and never answers: the case that hung for 137 s.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        hung, hung_s = status_of(f"redis://127.0.0.1:{silent.getsockname()[1]}/0")
    for result, seconds in ((refused, refused_s), (hung, hung_s)):
        assert result.returncode == 1 and seconds < 10, (result.returncode, seconds)
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.startswith("error: Redis at redis://"), result.stderr
    assert "hunter2" not in refused.stderr and "Connection refused" in refused.stderr
