"""The measuring half of ``bench.device_check``: each task runs in a process of its own, so that
JAX and PyTorch each have the whole device (no allocator holds memory the other needs) and each
process's peak memory is its own.

    python -m bench.device_work TASK SPEC.json RESULT.json

Tasks: ``parity`` (both frameworks, small configs), ``ours`` (JAX), ``variant`` (one variant of our
decode: its step geometry and XLA flags), ``diffusers`` (PyTorch) and ``service`` (a real server and
the httpx load test). A task rewrites RESULT.json after every
measurement, so that what it measured survives a kill at the budget. A task skips a measurement it
has no time left for, saying so; it never starts a warm-up with less time left than the longest
warm-up it has seen.

Nothing here imports ``service`` (FastAPI, pydantic) except the load-test client, and the server
runs as ``python -m vaeserve serve``: a host without those packages measures everything else.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# What the service end to end needs beyond the host's packages (docs/development.md: the carry kit).
SERVICE_MODULES = ("fastapi", "starlette", "uvicorn", "pydantic", "pydantic_settings", "av")
PARITY_PROMISE = 1e-4  # float32 against diffusers, max abs (docs/models.md)


class Recorder:
    """The task's result: a dict written to ``path`` (atomically) after every change."""

    def __init__(self, path: Path, deadline: float):
        self.path, self.deadline = path, deadline
        self.result: dict[str, Any] = {}
        self.longest_warmup = 0.0

    def left(self) -> float:
        return self.deadline - time.time()

    def save(self) -> None:
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(self.result, indent=1, default=float))
        partial.replace(self.path)

    def put(self, keys: tuple[str, ...], value: Any) -> None:
        node = self.result
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
        self.save()
        print(f"  {'/'.join(keys)}: {summary(value)}", flush=True)


def summary(value: Any) -> str:
    if isinstance(value, dict) and "min_s" in value:
        return f"min {value['min_s']:.3f} s, median {value['median_s']:.3f} s over {len(value['times_s'])} runs"
    text = json.dumps(value, default=float)
    return text if len(text) < 160 else text[:157] + "..."


def measure(run: Callable[[], Any], sync: Callable[[Any], Any], *, runs: int, rec: Recorder,
            compile_s: float = 0.0) -> tuple[dict, Any]:
    """The first run (``warmup_s``: for PyTorch its first-call costs; JAX compiles before, in
    ``compile_s``), then up to ``runs`` timed runs while time is left (one at least)."""
    start = time.perf_counter()
    out = sync(run())
    warmup = time.perf_counter() - start
    rec.longest_warmup = max(rec.longest_warmup, compile_s + warmup)
    times: list[float] = []
    while len(times) < runs and (not times or rec.left() > times[-1]):
        start = time.perf_counter()
        out = sync(run())
        times.append(time.perf_counter() - start)
    return {"warmup_s": warmup, "times_s": times, "min_s": min(times), "median_s": statistics.median(times)}, out


def no_time(rec: Recorder) -> str | None:
    """Why a measurement is skipped, or None when there is time for its warm-up."""
    if rec.left() <= rec.longest_warmup:
        return f"skipped: {rec.left():.0f} s left of the budget, a warm-up took {rec.longest_warmup:.0f} s"
    return None


def attempt(rec: Recorder, keys: tuple[str, ...], fn: Callable[[], dict]) -> dict | None:
    """``fn()`` recorded under ``keys``; a failure (out of memory, say) is recorded, not raised."""
    if (reason := no_time(rec)) is not None:
        rec.put(keys, {"skipped": reason})
        return None
    try:
        value = fn()
    except Exception as e:  # noqa: BLE001 - a failed measurement is a finding: record it, go on
        rec.put(keys, {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]})
        return None
    rec.put(keys, value)
    return value


# -- what runs where -------------------------------------------------------------------------------
def versions() -> dict[str, str | None]:
    from importlib import metadata

    names = ["jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "libtpu", "flax", "numpy", "torch",
             "diffusers", "fastapi", "uvicorn", "pydantic", "av"]
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def jax_device() -> dict[str, Any]:
    import jax

    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    return {"platform": device.platform, "device_kind": device.device_kind, "count": jax.device_count(),
            "bytes_limit": stats.get("bytes_limit")}


def torch_device() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return {"device": "cpu", "threads": torch.get_num_threads()}
    props = torch.cuda.get_device_properties(0)
    return {"device": "cuda", "name": props.name, "total_memory": props.total_memory,
            "cudnn_tf32": torch.backends.cudnn.allow_tf32, "matmul_tf32": torch.backends.cuda.matmul.allow_tf32}


def config_of(spec: dict[str, Any]):
    from vaeserve import models

    return models.config_from_dict(spec["config"])


def shapes(config, video: list[int], batch: int = 1) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Latents ``(B, C, T, H, W)`` and frames ``(B, 3, F, height, width)`` of a ``width x height x F``
    video; for an image model (``F`` 1) ``(B, C, H, W)`` and ``(B, 3, height, width)``."""
    from vaeserve.sharding.planner import latent_shape_for_video

    width, height, frames = video
    time_axis = () if config.is_image else (frames,)
    return (batch, *latent_shape_for_video(config, width, height, frames)), (batch, 3, *time_axis, height, width)


def inputs(latents_shape, frames_shape=None) -> tuple[Any, Any]:
    """Seeded latents and frames (None without ``frames_shape``): every task decodes the same latents."""
    import numpy as np

    rng = np.random.default_rng(0)
    latents = rng.standard_normal(latents_shape).astype(np.float32)
    return latents, None if frames_shape is None else rng.uniform(-1, 1, frames_shape).astype(np.float32)


# -- parity: both frameworks, float32, small configs -------------------------------------------------
EXACT_FLOAT32 = "float32-exact"  # diffusers' timing key for float32 with TF32 off (as parity runs it)


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """PyTorch on a GPU convolves float32 in TF32 by default; parity compares true float32 (ours is)."""
    import torch

    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def parity_task(spec: dict[str, Any], rec: Recorder) -> None:
    rec.put(("versions",), versions())  # before the imports, which take seconds
    import jax
    import numpy as np
    import torch

    from bench.common import diffusers_reference
    from vaeserve import models

    rec.put(("device",), {"jax": jax_device(), "torch": torch_device()})
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for case in spec["cases"]:
        config = config_of(case)
        latents, frames = inputs(*shapes(config, case["video"], case.get("batch", 1)))

        def compare(config=config, latents=latents, frames=frames) -> dict[str, Any]:
            with tempfile.TemporaryDirectory() as folder, torch.no_grad(), exact_float32():
                reference = diffusers_reference(config, folder).to(device)
                theirs = reference.decode(torch.from_numpy(latents).to(device)).sample.clamp(-1, 1).cpu().numpy()
                theirs_z = reference.encode(torch.from_numpy(frames).to(device)).latent_dist.mode().cpu().numpy()
                vae = models.load_vae(folder)
            ours = np.asarray(jax.device_get(vae.decode(latents)))
            ours_z = np.asarray(jax.device_get(vae.encode(frames)))
            decode, encode = float(np.abs(ours - theirs).max()), float(np.abs(ours_z - theirs_z).max())
            return {"latents": list(latents.shape), "frames": list(frames.shape), "decode_max_abs": decode,
                    "encode_max_abs": encode, "promise": PARITY_PROMISE,
                    "ok": max(decode, encode) <= PARITY_PROMISE}

        attempt(rec, ("parity", case["model"]), compare)


# -- ours (JAX) ---------------------------------------------------------------------------------------
def timed(compile: Callable[[], Any], run: Callable[[], Any], *, runs: int, rec: Recorder,
          trace_dir: str | None = None) -> tuple[dict[str, Any], Any]:
    """``compile()`` timed, then ``run()`` as ``measure`` times it, with the compiled program's memory
    and the process's peak device memory; with ``trace_dir`` and time left, one more run traced there
    (``jax.profiler``: ``bench.trace_summary`` reads it). Returns the measurement and the last output."""
    import jax

    from vaeserve.sharding.introspect import program_memory

    start = time.perf_counter()
    program = compile()
    compile_s = time.perf_counter() - start
    timing, out = measure(run, jax.block_until_ready, runs=runs, rec=rec, compile_s=compile_s)
    if trace_dir and rec.left() > timing["min_s"]:
        with jax.profiler.trace(trace_dir):
            jax.block_until_ready(run())
    peak = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
    return {"compile_s": compile_s, **timing, "program_bytes": program_memory(program), "process_peak_bytes": peak}, out


def ours_task(spec: dict[str, Any], rec: Recorder) -> None:
    import jax
    import jax.numpy as jnp

    from vaeserve import models

    config = config_of(spec)
    latents_shape, frames_shape = shapes(config, spec["video"], spec.get("batch", 1))
    latents_host, frames_host = inputs(latents_shape, frames_shape)
    latents, frames = jax.device_put(latents_host), jax.device_put(frames_host)
    rec.put(("shapes",), {"latents": list(latents_shape), "frames": list(frames_shape)})
    decoded: dict[str, jax.Array] = {}

    def decode(dtype: str) -> dict[str, Any]:
        vae = models.init_vae(config, dtype=dtype, encoder=False)
        found, decoded[dtype] = timed(lambda: vae.compile(latents_shape), lambda: vae.decode(latents),
                                      runs=spec["runs"], rec=rec,
                                      trace_dir=spec.get("trace_dir") if dtype == spec["trace_dtype"] else None)
        return found

    def encode(dtype: str) -> dict[str, Any]:
        vae = models.init_vae(config, dtype=dtype)
        vae.require_encoder()
        return timed(lambda: vae.compile_encode(frames_shape), lambda: vae.encode(frames), runs=spec["runs"], rec=rec)[0]

    # Dtype by dtype, so that a short budget still measures both directions in the first (bfloat16).
    for dtype in spec["dtypes"]:
        attempt(rec, ("decode", dtype), functools.partial(decode, dtype))
        attempt(rec, ("encode", dtype), functools.partial(encode, dtype))
    if {"bfloat16", "float32"} <= decoded.keys():  # the same seeded weights, rounded for bfloat16
        difference = jnp.abs(decoded["bfloat16"].astype(jnp.float32) - decoded["float32"])
        rec.put(("bf16_vs_f32",), {"max_abs": float(difference.max()), "mean_abs": float(difference.mean()),
                                   "psnr_db": float(10 * jnp.log10(4 / jnp.mean(difference**2)))})


def variant_task(spec: dict[str, Any], rec: Recorder) -> None:
    """One of the GPU study's variants of our decode (``bench.gpu_study.VARIANTS``: its step geometry,
    its rewrites, applied while it compiles; its XLA flags come with the process's environment):
    compile, time, the top kernels of one traced run, and the frames' largest difference from the
    first variant's (saved by it to ``spec["reference"]``)."""
    import jax
    import numpy as np

    from bench.gpu_study import VARIANTS, variant_rewrites
    from bench.trace_summary import summarize
    from vaeserve import models

    config = config_of(spec)
    latents_shape, _ = shapes(config, spec["video"], spec.get("batch", 1))
    latents = jax.device_put(inputs(latents_shape)[0])
    variant = VARIANTS[spec["variant"]]
    chunk, inner_frames = variant.chunk, variant.inner_frames
    rec.put(("options",), {"chunk": chunk, "inner_frames": inner_frames, "xla_flags": os.environ.get("XLA_FLAGS", ""),
                           "dtype": spec["dtype"], "latents": list(latents_shape)})

    def decode() -> dict[str, Any]:
        vae = models.init_vae(config, dtype=spec["dtype"], encoder=False)

        def compile() -> Any:
            with variant_rewrites(variant.name):  # the runs find the program this compiles
                return vae.compile(latents_shape, chunk=chunk, inner_frames=inner_frames)

        found, out = timed(compile, lambda: vae.decode(latents, chunk=chunk, inner_frames=inner_frames),
                           runs=spec["runs"], rec=rec, trace_dir=spec.get("trace_dir"))
        frames, reference = np.asarray(jax.device_get(out)), Path(spec["reference"])
        if reference.exists():
            found["max_abs_vs_first"] = float(np.abs(frames - np.load(reference)).max())
        else:
            np.save(reference, frames)
        if spec.get("trace_dir") and Path(spec["trace_dir"]).exists():
            found["trace"] = summarize(Path(spec["trace_dir"]), top=15)
        return found

    attempt(rec, ("decode",), decode)


# -- diffusers (PyTorch) ------------------------------------------------------------------------------
def diffusers_task(spec: dict[str, Any], rec: Recorder) -> None:
    import diffusers
    import torch

    config = config_of(spec)
    latents_shape, frames_shape = shapes(config, spec["video"], spec.get("batch", 1))
    latents_host, frames_host = inputs(latents_shape, frames_shape)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    rec.put(("shapes",), {"latents": list(latents_shape), "frames": list(frames_shape)})
    rec.put(("torch",), torch_device())

    def sync(out: Any) -> Any:
        if cuda:
            torch.cuda.synchronize()
        return out

    def run(op: str, dtype: str) -> dict[str, Any]:
        torch_dtype = getattr(torch, dtype)
        torch.manual_seed(0)
        with torch.device(device):
            model = getattr(diffusers, config.class_name)(**config_kwargs(config)).eval().to(torch_dtype)
        model.use_framewise_decoding = model.use_framewise_encoding = False  # the model, not its tiling
        source = latents_host if op == "decode" else frames_host
        x = torch.from_numpy(source).to(device, torch_dtype)
        call = ((lambda: model.decode(x).sample) if op == "decode" else (lambda: model.encode(x).latent_dist.mode()))
        tiling = False
        while True:
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            try:
                with torch.no_grad():
                    timing, _ = measure(call, sync, runs=spec["runs"], rec=rec)
                break
            except torch.OutOfMemoryError:
                if tiling:
                    raise
                model.enable_tiling()  # the untiled one does not fit: diffusers' own way out
                tiling = True
        return {**timing, "tiling": tiling, "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None}

    for dtype in spec["dtypes"]:
        for op in ("decode", "encode"):
            attempt(rec, (op, dtype), functools.partial(run, op, dtype))
    if "float32" in spec["dtypes"]:
        # PyTorch's float32 above convolves in TF32 (its default on GPUs); ours is true float32. Last,
        # where time is left: diffusers' decode in true float32 too, the like-for-like comparison.
        with exact_float32():
            attempt(rec, ("decode", EXACT_FLOAT32), functools.partial(run, "decode", "float32"))


def config_kwargs(config) -> dict[str, Any]:
    return {k: v for k, v in config.to_dict().items() if k != "_class_name"}


# -- the service end to end -------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, server: subprocess.Popen, rec: Recorder) -> float:
    import httpx

    start = time.perf_counter()
    while rec.left() > 0:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode} before it was ready")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return time.perf_counter() - start
        time.sleep(0.5)
    raise TimeoutError("the server was not ready within the budget")


def service_task(spec: dict[str, Any], rec: Recorder) -> None:
    missing = [name for name in SERVICE_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        rec.put(("skipped",), f"the service needs {', '.join(missing)}, which this host lacks: carry them as "
                              "wheels (bench/device_wheels.sh)")
        return
    import asyncio

    from vaeserve.service.cli.loadtest import build_parser, run

    config = config_of(spec)
    latents_shape, _ = shapes(config, spec["video"], spec.get("batch", 1))
    warmup = "x".join(map(str, latents_shape[1:]))
    with tempfile.TemporaryDirectory() as folder:
        model = spec["model_name"] or save_model(config, Path(folder))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "vaeserve", "serve", "--model", model, "--dtype", spec["dtype"],
                   "--warmup", f"{warmup}:stream", "--port", str(port), "--log-level", "warning"]
        rec.put(("server",), {"command": command[1:], "latents": list(latents_shape), "dtype": spec["dtype"]})
        server = subprocess.Popen(command, cwd=REPO)
        try:
            rec.put(("ready_s",), wait_ready(url, server, rec))
            for concurrency in spec["concurrency"]:
                if rec.left() <= 0:
                    rec.put(("concurrency", str(concurrency)), {"skipped": "no time left of the budget"})
                    continue
                args = build_parser().parse_args([
                    "--url", url, "--concurrency", str(concurrency), "--shape", "x".join(map(str, latents_shape)),
                    "--output-type", "mp4", "--requests", str(spec["requests_per_client"] * concurrency),
                    "--warmup", "1", "--duration", str(max(1.0, rec.left()))])
                rec.put(("concurrency", str(concurrency)), asyncio.run(run(args))["summary"])
        finally:
            server.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(timeout=30)
            if server.poll() is None:
                server.kill()


def save_model(config, folder: Path) -> str:
    """A model folder of ``config`` with seeded random weights (what ``--model`` reads)."""
    from vaeserve import models

    return str(models.save_vae(models.init_vae(config), folder / "model"))


TASKS: dict[str, Callable[[dict[str, Any], Recorder], None]] = {
    "parity": parity_task, "ours": ours_task, "variant": variant_task, "diffusers": diffusers_task,
    "service": service_task}


def main() -> None:
    task, spec_path, result_path = sys.argv[1:4]
    spec = json.loads(Path(spec_path).read_text())
    rec = Recorder(Path(result_path), spec["deadline"])
    rec.save()
    print(f"[{task}] {spec.get('model', '')} {rec.left():.0f} s left (pid {os.getpid()})", flush=True)
    TASKS[task](spec, rec)


if __name__ == "__main__":
    main()
