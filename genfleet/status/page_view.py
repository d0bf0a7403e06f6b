"""What the status page shows, as HTML and as JSON: per-dataset progress bars with their ETA range,
tok/s and req/min over the last hour, completion-length histograms, quality counters, alarms, the
fleet (partitions, upstreams) and the latest dead letters with links to their tasks in Flower.

Pure functions of a `PageData`. Every value goes through `html.escape` on its way into the markup:
dataset names pass `common/names.py`'s rule, but prompt ids, error messages (some are the upstream's
own words) and upstream URLs are anybody's text.
"""
from __future__ import annotations

import html
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from genfleet.common.fleet_stats import LengthHistogram
from genfleet.common.queues import GENERATE_TASK
from genfleet.status.alarms import AlarmSettings
from genfleet.status.eta import FLEET, Eta
from genfleet.status.render import duration, status_json
from genfleet.status.snapshot import DatasetStatus, RunStatus
from genfleet.status.svg import histogram_chart, line_chart, progress_bar

if TYPE_CHECKING:  # only types here: the view loads without redis (`history` reads it)
    from genfleet.common.run_state import DeadLetter
    from genfleet.status.history import MinuteRate

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
        f'<td class="num">{u.workers}</td><td class="num">{u.in_flight:,}</td></tr>' for u in status.upstreams)
    upstream_table = '<p class="muted">No live worker reports an upstream.</p>'
    if upstreams:
        upstream_table = (f'<table><tr><th>upstream</th><th>health</th><th>workers</th><th>in flight</th></tr>'
                          f'{upstreams}</table>')
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


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)
