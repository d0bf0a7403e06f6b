"""`genfleet export`: a run's shards, from one or several output roots, become one clean dataset.

- `cli`: the typer command (options, Redis, exit codes); `console`: its progress bars and tables.
- `exporter`: the one streaming pass (read → dedupe → stats → filter → format → write); `report`: its
  options and what it found.
- `samples`: a prompt's samples (`--samples N`) gathered by prompt on disk, for one line per prompt.
- `formats`: the line shapes and `FORMATS`, the one registry of them; `conversation`: the record as a
  conversation every format starts from; `tokenized`: the `input_ids` / `loss_mask` format.
- `filters`, `dedupe`, `stats`: what is left out, what was seen, completion-length statistics.
- `sinks`: the output files (split, hashed) and the bounded-memory shuffle.
- `reconcile`: the shards checked against the run in Redis; `manifest`: `manifest.json`.
- `card`: the dataset card `README.md` (configs, `features` inferred from every line, `card_body` its
  provenance text), so `datasets.load_dataset(<export>)` reads it; `hub`: `--push-to-hub`.

The shard layout and reader are `common.shards`. Nothing is imported here: `--help` stays cheap.
"""
