"""What the Dockerfile says, checked without building it (the image tests run what it builds): its
command parses as a vaeserve command, the settings it sets exist, its flavours are the locks."""

from __future__ import annotations

import json
import re

from tests.helpers.image_helpers import REPO
from vaeserve.service.cli import build_parser
from vaeserve.service.settings import Settings

DOCKERFILE = (REPO / "Dockerfile").read_text()


def instructions(name: str) -> list[str]:
    joined = re.sub(r"\\\n", " ", DOCKERFILE)  # fold continuation lines
    return [line.split(None, 1)[1] for line in joined.splitlines() if line.split(None, 1)[:1] == [name]]


def test_cmd_is_a_vaeserve_command_in_exec_form():
    (cmd,) = instructions("CMD")
    argv = json.loads(cmd)  # exec form, so SIGTERM reaches vaeserve itself (PID 1), not a shell
    assert argv[0] == "vaeserve" and build_parser().parse_args(argv[1:]).command == "serve"


def test_the_settings_it_sets_exist():
    env = " ".join(instructions("ENV"))
    names = re.findall(r"VAESERVE_(\w+)=", env)
    assert {"HOST", "PORT", "COMPILE_CACHE"} <= set(names)
    for name in names:
        assert name.lower() in Settings.model_fields, name


def test_base_and_flavours_are_arguments():
    args = dict(arg.split("=", 1) for arg in instructions("ARG") if "=" in arg)
    assert args["BASE"] == "python:3.12-slim" and args["JAX_FLAVOUR"] == "cpu"
    assert (REPO / "locks" / f"{args['JAX_FLAVOUR']}.txt").is_file()
    assert all(line.startswith(("${BASE}", "$BASE")) for line in instructions("FROM"))
