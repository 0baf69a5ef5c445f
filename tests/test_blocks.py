"""Blocks, in one process: even blocks tile the buffer; the examples and the errors.

(The ops' specifications are in test_ops.py, the schedule engine's in test_driver.py,
scratch reuse in test_staging.py.)
"""

import numpy as np
import pytest

from mpidp.collectives.algorithms.blocks import Blocks


@pytest.mark.parametrize("count", [0, 1, 3, 4, 5, 10, 13, 1 << 20])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8])
def test_even_blocks_tile_the_buffer(count, n):
    b = Blocks.even(count, n)
    assert len(b) == n and sum(b.counts) == count == b.total
    assert max(b.counts) - min(b.counts) <= 1
    assert b.packed and b.extent == count
    covered = np.concatenate([np.arange(count)[b.span(i, i + 1)] for i in range(n)])
    assert np.array_equal(covered, np.arange(count))
    assert b.max == (max(b.counts) if count else 0)


def test_blocks_examples_and_errors():
    b = Blocks.even(10, 4)
    assert b.counts == (3, 3, 2, 2) and b.displs == (0, 3, 6, 8)
    assert list(b.view(np.arange(10), 2)) == [6, 7]
    gapped = Blocks([1, 2], [0, 3])
    assert not gapped.packed and gapped.extent == 5
    with pytest.raises(ValueError):
        Blocks([1, -1])
    with pytest.raises(ValueError):
        Blocks.even(4, 0)
    with pytest.raises(ValueError):
        Blocks([1, 2], [0])
