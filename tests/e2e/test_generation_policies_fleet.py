"""End to end against the simulator: the loop guard stops every planted loop and nothing else, a cut
completion continued on the long queue is exactly the server's two parts joined, and `--samples`
gives distinct, reproducible completions that a re-run does not enqueue again."""
from __future__ import annotations

import json
import statistics
from collections import defaultdict

from helpers.data import read_jsonl, write_jsonl
from helpers.paths import TOKENIZER
from helpers.sim_in_process import parse_sim_args
from helpers.sim_process import SimProcess

from genfleet.common.reasoning import split_reasoning
from genfleet.producer.prompts import PromptTemplater
from genfleet.sim.vocab import SimVocab

LOOP_FLAGS = ("--length-tokens", "100:900", "--loop-rate", "0.1", "--loop-period", "5:40",
              "--stream-interval", "8")
SHORT_CAP = 2048
# The bound: a loop is stopped within this many tokens of where its repetition starts.
MAX_OVERRUN = 600


def write_dataset(path, count: int, prefix: str = "question") -> list[list[dict]]:
    write_jsonl(path, [{"id": f"q{n}", "prompt": f"{prefix} {n}"} for n in range(count)])
    return [[{"role": "user", "content": f"{prefix} {n}"}] for n in range(count)]


def planned(flags: tuple[str, ...], conversations: list[list[dict]], max_new_tokens: int,
            seeds: list[int | None] | None = None) -> list:
    settings = parse_sim_args(flags)
    vocab = SimVocab.from_tokenizer_dir(TOKENIZER)
    rendered = PromptTemplater(str(TOKENIZER), None).render(conversations)
    seeds = seeds or [None] * len(rendered)
    return [settings.plan(ids, vocab=vocab, seed=seed, max_new_tokens=max_new_tokens)
            for ids, seed in zip(rendered, seeds, strict=True)]


def test_every_loop_is_stopped_soon_after_it_starts_and_nothing_else_is_flagged(fleet, tmp_path, capsys):
    conversations = write_dataset(tmp_path / "l.jsonl", 200)
    plans = planned(LOOP_FLAGS, conversations, SHORT_CAP)
    looping = {f"l/q{n}": plan for n, plan in enumerate(plans) if plan.loop_start is not None}
    assert 8 <= len(looping) <= 40, "the workload plants about 10% loops"
    fleet.configure(tokenizer=TOKENIZER, stream_interval=8, max_new_tokens_short=SHORT_CAP)
    with SimProcess(*LOOP_FLAGS, "--rate", "3000") as sim:
        fleet.start_worker("short", sim.url)
        fleet.enqueue("l", f"l={tmp_path / 'l.jsonl'}", extra=("--keep-token-ids",))
        progress = fleet.wait_finished("l", timeout=240)
        stats = sim.stats()
        status = json.loads(fleet.genfleet("status", "--run", "l", "--json").stdout)

    records = {record["id"]: record for record in fleet.records("l")}
    assert len(records) == 200 and progress.totals().failed == 0
    flagged = {rid for rid, record in records.items() if record["finish_reason"] == "loop"}
    assert flagged == set(looping), "every planted loop stopped, no other completion flagged"
    overruns = []
    for rid, plan in looping.items():
        record = records[rid]
        loop = record["loop"]
        assert plan.loop_period % loop["period"] == 0  # the period, or a divisor of it
        overruns.append(loop["at_token"] - plan.loop_start)
        assert 0 < overruns[-1] <= MAX_OVERRUN, (rid, loop, plan.loop_start)
        # The record holds the partial completion exactly as generated, up to the cut.
        assert record["output_ids"] == plan.output_ids[:len(record["output_ids"])]
        assert len(record["output_ids"]) == record["usage"]["completion_tokens"] >= loop["at_token"]
    with capsys.disabled():
        print(f"\nloop guard: {len(looping)} loops of 200, overrun past the repetition's start: "
              f"median {statistics.median(overruns):.0f}, max {max(overruns)} tokens")
    # Each loop's slot was given back through /abort_request, not 2 s later by the disconnect.
    assert stats["aborted_requests"] == len(looping)
    looped = [row for row in status["datasets"] if row["dataset"] == "l"][0]
    assert looped["looped"] == len(looping)


def test_a_cut_completion_continued_on_the_long_queue_is_the_two_parts_joined_byte_for_byte(fleet, tmp_path):
    flags = ("--length-tokens", "300:400", "--stream-interval", "16")
    conversations = write_dataset(tmp_path / "c.jsonl", 20)
    log_path = tmp_path / "completions.jsonl"
    fleet.configure(tokenizer=TOKENIZER, stream_interval=16)
    with SimProcess(*flags, "--rate", "5000", "--log-completions", str(log_path)) as sim:
        fleet.start_worker("short", sim.url)
        fleet.start_worker("long", sim.url)
        fleet.enqueue("c", f"c={tmp_path / 'c.jsonl'}", extra=(
            "--keep-token-ids", "--max-new-tokens-short", "128", "--max-new-tokens-long", "1000",
            "--on-truncated", "continue"))
        progress = fleet.wait_finished("c", timeout=180)

    assert (progress.totals().done, progress.totals().failed) == (20, 0)
    log = read_jsonl(log_path)
    by_input = {tuple(line["input_ids"]): line for line in log}
    rendered = PromptTemplater(str(TOKENIZER), None).render(conversations)
    longer = planned(flags, conversations, 1000)
    for n, ids in enumerate(rendered):
        record = next(r for r in fleet.records("c") if r["id"] == f"c/q{n}")
        first = by_input[tuple(ids)]
        assert first["finish_reason"]["type"] == "length" and len(first["output_ids"]) == 128
        second = by_input[tuple(ids + first["output_ids"])]
        assert second["continues"] == first["rid"]
        assert record["output_ids"] == first["output_ids"] + second["output_ids"]
        assert record["continued"] == 1 and record["finish_reason"] == "stop"
        split = split_reasoning(first["text"] + second["text"], "kimi_k2")
        marker = "</think>" if split.closed else ""
        assert record["reasoning"] + marker + record["content"] == first["text"] + second["text"]
        # Statistically the same as asking the larger budget at once: here, the very same completion.
        assert record["output_ids"] == longer[n].output_ids
        assert record["partition"] == "long" and record["usage"]["completion_tokens"] == len(record["output_ids"])


def test_regenerate_asks_again_from_scratch_with_the_larger_budget(fleet, tmp_path):
    conversations = write_dataset(tmp_path / "r.jsonl", 10)
    log_path = tmp_path / "completions.jsonl"
    with SimProcess("--length-tokens", "300:400", "--rate", "5000", "--log-completions", str(log_path)) as sim:
        fleet.start_worker("short", sim.url)
        fleet.start_worker("long", sim.url)
        fleet.enqueue("r", f"r={tmp_path / 'r.jsonl'}", extra=(
            "--max-new-tokens-short", "128", "--max-new-tokens-long", "1000", "--on-truncated", "regenerate"))
        fleet.wait_finished("r", timeout=180)

    rendered = {tuple(ids) for ids in PromptTemplater(str(TOKENIZER), None).render(conversations)}
    log = read_jsonl(log_path)
    assert len(log) == 20 and {tuple(line["input_ids"]) for line in log} == rendered
    assert sorted(line["completion_tokens"] for line in log)[:10] == [128] * 10
    records = fleet.records("r")
    assert len(records) == 10 and all(r["regenerated"] and r["finish_reason"] == "stop" for r in records)


def test_samples_are_distinct_reproducible_and_enqueued_once(fleet, tmp_path):
    write_dataset(tmp_path / "s.jsonl", 15)
    with SimProcess("--length-tokens", "20:80", "--rate", "5000") as sim:
        fleet.start_worker("short", sim.url)
        for run in ("s1", "s2"):
            fleet.enqueue(run, f"s={tmp_path / 's.jsonl'}", extra=("--samples", "4", "--keep-token-ids"))
            fleet.wait_finished(run, timeout=180)
        # Re-running the same enqueue publishes nothing: every sample's slot is done.
        fleet.enqueue("s1", f"s={tmp_path / 's.jsonl'}", extra=("--samples", "4", "--keep-token-ids"))
        assert fleet.progress("s1").totals().total == 60 and fleet.redis.llen("short") == 0
    completions: dict[str, dict[str, list[int]]] = {"s1": {}, "s2": {}}
    for run in completions:
        for record in fleet.records(run):
            completions[run][record["id"]] = record["output_ids"]
    assert len(completions["s1"]) == 60
    assert completions["s1"] == completions["s2"], "the same run file asks the same seeds again"
    per_prompt = defaultdict(set)
    for rid, ids in completions["s1"].items():
        prompt, _, k = rid.rpartition("#")
        per_prompt[prompt].add(tuple(ids))
        assert k in {"0", "1", "2", "3"}
    assert len(per_prompt) == 15 and all(len(distinct) == 4 for distinct in per_prompt.values())


def test_staged_first_caps_give_the_completions_of_the_full_cap_asked_at_once(fleet, tmp_path):
    """`--first-max-new-tokens auto`, still at its start value: every first request asks 64 new
    tokens; those cut there go on in their own queue to the real cap, and each record is the sim's
    completion for the full cap, whichever way it was reached."""
    flags = ("--length-tokens", "20:300", "--stream-interval", "8")
    conversations = write_dataset(tmp_path / "s.jsonl", 24)
    log_path = tmp_path / "completions.jsonl"
    fleet.configure(tokenizer=TOKENIZER, stream_interval=8, first_cap_start=64, first_cap_min_samples=1000)
    with SimProcess(*flags, "--rate", "5000", "--log-completions", str(log_path)) as sim:
        fleet.start_worker("short", sim.url)
        fleet.enqueue("s", f"s={tmp_path / 's.jsonl'}", extra=(
            "--keep-token-ids", "--max-new-tokens-short", "250", "--first-max-new-tokens", "auto"))
        progress = fleet.wait_finished("s", timeout=180)

    assert (progress.totals().done, progress.totals().failed) == (24, 0)
    full = planned(flags, conversations, 250)
    rendered = PromptTemplater(str(TOKENIZER), None).render(conversations)
    first_requests = {tuple(line["input_ids"]): line for line in read_jsonl(log_path)}
    records = {r["id"]: r for r in fleet.records("s")}
    assert len(records) == 24
    for n, ids in enumerate(rendered):
        record, expected = records[f"s/q{n}"], full[n]
        assert record["output_ids"] == expected.output_ids
        assert record["finish_reason"] == ("length" if len(expected.output_ids) == 250 else "stop")
        first = first_requests[tuple(ids)]
        assert len(first["output_ids"]) == min(64, len(expected.output_ids))
        assert record.get("continued") == (1 if len(expected.output_ids) > 64 else None)
        assert record["partition"] == "short"
    assert 0 < sum(1 for r in records.values() if r.get("continued")) < 24  # both kinds were there
