"""The lock files the images install from (locks/FLAVOUR.txt, written by ``make locks``) agree with
pyproject.toml: every requirement of the flavour is pinned, at a version its specifier admits, for
the image's Python (3.12 on x86-64 Linux); nothing is pinned for vaeserve that pyproject no longer
asks for; every pin carries its hashes. Offline: the locks are read, not resolved again.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.helpers.image_helpers import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
FLAVOURS = ("cpu", "tpu", "cuda")  # cpu: the base dependencies; tpu, cuda: with the extra of that name
# Where the images run: the Dockerfile's base is python:3.12-slim (x86-64 for TPU VMs and GPU hosts).
IMAGE_ENVIRONMENT = {"python_version": "3.12", "python_full_version": "3.12.12", "implementation_name": "cpython",
                     "implementation_version": "3.12.12", "platform_python_implementation": "CPython",
                     "sys_platform": "linux", "os_name": "posix", "platform_system": "Linux",
                     "platform_machine": "x86_64", "platform_release": "", "platform_version": ""}
PROJECT_VIA = "vaeserve (pyproject.toml)"  # how uv names a requirement of the project itself


@dataclass
class Pin:
    name: str
    version: Version
    marker: Marker | None
    hashes: list[str] = field(default_factory=list)
    via: set[str] = field(default_factory=set)

    def applies(self) -> bool:
        return self.marker is None or self.marker.evaluate(IMAGE_ENVIRONMENT)


def parse_lock(text: str) -> list[Pin]:
    """``name==version [; marker] \\`` lines, their ``--hash=`` lines and ``# via`` annotations."""
    pins: list[Pin] = []
    for line in text.splitlines():
        stripped = line.strip()
        if match := re.match(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$", line):
            name, version, marker = match.groups()
            pins.append(Pin(canonicalize_name(name), Version(version), Marker(marker) if marker else None))
        elif stripped.startswith("--hash=") and pins:
            pins[-1].hashes.append(stripped.removeprefix("--hash=").rstrip(" \\"))
        elif stripped.startswith("#") and line.startswith(" ") and pins:
            via = stripped.lstrip("#").strip().removeprefix("via").strip()
            if via:
                pins[-1].via.add(via)
    return pins


def flavour_requirements(flavour: str, pyproject: dict = PYPROJECT) -> list[Requirement]:
    project = pyproject["project"]
    extra = [] if flavour == "cpu" else project["optional-dependencies"][flavour]
    return [Requirement(text) for text in [*project["dependencies"], *extra]]


def lock_problems(text: str, requirements: list[Requirement]) -> list[str]:
    """What makes a lock disagree with ``requirements`` (empty when it agrees)."""
    if "#    make locks" not in text.split("\n", 3)[1]:
        return ["the header does not say the lock was made by `make locks`"]
    pins = parse_lock(text)
    problems = [f"{pin.name}=={pin.version} has no sha256 hash" for pin in pins
                if not any(h.startswith("sha256:") for h in pin.hashes)]
    applying = {pin.name: pin for pin in pins if pin.applies()}
    wanted = {canonicalize_name(r.name) for r in requirements if r.marker is None or r.marker.evaluate(IMAGE_ENVIRONMENT)}
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        if name not in wanted:
            continue
        pin = applying.get(name)
        if pin is None:
            problems.append(f"{requirement} is not locked")
        elif not requirement.specifier.contains(pin.version, prereleases=True):
            problems.append(f"{requirement} is locked at {pin.version}")
    for pin in applying.values():
        if PROJECT_VIA in pin.via and pin.name not in wanted:
            problems.append(f"{pin.name}=={pin.version} is locked for vaeserve, which no longer requires it")
    return problems


def test_the_locks_are_the_dockerfiles_flavours():
    assert sorted(p.stem for p in (REPO / "locks").glob("*.txt")) == sorted(FLAVOURS)
    assert set(FLAVOURS) - {"cpu"} <= set(PYPROJECT["project"]["optional-dependencies"])


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_lock_agrees_with_pyproject(flavour):
    text = (REPO / "locks" / f"{flavour}.txt").read_text()
    assert lock_problems(text, flavour_requirements(flavour)) == []
    pins = {pin.name: pin for pin in parse_lock(text) if pin.applies()}
    # The image runs the JAX the tests run with (the `aot` extra pins it, with libtpu, for the checks).
    (aot,) = PYPROJECT["project"]["optional-dependencies"]["aot"]
    assert str(pins["jax"].version) in Requirement(aot).specifier
    assert ("libtpu" in pins) == (flavour == "tpu")
    assert ("jax-cuda13-plugin" in pins) == (flavour == "cuda")


def test_a_stale_lock_is_caught():
    text = (REPO / "locks" / "cpu.txt").read_text()
    requirements = flavour_requirements("cpu")
    # pyproject asks for something new, or for more than the lock holds.
    assert lock_problems(text, [*requirements, Requirement("requests>=2")]) == ["requests>=2 is not locked"]
    tightened = [Requirement("jax>=99") if r.name == "jax" else r for r in requirements]
    assert lock_problems(text, tightened) == [f"jax>=99 is locked at {parse_lock_version(text, 'jax')}"]
    # pyproject dropped a dependency the lock still pins for it.
    assert lock_problems(text, [r for r in requirements if r.name != "av"]) == [
        f"av=={parse_lock_version(text, 'av')} is locked for vaeserve, which no longer requires it"]
    # A pin without hashes, and a lock written by hand.
    unhashed = re.sub(r"(tqdm==[^\n]*)\n(\s+--hash=[^\n]*\n)+", r"\1\n", text)
    assert lock_problems(unhashed, requirements) == [f"tqdm=={parse_lock_version(text, 'tqdm')} has no sha256 hash"]
    assert lock_problems(text.replace("make locks", "pip freeze"), requirements) != []


def parse_lock_version(text: str, name: str) -> Version:
    return next(pin.version for pin in parse_lock(text) if pin.name == name and pin.applies())
