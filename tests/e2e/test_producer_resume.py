"""Enqueue once, whatever happens: a producer SIGKILLed half-way, duplicate ids in the input, a re-run
with another config, a queue held at --max-queue-depth, and a dry run that touches nothing."""
import json
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter

from helpers.data import write_jsonl
from helpers.paths import REPO, TOKENIZER
from helpers.producer_cli import all_payloads, decode_message, enqueue, queued_ids, queued_payloads, table_rows
from helpers.waits import wait_until

from genfleet.common.keys import ManifestFields
from genfleet.common.run_state import RunState


def genfleet_enqueue(redis_url, *args):
    return [sys.executable, "-m", "genfleet", "enqueue", "--redis-url", redis_url, "--tokenizer", str(TOKENIZER),
            *args]


def test_producer_sigkilled_half_way_then_rerun_enqueues_every_prompt_exactly_once(redis_url, redis_client,
                                                                                   tmp_path):
    total = 20_000
    data = write_jsonl(tmp_path / "big.jsonl", [{"prompt": f"question number {i}"} for i in range(total)])
    # No workers drain the queue: without a depth limit, or the default one would hold the re-run.
    command = genfleet_enqueue(redis_url, "--run", "kill", "--batch-size", "50", "--max-queue-depth", "0",
                               f"big={data}")
    producer = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def a_fifth_queued() -> bool:
        if redis_client.llen("short") >= total // 5:
            return True
        assert producer.poll() is None, producer.stderr.read().decode()
        return False

    wait_until(a_fifth_queued, timeout=60, interval=0.002, message="the producer never got going")
    producer.send_signal(signal.SIGKILL)
    producer.wait(timeout=10)
    producer.stderr.close()
    at_kill = redis_client.llen("short")
    assert total // 5 <= at_kill < total, "killed too late to test anything"

    rerun = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert rerun.returncode == 0, rerun.stderr
    ids = queued_ids(redis_client)
    assert set(ids) == {f"big/{i}" for i in range(total)}
    assert max(ids.values()) == 1, [i for i, n in ids.items() if n > 1][:5]
    assert RunState(redis_client, "kill").counters("big")["total"] == total
    # The re-run published exactly the rest and says so.
    _dataset, short, _long, already_queued, *_ = next(r for r in table_rows(rerun.stdout) if r[0] == "big")
    assert (short, already_queued) == (f"{total - at_kill:,}", f"{at_kill:,}")


def test_duplicate_ids_are_reported_and_only_the_first_is_enqueued(redis_url, redis_client, tmp_path):
    rows = [{"id": i, "prompt": f"p{n}"} for n, i in enumerate(["a", "b", "a", "c", "b"])]
    data = write_jsonl(tmp_path / "dup.jsonl", rows)
    result = enqueue(redis_url, f"d={data}", run="dup")
    assert f"{data}:3: duplicate id 'a'" in result.stderr and f"{data}:5: duplicate id 'b'" in result.stderr
    payloads = all_payloads(redis_client)
    assert {k: v["messages"][0]["content"] for k, v in payloads.items()} == {"d/a": "p0", "d/b": "p1", "d/c": "p3"}
    assert "duplicates" in result.stdout and RunState(redis_client, "dup").counters("d")["rejected"] == 2
    again = enqueue(redis_url, f"d={data}", run="dup")
    assert redis_client.llen("short") == 3 and RunState(redis_client, "dup").counters("d")["rejected"] == 2
    assert f"{data}:3: duplicate id 'a'" in again.stderr


def test_a_changed_config_is_refused_and_new_run_enqueues_into_a_fresh_named_run(redis_url, redis_client, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"q{i}"} for i in range(4)])
    enqueue(redis_url, f"d={data}", "--temperature", "0.5", run="cfg")
    assert redis_client.llen("short") == 4

    refused = enqueue(redis_url, f"d={data}", "--temperature", "0.7", run="cfg", expect_exit=2)
    assert "d.sampling.temperature: was 0.5, now 0.7" in refused.stderr and "--new-run" in refused.stderr
    assert redis_client.llen("short") == 4
    # Another model (here: another chat template) is refused too.
    other_model = tmp_path / "model"
    shutil.copytree(TOKENIZER, other_model)
    config = json.loads((other_model / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ 'changed' }}" + config["chat_template"]
    (other_model / "tokenizer_config.json").write_text(json.dumps(config))
    refused = enqueue(redis_url, f"d={data}", "--temperature", "0.5", "--tokenizer", str(other_model), run="cfg",
                      expect_exit=2)
    assert "tokenizer: was" in refused.stderr

    accepted = enqueue(redis_url, f"d={data}", "--temperature", "0.7", "--new-run", run="cfg")
    fresh = RunState(redis_client, "cfg").manifest()[ManifestFields.SUCCESSOR]
    assert fresh.startswith("cfg-cfg") and fresh in accepted.stderr
    runs = Counter((p["run"], p["sampling"]["temperature"])
                   for p in queued_payloads(redis_client, "short") + queued_payloads(redis_client, "long"))
    assert runs == {("cfg", 0.5): 4, (fresh, 0.7): 4}
    assert RunState(redis_client, fresh).manifest()[ManifestFields.PREDECESSOR] == "cfg"
    # The same command again resumes that fresh run: nothing new.
    enqueue(redis_url, f"d={data}", "--temperature", "0.7", "--new-run", run="cfg")
    assert redis_client.llen("short") == 8
    # Options that only select prompts may change without a new run.
    enqueue(redis_url, f"d={data}", "--temperature", "0.5", "--max-prompts", "2", "--long-threshold", "9999",
            run="cfg")


def test_max_queue_depth_holds_the_queue_at_n_while_a_consumer_drains_it(redis_url, redis_client, tmp_path):
    total, depth = 600, 50
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"q{i}"} for i in range(total)])
    command = genfleet_enqueue(redis_url, "--run", "bp", "--batch-size", "128", "--max-queue-depth", str(depth),
                               f"d={data}")
    producer = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    consumed, deepest = Counter(), 0
    while producer.poll() is None or redis_client.llen("short"):
        deepest = max(deepest, redis_client.llen("short"))
        raw = redis_client.rpop("short")
        if raw is not None:
            consumed[decode_message(raw)["id"]] += 1
        time.sleep(0.002)  # a slow worker fleet
    _stdout, stderr = producer.communicate()
    assert producer.returncode == 0, stderr
    assert depth - 5 <= deepest <= depth  # filled up to N, never beyond
    assert consumed == Counter({f"d/{i}": 1 for i in range(total)})
    assert f"waiting: queue short is {depth} deep (--max-queue-depth {depth})" in stderr


def test_dry_run_publishes_nothing_and_reports_prompts_rejections_tokens_and_memory(redis_url, redis_client,
                                                                                   tmp_path):
    rows = [{"prompt": "a short one"}, {"prompt": " ".join(["word"] * 400)}, '{"broken',
            {"messages": [{"role": "assistant", "content": "x"}]}, {"prompt": "another short one"}]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    result = enqueue(redis_url, f"d={data}", "--dry-run", "--long-threshold", "300", "--max-new-tokens-short", "100",
                     run="dry")
    assert redis_client.dbsize() == 0
    out = result.stdout
    assert "dry run: nothing was published" in out
    rows = {(cells[0], cells[1]): cells[2:] for cells in table_rows(out) if len(cells) == 9}
    # dataset, partition → prompts, min, median, mean, p99, max prompt tokens, queue memory
    short, long = rows[("d", "short")], rows[("d", "long")]
    assert short[0] == "2" and int(short[1]) <= int(short[2]) <= int(short[5]) and short[6].endswith("KiB")
    assert long[0] == "1" and int(long[1]) > 300 - 100
    rejected = {cells[1]: cells[2] for cells in table_rows(out) if len(cells) == 4}
    assert rejected["invalid JSON"] == "1" and rejected["no user turn"] == "1"


def test_dry_run_memory_estimate_is_close_to_what_redis_spends(redis_url, redis_client, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"question {i} " + "word " * (i % 30)} for i in range(3000)])
    from genfleet.common.settings import Settings
    from genfleet.producer.enqueue import enqueue_dataset
    from genfleet.producer.enqueue_report import DryRunDestination, queue_memory_bytes
    from genfleet.producer.prompts import PromptTemplater
    from genfleet.producer.run_config import CliOptions, DatasetSpec, resolve

    config = resolve(CliOptions(datasets=(DatasetSpec.parse(f"d={data}"),), run="m", tokenizer=str(TOKENIZER)),
                     None, Settings())
    report = enqueue_dataset(config.datasets[0], config, "m", templater=PromptTemplater(str(TOKENIZER)),
                             destination=DryRunDestination(), context_length=None)
    estimate = queue_memory_bytes(report.message_bytes["short"], report.enqueued["short"])
    before = redis_client.info("memory")["used_memory"]
    enqueue(redis_url, f"d={data}", run="m")
    spent = redis_client.info("memory")["used_memory"] - before
    assert 0.85 < spent / estimate < 1.15, (spent, estimate)


def test_rows_already_done_are_skipped_and_counted_as_such(redis_url, redis_client, tmp_path):
    from genfleet.common.run_state import Outcome

    state = RunState(redis_client, "done")
    finished = Outcome(prompt_tokens=1, completion_tokens=1, reasoning_tokens=0, truncated=False,
                       empty_reasoning=False, empty_content=False)
    for row in (3, 9, 17):  # across bitmap bytes: Redis numbers bits from the most significant
        state.mark_done("d", row, finished)
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"q{i}"} for i in range(20)])
    result = enqueue(redis_url, f"d={data}", run="done")
    assert queued_ids(redis_client) == Counter({f"d/{i}": 1 for i in range(20) if i not in (3, 9, 17)})
    _dataset, short, _long, already_queued, skipped_done, *_ = next(r for r in table_rows(result.stdout)
                                                                    if r[0] == "d")
    assert (short, already_queued, skipped_done) == ("17", "0", "3")
