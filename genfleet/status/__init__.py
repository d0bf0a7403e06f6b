"""`genfleet status`: where a run stands, read from the telemetry the workers write to Redis.

- `read_model`: reads counters, queue depths, rates, length histograms and beacons from Redis and
  assembles a `RunStatus` (`read_status`), or just the counters (`read_progress`, cheap to poll).
- `snapshot`: `RunStatus`, `RunProgress` and their parts, plain frozen data.
- `eta`: ETA per dataset as a range, from completion lengths and pool throughput (pure maths).
- `alarms`: the problems shown in red (pure rules over a `RunStatus`).
- `render`: the rich table and the JSON object (pure).
- `command`: the typer command (`--watch`, `--json`, `--serve`).
- `page` (with `page_view`, `svg`, `history`, `page.css`, `page.js`): `--serve`'s live web page.

Only `read_model`, `history`, `page` and `command` touch Redis. Nothing is imported here: `eta`,
`alarms` and `snapshot` load without redis or rich, `render` and `page_view` without redis.
"""
