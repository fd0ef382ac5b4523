"""The compiled plans shipped with the package (``sharding/plans``): ``vaeserve plan`` answers the
rows it holds without compiling (without libtpu, even), says what made each row, and calls a row
stale when the code that makes the decode program changed — the fingerprint sees code, not
comments or docstrings, and follows what the decoding family's code imports."""

import json

import pytest

from vaeserve import models, sharding
from vaeserve.service import cli
from vaeserve.sharding.plan_table import (
    code_fingerprint,
    compiler_versions,
    current_fingerprint,
    estimate_compile_s,
    lookup,
    rows,
    staleness,
)
from vaeserve.sharding.planner import table_model

README_ROWS = {tp: lookup("wan2.1", "1280x720x81", "v5e-8", "bfloat16", tp) for tp in (1, 2, 4, 8)}


def test_the_readme_plan_is_answered_from_the_table_without_a_compiler(monkeypatch, capsys):
    def no_compiler(topology):
        raise AssertionError("compiled: the table holds every mesh asked for")

    monkeypatch.setattr(sharding.chips, "topology_devices", no_compiler)
    assert cli.main(["plan", "--topology", "v5e:2x4", "--video", "1280x720x81", "--dtype", "bfloat16"]) == 0
    out, err = capsys.readouterr()
    assert "compiling" not in err and "to compile" not in err
    lines = [line for line in out.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    assert [int(line.split("|")[1]) for line in lines] == [1, 2, 4, 8]
    for line in lines:  # the table's own bytes, per device
        row = README_ROWS[int(line.split("|")[1])]
        assert f"| {row['total_bytes'] / 1e9:,.2f} |" in line and "table" in line
    assert "recommendation: tp=1 is the smallest tp that fits" in out
    assert "compiled by libtpu" in out


def test_the_json_plan_says_where_each_mesh_came_from(monkeypatch, capsys):
    monkeypatch.setattr(sharding.chips, "topology_devices", lambda topology: pytest.fail("compiled"))
    assert cli.main(["plan", "--topology", "v5e-8", "--video", "1280x720x81", "--dtype", "bfloat16", "--tp", "8",
                     "--headroom", "0.9", "--json"]) == 0
    (mesh,) = json.loads(capsys.readouterr().out)["meshes"]
    row = README_ROWS[8]
    assert (mesh["source"], mesh["code"], mesh["compiler"]) == ("table", row["code"], row["compiler"])
    assert mesh["total_bytes"] == row["total_bytes"] and mesh["halo_bytes"] is None
    assert mesh["fits"] is False  # read again at this headroom: 2.3 GB > 10% of 16 GB


def test_a_row_of_other_code_or_another_compiler_is_stale():
    row = dict(README_ROWS[8])
    current = {**row, "code": current_fingerprint("wan"), "compiler": compiler_versions("tpu")}
    assert staleness(current, "wan", "tpu") is None
    old_code = staleness({**current, "code": "0123456789ab"}, "wan", "tpu")
    assert old_code == f"compiled from decode code 0123456789ab; this checkout's is {current_fingerprint('wan')}"
    other_jax = staleness({**current, "compiler": {**current["compiler"], "jax": "0.0.1"}}, "wan", "tpu")
    assert other_jax is not None and "jax 0.0.1 (here " in other_jax
    assert "not recorded" in staleness({k: v for k, v in current.items() if k != "compiler"}, "wan", "tpu")


def read_with(path: str, change: str):
    """This checkout's files, with ``change`` appended to ``path``."""
    from vaeserve.sharding.plan_table import PACKAGE_ROOT

    def read(name: str) -> str | None:
        file = PACKAGE_ROOT / name
        if not file.is_file():
            return None
        return file.read_text() + (change if name == path else "")

    return read


def test_the_fingerprint_sees_code_not_comments_and_follows_the_family_imports():
    wan, hunyuan = current_fingerprint("wan"), current_fingerprint("hunyuan1.0")
    assert code_fingerprint("wan", read_with("models/conv.py", "\n# a comment\n")) == wan
    one = code_fingerprint("wan", read_with("models/conv.py", '\ndef f():\n    """One."""\n    return 1\n'))
    two = code_fingerprint("wan", read_with("models/conv.py", '\ndef f():\n    """Two words."""\n    return 1\n'))
    assert one == two != wan  # a docstring is not code; the function is
    assert code_fingerprint("wan", read_with("models/conv.py", "\nSCALE = 2\n")) != wan
    # Another family's layers are not Wan's program; a generic module both import is both families'
    # (HunyuanVideo's and Wan's decoders run the frame-group scan).
    assert code_fingerprint("wan", read_with("models/families/hunyuan15/modules.py", "\nSCALE = 2\n")) == wan
    assert code_fingerprint("hunyuan1.0", read_with("models/families/wan/decoder.py", "\nSCALE = 2\n")) == hunyuan
    assert code_fingerprint("hunyuan1.0", read_with("models/frame_groups.py", "\nSCALE = 2\n")) != hunyuan
    assert code_fingerprint("wan", read_with("models/frame_groups.py", "\nSCALE = 2\n")) != wan
    assert code_fingerprint("wan", read_with("sharding/planner.py", "\nSCALE = 2\n")) == wan  # not the program


def test_every_row_says_what_made_it_and_the_model_names_match():
    for platform in ("tpu", "gpu"):
        for row in rows(platform):
            assert len(row["code"]) == 12 and {"jax", "jaxlib"} <= set(row["compiler"]), row
    assert table_model(models.MODEL_NAMES["wan2.1"]()) == "wan2.1"
    assert table_model(models.WanVAEConfig(base_dim=8, num_res_blocks=1)) is None  # its own config: no rows
    seconds, source = estimate_compile_s("wan2.1", "1280x720x81", "v5e-8", "bfloat16", 8)
    assert seconds == README_ROWS[8]["compile_cpu_s"] and source == "1280x720x81 on v5e-8 at tp=8"
    assert estimate_compile_s("wan2.1", "1280x720x85", "v6e-8", "bfloat16", 8) is not None  # the nearest row
