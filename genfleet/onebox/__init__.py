"""One box, one command: `genfleet run` (the whole job in the foreground, with a Redis of its own
under the output directory) and `genfleet demo` (the same against the simulator, on sample data).

- `processes`: the child processes both start, each in its own session, stopped in order.
- `embedded_redis`: the Redis a one-box job owns, and how the other commands reach it afterwards.
- `job`: `genfleet run`'s life: Redis, the pools, the producer, progress, the end and a stop.
- `command`: its command line, every `genfleet enqueue` option included.
"""
