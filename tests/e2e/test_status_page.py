"""`genfleet status --serve`: a finished run (one worker, the simulator, a prompt dead-lettered for its
length whose own id is markup) served as a live page, read as JSON, looked at in headless Chromium,
and refused beyond loopback without GENFLEET_FLOWER_AUTH."""
from __future__ import annotations

import html
import re
import subprocess
import sys
from dataclasses import replace

import httpx
import pytest
from helpers.children import terminate
from helpers.data import write_jsonl
from helpers.fleet import Fleet
from helpers.flower import chromium_driver
from helpers.paths import ARTIFACTS
from helpers.redis_server import observer
from helpers.sim_process import SimProcess, free_port
from helpers.waits import wait_until

from genfleet.common.run_state import RunState
from genfleet.status.eta import FLEET, Eta
from genfleet.status.page import page_fragment, read_page
from genfleet.status.read_model import read_status
from genfleet.status.render import status_json

RUN = "paged"
FLOWER = "http://flower.example:5555"
AUTH = "watcher:s3cret"
# A prompt id is the row's own id: anybody's text. This one is markup that would run if unescaped.
HOSTILE_KEY = '<img src=x onerror="window.pwned=1">'
# Fast, and a context of 200 tokens: the long prompt is a 400 (permanent), dead-lettered at once.
SIM = ("--length-scale", "0.05", "--rate", "400", "--context-length", "200")


class PageProcess:
    """`genfleet status --run RUN --serve PORT *args`, answering on return."""

    def __init__(self, fleet: Fleet, *args: str, auth: str | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in fleet.env.items() if k != "GENFLEET_FLOWER_AUTH"}
        if auth:
            env["GENFLEET_FLOWER_AUTH"] = auth
        self.log = fleet.workdir / f"page-{self.port}.log"
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "genfleet", "status", "--run", RUN, "--serve", str(self.port), *args],
                env=env, cwd=fleet.workdir, stdout=log, stderr=subprocess.STDOUT)
        wait_until(lambda: httpx.get(f"{self.url}/api/status.json", timeout=2).status_code in (200, 401), 20, 0.1,
                   lambda: f"the page did not come up:\n{self.log.read_text()}", ignore=(httpx.HTTPError,))

    def stop(self) -> None:
        terminate(self.process)


@pytest.fixture(scope="module")
def served(redis_server: str, tmp_path_factory: pytest.TempPathFactory):
    """30 chat prompts plus one too long (its id is HOSTILE_KEY), 12 code prompts, run to the end by
    one worker; the page serves it with Flower links to FLOWER."""
    observer(redis_server).flushall()
    workdir = tmp_path_factory.mktemp("status-page")
    chat = write_jsonl(workdir / "chat.jsonl", [{"id": f"q{i}", "prompt": f"chat question {i}"} for i in range(30)]
                       + [{"id": HOSTILE_KEY, "prompt": "a very long prompt " * 60}])
    code = write_jsonl(workdir / "code.jsonl", [{"prompt": f"code question {i}"} for i in range(12)])
    with Fleet(redis_server, workdir) as fleet, SimProcess(*SIM) as sim:
        worker = fleet.start_worker("short", sim.url, wait=False)
        worker.wait_ready()
        fleet.enqueue(RUN, f"chat={chat}", f"code={code}")
        fleet.wait_finished(RUN, timeout=60)
        page = PageProcess(fleet, "--flower-url", FLOWER)
        try:
            yield fleet, page
        finally:
            page.stop()


def test_the_json_endpoint_is_status_json_with_the_last_hour_the_histograms_and_the_failures(served):
    fleet, page = served
    served_json = httpx.get(f"{page.url}/api/status.json", timeout=10).json()
    expected = status_json(read_status(fleet.redis, RUN))
    for key in ("run", "finished", "workers", "unaccounted", "alarms"):
        assert served_json[key] == expected[key], key
    counters = ("total", "done", "failed", "completion_tokens", "truncated", "pending", "done_by_partition")
    assert [{k: d[k] for k in counters} for d in served_json["datasets"]] \
        == [{k: d[k] for k in counters} for d in expected["datasets"]]
    by_name = {d["dataset"]: d for d in served_json["datasets"]}
    assert (by_name["chat"]["done"], by_name["chat"]["failed"], by_name["code"]["done"]) == (30, 1, 12)

    minutes = served_json["minutes"]
    assert len(minutes) == 60 and [m["ago_min"] for m in minutes] == list(range(59, -1, -1))
    # Every completion of the run falls in the last hour: the minutes add up to the counters ...
    assert sum(m["req_per_min"] * m["seconds"] / 60 for m in minutes) == pytest.approx(42)
    assert sum(m["tok_per_s"] * m["seconds"] for m in minutes) \
        == pytest.approx(served_json["totals"]["completion_tokens"])
    # ... and the last one is the table's 1-minute rate (both averaged over the run's age while it is young).
    assert minutes[-1]["tok_per_s"] == pytest.approx(served_json["totals"]["rates"]["1m"]["tok_per_s"], abs=0.01)
    for name, done in (("chat", 30), ("code", 12)):
        assert sum(served_json["length_histograms"][name].values()) == done

    (failure,) = served_json["recent_failures"]
    assert served_json["dead_letters"] == 1
    assert failure["id"] == f"chat/{HOSTILE_KEY}" and failure["error_class"] == "permanent"
    assert "context length" in failure["message"]
    assert failure["flower"].startswith(f"{FLOWER}/tasks?name=")


def test_the_page_draws_a_bar_per_dataset_the_hours_charts_and_shows_a_hostile_id_as_text(served):
    _, page = served
    driver = chromium_driver()
    try:
        driver.get(page.url)
        bars = {bar.get_attribute("aria-label"): bar for bar in driver.find_elements("css selector", "svg.progress")}
        assert set(bars) == {"chat", "code"}
        assert bars["chat"].get_attribute("aria-valuenow") == f"{100 * 30 / 31:.1f}"
        assert bars["code"].get_attribute("aria-valuenow") == "100.0"
        # Drawn, not just declared: the green part is that share of the bar's width on screen.
        drawn = driver.execute_script(
            "return Array.from(document.querySelectorAll('svg.progress')).map(s => "
            "[s.getAttribute('aria-label'), s.querySelector('rect.done').getBoundingClientRect().width "
            "/ s.querySelector('rect.track').getBoundingClientRect().width])")
        assert dict(drawn) == {"chat": pytest.approx(30 / 31, abs=0.01), "code": pytest.approx(1.0, abs=0.01)}
        assert "96.8%" in driver.find_element("id", "progress").text

        lines = driver.find_elements("css selector", "#rates svg.chart polyline.series")
        assert len(lines) == 2  # tok/s and req/min
        for line in lines:
            points = [tuple(map(float, p.split(","))) for p in line.get_attribute("points").split()]
            assert len(points) == 60
            assert min(y for _, y in points) < max(y for _, y in points)  # the run shows as a rise
        assert len(driver.find_elements("css selector", "#lengths svg.histogram")) == 2
        assert driver.find_elements("css selector", "#lengths svg.histogram rect.bar")

        link = driver.find_element("css selector", "#failures a[href*='args']")
        assert link.text == f"chat/{HOSTILE_KEY}"  # shown as text ...
        assert driver.execute_script("return window.pwned") is None  # ... never run as markup
        assert not driver.find_elements("css selector", "#failures img")
        assert link.get_attribute("href").startswith(f"{FLOWER}/tasks?name=genfleet.generate")
        # The page refreshes itself: page.js fetches the fragment (the CSP lets only this server's script run).
        wait_until(lambda: driver.find_element("id", "live").text.startswith("live ·"), 10, 0.2,
                   "the page never refreshed")
        # The whole page in one picture, for a person to look at.
        driver.set_window_size(1600, driver.execute_script("return document.documentElement.scrollHeight") + 120)
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "status_page.png"))
    finally:
        driver.quit()


def test_on_loopback_without_auth_a_request_for_another_host_name_is_refused(served):
    _, page = served
    assert httpx.get(f"{page.url}/api/status.json", headers={"Host": "rebound.example"}, timeout=5).status_code == 400
    assert httpx.get(f"{page.url}/api/status.json", headers={"Host": "localhost"}, timeout=5).status_code == 200


def test_beyond_loopback_the_page_refuses_to_start_without_flower_auth_and_asks_for_it_with(served):
    fleet, _ = served
    env = {k: v for k, v in fleet.env.items() if k != "GENFLEET_FLOWER_AUTH"}
    port = free_port()
    refused = subprocess.run([sys.executable, "-m", "genfleet", "status", "--run", RUN, "--serve", str(port),
                              "--bind", "0.0.0.0"], env=env, cwd=fleet.workdir, capture_output=True, text=True,
                             timeout=30)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "--bind 0.0.0.0" in refused.stderr
    assert "GENFLEET_FLOWER_AUTH" in refused.stderr
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/", timeout=2)

    page = PageProcess(fleet, "--bind", "0.0.0.0", auth=AUTH)
    try:
        denied = httpx.get(f"{page.url}/api/status.json", timeout=5)
        assert denied.status_code == 401 and denied.headers["www-authenticate"].startswith("Basic")
        assert httpx.get(f"{page.url}/", auth=("watcher", "wrong"), timeout=5).status_code == 401
        allowed = httpx.get(f"{page.url}/api/status.json", auth=tuple(AUTH.split(":")), timeout=5,
                            headers={"Host": "status.example"})  # any host name, once authenticated
        assert allowed.status_code == 200 and allowed.json()["run"] == RUN
    finally:
        page.stop()


def test_a_dataset_name_forged_into_redis_is_shown_as_text_not_markup(served):
    # common/names.py keeps such names out of every run genfleet enqueues; Redis itself keeps nothing out.
    fleet, _ = served
    forged = "<script>alert(1)</script>"
    RunState(fleet.redis, "forged").register_dataset(forged, "x.jsonl")
    markup = page_fragment(read_page(fleet.redis, "forged", FLOWER), [f"{forged}: an alarm"])
    assert "<script" not in markup
    assert html.escape(forged) in markup


def test_a_dataset_still_running_shows_its_eta_as_a_range(served):
    fleet, _ = served
    data = read_page(fleet.redis, RUN, FLOWER)
    chat = data.status.datasets[0]
    running = replace(chat, progress=replace(chat.progress, total=chat.progress.total + 10),
                      eta=Eta(low_s=120, expected_s=180, high_s=300, basis=FLEET, samples=42))
    status = replace(data.status, datasets=[running, *data.status.datasets[1:]])
    text = re.sub(r"<[^>]+>", " ", page_fragment(replace(data, status=status), []))
    assert "2m–5m *" in text  # low–high, marked: mostly from lengths seen fleet-wide
    assert "30 / 41" in text and "73.2%" in text
