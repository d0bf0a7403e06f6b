"""`genfleet doctor` as an operator runs it before a long job, against a real redis-server, the
simulator over HTTP, the test model's tokenizer and a real output directory: the sample setup passes
(run as its own process, as on a host), and each broken part fails with its own row saying what to
change (run in this process: a second saved each)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from helpers.paths import REPO, TOKENIZER
from helpers.redis_server import RedisServer
from helpers.sim_process import free_port
from typer.testing import CliRunner

from genfleet.cli import app as cli_app

# What the sim/model template appends for a new turn, and the same turn with thinking off.
OPENS_REASONING = ("{%- if (thinking is defined and thinking is false) or (enable_thinking is defined and "
                   "enable_thinking is false) -%}<think></think>{%- else -%}<think>{%- endif -%}")
CLOSES_REASONING = "<think></think>"


@dataclass(frozen=True)
class Report:
    exit_code: int
    stdout: str
    stderr: str


def doctor(*args: str, redis_url: str, upstream: str, output_dir: Path, tokenizer: Path = TOKENIZER,
           expect_exit: int, process: bool = False) -> Report:
    """`genfleet doctor` with the sample setup's settings, `args` on top, and no GENFLEET_* from
    outside; in this process (a second each saved), or as its own `process`."""
    argv = ["doctor", "--redis-url", redis_url, "--upstream", upstream, "--tokenizer", str(tokenizer),
            "--output-dir", str(output_dir), *args]
    outside = [name for name in os.environ if name.startswith("GENFLEET_")]
    if process:
        env = {name: value for name, value in os.environ.items() if name not in outside}
        ran = subprocess.run([sys.executable, "-m", "genfleet", *argv], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=60)
        report = Report(ran.returncode, ran.stdout, ran.stderr)
    else:
        result = CliRunner().invoke(cli_app, argv, env=dict.fromkeys(outside))
        report = Report(result.exit_code, result.stdout, result.stderr)
    assert report.exit_code == expect_exit, report.stdout + report.stderr
    return report


def failures(result: Report) -> dict[str, dict[str, str]]:
    """The failed rows of a `--json` report, by check name."""
    report = json.loads(result.stdout)
    assert report["passed"] is False
    return {check["name"]: check for check in report["checks"] if check["status"] == "fail"}


@contextmanager
def dedicated_redis(directory: Path, *options: str) -> Iterator[str]:
    server = RedisServer(directory, *options)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def test_the_sample_setup_passes_with_one_row_per_check(sim, redis_url, tmp_path):
    result = doctor(redis_url=redis_url, upstream=sim.url, output_dir=tmp_path / "output", expect_exit=0,
                    process=True)
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in result.stdout.splitlines() if line.startswith("│") and line.split("│")[1].strip()}
    assert rows == {"Redis": "OK", "Redis durability": "OK", "Redis memory": "WARN", "clock vs Redis": "OK",
                    "output dir": "OK", "tokenizer": "OK", "templating": "OK", "chat template": "OK",
                    f"upstream {sim.url}": "OK", f"test generation {sim.url}": "OK"}, result.stdout
    assert "maxmemory 0" in result.stdout  # the session's Redis has no memory limit: a warning, not a failure
    assert "9 ok, 1 warnings, 0 failed" in result.stdout
    assert not any((tmp_path / "output").iterdir()), "the probe file was left behind"


def test_a_redis_that_evicts_keys_fails_with_the_config_to_set(sim, tmp_path):
    with dedicated_redis(tmp_path / "redis", "--appendonly", "yes", "--maxmemory-policy", "allkeys-lru") as url:
        result = doctor("--json", redis_url=url, upstream=sim.url, output_dir=tmp_path / "out", expect_exit=1)
    failed = failures(result)
    assert list(failed) == ["Redis durability"]
    assert "maxmemory-policy is allkeys-lru" in failed["Redis durability"]["detail"]
    assert failed["Redis durability"]["fix"].startswith("CONFIG SET maxmemory-policy noeviction")


def test_a_redis_without_aof_fails_with_the_config_to_set(sim, tmp_path):
    with dedicated_redis(tmp_path / "redis") as url:  # noeviction, AOF off
        result = doctor("--json", redis_url=url, upstream=sim.url, output_dir=tmp_path / "out", expect_exit=1)
    failed = failures(result)
    assert list(failed) == ["Redis durability"]
    assert "without AOF" in failed["Redis durability"]["detail"]
    assert failed["Redis durability"]["fix"].startswith("CONFIG SET appendonly yes")


def test_a_redis_too_small_for_the_queues_fails_with_the_memory_they_need(sim, tmp_path):
    with dedicated_redis(tmp_path / "redis", "--appendonly", "yes", "--maxmemory", "20mb") as url:
        result = doctor("--json", "--max-queue-depth", "1000", redis_url=url, upstream=sim.url,
                        output_dir=tmp_path / "out", expect_exit=1)
    failed = failures(result)
    assert list(failed) == ["Redis memory"]
    # 2 x 1,000 prompts x (1,385 B + 13.9 B x 6,144 tokens in the long queue; 2,048 in the short) = 0.11 GiB
    assert "queues need 0.11 GiB (1,000 short x 2,048 tokens, 1,000 long x 6,144 tokens)" in \
        failed["Redis memory"]["detail"]
    assert "or a lower --max-queue-depth" in failed["Redis memory"]["fix"]


def test_a_dead_upstream_fails_and_no_generation_is_tried(sim, redis_url, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    result = doctor("--upstream", sim.url, redis_url=redis_url, upstream=dead, output_dir=tmp_path / "out",
                    expect_exit=1)
    assert f"upstream {dead}" in result.stdout and "unreachable" in result.stdout
    assert "start the server (SGLang or vLLM) there, or fix --upstream" in result.stdout
    assert f"test generation {dead}" not in result.stdout
    assert f"test generation {sim.url}" in result.stdout  # the live host is still checked
    assert "1 failed" in result.stdout


def test_a_chat_template_that_closes_reasoning_fails_the_template_and_the_generation(sim, redis_url, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(TOKENIZER, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    assert OPENS_REASONING in config["chat_template"]
    config["chat_template"] = config["chat_template"].replace(OPENS_REASONING, CLOSES_REASONING)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    result = doctor("--json", redis_url=redis_url, upstream=sim.url, output_dir=tmp_path / "out", tokenizer=model,
                    expect_exit=1)
    failed = failures(result)
    assert list(failed) == ["chat template", f"test generation {sim.url}"]
    assert "closes reasoning (<think>...</think>) before the model starts" in failed["chat template"]["detail"]
    assert failed["chat template"]["fix"].startswith("use the model's own chat template")
    # The simulated model, told not to think, answered at once: parser kimi_k2 took the answer for reasoning.
    assert "neither the prompt nor the model opened reasoning (<think>), so parser kimi_k2 filed the answer as " \
           "reasoning" in failed[f"test generation {sim.url}"]["detail"]


def test_an_output_dir_that_cannot_be_created_fails(sim, redis_url, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")  # root writes anywhere a mode allows: a file is what blocks it
    result = doctor("--json", redis_url=redis_url, upstream=sim.url, output_dir=blocker / "output", expect_exit=1)
    failed = failures(result)
    assert list(failed) == ["output dir"]
    assert failed["output dir"]["detail"] == f"{blocker / 'output'}: cannot write a file there: Not a directory"
    assert "GENFLEET_OUTPUT_DIR" in failed["output dir"]["fix"]


def test_a_bad_flag_is_one_line_naming_it(sim, redis_url, tmp_path):
    result = doctor("--reasoning-parser", "thinky", redis_url=redis_url, upstream=sim.url,
                    output_dir=tmp_path / "out", expect_exit=2)
    assert result.stderr.strip().splitlines() == [
        "error: --reasoning-parser / GENFLEET_REASONING_PARSER: unknown reasoning parser 'thinky'; choose one of "
        "kimi_k2, deepseek-r1, qwen3, qwen3-thinking, glm45, kimi, gpt-oss, none"]
