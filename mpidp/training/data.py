"""Datasets that need no download, and the per-rank sharding sampler.

`digits` and `synthetic` are for the MLP; `stdlib_text` is the GPT's corpus, the
bytes of Python's own standard library source (see its docstring).

The sampler is what makes N-rank training equal 1-rank training. Each epoch:

    perm = permutation of the training set, drawn from (seed, epoch) only
    drop the last len % global_batch samples          (every step is a full batch)
    global batch s = perm[s*G : (s+1)*G]               (G = global batch, any N)
    rank r's slice  = global batch s [r*G/N : (r+1)*G/N], cut into A micro-batches

      global batch s:  | rank 0 | rank 1 | rank 2 | rank 3 |     G = 4 x A x b
      rank r's slice:  | micro 0 | micro 1 | ... | micro A-1 |    each b samples

The global batches, and so the training, do not depend on N: only the cut of
each batch into shards does. Per epoch the shards are disjoint, hold the same
number of samples on every rank, and together cover the training set except
the < G dropped samples, which differ from epoch to epoch (we drop rather than
pad, because padding would repeat samples and change the gradient).
"""

from __future__ import annotations

import os
import sysconfig
import zlib
from typing import NamedTuple

import numpy as np


class Dataset(NamedTuple):
    """Train and test splits: features (n, D) float64 and labels (n,) int64."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    @property
    def features(self) -> int:
        return int(self.x_train.shape[1])

    @property
    def classes(self) -> int:
        return int(max(self.y_train.max(), self.y_test.max())) + 1


def _split(x, y, test_fraction: float, seed: int) -> Dataset:
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(len(x) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return Dataset(x[train], y[train], x[test], y[test])


def digits(test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """scikit-learn's handwritten digits: 1797 8x8 images (64 features in [0, 1]), 10 classes."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = data.data.astype(np.float64) / 16.0  # (1797, 64), pixel values 0..16
    return _split(x, data.target.astype(np.int64), test_fraction, seed)


def synthetic(n: int = 8192, features: int = 256, classes: int = 10, seed: int = 0,
              test_fraction: float = 0.2) -> Dataset:
    """Gaussian inputs labelled by a random linear teacher: any size, for benchmarks."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, features))  # (n, D)
    teacher = rng.standard_normal((features, classes))  # (D, C)
    y = (x @ teacher).argmax(axis=1).astype(np.int64)  # (n,)
    return _split(x, y, test_fraction, seed + 1)


class Text(NamedTuple):
    """A byte-level corpus: token ids (int64) of the train and held-out splits, the vocabulary.

    Token k is the byte ``vocab[k]``: the vocabulary is the sorted set of bytes in the text.
    """

    train: np.ndarray
    val: np.ndarray
    vocab: bytes
    files: int  # how many source files it was cut from

    def decode(self, ids) -> str:
        return bytes(self.vocab[int(i)] for i in ids).decode("utf-8", errors="replace")

    def fingerprint(self) -> str:
        """The corpus in a few words: its size, vocabulary and a CRC-32 of its tokens (what a
        checkpoint records: another Python's standard library gives another corpus)."""
        crc = zlib.crc32(self.vocab)
        for part in (self.train, self.val):
            crc = zlib.crc32(np.ascontiguousarray(part, dtype=np.int64).tobytes(), crc)
        return (f"{len(self.train)} + {len(self.val)} tokens, {len(self.vocab)} in the "
                f"vocabulary, crc32 {crc:08x}")

    def unigram_entropy(self) -> float:
        """H = -sum p log p of the training split's byte frequencies, in nats per token.

        The loss of the best model that ignores context: a language model that learns
        anything from the context goes below it.
        """
        counts = np.bincount(self.train, minlength=len(self.vocab)).astype(np.float64)
        p = counts[counts > 0] / counts.sum()
        return float(-(p * np.log(p)).sum())


SKIP = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def stdlib_files(root: str | None = None) -> list[str]:
    """The standard library's ``.py`` files, relative to `root`, in sorted order ('/' paths).

    Installed packages and the test suites are left out (`SKIP`).
    """
    root = root or sysconfig.get_paths()["stdlib"]
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP]
        rel = os.path.relpath(folder, root)
        found += [n if rel == "." else f"{rel}/{n}".replace(os.sep, "/")
                  for n in names if n.endswith(".py")]
    return sorted(found)


def stdlib_text(max_bytes: int = 2 << 20, val_fraction: float = 0.1,
                root: str | None = None) -> Text:
    """The first `max_bytes` of the standard library's source, as byte-level tokens.

    The files of `stdlib_files` are read in their sorted order and laid end to end
    (``__future__.py``, ``__hello__.py``, ``_aix_support.py``, ...) until `max_bytes`;
    the last one is cut. The first ``1 - val_fraction`` of the bytes are the
    training split, the rest the held-out one (other files than the training ones,
    but for the one at the cut). Every fresh machine has it; it depends on the
    Python version (and where the standard library comes from) only, and the
    training order on the seed only (`ShardSampler` over `sequences`).
    """
    if max_bytes < 2 or not 0 < val_fraction < 1:
        raise ValueError(f"max_bytes {max_bytes} must be >= 2 and val_fraction "
                         f"{val_fraction} in (0, 1)")
    root = root or sysconfig.get_paths()["stdlib"]
    chunks, size, files = [], 0, 0
    for rel in stdlib_files(root):
        with open(os.path.join(root, rel), "rb") as f:  # read(n) allocates n bytes first
            chunks.append(f.read(min(max_bytes - size, os.fstat(f.fileno()).st_size)))
        size += len(chunks[-1])
        files += 1
        if size >= max_bytes:
            break
    raw = np.frombuffer(b"".join(chunks), dtype=np.uint8)
    if raw.size < 2:
        raise ValueError(f"no Python source under {root}")
    vocab = np.unique(raw)  # (V,) the bytes that occur, sorted
    ids = np.searchsorted(vocab, raw).astype(np.int64)  # (n,) byte -> token id
    cut = int(round(raw.size * (1 - val_fraction)))
    return Text(ids[:cut], ids[cut:], bytes(vocab.tolist()), files)


def sequences(tokens: np.ndarray, context: int) -> int:
    """How many whole (input, target) sequences of `context` tokens `tokens` holds.

    Sequence k is ``tokens[k*T : k*T + T]``, its targets the same shifted by one
    (`batch`): they do not overlap, so an epoch sees each token once.
    """
    return max(0, (len(tokens) - 1) // context)


def batch(tokens: np.ndarray, seqs: np.ndarray, context: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and next-token targets (b, T) of the sequences numbered `seqs` (b,)."""
    pos = seqs[:, None] * context + np.arange(context)  # (b, T)
    return tokens[pos], tokens[pos + 1]


class ShardSampler:
    """Indices of each rank's micro-batches, epoch by epoch.

    Args:
        n_samples: size of the training set.
        global_batch: samples per optimizer step over all ranks and micro-batches.
        rank, size: this rank and the number of ranks.
        seed: with the epoch, the only source of the order.
        accum_steps: micro-batches per step on each rank (gradient accumulation).
    """

    def __init__(self, n_samples: int, global_batch: int, rank: int = 0, size: int = 1,
                 seed: int = 0, accum_steps: int = 1):
        if global_batch % (size * accum_steps):
            raise ValueError(f"global batch {global_batch} is not a multiple of ranks x "
                             f"accum steps = {size} x {accum_steps}")
        if global_batch > n_samples:
            raise ValueError(f"global batch {global_batch} exceeds the {n_samples} samples")
        self.n_samples, self.global_batch = n_samples, global_batch
        self.rank, self.size, self.seed, self.accum_steps = rank, size, seed, accum_steps
        self.local_batch = global_batch // (size * accum_steps)  # b: one micro-batch
        self.steps_per_epoch = n_samples // global_batch

    def permutation(self, epoch: int) -> np.ndarray:
        """The epoch's order of the whole training set, the same on every rank."""
        return np.random.default_rng([self.seed, epoch]).permutation(self.n_samples)

    def global_batches(self, epoch: int) -> np.ndarray:
        """(steps, G): the samples of every step, whatever the number of ranks."""
        perm = self.permutation(epoch)
        return perm[: self.steps_per_epoch * self.global_batch].reshape(
            self.steps_per_epoch, self.global_batch)

    def epoch(self, epoch: int) -> np.ndarray:
        """(steps, A, b): this rank's micro-batches for every step of the epoch."""
        shard = self.global_batches(epoch).reshape(
            self.steps_per_epoch, self.size, self.accum_steps, self.local_batch)
        return shard[:, self.rank]


class UnevenSampler:
    """Indices of each rank's micro-batches with shards of unequal length (``--uneven``).

    Each epoch's permutation (`ShardSampler`'s) is cut, with nothing dropped, into N
    contiguous shards, rank r's about (r + 1) / (1 + 2 + ... + N) of it; rank r runs
    ``steps(r) = max(1, len // (A·b))`` steps of A micro-batches, its shard cut into
    ``steps(r)·A`` micro-batches of b samples or a few more (sizes differing by at most
    one). So the ranks hold different numbers of steps: `DataParallel.join()` runs them.
    ``steps_per_epoch`` is the most any rank runs, the optimizer steps of an epoch.
    """

    def __init__(self, n_samples: int, global_batch: int, rank: int = 0, size: int = 1,
                 seed: int = 0, accum_steps: int = 1):
        self.even = ShardSampler(n_samples, global_batch, rank, size, seed, accum_steps)
        self.rank, self.accum_steps = rank, accum_steps
        self.local_batch = b = self.even.local_batch
        share = [n_samples * (r + 1) // (size * (size + 1) // 2) for r in range(size)]
        share[-1] += n_samples - sum(share)  # the rounding's rest to the last rank
        self.stops = np.cumsum([0, *share])
        short = [r for r in range(size) if share[r] < accum_steps * b]
        if short:
            raise ValueError(f"uneven shards: rank {short[0]}'s {share[short[0]]} samples "
                             f"hold less than one step of {accum_steps} x {b}")
        self.steps = [max(1, s // (accum_steps * b)) for s in share]  # rank -> its steps
        self.steps_per_epoch = max(self.steps)

    def epoch(self, epoch: int) -> list[list[np.ndarray]]:
        """This rank's steps of the epoch, each a list of A micro-batches of sample indices."""
        r, A = self.rank, self.accum_steps
        shard = self.even.permutation(epoch)[self.stops[r]:self.stops[r + 1]]
        micro = np.array_split(shard, self.steps[r] * A)
        return [micro[s * A:(s + 1) * A] for s in range(self.steps[r])]
