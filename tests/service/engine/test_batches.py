"""Batch buckets: the batch sizes programs are compiled for, and padding up to them."""

from __future__ import annotations

import numpy as np
import pytest

from vaeserve.service.engine.batches import batch_buckets, bucket_for, pad_batch


def test_batch_buckets():
    assert batch_buckets(1, 1) == [1]
    assert batch_buckets(4, 1) == [1, 2, 4]
    assert batch_buckets(6, 1) == [1, 2, 4, 6]
    assert batch_buckets(4, 2) == [2, 4]
    assert batch_buckets(3, 4) == [4]
    assert bucket_for(3, [1, 2, 4]) == 4 and bucket_for(1, [2, 4]) == 2
    with pytest.raises(ValueError):
        bucket_for(5, [1, 2, 4])
    padded = pad_batch(np.ones((3, 2), np.float32), 4)
    assert padded.shape == (4, 2) and padded[3].sum() == 0 and padded[:3].sum() == 6
