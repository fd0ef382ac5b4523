"""What can be checked of the Dockerfile without a Docker engine: the command it runs exists and
parses, the extras it installs exist in pyproject, it drops root and probes /healthz."""

from __future__ import annotations

import json
import re
import tomllib

from service.cli import build_parser
from service.settings import Settings
from tests.helpers.service_helpers import REPO

DOCKERFILE = (REPO / "Dockerfile").read_text()
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def instructions(name: str) -> list[str]:
    joined = re.sub(r"\\\n", " ", DOCKERFILE)  # fold continuation lines
    return [line.split(None, 1)[1] for line in joined.splitlines() if line.split(None, 1)[:1] == [name]]


def test_cmd_runs_the_console_script():
    (cmd,) = instructions("CMD")
    argv = json.loads(cmd)  # exec form, so SIGTERM reaches vaeserve itself (PID 1), not a shell
    assert argv[:2] == ["vaeserve", "serve"]
    assert PYPROJECT["project"]["scripts"]["vaeserve"] == "service.cli:main"
    assert build_parser().parse_args(argv[1:]).command == "serve"


def test_flavours_install_existing_extras():
    (arg,) = [a for a in instructions("ARG") if a.startswith("JAX_FLAVOUR")]
    assert arg == "JAX_FLAVOUR=cpu"
    (run,) = [r for r in instructions("RUN") if "JAX_FLAVOUR" in r]
    labels = re.findall(r"\s([a-z|]+)\) ", run)  # the case labels: "cpu) ", "tpu|cuda) "
    flavours = {f for label in labels for f in label.split("|")}
    assert flavours == {"cpu", "tpu", "cuda"}
    extras = PYPROJECT["project"]["optional-dependencies"]
    for flavour in flavours - {"cpu"}:
        assert flavour in extras and any(dep.startswith("jax[") for dep in extras[flavour])
    for name in ("models", "sharding", "service"):
        assert any(c.startswith(f"{name} ") for c in instructions("COPY"))
        assert f"{name}*" in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]


def test_non_root_healthcheck_and_port():
    (user,) = instructions("USER")
    assert user not in ("root", "0")
    (health,) = instructions("HEALTHCHECK")
    assert "/healthz" in health and "VAESERVE_PORT" in health and "127.0.0.1" in health
    env = " ".join(instructions("ENV"))
    port = int(re.search(r"VAESERVE_PORT=(\d+)", env).group(1))
    assert instructions("EXPOSE") == [str(port)] and port == 8000
    # The env names the image sets are real settings.
    for name in re.findall(r"VAESERVE_(\w+)=", env):
        assert name.lower() in Settings.model_fields
