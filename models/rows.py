"""A batch's rows one after another inside one program, so that an answer does not depend on what
it was batched with.

Compiled kernels tile their work by the shapes they see, the batch size among them: XLA's CPU
convolutions (oneDNN) and matrix products block ``B x pixels`` differently for ``B = 1`` and
``B = 4``, so the same latents decoded alone and in a batch of four differ in the last bits of a
float (and by 1 in a few uint8 values). Mapping the rows with ``lax.map`` makes every row's
computation the batch-1 program's own; the rows still share one device call (and its dispatch),
and a row's working memory is one row's, not the batch's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import jax
from jax import lax

Out = TypeVar("Out")


def batch_size(rows: Any) -> int:
    """The common leading size of ``rows``' leaves (a pytree of batch-major arrays)."""
    sizes = {leaf.shape[0] for leaf in jax.tree.leaves(rows)}
    if len(sizes) != 1:
        raise ValueError(f"every leaf of a batch leads with the same batch size; received sizes {sorted(sizes)}")
    return sizes.pop()


def each_row(run_one: Callable[[Any], Out], rows: Any) -> Out:
    """``run_one`` (a function of batch-major pytrees, called here with batches of one row) over
    each row of ``rows`` in turn, its results stacked on a leading batch axis: bit for bit the
    results of calling it on each row alone. A batch of one is ``run_one(rows)`` itself."""
    if batch_size(rows) == 1:
        return run_one(rows)

    def one(row: Any) -> Any:
        out = run_one(jax.tree.map(lambda leaf: leaf[None], row))
        return jax.tree.map(lambda leaf: leaf[0], out)

    return lax.map(one, rows)
