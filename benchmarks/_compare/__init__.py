"""Helpers of benchmarks/compare.py: workloads, the processes of one
configuration (roles), the start barrier and the report."""
