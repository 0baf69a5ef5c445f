"""The call path's one cache (`collectives/bounded.py`): at most `limit` answers, and the
four places that remember answers (setups, auto's choices, signatures, checked kinds) use it."""

import numpy as np
from mpi4py import MPI

import mpidp
from mpidp.collectives import checks, cost, state
from mpidp.collectives.bounded import LIMIT, Bounded


def test_a_full_cache_starts_again_and_never_holds_more_than_its_limit():
    cache = Bounded(limit=3)
    for i in range(7):
        assert cache.remember(i, i * i) == i * i
        assert len(cache) <= 3 and cache[i] == i * i
    assert dict(cache) == {6: 36}  # 0-2, then 3-5, then 6: cleared twice
    assert Bounded({1: 2}, limit=5) == {1: 2}


def test_every_remembered_answer_on_the_call_path_is_bounded():
    comm = MPI.COMM_SELF.Dup()
    x = np.ones(4)
    mpidp.allreduce(comm, mpidp.IN_PLACE, x)
    st = state.state(comm)
    for cache in (st.choices, st.setups, state._signatures, checks._checked_kinds):
        assert isinstance(cache, Bounded) and cache.limit <= LIMIT
    cost.set_model(comm, 1e-6, 1e-9, 1e-10)  # the old model's answers go, still bounded
    assert isinstance(st.choices, Bounded) and isinstance(st.setups, Bounded)
    dup = comm.Dup()
    assert isinstance(state.state(dup).choices, Bounded)
    dup.Free()
    comm.Free()


def test_ever_new_signatures_do_not_grow_the_cache_without_end():
    for i in range(LIMIT + 50):
        state.signature("a test", i)
    assert len(state._signatures) <= LIMIT
    assert state.signature("a test", 7) == state.signature("a test", 7) != 0
