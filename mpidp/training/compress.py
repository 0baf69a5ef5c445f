"""fp16 and bf16 compression: 16-bit words on the wire, every sum in float32.

NumPy has no bfloat16: a bfloat16 is carried as its 16-bit word (a float32's upper
half), rounded to nearest, ties to even (`to_bf16`); fp16 is NumPy's float16 seen as
words. `Compress16` is the hook (`hooks.py` has the protocol).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..collectives.algorithms.blocks import Blocks
from .gradbucket import GradBucket, Steps, hook_tag


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 words (uint16), rounded to nearest, ties to even; NaN stays NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    # adding 0x7FFF plus the kept part's lowest bit carries into it exactly when the
    # dropped half is above one half, or is one half and the kept part is odd
    words = ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():  # a NaN's payload could carry into the exponent: keep it a quiet NaN
        words[nan] = ((u[nan] >> 16) | 0x0040).astype(np.uint16)
    return words


def from_bf16(words: np.ndarray) -> np.ndarray:
    """bfloat16 words -> float32 (exact: the words are float32's upper halves)."""
    return (words.astype(np.uint32) << 16).view(np.float32)


def to_fp16(x: np.ndarray) -> np.ndarray:
    """float32 -> IEEE half words (uint16), NumPy's rounding (nearest, ties to even)."""
    return x.astype(np.float16).view(np.uint16)


def from_fp16(words: np.ndarray) -> np.ndarray:
    return words.view(np.float16).astype(np.float32)


FORMATS = {"fp16": (to_fp16, from_fp16), "bf16": (to_bf16, from_bf16)}


class Compress16:
    """fp16 or bf16 compression: 16-bit words on the wire, every sum in float32.

    A ring all-reduce of 16-bit words would carry partial sums in 16 bits, rounded at
    every hop. Here no sum is ever 16-bit: the bucket is cut into N blocks
    (`Blocks.even`) and

        1. reduce-scatter, direct: rank r sends its words of block j to rank j (j != r)
           and receives every rank's words of block r; it sums them in float32, in
           rank order, and divides by N: the float32 average of the rounded inputs;
        2. all-gather, direct: rank r rounds its block's average to 16 bits once and
           sends it to every rank; every rank (r too) writes the N blocks' words back
           as float32.

    Cost (G float32 bytes): 2 rounds of N - 1 messages, G(N-1)/(2N) bytes sent per rank
    in each: G(N-1)/N in all, half the ring's 2G(N-1)/N; 2(N-1)α + G(N-1)/N·β +
    G(N-1)/(2N)·γ, plus the rounding and widening, a few passes over G locally
    (`mpidp.sim` measures it: ``sim profile``). N - 1 messages a round: for many
    ranks a ring of words with float32 partial sums would trade that α for 1.5x bytes.

    ``error_feedback=True`` carries each rounding's residual to the next step: the
    input's (x + e - round(x + e), per rank and bucket) and the average's (on the rank
    owning the block), so the applied updates sum to the true gradients' sum, within
    one rounding.
    """

    def __init__(self, fmt: str = "fp16", error_feedback: bool = False):
        if fmt not in FORMATS:
            raise ValueError(f"comm hook format {fmt!r}: expected one of {', '.join(FORMATS)}")
        self.fmt, self.error_feedback = fmt, error_feedback
        self.compress, self.widen = FORMATS[fmt]
        self.residual: dict[int, np.ndarray] = {}  # bucket -> the input's rounding, carried
        self.owned: dict[int, np.ndarray] = {}  # bucket -> my block's average's rounding

    def __call__(self, comm, bucket: GradBucket) -> Steps:
        return Steps(self.steps(comm, bucket))

    def _carry(self, store: dict, key: int, x: np.ndarray) -> tuple[np.ndarray, Callable]:
        """x with the carried residual added, and how to keep the new one."""
        if not self.error_feedback:
            return x, lambda rounded: None
        x = x + store.setdefault(key, np.zeros_like(x))
        return x, lambda rounded: store.__setitem__(key, x - rounded)

    def steps(self, comm, bucket: GradBucket):
        rank, n = comm.Get_rank(), comm.Get_size()
        buf, tag = bucket.buffer, hook_tag(bucket.index, 0)
        blocks = Blocks.even(buf.size, n)
        x, keep = self._carry(self.residual, bucket.index, buf)
        words = self.compress(x)  # (G/2 bytes)
        keep(self.widen(words))
        if n == 1:
            buf[...] = self.widen(words)
            return
        mine = blocks.view(words, rank)
        incoming = np.empty((n, mine.size), dtype=np.uint16)  # every rank's words of my block
        peers = [j for j in range(n) if j != rank]
        yield ([comm.Irecv(incoming[j], j, tag) for j in peers]
               + [comm.Isend(blocks.view(words, j), j, tag) for j in peers])
        incoming[rank] = mine
        total = np.zeros(mine.size, dtype=np.float32)
        for j in range(n):  # rank order: the same bits whichever rank sums
            total += self.widen(incoming[j])
        avg, keep = self._carry(self.owned, bucket.index, total / np.float32(n))
        out = self.compress(avg)
        keep(self.widen(out))
        gathered = np.empty(buf.size, dtype=np.uint16)
        blocks.view(gathered, rank)[...] = out
        yield ([comm.Irecv(blocks.view(gathered, j), j, tag + 1) for j in peers]
               + [comm.Isend(out, j, tag + 1) for j in peers])
        buf[...] = self.widen(gathered)
