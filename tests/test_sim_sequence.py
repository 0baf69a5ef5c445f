"""mpidp.sim.sequence: programs of collectives per rank, matched by communicator, peer and tag.

The oracle is mpidp.sim's engine (`Sim`): one collective run by the sequence runner
with unbuffered sends (``eager=-1``) must post the same rounds on every rank and
stall the same ranks as `Sim` does; a program of several is the sum of its parts.
No MPI here: N ranks run in this one process.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from mpidp.collectives.algorithms.rounds import Recv, Send
from mpidp.collectives.placement import layout
from mpidp.collectives.state import CommState, signature
from mpidp.sim import COLLECTIVES, ScheduleError, Sim, SimComm, names
from mpidp.sim.collective import rounds_of
from mpidp.sim.sequence import EAGER, Collective, run_sequences

CASES = [(c, a) for c in COLLECTIVES for a in names(c)]


def counts_for(collective: str, N: int, count: int):
    """The count as a flight record gives it: items, or each rank's block."""
    if collective in ("reduce_scatter", "allgather"):
        return [count // N + (r < count % N) for r in range(N)]
    return count


def gen(collective, algorithm, rank, N, count, root=0, placement=None):
    comm = SimComm(rank, N)
    return rounds_of(collective, algorithm, comm, counts_for(collective, N, count),
                     "float64", "sum", root % N, placement)


def placement_for(algorithm, N):
    return layout(N, ppn=2) if algorithm == "hierarchical" and N > 1 else None


def sim_rounds(collective, algorithm, N, count, absent=(), root=0):
    """(rounds per rank, blocked ranks) from the engine, with the ranks `absent` calling nothing."""
    placement = placement_for(algorithm, N)
    sim = Sim(N, placement=placement)
    gens = [iter(()) if r in absent else gen(collective, algorithm, r, N, count, root, placement)
            for r in range(N)]
    try:
        sim.run(gens)
    except ScheduleError as e:
        m = re.match(r"deadlock after step \d+: ranks ([\d, -]+) of", str(e))
        assert m, e
        blocked = []
        for part in m.group(1).split(", "):
            lo, _, hi = part.partition("-")
            blocked += range(int(lo), int(hi or lo) + 1)
        return sim.rounds, blocked
    return sim.rounds, []


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_a_program_of_agreeing_calls_finishes_in_the_rounds_of_its_parts(collective, algorithm):
    for N in range(1, 9):
        calls = [(collective, algorithm, 0, 0), ("allreduce", "ring", 1, 0),
                 (collective, algorithm, N - 1 or 1, N - 1), (collective, algorithm, 2 * N + 1, 1)]
        placement = placement_for(algorithm, N)
        programs = [[Collective(gen(c, a, r, N, n, root, placement), tag=100 + i)
                     for i, (c, a, n, root) in enumerate(calls)] for r in range(N)]
        run = run_sequences(programs)
        assert run.stalled == [] and run.finished == list(range(N)), (N, run.stalls)
        want = np.sum([sim_rounds(c, a, N, n, root=root)[0] for c, a, n, root in calls], axis=0)
        assert run.rounds == list(want), (N, run.rounds, want)


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_a_rank_that_never_calls_stalls_the_others_as_the_engine_does(collective, algorithm):
    for N in (2, 3, 5, 7, 8):
        if algorithm == "hierarchical" and N % 2:
            continue  # (its placement: two ranks per host)
        for absent in {0, N // 2, N - 1}:
            placement = placement_for(algorithm, N)
            programs = [[] if r == absent else
                        [Collective(gen(collective, algorithm, r, N, 3 * N, 1, placement), 5)]
                        for r in range(N)]
            run = run_sequences(programs, eager=-1)  # unbuffered sends, as the engine's
            rounds, blocked = sim_rounds(collective, algorithm, N, 3 * N, {absent}, root=1)
            assert (run.rounds, run.stalled) == (rounds, blocked), (N, absent)
            for r in blocked:  # the round a stall names is the one the engine stopped in
                assert [s.round for s in run.stalls[r]] == [rounds[r]], (N, absent, r)
                assert run.blocked[r] is run.stalls[r][0]


STATE = CommState(tag_ub=2**31 - 1)  # the tag bound of MPICH and Open MPI


def allreduce(rank, N, slot, count=8, algorithm="recursive_doubling", blocking=True, **kw):
    """The `slot`-th call of a program, an all-reduce, with the tag the runtime gives it."""
    tag = STATE.tag(slot, signature("allreduce", count, algorithm))
    return Collective(gen("allreduce", algorithm, rank, N, count), tag, blocking=blocking, **kw)


def bcast(rank, N, slot, count=8, root=0):
    tag = STATE.tag(slot, signature("bcast", count, root))
    return Collective(gen("bcast", "binomial", rank, N, count, root), tag)


def test_a_message_matches_only_the_same_tag():
    N = 4
    other = run_sequences([[allreduce(r, N, 7 if r == 3 else 6)] for r in range(N)])
    assert other.stalled == [0, 1, 2, 3]  # rank 3's tag: nobody receives its messages
    assert [s.round for r in range(N) for s in other.stalls[r]] == [2, 2, 1, 1]
    assert other.stalls[3][0].pending == (("recv", 2, 2, 64),)
    # one tag, two collectives of the same sizes: MPI matches them too (hence the
    # signature in the runtime's tags, so that such calls get different ones): rank 3's
    # broadcast takes rank 1's message to it, and the all-reduce's data
    leaf = Collective(gen("bcast", "binomial", 3, N, 8, 1), other.stalls[0][0].tag)
    same = run_sequences([[leaf] if r == 3 else [allreduce(r, N, 6)] for r in range(N)])
    assert same.finished == [3]


def test_calls_in_another_order_stall_where_the_runtime_does():
    N = 3
    ok = run_sequences([[allreduce(r, N, 1), bcast(r, N, 2)] for r in range(N)])
    assert ok.finished == [0, 1, 2]
    # rank 1 calls the broadcast first: the k-th call takes the k-th slot, so its tag
    swapped = run_sequences([[bcast(r, N, 1), allreduce(r, N, 2)] if r == 1 else
                             [allreduce(r, N, 1), bcast(r, N, 2)] for r in range(N)])
    assert swapped.stalled == [0, 1, 2]
    assert [swapped.blocked[r].index for r in range(N)] == [0, 0, 0]
    assert swapped.started == [1, 1, 1]  # nobody got to its second call


def test_a_nonblocking_call_runs_beside_the_ranks_later_calls():
    N = 2

    def programs(blocking):  # rank 0: A then B; rank 1: B then A
        return [[allreduce(0, N, 1, blocking=blocking), allreduce(0, N, 2)],
                [allreduce(1, N, 2), allreduce(1, N, 1)]]

    assert run_sequences(programs(False)).finished == [0, 1]  # iallreduce A, allreduce B
    stuck = run_sequences(programs(True))  # both blocking: each waits for the other
    assert stuck.stalled == [0, 1] and stuck.started == [1, 1]
    # a nonblocking call that cannot complete is a stall too, with nothing after it blocked
    alone = run_sequences([[allreduce(0, N, 1, blocking=False)], []])
    assert alone.stalled == [0] and alone.blocked == [None, None]


def test_small_sends_are_buffered_large_ones_wait_for_their_receive():
    """Ring all-reduce on 4 ranks, rank 3 never calls. Unbuffered, rank 2's first send
    (to 3) blocks it in round 1; buffered, it goes on while rank 1 feeds it: round 3."""
    N = 4

    def rounds(count, eager=EAGER):
        run = run_sequences([[] if r == 3 else [allreduce(r, N, 1, count, "ring")]
                             for r in range(N)], eager=eager)
        return [run.stalls[r][0].round for r in range(3)]

    assert rounds(8, eager=-1) == sim_rounds("allreduce", "ring", N, 8, {3})[0][:3] == [1, 2, 1]
    assert rounds(8) == [1, 2, 3]
    big = 4 * (EAGER // 8 + 1)  # blocks past the eager limit: as unbuffered
    assert rounds(big) == [1, 2, 1]


def test_sub_communicators_map_their_ranks_to_world_ranks():
    N = 4
    pairs = {0: (0, 2), 2: (0, 2), 1: (3, 1), 3: (3, 1)}  # rank 3 is rank 0 of its pair

    def call(r, tag=1):
        members = pairs[r]
        return Collective(gen("allreduce", "ring", members.index(r), 2, 4), tag,
                          comm=f"pair{min(members)}", members=members)

    assert run_sequences([[call(r)] for r in range(N)]).finished == [0, 1, 2, 3]
    lonely = run_sequences([[call(r)] if r != 3 else [] for r in range(N)])
    assert lonely.stalled == [1]
    assert lonely.stalls[1][0].pending[-1][1:3] == (0, 3)  # its peer 0 is world rank 3
    # one tag on two communicators: no match across them
    crossed = run_sequences([[Collective(gen("allreduce", "ring", r, 2, 4), 1, comm=f"c{r}",
                                         members=(0, 1))] for r in range(2)])
    assert crossed.stalled == [0, 1]


def test_what_would_be_an_error_under_mpi_raises():
    with pytest.raises(ScheduleError, match="sends 7 x float64 to rank 0, which receives into 8"):
        run_sequences([[Collective(gen("allreduce", "ring", r, 2, 16 if r == 0 else 14), 1)]
                       for r in range(2)])
    with pytest.raises(ScheduleError, match="not a member"):
        run_sequences([[Collective(iter(()), 1, "c", members=(1,))], []])

    def bad():
        yield [Send(np.zeros(1), 5)]

    with pytest.raises(ScheduleError, match="peer 5 is not a rank"):
        run_sequences([[Collective(bad(), 1)]])

    def not_a_round():
        yield (Recv(np.zeros(1), 0),)

    with pytest.raises(ScheduleError, match="a round is a list"):
        run_sequences([[Collective(not_a_round(), 1)]])
