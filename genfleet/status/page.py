"""The live status page: the Starlette app and its access rule, the view (HTML and JSON) and its SVG
charts.

The charts of the status page as inline SVG, drawn on the server: a line over time, a histogram of
completion lengths, a segmented progress bar. Pure functions returning markup; every text they put
in it goes through `html.escape`, so a value from Redis can never become markup (the page's
content-security policy is the second line of defence, not the first).

No JavaScript chart library: the page works offline and from an installed package, and a chart
that is markup can be checked by a test without running any script.

What the status page shows, as HTML and as JSON: per-dataset progress bars with their ETA range,
tok/s and req/min over the last hour, completion-length histograms, quality counters, alarms, the
fleet (partitions, upstreams) and the latest dead letters with links to their tasks in Flower.

Pure functions of a `PageData`. Every value goes through `html.escape` on its way into the markup:
dataset names pass `common/names.py`'s rule, but prompt ids, error messages (some are the upstream's
own words) and upstream URLs are anybody's text.

`genfleet status --run R --serve PORT`: the run as a live web page (Starlette on uvicorn).

Routes: `/` the page, `/fragment` its refreshing part (`page.js` swaps it in every few seconds),
`/api/status.json` the object of `status --json` plus the minute series, histograms and latest
dead letters, and the page's own `page.css` and `page.js`. Only GETs: the page changes nothing.

Who may look, the rule `genfleet flower` follows: beyond loopback only behind basic auth with
`GENFLEET_FLOWER_AUTH` (`user:password`, checked by `workers.cli.flower_auth_problem`); on loopback
without it, requests must name a loopback host, so a web page that rebinds its own DNS name to
127.0.0.1 cannot read the run. When the variable is set, every address asks for it. A strict
content-security policy (scripts and styles from this server only) backs up `page_view`'s escaping.
"""
from __future__ import annotations

import base64
import binascii
import html
import ipaddress
import json
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urlsplit

import redis
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from genfleet.common import fleet_stats
from genfleet.common.fleet_stats import BUCKETS_PER_OCTAVE, LengthHistogram, bucket_bounds
from genfleet.common.keys import RunKeys
from genfleet.common.queues import GENERATE_TASK
from genfleet.common.run_state import DeadLetter
from genfleet.status.alarms import AlarmSettings, alarms
from genfleet.status.eta import FLEET, Eta
from genfleet.status.read_model import DatasetStatus, RunStatus, UpstreamStatus, read_minutes, read_status
from genfleet.status.render import duration, status_json

LINE_WIDTH, LINE_HEIGHT = 560, 150
HIST_WIDTH, HIST_HEIGHT = 360, 110
_PAD_LEFT, _PAD_BOTTOM, _PAD_TOP = 52, 18, 8


def line_chart(values: Sequence[float], *, title: str, x_labels: tuple[str, str, str]) -> str:
    """`values` evenly spaced left (oldest) to right (now), on an axis from 0 to their maximum;
    `x_labels` are written under the left end, the middle and the right end."""
    width, height = LINE_WIDTH, LINE_HEIGHT
    plot_w, plot_h = width - _PAD_LEFT - 8, height - _PAD_BOTTOM - _PAD_TOP
    top = max(values, default=0.0) or 1.0
    step = plot_w / max(len(values) - 1, 1)
    points = " ".join(f"{_PAD_LEFT + i * step:.1f},{_PAD_TOP + plot_h * (1 - v / top):.1f}"
                      for i, v in enumerate(values))
    base = _PAD_TOP + plot_h
    labels = "".join(
        f'<text x="{x:.0f}" y="{height - 4}" text-anchor="{anchor}">{_text(label)}</text>'
        for x, anchor, label in zip((_PAD_LEFT, _PAD_LEFT + plot_w / 2, _PAD_LEFT + plot_w),
                                    ("start", "middle", "end"), x_labels, strict=True))
    return (
        f'<svg class="chart line" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="{_text(title)}"><title>{_text(title)}</title>'
        f'<line class="axis" x1="{_PAD_LEFT}" y1="{base}" x2="{_PAD_LEFT + plot_w}" y2="{base}"/>'
        f'<line class="grid" x1="{_PAD_LEFT}" y1="{_PAD_TOP}" x2="{_PAD_LEFT + plot_w}" y2="{_PAD_TOP}"/>'
        f'<text x="{_PAD_LEFT - 4}" y="{_PAD_TOP + 4}" text-anchor="end">{_number(top)}</text>'
        f'<text x="{_PAD_LEFT - 4}" y="{base}" text-anchor="end">0</text>'
        f'<polyline class="series" points="{points}"/>{labels}</svg>'
    )


def histogram_chart(counts: Mapping[int, int], *, title: str) -> str:
    """Bars over the log-spaced buckets of `common/fleet_stats.py`, from the smallest bucket
    holding a completion to the largest; ticks at powers of two tokens."""
    width, height = HIST_WIDTH, HIST_HEIGHT
    filled = [index for index, count in counts.items() if count > 0]
    if not filled:
        return f'<p class="muted">{_text(title)}: no completion yet</p>'
    first, last = min(filled), max(filled)
    # Whole octaves either side, so the ticks have somewhere to go.
    first = max(0, first - (first - 1) % BUCKETS_PER_OCTAVE) if first else 0
    last = last + (BUCKETS_PER_OCTAVE - last % BUCKETS_PER_OCTAVE) % BUCKETS_PER_OCTAVE
    slots = last - first + 1
    plot_w, plot_h = width - 8, height - _PAD_BOTTOM - _PAD_TOP
    bar_w = plot_w / slots
    top = max(counts[i] for i in filled)
    bars, ticks = [], []
    octaves = slots // BUCKETS_PER_OCTAVE
    every = 1 if octaves <= 8 else 2
    for slot, index in enumerate(range(first, last + 1)):
        x = 4 + slot * bar_w
        count = counts.get(index, 0)
        if count:
            bar_h = max(plot_h * count / top, 1.0)
            low, high = bucket_bounds(index)
            bars.append(f'<rect class="bar" x="{x:.1f}" y="{_PAD_TOP + plot_h - bar_h:.1f}" '
                        f'width="{max(bar_w - 1, 1):.1f}" height="{bar_h:.1f}">'
                        f'<title>{low:,.0f}–{high:,.0f} tokens: {count:,}</title></rect>')
        if index >= 1 and (index - 1) % (BUCKETS_PER_OCTAVE * every) == 0:
            ticks.append(f'<text x="{x:.1f}" y="{height - 4}" text-anchor="middle">'
                         f'{_number(bucket_bounds(index)[0])}</text>')
    return (f'<svg class="chart histogram" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
            f'role="img" aria-label="{_text(title)}"><title>{_text(title)}</title>'
            f'<line class="axis" x1="4" y1="{_PAD_TOP + plot_h}" x2="{4 + plot_w}" y2="{_PAD_TOP + plot_h}"/>'
            f'{"".join(bars)}{"".join(ticks)}</svg>')


def progress_bar(label: str, done: int, failed: int, skipped: int, total: int) -> str:
    """One bar: done, failed and skipped shares of `total`, left to right. Its value (the share
    done, in percent) is in `aria-valuenow`, as a screen reader and a test read it."""
    shares = [(kind, 100 * n / total if total else 0.0) for kind, n in
              (("done", done), ("failed", failed), ("skipped", skipped))]
    rects, x = [], 0.0
    for kind, share in shares:
        if share > 0:
            rects.append(f'<rect class="{kind}" x="{x:.3f}" y="0" width="{share:.3f}" height="10"/>')
            x += share
    percent = shares[0][1]
    return (f'<svg class="progress" viewBox="0 0 100 10" preserveAspectRatio="none" role="progressbar" '
            f'aria-label="{_text(label)}" aria-valuemin="0" aria-valuemax="100" aria-valuenow="{percent:.1f}">'
            f'<rect class="track" x="0" y="0" width="100" height="10"/>{"".join(rects)}</svg>')


def _number(value: float) -> str:
    """Short axis labels: 950, 1.2k, 16k, 2.5M."""
    for divisor, suffix in ((1e6, "M"), (1e3, "k")):
        if value >= divisor:
            scaled = value / divisor
            return f"{scaled:.1f}{suffix}" if scaled < 10 and scaled != int(scaled) else f"{scaled:.0f}{suffix}"
    return f"{value:.1f}" if 0 < value < 10 and value != int(value) else f"{value:.0f}"


def _text(value: str) -> str:
    return html.escape(value, quote=True)


if TYPE_CHECKING:  # only types here: the view loads without redis (`history` reads it)
    from genfleet.common.run_state import DeadLetter
    from genfleet.status.read_model import MinuteRate

# Dead letters listed on the page; `genfleet failures` has them all.
RECENT_FAILURES = 20


@dataclass(frozen=True)
class Failures:
    total: int  # dead letters of the run
    recent: list[DeadLetter]  # the latest of those read, newest first
    read: int = 0  # how many were read to find them (a hash has no order: all of them, up to a cap)


@dataclass(frozen=True)
class PageData:
    status: RunStatus
    minutes: list[MinuteRate]  # oldest first
    lengths: dict[str, LengthHistogram]  # dataset -> completion lengths
    failures: Failures
    flower_url: str  # base URL, no trailing slash


def page_json(data: PageData, settings: AlarmSettings) -> dict[str, Any]:
    """`genfleet status --json`'s object, plus what only the page shows."""
    return {
        **status_json(data.status, settings),
        "minutes": [asdict(m) for m in data.minutes],
        "length_histograms": {name: {str(k): v for k, v in sorted(h.counts.items())}
                              for name, h in data.lengths.items()},
        "dead_letters": data.failures.total,
        "recent_failures": [{"id": f.id, "error_class": f.error_class, "message": f.message, "time": f.time,
                             "attempts": f.attempts, "upstream": f.upstream,
                             "flower": flower_task_search(data.flower_url, f.id)} for f in data.failures.recent],
    }


def page_fragment(data: PageData, alarms: list[str]) -> str:
    """The part of the page that refreshes: everything but the shell."""
    return "".join([
        _heading(data.status), _alarms(alarms), _progress(data.status), _rates(data.minutes),
        _quality(data.status), _lengths(data.status, data.lengths), _fleet(data.status), _failures(data),
    ])


def page_shell(run: str, fragment: str, refresh_ms: int) -> str:
    """The whole document around a first fragment; `page.js` swaps the fragment every `refresh_ms`."""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>genfleet · {_e(run)}</title><link rel="stylesheet" href="page.css"></head>'
            f'<body data-refresh-ms="{refresh_ms}"><header><h1>genfleet run {_e(run)}</h1>'
            f'<span id="live" class="ok">live</span></header>'
            f'<main id="content">{fragment}</main><script src="page.js"></script></body></html>')


def flower_task_search(flower_url: str, prompt_id: str) -> str:
    """Flower's task list searched for every attempt of one prompt. Dead letters keep no Celery task
    id, so not `/task/<id>`: the prompt id leads each task's args (`TaskPayload.argsrepr`), hence
    `args:"<id> "` (the space keeps `chat/4` from matching `chat/40`). Flower 2.2.0 takes no search
    from the URL but prefills its box with `name:<name>` from `?name=` (static/js/flower.js,
    `initialSearch`), and its query language (utils/search.py) reads the rest as a second term."""
    quoted = prompt_id.replace("\\", "\\\\").replace('"', '\\"')
    # %20, not '+': the page decodes it with decodeURIComponent, which leaves a '+' a '+'.
    return f"{flower_url}/tasks?" + urlencode({"name": f'{GENERATE_TASK} args:"{quoted} "'}, quote_via=quote)


def flower_failed_tasks(flower_url: str) -> str:
    return f"{flower_url}/tasks?state=FAILURE"


# --- sections ------------------------------------------------------------------------------------
def _heading(status: RunStatus) -> str:
    totals = status.totals.progress
    if not status.datasets:
        state = "no datasets"
    else:
        state = "finished" if status.finished else f"ETA {_eta(status.totals.eta, totals.pending)}"
    workers = f"{status.workers} worker{'' if status.workers == 1 else 's'}"
    return (f'<p class="summary"><b>{totals.done:,}</b> / {totals.total:,} done · {workers} · '
            f'{_e(state)} · <span class="muted">as of {_clock(status.time)}</span></p>')


def _alarms(lines: list[str]) -> str:
    if not lines:
        return '<section id="alarms" class="quiet">No alarms.</section>'
    items = "".join(f"<li>{_e(line)}</li>" for line in lines)
    return f'<section id="alarms" class="alarms"><h2>Alarms</h2><ul>{items}</ul></section>'


def _progress(status: RunStatus) -> str:
    rows = []
    for row in status.datasets:
        d = row.progress
        percent = 100 * d.done / d.total if d.total else 0.0
        rows.append(
            f'<tr class="dataset" data-dataset="{_e(d.dataset)}"><th scope="row">{_e(d.dataset)}</th>'
            f'<td class="bar-cell">{progress_bar(d.dataset, d.done, d.failed, d.skipped, d.total)}</td>'
            f'<td class="num">{d.done:,} / {d.total:,}</td><td class="num percent">{percent:.1f}%</td>'
            f'<td class="num">{row.in_flight:,} in flight</td>'
            f'<td class="num{" bad" if d.failed else ""}">{d.failed:,} failed</td>'
            f'<td class="eta">{_e(_eta(row.eta, d.pending))}</td></tr>')
    note = ""
    if any(r.eta is not None and r.eta.basis == FLEET and r.progress.pending for r in status.datasets):
        note = '<p class="muted">* ETA mostly from completion lengths seen fleet-wide: too few of its own yet</p>'
    if not rows:
        return ('<section id="progress"><h2>Progress</h2><p class="bad">No datasets for this run in this Redis '
                '(never enqueued, another --run, or another GENFLEET_REDIS_URL?)</p></section>')
    return (f'<section id="progress"><h2>Progress</h2><table>{"".join(rows)}</table>{note}'
            '<p class="muted">green done · red failed · grey skipped · ETA a 95% range</p></section>')


def _rates(minutes: list[MinuteRate]) -> str:
    labels = (f"-{len(minutes)} min", f"-{len(minutes) // 2} min", "now")
    last_tok_s, last_req_min = (minutes[-1].tok_per_s, minutes[-1].req_per_min) if minutes else (0.0, 0.0)
    tok_s = line_chart([m.tok_per_s for m in minutes], title="completion tokens per second", x_labels=labels)
    req_min = line_chart([m.req_per_min for m in minutes], title="prompts finished per minute", x_labels=labels)
    return ('<section id="rates"><h2>Throughput, last hour</h2><div class="charts">'
            f'<figure>{tok_s}<figcaption>completion tok/s · last minute {last_tok_s:,.1f}</figcaption></figure>'
            f'<figure>{req_min}<figcaption>req/min · last minute {last_req_min:,.1f}</figcaption></figure>'
            '</div></section>')


def _quality(status: RunStatus) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("dataset", "done", "truncated", "looped", "empty reasoning",
                                               "integrity", "aborted", "rejected", "skipped", "continued"))
    rows = []
    for row in _with_totals(status):
        d = row.progress
        cells = [_share(d.truncated, d.done), _share(d.looped, d.done), _share(d.empty_reasoning, d.done),
                 f"{d.integrity:,}", f"{d.aborted:,}", f"{d.rejected:,}", f"{d.skipped:,}", f"{d.continued:,}"]
        rows.append(f'<tr><th scope="row">{_e(d.dataset)}</th><td class="num">{d.done:,}</td>'
                    + "".join(f'<td class="num">{c}</td>' for c in cells) + "</tr>")
    return f'<section id="quality"><h2>Quality</h2><table><tr>{head}</tr>{"".join(rows)}</table></section>'


def _lengths(status: RunStatus, lengths: dict[str, LengthHistogram]) -> str:
    figures = []
    for row in status.datasets:
        stats = row.lengths
        numbers = " · ".join(f"{label} {value:,.0f}" for label, value in
                             (("p50", stats.median), ("mean", stats.mean), ("p99", stats.p99)) if value is not None)
        chart = histogram_chart(lengths.get(row.name, LengthHistogram()).counts,
                                title=f"{row.name}: completion tokens")
        figures.append(f'<figure>{chart}<figcaption>{_e(row.name)} · {stats.samples:,} completions'
                       f'{" · " + numbers if numbers else ""}</figcaption></figure>')
    return (f'<section id="lengths"><h2>Completion lengths (tokens, log scale)</h2>'
            f'<div class="charts">{"".join(figures)}</div></section>')


def _fleet(status: RunStatus) -> str:
    partitions = "".join(
        f'<tr><th scope="row">{_e(p.partition)}</th><td class="num">{p.queued:,}</td><td class="num">{p.in_flight:,}'
        f'</td><td class="num">{p.slots:,}</td><td class="num">{p.workers}</td>'
        f'<td class="num">{p.rates["1m"].tok_per_s:,.0f}</td></tr>' for p in status.partitions)
    upstreams = "".join(
        f'<tr class="{"bad" if u.down_in else "ok"}"><th scope="row">{_e(u.url)}</th>'
        f'<td>{"DOWN in " + str(u.down_in) + " of " + str(u.workers) + " workers" if u.down_in else "up"}</td>'
        f'<td class="num">{u.workers}</td><td class="num">{u.in_flight:,}</td>{_admission_cells(u)}</tr>'
        for u in status.upstreams)
    upstream_table = '<p class="muted">No live worker reports an upstream.</p>'
    if upstreams:
        upstream_table = (f'<table><tr><th>upstream</th><th>health</th><th>workers</th><th>in flight</th>'
                          f'<th>target</th><th>server running</th><th>waiting</th><th>KV use</th><th>retracted</th>'
                          f'<th>server tok/s</th></tr>{upstreams}</table>')
    return ('<section id="fleet"><h2>Fleet</h2><table><tr><th>partition</th><th>queued (all runs)</th>'
            f'<th>in flight</th><th>slots</th><th>workers</th><th>tok/s 1m</th></tr>{partitions}</table>'
            f'{upstream_table}</section>')


def _failures(data: PageData) -> str:
    failures = data.failures
    if not failures.total:
        return '<section id="failures"><h2>Failures</h2><p class="quiet">No dead letters.</p></section>'
    rows = "".join(
        f'<tr><td>{_clock(f.time)}</td><td><a href="{_e(flower_task_search(data.flower_url, f.id))}" '
        f'rel="noreferrer">{_e(f.id)}</a></td><td>{_e(f.error_class)}</td><td class="num">{f.attempts}</td>'
        f'<td class="message">{_e(_clip(f.message))}</td></tr>' for f in failures.recent)
    if len(failures.recent) == failures.total:
        shown = "all"
    elif failures.read < failures.total:  # past the cap, the newest of those read, not of the run
        shown = f"the latest {len(failures.recent)} of {failures.read:,} read"
    else:
        shown = f"the latest {len(failures.recent)}"
    letters = f"{failures.total:,} dead letter{'' if failures.total == 1 else 's'}"
    return (f'<section id="failures"><h2>Failures</h2><p>{letters}, {shown} below '
            f'(each id opens its attempts in Flower; <code>genfleet failures --run {_e(data.status.run)}</code> '
            f'lists them all) · <a href="{_e(flower_failed_tasks(data.flower_url))}" rel="noreferrer">failed '
            f'tasks in Flower</a></p><table><tr><th>time</th><th>prompt</th><th>class</th><th>attempts</th>'
            f'<th>message</th></tr>{rows}</table></section>')


# --- formatting ----------------------------------------------------------------------------------
def _with_totals(status: RunStatus) -> Iterable[DatasetStatus]:
    return status.datasets + ([status.totals] if len(status.datasets) > 1 else [])


def _eta(eta: Eta | None, pending: int) -> str:
    if not pending:
        return "done"
    if eta is None:
        return "ETA unknown"
    low, high = duration(eta.low_s), duration(eta.high_s)
    return (low if low == high else f"{low}–{high}") + (" *" if eta.basis == FLEET else "")


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _clip(message: str, limit: int = 240) -> str:
    return message if len(message) <= limit else message[:limit - 1] + "…"


def _clock(unix: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix))


def _admission_cells(upstream: UpstreamStatus) -> str:
    """`--in-flight auto`'s target and the server's own load; a host that waits on its KV
    reservations is marked admission-bound."""
    target = "fixed" if upstream.target is None else f"{upstream.target:,}"
    load = upstream.load
    if load is None:
        return f'<td class="num">{target}</td>' + '<td class="num">–</td>' * 5
    bound = ' <strong class="bad">admission-bound</strong>' if upstream.admission_bound else ""
    return (f'<td class="num">{target}</td><td class="num">{load.running:,}</td>'
            f'<td class="num">{load.waiting:,}{bound}</td><td class="num">{load.token_usage:.0%}</td>'
            f'<td class="num">{load.retracted:,}</td><td class="num">{load.gen_throughput:,.0f}</td>')


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


REFRESH_MS = 3000
# Several open tabs share one read of Redis per second.
SNAPSHOT_MAX_AGE_S = 1.0
# Dead letters decoded per refresh at most: each carries its prompt, and a bad run may hold many.
FAILURES_SCANNED = 500
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
ASSETS = Path(__file__).parent
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def read_page(client: redis.Redis, run: str, flower_url: str) -> PageData:
    status = read_status(client, run)
    since = status.created_at or status.first_finished
    return PageData(status=status, minutes=read_minutes(client, run, status.time, since),
                    lengths=fleet_stats.read_lengths(client, run, [row.name for row in status.datasets]),
                    failures=read_failures(client, run), flower_url=flower_url)


def read_failures(client: redis.Redis, run: str, limit: int = RECENT_FAILURES,
                  scanned: int = FAILURES_SCANNED) -> Failures:
    """How many dead letters the run has, and the latest `limit` of the first `scanned` read."""
    key = RunKeys(run).dead_letters
    total = client.hlen(key)
    letters: list[DeadLetter] = []
    if total:
        for prompt_id, data in client.hscan_iter(key, count=100):
            letters.append(DeadLetter.decode(prompt_id, data))
            if len(letters) >= scanned:
                break
    letters.sort(key=lambda letter: letter.time, reverse=True)
    return Failures(total, letters[:limit], read=len(letters))


class _Snapshot:
    """The latest `PageData`, read again once older than `max_age_s` (one reader at a time)."""

    def __init__(self, read: Callable[[], PageData], max_age_s: float) -> None:
        self._read, self._max_age_s = read, max_age_s
        self._lock = threading.Lock()
        self._value: PageData | None = None
        self._at = 0.0

    def get(self) -> PageData:
        with self._lock:
            if self._value is None or time.monotonic() - self._at > self._max_age_s:
                self._value, self._at = self._read(), time.monotonic()
            return self._value


def create_app(client: redis.Redis, run: str, *, flower_url: str, settings: AlarmSettings,
               auth: str | None, hosts: list[str] | None) -> Starlette:
    """The page's app. `auth` (`user:password`) turns basic auth on; `hosts`, where given, are the
    only host names a request may address (a rebound DNS name is refused)."""
    snapshot = _Snapshot(lambda: read_page(client, run, flower_url), SNAPSHOT_MAX_AGE_S)

    def page(_: Request) -> Response:
        try:
            return _html(page_shell(run, _fragment(snapshot.get(), settings), REFRESH_MS))
        except redis.RedisError as error:
            return _html(page_shell(run, f'<p class="bad">{html.escape(_redis_problem(error))}</p>', REFRESH_MS), 503)

    def fragment(_: Request) -> Response:
        try:
            return _html(_fragment(snapshot.get(), settings))
        except redis.RedisError as error:
            return PlainTextResponse(_redis_problem(error), 503, headers=_HEADERS)

    def status_json(_: Request) -> Response:
        try:
            body, code = page_json(snapshot.get(), settings), 200
        except redis.RedisError as error:
            body, code = {"error": _redis_problem(error)}, 503
        return Response(json.dumps(body), code, headers=_HEADERS, media_type="application/json")

    def asset(name: str, media_type: str) -> Callable[[Request], Response]:
        content = (ASSETS / name).read_text()
        return lambda _: Response(content, headers=_HEADERS, media_type=media_type)

    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=hosts)] if hosts else []
    if auth:
        middleware.append(Middleware(BasicAuth, credentials=auth))
    return Starlette(routes=[
        Route("/", page), Route("/fragment", fragment), Route("/api/status.json", status_json),
        Route("/page.css", asset("page.css", "text/css")), Route("/page.js", asset("page.js", "text/javascript")),
    ], middleware=middleware)


class BasicAuth:
    """RFC 7617 basic auth against one `user:password`, compared in constant time."""

    def __init__(self, app: ASGIApp, credentials: str) -> None:
        self.app = app
        self.expected = credentials.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._admits(Headers(scope=scope).get("authorization", "")):
            response = PlainTextResponse("genfleet status: user and password required (GENFLEET_FLOWER_AUTH)", 401,
                                         headers={"WWW-Authenticate": 'Basic realm="genfleet status", charset="UTF-8"'})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _admits(self, header: str) -> bool:
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            given = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        return secrets.compare_digest(given, self.expected)


def is_loopback(bind: str) -> bool:
    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind.strip("[]")).is_loopback
    except ValueError:  # a host name: whatever it resolves to, it is not known to be loopback
        return False


def flower_url_problem(url: str) -> str | None:
    """Why `url` cannot be Flower's base URL in the page's links, or None."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return f"must be an http:// or https:// URL with a host, not {url!r}"
    if parts.query or parts.fragment:
        return f"must be a base URL without query or fragment, not {url!r}"
    return None


def listen(bind: str, port: int) -> socket.socket:
    """The listening socket, opened here so a busy port is one clear error, not uvicorn's log."""
    family, kind, proto, _, address = socket.getaddrinfo(bind.strip("[]"), port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def serve(app: Starlette, sock: socket.socket) -> None:
    """Until interrupted (Ctrl-C, SIGTERM: uvicorn's own handlers stop it cleanly)."""
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])


def _fragment(data: PageData, settings: AlarmSettings) -> str:
    return page_fragment(data, alarms(data.status, settings))


def _html(content: str, code: int = 200) -> Response:
    return Response(content, code, headers=_HEADERS, media_type="text/html")


def _redis_problem(error: redis.RedisError) -> str:
    return f"Redis: {error or type(error).__name__} (retrying every {REFRESH_MS / 1000:.0f} s)"
