"""Every user-facing list of models is made from the registry (``vaeserve.models.registry``) or held
to it here: ``serve --help`` and ``plan --help``, the loader's names, docs/models.md's table, and the
prose list of the README, the docs' index, the HTTP API page and the package's description."""

from __future__ import annotations

import re
import tomllib

from tests.helpers.service_helpers import REPO
from vaeserve.models import MODEL_NAMES
from vaeserve.models.registry import EMBEDDED, FAMILIES, families_markdown, models_in_words
from vaeserve.service.cli import build_parser


def help_text(command: str) -> str:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    assert isinstance(sub.choices, dict)
    return " ".join(sub.choices[command].format_help().split())


def test_help_lists_every_embedded_model_the_loader_builds():
    assert list(MODEL_NAMES) == list(EMBEDDED) and len(EMBEDDED) >= 11
    for command in ("serve", "plan"):
        listed = help_text(command)
        assert all(re.search(rf"\b{re.escape(name)}\b", listed) for name in EMBEDDED), command
    # The control: a name no family embeds is in neither.
    assert "wan3.0" not in help_text("serve")


def test_the_models_page_table_is_the_generated_one():
    page = (REPO / "docs" / "models.md").read_text()
    committed = re.search(r"<!-- families:begin -->\n(.*)<!-- families:end -->", page, re.S)
    assert committed is not None
    assert committed.group(1) == families_markdown(), "regenerate it: vaeserve.models.registry.families_markdown()"
    rows = [line for line in committed.group(1).splitlines() if "models/families/" in line]
    assert len(rows) == len(FAMILIES)
    assert "`ltx-video` (LTX-Video 0.9.5): `timestep`, `noise_scale`, `seed`; `ltx2` (LTX-2): none" in committed.group(1)


def test_each_family_declares_the_conditions_its_models_take():
    """A descriptor's ``conditions`` are what its configs may take (``models.conditions.conditions_taken``)."""
    from vaeserve.models.conditions import conditions_taken

    for family in FAMILIES:
        declared = {condition.name for condition in family.conditions}
        for model in family.embedded:
            assert set(conditions_taken(model.config())) <= declared, model.name
    # The control: LTX-Video 0.9.5 takes a timestep, so a descriptor declaring none would be caught.
    assert set(conditions_taken(EMBEDDED["ltx-video"].config())) - set() == {"timestep", "noise_scale", "seed"}


def test_the_prose_lists_name_every_model():
    words = models_in_words()
    assert all(model.title.split(" 0.")[0] in words for model in EMBEDDED.values())
    description = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["description"]
    texts = {"pyproject.toml": description, **{name: " ".join((REPO / name).read_text().split())
                                               for name in ("README.md", "docs/index.md", "docs/api.md")}}
    missing = [name for name, text in texts.items() if words not in text]
    assert missing == [], f"say `{words}` in {missing}"
