"""Parallelism: sharding specs, the SPMD transform, partitions with their collectives, plans."""
