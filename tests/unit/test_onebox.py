"""`genfleet run`'s parts that need no job: the enqueue options handed on as the same flags, the
embedded Redis (a real redis-server), `--listen`, and the producer's word when nothing is accepted."""
from __future__ import annotations

import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
import typer
from helpers.redis_server import observer
from helpers.waits import wait_until
from hypothesis import given, settings
from hypothesis import strategies as st

from genfleet.common.run_state import RowRejection, RunManifest, RunState
from genfleet.onebox.command import ENQUEUE_OPTIONS_LEFT_OUT, enqueue_arguments, run_command
from genfleet.onebox.embedded_redis import EmbeddedRedis, EmbeddedRedisError, Listen, reach_redis
from genfleet.producer.command import enqueue_command, nothing_accepted
from genfleet.producer.enqueue_report import DatasetReport


def _enqueue_click_command():
    app = typer.Typer()
    app.command()(enqueue_command)
    return typer.main.get_command(app)


ENQUEUE = _enqueue_click_command()
PARAMS = {param.name: param for param in ENQUEUE.params}

text = st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="-"), min_size=1, max_size=12)
VALUES = {
    "datasets": st.lists(st.builds(lambda a, b: f"{a}={b}.jsonl", text, text), min_size=1, max_size=3),
    "run": text, "tokenizer": text, "max_new_tokens_short": st.integers(1, 10**6),
    "max_new_tokens": st.integers(1, 10**6), "temperature": st.floats(0, 2, allow_nan=False),
    "top_k": st.integers(-1, 100), "seed": st.integers(0, 2**31), "context_rule": st.sampled_from(["reserve", "clip"]),
    "thinking": st.booleans(), "keep_token_ids": st.booleans(),
    "sampling": st.lists(st.builds(lambda k, v: f"{k}={v}", text, text), min_size=1, max_size=3),
    "first_max_new_tokens": st.sampled_from(["auto", "512"]), "samples": st.integers(1, 8),
}


@settings(max_examples=150, deadline=None)
@given(st.fixed_dictionaries({}, optional=VALUES))
def test_enqueue_arguments_parse_back_to_the_same_values(values):
    argv = enqueue_arguments(values)
    parsed = ENQUEUE.make_context("enqueue", list(argv)).params
    for name, value in values.items():
        expected = tuple(value) if isinstance(value, list) else value
        got = tuple(parsed[name]) if isinstance(parsed[name], (list, tuple)) else parsed[name]
        assert got == expected, (name, argv)
    for name, value in parsed.items():
        if name not in values:
            assert value in (PARAMS[name].default, None, (), []), (name, argv)


def test_run_takes_every_enqueue_option_but_those_a_job_owns():
    import inspect

    run = set(inspect.signature(run_command).parameters)
    enqueue = set(inspect.signature(enqueue_command).parameters)
    assert enqueue - run == set(ENQUEUE_OPTIONS_LEFT_OUT)
    assert {"upstream", "out", "listen", "short_concurrency", "long_concurrency", "export"} <= run


@pytest.mark.parametrize("text, listen", [("0.0.0.0:6390", Listen("0.0.0.0", 6390)),
                                          ("10.1.2.3:7000", Listen("10.1.2.3", 7000)),
                                          ("[::]:6379", Listen("::", 6379))])
def test_listen_reads_address_and_port(text, listen):
    assert Listen.parse(text) == listen


@pytest.mark.parametrize("text", ["6379", ":6379", "host:", "host:0", "host:70000", "host:port"])
def test_a_bad_listen_says_what_it_expects(text):
    with pytest.raises(ValueError, match="expected ADDR:PORT"):
        Listen.parse(text)


@contextmanager
def started(directory: Path) -> Iterator[redis.Redis]:
    """The embedded Redis of the output directory `directory`, started, and a client of it; stopped
    on the way out."""
    embedded = EmbeddedRedis(directory)
    endpoint = embedded.start()
    try:
        yield observer(embedded.url(endpoint))
    finally:
        embedded.stop()


def test_the_embedded_redis_keeps_its_password_private_and_its_data_across_restarts(tmp_path):
    first = EmbeddedRedis(tmp_path / "out")
    endpoint = first.start()
    try:
        for name in ("password", "redis.conf"):
            mode = stat.S_IMODE((first.directory / name).stat().st_mode)
            assert mode == 0o600, (name, oct(mode))
        assert first.password() not in " ".join(first.process.args)  # not on the command line
        client = observer(first.url(endpoint))
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=endpoint.port).ping()
        client.set("kept", "yes")
        # A second starter finds it running and uses it, owning nothing.
        second = EmbeddedRedis(tmp_path / "out")
        assert second.start() == endpoint and second.process is None
        second.stop()  # it started nothing, and the first still uses it
        assert first.running() == endpoint
    finally:
        first.stop()
    assert first.running() is None and not (first.directory / "endpoint.json").exists()

    with started(tmp_path / "out") as client:
        assert client.get("kept") == b"yes"


def test_commands_reach_the_embedded_redis_unless_one_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("GENFLEET_REDIS_URL", raising=False)
    monkeypatch.setenv("GENFLEET_OUTPUT_DIR", str(tmp_path / "out"))
    with reach_redis(None) as url:
        assert url == "redis://127.0.0.1:6379/0"  # no job here yet: the default
    embedded = EmbeddedRedis(tmp_path / "out")
    embedded.start()
    embedded.stop()
    with reach_redis(None) as url:  # not running: started for the command, stopped after it
        assert observer(url).ping()
        assert embedded.running() is not None
    assert embedded.running() is None
    with reach_redis("redis://elsewhere:1/0") as url:
        assert url == "redis://elsewhere:1/0"
    monkeypatch.setenv("GENFLEET_REDIS_URL", "redis://named:2/0")
    with reach_redis(None) as url:
        assert url == "redis://named:2/0"


def test_an_unpublished_runs_config_gives_way_and_a_published_ones_stays(redis_client):
    manifest = RunManifest(redis_client, "r")
    manifest.record({"config": "{}"}, ["d"])
    RunState(redis_client, "r").count("d", "rejected", 5)
    assert manifest.forget_if_unpublished() and manifest.fields() == {} and manifest.datasets() == []

    manifest.record({"config": "{}"}, ["d"])
    RunState(redis_client, "r").count("d", "total", 1)
    assert not manifest.forget_if_unpublished() and manifest.datasets() == ["d"]


def _report(name: str, rejected: list[str], enqueued: int = 0) -> DatasetReport:
    report = DatasetReport(name, "r")
    report.enqueued["short"] = enqueued
    for row, reason in enumerate(rejected):
        report.reject(RowRejection(row, Path("f.jsonl"), row + 1, reason), reason.split(":")[0])
    return report


def test_a_dataset_with_every_row_too_long_names_the_fix():
    too_long = "prompt too long: 35 prompt tokens + 10240 max new tokens > context length 4096"
    lines = nothing_accepted([_report("a", [too_long] * 3), _report("b", [too_long], enqueued=2),
                              _report("c", ["invalid JSON: x"])])
    assert len(lines) == 2
    assert lines[0].startswith("a: every row was rejected (3); 3 too long") and "--context-rule clip" in lines[0]
    assert lines[0].count("--max-new-tokens-short") == 1
    assert lines[1] == "c: every row was rejected (1); the reasons are above"


def test_the_last_command_using_the_embedded_redis_stops_it_whoever_started_it(tmp_path):
    watcher = EmbeddedRedis(tmp_path / "out")  # e.g. `status --watch`, before the job
    endpoint = watcher.start(on_parent_death=None)
    job = EmbeddedRedis(tmp_path / "out")
    assert job.start() == endpoint and job.process is None
    watcher.stop()  # the watcher leaves first: the job still uses it
    assert job.running() == endpoint
    job.stop()  # the last user out stops it, though another started it
    assert job.running() is None


def test_one_job_per_output_directory(tmp_path):
    first, second = EmbeddedRedis(tmp_path / "out"), EmbeddedRedis(tmp_path / "out")
    held = first.claim_job()
    assert held is not None and second.claim_job() is None
    held.close()
    assert second.claim_job() is not None


def test_a_listen_port_taken_by_another_server_fails_with_its_log_named(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        embedded = EmbeddedRedis(tmp_path / "out")
        with pytest.raises(EmbeddedRedisError, match=r"redis-server exited .*redis\.log"):
            embedded.start(Listen("127.0.0.1", taken.getsockname()[1]))


def test_an_ipv6_address_goes_in_brackets_in_the_url(tmp_path):
    from genfleet.onebox.embedded_redis import Endpoint

    embedded = EmbeddedRedis(tmp_path / "out")
    url = embedded.url(Endpoint("127.0.0.1", 6390, 1, None), host="::1")
    assert url.endswith("@[::1]:6390/0")
    assert observer(url).connection_pool.connection_kwargs["host"] == "::1"


def test_a_run_this_redis_has_never_seen_is_not_finished(redis_client):
    from genfleet.status.read_model import read_progress

    assert not read_progress(redis_client, "never-enqueued").finished


def test_a_start_returns_once_the_aof_is_loaded(tmp_path, monkeypatch):
    # A large AOF takes seconds to load, and meanwhile the server answers CONFIG and INFO but
    # fails every data command with LOADING. redis' own test knobs make a small one load slowly
    # (`key-load-delay`, microseconds per key; `loading-process-events-interval-bytes`: answer
    # clients during the load), hidden configs of redis 7 `src/config.c`.
    write_config = EmbeddedRedis._write_config

    def slow_to_load(self: EmbeddedRedis, port: int, listen: Listen | None) -> None:
        write_config(self, port, listen)
        with open(self.directory / "redis.conf", "a") as conf:
            conf.write("key-load-delay 100\nloading-process-events-interval-bytes 1024\n")

    monkeypatch.setattr(EmbeddedRedis, "_write_config", slow_to_load)
    with started(tmp_path / "out") as client:
        client.mset({f"key-{i}": i for i in range(10_000)})  # ~1 s of loading
        # Into the AOF's base file (an RDB), whose keys are loaded one by one, each delayed.
        client.bgrewriteaof()
        wait_until(lambda: client.info("persistence")["aof_rewrite_in_progress"] == 0
                   and client.info("persistence")["aof_rewrite_scheduled"] == 0, 30, 0.05, "no AOF rewrite")

    with started(tmp_path / "out") as client:
        assert client.get("key-9999") == b"9999"
