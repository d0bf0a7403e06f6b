"""The PromQL that deploy/ asks Prometheus: every panel query and template variable of the Grafana
dashboard (deploy/grafana/genfleet.json) and the KEDA triggers' queries (deploy/k8s/keda.yaml), with
Grafana's variables filled in the way Grafana fills them before it sends a query."""
from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import promql_parser
import yaml

from helpers.paths import DEPLOY

DASHBOARD = DEPLOY / "grafana" / "genfleet.json"
KEDA = DEPLOY / "k8s" / "keda.yaml"

# Grafana's built-in interval variables, as a panel over the last hour on a 15 s scrape gets them:
# $__rate_interval = max($__interval + scrape interval, 4 x scrape interval) (Grafana's Prometheus
# data source docs, "Using __rate_interval").
BUILT_INS = {"__rate_interval": "1m", "__interval": "15s", "__interval_ms": "15000", "__range": "1h",
             "__range_s": "3600"}


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    ref: str
    expr: str

    def __str__(self) -> str:
        return f"{self.panel!r} {self.ref}: {self.expr}"


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panel_queries() -> list[PanelQuery]:
    """Every target of every panel, rows' nested panels included."""
    def panels(items: list[dict]) -> Iterator[dict]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    return [PanelQuery(panel["title"], target.get("refId", "?"), target["expr"])
            for panel in panels(dashboard()["panels"]) for target in panel.get("targets", [])]


@dataclass(frozen=True)
class QueryVariable:
    """A template variable filled from `label_values(match, label)`; `all_value` when "All" is picked."""

    name: str
    match: str
    label: str
    all_value: str


def query_variables() -> list[QueryVariable]:
    found = []
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        definition = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        parsed = re.fullmatch(r"\s*label_values\((.+),\s*(\w+)\)\s*", definition)
        assert parsed, f"{DASHBOARD.name}: variable {variable['name']}: not label_values(metric, label): {definition}"
        found.append(QueryVariable(variable["name"], parsed[1], parsed[2], variable.get("allValue") or ".*"))
    return found


def regex_value(values: Sequence[str]) -> str:
    """A multi-value variable in a `=~` matcher: each value regex-escaped, several as `(a|b)` (Grafana's
    Prometheus data source, `interpolateQueryExpr`)."""
    escaped = [re.sub(r"([\\^$*+?.()|{}\[\]])", r"\\\\\1", value) for value in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def fill_variables(expr: str, values: Mapping[str, str]) -> str:
    """`expr` with `$name` / `${name}` replaced by `values` (already formatted) or a built-in; an
    unknown variable is an error, so a query is never sent with a `$` Prometheus would reject."""
    known = {**BUILT_INS, **values}

    def replace(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        assert name in known, f"unknown dashboard variable ${name} in {expr}"
        return known[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", replace, expr)


def keda_queries() -> dict[str, str]:
    """ScaledObject name -> its Prometheus trigger's query."""
    return {doc["metadata"]["name"]: trigger["metadata"]["query"]
            for doc in yaml.safe_load_all(KEDA.read_text()) if doc and doc["kind"] == "ScaledObject"
            for trigger in doc["spec"]["triggers"] if trigger["type"] == "prometheus"}


def series_selectors(expr: str) -> list[str]:
    """Each series selector in `expr` (`name{matchers}`, range and offset dropped), in order: what
    must select series for the query to say anything about them."""
    def walk(node: object) -> Iterator[str]:
        if isinstance(node, promql_parser.VectorSelector):
            yield str(node)
        elif isinstance(node, promql_parser.MatrixSelector):
            yield str(node.vector_selector)
        elif isinstance(node, promql_parser.Call):
            for arg in node.args:
                yield from walk(arg)
        else:
            for part in ("expr", "lhs", "rhs"):
                if hasattr(node, part):
                    yield from walk(getattr(node, part))

    return list(walk(promql_parser.parse(expr)))
