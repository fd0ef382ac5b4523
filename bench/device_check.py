"""One command for an accelerator host (a GPU host now, a TPU VM later): our decode and encode against
diffusers' on the same device, within a time budget.

    python -m bench.device_check --out DIR                  # on the accelerator host, about 7 minutes
    python -m bench.device_check --tiny --out DIR           # the same code paths, small configs, a CPU

It measures, in this order, as long as ``--budget-s`` lasts (it stops cleanly and keeps what it has):

1. the versions, the device's name and memory; float32 parity of our decode and encode with
   diffusers' on that device (small configs of each family measured below);
   with ``--variants``, then: ways to run our bfloat16 decode of the first video (the GPU study's
   ``VARIANTS``: step geometries, XLA flags, rewrites; ``CARD_VARIANTS`` by default), each in a process of its own, with its compiled temp, its frames'
   difference from the first variant's and the top kernels of one traced run (``bench.trace_summary``);
2. for Wan 2.1 at 1280x720x81, then Wan 2.2 at 1280x704x121, HunyuanVideo 1.5 at 1280x720x121, LTX-2
   at 1280x704x121 and Flux.1's image VAE at 1024x1024, a batch of 8, as long as the budget lasts:
   decode and encode time (min and median of warm runs) ours and diffusers', bfloat16 then float32
   (diffusers untiled, or with ``enable_tiling()`` where the untiled one does not fit), peak device
   memory, and our bfloat16 decode's error against our float32; last, diffusers' float32 decode
   with TF32 off (``float32-exact``: PyTorch's float32 convolves in TF32 on GPUs by default, ours
   is true float32);
3. with the time left, the service end to end (MP4 answers at concurrency 1, 2 and 4), when
   FastAPI, uvicorn, pydantic and PyAV are importable (they travel as wheels: docs/development.md);
   with ``--service-first`` before the cases (after the variants), with each answer's latency over
   our decode of the same video alone.

Each part runs in a process of its own (``bench.device_work``). ``DIR/device_check.json`` is
rewritten after each part, ``DIR/device_check.png`` drawn at the end, and a ``jax.profiler`` trace
of one warm bfloat16 decode of the first video kept as ``DIR/trace.tar.gz``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.gpu_study import VARIANTS, Variant
from bench.trace_summary import summarize
from vaeserve.models.config import VAEConfig  # these import no JAX
from vaeserve.models.families.hunyuan15.config import HunyuanVideo15Config
from vaeserve.models.families.kl.config import KL_BLOCKS, AutoencoderKLConfig
from vaeserve.models.families.ltx.config import LTX2VideoConfig
from vaeserve.models.families.wan.config import WanVAEConfig
from vaeserve.models.registry import embedded_model

REPO = Path(__file__).resolve().parents[1]
DTYPES = ("bfloat16", "float32")
TRACE_LIMIT_BYTES = 15 * 2**20  # a file the device tool brings back is at most 16 MiB


@dataclasses.dataclass(frozen=True)
class Case:
    model: str
    config: VAEConfig
    video: tuple[int, int, int]  # width, height, frames (1: an image model's image)
    batch: int = 1

    def spec(self) -> dict[str, Any]:
        return {"model": self.model, "config": self.config.to_dict(), "video": list(self.video), "batch": self.batch}

    def name(self) -> str:
        return "x".join(map(str, self.video)) + (f" x{self.batch}" if self.batch > 1 else "")


@dataclasses.dataclass(frozen=True)
class DeviceCheckPlan:
    cases: list[Case]
    runs: int
    service_model: str | None  # an embedded model name, or None: the case's config saved to a folder
    service_dtype: str
    budget_s: float
    grace_s: float  # past its deadline a part is killed; what it wrote stays
    diffusers_dtypes: tuple[str, ...] = DTYPES


# The variants of the GPU study (``bench.gpu_study.VARIANTS``, docs/gpu-study.md) the card times by
# default: the product's programs (one latent frame per step, one frame per inner step at 720p),
# whole steps (no inner loop: 40% fewer bytes moved, the same temp), four latent frames per step
# (54% fewer, 2.6x the temp), each also with channels-last convolutions (no layout changes, larger
# norm passes). ``--variants`` names any of the study's, the conv and padding rewrites too.
CARD_VARIANTS = ("current", "inner-4", "nhwc-inner-4", "chunk-4", "nhwc-chunk-4")


# Small configs, and a video of each whose latents have odd sizes: parity on the device (both
# modes), and the whole check in --tiny (the same shapes, so that its float32 programs are the
# ones parity compiled: a compilation-cache hit).
SMALL = {
    "wan2.1": Case("wan2.1", WanVAEConfig(base_dim=8, num_res_blocks=1), (40, 24, 5)),
    "wan2.2": Case("wan2.2", WanVAEConfig.wan22(base_dim=16, decoder_base_dim=24, num_res_blocks=1,
                                                temperal_downsample=(True, True, False)), (80, 48, 5)),
    "hunyuan1.5": Case("hunyuan1.5", HunyuanVideo15Config(block_out_channels=(8, 16, 16, 32, 64),
                                                          layers_per_block=1, latent_channels=16), (80, 48, 5)),
    # LTX-2's real decoder (not causal: it sees ahead) and an encoder to match, in two levels (4x in
    # space and time).
    "ltx2": Case("ltx2", LTX2VideoConfig.ltx2(block_out_channels=(8, 8, 8), decoder_block_out_channels=(16, 32),
                                              layers_per_block=(1, 1, 1, 1), decoder_layers_per_block=(1, 0, 1),
                                              decoder_spatio_temporal_scaling=(True, True),
                                              upsample_type=("spatiotemporal", "spatiotemporal"), upsample_factor=(2, 2),
                                              upsample_residual=(True, True), decoder_inject_noise=(False, False, False),
                                              downsample_type=("spatiotemporal",) * 3,
                                              spatio_temporal_scaling=(True, True, False), spatial_compression_ratio=None,
                                              temporal_compression_ratio=None, latent_channels=8, patch_size=1),
                 (20, 12, 9)),
    "flux1": Case("flux1", AutoencoderKLConfig.flux1(block_out_channels=(8, 16), down_block_types=(KL_BLOCKS[0],) * 2,
                                                     up_block_types=(KL_BLOCKS[1],) * 2, norm_num_groups=4,
                                                     layers_per_block=1), (40, 24, 1), batch=2),
}
# The embedded models' real configs (``models.registry``), at the sizes people generate.
FULL = DeviceCheckPlan(cases=[Case(name, embedded_model(name).config(), video, batch) for name, video, batch in (
                   ("wan2.1", (1280, 720, 81), 1), ("wan2.2", (1280, 704, 121), 1), ("hunyuan1.5", (1280, 720, 121), 1),
                   ("ltx2", (1280, 704, 121), 1), ("flux1", (1024, 1024, 1), 8))],
            runs=3, service_model="wan2.1", service_dtype="bfloat16", budget_s=420, grace_s=30)
# PyTorch's bfloat16 3-D convolutions on a CPU take ~100x its float32 ones (measured on 2 cores: 14 s
# against 0.1 s for the tiny Wan decode), so --tiny times diffusers in float32 only.
TINY = DeviceCheckPlan(cases=list(SMALL.values()),
            runs=2, service_model=None, service_dtype="float32", budget_s=300, grace_s=15,
            diffusers_dtypes=("float32",))


class Check:
    """The run: its parts' results merged into one document, written after every part."""

    def __init__(self, plan: DeviceCheckPlan, out: Path, budget_s: float, argv: list[str]):
        self.plan, self.out, self.scratch = plan, out, Path(tempfile.mkdtemp(prefix="device-check-"))
        self.start = time.time()
        self.deadline = self.start + budget_s
        self.doc: dict[str, Any] = {"command": ["python", "-m", "bench.device_check", *argv], "budget_s": budget_s,
                                    "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cases": [], "notes": []}

    def write(self) -> None:
        self.doc["elapsed_s"] = round(time.time() - self.start, 1)
        path = self.out / "device_check.json"
        path.with_suffix(".partial").write_text(json.dumps(self.doc, indent=1))
        path.with_suffix(".partial").replace(path)

    def run(self, task: str, spec: dict[str, Any], deadline: float, *, xla_flags: str = "",
            name: str | None = None) -> dict[str, Any]:
        """One part in its own process until ``deadline`` (killed ``grace_s`` after it); its result."""
        name = name or task
        spec_path, result_path = self.scratch / f"{name}-spec.json", self.scratch / f"{name}-result.json"
        result_path.unlink(missing_ok=True)
        spec_path.write_text(json.dumps({**spec, "deadline": deadline}))
        # One compilation cache for the run's parts: a program compiled by one is not compiled again.
        env = {"JAX_COMPILATION_CACHE_DIR": str(self.scratch / "jax-cache"),
               "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", **os.environ, "PYTHONUNBUFFERED": "1"}
        if xla_flags:  # XLA reads its flags once per process: a variant's are its process's
            env["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS"), xla_flags]))
        if task == "parity":  # both frameworks in one process: JAX must leave PyTorch its share
            env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        try:
            done = subprocess.run([sys.executable, "-m", "bench.device_work", task, str(spec_path), str(result_path)],
                                  cwd=REPO, env=env, timeout=max(1.0, deadline - time.time()) + self.plan.grace_s)
            status = None if done.returncode == 0 else f"{name} exited with {done.returncode}"
        except subprocess.TimeoutExpired:
            status = f"{name} was stopped {self.plan.grace_s:.0f} s past its deadline"
        result = json.loads(result_path.read_text()) if result_path.exists() else {}
        if status:
            result["status"] = status
            self.doc["notes"].append(status)
        return result

    def left(self) -> float:
        return self.deadline - time.time()

    def parity(self) -> None:
        cases = [SMALL[case.model].spec() for case in self.plan.cases]
        result = self.run("parity", {"cases": cases}, time.time() + 0.25 * self.left())
        for key in ("versions", "device", "parity", "status"):
            if key in result:
                self.doc[key] = result[key]
        self.write()

    def variants(self, variants: tuple[Variant, ...], share: float) -> None:
        """Each variant of the first case's bfloat16 decode in a process of its own, in turn, within
        ``share`` of the time left (split evenly); the fastest named. The first variant's frames are
        the reference the others' are compared with."""
        case = self.plan.cases[0]
        found: dict[str, Any] = {}
        self.doc["variants"] = {"model": case.model, "video": case.name(), "dtype": "bfloat16",
                                "results": found}
        end = time.time() + share * self.left()
        for i, variant in enumerate(variants):
            if self.left() <= 0:
                found[variant.name] = {"skipped": "no time left of the budget"}
                continue
            deadline = time.time() + (end - time.time()) / (len(variants) - i)
            spec = {**case.spec(), "dtype": "bfloat16", "runs": self.plan.runs, "variant": variant.name,
                    "reference": str(self.scratch / "variant-reference.npy"),
                    "trace_dir": str(self.scratch / f"trace-{variant.name}")}
            found[variant.name] = self.run("variant", spec, deadline, xla_flags=variant.xla_flags,
                                           name=f"variant-{variant.name}")
            self.write()
        timed = {name: r["decode"]["min_s"] for name, r in found.items() if "min_s" in r.get("decode", {})}
        if timed:
            self.doc["variants"]["fastest"] = min(timed, key=timed.__getitem__)
        self.write()

    def case(self, case: Case, trace_dir: Path | None) -> None:
        entry: dict[str, Any] = {"model": case.model, "video": case.name()}
        self.doc["cases"].append(entry)
        if self.left() <= 0:
            entry["skipped"] = "no time left of the budget"
            return self.write()
        spec = {**case.spec(), "runs": self.plan.runs, "dtypes": list(DTYPES), "trace_dtype": "bfloat16",
                "trace_dir": str(trace_dir) if trace_dir else None}
        entry["ours"] = self.run("ours", spec, time.time() + 0.5 * self.left())  # diffusers gets the rest
        self.write()
        entry["diffusers"] = self.run("diffusers", {**spec, "dtypes": list(self.plan.diffusers_dtypes)},
                                      self.deadline)
        self.write()

    def service(self) -> None:
        case = self.plan.cases[0]
        if self.left() <= 0:
            self.doc["service"] = {"skipped": "no time left of the budget"}
            return self.write()
        spec = {**case.spec(), "model_name": self.plan.service_model, "dtype": self.plan.service_dtype,
                "concurrency": [1, 2, 4], "requests_per_client": 2}
        self.doc["service"] = self.run("service", spec, self.deadline)
        self.write()

    def keep_trace(self, trace_dir: Path) -> None:
        if not any(trace_dir.rglob("*")):
            return
        self.doc["trace_summary"] = summarize(trace_dir, top=15)  # kept even when the archive is not
        archive = self.out / "trace.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(trace_dir, arcname="trace")
        if archive.stat().st_size > TRACE_LIMIT_BYTES:
            archive.unlink()
            self.doc["notes"].append(f"the profiler trace was over {TRACE_LIMIT_BYTES >> 20} MiB: not kept")
        else:
            self.doc["trace"] = archive.name


# -- the report -----------------------------------------------------------------------------------
def rows(doc: dict[str, Any]) -> list[tuple[str, str, str, str, dict[str, Any]]]:
    """``(video, op, implementation, dtype, measurement)`` for every timed measurement."""
    found = []
    for case in doc["cases"]:
        for impl in ("ours", "diffusers"):
            for op in ("decode", "encode"):
                for dtype, value in case.get(impl, {}).get(op, {}).items():
                    if isinstance(value, dict) and "min_s" in value:
                        found.append((f"{case['model']} {case['video']}", op, impl, dtype, value))
    return found


def table(doc: dict[str, Any]) -> str:
    lines = [f"{'video':28s} {'op':6s} {'impl':9s} {'dtype':13s} {'min s':>8s} {'median s':>9s} "
             f"{'compile s':>9s} {'first s':>8s} {'peak GB':>8s}"]
    for video, op, impl, dtype, m in rows(doc):
        peak = m.get("peak_bytes") or m.get("process_peak_bytes")
        tiling = " (tiled)" if m.get("tiling") else ""
        lines.append(f"{video:28s} {op:6s} {impl:9s} {dtype:13s} {m['min_s']:8.3f} {m['median_s']:9.3f} "
                     f"{m.get('compile_s', float('nan')):9.1f} {m['warmup_s']:8.1f} "
                     f"{peak / 1e9 if peak else float('nan'):8.2f}{tiling}")
    return "\n".join(lines)


def variants_table(doc: dict[str, Any]) -> str:
    """The variants' decode times, the compiled temp, the frames against the first and the top kernel."""
    variants = doc.get("variants")
    if not variants:
        return ""
    lines = [f"variants of {variants['model']} {variants['video']} decode, {variants['dtype']} "
             f"(fastest: {variants.get('fastest', 'none timed')})",
             f"{'variant':14s} {'min s':>8s} {'median s':>9s} {'compile s':>9s} {'temp GB':>8s} {'max abs':>9s}  top kernel"]
    for name, result in variants["results"].items():
        m = result.get("decode", {})
        if "min_s" not in m:
            lines.append(f"{name:14s} {m.get('error') or m.get('skipped') or result.get('skipped') or result.get('status')}")
            continue
        top = (m.get("trace", {}).get("top_kernels") or [{}])[0]
        lines.append(f"{name:14s} {m['min_s']:8.3f} {m['median_s']:9.3f} {m['compile_s']:9.1f} "
                     f"{m['program_bytes']['temp_bytes'] / 1e9:8.2f} {m.get('max_abs_vs_first', 0.0):9.2e}  "
                     f"{top.get('kind', '')} {100 * top.get('share', 0):.0f}% {top.get('name', '')[:60]}")
    return "\n".join(lines)


def service_table(doc: dict[str, Any]) -> str:
    """The served MP4 answers per concurrency: latency (p50), the device time the server reports
    (p50), and the latency over our bfloat16 decode of the same video timed alone, as the server runs
    it (the ``current`` variant's, else the first case's): how close the served answer keeps to the device."""
    concurrency = doc.get("service", {}).get("concurrency")
    if not concurrency:
        return ""
    current = doc.get("variants", {}).get("results", {}).get("current", {}).get("decode", {})
    first = doc["cases"][0].get("ours", {}).get("decode", {}).get("bfloat16", {}) if doc["cases"] else {}
    alone = current.get("min_s") or first.get("min_s")
    lines = [f"served MP4 answers (our decode alone: {alone:.3f} s)" if alone else "served MP4 answers",
             f"{'clients':>7s} {'ok':>3s} {'latency p50 s':>13s} {'device p50 s':>12s} {'latency / alone':>15s} {'frames/s':>9s}"]
    for clients, summary in concurrency.items():
        if "latency_s" not in summary:
            lines.append(f"{clients:>7s} {summary.get('skipped') or summary}")
            continue
        latency, device = summary["latency_s"]["p50"], summary["device_s"]["p50"]
        ratio = f"{latency / alone:15.2f}" if alone and latency else f"{'':>15s}"
        lines.append(f"{clients:>7s} {summary['ok']:3d} {latency or float('nan'):13.3f} {device or float('nan'):12.3f} "
                     f"{ratio} {summary['frames_per_s']:9.1f}")
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: Path) -> str | None:
    """Bars of min seconds (decode, encode) and peak memory per video; None, or why not drawn."""
    try:
        import matplotlib
    except ImportError:
        return "matplotlib is not installed: no plot"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = rows(doc)
    if not found:
        return "nothing was timed: no plot"
    videos = list(dict.fromkeys(video for video, *_ in found))
    series = [(impl, dtype) for impl in ("ours", "diffusers") for dtype in DTYPES]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    width = 0.8 / len(series)
    panels = [("decode", "min_s", "decode, min s"), ("encode", "min_s", "encode, min s"),
              ("decode", "peak", "decode, peak device GB")]
    for ax, (op, field, title) in zip(axes, panels, strict=True):
        for i, (impl, dtype) in enumerate(series):
            values, hatches = [], []
            for video in videos:
                m = next((m for v, o, im, d, m in found if (v, o, im, d) == (video, op, impl, dtype)), None)
                peak = m and (m.get("peak_bytes") or m.get("process_peak_bytes"))
                values.append(0 if m is None else (peak or 0) / 1e9 if field == "peak" else m[field])
                hatches.append("//" if m and m.get("tiling") else None)  # diffusers' enable_tiling(): not one call
            ax.bar([j + i * width for j in range(len(videos))], values, width, label=f"{impl} {dtype}", hatch=hatches)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(videos))], [v.replace(" ", "\n") for v in videos],
                      fontsize=8)
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    device = doc.get("device", {}).get("jax", {}).get("device_kind", "?")
    tiled = " (hatched: diffusers tiled)" if any(m.get("tiling") for *_, m in found) else ""
    fig.suptitle(f"vaeserve vs diffusers on {device} (JAX {doc.get('versions', {}).get('jax', '?')}){tiled}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for device_check.json and its plot")
    parser.add_argument("--tiny", action="store_true", help="small configs and videos: the code paths on a CPU")
    parser.add_argument("--budget-s", type=float, help="stop measuring after this (default 420; --tiny 300)")
    parser.add_argument("--models", help="comma-separated, in this order (default: every one of the plan's)")
    parser.add_argument("--no-service", action="store_true", help="skip the service end to end")
    parser.add_argument("--variants", nargs="*", metavar="NAME", choices=list(VARIANTS),
                        help="first, time these variants of the first case's bfloat16 decode, the first named "
                             "the reference (none named: all: "
                             + ", ".join(CARD_VARIANTS) + "; any of " + ", ".join(VARIANTS) + ")")
    parser.add_argument("--service-first", action="store_true",
                        help="the service end to end before the cases (after parity and the variants)")
    parser.add_argument("--variants-share", type=float, default=0.6,
                        help="the share of the time left after parity the variants get (default 0.6)")
    args = parser.parse_args(argv)
    plan = TINY if args.tiny else FULL
    if args.models:
        by_name = {case.model: case for case in plan.cases}
        unknown = [name for name in args.models.split(",") if name not in by_name]
        if unknown:
            parser.error(f"--models: unknown {unknown}; the plan has {sorted(by_name)}")
        plan = dataclasses.replace(plan, cases=[by_name[name] for name in args.models.split(",")])
    args.out.mkdir(parents=True, exist_ok=True)
    budget_s = plan.budget_s if args.budget_s is None else args.budget_s  # 0 is a budget, spent
    check = Check(plan, args.out, budget_s, sys.argv[1:] if argv is None else argv)
    check.doc["mode"] = "tiny" if args.tiny else "full"
    trace_dir = check.scratch / "trace"
    check.parity()
    if args.variants is not None:
        names = dict.fromkeys(args.variants or CARD_VARIANTS)  # in the order named: the first is the reference
        chosen = tuple(VARIANTS[name] for name in names)
        check.variants(chosen, args.variants_share)
    if args.no_service:
        check.doc["service"] = {"skipped": "--no-service"}
    elif args.service_first:
        check.service()
    for i, case in enumerate(plan.cases):
        check.case(case, trace_dir if i == 0 else None)
    check.keep_trace(trace_dir)
    if not args.no_service and not args.service_first:
        check.service()
    if (why := plot(check.doc, args.out / "device_check.png")) is not None:
        check.doc["notes"].append(why)
    check.write()
    print(table(check.doc))
    for extra in (variants_table(check.doc), service_table(check.doc)):
        if extra:
            print(extra)
    parity = check.doc.get("parity", {})
    print("parity (max abs, float32):", {k: (v.get("decode_max_abs"), v.get("encode_max_abs")) for k, v in
                                         parity.items() if isinstance(v, dict)})
    print("notes:", check.doc["notes"] or "none", f"; {check.doc['elapsed_s']:.0f} s in all")
    return 0 if all(isinstance(v, dict) and v.get("ok") for v in parity.values()) and parity else 1


if __name__ == "__main__":
    sys.exit(main())
