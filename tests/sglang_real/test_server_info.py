"""What genfleet reads from the real server about itself (workers/servers/sglang_info.py): the stream
mode and stream interval from `/server_info`, the weight version from `/model_info`; as `genfleet
doctor` prints them, as the workers' reader returns them, and as records carry them.

SGLang 0.5.23 `/server_info` is `server_args.resolved_dict()` flat (`utils/common.py::build_server_info`):
`incremental_streaming_output` is the launch flag (default False) and `stream_interval` the server's
default interval, 1 unless `--stream-interval` (`arg_groups/fields/serving.py`); neither session
server sets it. `/model_info` `weight_version` is `--weight-version` ("default" unless set; the
session servers set one each, conftest.py), and `/server_info` `revision` is `--revision` (none)."""
from __future__ import annotations

import json

import httpx
import pytest
from tier import enqueue, write_plan_prompts

from genfleet.workers.servers.api import ModelIdentity
from genfleet.workers.servers.sglang_info import ServerInfo, StreamMode

SGLANG_DEFAULT_STREAM_INTERVAL = 1


def launched_incremental(server) -> bool:
    return "--incremental-streaming-output" in server.flags


def launched_weight_version(server) -> str:
    return server.flags[server.flags.index("--weight-version") + 1]


def test_doctor_prints_each_servers_stream_mode_and_interval_as_its_server_info_reports_them(
        servers, real_fleet, model):
    urls = [server.url for server in servers.values()]
    result = real_fleet.genfleet("doctor", "--json", *(arg for url in urls for arg in ("--upstream", url)),
                                 check=False)
    rows = {check["name"]: check for check in json.loads(result.stdout)["checks"]}
    for name, server in servers.items():
        row = rows[f"upstream {server.url}"]
        assert row["status"] in ("ok", "warn"), row  # warn: the parser differs from GENFLEET_REASONING_PARSER
        stream = "incremental" if launched_incremental(server) else "cumulative"
        assert f"stream {stream}, stream_interval {SGLANG_DEFAULT_STREAM_INTERVAL} " in row["detail"], (name, row)
        assert f"reasoning parser {server.flags[server.flags.index('--reasoning-parser') + 1]};" in row["detail"]


def test_the_workers_reader_takes_stream_mode_interval_and_weight_version_from_the_real_server(servers):
    with httpx.Client() as http:
        reader = ServerInfo(http)
        for server in servers.values():
            assert reader.stream_mode(server.url) == StreamMode(launched_incremental(server),
                                                                SGLANG_DEFAULT_STREAM_INTERVAL)
            assert reader.model_identity(server.url) == ModelIdentity(
                str(server.model_dir), revision=None, weight_version=launched_weight_version(server))


@pytest.mark.parametrize("api", ["generate", "chat"])
def test_every_record_carries_the_weight_version_its_own_server_reports(
        api, servers, real_fleet, model, tmp_path):
    # One worker over both servers; affinity routing hashes each (distinct) prompt to a host, so
    # 16 prompts all landing on one of the two is a 2 in 65,536 chance.
    real_fleet.configure(api=api)
    real_fleet.start_worker("short", *(server.url for server in servers.values()), concurrency=8)
    data = write_plan_prompts(tmp_path / "q.jsonl", 16, ("[plan len=4 think=4]",))
    enqueue(real_fleet, model, "identity", f"q={data}")
    progress = real_fleet.wait_finished("identity", timeout=120)
    assert progress.totals().done == 16 and progress.totals().failed == 0

    by_url = {server.url: server for server in servers.values()}
    records = real_fleet.records("identity")
    assert {record["upstream"] for record in records} == set(by_url)
    for record in records:
        server = by_url[record["upstream"]]
        assert record["model_revision"] == {"revision": None, "weight_version": launched_weight_version(server)}
        assert record["model"] == str(server.model_dir)
