"""Fixtures for the shipping tests: the stand-in base, the built images (once a session, removed at
its end) and a tiny model folder a container can read. Helpers: tests/helpers/image_helpers.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.image_helpers import Image, build_image, remove_image, stand_in_base
from tests.helpers.service_helpers import make_test_model
from vaeserve import models


@pytest.fixture(scope="session")
def stand_in(tmp_path_factory) -> str:
    return stand_in_base(tmp_path_factory.mktemp("logs") / "stand-in-base.log")


def _image(flavour: str, stand_in: str, tmp_path_factory) -> Iterator[Image]:
    name = f"localhost/vaeserve-test:{flavour}"
    image = build_image(flavour, name, stand_in, tmp_path_factory.mktemp("logs") / f"build-{flavour}.log")
    print(f"\nimage {flavour}: built in {image.build_seconds:.0f} s, {image.size()}")
    yield image
    remove_image(name)  # vfs keeps every layer whole: gigabytes per image


@pytest.fixture(scope="session")
def cpu_image(stand_in, tmp_path_factory) -> Iterator[Image]:
    yield from _image("cpu", stand_in, tmp_path_factory)


@pytest.fixture(scope="session")
def tpu_image(stand_in, tmp_path_factory) -> Iterator[Image]:
    yield from _image("tpu", stand_in, tmp_path_factory)


def readable_by_all(folder: Path) -> Path:
    """pytest's temporary folders are private to root; a container's user must read a mounted one."""
    for path in [folder, *folder.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny-vae")
    models.save_vae(make_test_model(), out)
    return readable_by_all(out)


@pytest.fixture(scope="session")
def tiny_vae(tiny_model_dir):
    return models.load_vae(str(tiny_model_dir))
