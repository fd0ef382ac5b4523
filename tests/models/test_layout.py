"""The floor plan of ``models/``: a family is a folder (``models/families/<name>/``) that exports one
descriptor, generic code reaches a family only through the registry, and no import circle."""

from __future__ import annotations

import importlib

from tests.helpers.imports import cycle, import_graph
from tests.helpers.service_helpers import REPO

MODELS = REPO / "models"
FAMILIES = "vaeserve.models.families"
# The registry imports each family's package (its descriptor); the package's own __init__ names the
# families' config classes for type checkers only (``if TYPE_CHECKING``: loaded on first use).
MAY_NAME_FAMILIES = {"vaeserve.models.registry", "vaeserve.models"}
# Family folders the registry does not list (they export no descriptor): LTX-2's and MiniMax-H3's
# sound decode to a waveform, which no ``VAEConfig`` describes.
UNLISTED = {"ltx2_audio", "minimax_h3_audio"}  # sound families (models.sound); SOUND_FAMILIES lists the served ones


def graph() -> dict[str, set[str]]:
    return import_graph(MODELS)


def generic_imports_of_families(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    return {name: found for name, targets in edges.items() if not name.startswith(FAMILIES) and name not in MAY_NAME_FAMILIES
            and (found := {t for t in targets if t.startswith(FAMILIES)})}


def test_generic_code_reaches_a_family_only_through_the_registry():
    edges = graph()
    assert generic_imports_of_families(edges) == {}
    # The control: a generic module that imports a family's module is seen.
    planted = {**edges, "vaeserve.models.decode": {*edges["vaeserve.models.decode"], f"{FAMILIES}.ltx.layers"}}
    assert generic_imports_of_families(planted) == {"vaeserve.models.decode": {f"{FAMILIES}.ltx.layers"}}
    # Nor do the other packages (sharding, service, the API) import a family's module.
    others = [p for folder in ("sharding", "service") for p in (REPO / folder).rglob("*.py")]
    named = {str(p.relative_to(REPO)) for p in others if FAMILIES in p.read_text()}
    assert named == set()


def test_no_import_circle_in_models():
    edges = graph()
    assert cycle(edges) is None, cycle(edges)
    assert cycle({**edges, "vaeserve.models.config": {"vaeserve.models.registry"}}) is not None  # the control


def test_every_family_folder_exports_one_descriptor_the_registry_lists():
    from vaeserve.models.descriptor import FamilyDescriptor
    from vaeserve.models.registry import FAMILIES as LISTED

    folders = sorted(p.name for p in (MODELS / "families").iterdir() if (p / "__init__.py").exists())
    assert sorted(f.folder for f in LISTED) == [folder for folder in folders if folder not in UNLISTED]
    for folder in folders:
        package = importlib.import_module(f"{FAMILIES}.{folder}")
        exported = [v for v in vars(package).values() if isinstance(v, FamilyDescriptor)]
        if folder in UNLISTED:
            assert exported == [], folder
            continue
        assert exported == [package.FAMILY], folder
        for cls in package.FAMILY.configs:
            assert cls.__module__.startswith(package.__name__ + "."), (folder, cls)  # its configs live in its folder
            assert cls.class_name in package.FAMILY.modules


def test_descriptors_import_no_jax_and_their_module_paths_resolve():
    import subprocess
    import sys

    code = ("import sys\nfrom vaeserve.models.registry import FAMILIES\n"
            "print([m for m in sys.modules if m == 'jax'])\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    from vaeserve.models.family_modules import family_modules
    from vaeserve.models.registry import EMBEDDED

    for model in EMBEDDED.values():
        modules = family_modules(model.config())
        assert callable(modules.decoder) and callable(modules.encoder) and callable(modules.check_encoder)
