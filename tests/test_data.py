"""The datasets and the sharding sampler that makes N ranks train like one."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpidp.training import ShardSampler, data, digits, synthetic
from mpidp.training.data import UnevenSampler


def test_digits_ships_with_sklearn_and_splits_deterministically():
    ds = digits()
    assert ds.x_train.shape[1] == 64 and ds.classes == 10
    assert len(ds.y_train) + len(ds.y_test) == 1797 and len(ds.y_test) == 359
    assert 0 <= ds.x_train.min() and ds.x_train.max() <= 1
    assert np.array_equal(digits().y_test, ds.y_test)


def test_synthetic_has_the_asked_shape():
    ds = synthetic(n=500, features=12, classes=4, seed=1)
    assert ds.x_train.shape == (400, 12) and ds.x_test.shape == (100, 12)
    assert set(np.unique(ds.y_train)) <= set(range(4))


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("accum", [1, 2])
def test_shards_are_disjoint_equal_and_cover_all_but_the_dropped_tail(size, accum):
    n, G = 101, 24
    shards = [ShardSampler(n, G, r, size, seed=5, accum_steps=accum).epoch(3)
              for r in range(size)]
    assert all(s.shape == (n // G, accum, G // (size * accum)) for s in shards)
    seen = np.concatenate([s.ravel() for s in shards])
    assert len(np.unique(seen)) == len(seen) == (n // G) * G  # disjoint, 5 samples dropped
    assert seen.min() >= 0 and seen.max() < n


def test_global_batches_do_not_depend_on_the_number_of_ranks():
    n, G = 100, 24
    one = ShardSampler(n, G, 0, 1, seed=2).global_batches(0)
    for size in (2, 3, 4):
        for accum in (1, 2):
            per_rank = [ShardSampler(n, G, r, size, 2, accum).epoch(0) for r in range(size)]
            for step in range(one.shape[0]):
                ours = np.concatenate([s[step].ravel() for s in per_rank])
                assert np.array_equal(np.sort(ours), np.sort(one[step]))


def test_order_comes_from_seed_and_epoch_only():
    a = ShardSampler(64, 16, seed=1)
    assert np.array_equal(a.epoch(0), ShardSampler(64, 16, seed=1).epoch(0))
    assert not np.array_equal(a.epoch(0), a.epoch(1))  # reshuffled every epoch
    assert not np.array_equal(a.epoch(0), ShardSampler(64, 16, seed=2).epoch(0))


def test_bad_batch_sizes_are_refused():
    with pytest.raises(ValueError, match="multiple"):
        ShardSampler(100, 10, 0, 4)
    with pytest.raises(ValueError, match="exceeds"):
        ShardSampler(10, 20, 0, 1)


def test_stdlib_text_reads_the_sorted_files_end_to_end_and_holds_out_the_tail(tmp_path):
    files = {"b.py": b"bb\n", "a.py": b"aaaa", "pkg/__init__.py": b"c", "pkg/x.txt": b"no",
             "test/t.py": b"skipped", "site-packages/s.py": b"skipped"}
    for rel, content in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(content)
    assert data.stdlib_files(str(tmp_path)) == ["a.py", "b.py", "pkg/__init__.py"]
    text = data.stdlib_text(max_bytes=7, val_fraction=0.3, root=str(tmp_path))
    assert text.vocab == b"\nab" and text.files == 2  # 'aaaa' + 'bb\n', cut at 7 bytes
    assert text.decode(text.train) == "aaaab" and text.decode(text.val) == "b\n"
    assert text.unigram_entropy() == pytest.approx(-(0.8 * np.log(0.8) + 0.2 * np.log(0.2)))
    again = data.stdlib_text(max_bytes=7, val_fraction=0.3, root=str(tmp_path))
    assert np.array_equal(again.train, text.train) and np.array_equal(again.val, text.val)
    with pytest.raises(ValueError, match="no Python source"):
        data.stdlib_text(root=str(tmp_path / "pkg" / "none"))


def test_sequences_are_disjoint_windows_with_targets_shifted_by_one():
    tokens = np.arange(23)
    assert data.sequences(tokens, 5) == 4  # 4 x 5 + 1 target <= 23
    x, y = data.batch(tokens, np.array([3, 0]), 5)
    assert x.tolist() == [[15, 16, 17, 18, 19], [0, 1, 2, 3, 4]]
    assert np.array_equal(y, x + 1)


def test_the_real_stdlib_corpus_is_python_source():
    text = data.stdlib_text(max_bytes=1 << 16)
    assert len(text.train) + len(text.val) == 1 << 16
    assert "def " in text.decode(text.train) and 1.5 < text.unigram_entropy() < np.log(256)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 6), st.integers(1, 3), st.integers(1, 4), st.integers(0, 200),
       st.integers(0, 3))
def test_uneven_shards_use_every_sample_once_in_steps_of_a_micro_batches(n, A, b, extra, ep):
    G = n * A * b
    total = n * (n + 1) // 2 * A * b + extra  # every shard holds a step at least
    samplers = [UnevenSampler(total, G, r, n, seed=3, accum_steps=A) for r in range(n)]
    steps = [s.epoch(ep) for s in samplers]
    seen = np.concatenate([np.concatenate(m) for rank in steps for m in rank])
    assert np.array_equal(np.sort(seen), np.arange(total))  # none dropped, none twice
    for s, rank in zip(samplers, steps, strict=True):
        assert s.steps_per_epoch == max(len(r) for r in steps)
        assert all(len(m) == A for m in rank)  # A micro-batches a step, on every rank
        sizes = [len(x) for m in rank for x in m]
        assert min(sizes) >= b and max(sizes) - min(sizes) <= 1, sizes
    if n > 1:  # one global batch in all: rank 0's share, 2/(n+1) of it, is short of a step
        with pytest.raises(ValueError, match="less than one step"):
            UnevenSampler(G, G, 0, n, accum_steps=A)
