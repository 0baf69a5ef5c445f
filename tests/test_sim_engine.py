"""mpidp.sim's engine: it runs the unchanged algorithms, catches what MPI would not forgive, and
its step tables are the ones in the algorithm modules' docstrings.

No MPI here: N ranks run in this one process.
"""

import inspect
import re
import time

import numpy as np
import pytest

from mpidp.collectives import placement
from mpidp.collectives.algorithms import (
    direct,
    doubling,
    halving,
    hierarchical,
    nearest,
    ring,
    tree,
)
from mpidp.collectives.algorithms.rounds import Recv, Send
from mpidp.sim import COLLECTIVES, ScheduleError, Sim, SimComm, names, simulate
from mpidp.sim.table import command, format_table, table

ALGORITHM_MODULES = (ring, halving, doubling, nearest, tree, direct, hierarchical, placement)
REFERENCE = re.compile(r"the table of `(python -m mpidp\.sim table [^`]+)`(?: steps (\d+)-(\d+))?")
# tables across hosts in the docstrings: (algorithm, collective, ranks per host), N = 4
PLACED_TABLES = (("hierarchical", "allreduce", 2), ("rabenseifner", "allreduce", 2),
                 ("rabenseifner_article", "allreduce", 2))
# tables of other sizes in the docstrings: (algorithm, collective, N)
SIZED_TABLES = (("binomial", "bcast", 3),)  # N = 3: the root's two sends in two steps


def run(N, algorithm):
    """Run `algorithm(rank, N)` (a generator of rounds) on N simulated ranks."""
    sim = Sim(N)
    return sim.run(algorithm(r, N) for r in range(N))


# ------------------------------------------------------------------ the docstring tables


def docstring_tables():
    """{command line: table text} of every `$ python -m mpidp.sim table` block in the modules."""
    found = {}
    for module in ALGORITHM_MODULES:
        lines = inspect.getsource(module).splitlines()
        for i, line in enumerate(lines):
            if "$ python -m mpidp.sim table" not in line:
                continue
            indent = len(line) - len(line.lstrip())
            rows = []
            for row in lines[i + 1 :]:
                if not row.strip():
                    break
                rows.append(row[indent:])
            assert line.strip() not in found, f"{line.strip()} twice"
            found[line.strip()] = (module.__name__, "\n".join(rows))
    return {cmd: (module, quoted(found, cmd, text)) for cmd, (module, text) in found.items()}


def quoted(found, cmd, text):
    """A table quoted once and referred to elsewhere, "(the table of `python -m mpidp.sim
    table ...` steps 0-2)": the rows it refers to, renumbered, as the simulator prints them."""
    parts = REFERENCE.findall(text) if text.startswith("(the table of `") else []
    if not parts:
        return text
    grid = []
    for other, lo, hi in parts:
        rows = found[f"$ {other}"][1].splitlines()[2:]
        rows = rows[int(lo) : int(hi) + 1] if lo else rows
        grid += [[cell.strip() for cell in row.split("|")[1:]] for row in rows]
    return format_table(grid, int(re.search(r"--ranks (\d+)", cmd)[1]))


def drifted(tables) -> list[str]:
    """Registered algorithms whose N = 4 docstring table is missing or differs from the code."""
    problems, expected = [], set()
    for collective in COLLECTIVES:
        for name in names(collective):
            cmd = command(name, collective, 4)
            expected.add(cmd)
            if cmd not in tables:
                problems.append(f"no N = 4 table for {collective} {name!r} (want: {cmd})")
            elif tables[cmd][1] != table(name, collective, 4):
                problems.append(f"{tables[cmd][0]}: the table under `{cmd}` differs from what "
                                f"the code does; it prints:\n{table(name, collective, 4)}")
    for name, collective, ppn in PLACED_TABLES:  # 2 hosts x 2 ranks: what placement costs
        cmd = command(name, collective, 4) + f" --ppn {ppn}"
        expected.add(cmd)
        printed = table(name, collective, 4, placement=placement.layout(4, ppn=ppn))
        if cmd not in tables:
            problems.append(f"no table across hosts for {name!r} (want: {cmd})")
        elif tables[cmd][1] != printed:
            problems.append(f"{tables[cmd][0]}: the table under `{cmd}` differs from what "
                            f"the code does; it prints:\n{printed}")
    for name, collective, N in SIZED_TABLES:
        cmd = command(name, collective, N)
        expected.add(cmd)
        if cmd not in tables:
            problems.append(f"no N = {N} table for {collective} {name!r} (want: {cmd})")
        elif tables[cmd][1] != table(name, collective, N):
            problems.append(f"{tables[cmd][0]}: the table under `{cmd}` differs from what "
                            f"the code does; it prints:\n{table(name, collective, N)}")
    problems += [f"a table of no registered algorithm: {cmd}" for cmd in set(tables) - expected]
    return problems


def test_every_docstring_table_is_what_the_simulator_prints():
    assert drifted(docstring_tables()) == []


def test_a_table_that_drifts_from_its_loop_is_caught():
    tables = docstring_tables()
    cmd = command("ring", "reduce_scatter", 4)
    module, text = tables[cmd]
    tables[cmd] = (module, text.replace("→1:3 ←3:2", "→1:2 ←3:3", 1))  # step 0 misdescribed
    assert len(drifted(tables)) == 1 and "differs from what the code does" in drifted(tables)[0]
    del tables[command("direct", "allreduce", 4)]
    assert any("no N = 4 table for allreduce 'direct'" in p for p in drifted(tables))


def test_table_format():
    grid = [["→1:0", "←0:0"], ["", "→0:1"]]
    assert format_table(grid, 2).splitlines() == [
        "step | rank 0 | rank 1",
        "-----+--------+-------",
        "   0 | →1:0   | ←0:0",
        "   1 |        | →0:1",
    ]
    # not whole blocks: item ranges; the fold of recursive halving at N = 6 idles ranks 0 and 2
    six = table("rabenseifner", "allreduce", 6).splitlines()
    assert "[0:6]" in six[5] and six[4].split("|")[1].strip() == ""


# ------------------------------------------------------------------ what the engine catches


def test_deadlock_names_the_ranks_and_what_they_wait_for():
    def both_receive_first(rank, N):
        a, b = np.zeros(3), np.zeros(3)
        yield [Recv(a, 1 - rank)]  # each waits for the other: under MPI, a hang
        yield [Send(b, 1 - rank)]

    with pytest.raises(ScheduleError) as err:
        run(2, both_receive_first)
    text = str(err.value)
    assert "deadlock after step 0: ranks 0-1 of 2 cannot go on" in text
    assert "rank 0, round 0: its Recv into 3 × float64 from rank 1 gets no message" in text
    assert "rank 1, round 0: its Recv into 3 × float64 from rank 0 gets no message" in text


def test_a_send_nobody_receives_is_a_deadlock_too():
    def rank0_sends_twice(rank, N):
        x = np.zeros(2)
        yield [Send(x, 1)] if rank == 0 else [Recv(x, 0)]
        if rank == 0:
            yield [Send(x, 1)]  # rank 1 has finished

    with pytest.raises(ScheduleError, match=r"(?s)ranks 0 of 2.*finished: 1.*rank 0, round 1: "
                       r"its Send of 2 × float64 to rank 1 is never received"):
        run(2, rank0_sends_twice)


def test_mismatched_pairs_are_reported():
    def sizes(rank, N):
        yield [Send(np.zeros(3), 1)] if rank == 0 else [Recv(np.zeros(4), 0)]

    with pytest.raises(ScheduleError, match=r"step 0: rank 0 sends 3 × float64 to rank 1, which "
                       r"receives into 4 × float64: sizes and dtypes must match"):
        run(2, sizes)

    def dtypes(rank, N):
        yield [Send(np.zeros(2, np.int64), 1)] if rank == 0 else [Recv(np.zeros(2), 0)]

    with pytest.raises(ScheduleError, match="int64 to rank 1, which receives into 2 × float64"):
        run(2, dtypes)


@pytest.mark.parametrize("messages", [2, 5])  # two: NumPy's check; more: the interval sweep
def test_a_round_that_writes_memory_it_sends_is_reported(messages):
    def overlapping(rank, N):
        buf = np.zeros(8)
        peer = 1 - rank
        extra = [Send(np.zeros(1), peer)] * (messages - 2)
        yield [Send(buf[0:4], peer), *extra, Recv(buf[2:6], peer)]

    sim = Sim(2)
    with pytest.raises(ScheduleError, match=r"rank 0, round 0: Send 4 × float64 \(peer 1\) and "
                       r"Recv 4 × float64 \(peer 1\) use the same memory"):
        sim.run(overlapping(r, 2) for r in range(2))


def test_receiving_twice_into_the_same_memory_is_reported_and_disjoint_halves_are_not():
    def halves(rank, N, overlap):
        buf = np.zeros(8)
        peer = 1 - rank
        yield [Send(np.ones(4), peer), Send(np.ones(4), peer),
               Recv(buf[:4], peer), Recv(buf[4 - overlap : 8 - overlap], peer)]

    assert run(2, lambda r, N: halves(r, N, 0)).bytes_received == [64, 64]
    with pytest.raises(ScheduleError, match="use the same memory"):
        run(2, lambda r, N: halves(r, N, 1))


def test_bad_peers_buffers_and_comm_calls_are_reported():
    with pytest.raises(ScheduleError, match="peer 2 is not a rank of 2"):
        run(2, lambda r, N: iter([[Send(np.zeros(1), 2)]]))
    with pytest.raises(ScheduleError, match="contiguous NumPy arrays"):
        run(2, lambda r, N: iter([[Send(np.zeros(4)[::2], 1 - r), Recv(np.zeros(2), 1 - r)]]))
    with pytest.raises(AttributeError, match="yields rounds of Send/Recv"):
        SimComm(0, 2).Isend(np.zeros(1), 1)


@pytest.mark.parametrize("bad, says", [
    (lambda: Send(np.zeros(2), 0), r"a round is a list of Send and Recv, got Send\("),
    (lambda: None, "a round is a list of Send and Recv, got None"),
    (lambda: (Recv(np.zeros(2), 0),), r"a round is a list of Send and Recv, got \(Recv\("),
    (lambda: [np.zeros(2)], "a round holds Send and Recv only, not array"),
    (lambda: [Send([0.0, 1.0], 0)], "the Send's buffer is a list, not a NumPy array"),
    (lambda: [Recv(None, 0)], "the Recv's buffer is a NoneType, not a NumPy array"),
    (lambda: [Send(np.zeros(4)[::2], 0)], "the Send's buffer is not contiguous"),
    (lambda: [Send(np.zeros(1), 1.0)], r"peer 1\.0 is not a rank of 3"),
])
def test_a_round_that_is_not_a_list_of_messages_on_arrays_names_rank_and_round(bad, says):
    """Rank 2 yields a good round, then the bad one, to a rank that finished long ago: the
    error is what is wrong with the round, not a deadlock, and not a traceback from inside."""
    def second_round_bad(rank, N):
        if rank == 2:
            yield [Send(np.zeros(2), 0)]
            yield bad()
        elif rank == 0:
            yield [Recv(np.zeros(2), 2)]

    with pytest.raises(ScheduleError, match=f"step 1: rank 2, round 1: {says}"):
        run(3, second_round_bad)


def test_a_generator_that_never_yields_is_stopped_after_its_timeout():
    def spins(rank, N):
        yield []
        while rank == 1:  # no yield: under MPI, a hang
            pass
        yield []

    t0 = time.monotonic()
    with pytest.raises(ScheduleError, match=r"step 1: rank 1, after round 0: the algorithm ran "
                       r"for more than 0\.3 s without yielding"):
        Sim(3, timeout=0.3).run(spins(r, 3) for r in range(3))
    assert time.monotonic() - t0 < 10  # 0.3 s, and the watchdog's tick, on a loaded machine


def test_the_timeout_catches_a_loop_that_swallows_exceptions_and_leaves_no_trace():
    def stubborn(rank, N):
        while True:
            try:
                while True:
                    pass
            except Exception:  # not enough to stop the watchdog
                pass
        yield []

    with pytest.raises(ScheduleError, match="without yielding"):
        Sim(1, timeout=0.2).run([stubborn(0, 1)])
    time.sleep(0.5)  # nothing pending: a late stop must not land here
    assert run(2, lambda r, N: iter([[]])).steps == 1


# ------------------------------------------------------------------ counters and matching


def test_messages_match_in_order_per_link_and_are_counted():
    def two_messages(rank, N):
        a, b = np.arange(3.0) + 10 * rank, np.arange(5.0) + 10 * rank
        x, y = np.zeros(3), np.zeros(5)
        if rank == 0:
            yield [Send(a, 1)]  # posted first, matched first
            yield [Send(b, 1)]
            yield [Send(b, 1), Send(a, 1)]  # both wait for rank 1: they match in this order
        else:  # both receives in one round: the first send matches the first receive
            yield [Recv(x, 0), Recv(y, 0)]
            assert x.tolist() == [0, 1, 2] and y.tolist() == [0, 1, 2, 3, 4]
            yield []  # an empty round: rank 1 posts its receives a step late
            yield [Recv(y, 0), Recv(x, 0)]

    sim = run(2, two_messages)
    assert sim.bytes_sent == [128, 0] and sim.bytes_received == [0, 128]
    assert sim.messages_sent == [4, 0] and sim.rounds == [3, 3] and sim.steps == 4
    assert sim.links == {(0, 1): 128}


def test_the_unchanged_algorithms_run_and_agree_with_numpy():
    for collective in COLLECTIVES:
        for name in names(collective):
            for N in (1, 2, 3, 4, 5, 6, 7, 8):
                for count in (0, 1, N + 1, 4 * N):
                    for in_place in (False, True):
                        out = simulate(collective, name, N, count, in_place=in_place,
                                       dtype="int32", op="sum", root=N - 1)
                        assert not out.problems(), (collective, name, N, count, out.problems())


def test_ring_steps_rounds_and_reductions():
    out = simulate("allreduce", "ring", 5, 50)
    assert out.sim.steps == 8 and out.sim.rounds == [8] * 5
    assert out.sim.reduced == [40] * 5  # 4 blocks of 10 reduced per rank
    assert set(out.sim.links) == {(r, (r + 1) % 5) for r in range(5)}  # a ring, to the right


def test_a_run_that_moves_no_data_counts_what_the_real_run_counts():
    """`data=False` (volume, predict): the same messages, rounds, reductions and steps."""
    counters = ("bytes_sent", "bytes_received", "messages_sent", "messages_received", "rounds",
                "reduced", "steps", "links")
    for collective in COLLECTIVES:
        for name in names(collective):
            for N in (1, 3, 4, 6):
                real = simulate(collective, name, N, 4 * N + 1, dtype="int32", root=N - 1)
                tally = simulate(collective, name, N, 4 * N + 1, dtype="int32", root=N - 1,
                                 data=False)
                for counter in counters:
                    assert getattr(tally.sim, counter) == getattr(real.sim, counter), \
                        (collective, name, N, counter)
    with pytest.raises(ValueError, match="data=False"):
        tally.problems()
