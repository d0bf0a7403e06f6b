"""Shared contracts of genfleet: settings, records, Redis keys, queues, reasoning parsers, run state."""


class GenfleetError(Exception):
    """The root of every error genfleet raises on purpose. Each package has its own root under it
    (`ProducerError`, `WorkerError`, `SimError`, `ToolError`); an error that is also a kind of
    builtin one (a bad value, a missing file) keeps that base too, for callers that catch it so."""
