"""End to end, every record equals what the simulated server says it generated (its own completion
log, not our prediction of it), in both stream modes and with the mode reported or not; a stream
corrupted on purpose is retried and never written."""
from __future__ import annotations

import json

import pytest
from helpers.data import read_jsonl, write_jsonl
from helpers.paths import TOKENIZER
from helpers.sim_in_process import parse_sim_args
from helpers.sim_process import SimProcess

from genfleet.common.reasoning import split_reasoning
from genfleet.producer.prompts import PromptTemplater
from genfleet.sim.vocab import SimVocab

MAX_LENGTH = 200
INTERVAL = 32
MAX_NEW_TOKENS = 10240  # the short partition's default


def prompts_covering_every_length(flags: tuple[str, ...]) -> list[list[int]]:
    """One prompt for each completion length 1..MAX_LENGTH, found with the simulator's own planner."""
    settings = parse_sim_args(flags)
    vocab = SimVocab.from_tokenizer_dir(TOKENIZER)
    templater = PromptTemplater(str(TOKENIZER), None)
    chosen: dict[int, int] = {}
    batch = 0
    while len(chosen) < MAX_LENGTH:
        numbers = range(batch * 500, (batch + 1) * 500)
        rendered = templater.render([[{"role": "user", "content": f"question {i}"}] for i in numbers])
        for number, ids in zip(numbers, rendered, strict=True):
            length = settings.plan(ids, vocab=vocab, max_new_tokens=MAX_NEW_TOKENS).completion_tokens
            chosen.setdefault(length, number)
        batch += 1
        assert batch < 20, f"only {len(chosen)} lengths found"
    return [chosen[length] for length in sorted(chosen)]


def write_dataset(path, numbers) -> None:
    write_jsonl(path, [{"id": f"q{n}", "prompt": f"question {n}"} for n in numbers])


def check_against_log(records: list[dict], log: list[dict]) -> None:
    """Each record's ids and text are those of a clean response in the server's log, byte for byte."""
    templater = PromptTemplater(str(TOKENIZER), None)
    clean = {tuple(line["input_ids"]): line for line in log if not line["faults"] and line["finish_reason"]}
    for record, ids in zip(records, templater.render([r["messages"] for r in records]), strict=True):
        line = clean[tuple(ids)]
        assert record["output_ids"] == line["output_ids"]
        assert record["usage"]["completion_tokens"] == line["completion_tokens"] == len(line["output_ids"])
        expected = split_reasoning(line["text"], "kimi_k2")
        assert (record["reasoning"], record["content"]) == (expected.reasoning, expected.content)
        marker = "</think>" if expected.closed else ""
        assert record["reasoning"] + marker + record["content"] == line["text"]


@pytest.mark.parametrize("mode", ["cumulative", "incremental", "incremental-unreported"])
def test_every_length_from_1_to_200_is_written_exactly_as_the_server_generated_it(mode, fleet, tmp_path):
    flags = ("--length-tokens", f"1:{MAX_LENGTH}", "--stream-interval", str(INTERVAL), "--spec-tokens", "3")
    numbers = prompts_covering_every_length(flags)
    log_path = tmp_path / "completions.jsonl"
    extra = {"cumulative": (), "incremental": ("--incremental",),
             "incremental-unreported": ("--incremental", "--no-server-info")}[mode]
    write_dataset(tmp_path / "lengths.jsonl", numbers)
    fleet.configure(tokenizer=TOKENIZER, stream_interval=INTERVAL)
    with SimProcess(*flags, *extra, "--rate", "5000", "--log-completions", str(log_path)) as sim:
        fleet.start_worker("short", sim.url)
        fleet.enqueue("lengths", f"lengths={tmp_path / 'lengths.jsonl'}", extra=("--keep-token-ids",))
        progress = fleet.wait_finished("lengths", timeout=180)

    totals = progress.totals()
    assert (totals.done, totals.failed, totals.integrity) == (MAX_LENGTH, 0, 0)
    log = read_jsonl(log_path)
    assert sorted(line["completion_tokens"] for line in log) == list(range(1, MAX_LENGTH + 1))
    records = fleet.records("lengths")
    assert len(records) == MAX_LENGTH
    check_against_log(records, log)


@pytest.mark.parametrize("corruption", [
    ("--miscount-rate", "0.5"),
    ("--incremental", "--drop-chunk-rate", "0.5"),
], ids=["final-count-off", "chunk-dropped"])
def test_a_corrupted_stream_is_counted_retried_and_never_written(corruption, fleet, tmp_path):
    log_path = tmp_path / "completions.jsonl"
    write_dataset(tmp_path / "c.jsonl", range(30))
    fleet.configure(tokenizer=TOKENIZER, max_attempts=30, retry_backoff_s=0.05, retry_backoff_max_s=0.2,
                    breaker_failures=1000)
    with SimProcess("--length-tokens", "100:160", "--rate", "5000", "--fault-seed", "7", *corruption,
                    "--log-completions", str(log_path)) as sim:
        fleet.start_worker("short", sim.url)
        fleet.enqueue("c", f"c={tmp_path / 'c.jsonl'}", extra=("--keep-token-ids",))
        progress = fleet.wait_finished("c", timeout=180)
        status = json.loads(fleet.genfleet("status", "--run", "c", "--json").stdout)

    log = read_jsonl(log_path)
    corrupted = sum(1 for line in log if line["faults"])
    totals = progress.totals()
    assert totals.integrity > 0 and (totals.done, totals.failed) == (30, 0)
    # Each corrupted response was one failed attempt, retried until a clean one came. The sim logs a
    # response only if the client read it to the end: a dropped chunk is caught at the next one,
    # and the client hangs up, so only a miscount (caught at the last chunk) is in the log each time.
    if "--miscount-rate" in corruption:
        assert totals.integrity == corrupted
    assert any("integrity check" in alarm for alarm in status["alarms"])
    records = fleet.records("c")
    assert len(records) == 30
    check_against_log(records, log)


def test_a_stream_that_is_always_corrupt_is_dead_lettered_as_integrity(fleet, tmp_path):
    write_dataset(tmp_path / "d.jsonl", range(3))
    fleet.configure(max_attempts=2, retry_backoff_s=0.05, retry_backoff_max_s=0.1, breaker_failures=1000)
    with SimProcess("--length-tokens", "40:60", "--rate", "5000", "--miscount-rate", "1") as sim:
        fleet.start_worker("short", sim.url)
        fleet.enqueue("d", f"d={tmp_path / 'd.jsonl'}")
        progress = fleet.wait_finished("d", timeout=120)
        failures = fleet.genfleet("failures", "--run", "d").stdout

    totals = progress.totals()
    assert (totals.done, totals.failed, totals.integrity) == (0, 3, 6)
    assert fleet.records("d") == []
    assert "integrity" in failures and "completion_tokens" in failures
