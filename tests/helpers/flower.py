"""`genfleet flower` as a process of the test's, and a headless Chromium to look at it with."""
from __future__ import annotations

import shutil
import subprocess
import sys

import httpx
import pytest

from helpers.children import terminate
from helpers.fleet import Fleet
from helpers.sim_process import free_port
from helpers.waits import wait_until


class FlowerProcess:
    """`genfleet flower` with basic auth `user:password`, on the fleet's Redis; with `wait`, up
    (its /healthcheck answers) on return."""

    def __init__(self, fleet: Fleet, auth: str, *, port: int | None = None, wait: bool = True) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.auth = tuple(auth.split(":", 1))
        self.log = fleet.workdir / "flower.log"
        env = {**fleet.env, "GENFLEET_FLOWER_AUTH": auth}
        with open(self.log, "w") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen([sys.executable, "-m", "genfleet", "flower", "--port", str(self.port)],
                                            env=env, cwd=fleet.workdir, stdout=log, stderr=subprocess.STDOUT)
        if wait:
            wait_until(lambda: httpx.get(f"{self.url}/healthcheck", timeout=2).status_code == 200, 30, 0.2,
                       "Flower not up", ignore=(httpx.HTTPError,))

    def api(self, path: str, **params: object) -> object:
        response = httpx.get(f"{self.url}{path}", params=params, auth=self.auth, timeout=10)
        response.raise_for_status()
        return response.json()

    def stop(self) -> None:
        terminate(self.process)


def chromium_driver():
    """Headless Chromium through Debian's chromedriver (no download: Selenium Manager stays idle)."""
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not chromedriver:
        # `make test` installs them where it can (root and apt); elsewhere this test cannot run.
        pytest.skip("headless Chromium is not installed and `make chromium` could not install it here: "
                    "`sudo apt-get install chromium chromium-driver` to run the Flower browser test")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1600,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    driver.set_page_load_timeout(30)
    return driver
