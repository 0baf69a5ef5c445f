"""The lean per-call path: what is remembered per signature, what is checked at every call.

A call's signature (collective, counts, dtype, op, algorithm, root) determines the
algorithm `auto` picks, the blocks, the scratch size and the signature folded into
the tags; mpidp works them out once per communicator (`plan.Call.setup`). These
tests pin down that nothing the remembered answer depends on is left out of its
key, and that what depends on the arrays themselves is still checked every time.
"""

import os
import sys

import numpy as np
import pytest

# a comm that records the tag of every message it posts (and refuses its own collectives)
from helpers.comms import Loopback
from helpers.comms import NoCollectives as TagRecorder
from helpers.subcomms import on_each_size
from helpers.sweeps import debug_check_off
from mpi4py import MPI

import mpidp
from mpidp.collectives import cost, state


def sig_of(tag: int) -> int:
    return (tag - state.TAG_BASE) // state.SLOTS


def check_every_call_is_signed_with_its_own_arguments_though_setups_are_remembered(base):
    """A call that differs from an earlier one in any field of the signature gets that
    field's signature, not the earlier call's remembered one (calls repeat, interleaved)."""
    world = base.Dup()
    comm = TagRecorder(world)
    n = world.Get_size()
    st = state.state(world)
    calls = [  # (mpidp function, arguments, the fields its signature is made of)
        (mpidp.allreduce, lambda: (np.ones(6, "f4"), np.empty(6, "f4")), {"algorithm": "ring"},
         ("allreduce", 6, np.dtype("f4"), "sum", "ring", None)),
        (mpidp.allreduce, lambda: (np.ones(6, "f4"), np.empty(6, "f4")),
         {"algorithm": "recursive_doubling"},
         ("allreduce", 6, np.dtype("f4"), "sum", "recursive_doubling", None)),
        (mpidp.allreduce, lambda: (np.ones(6, "f8"), np.empty(6, "f8")), {"algorithm": "ring"},
         ("allreduce", 6, np.dtype("f8"), "sum", "ring", None)),
        (mpidp.allreduce, lambda: (np.ones(7, "f4"), np.empty(7, "f4")), {"algorithm": "ring"},
         ("allreduce", 7, np.dtype("f4"), "sum", "ring", None)),
        (mpidp.allreduce, lambda: (np.ones(6, "f4"), np.empty(6, "f4")),
         {"algorithm": "ring", "op": MPI.MAX},
         ("allreduce", 6, np.dtype("f4"), "max", "ring", None)),
        (mpidp.reduce_scatter, lambda: (np.ones(2 * n, "f4"), np.empty(2, "f4")),
         {"algorithm": "ring"}, ("reduce_scatter", (2,) * n, np.dtype("f4"), "sum", "ring", None)),
        (mpidp.reduce_scatter, lambda: (np.ones(3 * n, "f4"), np.empty(3, "f4")),
         {"algorithm": "ring"}, ("reduce_scatter", (3,) * n, np.dtype("f4"), "sum", "ring", None)),
        (mpidp.allgather, lambda: (np.ones(2, "i4"), np.empty(2 * n, "i4")),
         {"algorithm": "ring"}, ("allgather", (2,) * n, np.dtype("i4"), None, "ring", None)),
        (mpidp.allgather, lambda: (np.ones(2, "i4"), np.empty(2 * n + 1, "i4")),
         {"algorithm": "ring", "recvcounts": [2] * n, "displs": [2 * q + 1 for q in range(n)]},
         ("allgather", (2,) * n, np.dtype("i4"), None, "ring", None)),
        (mpidp.bcast, lambda: (np.ones(5, "f4"),), {"algorithm": "binomial", "root": 0},
         ("bcast", 5, np.dtype("f4"), None, "binomial", 0)),
        (mpidp.bcast, lambda: (np.ones(5, "f4"),), {"algorithm": "binomial", "root": n - 1},
         ("bcast", 5, np.dtype("f4"), None, "binomial", n - 1)),
    ]
    for _ in range(2):  # the second time round every setup is a remembered one
        for fn, args, kwargs, fields in calls + calls[::-1]:
            comm.tags.clear()
            slot = st.started % state.SLOTS
            fn(comm, *args(), **kwargs)
            assert comm.tags, fields  # n > 1: every rank sends or receives
            want = st.tag(slot, state.signature(*fields))
            assert set(comm.tags) <= {want}, (fields, {sig_of(t) for t in comm.tags})
    # the same call on every rank has the same tags: gathered and compared
    assert len(set(world.allgather(st.started))) == 1
    world.Free()


def check_a_new_model_forgets_the_remembered_choices(world):
    comm = world.Dup()
    x, y = np.ones(1 << 16, "f4"), np.empty(1 << 16, "f4")

    def chosen():
        (entry,) = [s for key, s in state.state(comm).setups.items() if key[0] == "allreduce"]
        return entry.signed.description["algorithm"]

    cost.set_model(comm, 1.0, 0.0, 0.0)  # only rounds cost: recursive doubling
    mpidp.allreduce(comm, x, y)
    assert chosen() == "recursive_doubling"
    cost.set_model(comm, 0.0, 1.0, 0.0)  # only bytes cost
    mpidp.allreduce(comm, x, y)
    assert chosen() in ("ring", "rabenseifner")
    assert np.array_equal(y, np.full_like(y, comm.Get_size()))
    comm.Free()


def check_a_setup_whose_build_calibrates_the_model_is_remembered(world):
    """The first `auto` call on a comm calibrates inside its setup's build, and a new model
    forgets the setups made before it: the build's own answer is kept all the same."""
    comm, before = world.Dup(), os.environ.pop("MPIDP_COST", None)
    try:
        x = np.ones(100, "f4")
        mpidp.iallreduce(comm, x, np.empty_like(x)).wait()
        st = state.state(comm)
        assert st.measured, "the call did not calibrate the comm"
        assert [key for key in st.setups if key[0] == "allreduce"], list(st.setups)
    finally:
        if before is not None:
            os.environ["MPIDP_COST"] = before
        comm.Free()


def test_what_depends_on_the_arrays_is_checked_at_every_call():
    """The same kinds and sizes as a call that passed: a different array is checked anew."""
    comm = MPI.COMM_SELF
    x, y = np.ones(8, "f4"), np.zeros(8, "f4")
    for _ in range(2):
        mpidp.allreduce(comm, x, y)
        mpidp.reduce_scatter(comm, x, y)
        mpidp.allgather(comm, x, y)
    strided = np.zeros(16, "f4")[::2]
    frozen = np.zeros(8, "f4")
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="C-contiguous"):
        mpidp.allreduce(comm, x, strided)
    with pytest.raises(ValueError, match="C-contiguous"):
        mpidp.allreduce(comm, strided, y)
    with pytest.raises(ValueError, match="read-only"):
        mpidp.allreduce(comm, x, frozen)
    with pytest.raises(ValueError, match="read-only"):
        mpidp.allgather(comm, x, frozen)
    with pytest.raises(ValueError, match="overlap"):
        mpidp.allreduce(comm, y, y)
    with pytest.raises(ValueError, match="overlap"):
        mpidp.reduce_scatter(comm, y, y)
    with pytest.raises(ValueError, match="items"):
        mpidp.allreduce(comm, np.ones(9, "f4")[:8].reshape(2, 4), np.zeros(9, "f4"))
    with pytest.raises(TypeError, match="same dtype"):
        mpidp.allreduce(comm, x.astype("f8"), y)
    with pytest.raises(TypeError, match="not defined"):
        mpidp.allreduce(comm, x, y, op=MPI.BAND)
    with pytest.raises(ValueError, match="unknown allreduce algorithm"):  # not hashable either
        mpidp.allreduce(comm, x, y, algorithm=["ring"])
    mpidp.allreduce(comm, x, y)  # and the good call still passes
    assert np.array_equal(y, x)


def check_remembered_blocks_follow_the_counts_and_displacements(comm):
    """Calls alike but for their layout, interleaved: each result lands where its own
    counts and displacements say."""
    n, rank = comm.Get_size(), comm.Get_rank()
    mine = np.full(2, rank + 1, "i4")
    packed = np.repeat(np.arange(1, n + 1, dtype="i4"), 2)
    for _ in range(2):
        reverse, shifted = [2 * (n - 1 - q) + 1 for q in range(n)], [2 * q + 1 for q in range(n)]
        for displs in (None, reverse, shifted):
            y = np.zeros(2 * n + 1, "i4")
            mpidp.allgather(comm, mine, y, [2] * n, displs, algorithm="ring")
            for q in range(n):
                at = 2 * q if displs is None else displs[q]
                assert np.array_equal(y[at : at + 2], packed[2 * q : 2 * q + 2]), (displs, y)
        for counts in ([1] * (n - 1) + [n + 1], [n + 1] + [1] * (n - 1)):
            x = np.arange(2 * n, dtype="f8") + rank
            y = np.zeros(max(counts), "f8")
            mpidp.reduce_scatter(comm, x, y, counts, algorithm="ring")
            start = sum(counts[:rank])
            want = n * np.arange(start, start + counts[rank]) + n * (n - 1) / 2
            assert np.array_equal(y[: counts[rank]], want), (counts, y)


# Every multi-rank check in one launch (a launch of ranks costs seconds of start-up).

@pytest.mark.mpi(ranks=[3], timeout=120)
def test_signatures_remembered_choices_and_blocks_on_real_ranks(mpi_ranks):
    """Every call is signed with its own arguments though set-ups are remembered (N = 2, 3);
    a new model forgets the remembered choices (N = 2); remembered blocks follow the counts
    and displacements (N = 2, 3)."""
    with debug_check_off():  # the agreement check's own messages would be among the tags
        on_each_size((2, 3),
                     check_every_call_is_signed_with_its_own_arguments_though_setups_are_remembered)
    on_each_size((2,), check_a_new_model_forgets_the_remembered_choices)
    on_each_size((2,), check_a_setup_whose_build_calibrates_the_model_is_remembered)
    on_each_size((2, 3), check_remembered_blocks_follow_the_counts_and_displacements)


def test_what_a_setup_holds_is_what_it_declares():
    """Every remembered setup's fields have the types its class declares (`plan.Setup`,
    `exact.Passes`): the algorithms are registered `Algorithm`s, the scratch items ints."""
    import typing

    from mpidp.collectives.algorithms import Algorithm
    from mpidp.collectives.exact import Passes
    from mpidp.collectives.plan import Setup, Signed

    comm = MPI.COMM_SELF.Dup()
    x = np.arange(6.0)
    mpidp.allreduce(comm, mpidp.IN_PLACE, x, algorithm="ring")
    mpidp.allreduce(comm, mpidp.IN_PLACE, x, op=mpidp.EXACT_SUM)
    mpidp.bcast(comm, x, 0)
    found = list(state.state(comm).setups.values())
    assert {type(s) for s in found} == {Setup, Passes}
    for s in found:
        hints = typing.get_type_hints(type(s))
        for name, value in s._asdict().items():
            want = {Signed: Signed, Algorithm: Algorithm, int: int,
                    tuple[int, int]: tuple}.get(hints[name])
            if want is not None:
                assert isinstance(value, want), (type(s).__name__, name, value)
        if isinstance(s, Passes):
            assert all(isinstance(i, int) for i in s.scratch), s.scratch
    comm.Free()


# Python frames entered by one blocking 8 B all-reduce, auto, once its setup is remembered:
# the call path, the generator's resumes, the sum (issue 38: the per-call floor). The
# loopback comm's own methods are not counted. 55 before the cut, 41 after it (in place 51 and 39);
# 45 at 46f9f2f, then 46: a blocking call first asks `blocking` to replay it, one frame
# (`blocking.allreduce`, which plans a comm-like such as this one at once); a replayed call,
# on an MPI communicator, enters 13 (`python -m mpidp.bench.flight --opcodes`: 478 bytecodes).
CALL_BUDGET = 46


def test_a_small_allreduce_enters_few_python_frames(no_debug_check):
    """The floor of a small call is its Python: a budget of frames, counted (any machine's
    load leaves the count alone), so that a change that adds steps to every call shows.
    (MPIDP_DEBUG's agreement check, off here, is a collective of its own.)"""
    comm, x, y = Loopback(), np.ones(1), np.empty(1)
    for args in ((x, y), (mpidp.IN_PLACE, y)):
        for _ in range(2):  # the setup, remembered (the first call of a comm also sets
            mpidp.allreduce(comm, *args)  # its cost model, which forgets the setups)
        entered = []

        def count(frame, event, arg, entered=entered):
            if event == "call" and frame.f_code.co_filename != __file__:
                entered.append(frame.f_code.co_name)

        y[...] = 1.0  # (in place, the input)
        sys.setprofile(count)
        try:
            mpidp.allreduce(comm, *args)
        finally:
            sys.setprofile(None)
        assert y[0] == 2.0
        assert len(entered) <= CALL_BUDGET, " ".join(entered)  # whole (a list is cut short)
