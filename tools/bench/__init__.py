"""Benchmarks: graphrt against its peers and floors, each in one run (JSON under bench/results/)."""
