"""Test helpers shared across the test packages: import them as ``tests.helpers.<module>``."""
