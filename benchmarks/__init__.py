"""Benchmarks and measured floors: step time, memory and per-sample cost of cockpit-lite against the plain
step and its peers (``python -m benchmarks.<name>``; each module's docstring gives its command and
what it measures). The experiments people run to learn from the quantities live in ``experiments``."""
