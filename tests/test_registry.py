"""The one registry of algorithms (mpidp/collectives/algorithms/__init__.py).

Each algorithm's cost is written once, as its ``cost(N, G, hosts)``; its module's
docstring quotes it as a cost line, and here every line is read as a formula and
evaluated against the function (as tests/test_sim_engine.py holds the step tables against
the simulator). And adding an algorithm is one file plus one `register`: a toy one
reaches ``mpidp.ALGORITHMS``, ``sim check``, ``sim predict`` and the benchmark.
"""

import contextlib
import inspect
import io
import json
import os
import re

import numpy as np
import pytest
from mpi4py import MPI

import mpidp
from mpidp.collectives import algorithms, cost
from mpidp.collectives.algorithms import (
    COLLECTIVES,
    REGISTRY,
    Algorithm,
    direct,
    doubling,
    halving,
    hierarchical,
    ring,
    tree,
)
from mpidp.collectives.algorithms.blocks import one_vector
from mpidp.collectives.algorithms.rounds import Cost, Recv, Send
from mpidp.collectives.placement import layout
from mpidp.sim.__main__ import main as sim_main

MODULES = (ring, halving, doubling, tree, direct, hierarchical)
SPOKEN = {"all-reduce": "allreduce", "reduce-scatter": "reduce_scatter",
          "all-gather": "allgather", "broadcast": "bcast"}
LABEL = re.compile(r"^( +)([a-z_]+(?:, [a-z_]+)*) (all-reduce|reduce-scatter|all-gather|"
                   r"broadcast):(.*)$")


# ------------------------------------------------------------------ the docstrings' cost lines


def cost_lines(doc: str) -> dict:
    """{(collective, name): formula} of the lines "name[, name] collective: formula" in `doc`;
    a formula may go on in the lines below, indented deeper."""
    found, lines = {}, doc.splitlines()
    for i, line in enumerate(lines):
        m = LABEL.match(line)
        if not m:
            continue
        indent, formula = len(m[1]), m[4].strip()
        for more in lines[i + 1 :]:
            if not more.strip() or len(more) - len(more.lstrip()) <= indent:
                break
            formula += " " + more.strip()
        for name in m[2].split(", "):
            key = (SPOKEN[m[3]], name)
            assert key not in found, f"two cost lines for {key}"
            found[key] = formula
    return found


def terms(formula: str, **values) -> tuple[float, float, float]:
    """(rounds, bytes sent, bytes reduced) of a formula such as "2(N-1)α + 2G(N-1)/N·β":
    its coefficients of α, β and γ, with implicit multiplication as written."""
    tokens = re.findall(r"\d+|[A-Za-z]|[αβγ]|[-+/·()]|\S", formula.replace(" ", ""))
    python, last = [], None
    for t in tokens:
        if t not in "-+/·()" and not (t.isalnum() or t in "αβγ"):
            raise ValueError(f"cannot read {t!r} in {formula!r}")
        factor_start = t.isalnum() or t in "αβγ("
        if last is not None and factor_start and (last.isalnum() or last in "αβγ)"):
            python.append("*")  # 2G, G(N-1), (N-1)α: products as written
        python.append({"·": "*", "α": "A", "β": "B", "γ": "C"}.get(t, t))
        last = t
    code = "".join(python)
    unit = [dict(A=1, B=0, C=0), dict(A=0, B=1, C=0), dict(A=0, B=0, C=1)]
    return tuple(float(eval(code, {}, {**values, **u})) for u in unit)  # noqa: S307


def symbols(N: int, G: float, hosts=None) -> dict:
    """The letters the docstrings define: q, k, f (halving), L (tree), H, P (hierarchical)."""
    q = 1 << (N.bit_length() - 1)
    H = max(hosts) + 1 if hosts else 1
    P = max(hosts.count(h) for h in range(H)) if hosts else N
    return dict(N=N, G=G, q=q, k=q.bit_length() - 1, f=int(N > q), L=(N - 1).bit_length(),
                H=H, P=P)


def drifted(lines: dict) -> list[str]:
    """Registered algorithms whose cost line is missing or differs from their `cost`."""
    problems = []
    for collective in COLLECTIVES:
        for name, found in REGISTRY[collective].items():
            formula = lines.get((collective, name))
            if formula is None:
                problems.append(f"no cost line for {collective} {name!r}")
                continue
            placements = [None] + ([layout(N, ppn=2) for N in (4, 6, 8)] if found.placed
                                   else [])
            cases = [(N, G, hosts) for N in range(1, 17) for G in (1.0, 96.0, float(1 << 20))
                     for hosts in placements if hosts is None or len(hosts) == N]
            for N, G, hosts in cases:  # the first case that differs, if any
                c = found.cost(N, G, hosts)
                want = terms(formula, **symbols(N, G, hosts))
                if want != pytest.approx((c.rounds, c.sent, c.reduced), rel=1e-12):
                    problems.append(f"{collective} {name!r}, N = {N}, G = {G:g}, hosts {hosts}: "
                                    f"the docstring's {formula!r} gives {want}, its cost "
                                    f"{tuple(c)[:3]}")
                    break
    return problems + [f"a cost line of no registered algorithm: {k}"
                       for k in set(lines) - {(c, n) for c in COLLECTIVES for n in REGISTRY[c]}]


def all_cost_lines() -> dict:
    found = {}
    for module in MODULES:
        for key, formula in cost_lines(inspect.getdoc(module)).items():
            assert key not in found, f"{key}: cost lines in two modules"
            found[key] = formula
    return found


def test_every_docstring_cost_line_is_its_algorithms_cost():
    assert drifted(all_cost_lines()) == []


def test_a_cost_line_that_drifts_is_caught():
    assert terms("2(N-1)α + 2G(N-1)/N·β + G(N-1)/N·γ", N=4, G=8.0) == (6, 12, 6)
    lines = all_cost_lines()
    lines["allreduce", "ring"] = lines["allreduce", "ring"].replace("2G(N-1)/N·β", "2G(N-1)·β")
    problems = drifted(lines)
    assert len(problems) == 1 and "'ring'" in problems[0], problems
    del lines["bcast", "binomial"]
    assert "no cost line for bcast 'binomial'" in drifted(lines)


# ------------------------------------------------------------------ one file plus one entry


def chain_allreduce(comm, buf, blocks, op, tmp, src=None):
    """A toy: sum up the chain N-1, ..., 1 to rank 0, then pass the result back down it."""
    rank, N = comm.Get_rank(), comm.Get_size()
    if src is not None:
        buf[...] = src
    if rank < N - 1:  # the partial sum of the ranks above me
        yield [Recv(tmp[: buf.size], rank + 1)]
        op(buf, tmp[: buf.size])
    if rank > 0:
        yield [Send(buf, rank - 1)]
        yield [Recv(buf, rank - 1)]
    else:
        op.finish(buf, N)
    if rank < N - 1:
        yield [Send(buf, rank + 1)]


def chain_cost(N: int, G: float, hosts=None) -> Cost:
    return Cost(2 * (N - 1), G * min(N - 1, 2), G * (N > 1))


TOY = Algorithm("allreduce", "chain", chain_allreduce, chain_cost, one_vector,
                replayable="in place")


@contextlib.contextmanager
def registered(toy: Algorithm):
    algorithms.register(toy)
    try:
        yield
    finally:
        algorithms.unregister(toy.collective, toy.name)


def sim(*argv) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = sim_main(list(argv))
    return rc, out.getvalue()


def test_a_registered_algorithm_reaches_the_names_the_simulator_and_the_model():
    assert "chain" not in mpidp.ALGORITHMS["allreduce"]
    with registered(TOY):
        assert mpidp.ALGORITHMS["allreduce"][-2:] == ("chain", "auto")
        assert algorithms.of(chain_allreduce) is TOY
        rc, text = sim("check", "chain", "--ranks", "1-5", "--quick")
        assert rc == 0 and "chain" in text, text
        rc, text = sim("predict", "--ranks", "4", "--bytes", "8,1MiB")
        assert rc == 0, text
        head = next(line for line in text.splitlines() if line.startswith("| N |"))
        assert "| chain |" in head, text
        assert cost.predict(cost.Model(1, 0, 0), "allreduce", "chain", 64, 5) == 8
        with pytest.raises(ValueError, match="registered already"):
            algorithms.register(TOY)
    assert "chain" not in mpidp.ALGORITHMS["allreduce"] and algorithms.of(chain_allreduce) is None


@pytest.mark.mpi(ranks=[2], timeout=120)
def test_a_registered_algorithm_reaches_the_benchmark_and_the_entry_points(mpi_ranks,
                                                                           shared_dir):
    from mpidp.bench import collectives as bench

    comm = MPI.COMM_WORLD
    with registered(TOY):
        y = np.arange(5.0) * (comm.Get_rank() + 1)
        out = np.empty_like(y)
        mpidp.allreduce(comm, y, out, algorithm="chain")
        assert np.array_equal(out, np.arange(5.0) * 3)
        path = os.path.join(shared_dir, "chain.json")
        rc = bench.main(["--collectives", "allreduce", "--min", "8", "--max", "64", "--iters",
                         "1", "--warmup", "0", "--no-gloo", "--no-memory", "--no-persistent",
                         "--json", path])
        assert rc == 0
        comm.Barrier()
        with open(path) as f:
            data = json.load(f)
        assert "chain" in data["algorithms"]["allreduce"]
        rows = [r for r in data["rows"] if r["algorithm"] == "chain"]
        assert rows and all(r["wrong"] == 0 for r in rows), rows
