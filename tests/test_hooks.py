"""Communication hooks (mpidp/training/hooks.py, compress.py, powersgd.py, gradbucket.py).

What a hook sends is counted (a `CountingComm` under DataParallel); what it delivers is
checked against the ranks' own gradients, gathered by mpi4py and reduced here in NumPy.
"""

import argparse

import numpy as np
import pytest
from helpers.subcomms import on_each_size
from helpers.sweeps import debug_check_off
from threadpoolctl import threadpool_limits

import mpidp
from mpidp.collectives import CountingComm
from mpidp.sim import hookstep
from mpidp.sim.step import Net
from mpidp.training import MLP, DataParallel, hooks
from mpidp.training.compress import Compress16, from_bf16, from_fp16, to_bf16, to_fp16
from mpidp.training.gradbucket import GradBucket
from mpidp.training.powersgd import PowerSGD

SIZES = [12, 6, 6]  # W1 (12, 6), b1, W2 (6, 6), b2: 120 items, N = 1..6 divide it
WORDS = {"fp16": (to_fp16, from_fp16), "bf16": (to_bf16, from_bf16)}


# ------------------------------------------------------------ bfloat16 words

def test_bf16_words_round_as_torch_does_for_every_upper_half():
    """Every float32 upper half, with lower halves at, just below and above the tie, zero
    and random ones: 2^16 x 8 patterns, NaNs aside (only NaN-ness is promised)."""
    torch = pytest.importorskip("torch", reason="torch.bfloat16 is the reference rounding")
    upper = np.arange(1 << 16, dtype=np.uint32)[:, None] << 16
    lower = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF,
                      *np.random.default_rng(0).integers(0, 1 << 16, 2)], np.uint32)
    x = (upper | lower).reshape(-1).view(np.float32)
    x = x[~np.isnan(x)]
    ref = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(to_bf16(x), ref)


def test_bf16_ties_go_to_even_and_specials_survive():
    one = 1.0
    half_ulp, ulp = 2.0**-8, 2.0**-7  # bfloat16: 7 mantissa bits
    x = np.array([one + half_ulp, one + ulp + half_ulp, one + half_ulp * 1.5, np.inf, -0.0,
                  np.nan, 3.4e38], np.float32)
    back = from_bf16(to_bf16(x))
    assert back[0] == one  # a tie, to the even neighbour (1.0)
    assert back[1] == one + 2 * ulp  # a tie, to the even neighbour above
    assert back[2] == one + ulp  # above the half: up
    assert back[3] == np.inf and np.signbit(back[4]) and np.isnan(back[5])
    assert back[6] == np.inf  # beyond bfloat16's largest finite: rounds to infinity


# ------------------------------------------------------------ names and refusals

@pytest.mark.parametrize("text, kind", [("none", type(None)), ("fp16", Compress16),
                                         ("bf16", Compress16), ("powersgd:4", PowerSGD)])
def test_names_parse(text, kind):
    hook = hooks.parse(text)
    assert isinstance(hook, kind) and hooks.flag(text) == text
    if kind is PowerSGD:
        assert hook.rank == 4


@pytest.mark.parametrize("text", ["fp32", "powersgd", "powersgd:0", "powersgd:x", "",
                                  "powersgd:٣", "FP16"])
def test_bad_names_are_refused_naming_the_value(text):
    with pytest.raises(ValueError, match="comm hook"):
        hooks.parse(text)
    with pytest.raises(argparse.ArgumentTypeError, match="powersgd:R"):
        hooks.flag(text)


@pytest.mark.parametrize("kw, says", [({"zero": 1}, "zero"), ({"deterministic": True},
                                                               "deterministic"),
                                      ({"progress_thread": "poll"}, "progress_thread")])
def test_zero_and_deterministic_are_refused_before_any_message(kw, says):
    model = MLP(SIZES, dtype="float32")
    opt = mpidp.training.SGD(model.params, model.grads, 0.1)
    with threadpool_limits(1, user_api="blas"), pytest.raises(ValueError,
                                                              match=f"comm_hook with {says}"):
        DataParallel(model, NoMessages(), comm_hook="fp16", optimizer=opt, **kw)


def test_fp16_and_bf16_refuse_float64_gradients_powersgd_takes_them():
    with pytest.raises(ValueError, match="float64"):
        DataParallel(MLP(SIZES, dtype="float64"), NoMessages(), comm_hook="bf16")
    with pytest.raises(TypeError, match="callable"):
        DataParallel(MLP(SIZES, dtype="float64"), NoMessages(), comm_hook=3)


class NoMessages:
    """A comm-like object that fails any message: what is refused is refused before one."""

    def __getattr__(self, name):
        raise AssertionError(f"{name} called before the arguments were checked")


# ------------------------------------------------------------ across ranks

@pytest.mark.mpi(ranks=[3], timeout=120)
def test_hooks_on_1_2_3_ranks(mpi_ranks):
    """N = 1, 2, 3 in one launch: none bitwise, fp16/bf16 and PowerSGD exact, their bytes
    counted, error feedback's sums."""
    on_each_size([1, 2, 3], every_hook_check)


def every_hook_check(comm):
    none_is_the_plain_ring_all_reduce(comm)
    for fmt in WORDS:
        compressed_average_and_bytes(comm, fmt)
        error_feedback_sums_to_the_true_sum_compressed(comm, fmt)
    powersgd_full_rank_is_exact_and_its_bytes_are_m_plus_n_times_r(comm)
    error_feedback_sums_to_the_true_sum_powersgd(comm)


def local_gradients(comm, dtype="float32", seed=0):
    """This rank's batch and its gradients, from a model that no DataParallel touched."""
    x = np.random.default_rng(100 + comm.Get_rank()).standard_normal((8, SIZES[0]))
    model = MLP(SIZES, dtype=dtype, seed=seed)
    out = model.forward(x.astype(dtype))
    model.backward(np.ones_like(out))
    return x.astype(dtype), {k: g.copy() for k, g in model.grads.items()}


def hooked_backward(comm, x, dtype="float32", steps=1, **kw):
    """DataParallel's averaged gradients after `steps` backwards on x, and its bucket."""
    model = MLP(SIZES, dtype=dtype, seed=0)
    ddp = DataParallel(model, comm, piece_mb=None, **kw)
    for _ in range(steps):
        ddp.backward(np.ones_like(ddp.forward(x)))
    return ddp, {k: g.copy() for k, g in model.grads.items()}


def gathered(comm, grads, names):
    """Every rank's flat gradient (in `names`' order), rank order: (N, G)."""
    return np.stack(comm.allgather(np.concatenate([grads[k].ravel() for k in names])))


def plain(comm, bucket):
    """docs/training.md's example of the protocol: the plain all-reduce as a hook."""
    return mpidp.iallreduce(comm, mpidp.IN_PLACE, bucket.buffer, op=mpidp.AVG,
                            algorithm=bucket.algorithm)


def none_is_the_plain_ring_all_reduce(comm):
    x, local = local_gradients(comm)
    for hook in (None, "none", plain):
        ddp, got = hooked_backward(comm, x, algorithm="ring", bucket_mb=0, comm_hook=hook)
        for b in ddp.buckets:  # each bucket as mpidp's ring all-reduce averages it, bitwise
            flat = np.concatenate([local[k].ravel() for k in b.names])
            mpidp.allreduce(comm, mpidp.IN_PLACE, flat, op=mpidp.AVG, algorithm="ring")
            np.testing.assert_array_equal(b.flat, flat)
        ddp.close()


def compressed_average_and_bytes(comm, fmt):
    n, rank = comm.Get_size(), comm.Get_rank()
    to16, widen = WORDS[fmt]
    x, local = local_gradients(comm)
    ddp, _ = hooked_backward(comm, x, bucket_mb=0, comm_hook=fmt)  # 2 buckets in flight
    for b in ddp.buckets:
        total = np.zeros(b.flat.size, np.float32)
        for g in gathered(comm, local, b.names):  # the rounded inputs, summed in float32
            total += widen(to16(g))
        np.testing.assert_array_equal(b.flat, widen(to16(total / np.float32(n))))
    ddp.close()
    sent = {}
    for hook in (None, fmt):  # one bucket of G = 480 bytes
        counter = CountingComm(comm)
        ddp, _ = hooked_backward(counter, x, comm_hook=hook, algorithm="ring")
        with debug_check_off():
            counter.reset()
            ddp.backward(np.ones_like(ddp.forward(x)))
        sent[hook] = counter.bytes_sent
        ddp.close()
    g = 4 * 120
    assert sent[None] == 2 * g * (n - 1) // n  # the ring's, as test_ring counts it
    assert sent[fmt] == g * (n - 1) // n == sent[None] // 2, (fmt, rank, sent)
    assert hookstep.compressed16(g, n, 0, Net(), 0.0).sent == sent[fmt]  # the cost model's


def powersgd_full_rank_is_exact_and_its_bytes_are_m_plus_n_times_r(comm):
    n = comm.Get_size()
    x, local = local_gradients(comm, "float64")
    ddp, got = hooked_backward(comm, x, "float64", steps=2,
                               comm_hook=PowerSGD(6, min_size=36, error_feedback=False))
    average = gathered(comm, local, ddp.buckets[0].names).mean(axis=0)
    states = list(ddp.reducer.hook.states.values())
    assert [f[0] for s in states for f in s.factored] == [0, 2]  # W2, W1 factored (rank 6)
    np.testing.assert_allclose(ddp.buckets[0].flat, average, rtol=1e-10, atol=1e-12)
    for other in comm.allgather(ddp.buckets[0].flat):  # and the same bits on every rank
        np.testing.assert_array_equal(other, ddp.buckets[0].flat)
    ddp.close()
    counter = CountingComm(comm)
    ddp, _ = hooked_backward(counter, x, comm_hook=PowerSGD(1, min_size=36), algorithm="ring")
    with debug_check_off():
        counter.reset()
        ddp.backward(np.ones_like(ddp.forward(x)))
    ddp.close()
    r = 1
    items = (12 + 6) * r + (6 + 6) * r + 6 + 6  # W1, W2 as (m + n)·r; b1, b2 whole
    assert counter.bytes_sent == 2 * 4 * items * (n - 1) // n  # two ring all-reduces
    modelled = hookstep.powersgd(((12 + 6) * r + 12, 12 * r), 4, "ring", n, 0, Net(), {}, 0.0)
    assert modelled.sent == counter.bytes_sent  # the cost model's (sim step --comm-hook)


def feedback_sums(comm, hook, true, steps):
    """max |sum of applied - sum of true averages| / steps after `steps` hook calls."""
    avg = np.mean(comm.allgather(true), axis=0)
    buf = np.zeros_like(true)
    applied = np.zeros_like(true, dtype=np.float64)
    bucket = GradBucket(0, buf.reshape(-1), [("g", 0, true.shape)])
    for _ in range(steps):
        buf[...] = true
        mpidp.waitall([hook(comm, bucket)], timeout=30)
        applied += buf
    if hasattr(hook, "close"):
        hook.close()
    return np.abs(applied - steps * avg.astype(np.float64)).max()


def error_feedback_sums_to_the_true_sum_compressed(comm, fmt):
    true = np.random.default_rng(comm.Get_rank()).uniform(0.5, 2, 60).astype(np.float32)
    ulp = 2.0 ** (-10 if fmt == "fp16" else -7)  # at [1, 2)
    steps = 64
    with_ef = feedback_sums(comm, Compress16(fmt, error_feedback=True), true, steps)
    without = feedback_sums(comm, Compress16(fmt, error_feedback=False), true, steps)
    assert with_ef <= 2 * ulp, (fmt, with_ef)  # within a rounding, after any number of steps
    assert without > 4 * ulp, (fmt, without)  # the rounding's bias piles up


def error_feedback_sums_to_the_true_sum_powersgd(comm):
    true = np.random.default_rng(3 + comm.Get_rank()).standard_normal((8, 6))
    steps = 200
    with_ef = feedback_sums(comm, PowerSGD(1, min_size=1), true, steps) / steps
    without = feedback_sums(comm, PowerSGD(1, min_size=1, error_feedback=False), true,
                            steps) / steps
    assert with_ef < 0.1 < 1 < without, (with_ef, without)  # rank 1 of a rank-6 average
