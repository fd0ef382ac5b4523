"""``--compile-cache`` and the CPU's conv paths: XLA cannot save a program of oneDNN's convolutions
(``tests/models/test_onednn_convs.py``), so a CPU server that has a cache and runs them says so
once at start-up; with ``--cpu-convs matmul``, or with no cache, it says nothing. (The cache
itself, saved and read back by a restart, is tested on the image: ``tests/shipping``.)"""

import logging

from tests.helpers.service_helpers import make_test_model
from vaeserve.service.engine.startup import load_model
from vaeserve.service.settings import Settings

SAID = "--compile-cache keeps no program that runs oneDNN's convolutions"


def test_start_up_says_once_that_the_cache_keeps_no_onednn_program(tmp_path, caplog):
    cache = str(tmp_path / "jax")
    for settings, says in ((Settings(compile_cache=cache), True),
                           (Settings(compile_cache=cache, cpu_convs="matmul"), False),
                           (Settings(), False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="vaeserve"):
            model = load_model(settings, vae=make_test_model())  # a new one: its conv path is set once
        assert model.convs == settings.cpu_convs
        assert [record.message.startswith(SAID) for record in caplog.records].count(True) == int(says)
