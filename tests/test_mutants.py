"""The mutation check's list stays true to the code and the docs, without running it (``make mutants`` does)."""

from __future__ import annotations

import pytest

from tests.mutants import DOCS, DOCS_BEGIN, DOCS_END, MUTANTS, REPO, docs_table


@pytest.mark.parametrize("mutant", MUTANTS, ids=[mutant.name for mutant in MUTANTS])
def test_each_mutant_still_finds_its_text_once(mutant):
    text = (REPO / mutant.path).read_text()
    assert text.count(mutant.original) == 1, f"update {mutant.name} in tests/mutants.py"
    assert mutant.mutated != mutant.original and mutant.tests
    for test in mutant.tests:
        path, _, name = test.partition("::")
        assert (REPO / path).is_file() and f"def {name.partition('[')[0]}(" in (REPO / path).read_text(), test


def test_names_are_unique_and_the_docs_list_every_mutant():
    assert len({mutant.name for mutant in MUTANTS}) == len(MUTANTS)
    block = DOCS.read_text().partition(DOCS_BEGIN)[2].partition(DOCS_END)[0]
    assert block.strip() == docs_table(), "run `python -m tests.mutants --docs`"
