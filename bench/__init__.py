"""Benchmark scripts (run as files: ``python bench/decode.py``); ``bench.common`` holds what they share."""
