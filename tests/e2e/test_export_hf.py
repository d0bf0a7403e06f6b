"""`genfleet export` as the Hugging Face ecosystem reads it: every format's export directory loads with
`datasets.load_dataset(<dir>)`, offline, config by config (every dataset, each dataset, the dead
letters), each row the line written and the record generated; its card carries the provenance; and
`--push-to-hub --dry-run` lists what would be uploaded and sends nothing. The upload itself needs the
network and a token and is not tested here: only that a push that cannot reach the Hub fails as it
should (huggingface_hub's offline mode).

One hand-made run serves every test: `syn` (30 records, some without reasoning) and `sampled` (6
prompts × 3 samples, some with a system message naming its author), plus a dead letter. `datasets` runs
in a fresh interpreter with HF_DATASETS_OFFLINE / HF_HUB_OFFLINE set before it is imported.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.data import read_jsonl as lines
from helpers.export_runs import EXIT_INCOMPLETE, run_export, sampled_run, synthetic_run
from helpers.redis_server import observer

from genfleet.common.reasoning import get_format
from genfleet.common.records import TaskPayload
from genfleet.common.run_state import RunState

pytest.importorskip("datasets", reason="the `hf` extra (pip install -e '.[hf]') reads the exports")

RUN = "hf"
FORMATS = ("specforge", "openai", "sharegpt", "openai-batch", "tokenized")
# Every format, and one export split into numbered files with no merged file.
EXPORTS = {**{name: ("--format", name) for name in FORMATS},
           "split": ("--format", "specforge", "--no-merged", "--max-records-per-file", "7")}
DEAD_ID = "syn/req-dead"

# Loads every config the card declares, and the default one (no name), in a fresh interpreter.
LOADER = """
import json, sys
from datasets import load_dataset
from huggingface_hub import DatasetCard
loaded = {}
for name, directory in json.loads(sys.argv[1]).items():
    card = DatasetCard.load(directory + "/README.md")
    configs = {c["config_name"]: load_dataset(directory, c["config_name"], split="train").to_list()
               for c in card.data.configs}
    configs[""] = load_dataset(directory, split="train").to_list()
    loaded[name] = configs
print(json.dumps(loaded))
"""


@pytest.fixture(scope="module")
def run_records(redis_server: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    client = observer(redis_server)
    shards = tmp_path_factory.mktemp("hf-run") / "shards"
    records = synthetic_run(shards, client, RUN, 30) + sampled_run(shards, client, RUN, prompts=6, samples=3)
    state = RunState(client, RUN)
    client.setbit(state.keys.enqueued("syn"), 30, 1)
    state.count("syn", "total")
    state.record_dead_letter(TaskPayload(run=RUN, id=DEAD_ID, dataset="syn", row=30, partition="short",
                                         prompt_tokens=9000, max_new_tokens=10,
                                         messages=[{"role": "user", "content": "too long"}]),
                             "permanent", "HTTP 400: context too long", "http://sim")
    return shards, [json.loads(record.to_json_line()) for record in records]


@pytest.fixture(scope="module")
def exports(run_records, redis_server: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    shards, _ = run_records
    root = tmp_path_factory.mktemp("hf-exports")
    for name, args in EXPORTS.items():
        code, output, manifest = run_export(RUN, (shards,), root / name, *args, redis_url=redis_server)
        assert code == 0 and manifest["verified"], output
    return {name: root / name for name in EXPORTS}


@pytest.fixture(scope="module")
def loaded(exports, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, list[dict]]]:
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(tmp_path_factory.mktemp("hf-home"))}
    result = subprocess.run([sys.executable, "-c", LOADER, json.dumps({k: str(v) for k, v in exports.items()})],
                            env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def card_data(directory: Path) -> dict[str, Any]:
    from huggingface_hub import DatasetCard

    return DatasetCard.load(directory / "README.md").data.to_dict()


def without_nulls(value: Any) -> Any:
    """A value without its null fields: datasets gives a field a line lacks back as None, so a line and
    its row agree once both lose them."""
    if isinstance(value, dict):
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_nulls(item) for item in value]
    return value


@pytest.mark.parametrize("format_name", EXPORTS)
def test_every_config_of_the_card_loads_offline_as_exactly_the_lines_written(exports, loaded, format_name):
    out = exports[format_name]
    data = card_data(out)
    configs = {config["config_name"]: config for config in data["configs"]}
    expected = ["all", "sampled", "syn"] + (["errors"] if format_name == "openai-batch" else [])
    assert list(configs) == expected and configs["all"]["default"] is True
    infos = {info["config_name"]: info for info in data["dataset_info"]}
    for name, config in configs.items():
        (split,) = config["data_files"]
        paths = [split["path"]] if isinstance(split["path"], str) else split["path"]
        written = [line for path in paths for line in lines(out / path)]
        rows = loaded[format_name][name]
        assert [without_nulls(row) for row in rows] == [without_nulls(line) for line in written], name
        assert infos[name]["splits"] == [{"name": "train", "num_examples": len(written),
                                          "num_bytes": sum((out / path).stat().st_size for path in paths)}]
    assert loaded[format_name][""] == loaded[format_name]["all"]  # the default config is every dataset
    assert len(loaded[format_name]["all"]) == len(loaded[format_name]["sampled"]) + len(loaded[format_name]["syn"])
    assert data["size_categories"] == "n<1K"


def test_configs_name_exactly_the_files_written(exports):
    merged = {config["config_name"]: config["data_files"] for config in card_data(exports["openai"])["configs"]}
    assert merged == {"all": [{"split": "train", "path": "all.jsonl"}],
                      "sampled": [{"split": "train", "path": "datasets/sampled.jsonl"}],
                      "syn": [{"split": "train", "path": "datasets/syn.jsonl"}]}
    split = {config["config_name"]: config["data_files"][0]["path"]
             for config in card_data(exports["split"])["configs"]}
    syn_parts = [f"datasets/syn-{part:05d}.jsonl" for part in range(5)]  # 30 lines, 7 a file
    assert split == {"all": ["datasets/sampled-00000.jsonl", *syn_parts], "sampled": "datasets/sampled-00000.jsonl",
                     "syn": syn_parts}


def replies(format_name: str, dataset: str, rows: list[dict]) -> dict[str, tuple]:
    """Each record's id and (content, reasoning) as the exported row holds them."""
    if format_name == "openai-batch":
        return {f"{dataset}/{row['custom_id']}": (row["response"]["body"]["choices"][0]["message"]["content"],
                                                 row["response"]["body"]["choices"][0]["message"]["reasoning_content"])
                for row in rows}
    if format_name == "sharegpt":
        return {row["id"]: (row["conversations"][-1]["value"], None) for row in rows}
    key = "conversations" if format_name == "specforge" else "messages"
    found = {}
    for row in rows:
        if "samples" in row:  # --samples: one line per prompt
            for k, sample in zip(row["sample_indices"], row["samples"], strict=True):
                found[f"{row['id']}#{k}"] = (sample[-1]["content"], sample[-1]["reasoning_content"])
        else:
            found[row["id"]] = (row[key][-1]["content"], row[key][-1]["reasoning_content"])
    return found


@pytest.mark.parametrize("format_name", ["specforge", "openai", "sharegpt", "openai-batch"])
def test_loaded_rows_hold_each_generated_record(run_records, loaded, format_name):
    _, records = run_records
    think = get_format("kimi_k2")
    for dataset in ("syn", "sampled"):
        expected = {}
        for record in records:
            if record["dataset"] != dataset:
                continue
            reasoning, content = record["reasoning"], record["content"]
            expected[record["id"]] = ((f"{think.start}{reasoning}{think.end}{content}" if reasoning else content, None)
                                      if format_name == "sharegpt" else (content, reasoning or None))
        assert replies(format_name, dataset, loaded[format_name][dataset]) == expected, dataset


def test_tokenized_rows_and_the_batch_error_file_load_as_their_records(run_records, loaded):
    _, records = run_records
    tokenized = loaded["tokenized"]["all"]
    assert sorted(row["id"] for row in tokenized) == sorted(record["id"] for record in records)
    generated = {record["id"] for record in records if record["content"]}
    assert all(len(row["input_ids"]) == len(row["loss_mask"]) > 0 for row in tokenized)
    assert {row["id"] for row in tokenized if 1 in row["loss_mask"]} == generated
    (error,) = loaded["openai-batch"]["errors"]
    assert error["custom_id"] == "req-dead" and error["error"] == {"code": "permanent",
                                                                    "message": "HTTP 400: context too long"}


def test_the_card_states_the_provenance_and_the_numbers_of_the_manifest(exports):
    out = exports["specforge"]
    card = (out / "README.md").read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    assert "| **model** | `sim-model` |" in card
    # Records written before workers kept `model_revision`: nothing reported, nothing guessed.
    assert "| **model revision** | not reported by the server (revision null); weight version not reported" in card
    assert f"fingerprint `{manifest['tokenizer']['fingerprint']}`" in card and manifest["tokenizer"]["fingerprint"]
    assert "| **reasoning parser** | `kimi_k2` |" in card
    assert f"| **run config hash** | `{manifest['config_hash']}` |" in card and manifest["config_hash"]
    assert f"| **genfleet** | `{manifest['genfleet_version']}` |" in card
    assert '| `sampled` | `{"temperature": 0.6, "top_p": 0.95}` | short 512 / long 2,048 | 3 |' in card
    assert "| `syn` | 31 | 30 | 1 | 0 | 0 | 30 | 0 | 0 | 30 |" in card  # input, done, dead, ..., exported
    syn = manifest["stats"]["syn"]["completion_tokens"]
    assert f"| `syn` | 30 | 10 | {syn['median']:,.1f} | {syn['mean']:,.1f} |" in card
    assert "complete, and verified against the run's Redis" in card
    listed = {entry["path"]: entry for entry in manifest["files"]}
    assert listed["README.md"]["bytes"] == (out / "README.md").stat().st_size


def test_an_incomplete_export_gets_a_card_saying_so_and_is_not_pushed(redis_server, tmp_path):
    client = observer(redis_server)
    synthetic_run(tmp_path / "shards", client, "hf-pending", 5)
    state = RunState(client, "hf-pending")
    client.setbit(state.keys.enqueued("syn"), 5, 1)  # published, never finished
    state.count("syn", "total")
    code, output, manifest = run_export("hf-pending", (tmp_path / "shards",), tmp_path / "out", "--format", "openai",
                                        "--push-to-hub", "someone/genfleet-hf-test", "--dry-run",
                                        redis_url=redis_server)
    assert code == EXIT_INCOMPLETE and "not pushed: the export is incomplete" in output
    assert "would upload" not in output
    card = (tmp_path / "out" / "README.md").read_text()
    assert "The export is **incomplete**." in card and "\n- syn: input 6 ≠ done 5" in card
    assert not manifest["complete"]


def test_push_to_hub_dry_run_lists_every_file_with_its_size_and_sends_nothing(run_records, redis_server, tmp_path):
    shards, _ = run_records
    out = tmp_path / "out"
    code, output, manifest = run_export(RUN, (shards,), out, "--format", "openai", "--push-to-hub",
                                        "someone/genfleet-hf-test", "--dry-run", redis_url=redis_server)
    assert code == 0, output
    listed = dict(line.split("\t") for line in output.splitlines() if "\t" in line)
    on_disk = {path.relative_to(out).as_posix(): str(path.stat().st_size) for path in out.rglob("*") if path.is_file()}
    assert listed == on_disk and {"README.md", "manifest.json", "all.jsonl", "datasets/syn.jsonl"} <= set(listed)
    assert "nothing sent" in output and manifest["complete"]


def test_a_push_that_cannot_reach_the_hub_exits_4_and_names_the_command_that_retries_it(run_records, tmp_path):
    shards, _ = run_records
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}  # no request leaves
    result = subprocess.run([sys.executable, "-m", "genfleet", "export", "--run", RUN, "--from", str(shards), "--out",
                             str(out), "--format", "openai", "--no-reconcile", "--push-to-hub", "someone/genfleet-x"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 4, result.stderr
    assert "push to the Hub failed" in result.stderr and "offline" in result.stderr
    assert f"hf upload someone/genfleet-x {out} --repo-type dataset" in " ".join(result.stderr.split())
    assert (out / "README.md").is_file()


@pytest.mark.parametrize(("args", "message"), [
    (("--dry-run",), "--dry-run goes with --push-to-hub"),
    (("--push-to-hub", "not a repo"), "--push-to-hub 'not a repo' is not a repository id"),
])
def test_push_options_that_cannot_work_stop_before_exporting(tmp_path, args, message):
    code, output, _ = run_export(RUN, (tmp_path,), tmp_path / "out", "--format", "openai", "--no-reconcile", *args)
    assert code == 2 and message in " ".join(output.split())
    assert not (tmp_path / "out").exists()
