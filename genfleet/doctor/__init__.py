"""`genfleet doctor`: the preflight before a long run. Each check looks at one thing the run will
rely on (Redis, each upstream, the tokenizer and its chat template, the output directory, the
clocks) with the settings the run will use, and returns a `Check`; `command` shows them as one table
and exits non-zero if any failed, so a bad setting costs seconds instead of hours of GPU time.
"""
