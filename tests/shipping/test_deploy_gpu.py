"""The Kubernetes recipe for GPU replicas (docs/deploy/gpu.yaml), checked against the service without
a cluster: the container's command parses as `vaeserve serve` and, with its environment, makes valid
Settings; every VAESERVE_ variable is a setting; the port it listens on is the one probed and
served; the probe paths are the app's own liveness and readiness routes; the compile cache and the
model lie on the volumes mounted; one GPU per replica, as many as the mesh uses; the grace period
outlasts the drain; the image is the one `make image FLAVOUR=cuda` builds, run as its own user."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from tests.helpers.image_helpers import REPO
from vaeserve.service import create_app
from vaeserve.service.cli import build_parser
from vaeserve.service.cli.serve import settings_from
from vaeserve.service.settings import Settings

RECIPE = REPO / "docs" / "deploy" / "gpu.yaml"
DOCUMENTS = {document["kind"]: document for document in yaml.safe_load_all(RECIPE.read_text())}
POD = DOCUMENTS["Deployment"]["spec"]["template"]["spec"]
(CONTAINER,) = POD["containers"]
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


@pytest.fixture
def settings(monkeypatch) -> Settings:
    """The container's settings as `vaeserve serve` reads them there: its args over its environment
    (a secret's value stands in as text)."""
    for variable in CONTAINER["env"]:
        monkeypatch.setenv(variable["name"], variable.get("value", "from-a-secret"))
    args = build_parser().parse_args(CONTAINER["args"][1:])
    assert CONTAINER["args"][0] == "vaeserve" and args.command == "serve"
    return settings_from(args)


def container_port(port: int | str) -> int:
    """A port as a probe or the Service names it (by name or number) → the container's number."""
    numbers = {entry["name"]: entry["containerPort"] for entry in CONTAINER["ports"]}
    return numbers[port] if isinstance(port, str) else port


def mounted_volume(path: str) -> dict[str, Any]:
    """The volume mount that holds ``path``."""
    holders = [mount for mount in CONTAINER["volumeMounts"] if PurePosixPath(path).is_relative_to(mount["mountPath"])]
    assert holders, f"{path} is on no volume"
    return max(holders, key=lambda mount: len(mount["mountPath"]))


def test_every_variable_is_a_setting_and_the_command_is_valid(settings):
    for variable in CONTAINER["env"]:
        assert variable["name"].startswith("VAESERVE_"), variable
        assert variable["name"].removeprefix("VAESERVE_").lower() in Settings.model_fields, variable
    assert (settings.model, settings.dtype, settings.shapes) == (["/models/wan2.1-vae"], "bfloat16", "warmed")
    assert [str(warmup) for warmup in settings.warmup] == ["16x21x90x160:uint8,stream"]
    assert settings.api_key is not None  # from the secret


def test_the_port_served_is_the_port_probed(settings):
    assert settings.host == Settings().host or settings.host == "0.0.0.0"  # the image listens on every interface
    assert [container_port(entry["name"]) for entry in CONTAINER["ports"]] == [settings.port]
    for probe in PROBES:
        assert container_port(CONTAINER[probe]["httpGet"]["port"]) == settings.port, probe
    service = DOCUMENTS["Service"]["spec"]
    assert service["selector"].items() <= DOCUMENTS["Deployment"]["spec"]["template"]["metadata"]["labels"].items()
    assert [container_port(entry["targetPort"]) for entry in service["ports"]] == [settings.port]


def test_probes_ask_the_apps_liveness_and_readiness_routes():
    routes = create_app(Settings()).openapi()["paths"]  # nothing loads before the lifespan
    paths = {probe: CONTAINER[probe]["httpGet"]["path"] for probe in PROBES}
    assert paths == {"startupProbe": "/healthz", "readinessProbe": "/readyz", "livenessProbe": "/healthz"}
    assert all("get" in routes[path] and "503" in routes[path]["get"]["responses"] for path in paths.values())
    # Readiness looks more often than liveness, and a liveness failure needs more than one answer.
    assert CONTAINER["readinessProbe"]["periodSeconds"] < CONTAINER["livenessProbe"]["periodSeconds"]
    assert CONTAINER["livenessProbe"]["failureThreshold"] > 1


def test_the_compile_cache_and_the_model_lie_on_the_volumes(settings):
    assert settings.compile_cache is not None
    cache = mounted_volume(settings.compile_cache)
    assert not cache.get("readOnly", False)
    assert mounted_volume(settings.model[0])["readOnly"] is True
    volumes = {volume["name"]: volume for volume in POD["volumes"]}
    claim = volumes[cache["name"]]["persistentVolumeClaim"]["claimName"]
    assert DOCUMENTS["PersistentVolumeClaim"]["metadata"]["name"] == claim
    assert "ReadWriteMany" in DOCUMENTS["PersistentVolumeClaim"]["spec"]["accessModes"]  # shared by the replicas


def test_one_gpu_per_replica_and_the_mesh_uses_it(settings):
    assert CONTAINER["resources"]["limits"]["nvidia.com/gpu"] == 1 == settings.tp * settings.dp


def test_the_grace_period_outlasts_the_drain(settings):
    assert POD["terminationGracePeriodSeconds"] > settings.drain_timeout_s


def test_the_image_is_the_cuda_flavour_run_as_its_own_user():
    assert CONTAINER["image"].endswith(":cuda")
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^IMAGE\s*\?=\s*vaeserve:\$\(FLAVOUR\)$", makefile, re.MULTILINE)  # make image FLAVOUR=cuda
    uid = re.search(r"useradd .*--uid (\d+) vaeserve", (REPO / "Dockerfile").read_text())
    assert uid is not None and POD["securityContext"]["runAsUser"] == int(uid[1]) == POD["securityContext"]["fsGroup"]


def test_the_deployment_page_links_the_recipe():
    assert "(deploy/gpu.yaml)" in (REPO / "docs" / "deployment.md").read_text()
