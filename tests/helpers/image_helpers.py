"""Build and run the images with buildah, as the shipping tests and bench/container_startup.py do.

No Docker daemon and no container registry answer here or in CI: the base is a stand-in for
python:3.12-slim made from Debian's packages (.ci/stand-in-base.sh), images are built by
``make image`` (which falls back to buildah), and a container is a buildah working container whose
command runs with ``buildah run`` (chroot isolation: the host's network, so a server in it listens
on this machine's loopback). Needs root, buildah and debootstrap (.ci/install-image-tools.sh).

``docker stop`` sends SIGTERM to the container's main process; ``buildah run`` does not forward
signals, so ``Running.stop`` signals the main process itself (the first process under buildah's
chroot runtime, the one that runs the image's command).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.helpers.service_helpers import free_port

REPO = Path(__file__).resolve().parents[2]
# This host's buildah: vfs storage (no overlay mounts in the sandbox) and chroot isolation (no
# user namespaces for runc). An environment that sets them otherwise keeps its own.
BUILDAH_ENV = {"STORAGE_DRIVER": "vfs", "BUILDAH_ISOLATION": "chroot"}


def buildah_env() -> dict[str, str]:
    return {**BUILDAH_ENV, **os.environ}


def buildah(*args: str, timeout: float = 600) -> str:
    """Run ``buildah ARGS``; its stdout, stripped. A failure raises with buildah's stderr."""
    done = subprocess.run(["buildah", *args], env=buildah_env(), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"buildah {' '.join(args)} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done.stdout.strip()


def stand_in_base(log_path: Path) -> str:
    """The stand-in base image's name, built on first use (debootstrap, 80-110 s)."""
    with open(log_path, "w") as log:
        done = subprocess.run(["bash", str(REPO / ".ci/stand-in-base.sh")], env=buildah_env(), stdout=subprocess.PIPE,
                              stderr=log, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f".ci/stand-in-base.sh exited {done.returncode}:\n{log_path.read_text()[-4000:]}")
    return done.stdout.strip().splitlines()[-1]


@dataclass
class Image:
    name: str
    build_seconds: float

    def config(self) -> dict[str, Any]:
        """The image's Docker config (User, Cmd, Env, Healthcheck, Volumes, ...)."""
        return json.loads(buildah("inspect", "--type", "image", self.name))["Docker"]["config"]

    def size(self) -> str:
        """The image's size as ``buildah images`` (and ``docker images``) print it: its layers,
        uncompressed, e.g. ``"1.08 GB"``."""
        return json.loads(buildah("images", "--json", self.name))[0]["size"]


def build_image(flavour: str, name: str, base: str, log_path: Path, *, timeout: float = 1800) -> Image:
    """``make image FLAVOUR=flavour`` on ``base`` (under nice: the machine is shared)."""
    cmd = ["nice", "-n", "10", "make", "-s", "-C", str(REPO), "image", f"FLAVOUR={flavour}", f"IMAGE={name}",
           f"BASE={base}", "IMAGE_FLAGS=--pull-never"]
    start = time.monotonic()
    with open(log_path, "w") as log:
        done = subprocess.run(cmd, env=buildah_env(), stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"make image FLAVOUR={flavour} exited {done.returncode}:\n{log_path.read_text()[-6000:]}")
    return Image(name, time.monotonic() - start)


def remove_image(name: str) -> None:
    with contextlib.suppress(RuntimeError):
        buildah("rmi", "--force", name)


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(p) for p in (task / "children").read_text().split()]
    return found


def _program(pid: int) -> str:
    """The name a process was started as (buildah's helpers run from memory: their ``comm`` says
    ``memfd:...``, their argv[0] says which helper they are)."""
    try:
        return Path(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()).name
    except (OSError, UnicodeDecodeError):
        return ""


def main_process(buildah_pid: int) -> int | None:
    """The process that runs the image's command under ``buildah run`` (breadth first: the first
    process below buildah's own chroot runtime and exec helpers), or None while it is not there."""
    level = [buildah_pid]
    while level:
        below = [child for pid in level for child in _children(pid)]
        for pid in below:
            if not _program(pid).startswith("buildah"):
                return pid
        level = below
    return None


@dataclass
class Running:
    """A command running in a container (``buildah run`` in the background)."""

    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Signal the container's main process as ``docker stop`` does; buildah's exit code (the
        command's)."""
        if self.process.poll() is None:
            pid = main_process(self.process.pid)
            if pid is not None:
                os.kill(pid, sig)
            else:
                self.process.kill()
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


@dataclass
class Container:
    """A buildah working container of an image; each ``run`` is like a ``docker exec`` of it,
    ``start`` like the container's own start (the command in the background)."""

    name: str
    image: Image
    volumes: dict[str, str] = field(default_factory=dict)  # host path -> container path[:options]

    def configure(self, **env: str) -> None:
        """Set environment variables as ``docker run -e`` would."""
        buildah("config", *[f"--env={key}={value}" for key, value in env.items()], self.name)

    def _run_cmd(self, argv: Sequence[str]) -> list[str]:
        mounts = [f"--volume={host}:{inside}" for host, inside in self.volumes.items()]
        return ["buildah", "run", *mounts, self.name, "--", *argv]

    def run(self, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(self._run_cmd(argv), env=buildah_env(), capture_output=True, text=True, timeout=timeout)

    def start(self, argv: Sequence[str], log_path: Path) -> Running:
        with open(log_path, "wb") as log:
            process = subprocess.Popen(self._run_cmd(argv), env=buildah_env(), stdout=log, stderr=subprocess.STDOUT)
        return Running(process, log_path)

    def image_command(self) -> list[str]:
        """What ``docker run IMAGE`` runs: the image's entrypoint and command."""
        config = self.image.config()
        return [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]

    def start_server(self, log_path: Path, **env: str) -> tuple[Running, str]:
        """The image's own command on a free port, as ``docker run -e KEY=VALUE ... IMAGE`` starts
        it; the running command and the server's URL."""
        port = free_port()
        self.configure(VAESERVE_PORT=str(port), **env)
        return self.start(self.image_command(), log_path), f"http://127.0.0.1:{port}"

    def healthcheck(self, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run the image's own HEALTHCHECK command in this container, as the engine does."""
        test = self.image.config()["Healthcheck"]["Test"]
        argv = ["/bin/sh", "-c", test[1]] if test[0] == "CMD-SHELL" else test[1:]
        return self.run(*argv, timeout=timeout)


def new_volume(image: Image, folder: Path) -> tuple[str, int]:
    """Make ``folder`` a new volume for the image's (only) VOLUME, owned as a new named volume is
    (Docker copies the image's folder into it: its owner too); the mount point and the owner's uid."""
    (mount,) = image.config()["Volumes"]
    with container(image) as box:
        uid, gid = (int(n) for n in box.run("stat", "-c", "%u:%g", mount).stdout.split(":"))
    folder.mkdir(parents=True, exist_ok=True)
    os.chown(folder, uid, gid)
    return mount, uid


@contextlib.contextmanager
def container(image: Image, *, volumes: dict[str, str] | None = None) -> Iterator[Container]:
    name = buildah("from", "--pull-never", image.name)
    try:
        yield Container(name, image, dict(volumes or {}))
    finally:
        with contextlib.suppress(RuntimeError):
            buildah("rm", name)


def wait_ready(url: str, running: Running, timeout: float = 600) -> float:
    """Poll ``/readyz`` until 200; the seconds it took. The command exiting first raises with its log."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if running.process.poll() is not None:
            raise RuntimeError(f"the container's command exited {running.process.returncode}:\n{running.log()[-6000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return time.monotonic() - start
        time.sleep(0.2)
    running.stop(signal.SIGKILL)
    raise RuntimeError(f"not ready in {timeout} s:\n{running.log()[-6000:]}")
