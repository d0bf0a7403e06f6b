"""`genfleet run`: a whole job on one box from one command, with real processes: the command itself,
its embedded redis-server, its two workers and producer, the simulator over HTTP, real shards.

Its output goes to a file (no terminal), so the plain progress lines are what it prints."""
from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from helpers.children import terminate
from helpers.data import write_jsonl, write_prompts
from helpers.paths import TOKENIZER
from helpers.sim_process import FAST_SIM, ONE_SECOND, SimProcess, free_port
from helpers.waits import wait_until

# Quick leases, so that prompts a killed job held come back within seconds of the next start.
QUICK_LEASES = {"GENFLEET_LEASE_TTL_S": "4", "GENFLEET_LEASE_HEARTBEAT_S": "1", "GENFLEET_REAPER_INTERVAL_S": "1",
                "GENFLEET_RETRY_BACKOFF_S": "0.5"}


class OneBox:
    """`genfleet run` in its own session (so the test can kill its whole process group), its output
    in a file; the job's output directory under `root`."""

    def __init__(self, root: Path, **env: str) -> None:
        self.root, self.out = root, root / "output"
        self.env = {key: value for key, value in os.environ.items() if not key.startswith("GENFLEET_")}
        self.env.update({"GENFLEET_METRICS_PORT": "0", "GENFLEET_MIN_FREE_DISK_MB": "16", **QUICK_LEASES, **env})
        self.process: subprocess.Popen | None = None
        self.log = root / "run-0.log"
        self.runs = 0

    def start(self, *args: str) -> subprocess.Popen:
        self.log = self.root / f"run-{self.runs}.log"
        self.runs += 1
        command = [sys.executable, "-m", "genfleet", "run", "--out", str(self.out), "--tokenizer", str(TOKENIZER),
                   "--progress-every", "1", *args]
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(command, cwd=self.root, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        return self.process

    def finish(self, *args: str, timeout: float = 120) -> tuple[int, str]:
        """Runs the command to its end; returns its exit status and output."""
        process = self.start(*args)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise AssertionError(f"genfleet run did not end within {timeout} s:\n{self.output()[-4000:]}") from None
        return process.returncode, self.output()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def records(self, run: str) -> list[dict]:
        return shard_records(self.out / run)

    def genfleet(self, *args: str) -> subprocess.CompletedProcess:
        """Another genfleet command on the same output directory, as a user runs it afterwards."""
        return subprocess.run([sys.executable, "-m", "genfleet", *args], cwd=self.root, capture_output=True,
                              text=True, timeout=120, env={**self.env, "GENFLEET_OUTPUT_DIR": str(self.out)})

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def shard_records(directory: Path) -> list[dict]:
    """Every whole record under `directory`, in sealed shards and open ones (`*.jsonl.open`), whose
    last line may still be being written."""
    records = []
    for path in sorted(directory.rglob("*.jsonl*")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                pass
    return records


PROGRESS = re.compile(r"^\d\d:\d\d:\d\d (?P<name>\S+): (?P<figures>[\d,]+/[\d,]+ done) \([\d.-]+%\) · .* · "
                      r"(?P<failed>[\d,]+ failed) · (?P<state>.+)$", re.MULTILINE)


def assert_progress_is_what_changed(output: str, sizes: dict[str, int]) -> None:
    """The plain progress of a whole run: a total line first at every interval, a dataset's line only
    where its figures moved since its last one, and its finished line once."""
    lines = [match.groupdict() for match in PROGRESS.finditer(output)]
    assert lines and lines[0]["name"] == "total", output
    totals = sum(line["name"] == "total" for line in lines)
    for name, size in sizes.items():
        own = [(line["figures"], line["failed"], line["state"]) for line in lines if line["name"] == name]
        assert own and all(a != b for a, b in itertools.pairwise(own)), (name, own)
        assert own.count((f"{size}/{size} done", "0 failed", "done")) == 1, (name, own)
        assert len(own) <= totals, (name, len(own), totals)


@pytest.fixture
def onebox(tmp_path):
    box = OneBox(tmp_path)
    yield box
    box.stop()


def exported_ids(box: OneBox, run: str) -> Counter:
    """`genfleet export` of the run (reaching its embedded Redis by itself): each id's count."""
    result = box.genfleet("export", "--run", run, "--from", str(box.out), "--out", str(box.root / f"export-{run}"),
                          "--format", "sharegpt")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = (box.root / f"export-{run}" / "all.jsonl").read_text().splitlines()
    return Counter(json.loads(line)["id"] for line in lines)


def test_defaults_too_long_for_a_4096_context_are_refused_then_the_corrected_command_runs(onebox, tmp_path):
    data = write_prompts(tmp_path / "q.jsonl", 30)
    with SimProcess(*FAST_SIM, "--context-length", "4096") as sim:
        status, output = onebox.finish("--run", "r", "--upstream", sim.url, f"q={data}")
        assert status == 1, output
        assert "every row was rejected (30)" in output and "--context-rule clip" in output, output
        assert sim.stats()["requests_started"] == 0

        # The corrected command, with a dataset pinned to the long queue: the long pool starts for it.
        pinned = write_prompts(tmp_path / "p.jsonl", 5)
        status, output = onebox.finish("--run", "r", "--upstream", sim.url, "--max-new-tokens", "256",
                                       "--export", "sharegpt", "--export-to", str(tmp_path / "export"), f"q={data}",
                                       f"p={pinned}:long")
    assert status == 0, output
    assert re.search(r"^\d\d:\d\d:\d\d q: 30/30 done \(100\.0%\) · .* req/min · .* tok/s · 0 failed · done$",
                     output, re.MULTILINE), output
    assert_progress_is_what_changed(output, {"q": 30, "p": 5})
    expected = {*(f"q/{i}" for i in range(30)), *(f"p/{i}" for i in range(5))}
    records = onebox.records("r")
    ids = Counter(record["id"] for record in records)
    assert set(ids) == expected and max(ids.values()) == 1
    assert {record["partition"] for record in records if record["id"].startswith("p/")} == {"long"}
    exported = (tmp_path / "export" / "all.jsonl").read_text().splitlines()
    assert Counter(json.loads(line)["id"] for line in exported) == Counter(dict.fromkeys(expected, 1))


def test_kill_9_of_the_whole_job_then_the_same_command_completes_and_generates_little_again(onebox, tmp_path):
    prompts = 40
    data = write_prompts(tmp_path / "k.jsonl", prompts)
    args = ("--run", "k", "--short-concurrency", "8", "--max-new-tokens", "64", f"k={data}")
    with SimProcess(*ONE_SECOND) as sim:
        process = onebox.start("--upstream", sim.url, *args)
        wait_until(lambda: len(onebox.records("k")) >= 8 and sim.stats()["running"] > 0, timeout=90,
                   message=lambda: onebox.output()[-3000:])
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        # The kernel stops the children (their parent died): nothing of the job keeps generating.
        wait_until(lambda: sim.stats()["running"] == 0, timeout=30, message="the job's streams did not stop")
        at_the_kill = sim.stats()
        # Every stream cut by the kill left the server as a disconnect (the job saw no other fault).
        in_flight, started_before = at_the_kill["requests_disconnected"], at_the_kill["requests_started"]
        assert in_flight > 0
        # A stream the server finished whose record was not yet fsynced is generated again too: it
        # was never durable. What was durable at the kill is never generated again.
        durable_at_the_kill = len(onebox.records("k"))
        status, output = onebox.finish("--upstream", sim.url, *args)
        generations = sim.stats()["requests_started"]
    assert status == 0, output
    assert "held by workers of an earlier job that did not stop" in output, output
    print(f"in flight at the kill: {in_flight}; durable: {durable_at_the_kill}; "
          f"generations: {started_before} before the re-run, {generations} in all")
    assert generations <= prompts + started_before - durable_at_the_kill
    assert exported_ids(onebox, "k") == Counter({f"k/{i}": 1 for i in range(prompts)})


def test_sigterm_stops_within_the_grace_and_the_same_command_resumes_with_nothing_lost(tmp_path):
    box = OneBox(tmp_path, GENFLEET_SHUTDOWN_GRACE_S="3")
    data = write_prompts(tmp_path / "t.jsonl", 30)
    args = ("--run", "t", "--short-concurrency", "6", "--max-new-tokens", "64", f"t={data}")
    try:
        with SimProcess(*ONE_SECOND) as sim:
            process = box.start("--upstream", sim.url, *args)
            wait_until(lambda: len(box.records("t")) >= 4 and sim.stats()["running"] > 0, timeout=90,
                       message=lambda: box.output()[-3000:])
            asked = time.monotonic()
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
            took = time.monotonic() - asked
            assert process.returncode == 128 + signal.SIGTERM, box.output()
            assert took <= 3 + 5, f"stopped in {took:.1f} s"
            assert "SIGTERM: stopping" in box.output()
            status, output = box.finish("--upstream", sim.url, *args)
        assert status == 0, output
        assert exported_ids(box, "t") == Counter({f"t/{i}": 1 for i in range(30)})
    finally:
        box.stop()


def test_a_worker_started_from_the_printed_listen_line_joins_and_takes_prompts(onebox, tmp_path):
    data = write_prompts(tmp_path / "l.jsonl", 60)
    port = free_port()
    joined: subprocess.Popen | None = None
    with SimProcess(*ONE_SECOND) as sim:
        process = onebox.start("--run", "l", "--upstream", sim.url, "--short-concurrency", "2", "--max-new-tokens",
                               "64", "--listen", f"127.0.0.1:{port}", f"l={data}")
        # The line as printed: `[VAR=value ...] genfleet worker --pool short ... --redis-url '...'`.
        found = wait_until(lambda: re.search(r"^  ((?:\w+=\S+ )*)genfleet (worker --pool short .*)$", onebox.output(),
                                             re.MULTILINE), timeout=60, message=lambda: onebox.output()[-3000:])
        variables, command = found.group(1), found.group(2)
        argv = shlex.split(command)
        remote = argv[argv.index("--redis-url") + 1]
        assert remote.startswith("redis://:") and remote.endswith(f"@127.0.0.1:{port}/0")
        assert argv[argv.index("--tokenizer") + 1] == str(TOKENIZER)  # the job's workers' flags, the same
        other_host = tmp_path / "other-host"
        env = {**onebox.env, **dict(word.split("=", 1) for word in shlex.split(variables)),
               "GENFLEET_OUTPUT_DIR": str(other_host)}
        try:
            joined = subprocess.Popen([sys.executable, "-m", "genfleet", *argv], cwd=tmp_path,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env)
            wait_until(lambda: shard_records(other_host), timeout=90, message="the joined worker wrote no record")
            process.wait(timeout=120)
        finally:
            terminate(joined)
    assert process.returncode == 0, onebox.output()
    here = {record["id"] for record in onebox.records("l")}
    there = {record["id"] for record in shard_records(other_host)}
    assert there and here | there == {f"l/{i}" for i in range(60)}


def test_a_dead_lettered_prompt_exits_1_and_names_the_requeue_command(onebox, tmp_path):
    rows = [{"prompt": f"short question {i}"} for i in range(8)] + [{"id": "poison", "prompt": "word " * 150}]
    data = write_jsonl(tmp_path / "p.jsonl", rows)
    # The producer is told a large context; the server's is small: the long prompt is refused there, for good.
    with SimProcess(*FAST_SIM, "--context-length", "100") as sim:
        status, output = onebox.finish("--run", "p", "--upstream", sim.url, "--context-length", "32768",
                                       "--max-new-tokens", "16", f"p={data}")
    assert status == 1, output
    assert "1 prompts failed" in output and "genfleet requeue --run p" in output, output
    failures = onebox.genfleet("failures", "--run", "p")
    assert failures.returncode == 0 and "permanent" in failures.stdout, failures.stdout + failures.stderr


def test_without_redis_server_on_path_it_says_how_to_get_it_and_exits_2(onebox, tmp_path):
    data = write_prompts(tmp_path / "m.jsonl", 3)
    onebox.env["PATH"] = str(tmp_path / "empty")
    status, output = onebox.finish("--run", "m", "--upstream", "http://127.0.0.1:9", f"m={data}")
    assert status == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and "redis-server is not on PATH" in lines[0] and "apt-get install redis-server" in lines[0]
