"""Fixtures for the service tests (helpers live in tests/helpers/service_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.service_helpers import make_test_model
from vaeserve import models


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny-vae")
    models.save_vae(make_test_model(), out)
    return out


@pytest.fixture(scope="session")
def tiny_vae(tiny_model_dir):
    """The saved model loaded back: the reference the server must reproduce."""
    return models.load_vae(str(tiny_model_dir))
