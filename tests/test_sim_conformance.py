"""The conformance kit, `mpidp.sim.check`: every shipped algorithm passes it for N = 1 to 64,
and broken ones are caught with a report that names the smallest failing case.

No MPI here: the simulator runs N ranks in this process (the real-MPI tests are
tests/test_ring.py, test_halving.py, test_comm.py, ...).
"""

import os
import re
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from mpidp.collectives.algorithms.fold import fold, real_ranks, virtual
from mpidp.collectives.algorithms.halving import halving_scratch
from mpidp.collectives.algorithms.rounds import Recv, Send, remap
from mpidp.sim import COLLECTIVES, check, names, simulate
from mpidp.sim.conformance import counts_for, pairs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = [(c, a) for c in COLLECTIVES for a in names(c)]


@pytest.mark.parametrize("collective,algorithm", SHIPPED)
def test_every_shipped_algorithm_passes_for_1_to_64_ranks(collective, algorithm):
    report = check(algorithm, collective, range(1, 65), quick=True, volume=False)
    assert report.ok, report.text
    assert report.cases == 64 * 2 * (2 if collective in ("allreduce", "reduce_scatter") else 1)


def test_the_quick_cases_cover_every_count_shape_op_and_dtype():
    from mpidp.sim.conformance import cases

    seen = list(cases("allreduce", range(1, 65), quick=True))
    shapes = {counts_for(c.N).index(c.count) for c in seen if c.count in counts_for(c.N)}
    assert shapes == set(range(6))
    assert {(c.op, c.dtype) for c in seen} == set(pairs("allreduce"))
    assert {c.in_place for c in seen} == {False, True}


# ------------------------------------------------------------------ broken algorithms


def ring_skipping_a_step(comm, buf, blocks, op, tmp, src=None):
    """The ring all-reduce with its reduce-scatter one step short."""
    rank, N = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % N, (rank - 1) % N
    src = buf if src is None else src
    for step in range(N - 2):  # the bug: N - 1 steps are needed
        send = blocks.view(src if step == 0 else buf, (rank - step - 1) % N)
        recv_block = (rank - step - 2) % N
        recv = tmp[: blocks.counts[recv_block]]
        yield [Send(send, right), Recv(recv, left)]
        op(blocks.view(buf, recv_block), recv, blocks.view(src, recv_block))
    for step in range(N - 1):
        yield [Send(blocks.view(buf, (rank - step) % N), right),
               Recv(blocks.view(buf, (rank - step - 1) % N), left)]


def halving_wrong_partner(comm, buf, blocks, op, tmp, src=None):
    """Recursive halving reduce-scatter with partner rank + mask instead of rank ^ mask."""
    from mpidp.collectives.algorithms.fold import VirtualBlocks

    rank, N = comm.Get_rank(), comm.Get_size()
    q, r = fold(N)
    if r:  # keep to powers of two: the fold is not what is tested here
        raise NotImplementedError("powers of two only")
    blocks = VirtualBlocks(blocks, 0)

    def loop(rank, q, src):
        lo, hi, mask = 0, q, q >> 1
        while mask:
            partner = (rank + mask) % q  # the bug: right for mask = q/2 only
            mid = lo + mask
            if rank & mask:
                send, lo = blocks.span(lo, mid), mid
            else:
                send, hi = blocks.span(mid, hi), mid
            kept = blocks.span(lo, hi)
            recv = tmp[: kept.stop - kept.start]
            yield [Send(src[send], partner), Recv(recv, partner)]
            op(buf[kept], recv, src[kept])
            src, mask = buf, mask >> 1

    yield from remap(loop(virtual(rank, r), q, buf if src is None else src), real_ranks(q, r))



def test_a_ring_that_skips_a_step_is_caught_at_its_smallest_case():
    report = check(ring_skipping_a_step, "allreduce", range(1, 9), volume=False)
    assert not report.ok
    assert report.failure[:2] == (2, 1)  # 2 ranks, 1 item: the smallest case that shows it
    text = report.text
    assert "smallest failing case: N = 2, count = 1, int64, op sum" in text
    assert re.search(r"rank \d: result differs at items \[0\] of 1: got \[-?\d+\], want", text)
    assert ("reproduce: mpidp.sim.simulate('allreduce', "
            "test_sim_conformance.ring_skipping_a_step, 2, 1") in text


def test_a_halving_with_the_wrong_partner_is_caught():
    report = check(halving_wrong_partner, "reduce_scatter", [1, 2, 4, 8],
                   scratch=lambda blocks: halving_scratch(blocks, len(blocks)), volume=False)
    assert not report.ok
    assert report.failure.N == 4  # right at N = 2, where rank + 1 == rank ^ 1
    assert "deadlock" in report.text or "sizes and dtypes must match" in report.text, report.text
    assert "smallest failing case: N = 4, count = " in report.text


def test_ranks_that_reduce_in_different_orders_are_caught():
    def own_first(comm, buf, blocks, op, tmp, src=None):
        """Every rank adds its own vector first: the bits differ from rank to rank."""
        rank, N = comm.Get_rank(), comm.Get_size()
        src = buf if src is None else src
        count = blocks.total
        others = [(rank + i) % N for i in range(1, N)]
        vec = {q: tmp[i * count : (i + 1) * count] for i, q in enumerate(others)}
        yield [Send(src, q) for q in others] + [Recv(vec[q], q) for q in reversed(others)]
        buf[...] = src
        for q in others:
            op(buf, vec[q])
        op.finish(buf, N)

    report = check(own_first, "allreduce", range(1, 9), scratch=lambda b: b.total * len(b),
                   volume=False)
    assert not report.ok and "hold other bits than rank 0" in report.text, report.text


def test_an_exception_in_the_algorithm_is_reported_with_its_rank():
    def fails_on_rank_1(comm, buf, blocks, op, tmp, src=None):
        if comm.Get_rank() == 1:
            raise IndexError("block out of range")
        yield from ()

    report = check(fails_on_rank_1, "allreduce", range(1, 4), volume=False)
    assert "rank 1, before its first round: the algorithm raised IndexError: block out of " \
        "range" in report.text
    assert report.failure.N == 2


# ------------------------------------------------------------------ the worked example


def example_source() -> str:
    """The algorithm of docs/simulator.md's worked example (the file `my_allreduce.py`)."""
    with open(os.path.join(ROOT, "docs", "simulator.md"), encoding="utf-8") as f:
        text = f.read()
    return re.search(r"a file `my_allreduce.py`:\n\n```python\n(.*?)```", text, re.S).group(1)


def test_the_worked_example_of_the_docs_passes_and_its_volume_is_printed(tmp_path):
    (tmp_path / "my_allreduce.py").write_text(example_source())
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "mpidp.sim", "check", "my_allreduce:allreduce",
                           "--ranks", "1-12"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok: 144 cases passed" in done.stdout
    assert re.search(r"\n   8 \| +\d+ \| +\d+ \| 1\.750 \| 1\.750 \|", done.stdout), done.stdout
    assert time.perf_counter() - t0 < 120
    table = subprocess.run([sys.executable, "-m", "mpidp.sim", "table", "my_allreduce:allreduce",
                            "--ranks", "3"], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=300)
    assert table.stdout.splitlines()[2] == "   0 | →1:0 ←2:2 | →2:1 ←0:0 | →0:2 ←1:1"


def test_the_command_line_reports_a_failure_with_exit_status_1(tmp_path):
    broken = textwrap.dedent(example_source()).replace("range(N - 1)", "range(N - 2)", 1)
    assert broken != example_source()
    (tmp_path / "broken.py").write_text(broken)
    done = subprocess.run([sys.executable, "-m", "mpidp.sim", "check", "broken:allreduce",
                           "--ranks", "1-4"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)}, cwd=tmp_path,
                          timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED" in done.stdout and "smallest failing case: N = 2" in done.stdout


def test_simulated_results_equal_numpy_for_uneven_layouts():
    layouts = [[0, 0, 5], [3, 0, 1], [1, 2, 3]]
    for counts in layouts:
        for name in names("reduce_scatter"):
            out = simulate("reduce_scatter", name, 3, counts=counts, dtype="int16", op="max")
            assert not out.problems(), (name, counts)
        # Allgatherv: the blocks in reverse order, a gap of one item before each
        displs = [sum(c + 1 for c in counts[i + 1 :]) + 1 for i in range(3)]
        for name in names("allgather"):
            out = simulate("allgather", name, 3, counts=counts, displs=displs)
            assert not out.problems(), (name, counts)
            assert np.count_nonzero(out.results[0] == 77) == out.blocks.extent - sum(counts)


def test_the_volume_table_shows_the_busiest_rank_where_ranks_differ():
    """`check`'s table gives, per N, the most rounds, bytes sent, received and reduced over
    the ranks. Binomial broadcast: the root sends G to each of its ⌈log2 N⌉ children, a
    leaf nothing; Rabenseifner on 3 ranks: the folded pair does more than the others."""
    from mpidp.sim.conformance import measured

    for collective, algorithm, ranks in (("bcast", "binomial", [3, 8]),
                                         ("allreduce", "rabenseifner", [3])):
        text = measured(collective, algorithm, ranks)
        rows = {int(line.split("|")[0]): line.split("|")[1:6]
                for line in text.splitlines()[3:]}
        assert sorted(rows) == ranks, text
        for N, cells in rows.items():
            steps, rounds, sent, recv, reduced = (float(c) for c in cells)
            q = 1 << (N.bit_length() - 1)
            count = 2 * N * q // np.gcd(N, q)  # as `measured` takes it
            s = simulate(collective, algorithm, N, count, dtype="int64").sim
            G = count * 8
            assert min(s.bytes_sent) < max(s.bytes_sent), (algorithm, N)  # the ranks differ
            assert (steps, rounds) == (s.steps, max(s.rounds)), (algorithm, N, text)
            assert sent == round(max(s.bytes_sent) / G, 3), (algorithm, N, text)
            assert recv == round(max(s.bytes_received) / G, 3), (algorithm, N, text)
            assert reduced == round(max(s.reduced) / count, 3), (algorithm, N, text)
            if algorithm == "binomial":
                assert sent == (N - 1).bit_length() and recv == 1.0, text  # the root; a leaf
