"""Settings are declared once: the flags of `vaeserve serve` (with their help), the environment
variables and the docs' table all come from ``service.settings.Settings``."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from tests.helpers.service_helpers import REPO
from vaeserve.service.cli import build_parser, main, serve as serve_command
from vaeserve.service.cli.serve import settings_from
from vaeserve.service.settings import Settings, named_model, parse_latent_shape, settings_markdown


def serve_parser():
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    return sub.choices["serve"]


def test_every_setting_is_a_flag_with_its_description_and_environment_variable():
    actions = {a.dest: a for a in serve_parser()._actions if a.dest != "help"}
    assert set(actions) == set(Settings.model_fields)
    help_text = " ".join(serve_parser().format_help().split())
    for name, field in Settings.model_fields.items():
        assert f"--{name.replace('_', '-')}" in actions[name].option_strings
        assert " ".join((field.description or "").split())[:40] in help_text, name
        assert f"VAESERVE_{name.upper()}" in help_text, name


def test_flags_win_over_the_environment_which_wins_over_defaults(monkeypatch):
    monkeypatch.setenv("VAESERVE_TP", "4")
    monkeypatch.setenv("VAESERVE_MAX_QUEUE", "7")
    args = build_parser().parse_args(["serve", "--tp", "2", "--warmup", "16x2x4x4", "--warmup", "16x1x8x8:uint8,stream",
                                      "--shapes", "warmed", "--api-key", "k", "--encode-warmup", "3,5,64,64"])
    settings = settings_from(args)
    assert (settings.tp, settings.max_queue, settings.max_batch) == (2, 7, 4)
    # A value with commas is one entry (pydantic-settings alone would split it).
    assert [str(w) for w in settings.warmup] == ["16x2x4x4:uint8,float,stream", "16x1x8x8:uint8,stream"]
    assert settings.encode_warmup == [(3, 5, 64, 64)]
    assert settings_from(build_parser().parse_args(["serve", "--shapes", "16,2,4,4"])).shapes == [(16, 2, 4, 4)]
    assert settings.shapes == "warmed" and settings.api_key is not None
    assert settings.api_key.get_secret_value() == "k"
    with pytest.raises(ValidationError, match="tp"):  # the model's constraints hold for flags too
        settings_from(build_parser().parse_args(["serve", "--tp", "0"]))


def test_the_docs_table_is_the_generated_one():
    page = (REPO / "docs" / "settings.md").read_text()
    committed = re.search(r"<!-- settings:begin -->\n(.*)<!-- settings:end -->", page, re.S)
    assert committed is not None
    assert committed.group(1) == settings_markdown(), "regenerate it: vaeserve settings (docs/settings.md)"
    rows = [line for line in committed.group(1).splitlines() if line.startswith("| `--")]
    assert len(rows) == len(Settings.model_fields)
    # Negative control: a setting the table lacks is noticed.
    assert "| `--max-queue N` | `VAESERVE_MAX_QUEUE` | `16` |" in committed.group(1)


def test_settings_from_env_and_overrides(monkeypatch):
    monkeypatch.setenv("VAESERVE_MAX_QUEUE", "7")
    monkeypatch.setenv("VAESERVE_WARMUP", '["16x2x4x4", "16,1,8,8"]')
    monkeypatch.setenv("VAESERVE_API_KEY", "zq-secret-91")
    s = Settings(max_batch=3)
    assert s.max_queue == 7 and s.max_batch == 3
    assert [w.shape for w in s.warmup] == [(16, 2, 4, 4), (16, 1, 8, 8)]
    assert s.warmup[0].outputs == ("uint8", "float", "stream")  # every output by default
    assert s.api_key.get_secret_value() == "zq-secret-91" and "zq-secret-91" not in repr(s)
    (only,) = Settings(warmup=["16x1x2x2:uint8,stream"]).warmup
    assert only.shape == (16, 1, 2, 2) and only.outputs == ("uint8", "stream")
    assert parse_latent_shape("16x128x96") == (16, 128, 96)  # an image model's CxHxW
    with pytest.raises(ValueError):
        parse_latent_shape("16x2")
    with pytest.raises(ValueError):
        Settings(warmup=["16x2x4x4:gif"])
    with pytest.raises(ValueError):  # a body of max_body_bytes could never be read
        Settings(max_body_bytes=2048, max_reading_bytes=1024)


def test_a_deprecated_name_still_sets_its_setting():
    with pytest.warns(DeprecationWarning, match="encode_workers .* is now mp4_writers"):
        settings = Settings(encode_workers=3)
    assert settings.mp4_writers == settings.mp4_writer_count == 3
    with pytest.warns(DeprecationWarning):  # the new name wins where both are given
        assert Settings(encode_workers=3, mp4_writers=5).mp4_writer_count == 5
    assert Settings(mp4_writers=2).mp4_writer_count == 2


# ---- the API key -------------------------------------------------------------------------------------


def never_serve(*args, **kwargs):
    raise AssertionError("the server was started")


@pytest.mark.parametrize("how", ["environment", "flag"])
def test_an_empty_api_key_refuses_to_start_saying_why(how, monkeypatch, capsys):
    # An unset compose variable gives VAESERVE_API_KEY= : the empty bearer token was then the key.
    monkeypatch.delenv("VAESERVE_API_KEY", raising=False)
    monkeypatch.setattr(serve_command, "create_app", never_serve)
    if how == "environment":
        monkeypatch.setenv("VAESERVE_API_KEY", "")
    assert main(["serve", *(["--api-key", ""] if how == "flag" else [])]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vaeserve serve: the API key (--api-key, VAESERVE_API_KEY) is empty") and "Traceback" not in err
    with pytest.raises(ValidationError, match="empty"):
        Settings(api_key="  ")
    with pytest.raises(ValidationError, match="whitespace"):  # no Authorization header could carry it
        Settings(api_key=" k")


def test_the_api_key_file_is_read_stripped_and_an_empty_one_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("VAESERVE_API_KEY", raising=False)
    monkeypatch.setattr(serve_command, "create_app", never_serve)
    key_file = tmp_path / "key"
    key_file.write_text("zq-file-secret-7\n")
    settings = settings_from(build_parser().parse_args(["serve", "--api-key-file", str(key_file)]))
    assert settings.api_key is not None and settings.api_key.get_secret_value() == "zq-file-secret-7"
    assert "zq-file-secret-7" not in repr(settings)
    monkeypatch.setenv("VAESERVE_API_KEY_FILE", str(key_file))  # the environment names the file too
    assert Settings().api_key == settings.api_key
    with pytest.raises(ValidationError, match="given twice"):
        Settings(api_key="other")
    monkeypatch.delenv("VAESERVE_API_KEY_FILE")
    key_file.write_text(" \n")
    assert main(["serve", "--api-key-file", str(key_file)]) == 2
    assert f"api_key_file {key_file} holds no key" in capsys.readouterr().err
    assert main(["serve", "--api-key-file", str(tmp_path / "missing")]) == 2
    assert "cannot be read" in capsys.readouterr().err


def test_model_repeats_and_names_its_models(monkeypatch):
    args = build_parser().parse_args(["serve", "--model", "wan2.1", "--model", "ltx=/models/ltx-2-vae"])
    assert settings_from(args).model == ["wan2.1", "ltx=/models/ltx-2-vae"]
    assert [named_model(entry) for entry in settings_from(args).model] == [
        ("wan2.1", "wan2.1"), ("ltx", "/models/ltx-2-vae")]
    assert named_model("/models/a=b") == ("/models/a=b", "/models/a=b")  # a path is not a name
    monkeypatch.setenv("VAESERVE_MODEL", "/models/wan2.1-vae")  # one model: the value as it is
    assert Settings().model == ["/models/wan2.1-vae"]
    monkeypatch.setenv("VAESERVE_MODEL", '["wan2.1", "flux1=/models/flux1-vae"]')
    assert Settings().model == ["wan2.1", "flux1=/models/flux1-vae"]
    with pytest.raises(ValidationError, match="named alike.*wan"):
        Settings(model=["wan=/a", "wan=/b"])
