"""End to end against the simulator: the loop guard stops every planted loop and nothing else, and
`--samples` gives distinct, reproducible completions that a re-run does not enqueue again. The
continuation, regeneration and staged caps run on the task body in process
(tests/unit/test_task_policies.py)."""
from __future__ import annotations

import json
import statistics
from collections import defaultdict

from helpers.data import write_jsonl
from helpers.paths import TOKENIZER
from helpers.sim_in_process import parse_sim_args
from helpers.sim_process import SimProcess

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
    # A loop's slot is given back at once (/abort_request), where the server was still generating
    # it when the worker read the chunk that showed the loop. On a busy machine the worker may read
    # that chunk after the server already finished the completion: nothing is left to abort then.
    assert 0 < stats["aborted_requests"] <= len(looping)
    looped = [row for row in status["datasets"] if row["dataset"] == "l"][0]
    assert looped["looped"] == len(looping)


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
