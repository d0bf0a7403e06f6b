"""`genfleet export` over hand-made runs (shards plus the Redis state a finished run leaves):
filters, a seeded shuffle and file splitting, reconciliation of unfinished and budget-skipped
rows, no Redis at all, dead letters in the batch error file, and exact length statistics."""
from __future__ import annotations

from helpers.data import read_jsonl as lines
from helpers.export_runs import EXIT_ABORTED, EXIT_INCOMPLETE, run_export, synthetic_run
from helpers.redis_server import observer

from genfleet.common.records import TaskPayload
from genfleet.common.run_state import RunState


def test_filters_leave_out_what_they_say_and_count_it(redis_server, tmp_path):
    client = observer(redis_server)
    synthetic_run(tmp_path / "shards", client, "filters", 70)
    code, output, manifest = run_export("filters", (tmp_path / "shards",), tmp_path / "out", "--format", "openai",
                                        "--drop-truncated", "--require-reasoning", "--min-content-chars", "10",
                                        redis_url=redis_server)
    assert code == 0, output
    kept = {int(line["id"].split("/")[1]) for line in lines(tmp_path / "out" / "all.jsonl")}
    assert kept == {row for row in range(70) if row % 5 and row % 7 and row >= 10}
    syn = manifest["datasets"]["syn"]
    assert syn["filtered_by_reason"] == {"truncated": 14, "no_reasoning": 8, "short_content": 7}
    assert syn["exported"] == len(kept) == syn["records"] - syn["filtered"]
    assert manifest["verified"]


def test_shuffle_is_a_seeded_permutation_and_files_split_at_the_record_cap(redis_server, tmp_path):
    client = observer(redis_server)
    synthetic_run(tmp_path / "shards", client, "shuffle", 100)

    def export(name: str, *args: str) -> list[str]:
        code, output, _ = run_export("shuffle", (tmp_path / "shards",), tmp_path / name, "--format",
                                            "specforge", *args, redis_url=redis_server)
        assert code == 0, output
        parts = sorted((tmp_path / name).glob("all*.jsonl"))
        return [line["id"] for part in parts for line in lines(part)]

    plain = export("plain")
    shuffled = export("shuffled", "--shuffle", "--seed", "7", "--max-records-per-file", "30")
    assert sorted(shuffled) == sorted(plain) and shuffled != plain
    assert shuffled == export("again", "--shuffle", "--seed", "7", "--max-records-per-file", "30")
    assert shuffled != export("other", "--shuffle", "--seed", "8")
    parts = sorted((tmp_path / "shuffled").glob("all-*.jsonl"))
    assert [p.name for p in parts] == [f"all-{i:05d}.jsonl" for i in range(4)]
    assert [len(lines(p)) for p in parts] == [30, 30, 30, 10]
    assert [len(lines(p)) for p in sorted((tmp_path / "shuffled" / "datasets").glob("syn-*.jsonl"))] == [30, 30, 30, 10]


def test_reconciliation_lists_the_pending_rows_of_an_unfinished_run(redis_server, tmp_path):
    client = observer(redis_server)
    synthetic_run(tmp_path / "shards", client, "unfinished", 10)
    state = RunState(client, "unfinished")
    for row in (10, 11):  # published, still queued or running
        client.setbit(state.keys.enqueued("syn"), row, 1)
    state.count("syn", "total", 2)

    code, output, manifest = run_export("unfinished", (tmp_path / "shards",), tmp_path / "out", "--format",
                                        "openai", redis_url=redis_server)

    assert code == EXIT_INCOMPLETE
    assert lines(tmp_path / "out" / "missing.jsonl") == [
        {"dataset": "syn", "row": row, "id": f"syn/{row}", "reason": "pending"} for row in (10, 11)]
    assert "2 prompts not settled" in manifest["problems"][0] and "is the run finished?" in output


def test_rows_skipped_for_the_token_budget_are_not_missing_records(redis_server, tmp_path):
    client = observer(redis_server)
    synthetic_run(tmp_path / "shards", client, "budget", 10)
    state = RunState(client, "budget")
    for row in (10, 11, 12):
        client.setbit(state.keys.enqueued("syn"), row, 1)
        state.mark_skipped("syn", row)
    state.count("syn", "total", 3)

    code, output, manifest = run_export("budget", (tmp_path / "shards",), tmp_path / "ok", "--format", "openai",
                                        redis_url=redis_server)
    assert code == 0, output
    assert manifest["verified"] and manifest["datasets"]["syn"]["skipped"] == 3
    assert "3 done rows without a record: the prompts skipped for the token budget" in output

    # One record more gone: 4 done rows without a record, only 3 skips; Redis cannot say which, so all 4
    # are listed.
    shard = tmp_path / "shards" / "budget" / "syn" / "w-00000.jsonl"
    shard.write_text("".join(shard.read_text().splitlines(keepends=True)[1:]))
    code, output, manifest = run_export("budget", (tmp_path / "shards",), tmp_path / "short", "--format", "openai",
                                        redis_url=redis_server)
    assert code == EXIT_INCOMPLETE
    assert [m["row"] for m in lines(tmp_path / "short" / "missing.jsonl")] == [0, 10, 11, 12]
    assert "3 of them may be prompts skipped for the token budget" in manifest["problems"][0]


def test_export_without_reachable_redis_fails_fast_and_says_how_to_go_on(tmp_path):
    (tmp_path / "shards" / "r" / "d").mkdir(parents=True)
    code, output, _ = run_export("r", (tmp_path / "shards",), tmp_path / "out", "--format", "openai",
                                 redis_url="redis://127.0.0.1:1/0")
    assert code == EXIT_ABORTED and "--no-reconcile" in output


def test_openai_batch_writes_dead_letters_to_the_error_file(redis_server, tmp_path):
    client = observer(redis_server)
    synthetic_run(tmp_path / "shards", client, "batch", 4)
    state = RunState(client, "batch")
    dead = TaskPayload(run="batch", id="syn/req-9", dataset="syn", row=4, partition="short", prompt_tokens=9000,
                       max_new_tokens=10, messages=[{"role": "user", "content": "too long"}])
    client.setbit(state.keys.enqueued("syn"), 4, 1)
    state.count("syn", "total")
    state.record_dead_letter(dead, "permanent", "HTTP 400: context too long", "http://sim")

    code, output, manifest = run_export("batch", (tmp_path / "shards",), tmp_path / "out", "--format",
                                        "openai-batch", redis_url=redis_server)

    assert code == 0, output
    (error,) = lines(tmp_path / "out" / "all.errors.jsonl")
    assert error["custom_id"] == "req-9" and error["response"]["status_code"] == 400
    assert error["error"] == {"code": "permanent", "message": "HTTP 400: context too long"}
    assert lines(tmp_path / "out" / "datasets" / "syn.errors.jsonl") == [error]
    assert [line["custom_id"] for line in lines(tmp_path / "out" / "all.jsonl")] == ["0", "1", "2", "3"]
    assert manifest["datasets"]["syn"].items() >= {"input": 5, "done": 4, "dead": 1, "exported": 4}.items()
    assert manifest["verified"]


def test_stats_give_the_exact_completion_length_distribution(redis_server, tmp_path):
    client = observer(redis_server)
    synthetic_run(tmp_path / "shards", client, "stats", 100)
    code, output, manifest = run_export("stats", (tmp_path / "shards",), tmp_path / "out", "--format", "openai",
                                        "--drop-truncated", redis_url=redis_server)
    assert code == 0, output
    stats = manifest["stats"]["syn"]
    assert stats["records"] == 100  # before filters
    assert stats["completion_tokens"] == {"min": 10, "median": 505.0, "mean": 505.0, "std": 288.66, "p99": 990.0,
                                          "max": 1000, "total": 50500}
    assert stats["at_max_tokens_pct"] == 20.0 and stats["reasoning_token_pct"] == 40.0
    assert "completion tokens" in output and "505.0" in output
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in output
    else:
        png = tmp_path / "out" / "stats.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "stats.png" in {entry["path"] for entry in manifest["files"]}
