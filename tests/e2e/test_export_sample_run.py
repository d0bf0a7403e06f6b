"""`genfleet export` over the shards of a real run (sample data through real workers): copies from
two hosts dedupe to one record per id, every format round-trips, the tokenized format masks exactly
the generated tokens, a torn last line is tolerated and a corrupt one stops the export, a
deleted shard fails reconciliation naming the missing ids, and the card names the model's revision
as the server reported it to the workers."""
from __future__ import annotations

import hashlib
import json
from collections import Counter

import pytest
from helpers.data import read_jsonl as lines
from helpers.data import sample_dataset_args
from helpers.export_runs import EXIT_ABORTED, EXIT_INCOMPLETE, SampleRun, run_export
from helpers.fleet import Fleet
from helpers.paths import TOKENIZER
from helpers.redis_server import observer
from helpers.sim_process import FAST_SIM, SimProcess

from genfleet.common.tokenizer import load_tokenizer, render_prompts

RUN = SampleRun.RUN


@pytest.fixture(scope="module")
def sample_run(redis_server: str, tmp_path_factory: pytest.TempPathFactory) -> SampleRun:
    observer(redis_server).flushall()
    workdir = tmp_path_factory.mktemp("export-run")
    with SimProcess(*FAST_SIM) as sim, Fleet(redis_server, workdir) as fleet:
        fleet.start_worker("short", sim.url)
        fleet.start_worker("long", sim.url)
        fleet.enqueue(RUN, *sample_dataset_args(workdir / "data", scale=0.1), extra=("--keep-token-ids",))
        fleet.wait_finished(RUN, timeout=120)
    return SampleRun(redis_server, fleet.output_dir)


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


# What the simulator reports, as SGLang 0.5.23 launched without --revision or --weight-version.
SIM_REVISION = {"revision": None, "weight_version": "default"}


def test_the_card_names_the_revision_and_weight_version_the_server_reported(sample_run, tmp_path):
    records = sample_run.records()
    assert all(record["model_revision"] == SIM_REVISION for record in records)

    code, output, manifest = sample_run.export(tmp_path / "out", "--format", "specforge")

    assert code == 0, output
    glaive = manifest["datasets"]["B1_glaive"]
    assert glaive["models"] == [{"model": records[0]["model"], **SIM_REVISION, "records": glaive["records"]}]
    card = (tmp_path / "out" / "README.md").read_text()
    assert ("| **model revision** | not reported by the server (revision null); weight version `default` "
            "(as the server reported them: `/server_info` `revision`, `/model_info` `weight_version`) |") in card
    assert "Models by dataset" not in card


def test_records_from_a_host_serving_another_revision_are_listed_apart_in_the_card(sample_run, tmp_path):
    hosts = sample_run.copy(tmp_path / "copy")
    newer = {"revision": "3f2a9c1", "weight_version": "step-1200"}
    for shard in (hosts / RUN / "B1_glaive").glob("*.jsonl"):
        shard.write_text("".join(json.dumps({**record, "model_revision": newer}) + "\n" for record in lines(shard)))

    code, output, manifest = sample_run.export(tmp_path / "out", "--format", "specforge", sources=(hosts,))

    assert code == 0, output
    card = (tmp_path / "out" / "README.md").read_text()
    assert "| **model revision** | several: see *Models by dataset* |" in card
    model = sample_run.records()[0]["model"]
    glaive, magicoder = manifest["datasets"]["B1_glaive"], manifest["datasets"]["B3_magicoder"]
    assert f"| `B1_glaive` | `{model}` | `3f2a9c1` | `step-1200` | {glaive['records']:,} |" in card
    assert (f"| `B3_magicoder` | `{model}` | not reported by the server (revision null) | `default` | "
            f"{magicoder['records']:,} |") in card


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
