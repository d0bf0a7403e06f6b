"""`genfleet export` over small hand-written shards (no Redis: `--no-reconcile`): `--drop-looped`,
the manifest's loop / continuation / regeneration / sample counts, and `--samples N` records grouped
one line per prompt in sample order (specforge, openai) or kept one line per sample (openai-batch),
wherever in the shards a prompt's samples lie; the on-disk grouping on its own with tiny buckets."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.data import read_jsonl
from helpers.export_runs import run_export

from genfleet.common.records import CompletionRecord, Timing, Usage
from genfleet.export.formats import openai_line, specforge_line
from genfleet.export.records import SampleGroups, SeenRecords

RUN = "r"
LOOP = {"period": 3, "repeats": 40, "start": 12, "at_token": 132}


def record(record_id: str, row: int, **fields: object) -> CompletionRecord:
    prompt = record_id.split("#")[0]
    base = CompletionRecord(
        id=record_id, run=RUN, dataset="d", partition="short", messages=[{"role": "user", "content": f"ask {prompt}"}],
        reasoning=f"think {record_id}", content=f"answer {record_id}", finish_reason="stop", matched_stop=None,
        usage=Usage(5, 20, 8, 0), upstream="sim", model="m", sampling={}, timing=Timing(0.0, 0.0, None, 1.0),
        attempts=1, worker="w", row=row)
    for name, value in fields.items():
        setattr(base, name, value)
    return base


def write_shards(root: Path, *shards: list[CompletionRecord]) -> Path:
    directory = root / RUN / "d"
    directory.mkdir(parents=True)
    for index, records in enumerate(shards):
        (directory / f"w{index}-00000.jsonl").write_bytes(b"".join(r.to_json_line() for r in records))
    return root


def export(shards: Path, out: Path, *args: str) -> tuple[list[dict], dict]:
    code, output, manifest = run_export(RUN, (shards,), out, "--no-reconcile", *args)
    assert code == 0, output
    return read_jsonl(out / "all.jsonl"), manifest


def sample(prompt: int, k: int, **fields: object) -> CompletionRecord:
    """Sample k of prompt `prompt` (3 samples per prompt, each in its own row slot)."""
    return record(f"d/p{prompt}#{k}", 3 * prompt + k, sample=k, **fields)


def test_drop_looped_leaves_out_looped_records_and_the_manifest_counts_them(tmp_path):
    records = [record("d/0", 0), record("d/1", 1, finish_reason="loop", loop=LOOP),
               record("d/2", 2, continued=2), record("d/3", 3, regenerated=True, finish_reason="length"),
               record("d/4", 4, finish_reason="loop", loop=LOOP, continued=1)]
    shards = write_shards(tmp_path / "shards", records)

    kept, manifest = export(shards, tmp_path / "all", "--format", "openai")
    assert [line["id"] for line in kept] == ["d/0", "d/1", "d/2", "d/3", "d/4"]
    d = manifest["datasets"]["d"]
    assert (d["looped"], d["continued"], d["regenerated"], d["samples"]) == (2, 2, 1, None)
    assert manifest["totals"]["looped"] == 2 and manifest["options"]["drop_looped"] is False

    kept, manifest = export(shards, tmp_path / "dropped", "--format", "openai", "--drop-looped")
    assert [line["id"] for line in kept] == ["d/0", "d/2", "d/3"]
    d = manifest["datasets"]["d"]
    assert d["filtered_by_reason"] == {"looped": 2} and d["exported"] == 3
    assert d["looped"] == 2  # counted before the filters, like the stats
    assert manifest["options"]["drop_looped"] is True


def scattered_samples() -> tuple[list[CompletionRecord], list[CompletionRecord]]:
    """Three prompts' samples spread over two shards out of order, one sample written twice (a crash
    before the ack), one looped sample, and one record without samples."""
    first = [sample(1, 2), sample(0, 1), record("d/plain", 100), sample(2, 0), sample(0, 2, finish_reason="loop",
                                                                                   loop=LOOP)]
    second = [sample(1, 0), sample(0, 0), sample(1, 1), sample(2, 2), sample(1, 2), sample(2, 1)]
    return first, second


@pytest.mark.parametrize(("format_name", "messages_key", "one_line"),
                         [("specforge", "conversations", specforge_line), ("openai", "messages", openai_line)])
def test_samples_become_one_line_per_prompt_in_sample_order(tmp_path, format_name, messages_key, one_line):
    first, second = scattered_samples()
    shards = write_shards(tmp_path / "shards", first, second)

    lines, manifest = export(shards, tmp_path / "out", "--format", format_name, "--drop-looped")

    by_id = {line["id"]: line for line in lines}
    assert len(lines) == len(by_id) == 4
    assert by_id["d/plain"] == one_line(json.loads(record("d/plain", 100).to_json_line()))  # as without samples
    p1 = by_id["d/p1"]
    assert p1 == {"id": "d/p1", messages_key: [{"role": "user", "content": "ask d/p1"}],
                  "samples": [[{"role": "assistant", "content": f"answer d/p1#{k}",
                                "reasoning_content": f"think d/p1#{k}"}] for k in range(3)],
                  "sample_indices": [0, 1, 2]}
    # The looped sample 2 of p0 was left out: the others keep their order and say which they are.
    assert [reply[0]["content"] for reply in by_id["d/p0"]["samples"]] == ["answer d/p0#0", "answer d/p0#1"]
    assert by_id["d/p0"]["sample_indices"] == [0, 1]
    assert by_id["d/p2"]["sample_indices"] == [0, 1, 2]
    d = manifest["datasets"]["d"]
    assert d["duplicates_dropped"] == 1 and d["filtered_by_reason"] == {"looped": 1}
    assert d["samples"] == {"records": 8, "prompts": 3, "per_prompt": {"2": 1, "3": 2}}
    assert d["exported"] == 9  # records: 8 samples and the plain one, in 4 lines
    assert manifest["totals"]["samples"] == d["samples"]
    assert sum(file["records"] for file in manifest["files"] if file["path"] == "all.jsonl") == 4


def test_grouped_samples_survive_the_shuffle_whole(tmp_path):
    shards = write_shards(tmp_path / "shards", *scattered_samples())
    plain, _ = export(shards, tmp_path / "plain", "--format", "specforge")
    shuffled, _ = export(shards, tmp_path / "shuffled", "--format", "specforge", "--shuffle", "--seed", "3")
    assert sorted(shuffled, key=lambda line: line["id"]) == sorted(plain, key=lambda line: line["id"])
    assert len(plain) == 4


def test_openai_batch_keeps_one_line_per_sample_under_its_own_custom_id(tmp_path):
    shards = write_shards(tmp_path / "shards", *scattered_samples())
    lines, manifest = export(shards, tmp_path / "out", "--format", "openai-batch")
    custom_ids = sorted(line["custom_id"] for line in lines)
    assert custom_ids == sorted(["plain", *(f"p{p}#{k}" for p in range(3) for k in range(3))])
    assert len({line["id"] for line in lines}) == len(lines)  # batch request ids differ per sample too
    looped = next(line for line in lines if line["custom_id"] == "p0#2")
    assert looped["response"]["body"]["choices"][0]["finish_reason"] == "loop"
    assert manifest["datasets"]["d"]["samples"] == {"records": 9, "prompts": 3, "per_prompt": {"3": 3}}


def test_dedupe_tells_samples_of_one_prompt_apart_with_or_without_rows():
    seen = SeenRecords()
    assert seen.first_time("d", None, "d/p#0") and seen.first_time("d", None, "d/p#1")
    assert not seen.first_time("d", None, "d/p#1")
    assert seen.first_time("d", 6, "d/q#0") and seen.first_time("d", 7, "d/q#1")
    assert not seen.first_time("d", 7, "d/q#1")


def test_sample_groups_split_oversized_buckets_and_keep_each_prompt_whole(tmp_path):
    groups = SampleGroups(tmp_path / "spill", expected_bytes=10_000, max_bucket_bytes=2_000)
    prompts = 60
    for k in (3, 0, 2, 1):  # sample order scrambled, prompts interleaved
        for prompt in range(prompts):
            groups.add("d", f"d/{prompt}", k, {"text": f"{prompt}:{k}" * 5})
    groups.add("e", "d/0", 0, None)  # another dataset's prompt of the same id is another prompt
    # 10 kB expected / 2 kB per bucket: 5 files, some of which come out over 2 kB and are split again.
    assert len(list((tmp_path / "spill").iterdir())) == 5
    drained = list(groups.drain())
    assert sorted((dataset, prompt_id) for dataset, prompt_id, _ in drained) == sorted(
        [("d", f"d/{prompt}") for prompt in range(prompts)] + [("e", "d/0")])
    for dataset, prompt_id, samples in drained:
        if dataset == "d":
            number = prompt_id.split("/")[1]
            assert samples == [(k, {"text": f"{number}:{k}" * 5}) for k in range(4)]
        else:
            assert samples == [(0, None)]
    assert not list((tmp_path / "spill").iterdir())  # spill files removed, split ones too
