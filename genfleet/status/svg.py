"""The charts of the status page as inline SVG, drawn on the server: a line over time, a histogram of
completion lengths, a segmented progress bar. Pure functions returning markup; every text they put
in it goes through `html.escape`, so a value from Redis can never become markup (the page's
content-security policy is the second line of defence, not the first).

No JavaScript chart library: the page works offline and from an installed package, and a chart
that is markup can be checked by a test without running any script.
"""
from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

from genfleet.common.fleet_stats import BUCKETS_PER_OCTAVE, bucket_bounds

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
