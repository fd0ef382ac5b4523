"""The compiled plans shipped with the package (``sharding/plans``): ``vaeserve plan`` answers the
rows it holds without compiling, says what made each row, and calls a row stale when this checkout
lowers another program for it or another compiler is installed — the fingerprint sees the lowered
program, not the Python that wrote it."""

import importlib.util
import json

import pytest

from vaeserve import models, sharding
from vaeserve.service import cli
from vaeserve.sharding import planner
from vaeserve.sharding.plan_table import (
    compiler_versions,
    estimate_compile_s,
    lookup,
    normalized_module,
    program_fingerprint,
    rows,
    staleness,
)
from vaeserve.sharding.planner import decode_program, table_model

README_ROWS = {tp: lookup("wan2.1", "1280x720x81", "v5e-8", "bfloat16", tp) for tp in (1, 2, 4, 8)}
LIBTPU = importlib.util.find_spec("libtpu") is not None
RECOMPILE = "python -m bench.plan_table --recompile --only 1280x720x81:v5e-8:bfloat16:{tp}"


@pytest.fixture
def no_compile(monkeypatch):
    """Planning in this test compiles nothing: the table answers."""
    monkeypatch.setattr(planner, "plan_mesh", lambda *args, **kwargs: pytest.fail("compiled: the table answers"))


def table_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()]


def test_the_readme_plan_is_answered_from_fresh_rows_up_to_the_first_fit(no_compile, capsys):
    assert cli.main(["plan", "--topology", "v5e:2x4", "--video", "1280x720x81", "--dtype", "bfloat16"]) == 0
    out, err = capsys.readouterr()
    assert "compiling" not in err and "to compile" not in err
    (answered,) = table_lines(out)
    row = README_ROWS[1]  # the table's own bytes, per device
    assert answered.startswith("| 1 |") and f"| {row['total_bytes'] / 1e9:,.2f} |" in answered
    assert "\n| 2, 4, 8 | 1 | — | skipped: tp=1 fits: only the smallest tp that fits is planned" in out
    assert "recommendation: tp=1 is the smallest tp that fits" in out
    assert f"compiled by libtpu {row['compiler']['libtpu']}" in out and f"from program {row['program']}" in out
    if LIBTPU:  # its program lowered here and compared: the answer is fresh
        assert answered.endswith("| table |"), f"{answered}\n{out}\nrecompile it: {RECOMPILE.format(tp=1)}"
    else:
        assert answered.endswith("| table, unchecked |") and "libtpu" in out


def test_named_candidates_are_all_planned_and_the_json_says_where_each_came_from(no_compile, capsys):
    assert cli.main(["plan", "--topology", "v5e-8", "--video", "1280x720x81", "--dtype", "bfloat16", "--tp", "1,8",
                     "--headroom", "0.9", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [mesh["tp"] for mesh in plan["meshes"]] == [1, 8] and plan["skipped"] == []
    for mesh in plan["meshes"]:
        row = README_ROWS[mesh["tp"]]
        assert (mesh["source"], mesh["program"], mesh["compiler"]) == ("table", row.get("program"), row["compiler"])
        assert mesh["total_bytes"] == row["total_bytes"] and mesh["halo_bytes"] is None
        assert mesh["fits"] is False  # read again at this headroom: more than 10% of 16 GB
        assert (mesh["unchecked"] is None) == LIBTPU


def test_a_row_of_another_program_or_compiler_is_stale():
    current = {**README_ROWS[1], "program": "0123456789ab", "compiler": compiler_versions("tpu")}
    assert staleness(current, "tpu", "0123456789ab") is None
    assert staleness(current, "tpu", None) is None  # not lowered here: unchecked, not stale
    assert staleness(current, "tpu", "ba9876543210") == (
        "compiled from program 0123456789ab; this checkout lowers ba9876543210")
    other_jax = staleness({**current, "compiler": {**current["compiler"], "jax": "0.0.1"}}, "tpu", "0123456789ab")
    assert other_jax is not None and other_jax.startswith("compiled by jax 0.0.1 (here ")
    unrecorded = {k: v for k, v in current.items() if k not in ("compiler", "program")}
    assert staleness(unrecorded, "tpu", "0123456789ab") == (
        "the compiler that made it is not recorded; the program it was compiled from is not recorded")


MODULE = """module @jit_run attributes {mhlo.num_partitions = 2 : i32} {
  func.func public @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
    %0 = call @silu(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
    %1 = call @silu_0(%0) : (tensor<4xf32>) -> tensor<4xf32>
    return %1 : tensor<4xf32>
  }
  func.func private @silu(%arg0: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.logistic %arg0 : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
  func.func private @silu_0(%arg0: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.negate %arg0 : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"""


def test_the_fingerprint_sees_the_program_not_the_python_names():
    fingerprint = program_fingerprint(MODULE, {})
    renamed = MODULE.replace("@silu_0", "@negated").replace("@silu", "@swish")  # other helpers' names
    assert normalized_module(renamed) == normalized_module(MODULE) and program_fingerprint(renamed, {}) == fingerprint
    assert "@f0(" in normalized_module(MODULE) and "@f1(" in normalized_module(MODULE) and "@main(" in normalized_module(MODULE)
    swapped = MODULE.replace("call @silu(", "call @SWAP(").replace("call @silu_0(", "call @silu(").replace(
        "call @SWAP(", "call @silu_0(")  # the same functions, called in the other order: another program
    assert program_fingerprint(swapped, {}) != fingerprint
    assert program_fingerprint(MODULE.replace("negate", "abs"), {}) != fingerprint
    assert program_fingerprint(MODULE, {"xla_cpu_use_onednn": True}) != fingerprint  # what the compiler is told


def test_a_lowered_decode_has_one_fingerprint_per_program(vae):
    """The tiny model's decode lowered for this host's CPU devices (no compile): the same program
    lowered twice, by two model objects, has one fingerprint; another mesh, output or weight dtype
    is another program."""
    shape, mesh = (1, 16, 2, 8, 8), sharding.make_mesh(2)
    abstract = models.abstract_vae(vae.config)
    lowered, fingerprint = decode_program(vae, shape, mesh)
    assert decode_program(abstract, shape, mesh)[1] == fingerprint and len(fingerprint) == 12
    assert "loc(" not in lowered.as_text(debug_info=False)
    others = {decode_program(vae, shape, sharding.make_mesh(4))[1], decode_program(vae, shape, mesh, output="float")[1],
              decode_program(models.abstract_vae(vae.config, dtype="bfloat16"), shape, mesh)[1]}
    assert fingerprint not in others and len(others) == 3


def test_every_row_says_what_made_it_and_the_model_names_match():
    for platform in ("tpu", "gpu"):
        for row in rows(platform):
            assert {"jax", "jaxlib"} <= set(row["compiler"]) and "code" not in row, row
            # A row of the jax installed here names its program; older ones are stale, saying so.
            assert row["compiler"]["jax"] != compiler_versions(platform)["jax"] or len(row["program"]) == 12, row
    assert table_model(models.MODEL_NAMES["wan2.1"]()) == "wan2.1"
    assert table_model(models.WanVAEConfig(base_dim=8, num_res_blocks=1)) is None  # its own config: no rows
    seconds, source = estimate_compile_s("wan2.1", "1280x720x81", "v5e-8", "bfloat16", 8)
    assert seconds == README_ROWS[8]["compile_cpu_s"] and source == "1280x720x81 on v5e-8 at tp=8"
    assert estimate_compile_s("wan2.1", "1280x720x85", "v6e-8", "bfloat16", 8) is not None  # the nearest row
