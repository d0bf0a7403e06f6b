"""Prometheus text exposition, read back: what a worker's or Flower's /metrics exports."""
from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[str, dict[str, str], float]


def parse_metrics(text: str) -> list[Sample]:
    """(sample name, labels, value) for every sample in a /metrics page."""
    return [(sample.name, sample.labels, sample.value)
            for family in text_string_to_metric_families(text) for sample in family.samples]


def scrape(url: str) -> list[Sample]:
    """The samples of `url`'s /metrics page (`url` is http://host:port)."""
    return parse_metrics(httpx.get(f"{url}/metrics", timeout=5).raise_for_status().text)


def total(samples: list[Sample], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(value for sample, have, value in samples
               if sample == name and all(have.get(k) == v for k, v in labels.items()))
