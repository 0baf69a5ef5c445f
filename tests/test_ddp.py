"""DataParallel: N ranks on shards of the global batch train exactly like one rank on it.

Every multi-rank test computes the 1-rank reference inside the same job, on every
rank, with a plain non-distributed loop over the global batches, then compares.
"""

import itertools
import time
from contextlib import nullcontext

import numpy as np
import pytest
from helpers.subcomms import on_each_size
from helpers.sweeps import debug_check_off
from mpi4py import MPI
from threadpoolctl import threadpool_limits

import mpidp
from mpidp.collectives import CountingComm
from mpidp.training import MLP, SGD, DataParallel, ShardSampler, softmax_cross_entropy
from mpidp.training.pieces import RowsOnly

SIZES = [20, 16, 12, 5]  # 3 layers: with bucket_mb=0, 3 buckets in flight together
N_SAMPLES, GLOBAL_BATCH, EPOCHS = 48, 24, 2  # 2 steps per epoch, 4 steps in all
HYPER = {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}
TOL = {"rtol": 1e-11, "atol": 1e-13}  # summation order only, in float64


def dataset():
    rng = np.random.default_rng(42)
    x = rng.standard_normal((N_SAMPLES, SIZES[0]))  # (n, D)
    y = rng.integers(0, SIZES[-1], N_SAMPLES)  # (n,)
    return x, y


def reference() -> dict:
    """One process, one batch of GLOBAL_BATCH samples per step: what DP must reproduce."""
    x, y = dataset()
    model = MLP(SIZES, dtype="float64", seed=0)
    opt = SGD(model.params, model.grads, **HYPER)
    sampler = ShardSampler(N_SAMPLES, GLOBAL_BATCH, seed=7)
    for epoch in range(EPOCHS):
        for idx in sampler.global_batches(epoch):
            _, dlogits = softmax_cross_entropy(model.forward(x[idx]), y[idx])
            model.backward(dlogits)
            opt.step()
    return model.params


def train(comm, accum=1, check_every_step=True, **ddp_kw) -> dict:
    """DP training; every rank starts from different weights (the broadcast must fix that).

    With ``deterministic=True`` each of the `accum` backwards is one micro-shard, and
    DataParallel averages them (no 1/accum here)."""
    x, y = dataset()
    rank, size = comm.Get_rank(), comm.Get_size()
    model = MLP(SIZES, dtype="float64", seed=rank)
    ddp = DataParallel(model, comm, **ddp_kw)
    opt = SGD(model.params, model.grads, **HYPER)
    sampler = ShardSampler(N_SAMPLES, GLOBAL_BATCH, rank, size, seed=7, accum_steps=accum)
    with ddp:
        for epoch in range(EPOCHS):
            for micro_batches in sampler.epoch(epoch):  # (A, b)
                for a, idx in enumerate(micro_batches):
                    with ddp.no_sync() if a < accum - 1 else nullcontext():
                        _, dlogits = softmax_cross_entropy(ddp.forward(x[idx]), y[idx])
                        ddp.backward(dlogits if ddp.deterministic else dlogits / accum)
                opt.step()
                if check_every_step:
                    ddp.check_replicas()  # bitwise identical on every rank, every step
    return model.params


def assert_close(params, expected, what):
    for name in expected:
        np.testing.assert_allclose(params[name], expected[name], **TOL, err_msg=f"{what} {name}")


@pytest.mark.mpi(ranks=[4], timeout=300)
def test_equals_one_rank_for_every_algorithm_with_and_without_overlap(mpi_ranks):
    """N = 1..4 in one launch: a communicator of each size (tests/helpers/subcomms.py)."""
    on_each_size(range(1, 5), equals_one_rank_for_every_algorithm_with_and_without_overlap)


def equals_one_rank_for_every_algorithm_with_and_without_overlap(comm):
    expected = reference()
    for algorithm in mpidp.ALGORITHMS["allreduce"]:
        for overlap in (True, False):
            for bucket_mb in (0, 25):  # one bucket per layer; one bucket for everything
                params = train(comm, algorithm=algorithm, overlap=overlap, bucket_mb=bucket_mb)
                assert_close(params, expected, f"{algorithm} overlap={overlap} mb={bucket_mb}")


@pytest.mark.mpi(ranks=[4], timeout=300)
def test_gradient_accumulation_equals_one_batch_of_a_times_b(mpi_ranks):
    """N = 1..4 in one launch: a communicator of each size (tests/helpers/subcomms.py)."""
    on_each_size(range(1, 5), gradient_accumulation_equals_one_batch_of_a_times_b)


def gradient_accumulation_equals_one_batch_of_a_times_b(comm):
    expected = reference()
    accums = [a for a in (2, 3, 4) if GLOBAL_BATCH % (comm.Get_size() * a) == 0]
    for accum in accums:
        for overlap in (True, False):
            params = train(comm, accum=accum, overlap=overlap, bucket_mb=0)
            assert_close(params, expected, f"accum={accum} overlap={overlap}")


def check_deterministic_mode_equals_one_rank_bitwise(comm):
    """The tests above to a tolerance, here bitwise: micro-shards of M = 2 samples on N
    ranks against the same micro-shards on MPI.COMM_SELF (tests/test_determinism.py
    crosses more settings)."""
    m, local = 2, GLOBAL_BATCH // comm.Get_size()
    with threadpool_limits(1, user_api="blas"):
        expected = train(MPI.COMM_SELF, accum=GLOBAL_BATCH // m, deterministic=True)
        settings = zip(mpidp.ALGORITHMS["allreduce"], itertools.cycle([(True, 0), (False, 25)]))
        for algorithm, (overlap, bucket_mb) in settings:
            params = train(comm, accum=local // m, deterministic=True,
                           algorithm=algorithm, overlap=overlap, bucket_mb=bucket_mb)
            for name in expected:
                assert np.array_equal(params[name], expected[name]), (algorithm, name)


def check_progress_thread_gives_the_same_result(comm):
    expected = reference()
    for thread in (True, "wait", "poll"):
        assert_close(train(comm, bucket_mb=0, progress_thread=thread), expected,
                     f"progress thread {thread}")


PIECE_MB = 100 / 2**20  # 100 B: W1 (20 x 16 float64) in 20 pieces of one row each


def check_pieces_and_the_blocking_thread_equal_one_rank(comm):
    """The progress designs (pieces, the "wait" thread), with and without each other,
    and with several layers per bucket: the 1-rank result on the global batch."""
    expected = reference()
    with DataParallel(MLP(SIZES, dtype="float64"), comm, bucket_mb=0,
                      piece_mb=PIECE_MB) as ddp:  # the pieces are there to test
        # one row of W1 (128 B), of W2 (96 B); two of W3 (40 B a row, 2.5 rounded down)
        assert [len(ddp.reducer.pieces[b.index]) for b in ddp.buckets] == [6, 16, 20]
        assert ddp.row_stops == {1: list(range(1, 21)), 2: list(range(1, 17)),
                              3: list(range(2, 13, 2))}
    settings = [{"piece_mb": PIECE_MB}, {"piece_mb": PIECE_MB, "progress_thread": "wait"},
                {"progress_thread": "wait"}, {"piece_mb": RowsOnly(PIECE_MB)},
                {"piece_mb": 3 * PIECE_MB, "bucket_mb": 25, "progress_thread": "wait"},
                {"piece_mb": PIECE_MB, "overlap": False}]
    for kw in settings:
        params = train(comm, **{"bucket_mb": 0, **kw})
        assert_close(params, expected, f"{kw}")
    accums = [a for a in (2, 3) if GLOBAL_BATCH % (comm.Get_size() * a) == 0]
    for accum in accums:  # no_sync: pieces reduce the accumulated sum
        assert_close(train(comm, accum=accum, bucket_mb=0, piece_mb=PIECE_MB,
                           progress_thread="wait"), expected, f"accum={accum}")


def test_buckets_in_pieces_plan_no_whole_bucket_all_reduce(monkeypatch):
    """Before: every bucket's whole persistent all-reduce was planned, then the pieces' as
    well, and the whole one was never started (a plan, its scratch and its tags for
    nothing). Counted on one rank: one plan per piece, none more; whole buckets without."""
    planned = []
    real = mpidp.collectives.allreduce_init

    def counting(comm, send, recv, *args, **kw):
        planned.append(recv.size)
        return real(comm, send, recv, *args, **kw)

    monkeypatch.setattr(mpidp.collectives, "allreduce_init", counting)
    with DataParallel(MLP(SIZES, dtype="float64"), MPI.COMM_WORLD, bucket_mb=0,
                      piece_mb=PIECE_MB) as ddp:
        pieces = [len(ddp.reducer.pieces[b.index]) for b in ddp.buckets]
        assert pieces == [6, 16, 20] and len(planned) == sum(pieces), planned
    planned.clear()
    with DataParallel(MLP(SIZES, dtype="float64"), MPI.COMM_WORLD, bucket_mb=0,
                      piece_mb=None) as ddp:
        assert planned == [b.flat.size for b in ddp.buckets]


def check_the_default_on_one_host_is_plain_overlap_with_whole_buckets(comm):
    """The default, piece_mb="auto", cuts layers only where the comm spans hosts (not
    these ranks: on one host the cut products cost more than they hide, docs/overlap.md;
    across hosts, tests/test_cluster.py); no thread; deterministic mode never cuts."""
    with DataParallel(MLP(SIZES, dtype="float64"), comm) as ddp:
        assert (ddp.across, ddp.thread, ddp.row_stops) == (False, None, None)
        assert ddp.reducer.pieces == {}
    with threadpool_limits(1, user_api="blas"), DataParallel(
            MLP(SIZES, dtype="float64"), comm, piece_mb=PIECE_MB, deterministic=True) as ddp:
        assert ddp.row_stops is None and ddp.reducer.pieces == {}
    with pytest.raises(ValueError, match="piece_mb"):
        DataParallel(MLP(SIZES), comm, piece_mb=0)
    with pytest.raises(ValueError, match="progress_thread"):
        DataParallel(MLP(SIZES), comm, progress_thread="spin")


def check_no_sync_sends_nothing_and_the_synced_backward_reduces_the_sum(world):
    comm = CountingComm(world)
    rank = comm.Get_rank()
    model = MLP([4, 3, 2], dtype="float64", seed=0)
    ddp = DataParallel(model, comm, bucket_mb=0)
    x = np.full((2, 4), float(rank + 1))
    y = np.array([0, 1])
    comm.reset()
    with ddp.no_sync():
        ddp.forward(x)
        ddp.backward(softmax_cross_entropy(model.forward(x), y)[1])
    assert comm.bytes_sent == 0 and comm.messages_sent == 0
    ddp.forward(x)
    ddp.backward(softmax_cross_entropy(model.forward(x), y)[1])
    assert comm.bytes_sent > 0
    # expected: the average over ranks of 2 x (each rank's gradient)
    expected = {}
    for r in range(3):
        m = MLP([4, 3, 2], dtype="float64", seed=0)
        xr = np.full((2, 4), float(r + 1))
        m.backward(softmax_cross_entropy(m.forward(xr), y)[1])
        for k, g in m.grads.items():
            expected[k] = expected.get(k, 0) + 2 * g / 3
    assert_close(model.grads, expected, "accumulated")


def check_broadcast_at_start_and_check_replicas_catches_a_drift(comm):
    model = MLP([6, 5, 3], dtype="float32", seed=100 + comm.Get_rank())
    ddp = DataParallel(model, comm)
    ddp.check_replicas()  # after the broadcast: the same
    rank0 = MLP([6, 5, 3], dtype="float32", seed=100)
    for k in model.params:
        assert np.array_equal(model.params[k], rank0.params[k])
    if comm.Get_rank() == 1:
        model.params["b2"][0] += 1e-3
    with pytest.raises(RuntimeError, match=r"ranks \[1\] differ"):
        ddp.check_replicas()


def check_overlap_launches_buckets_during_backward_in_order(comm):
    model = MLP([64, 256, 256, 256, 10], dtype="float64", seed=0)
    ddp = DataParallel(model, comm, bucket_mb=0, overlap=True)
    x, y = np.ones((8, 64)), np.zeros(8, dtype=np.int64)
    ddp.forward(x)
    ddp.backward(softmax_cross_entropy(model.forward(x), y)[1])
    times = ddp.bucket_times()
    assert [t["units"] for t in times] == [[4], [3], [2], [1]]
    launches = [t["launch"] for t in times]
    assert launches == sorted(launches)
    backward_end = ddp.timings["backward"]
    assert all(t["launch"] < backward_end for t in times)
    assert times[0]["launch"] < times[-1]["launch"]  # the first starts before layer 1 is done
    ddp = DataParallel(model, comm, bucket_mb=0, overlap=False)
    ddp.forward(x)
    ddp.backward(softmax_cross_entropy(model.forward(x), y)[1])
    assert all(t["launch"] >= ddp.timings["backward"] for t in ddp.bucket_times())


def test_buckets_are_reverse_layer_order_and_grads_are_views_of_them():
    comm = MPI.COMM_SELF
    model = MLP([100, 300, 300, 10], dtype="float64", seed=0)  # W1 240 KB, W2 720 KB, W3 24 KB
    ddp = DataParallel(model, comm, bucket_mb=0.5, first_bucket_mb=0.01)
    assert [b.units for b in ddp.buckets] == [[3], [2], [1]]
    for b in ddp.buckets:
        for name in b.names:
            assert np.shares_memory(model.grads[name], b.flat)
    assert sum(b.flat.size for b in ddp.buckets) == model.num_params()
    one = DataParallel(MLP([100, 300, 300, 10], seed=0), comm)  # defaults: 25 MiB, first 1 MiB
    assert [b.units for b in one.buckets] == [[3, 2, 1]]
    with pytest.raises(ValueError, match="algorithm"):
        DataParallel(MLP([3, 2]), comm, algorithm="nope")


def check_user_collectives_in_flight_across_backward_keep_their_own_messages(world):
    # The user's collectives and the buckets' take tags of one sequence per communicator;
    # DataParallel's own duplicate keeps the buckets in a matching space of their own.
    comm = mpidp.Comm(world)
    rank, n = comm.Get_rank(), comm.Get_size()
    model = MLP([64, 256, 256, 10], dtype="float64", seed=0)
    with DataParallel(model, comm, bucket_mb=0) as ddp:
        assert MPI.Comm.Compare(ddp.comm, world) == MPI.CONGRUENT  # not the same one
        mine = [np.full(50_000 + 7 * k, float(rank + k)) for k in range(3)]
        theirs = [np.empty_like(v) for v in mine]
        requests = [comm.Iallreduce(v, out) for v, out in zip(mine, theirs, strict=True)]
        x, y = np.ones((8, 64)) * (rank + 1), np.zeros(8, dtype=np.int64)
        ddp.forward(x)
        ddp.backward(softmax_cross_entropy(model.forward(x), y)[1])
        mpidp.waitall(requests)
        for k, out in enumerate(theirs):
            assert np.array_equal(out, np.full_like(out, sum(r + k for r in range(n))))
        expected = {}
        for r in range(n):  # the gradient is the average of every rank's
            m = MLP([64, 256, 256, 10], dtype="float64", seed=0)
            xr = np.ones((8, 64)) * (r + 1)
            m.backward(softmax_cross_entropy(m.forward(xr), y)[1])
            for name, g in m.grads.items():
                expected[name] = expected.get(name, 0) + g / n
        assert_close(model.grads, expected, "gradient")
    assert ddp.comm == MPI.COMM_NULL  # freed by close()


def check_the_articles_naive_data_parallel_equals_one_rank(comm):
    from mpidp.training import NaiveDataParallel

    x, y = dataset()
    rank, size = comm.Get_rank(), comm.Get_size()
    model = MLP(SIZES, dtype="float64", seed=rank)
    dp = NaiveDataParallel(model, comm)
    opt = SGD(model.params, model.grads, **HYPER)
    sampler = ShardSampler(N_SAMPLES, GLOBAL_BATCH, rank, size, seed=7)
    for epoch in range(EPOCHS):
        for (idx,) in sampler.epoch(epoch):
            dp.backward(softmax_cross_entropy(dp.forward(x[idx]), y[idx])[1])
            opt.step()
    assert_close(model.params, reference(), "naive DP")


def check_buckets_make_progress_during_backward_not_only_at_the_end(comm):
    """Rounds completed while backward still computes: what overlap means."""
    model = MLP([64, 512, 512, 512, 10], dtype="float64", seed=0)
    x, y = np.ones((64, 64)), np.zeros(64, dtype=np.int64)
    for overlap in (True, False):
        with DataParallel(model, comm, bucket_mb=0, overlap=overlap, algorithm="ring") as ddp:
            rounds = 0
            for _ in range(5):
                ddp.backward(softmax_cross_entropy(ddp.forward(x), y)[1])
                rounds += ddp.timings["rounds_in_backward"]
            everyone = comm.allreduce(rounds)
        if overlap:  # a step without any progress on any rank is possible, five are not
            assert everyone > 0, "no bucket advanced past its first round during backward"
        else:
            assert everyone == 0  # launched after backward: nothing to overlap


def check_the_progress_thread_completes_buckets_by_itself(comm):
    for thread, piece_mb in (("wait", None), ("poll", None), ("wait", 0.01)):
        model = MLP([32, 256, 256, 10], dtype="float64", seed=0)
        with DataParallel(model, comm, bucket_mb=0, progress_thread=thread,
                          algorithm="ring", piece_mb=piece_mb) as ddp:
            for b in ddp.buckets:
                ddp.launch(b)  # what backward does; then this thread makes no MPI call
            deadline = time.monotonic() + 5.0
            while not all(b.request.done for b in ddp.buckets) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert all(b.request.done for b in ddp.buckets), f"the {thread} thread did not"
            comm.Barrier()


def check_backward_times_out_when_a_peer_does_not_join(comm):
    model = MLP([8, 6, 3], dtype="float64", seed=0)
    x, y = np.ones((4, 8)), np.zeros(4, dtype=np.int64)
    with DataParallel(model, comm, bucket_mb=0, algorithm="ring") as ddp:
        dlogits = softmax_cross_entropy(ddp.forward(x), y)[1]
        if comm.Get_rank() == 0:
            with pytest.raises(TimeoutError, match="not complete after 0.3 s"):
                ddp.backward(dlogits, timeout=0.3)
            comm.Barrier()
            mpidp.waitall([b.request for b in ddp.buckets])  # still in flight: completes now
        else:
            comm.Barrier()  # rank 0 has timed out
            ddp.backward(dlogits)
        assert all(b.request.done for b in ddp.buckets)


# The smaller checks in two launches (each launch of ranks costs seconds of start-up).

@pytest.mark.mpi(ranks=[4], timeout=240)
def test_deterministic_mode_progress_designs_and_naive_dp_equal_one_rank(mpi_ranks):
    """Deterministic mode, bitwise (N = 2, 3); the progress threads (N = 2, 3); pieces and
    the blocking thread (N = 1..4); the article's naive data parallelism (N = 1, 2, 3)."""
    on_each_size((2, 3), check_deterministic_mode_equals_one_rank_bitwise)
    on_each_size((2, 3), check_progress_thread_gives_the_same_result)
    on_each_size((1, 2, 3, 4), check_pieces_and_the_blocking_thread_equal_one_rank)
    on_each_size((1, 2, 3), check_the_articles_naive_data_parallel_equals_one_rank)


@pytest.mark.mpi(ranks=[4], timeout=180)
def test_defaults_no_sync_broadcast_overlap_progress_and_deadlines(mpi_ranks):
    """The defaults (N = 2); no_sync (N = 3); the broadcast at start and check_replicas
    (N = 2, 4); buckets launched in order during backward (N = 2); the user's collectives
    in flight across backward (N = 2, 3); rounds made during backward (N = 2, 3); the
    progress thread alone (N = 2); backward's deadline when a peer does not join (N = 2)."""
    on_each_size((2,), check_the_default_on_one_host_is_plain_overlap_with_whole_buckets)
    on_each_size((3,), check_no_sync_sends_nothing_and_the_synced_backward_reduces_the_sum)
    on_each_size((2, 4), check_broadcast_at_start_and_check_replicas_catches_a_drift)
    on_each_size((2,), check_overlap_launches_buckets_during_backward_in_order)
    on_each_size((2, 3), check_user_collectives_in_flight_across_backward_keep_their_own_messages)
    on_each_size((2, 3), check_buckets_make_progress_during_backward_not_only_at_the_end)
    on_each_size((2,), check_the_progress_thread_completes_buckets_by_itself)
    with debug_check_off():  # its exchange would wait for the peer: the deadline is tested
        on_each_size((2,), check_backward_times_out_when_a_peer_does_not_join)
