"""The mutation check: named bugs put into the code where a silent one would do the most harm, each of
which must make the tests named for it fail.

A test that passes whatever the code does protects nothing. Each mutant here is one small edit of
the source (a formula inverted, one side of the halo exchange dropped, the padded rows left
unmasked, uint8 truncated instead of rounded, ...) together with the fast tests that must catch it.
The check copies the sources to a temporary folder, runs every named test there once unmutated (they
must pass), then applies each mutant in turn and runs its tests again: every one of them must fail.
A mutant whose text is no longer in its file is an error too, so the list follows the code.

    python -m tests.mutants                      # the baseline, then every mutant (make mutants)
    python -m tests.mutants halo-top-missing     # some of them
    python -m tests.mutants --list               # the mutants and their tests
    python -m tests.mutants --docs               # rewrite the table in docs/development.md

Exit status: 0 when every mutant was killed, 1 when one survived, 2 on an error (a baseline test
failed, a mutant's text was not found, pytest could not run).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("models", "sharding", "service", "vaeserve", "tests", "pyproject.toml")
DOCS = REPO / "docs" / "development.md"
DOCS_BEGIN, DOCS_END = "<!-- mutants:begin -->", "<!-- mutants:end -->"
# One pytest run (a baseline or a mutant's tests): far more than any takes.
RUN_TIMEOUT_S = 1800


@dataclasses.dataclass(frozen=True)
class Mutant:
    """``original`` (exactly once in ``path``) replaced by ``mutated``; every one of ``tests`` must fail."""

    name: str
    bug: str
    path: str
    original: str
    mutated: str
    tests: tuple[str, ...]

    def apply(self, root: Path) -> None:
        file = root / self.path
        text = file.read_text()
        found = text.count(self.original)
        if found != 1:
            raise MutantError(f"{self.name}: the text to mutate occurs {found} times in {self.path} "
                              f"(expected once): update the mutant in tests/mutants.py")
        file.write_text(text.replace(self.original, self.mutated))


class MutantError(RuntimeError):
    """The check could not be made (not a surviving mutant)."""


HALO = "sharding/halo.py"
CODEC = "service/codecs/latents.py"
DECODE = "models/decode.py"

PAD_HW = ("tests/sharding/test_halo.py::test_pad_hw_equals_zero_padding_of_the_whole_frame[height-8-4]",
          "tests/sharding/test_halo.py::test_pad_hw_equals_zero_padding_of_the_whole_frame[width-5-3]")
PAD_HW_AFTER = ("tests/sharding/test_halo.py::test_pad_hw_after_equals_bottom_right_zero_padding_of_the_whole_frame"
                "[height-8-4]",)
DECODE_EXACT = ("tests/sharding/test_exact.py::test_height_split_matches_single_device[tp2-h8-t1]",)
ENCODE_EXACT = ("tests/sharding/test_encode_exact.py::test_sharded_encode_matches_single_device[tp8-h8-one-row-bands]",)
# Frames reach every mesh by ``put_frames``, one device's (a 1x1 mesh) too: a fault there moves the
# single-device encode with the sharded one, so the reference that catches it is diffusers'.
ENCODE_PLACED = ("tests/models/test_encode_parity.py::test_posterior_mean_matches_diffusers_fixture[tiny_r1-2x3x1x24x40]",)
SCALING = ("tests/service/codecs/test_codec.py::test_scaling_follows_diffusers_remote_convention",)
PAD_REFLECT = ("tests/sharding/test_halo.py::test_pad_hw_reflect_equals_reflect_padding_of_the_whole_frame[height-7-4]",
               "tests/sharding/test_halo.py::test_pad_hw_reflect_equals_reflect_padding_of_the_whole_frame[height-34-8]")
UINT8 = ("tests/models/test_numerics.py::test_to_uint8_rounds_and_clamps",
         "tests/models/test_parity.py::test_uint8_output_is_rounded_float_output")

MUTANTS = (
    Mutant("unscale-multiplies", "decode input multiplied by scaling_factor instead of divided", CODEC,
           "latents = latents / np.float32(scaling_factor)", "latents = latents * np.float32(scaling_factor)",
           SCALING),
    Mutant("unscale-subtracts-shift", "decode input shifted by −shift_factor", CODEC,
           "latents = latents + np.float32(shift_factor)", "latents = latents - np.float32(shift_factor)", SCALING),
    Mutant("unscale-shifts-first", "decode input shifted before it is scaled: (z + shift) / scaling", CODEC,
           "    if scaling_factor is not None:\n        latents = latents / np.float32(scaling_factor)\n"
           "    if shift_factor is not None:\n        latents = latents + np.float32(shift_factor)\n",
           "    if shift_factor is not None:\n        latents = latents + np.float32(shift_factor)\n"
           "    if scaling_factor is not None:\n        latents = latents / np.float32(scaling_factor)\n", SCALING),
    Mutant("scale-divides", "encode output divided by scaling_factor instead of multiplied", CODEC,
           "latents = latents * np.float32(scaling_factor)", "latents = latents / np.float32(scaling_factor)",
           SCALING),
    Mutant("halo-top-missing", "a band receives zeros instead of the row above it", HALO,
           "top = lax.ppermute(lax.slice_in_dim(x, n - 1, n, axis=axis), self.axis_name, down)",
           "top = jnp.zeros_like(lax.slice_in_dim(x, n - 1, n, axis=axis))", PAD_HW + DECODE_EXACT),
    Mutant("halo-bottom-missing", "a band receives zeros instead of the row below it", HALO,
           "bottom = lax.ppermute(lax.slice_in_dim(x, 0, 1, axis=axis), self.axis_name, up)",
           "bottom = jnp.zeros_like(lax.slice_in_dim(x, 0, 1, axis=axis))", PAD_HW + DECODE_EXACT),
    Mutant("halo-top-wrong-row", "the row above is the neighbour's first row instead of its last", HALO,
           "top = lax.ppermute(lax.slice_in_dim(x, n - 1, n, axis=axis), self.axis_name, down)",
           "top = lax.ppermute(lax.slice_in_dim(x, 0, 1, axis=axis), self.axis_name, down)", PAD_HW + DECODE_EXACT),
    Mutant("encoder-halo-missing", "the encoder's stride-2 convs receive zeros instead of the row below", HALO,
           "below = lax.ppermute(lax.slice_in_dim(x, 0, 1, axis=axis), self.axis_name, up)",
           "below = jnp.zeros_like(lax.slice_in_dim(x, 0, 1, axis=axis))", PAD_HW_AFTER + ENCODE_EXACT),
    Mutant("padded-rows-unmasked", "rows that exist only because of padding are not zeroed at conv inputs", HALO,
           "        if self.layout.pad == 0:\n            return x\n        axis = _positive(",
           "        if True:\n            return x\n        axis = _positive(",
           ("tests/sharding/test_halo.py::test_pad_hw_equals_zero_padding_of_the_whole_frame[height-7-4]",
            "tests/sharding/test_halo.py::test_pad_hw_after_equals_bottom_right_zero_padding_of_the_whole_frame"
            "[height-5-4]",
            "tests/sharding/test_exact.py::test_height_split_matches_single_device[tp4-h5-t1]")),
    Mutant("reflect-top-replicates", "the image's top edge repeats row 0 where it reflects row 1", HALO,
           "return jnp.where(rows < 0, row(1), jnp.where(rows >= real, below, banded))",
           "return jnp.where(rows < 0, row(0), jnp.where(rows >= real, below, banded))", PAD_REFLECT),
    Mutant("reflect-bottom-takes-a-padded-row", "the row below the last real one is the padded row there, not R − 2",
           HALO, "below = jnp.where(rows == real, row(real - 2), row(real - 1))",
           "below = jnp.where(rows == real, row(real), row(real - 1))", PAD_REFLECT),
    Mutant("encoder-bands-on-odd-rows", "the encoder's bands start one frame row off the even rows",
           "sharding/encode.py", "jax.device_put(np.pad(frames, widths), NamedSharding(",
           "jax.device_put(np.roll(np.pad(frames, widths), 1, axis), NamedSharding(", ENCODE_PLACED),
    Mutant("uint8-truncates", "uint8 frames truncated instead of rounded", DECODE,
           "return jnp.round(scaled).astype(jnp.uint8)", "return jnp.floor(scaled).astype(jnp.uint8)", UINT8),
    Mutant("uint8-scale-127", "[-1, 1] mapped with 127 instead of 127.5", DECODE,
           "(jnp.clip(frames.astype(jnp.float32), -1.0, 1.0) + 1.0) * 127.5",
           "(jnp.clip(frames.astype(jnp.float32), -1.0, 1.0) + 1.0) * 127.0", UINT8),
    Mutant("nonfinite-misses-inf", "the decoder's non-finite count sees NaN only", DECODE,
           "return jnp.sum(~jnp.isfinite(frames),", "return jnp.sum(jnp.isnan(frames),",
           ("tests/models/test_numerics.py::test_nonfinite_count_counts_nan_and_both_infinities_per_row",)),
    Mutant("nonfinite-never-counted", "the decoder's non-finite count is always zero", DECODE,
           "return jnp.sum(~jnp.isfinite(frames),", "return 0 * jnp.sum(~jnp.isfinite(frames),",
           ("tests/models/test_numerics.py::test_nonfinite_count_counts_nan_and_both_infinities_per_row",
            "tests/sharding/test_exact.py::test_the_decoder_counts_the_nonfinite_values_it_produces")),
)


# -- running pytest in the copy ---------------------------------------------------------------------
def copy_sources(destination: Path) -> None:
    """The packages, the tests and pyproject.toml (pytest's settings), without byte-code caches."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, destination / name, ignore=ignore, symlinks=True)  # vaeserve/ links the copies
        else:
            shutil.copy2(source, destination / name)


def test_environment(cache: Path) -> dict[str, str]:
    """No byte code written (a mutant and its restored original can share a size and an mtime
    second, and Python would then run the stale one); compiled programs kept in ``cache`` across
    runs (a program a mutant does not change is compiled once)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env.update(PYTHONDONTWRITEBYTECODE="1", JAX_COMPILATION_CACHE_DIR=str(cache),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5", PYTHONPATH="")
    return env


def run_tests(root: Path, tests: tuple[str, ...], env: dict[str, str]) -> dict[str, str]:
    """``{node id: "passed" | "failed" | "error" | "skipped"}`` of ``tests`` run by pytest in ``root``."""
    report = root / "mutants-junit.xml"
    report.unlink(missing_ok=True)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-o", "addopts=",
               f"--junitxml={report}", *tests]
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if done.returncode not in (0, 1) or not report.exists():
        raise MutantError(f"pytest exited with {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}")
    outcomes = {}
    for case in ElementTree.parse(report).iter("testcase"):
        node = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "")
        kinds = {child.tag for child in case}
        outcomes[node] = next((kind for kind in ("error", "failure", "skipped") if kind in kinds), "passed")
        outcomes[node] = outcomes[node].replace("failure", "failed")
    missing = [test for test in tests if test not in outcomes]
    if missing:
        raise MutantError(f"not run (renamed or gone?): {missing}")
    return {test: outcomes[test] for test in tests}


@dataclasses.dataclass
class Result:
    mutant: Mutant
    outcomes: dict[str, str]
    seconds: float

    @property
    def killed(self) -> bool:
        return all(outcome in ("failed", "error") for outcome in self.outcomes.values())


def check(mutants: tuple[Mutant, ...], *, baseline: bool = True) -> list[Result]:
    """The baseline (every named test passes unmutated), then each mutant's tests on the mutated copy."""
    with tempfile.TemporaryDirectory(prefix="vaeserve-mutants-") as temporary:
        root = Path(temporary) / "src"
        copy_sources(root)
        env = test_environment(Path(temporary) / "jax-cache")
        if baseline:
            tests = tuple(dict.fromkeys(test for mutant in mutants for test in mutant.tests))
            print(f"baseline: {len(tests)} tests, unmutated", flush=True)
            start = time.monotonic()
            failing = [test for test, outcome in run_tests(root, tests, env).items() if outcome != "passed"]
            if failing:
                raise MutantError(f"these tests do not pass unmutated, so they can kill nothing: {failing}")
            print(f"baseline passed in {time.monotonic() - start:.0f} s", flush=True)
        results = []
        for mutant in tqdm(mutants, desc="mutants", unit="mutant"):
            pristine = (root / mutant.path).read_text()
            mutant.apply(root)
            start = time.monotonic()
            try:
                outcomes = run_tests(root, mutant.tests, env)
            finally:
                (root / mutant.path).write_text(pristine)
            results.append(Result(mutant, outcomes, time.monotonic() - start))
            tqdm.write(f"{mutant.name}: {'killed' if results[-1].killed else 'SURVIVED'} "
                       f"({results[-1].seconds:.0f} s)")
        return results


# -- reports ----------------------------------------------------------------------------------------
def _short(test: str) -> str:
    return test.removeprefix("tests/")


def docs_table() -> str:
    """The Markdown table of the mutants and the tests that kill them (docs/development.md)."""
    lines = ["| mutant | the bug it stands for | file | tests that must fail |", "|---|---|---|---|"]
    for mutant in MUTANTS:
        tests = "<br>".join(f"`{_short(test)}`" for test in mutant.tests)
        lines.append(f"| `{mutant.name}` | {mutant.bug} | `{mutant.path}` | {tests} |")
    return "\n".join(lines)


def write_docs(path: Path = DOCS) -> None:
    text = path.read_text()
    head, begin, rest = text.partition(DOCS_BEGIN)
    _, end, tail = rest.partition(DOCS_END)
    if not begin or not end:
        raise MutantError(f"{path} has no {DOCS_BEGIN} ... {DOCS_END} block")
    path.write_text(f"{head}{DOCS_BEGIN}\n{docs_table()}\n{DOCS_END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutants", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutants to check (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and their tests")
    parser.add_argument("--docs", action="store_true", help=f"rewrite the table in {DOCS.relative_to(REPO)}")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of the tests")
    args = parser.parse_args(argv)
    if args.list:
        print(docs_table())
        return 0
    if args.docs:
        write_docs()
        return 0
    known = {mutant.name: mutant for mutant in MUTANTS}
    unknown = [name for name in args.names if name not in known]
    if unknown:
        parser.error(f"unknown mutants {unknown}; known: {sorted(known)}")
    selected = tuple(known[name] for name in args.names) or MUTANTS
    try:
        results = check(selected, baseline=not args.no_baseline)
    except MutantError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    survivors = [result for result in results if not result.killed]
    for result in survivors:
        passing = [_short(test) for test, outcome in result.outcomes.items() if outcome not in ("failed", "error")]
        print(f"SURVIVED {result.mutant.name} ({result.mutant.bug}): these tests still pass: {passing}")
    total = sum(result.seconds for result in results)
    print(f"{len(results) - len(survivors)} of {len(results)} mutants killed ({total:.0f} s of mutant runs)")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
