"""Debian's `prometheus` as a process of the test's: it scrapes the targets it is given every second
and answers PromQL over its HTTP API, so a query is checked by the engine Grafana and KEDA ask.

Its config, its TSDB and its log live in the test's directory; it listens on a free loopback port.
Where the binary is missing (`make prometheus` installs it as root) the tests that need it skip.
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml

from helpers.children import terminate
from helpers.sim_process import free_port
from helpers.waits import wait_until

SCRAPE_INTERVAL_S = 1  # rate() needs two samples inside its window: seconds of a run give several


@dataclass(frozen=True)
class ScrapeJob:
    """One scrape job: its targets (`host:port`), labels added to every series it scrapes, and
    basic auth (`user:password`) where the target asks for it."""

    name: str
    targets: tuple[str, ...]
    labels: dict[str, str] = field(default_factory=dict)
    basic_auth: str | None = None

    def config(self) -> dict:
        job: dict = {"job_name": self.name, "static_configs": [{"targets": list(self.targets), "labels": self.labels}]}
        if self.basic_auth:
            username, password = self.basic_auth.split(":", 1)
            job["basic_auth"] = {"username": username, "password": password}
        return job


def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is not installed and `make prometheus` could not install it here: "
                    "`sudo apt-get install prometheus` to run the tests that query a real Prometheus")
    return binary


class PrometheusServer:
    """`prometheus` scraping `jobs` every second, ready (its /-/ready answers) when started."""

    def __init__(self, directory: Path, *jobs: ScrapeJob) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = directory / "prometheus.yml"
        self.config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "scrape_timeout": f"{SCRAPE_INTERVAL_S}s"},
            "scrape_configs": [job.config() for job in jobs],
        }))
        self.log = directory / "prometheus.log"
        self.process: subprocess.Popen | None = None
        self.http = httpx.Client(base_url=self.url, timeout=10)  # one connection for many queries

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> None:
        binary = prometheus_binary()
        with open(self.log, "w") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                [binary, f"--config.file={self.config}", f"--storage.tsdb.path={self.directory / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT)

        def ready() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.process.returncode}:\n{self.tail()}")
            return self.http.get("/-/ready", timeout=1).status_code == 200

        wait_until(ready, 30, 0.1, lambda: f"prometheus not ready:\n{self.tail()}", ignore=(httpx.HTTPError,))

    def stop(self) -> None:
        self.http.close()
        terminate(self.process)

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def _get(self, path: str, **params: object) -> object:
        body = self.http.get(path, params=params).json()
        if body.get("status") != "success":  # a bad query answers 400 with Prometheus's own reason
            raise AssertionError(f"prometheus {path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """The instant vector (or scalar, as one sample) `expr` evaluates to now, or at unix time `at`:
        a list of {"metric": labels, "value": [time, "text"]}, as /api/v1/query answers it."""
        data = self._get("/api/v1/query", query=expr, **({} if at is None else {"time": at}))
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def query_range(self, expr: str, start: float, end: float, step: float = SCRAPE_INTERVAL_S / 2) -> list[dict]:
        """`expr` evaluated every `step` seconds from `start` to `end`: {"metric", "values"} per series.
        The default step is half the scrape interval, so no scrape goes unseen."""
        return self._get("/api/v1/query_range", query=expr, start=start, end=end, step=step)["result"]

    def label_values(self, label: str, match: str) -> list[str]:
        """Values of `label` on the series `match` selects (what Grafana's label_values() asks)."""
        return self._get(f"/api/v1/label/{label}/values", **{"match[]": match})

    def targets(self) -> list[dict]:
        """The active scrape targets with their health ("up", "down", "unknown") and last error."""
        return self._get("/api/v1/targets", state="active")["activeTargets"]

    def wait_scraping(self, timeout: float = 30.0) -> None:
        """Until every target has been scraped successfully."""
        def all_up() -> bool:
            targets = self.targets()
            return bool(targets) and all(t["health"] == "up" for t in targets)

        wait_until(all_up, timeout, 0.2, lambda: "targets not up: " + "; ".join(
            f"{t['scrapeUrl']} {t['health']} {t['lastError']}" for t in self.targets()), ignore=(httpx.HTTPError,))
