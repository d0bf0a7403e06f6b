"""The dashboard and the autoscaler, asked of a real Prometheus: Debian's `prometheus` scrapes a
worker's and Flower's /metrics every second during a small run, and every query of the Grafana
dashboard (deploy/grafana/genfleet.json) and of the KEDA triggers (deploy/k8s/keda.yaml) is
evaluated by it. A panel that shows "No data" for a run that did the thing it charts is a bug."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import promql_parser
import pytest
from helpers.data import write_prompts
from helpers.deploy_queries import (
    PanelQuery,
    fill_variables,
    keda_queries,
    panel_queries,
    query_variables,
    regex_value,
    series_selectors,
)
from helpers.fleet import Fleet
from helpers.flower import FlowerProcess
from helpers.prometheus import PrometheusServer, ScrapeJob, prometheus_binary
from helpers.redis_server import observer
from helpers.sim_process import SimProcess, free_port
from helpers.waits import wait_until

FLOWER_AUTH = "scraper:s3cret"
RUN = "scraped"
DATASETS = ("chat", "code")
WRITTEN = 36  # 24 chat + 12 code prompts; the 13th code prompt is too long for the server
# ~1 s completions of ~40 tokens (40 tok/s each), 10% of requests answered with HTTP 500 (retried),
# prompts over 200 tokens refused with a 400 (dead-lettered: Flower's task-failed).
SIM = ("--rate", "40", "--knee", "100000", "--length-median", "40", "--length-mean", "41",
       "--context-length", "200", "--http-500-rate", "0.1", "--fault-seed", "3")
CONCURRENCY = 8  # 37 prompts in ~5 rounds: several scrapes see the run at work
# chat is cut at 24 tokens (finish_reason length), code never is: the truncated-share panel must
# show 0 for code, not leave it out.
RUN_FILE = """
first_max_new_tokens = "auto"
[datasets.chat]
path = "chat.jsonl"
max_new_tokens = 24
[datasets.code]
path = "code.jsonl"
max_new_tokens = 400
"""


@dataclass(frozen=True)
class ScrapedRun:
    prometheus: PrometheusServer
    started: float  # unix time the enqueue began
    ended: float  # unix time Prometheus had scraped the finished run


@pytest.fixture(scope="module")
def scraped(redis_server: str, tmp_path_factory: pytest.TempPathFactory):
    """A run of 37 prompts on one short worker, with Flower and a Prometheus that scraped both from
    before the first prompt was enqueued until after the last was written."""
    prometheus_binary()  # skip before starting anything
    observer(redis_server).flushall()
    workdir = tmp_path_factory.mktemp("scraped")
    write_prompts(workdir / "chat.jsonl", 24, "chat question number")
    # Last in the queue: the failure ratio has been shown (as 0) for a while before the one failure.
    write_prompts(workdir / "code.jsonl", 12, "code question number", extra=("a very long prompt " * 60,))
    (workdir / "run.toml").write_text(RUN_FILE)
    # Three 500s in a row would open the single upstream's circuit for 30 s: not what this run is about.
    # `--in-flight auto` and `--first-max-new-tokens auto`, for the admission panels (the sim answers /v1/loads).
    with Fleet(redis_server, workdir, retry_backoff_s=0.1, retry_backoff_max_s=0.3, breaker_failures=50,
               in_flight_mode="auto", admission_interval_s=0.5) as fleet, \
            SimProcess(*SIM) as sim:
        worker_port, flower_port = free_port(), free_port()
        # A worker pod's series carry its namespace (prometheus-operator's PodMonitor relabelling adds
        # `namespace` from the pod's); the KEDA queries select on it.
        jobs = (ScrapeJob("genfleet-worker", (f"127.0.0.1:{worker_port}",), {"namespace": "genfleet"}),
                # Flower 2.2.0 serves /metrics without asking for the password (flower/views/monitor.py
                # has no @web.authenticated); the job sends it anyway, so the scrape holds if Flower starts asking.
                ScrapeJob("flower", (f"127.0.0.1:{flower_port}",), basic_auth=FLOWER_AUTH))
        # All three start at once; the targets are down until the worker and Flower are up.
        worker = fleet.start_worker("short", sim.url, concurrency=CONCURRENCY, metrics_port=worker_port, wait=False)
        with PrometheusServer(workdir / "prometheus", *jobs) as prometheus:
            flower = FlowerProcess(fleet, FLOWER_AUTH, port=flower_port)
            try:
                worker.wait_ready()
                prometheus.wait_scraping()
                started = time.time()
                fleet.enqueue(RUN, extra=("--run-file", str(workdir / "run.toml")))
                fleet.wait_finished(RUN, timeout=60)
                wait_until(lambda: prometheus.query(f'sum(genfleet_completions_total{{run="{RUN}"}}) == {WRITTEN}'),
                           10, 0.2, "Prometheus has not scraped the finished run")
                yield ScrapedRun(prometheus, started, time.time())
            finally:
                flower.stop()


def all_values() -> dict[str, str]:
    """Every variable at "All", the dashboard's default."""
    return {variable.name: variable.all_value for variable in query_variables()}


def picked_values() -> dict[str, str]:
    """The run and both its datasets picked by name (a multi-value regex, as Grafana sends it)."""
    return {"run": regex_value([RUN]), "dataset": regex_value(DATASETS)}


def numbers(result: list[dict]) -> list[float]:
    return [value for series in result if not math.isnan(value := float(series["value"][1]))]


def every_panel(values: dict[str, str]) -> list[tuple[PanelQuery, str]]:
    return [(query, fill_variables(query.expr, values)) for query in panel_queries()]


@pytest.mark.parametrize("values", [all_values, picked_values], ids=["all", "picked"])
def test_every_dashboard_panel_query_returns_a_number_for_the_run(scraped, values):
    queries = every_panel(values())
    assert len(queries) >= 30, "the dashboard's panels were not found"

    def empty() -> list[str]:
        return [f"{query} -> {result}" for query, expr in queries
                if not numbers(result := scraped.prometheus.query(expr))]

    # Flower's last events and the last scrape may trail the run's end by a second or two.
    wait_until(lambda: not empty(), 10, 0.5, lambda: "panels with no data:\n" + "\n".join(empty()))


def test_a_panel_split_by_dataset_shows_every_dataset_of_the_run(scraped):
    missing = []
    for query, expr in every_panel(all_values()):
        shown = {series["metric"]["dataset"] for series in scraped.prometheus.query(expr)
                 if "dataset" in series["metric"]}
        if shown and shown != set(DATASETS):
            missing.append(f"{query} shows {sorted(shown)}")
    assert not missing, "panels that leave a dataset out:\n" + "\n".join(missing)


def test_every_series_a_panel_selects_is_scraped(scraped):
    # A selector behind `or vector(0)` still returns a sample when its metric is misnamed: check each.
    unmatched = [f"{query}: {selector}" for query, expr in every_panel(all_values())
                 for selector in series_selectors(expr) if not scraped.prometheus.query(selector)]
    assert not unmatched, "selectors that match no series:\n" + "\n".join(unmatched)


def test_a_ratio_panel_has_a_value_wherever_its_denominator_has_one(scraped):
    """From the enqueue on, a share or a ratio is shown (0 while nothing happened yet), never a gap
    where the thing it divides by exists."""
    checked, gaps = 0, []
    # The denominator is sent as promql-parser renders it: fine for "All" (`.*`, nothing escaped).
    for query, expr in every_panel(all_values()):
        parsed = promql_parser.parse(expr)
        if not isinstance(parsed, promql_parser.BinaryExpr) or str(parsed.op) != "/":
            continue
        checked += 1
        ratio, denominator = (
            {(tuple(sorted(s["metric"].items())), t) for s in scraped.prometheus.query_range(
                text, scraped.started, scraped.ended) for t, _ in s["values"]}
            for text in (expr, str(parsed.rhs)))
        if lost := denominator - ratio:
            gaps.append(f"{query}: no value at {len(lost)} of {len(denominator)} steps, e.g. {min(lost)}")
    assert checked >= 3, "the dashboard's ratio panels were not found"
    assert not gaps, "ratios with gaps:\n" + "\n".join(gaps)


def test_dashboard_variables_list_the_run_and_its_datasets(scraped):
    found = {variable.name: scraped.prometheus.label_values(variable.label,
                                                            fill_variables(variable.match, picked_values()))
             for variable in query_variables()}
    assert found == {"run": [RUN], "dataset": sorted(DATASETS)}


def test_keda_triggers_count_the_waiting_and_the_running_prompts_of_their_partition(scraped):
    prometheus = scraped.prometheus
    queries = keda_queries()
    assert set(queries) == {"genfleet-worker-short", "genfleet-worker-long"}
    # Both answer once the run is over: no work left (queue depth is read fleet-wide, so the long
    # trigger has its number too; with no long pod yet, its in-flight term is the `or vector(0)`).
    for name, query in queries.items():
        wait_until(lambda query=query: numbers(prometheus.query(query)) == [0], 10, 0.5,
                   lambda name=name, query=query: f"{name}: {prometheus.query(query)}")
    short = queries["genfleet-worker-short"]
    assert all(prometheus.query(selector) for selector in series_selectors(short))

    def over_the_run(expr: str) -> dict[float, float]:
        (series,) = prometheus.query_range(expr, scraped.started, scraped.ended)
        return {t: float(v) for t, v in series["values"]}

    work = over_the_run(short)
    waiting = over_the_run('max(genfleet_queue_depth{namespace="genfleet", queue="short"})')
    # While prompts waited, the work was more than one pod's slots; as the queue drained, the
    # running prompts still counted: scale-in never sees a busy pool as idle.
    assert max(work.values()) > CONCURRENCY, work
    assert any(waiting[t] == 0 < work[t] for t in work), (work, waiting)
