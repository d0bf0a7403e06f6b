"""One run watched from every side: Flower (API and a real browser), `genfleet status` (table and
JSON against the shards and dead letters), Prometheus /metrics on the workers, and the Grafana
dashboard's queries against what is exported."""
from __future__ import annotations

import ast
import base64
import json
import re
from collections import Counter

import httpx
import pytest
from helpers.data import write_prompts
from helpers.fleet import Fleet
from helpers.flower import FlowerProcess, chromium_driver
from helpers.metrics import scrape, total
from helpers.paths import ARTIFACTS, DEPLOY
from helpers.redis_server import observer
from helpers.sim_process import SimProcess, free_port
from helpers.waits import NOT_YET, wait_until

FLOWER_AUTH = "watcher:s3cret"
# A fast simulator that answers 10% of requests with HTTP 500 (retried) and rejects prompts over
# 200 tokens with a 400 (permanent: dead-lettered at once).
OBSERVED_SIM = ("--length-scale", "0.05", "--rate", "400", "--context-length", "200",
                "--http-500-rate", "0.1", "--fault-seed", "7")
RUN = "watched"


@pytest.fixture(scope="class")
def observed(redis_server: str, tmp_path_factory: pytest.TempPathFactory):
    """One run watched from every side: 40 chat prompts (one more too long for the server's
    context), 12 code prompts pinned to the long pool; Flower, both pools and /metrics stay up."""
    observer(redis_server).flushall()
    workdir = tmp_path_factory.mktemp("observed")
    data = workdir / "data"
    data.mkdir()
    chat = write_prompts(data / "chat.jsonl", 40, "chat question number", extra=("a very long prompt " * 60,))
    code = write_prompts(data / "code.jsonl", 12, "code question number")
    # Three 500s in a row would open the single upstream's circuit for 30 s: not what this run is about.
    with Fleet(redis_server, workdir, retry_backoff_s=0.1, retry_backoff_max_s=0.3, breaker_failures=50) as fleet, \
            SimProcess(*OBSERVED_SIM) as sim:
        flower = FlowerProcess(fleet, FLOWER_AUTH)
        try:
            ports = {"short": free_port(), "long": free_port()}
            workers = [fleet.start_worker(pool, sim.url, metrics_port=port, wait=False)
                       for pool, port in ports.items()]
            for worker in workers:
                worker.wait_ready()
            fleet.enqueue(RUN, f"chat={chat}", f"code={code}:long")
            fleet.wait_finished(RUN, timeout=60)
            yield fleet, flower, ports
        finally:
            flower.stop()


@pytest.mark.usefixtures("observed")
class TestObservedRun:
    RUN = RUN

    def test_flower_api_lists_both_pools_and_task_summaries_and_a_typed_failure(self, observed):
        _, flower, _ = observed
        assert httpx.get(f"{flower.url}/api/workers", timeout=5).status_code == 401  # GENFLEET_FLOWER_AUTH
        workers = wait_until(lambda: flower.api("/api/workers", refresh=1), 30, 0.2, "no workers in Flower",
                             ignore=NOT_YET)
        assert {name.split("-")[0] for name in workers} == {"short", "long"}

        tasks = wait_until(lambda: (t := flower.api("/api/tasks", limit=1000))
                           and Counter(v["state"] for v in t.values())["SUCCESS"] >= 52 and t,
                           30, 0.2, "Flower has not seen every task finish", ignore=NOT_YET)
        succeeded = [t for t in tasks.values() if t["state"] == "SUCCESS"]
        for task in succeeded:
            summary = ast.literal_eval(task["result"])
            assert {"completion_tokens", "reasoning_tokens", "finish_reason", "upstream", "seconds",
                    "tok_s"} <= summary.keys()
            # argsrepr: id, partition and size, never the prompt itself
            assert task["args"].startswith(summary["id"]) and "prompt tokens" in task["args"]
            assert "question number" not in task["args"]
        assert {t["args"].split()[1] for t in succeeded} == {"short", "long"}

        (failed,) = [t for t in tasks.values() if t["state"] == "FAILURE"]
        assert failed["exception"].startswith("PermanentError(")
        assert "permanent, dead-lettered: " in failed["exception"]
        assert "context length" in failed["exception"]
        retried = [t for t in tasks.values() if t.get("retries")]
        for task in retried:  # a retry's message carries the same short argsrepr
            assert "question number" not in task["args"]

    def test_flower_pages_in_a_real_browser_show_the_workers_and_the_failed_task(self, observed):
        _, flower, _ = observed
        driver = chromium_driver()
        try:
            token = base64.b64encode(FLOWER_AUTH.encode()).decode()
            driver.execute_cdp_cmd("Network.enable", {})
            driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {token}"}})
            driver.get(f"{flower.url}/workers")

            def pools_listed() -> set[str]:
                # Names are split in two spans for display; the link's title holds the whole name.
                links = driver.find_elements("css selector", "#workers-table a.worker-name-link")
                return {link.get_attribute("title").split("-")[0] for link in links}

            assert wait_until(lambda: pools_listed() >= {"short", "long"} and pools_listed(), 30, 0.2,
                              "workers not on the dashboard", ignore=NOT_YET) == {"short", "long"}
            body = driver.find_element("tag name", "body").text
            assert "Online workers" in body and "Online" in driver.find_element("id", "workers-table").text
            ARTIFACTS.mkdir(exist_ok=True)
            driver.save_screenshot(str(ARTIFACTS / "flower-workers.png"))

            driver.get(f"{flower.url}/tasks?state=FAILURE")
            body = wait_until(lambda: (text := driver.find_element("id", "tasks-table").text)
                              and "PermanentError" in text and text, 30, 0.2,
                              "the failed task not on the tasks page", ignore=NOT_YET)
            assert "FAILURE" in body and "chat/40" in body  # the too-long prompt's id, from argsrepr
            driver.save_screenshot(str(ARTIFACTS / "flower.png"))

            driver.get(f"{flower.url}/tasks?state=SUCCESS")
            body = wait_until(lambda: (text := driver.find_element("id", "tasks-table").text)
                              and "tok_s" in text and text, 30, 0.2,
                              "task summaries not on the tasks page", ignore=NOT_YET)
            assert "completion_tokens" in body
            driver.save_screenshot(str(ARTIFACTS / "flower-succeeded.png"))
        finally:
            driver.quit()

    def test_status_json_matches_the_shards_and_dead_letters(self, observed):
        fleet, _, _ = observed
        status = json.loads(fleet.genfleet("status", "--run", self.RUN, "--json").stdout)
        records = fleet.records(self.RUN)
        letters = fleet.genfleet("failures", "--run", self.RUN).stdout
        by_dataset = {d["dataset"]: d for d in status["datasets"]}
        for name in ("chat", "code"):
            mine = [r for r in records if r["dataset"] == name]
            row = by_dataset[name]
            assert row["done"] == len({r["id"] for r in mine})
            assert row["completion_tokens"] == sum(r["usage"]["completion_tokens"] for r in mine)
            assert row["truncated"] == sum(r["finish_reason"] == "length" for r in mine)
            assert row["completion_tokens_stats"]["samples"] == len(mine)
            lengths = sorted(r["usage"]["completion_tokens"] for r in mine)
            # Within a histogram bucket (~9%) of the middle sample(s).
            median = row["completion_tokens_stats"]["median"]
            assert lengths[(len(lengths) - 1) // 2] / 1.1 <= median <= lengths[len(lengths) // 2] * 1.1
            assert lengths[-2] / 1.1 <= row["completion_tokens_stats"]["p99"] <= lengths[-1] * 1.1
            assert row["completion_tokens_stats"]["mean"] == pytest.approx(sum(lengths) / len(lengths))
            assert row["pending"] == 0 and row["in_flight"] == 0 and row["eta"]["expected_s"] == 0
            assert row["rates"]["10m"]["req_per_min"] > 0 and row["rates"]["10m"]["tok_per_s"] > 0
        assert by_dataset["chat"]["failed"] == 1 and "permanent" in letters and "context length" in letters
        assert by_dataset["chat"]["total"] == 41 and by_dataset["code"]["total"] == 12
        assert by_dataset["code"]["done_by_partition"] == {"long": 12}
        assert by_dataset["chat"]["done_by_partition"] == {"short": 40}
        totals = status["totals"]
        assert totals["done"] == 52 and totals["failed"] == 1 and status["finished"]
        assert {p["partition"]: p["workers"] for p in status["partitions"]} == {"short": 1, "long": 1}
        assert [u["down_in"] for u in status["upstreams"]] == [0] and status["workers"] == 2
        assert status["alarms"] == [] or all("errors:" in a for a in status["alarms"])

        table = fleet.genfleet("status", "--run", self.RUN).stdout
        for heading in ("done/total", "req/min", "tok/s", "trunc %", "loop %", "ETA", "in flight", "partitions"):
            assert heading in table
        wide = fleet.genfleet("status", "--run", self.RUN, "--wide").stdout
        for heading in ("req/min 1m·10m", "tokens p50·mean·p99", "rejected", "skipped"):
            assert heading in wide
        (fleet.workdir / "status.txt").write_text(f"{table}\n{wide}")

    def test_worker_metrics_expose_tokens_latency_errors_and_queues(self, observed):
        fleet, _, ports = observed
        status = json.loads(fleet.genfleet("status", "--run", self.RUN, "--json").stdout)
        metrics = {pool: scrape(f"http://127.0.0.1:{port}") for pool, port in ports.items()}
        short, long = metrics["short"], metrics["long"]
        by_dataset = {d["dataset"]: d for d in status["datasets"]}
        assert total(short, "genfleet_completion_tokens_total", dataset="chat", partition="short") \
            == by_dataset["chat"]["completion_tokens"]
        assert total(long, "genfleet_completion_tokens_total", dataset="code", partition="long") \
            == by_dataset["code"]["completion_tokens"]
        assert total(short, "genfleet_completions_total") == 40
        assert total(short, "genfleet_errors_total", error="PermanentError", error_class="permanent") == 1
        # HTTP 500s were retried: transient errors, each followed by a success.
        assert total(short, "genfleet_errors_total", error_class="transient") \
            + total(long, "genfleet_errors_total", error_class="transient") >= 1
        assert total(short, "genfleet_request_duration_seconds_count") == 40
        assert total(short, "genfleet_time_to_first_token_seconds_count") == 40
        assert total(short, "genfleet_time_to_first_token_seconds_bucket", le="3600.0") == 40
        assert 0 < total(short, "genfleet_time_to_first_token_seconds_sum") / 40 < 5
        assert total(short, "genfleet_tasks_in_flight") == 0
        assert total(short, "genfleet_queue_depth", queue="short") == 0
        assert total(short, "genfleet_unacked_messages") == 0
        assert total(short, "genfleet_upstream_up") == 1 and total(short, "genfleet_worker_slots") == 150
        assert total(long, "genfleet_worker_slots") == 32
        assert total(short, "process_resident_memory_bytes") > 0


    def test_grafana_dashboard_queries_metrics_the_workers_and_flower_export(self, observed):
        _, flower, ports = observed
        exported = {name for port in ports.values()
                    for name, _, _ in scrape(f"http://127.0.0.1:{port}")}
        flower_metrics = scrape(flower.url)
        exported |= {name for name, _, _ in flower_metrics}
        # Flower's runtime histogram reaches an hour (`genfleet flower` sets the buckets).
        assert any(name == "flower_task_runtime_seconds_bucket" and labels["le"] == "3600.0"
                   for name, labels, _ in flower_metrics)
        dashboard = json.loads((DEPLOY / "grafana" / "genfleet.json").read_text())
        queried = {name for panel in dashboard["panels"] for target in panel.get("targets", [])
                   for name in re.findall(r"\b((?:genfleet|flower|process)_[a-z_]+)", target["expr"])}
        assert {n for n in queried if n.startswith("flower_")} and {n for n in queried if n.startswith("genfleet_")}
        # Exported only by a run that uses the option (tests/e2e/test_prometheus_scrape.py runs one).
        assert queried - {"genfleet_first_max_new_tokens"} <= exported, queried - exported
