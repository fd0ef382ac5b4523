"""An answer does not depend on what it was batched with: a batch's rows run one at a time inside
the program (``models.rows``), so each row's frames and latents are bit for bit those of the row
decoded (or encoded) alone. The control runs the batch as one: its convolutions tile the batch,
and the rows come out different in their last bits. (The hostile run found uint8 frames differing
by 1 between a request alone and in a batch of four.)"""

from __future__ import annotations

import numpy as np

from vaeserve import models
from vaeserve.models import decode as decode_module, encode as encode_module

# The smallest Wan config found whose batched convolutions round differently from single rows
# on XLA's CPU backend (wider tiny configs happened to agree).
CONFIG = models.WanVAEConfig(base_dim=8, num_res_blocks=1)
LATENTS = (4, 16, 2, 8, 8)
FRAMES = (4, 3, 5, 32, 32)


def rows_alone_and_together(*, stream: bool) -> dict[str, tuple[list[np.ndarray], np.ndarray]]:
    vae = models.init_vae(CONFIG, seed=0)  # its own program cache: the control compiles anew
    rng = np.random.default_rng(0)
    x = rng.standard_normal(LATENTS).astype(np.float32)
    frames = rng.uniform(-1, 1, FRAMES).astype(np.float32)
    results = {
        "float": ([np.asarray(vae.decode(x[r:r + 1]))[0] for r in range(4)], np.asarray(vae.decode(x))),
        "encode": ([np.asarray(vae.encode(frames[r:r + 1]))[0] for r in range(4)], np.asarray(vae.encode(frames))),
    }
    if stream:  # the server's path: step programs, uint8 frames
        results["stream"] = ([np.concatenate(list(vae.decode_stream(x[r:r + 1])), axis=1)[0] for r in range(4)],
                             np.concatenate(list(vae.decode_stream(x)), axis=1))
    return results


def differing_rows(alone: list[np.ndarray], together: np.ndarray) -> list[int]:
    return [r for r in range(len(alone)) if not np.array_equal(alone[r], together[r])]


def test_each_row_of_a_batch_is_bit_for_bit_the_row_alone():
    results = rows_alone_and_together(stream=True)
    assert {name: differing_rows(*pair) for name, pair in results.items()} == dict.fromkeys(results, [])


def test_control_a_batch_run_as_one_differs_from_its_rows_alone(monkeypatch):
    def as_one(run_one, rows):
        return run_one(rows)

    monkeypatch.setattr(decode_module, "each_row", as_one)
    monkeypatch.setattr(encode_module, "each_row", as_one)
    results = rows_alone_and_together(stream=False)
    assert {name: bool(differing_rows(*pair)) for name, pair in results.items()} == {"float": True, "encode": True}
