"""`genfleet export`: shards from a real run (and hand-made ones) become verified training data."""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from common.records import CompletionRecord, TaskPayload, Timing, Usage
from common.run_state import Outcome, RunState
from common.tokenizer import load_tokenizer, render_prompts
from fleet import TOKENIZER, Fleet
from genfleet.cli import app
from genfleet.export.formats import specforge_line
from genfleet.export.sinks import BucketShuffle
from genfleet.export.tokenized import TokenizedFormat
from sim.completion import LengthModel, plan_completion
from sim.vocab import SimVocab
from sim_process import SimProcess

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from make_sample_data import dataset_args, write_datasets  # noqa: E402

RUN = "exp"
FAST_SIM = ("--length-scale", "0.05", "--rate", "400")
EXIT_INCOMPLETE, EXIT_ABORTED = 1, 3


class SampleRun:
    """A finished real run (sample data, token ids kept); tests export copies of its shards."""

    def __init__(self, redis_url: str, output: Path) -> None:
        self.redis_url, self.output = redis_url, output

    def records(self) -> list[dict]:
        return [json.loads(line) for shard in sorted((self.output / RUN).glob("*/*.jsonl*"))
                for line in shard.read_text().splitlines()]

    def copy(self, to: Path) -> Path:
        shutil.copytree(self.output, to)
        return to

    def export(self, out: Path, *args: str, sources: tuple[Path, ...] | None = None) -> tuple[int, str, dict]:
        return run_export(RUN, sources or (self.output,), out, *args, redis_url=self.redis_url)


def run_export(run: str, sources: tuple[Path, ...], out: Path, *args: str,
               redis_url: str | None = None) -> tuple[int, str, dict]:
    """Runs `genfleet export` in-process; returns the exit code, the output and the manifest."""
    argv = ["export", "--run", run, "--out", str(out), *args]
    for source in sources:
        argv += ["--from", str(source)]
    if redis_url is not None:
        argv += ["--redis-url", redis_url]
    result = CliRunner().invoke(app, argv, catch_exceptions=False)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    return result.exit_code, result.output, manifest


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def sample_run(redis_server: str, tmp_path_factory: pytest.TempPathFactory) -> SampleRun:
    redis.Redis.from_url(redis_server).flushall()
    workdir = tmp_path_factory.mktemp("export-run")
    with SimProcess(*FAST_SIM) as sim, Fleet(redis_server, workdir) as fleet:
        fleet.start_worker("short", sim.url)
        fleet.start_worker("long", sim.url)
        fleet.enqueue(RUN, *dataset_args(write_datasets(workdir / "data", scale=0.1)), extra=("--keep-token-ids",))
        fleet.wait_finished(RUN, timeout=120)
    return SampleRun(redis_server, fleet.output_dir)


# --- dedupe across hosts --------------------------------------------------------------------------

def test_shards_copied_from_two_hosts_export_one_record_per_id(sample_run, tmp_path):
    host_a, host_b = tmp_path / "host-a", tmp_path / "host-b"
    overlap = 0
    for shard in sorted((sample_run.output / RUN).glob("*/*.jsonl")):
        shard_lines = shard.read_text().splitlines(keepends=True)
        half = len(shard_lines) // 2
        # Host a holds the first half and a bit more, host b the rest and a bit less: the lines in
        # between were written twice (a worker died after writing, before acking).
        for host, part in ((host_a, shard_lines[: half + 2]), (host_b, shard_lines[half:])):
            target = host / RUN / shard.parent.name / shard.name.replace("-00000", "-00007")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("".join(part))
        overlap += len(shard_lines[half: half + 2])

    (tmp_path / "host-c").mkdir()  # a host that wrote nothing of this run
    code, output, manifest = sample_run.export(tmp_path / "out", "--format", "specforge",
                                               sources=(host_a, host_b, tmp_path / "host-c"))

    assert code == 0, output
    exported = Counter(line["id"] for line in lines(tmp_path / "out" / "all.jsonl"))
    expected = {record["id"] for record in sample_run.records()}
    assert set(exported) == expected and set(exported.values()) == {1}
    assert manifest["duplicates"]["dropped"] == manifest["totals"]["duplicates_dropped"] == overlap > 0
    assert manifest["complete"] and manifest["verified"]
    assert "duplicate records dropped" in output
    assert manifest["sources_without_run"] == [str(tmp_path / "host-c")]


# --- formats ----------------------------------------------------------------------------------------

def _generated_message(record: dict) -> dict:
    return {"role": "assistant", "content": record["content"], "reasoning_content": record["reasoning"]}


@pytest.mark.parametrize("format_name", ["specforge", "openai", "sharegpt", "openai-batch"])
def test_each_format_round_trips_the_sample_run(sample_run, tmp_path, format_name):
    out = tmp_path / "out"
    code, output, manifest = sample_run.export(out, "--format", format_name)
    assert code == 0, output

    records = {record["id"]: record for record in sample_run.records()}
    exported = lines(out / "all.jsonl")
    assert len(exported) == len(records) == manifest["totals"]["exported"] == manifest["totals"]["done"]
    roles = {"system": "system", "user": "human", "assistant": "gpt", "tool": "tool"}
    for path in sorted((out / "datasets").glob("*.jsonl")):
        for line in lines(path):
            if format_name == "openai-batch":
                record = records[f"{path.stem}/{line['custom_id']}"]
                assert line["error"] is None and line["response"]["status_code"] == 200
                body = line["response"]["body"]
                (choice,) = body["choices"]
                assert choice["message"] == {"role": "assistant", "content": record["content"],
                                             "reasoning_content": record["reasoning"]}
                assert choice["finish_reason"] == record["finish_reason"]
                assert body["usage"]["completion_tokens"] == record["usage"]["completion_tokens"]
                assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == \
                    record["usage"]["reasoning_tokens"]
            elif format_name == "sharegpt":
                record = records[line["id"]]
                assert line["conversations"][:-1] == [{"from": roles[m["role"]], "value": m["content"]}
                                                      for m in record["messages"]]
                assert line["conversations"][-1] == {
                    "from": "gpt", "value": f"<think>{record['reasoning']}</think>{record['content']}"}
            else:
                record = records[line["id"]]
                conversation = line["conversations" if format_name == "specforge" else "messages"]
                assert conversation == record["messages"] + [_generated_message(record)]

    # Per-dataset files hold the same lines as the merged one, and every file's hash is recorded.
    per_dataset = [line for path in sorted((out / "datasets").glob("*.jsonl")) for line in lines(path)]
    assert sorted(map(json.dumps, per_dataset)) == sorted(map(json.dumps, exported))
    for entry in manifest["files"]:
        assert hashlib.sha256((out / entry["path"]).read_bytes()).hexdigest() == entry["sha256"]
    assert {entry["path"] for entry in manifest["files"]} >= {"all.jsonl", "datasets/B1_glaive.jsonl"}


def test_tokenized_masks_exactly_the_generated_tokens_with_and_without_output_ids(sample_run, tmp_path):
    records = {record["id"]: record for record in sample_run.records()}
    assert all(record["output_ids"] for record in records.values())
    # The same run with the token ids dropped: its masks come from re-tokenizing the text.
    text_only = sample_run.copy(tmp_path / "text-only")
    for shard in (text_only / RUN).glob("*/*.jsonl"):
        stripped = [json.loads(line) for line in shard.read_text().splitlines()]
        shard.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "output_ids"}) + "\n"
                                 for r in stripped))

    code, output, _ = sample_run.export(tmp_path / "ids", "--format", "tokenized")
    assert code == 0, output
    code, output, _ = sample_run.export(tmp_path / "text", "--format", "tokenized", sources=(text_only,))
    assert code == 0, output

    tokenizer = load_tokenizer(TOKENIZER)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    from_ids = {line["id"]: line for line in lines(tmp_path / "ids" / "all.jsonl")}
    from_text = {line["id"]: line for line in lines(tmp_path / "text" / "all.jsonl")}
    assert set(from_ids) == set(from_text) == set(records)
    for record_id, line in from_ids.items():
        record = records[record_id]
        (prompt,) = render_prompts(tokenizer, [record["messages"]])
        ids, mask = line["input_ids"], line["loss_mask"]
        assert ids[: len(prompt)] == prompt and set(mask[: len(prompt)]) == {0}
        # The generated tokens, exactly as the model produced them, the stop token it matched included.
        assert record["output_ids"][-1] == eos
        assert ids[len(prompt):] == record["output_ids"] and set(mask[len(prompt):]) == {1}
        generated = tokenizer.decode(ids[len(prompt):], skip_special_tokens=False)
        assert generated == f"{record['reasoning']}</think>{record['content']}<|im_end|>"
        assert from_text[record_id] == line  # re-tokenized text gives the very same tokens and mask


def _tokenized(messages: list[dict], max_new_tokens: int, kwargs: dict | None = None,
               keep_ids: bool = True) -> tuple[dict, list[int], object]:
    tokenizer = load_tokenizer(TOKENIZER)
    vocab = SimVocab.from_tokenizer_dir(TOKENIZER)
    (prompt,) = render_prompts(tokenizer, [messages], kwargs)
    plan = plan_completion(prompt, seed=0, max_new_tokens=max_new_tokens, lengths=LengthModel(scale=0.05),
                           vocab=vocab)
    record = {"id": "d/0", "dataset": "d", "messages": messages, "reasoning": plan.reasoning_text,
              "content": plan.content_text, "finish_reason": plan.finish_reason["type"],
              "matched_stop": plan.finish_reason.get("matched"), "usage": {}}
    if keep_ids:
        record["output_ids"] = plan.output_ids
    return TokenizedFormat(tokenizer, {"d": kwargs or {}})(record), prompt, plan


@pytest.mark.parametrize("keep_ids", [True, False], ids=["output_ids", "text"])
def test_tokenized_truncated_turn_ends_at_its_last_generated_token(keep_ids):
    messages = [{"role": "user", "content": "explain the module loader in detail please"}]
    line, prompt, plan = _tokenized(messages, max_new_tokens=6, keep_ids=keep_ids)
    assert plan.finish_reason["type"] == "length"
    assert line["input_ids"] == prompt + plan.output_ids  # no </think>, no <|im_end|>: never generated
    assert line["loss_mask"] == [0] * len(prompt) + [1] * len(plan.output_ids)


@pytest.mark.parametrize("keep_ids", [True, False], ids=["output_ids", "text"])
def test_tokenized_thinking_off_masks_content_and_end_of_turn_only(keep_ids):
    messages = [{"role": "user", "content": "a quick answer please"}]
    line, prompt, plan = _tokenized(messages, 200, {"thinking": False}, keep_ids=keep_ids)
    tokenizer = load_tokenizer(TOKENIZER)
    assert plan.reasoning_text == ""
    assert tokenizer.decode(prompt[-2:], skip_special_tokens=False) == "<think></think>"  # the template's
    generated = [i for i, m in zip(line["input_ids"], line["loss_mask"], strict=True) if m]
    assert tokenizer.decode(generated, skip_special_tokens=False) == plan.content_text + "<|im_end|>"
    assert line["input_ids"][: len(prompt)] == prompt and not any(line["loss_mask"][: len(prompt)])


def test_regenerate_all_interleaves_the_generated_turns_and_tokenized_masks_each():
    tokenizer = load_tokenizer(TOKENIZER)
    turns = [{"reasoning": f" thought {i}", "content": f" answer {i}", "finish_reason": "stop",
              "matched_stop": tokenizer.convert_tokens_to_ids("<|im_end|>")} for i in range(2)]
    record = {"id": "m/0", "dataset": "m", "usage": {}, "reasoning": turns[-1]["reasoning"],
              "content": turns[-1]["content"], "finish_reason": "stop", "turns": turns,
              "messages": [{"role": "user", "content": "first question"},
                           {"role": "assistant", "content": " answer 0"},
                           {"role": "user", "content": "second question"}]}
    assert specforge_line(record)["conversations"] == [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": " answer 0", "reasoning_content": " thought 0"},
        {"role": "user", "content": "second question"},
        {"role": "assistant", "content": " answer 1", "reasoning_content": " thought 1"}]
    line = TokenizedFormat(tokenizer)(record)
    spans, current = [], []
    for token, mask in zip(line["input_ids"], line["loss_mask"], strict=True):
        if mask:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    spans.append(current)
    assert [tokenizer.decode(span, skip_special_tokens=False) for span in spans] == [
        " thought 0</think> answer 0<|im_end|>", " thought 1</think> answer 1<|im_end|>"]
    unmasked = tokenizer.decode([t for t, m in zip(line["input_ids"], line["loss_mask"], strict=True) if not m],
                                skip_special_tokens=False)
    assert "first question" in unmasked and "second question" in unmasked and "answer" not in unmasked


# --- torn and corrupt shards ----------------------------------------------------------------------

def test_a_torn_last_line_of_an_open_shard_is_tolerated_and_reported(sample_run, tmp_path):
    hosts = sample_run.copy(tmp_path / "copy")
    shard = next((hosts / RUN / "B2_opencodeinstruct").glob("*.jsonl"))
    torn = shard.with_name(shard.name + ".open")
    shard.rename(torn)
    whole = torn.read_text().splitlines(keepends=True)
    with torn.open("a") as handle:
        handle.write(whole[0][: len(whole[0]) // 2])  # a crash mid-write: half a line, no newline

    code, output, manifest = sample_run.export(tmp_path / "out", "--format", "openai", sources=(hosts,))

    assert code == 0, output
    assert manifest["torn_lines"] == [{"file": str(torn), "line": len(whole) + 1,
                                       "bytes": len(whole[0]) // 2}]
    assert manifest["datasets"]["B2_opencodeinstruct"]["torn_lines"] == 1
    assert f"torn last line tolerated {torn}:{len(whole) + 1}" in output
    assert manifest["complete"] and manifest["verified"]


@pytest.mark.parametrize("damage", ["garbage line", "torn line in a sealed shard", "record without content"])
def test_a_corrupt_line_stops_the_export_naming_file_and_line(sample_run, tmp_path, damage):
    hosts = sample_run.copy(tmp_path / "copy")
    shard = next((hosts / RUN / "B3_magicoder").glob("*.jsonl"))
    shard_lines = shard.read_text().splitlines(keepends=True)
    if damage == "garbage line":
        shard_lines.insert(3, '{"id": "B3_magicoder/x", "run": \n')
        line = 4
    elif damage == "torn line in a sealed shard":
        shard_lines[-1] = shard_lines[-1][:40]
        line = len(shard_lines)
    else:
        record = json.loads(shard_lines[2])
        del record["content"]
        shard_lines[2] = json.dumps(record) + "\n"
        line = 3
    shard.write_text("".join(shard_lines))

    code, output, manifest = sample_run.export(tmp_path / "out", "--format", "specforge", sources=(hosts,))

    assert code == EXIT_ABORTED
    assert f"{shard}:{line}:" in output
    assert manifest["complete"] is False and f"{shard}:{line}:" in manifest["problems"][0]


# --- reconciliation ---------------------------------------------------------------------------------

def test_reconciliation_fails_listing_the_missing_ids_when_a_shard_is_deleted(sample_run, tmp_path):
    hosts = sample_run.copy(tmp_path / "copy")
    lost: list[dict] = []
    for dataset in ("B8_sweagent", "B1_glaive"):  # ids are row indices in B8, the rows' own in B1
        shard = next((hosts / RUN / dataset).glob("*.jsonl"))
        shard_lines = shard.read_text().splitlines(keepends=True)
        # Two shards of one worker, as a rotation leaves them; the second one is lost.
        shard.write_text("".join(shard_lines[:5]))
        lost += [json.loads(line) for line in shard_lines[5:]]

    out = tmp_path / "out"
    code, output, manifest = sample_run.export(out, "--format", "specforge", sources=(hosts,))

    assert code == EXIT_INCOMPLETE
    missing = lines(out / "missing.jsonl")
    assert sorted((m["dataset"], m["row"]) for m in missing) == sorted((r["dataset"], r["row"]) for r in lost)
    assert all(m["reason"] == "done_without_record" for m in missing)
    b8_lost = {r["id"] for r in lost if r["dataset"] == "B8_sweagent"}
    assert {m["id"] for m in missing if m["dataset"] == "B8_sweagent"} == b8_lost
    assert {m["id"] for m in missing if m["dataset"] == "B1_glaive"} == {None}  # Redis knows rows only
    assert all(f"missing: {record_id} " in output for record_id in b8_lost)
    assert "INCOMPLETE" in output
    # What could be written was written, and the manifest says it is not the whole run.
    assert manifest["complete"] is False and not manifest["verified"]
    assert manifest["reconciliation"]["missing_rows"] == len(lost)
    assert any("B8_sweagent: 5 rows are done in Redis but have no record" in p for p in manifest["problems"])
    assert len(lines(out / "all.jsonl")) == manifest["totals"]["done"] - len(lost)
    assert "missing.jsonl" in {entry["path"] for entry in manifest["files"]}

    # Without Redis nothing can prove the shards whole: the export succeeds, unverified.
    code, output, manifest = run_export(RUN, (hosts,), tmp_path / "unchecked", "--format", "specforge",
                                        "--no-reconcile")
    assert code == 0, output
    assert manifest["complete"] and not manifest["verified"] and manifest["datasets"]["B1_glaive"]["input"] is None


# --- hand-made runs: filters, shuffle, file splitting, dead letters, stats ---------------------------

def synthetic_run(root: Path, client: redis.Redis, run: str, count: int) -> list[CompletionRecord]:
    """`count` records of dataset `syn` in two shards, with the Redis state a finished run leaves:
    record i has 10 * (i + 1) completion tokens, every fifth is truncated, every seventh has no
    reasoning, and content of i characters."""
    state = RunState(client, run)
    state.register_dataset("syn", "synthetic.jsonl")
    records = []
    for row in range(count):
        record = CompletionRecord(
            id=f"syn/{row}", run=run, dataset="syn", partition="short",
            messages=[{"role": "user", "content": f"question {row}"}],
            reasoning="" if row % 7 == 0 else f"thinking about {row}", content="x" * row,
            finish_reason="length" if row % 5 == 0 else "stop", matched_stop=None,
            usage=Usage(prompt_tokens=5, completion_tokens=10 * (row + 1), reasoning_tokens=4 * (row + 1),
                        cached_tokens=0),
            upstream="sim", model="sim-model", sampling={}, timing=Timing(0.0, 0.0, None, 1.0),
            attempts=1, worker="w", row=row)
        records.append(record)
        client.setbit(state.keys.enqueued("syn"), row, 1)
        state.mark_done("syn", row, Outcome(5, 10 * (row + 1), 4 * (row + 1), row % 5 == 0, False, False))
    state.count("syn", "total", count)
    shards = root / run / "syn"
    shards.mkdir(parents=True)
    half = count // 2
    (shards / "w-00000.jsonl").write_bytes(b"".join(r.to_json_line() for r in records[:half]))
    (shards / "w-00001.jsonl.open").write_bytes(b"".join(r.to_json_line() for r in records[half:]))
    return records


def test_filters_leave_out_what_they_say_and_count_it(redis_server, tmp_path):
    client = redis.Redis.from_url(redis_server)
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
    client = redis.Redis.from_url(redis_server)
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


def test_bucket_shuffle_keeps_every_line_once_when_buckets_overflow_and_split(tmp_path):
    shuffle = BucketShuffle(tmp_path, expected_bytes=100, max_bucket_bytes=2000, seed=3)
    sent = [(i % 3, f"line {i}\n".encode()) for i in range(3000)]
    for tag, line in sent:
        shuffle.add(tag, line)
    received = list(shuffle.drain())
    assert sorted(received) == sorted(sent) and received != sent
    assert not list(tmp_path.iterdir())  # bucket files are gone
    # Every line lands anywhere: the first tenth spreads over the whole output.
    positions = sorted(received.index(item) for item in sent[:300])
    assert positions[0] < 300 and positions[-1] > 2700


def test_reconciliation_lists_the_pending_rows_of_an_unfinished_run(redis_server, tmp_path):
    client = redis.Redis.from_url(redis_server)
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
    client = redis.Redis.from_url(redis_server)
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
    client = redis.Redis.from_url(redis_server)
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
    client = redis.Redis.from_url(redis_server)
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
