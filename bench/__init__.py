"""`make bench`: throughput, occupancy, CPU per token, enqueue rate, scaling, export."""
