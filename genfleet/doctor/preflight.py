"""Runs every check in the order a run depends on its parts: its inputs, Redis, the output
directory, the tokenizer and its template, then each upstream and a test generation through it.
A check whose subject is missing (no tokenizer, an upstream down) stands in for the checks that
would need it: one failure, one row, not a cascade.
"""
from __future__ import annotations

from genfleet.common.reasoning import get_format
from genfleet.doctor.checks import Check, fail, ok
from genfleet.doctor.disk_checks import output_dir_check
from genfleet.doctor.generation_check import generation_check
from genfleet.doctor.plan import Preflight
from genfleet.doctor.redis_checks import redis_checks
from genfleet.doctor.template_checks import probe_template, template_check, tokenizer_check, variant_label
from genfleet.doctor.upstream_checks import upstream_check
from genfleet.producer.readers import DatasetReadError, open_dataset
from genfleet.workers.generation.client import SglangClient

# An operator's command: a Redis or host that does not answer is reported in seconds.
TIMEOUT_S = 5.0


def run_checks(preflight: Preflight) -> list[Check]:
    settings = preflight.settings
    checks = dataset_checks(preflight.datasets)
    checks += redis_checks(preflight, timeout_s=TIMEOUT_S)
    checks.append(output_dir_check(settings.output_dir, min_free_disk_mb=settings.min_free_disk_mb))
    fmt = get_format(settings.reasoning_parser)
    tokenizer, tokenizer_row = tokenizer_check(settings.tokenizer, fmt)
    checks.append(tokenizer_row)
    probes = []
    for variant in preflight.variants if tokenizer is not None else ():
        try:
            probes.append(probe_template(tokenizer, variant, fmt))
        except Exception as error:  # noqa: BLE001 - a template may raise anything jinja2 can
            checks.append(fail("chat template" + variant_label(variant), f"rendering failed: {error}",
                               "fix the chat_template in the tokenizer's tokenizer_config.json"))
            continue
        checks.append(template_check(probes[-1], fmt))
    if not settings.upstreams:
        return [*checks, fail("upstreams", "none given", "pass --upstream URL (once per host) or GENFLEET_UPSTREAMS")]
    sglang = SglangClient(max_connections=4, connect_timeout_s=min(settings.connect_timeout_s, TIMEOUT_S),
                          stall_timeout_s=30.0)
    try:
        for url in settings.upstreams:
            upstream, row = upstream_check(sglang, url, settings, preflight.context_length)
            checks.append(row)
            for probe in probes if upstream is not None else ():
                checks.append(generation_check(sglang, url, upstream.model, tokenizer, probe, settings, fmt))
    finally:
        sglang.close()
    return checks


def dataset_checks(datasets: dict[str, str]) -> list[Check]:
    """The run file's datasets resolve to files the producer can read (their rows are not read)."""
    checks = []
    for name, source in datasets.items():
        try:
            files = open_dataset(source).files
        except DatasetReadError as error:
            checks.append(fail(f"dataset {name}", str(error), "fix its path in the run file"))
            continue
        kinds = sorted({kind.name for _, kind in files})
        checks.append(ok(f"dataset {name}", f"{source}: {len(files)} file(s), {', '.join(kinds)}"))
    return checks
