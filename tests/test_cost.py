"""The α-β-γ model: its formulas, its calibration, and the "auto" choice it drives."""

import math
import os

import numpy as np
import pytest
from helpers.subcomms import on_each_size
from mpi4py import MPI

from mpidp.collectives import ALGORITHMS, CountingComm, api, cost
from mpidp.collectives.cost import DEFAULT, Model, best, predict

ROUNDS, BYTES, REDUCED = Model(1.0, 0.0, 0.0), Model(0.0, 1.0, 0.0), Model(0.0, 0.0, 1.0)


def names(collective):
    return ALGORITHMS[collective][:-1]  # without "auto"


def test_rounds_bytes_and_reductions_follow_the_cost_table():
    G = 1 << 20
    for p in (2, 4, 8):
        k = p.bit_length() - 1
        assert predict(ROUNDS, "allreduce", "ring", G, p) == 2 * (p - 1)
        assert predict(ROUNDS, "allreduce", "rabenseifner", G, p) == 2 * k
        assert predict(ROUNDS, "allreduce", "recursive_doubling", G, p) == k
        assert predict(ROUNDS, "allreduce", "direct", G, p) == p - 1  # one message per peer
        assert predict(BYTES, "allreduce", "direct", G, p) == G * (p - 1)
        assert predict(REDUCED, "allreduce", "direct", G, p) == G * (p - 1)
        assert predict(BYTES, "allreduce", "ring", G, p) == 2 * G * (p - 1) / p
        assert predict(BYTES, "allreduce", "rabenseifner", G, p) == 2 * G * (p - 1) / p
        assert predict(BYTES, "allreduce", "recursive_doubling", G, p) == G * k
        assert predict(REDUCED, "allreduce", "rabenseifner", G, p) == G * (p - 1) / p
        assert predict(BYTES, "reduce_scatter", "recursive_halving", G, p) == G * (p - 1) / p
        assert predict(BYTES, "allgather", "recursive_doubling", G, p) == G * (p - 1) / p
        assert predict(BYTES, "bcast", "scatter_allgather", G, p) == 2 * G * (p - 1) / p
    # N = 6: p = 4, the fold adds 3 rounds to Rabenseifner and 2 to recursive doubling
    assert predict(ROUNDS, "allreduce", "rabenseifner", G, 6) == 2 * 2 + 3
    assert predict(ROUNDS, "allreduce", "recursive_doubling", G, 6) == 2 + 2
    assert predict(ROUNDS, "allreduce", "naive", G, 6) == 2 * 3
    for collective in ("allreduce", "reduce_scatter", "allgather", "bcast"):
        for name in names(collective):
            assert predict(DEFAULT, collective, name, G, 1) == 0.0


def test_auto_takes_few_rounds_when_small_and_few_bytes_when_large():
    for p in (2, 4, 8):
        assert best(DEFAULT, "allreduce", names("allreduce"), 8, p) == "recursive_doubling"
    # 3 ranks: direct's 2 messages against the fold's 3 rounds (measured: within noise)
    assert best(DEFAULT, "allreduce", names("allreduce"), 8, 3) == "direct"
    for p in (2, 3, 4, 8):
        assert best(DEFAULT, "allreduce", names("allreduce"), 64 << 20, p) in (
            "ring", "rabenseifner")
        assert best(DEFAULT, "bcast", names("bcast"), 8, p) == "binomial"
    assert best(DEFAULT, "bcast", names("bcast"), 64 << 20, 8) == "scatter_allgather"
    assert best(ROUNDS, "allreduce", names("allreduce"), 1 << 30, 4) == "recursive_doubling"


def test_fit_recovers_a_known_model_and_keeps_every_term_non_negative():
    rows = np.array([cost.terms("allreduce", name, size, 4) for name, size in cost.PROBES])
    known = Model(alpha=30e-6, beta=0.4e-9, gamma=0.1e-9, fixed=9e-6)
    seconds = np.array([predict(known, "allreduce", name, size, 4) for name, size in cost.PROBES])
    assert np.allclose(rows @ [known.fixed, known.alpha, known.beta, known.gamma], seconds)
    assert np.allclose(cost.fit(rows, seconds), known, rtol=1e-6, atol=1e-15)
    # times that shrink with the size would need a negative β: the fit sets it to 0
    shrinking = seconds[::-1].copy()
    fitted = cost.fit(rows, shrinking)
    assert min(fitted) >= 0 and fitted.beta == 0, fitted


def check_calibration_is_cheap_cached_and_the_same_on_every_rank(world):
    comm = world.Dup()  # a new communicator: nothing cached yet
    n = comm.Get_size()
    counter = CountingComm(comm)
    m = cost.model(counter)  # its duration is reported by `bench calibrate`
    assert all(np.isfinite(v) and v >= 0 for v in m) and m.alpha > 0, m
    if n > 1:  # it measured: the probes went over the wire, and the fit is not the default
        calls = sum(1 + 3 * cost.REPS[size >= 1 << 16] for _, size in cost.PROBES)
        assert counter.messages_sent >= calls, counter.messages_sent  # a message a call, at least
        assert m != cost.DEFAULT
    everyone = np.empty((n, len(m)))
    comm.Allgather(np.array(m, dtype=np.float64), everyone)
    assert (everyone == everyone[0]).all(), everyone  # bit for bit
    counter = CountingComm(comm)
    assert cost.model(counter) == m
    assert counter.messages_sent == 0  # cached on the communicator
    # every rank resolves "auto" alike at every size, so no rank waits on another algorithm
    for collective in ("allreduce", "reduce_scatter", "allgather", "bcast"):
        for nbytes in [0] + [8 << (3 * i) for i in range(9)]:  # 8 B .. 128 MiB
            choice = api.choose(comm, collective, nbytes, "auto")
            assert choice in names(collective)
            index = np.array([names(collective).index(choice)])
            lowest, highest = np.empty(1, int), np.empty(1, int)
            comm.Allreduce(index, lowest, MPI.MIN)
            comm.Allreduce(index, highest, MPI.MAX)
            assert lowest[0] == highest[0], (collective, nbytes)
    comm.Free()


def check_auto_follows_a_pinned_model_and_is_correct(world):
    comm = world.Dup()
    rank = comm.Get_rank()
    cost.set_model(comm, *ROUNDS)  # only rounds cost: the fewest-round algorithm wins
    fewest = "direct" if comm.Get_size() == 3 else "recursive_doubling"  # 2 messages < 3 rounds
    assert api.choose(comm, "allreduce", 1 << 26, "auto") == fewest
    assert api.choose(comm, "bcast", 1 << 26, "auto") == "binomial"
    cost.set_model(comm, *BYTES)
    assert api.choose(comm, "allreduce", 1 << 26, "auto") in ("ring", "rabenseifner")
    cost.set_model(comm, *DEFAULT)
    for count in (0, 1, 100, 10_000, 300_000):
        x = np.arange(count, dtype=np.float64) + rank
        ref, y = np.empty_like(x), np.empty_like(x)
        comm.Allreduce(x, ref)
        api.allreduce(comm, x, y)  # algorithm="auto" is the default
        assert np.array_equal(y, ref), count
        handle = api.iallreduce(comm, x, y, op=MPI.MAX)
        handle.wait()
        assert np.array_equal(y, x - rank + comm.Get_size() - 1), count
    comm.Free()


def check_environment_variable_skips_calibration(world):
    os.environ["MPIDP_COST"] = "2e-6,3e-10,4e-10"
    try:
        counter = CountingComm(world.Dup())
        assert cost.model(counter) == Model(2e-6, 3e-10, 4e-10)
        assert counter.messages_sent == 0
        counter.comm.Free()
        os.environ["MPIDP_COST"] = "default"
        comm = world.Dup()
        assert cost.model(comm) == DEFAULT
        comm.Free()
    finally:
        del os.environ["MPIDP_COST"]


def check_auto_answers_are_remembered_per_comm_and_follow_set_model(world):
    import gc

    from mpidp.collectives import state

    comm = world.Dup()
    cost.set_model(comm, *ROUNDS)
    assert api.choose(comm, "allreduce", 1 << 26, "auto") == "recursive_doubling"
    st = state.state(comm)
    assert st.choices == {("allreduce", 1 << 26): "recursive_doubling"}  # remembered
    again = MPI.Intracomm(comm)  # another Python object for the same communicator
    assert state.state(again) is st and state.state(CountingComm(again)) is st
    cost.set_model(comm, *BYTES)  # a new model: the old answers must go
    assert api.choose(comm, "allreduce", 1 << 26, "auto") in ("ring", "rabenseifner")
    dup = comm.Dup()  # a new communicator: a state of its own, no model until inherited
    assert state.state(dup) is not st and state.state(dup).model is None
    state.state(dup).inherit(st)
    assert state.state(dup).model == st.model
    key = id(comm)
    dup.Free()
    comm.Free()
    del comm, again
    gc.collect()
    assert key not in state._by_object  # the entry died with its comm object


# All in one launch (each launch of ranks costs seconds of start-up on 2 cores).

@pytest.mark.mpi(ranks=[4], timeout=180)
def test_calibration_auto_and_the_remembered_answers_on_real_ranks(mpi_ranks):
    """Calibration is cheap, cached and the same on every rank (N = 1, 3, 4); "auto" follows
    a pinned model and is correct (N = 3, 4); MPIDP_COST skips calibration (N = 2); "auto"'s
    answers are remembered per communicator and follow `set_model` (N = 2)."""
    on_each_size((1, 3, 4), check_calibration_is_cheap_cached_and_the_same_on_every_rank)
    on_each_size((3, 4), check_auto_follows_a_pinned_model_and_is_correct)
    on_each_size((2,), check_environment_variable_skips_calibration)
    on_each_size((2,), check_auto_answers_are_remembered_per_comm_and_follow_set_model)


@pytest.mark.parametrize("bad", [math.inf, math.nan, -1.0, -math.inf])
def test_set_model_refuses_what_mpidp_cost_refuses(bad):
    """A model of infinite, NaN or negative seconds would make every choice the same (or
    none): refused as MPIDP_COST refuses it, naming the field."""
    for field in range(5):
        numbers = [1e-6, 1e-9, 1e-9, 0.0, 0.0]
        numbers[field] = bad
        with pytest.raises(ValueError, match=f"{cost.Model._fields[field]}="):
            cost.set_model(MPI.COMM_SELF, *numbers)
