"""Benchmark scripts (run as files: ``python -m bench.decode``); ``bench.common`` holds what they share."""
