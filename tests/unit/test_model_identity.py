"""The served model's identity as a worker reads it from SGLang's `/model_info` and `/server_info`
answers (shaped as sglang 0.5.23 `entrypoints/http_server.py` returns them), and the record's
`model_revision` it becomes: what the server reports is kept as reported, what it does not stays
null, and a server that reports neither leaves the record as it was before the field existed."""
from __future__ import annotations

import json

from genfleet.common.records import CompletionRecord, Timing, Usage
from genfleet.workers.servers.api import ModelIdentity
from genfleet.workers.servers.sglang_info import identity_from_model_info, revision_from_server_info

MODEL_INFO = {"model_path": "/models/Kimi-K2.5", "served_model_name": "kimi-k2.5",
              "tokenizer_path": "/models/Kimi-K2.5", "is_generation": True, "weight_version": "step-1200",
              "load_format": "auto"}
SERVER_INFO = {"model_path": "moonshotai/Kimi-K2.5", "revision": "3f2a9c1", "weight_version": "default",
               "incremental_streaming_output": False, "stream_interval": 1, "version": "0.5.23"}


def test_the_served_name_weight_version_and_launch_revision_are_read_as_reported():
    identity = identity_from_model_info(MODEL_INFO)
    assert (identity.name, identity.weight_version) == ("kimi-k2.5", "step-1200")
    assert revision_from_server_info(SERVER_INFO) == "3f2a9c1"


def test_keys_a_server_does_not_report_stay_none_never_guessed():
    identity = identity_from_model_info({"model_path": "/models/m"})  # an older server: no weight_version
    assert identity == ModelIdentity("/models/m", revision=None, weight_version=None)
    assert revision_from_server_info({**SERVER_INFO, "revision": None}) is None  # launched without --revision
    assert revision_from_server_info({"stream_interval": 1}) is None
    assert revision_from_server_info([]) is None and identity_from_model_info("oops").name == "unknown"


def test_the_record_keeps_both_values_and_leaves_the_field_out_when_the_server_said_neither():
    record = CompletionRecord(
        id="d/0", run="r", dataset="d", partition="short", messages=[], reasoning="", content="hi",
        finish_reason="stop", matched_stop=None, usage=Usage(1, 1, 0, 0), upstream="http://h", model="m",
        sampling={}, timing=Timing(0.0, 0.0, None, 1.0), attempts=1, worker="w")
    assert "model_revision" not in json.loads(record.to_json_line())

    record.model_revision = ModelIdentity("m", revision=None, weight_version="default").record_field()
    line = record.to_json_line()
    assert json.loads(line)["model_revision"] == {"revision": None, "weight_version": "default"}
    assert CompletionRecord.from_json(line).model_revision == {"revision": None, "weight_version": "default"}
    assert ModelIdentity("m").record_field() is None
