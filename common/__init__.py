"""Shared contracts of genfleet: settings, records, Redis keys, queues, reasoning parsers, run state."""
