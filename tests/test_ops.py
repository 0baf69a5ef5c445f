"""mpidp.Comm's reductions over the whole table of predefined datatypes x operations.

The MPI standard (MPI-4.1, section 6.9.2) says which predefined operation is defined
on which datatypes; a call outside that table is erroneous, and MPICH and Open MPI
refuse most such calls with ``MPI.Exception`` (``MPI.ERR_OP``). The oracle is the MPI
library: every datatype mpi4py names, each with every predefined op, runs on
``MPI.COMM_WORLD`` and on ``mpidp.Comm`` with the same bytes; mpidp must give the same
result, or raise ``MPI.Exception`` with the same error class. Where the library
computes a pair the standard does not allow, mpidp follows the standard and refuses
it: those places are the table in docs/dropin.md ("Datatypes and operations"),
read here, and the places observed must be exactly the ones listed there, no more and
no fewer. mpidp computes no pair types (``MPI.DOUBLE_INT``) and no ``WCHAR`` or
Fortran quad precision (``REAL16``, ``COMPLEX32``): ``NotImplementedError`` there.

At the end, in one process: each op's semantics and its dtype rules (`ops`).
"""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest
from helpers.subcomms import on_each_size
from mpi4py import MPI

import mpidp
from mpidp.collectives.algorithms import ops as O
from mpidp.collectives.mpiops import resolve_op

ROOT = pathlib.Path(__file__).resolve().parent.parent
OPS = ("MAX", "MIN", "SUM", "PROD", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR",
       "MAXLOC", "MINLOC", "REPLACE", "NO_OP")
# what mpidp reads as no NumPy dtype: wide characters, Fortran quad precision (NumPy's
# float128 is x87 extended precision), and the pair types of MAXLOC and MINLOC
NOT_COMPUTED = ("WCHAR", "REAL16", "COMPLEX32", "DOUBLE_INT", "FLOAT_INT", "LONG_DOUBLE_INT",
                "LONG_INT", "SHORT_INT", "TWOINT", "TWOINTEGER", "TWOREAL",
                "TWODOUBLE_PRECISION")
COUNT = 5
LIBRARY = "Open MPI" if "Open MPI" in MPI.Get_library_version() else "MPICH"


def datatypes() -> list[tuple[str, MPI.Datatype]]:
    """Every predefined datatype this mpi4py names, once each (an alias under the name
    the library gives it, else its shortest), without the null and zero-size ones."""
    found: list[tuple[list[str], MPI.Datatype]] = []
    for name in sorted(dir(MPI)):
        t = getattr(MPI, name)
        if not isinstance(t, MPI.Datatype) or t == MPI.DATATYPE_NULL or t.Get_size() == 0:
            continue
        for names, u in found:
            if u == t:
                names.append(name)
                break
        else:
            found.append(([name], t))
    chosen = []
    for names, t in found:
        own = t.Get_name().removeprefix("MPI_")
        chosen.append((own if own in names else min(names, key=len), t))
    return sorted(chosen)


def deviations(header: str = "| library | datatypes | ops it computes that") -> set:
    """(datatype, op) pairs docs/dropin.md says this library computes and the standard
    does not allow (with another `header`: the pairs of that table)."""
    text = (ROOT / "docs" / "dropin.md").read_text()
    table = text[text.index(header):]
    table = table[: table.index("\n\n")]
    pairs = set()
    for row in re.findall(r"^\| ([^|]+) \| ([^|]+) \| ([^|]+) \|$", table, re.M):
        library, types, ops = row
        if library.startswith(LIBRARY):
            pairs |= {(t, o) for t in re.findall(r"`(\w+)`", types)
                      for o in re.findall(r"`(\w+)`", ops)}
    return pairs


def values(dtype: np.dtype, op: str, rank: int, seed: int) -> np.ndarray:
    """Small values that every op reduces exactly, in any order, on up to 3 ranks."""
    rng = np.random.default_rng([seed, rank])
    if op in ("LAND", "LOR", "LXOR") or dtype.kind == "b":
        v = rng.integers(0, 2, COUNT)  # 0 and 1: true and false in C and Fortran alike
    elif op in ("BAND", "BOR", "BXOR"):
        v = rng.integers(0, 128, COUNT)
    elif op == "PROD":
        v = rng.choice([1, 2] if dtype.kind in "uS" else [1, -1, 2], COUNT)
    else:
        v = rng.integers(0 if dtype.kind in "uS" else -8, 9, COUNT)
    if dtype.kind == "S":
        return v.astype(np.uint8).view(dtype)
    if dtype.kind == "c":
        v = v + 1j * (rng.choice([0, 1], COUNT) if op == "PROD" else rng.integers(-3, 4, COUNT))
    return v.astype(dtype)


def mapped(t: MPI.Datatype) -> np.dtype | None:
    """The NumPy dtype mpidp reads `t` as, or None where it reads none."""
    from mpidp.collectives.dropin import bufspec
    try:
        return bufspec._to_dtype(t, "buf")
    except NotImplementedError:
        return None


def outcome(comm, t, dtype, op: str, seed: int, call=None):
    """("ok", the result's values) or ("error", the exception) of one all-reduce (of
    `values`; unread datatypes: zero bytes)."""
    rank = MPI.COMM_WORLD.Get_rank()
    extent = dtype.itemsize if t is None else t.Get_extent()[1]
    send = np.zeros(COUNT * extent, np.uint8)
    if dtype is not None:
        send.view(dtype)[:] = values(dtype, op, rank, seed)
    recv = np.full(COUNT * extent, 77, np.uint8)
    try:
        if t is None:  # a plain array: mpi4py infers the datatype from its format
            got = np.zeros(COUNT, dtype)
            (call or comm.Allreduce)(send.view(dtype), got, op=getattr(MPI, op))
            return "ok", got
        (call or comm.Allreduce)([send, COUNT, t], [recv, COUNT, t], op=getattr(MPI, op))
    except Exception as e:  # compared with the library's
        return "error", e
    return "ok", recv if dtype is None else recv.view(dtype)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal values (long double compared by value: its 6 padding bytes are anything)."""
    return a.dtype == b.dtype and np.array_equal(a, b)


WRONG = "| library | datatypes | ops where it computes another result |"


def reduced(mine: np.ndarray, op: str, comm) -> np.ndarray:
    """The oracle where the library computes another result: NumPy's reduction of every
    rank's input, in the datatype's own (signed) numbers. Collective over `comm`."""
    ufunc = {"MAX": np.maximum, "MIN": np.minimum, "SUM": np.add, "PROD": np.multiply}[op]
    return ufunc.reduce(np.array(comm.allgather(mine)), axis=0)


def compare(name: str, op: str, native, mine, seen: set, where: str, wrong: set = None,
            sent=None, comm=None) -> None:
    """Assert mpidp's outcome against the library's; record a documented deviation."""
    (n_how, n_what), (m_how, m_what) = native, mine
    if n_how == m_how == "ok":
        if wrong is not None and (name, op) in deviations(WRONG):  # every rank alike
            want = reduced(sent, op, comm)
            assert same(m_what, want), f"{where}: mpidp {m_what}, NumPy {want}"
            if not same(n_what, want):
                wrong.add((name, op))
            return
        assert same(m_what, n_what), f"{where}: mpidp {m_what}, {LIBRARY} {n_what}"
        return
    if m_how == "error" and isinstance(m_what, NotImplementedError):
        assert name in NOT_COMPUTED, f"{where}: {m_what!r}"  # for every op, then
        return
    assert m_how == "error" and isinstance(m_what, MPI.Exception), \
        f"{where}: {LIBRARY} {n_how} {n_what!r}, mpidp {m_how} {m_what!r}"
    assert m_what.Get_error_class() == MPI.ERR_OP, f"{where}: {m_what!r}"
    if n_how == "ok":  # the library computes it; mpidp follows the standard
        seen.add((name, op))
    else:
        assert n_what.Get_error_class() == m_what.Get_error_class(), where


def check_every_datatype_with_every_op_matches_the_library_or_the_standard(world):
    comm = mpidp.Comm(world)
    seen: set[tuple[str, str]] = set()
    wrong: set[tuple[str, str]] = set()
    computed = refused = 0
    for i, (name, t) in enumerate(datatypes()):
        dtype = mapped(t)
        for j, op in enumerate(OPS):
            native = outcome(world, t, dtype, op, i * 100 + j)
            mine = outcome(comm, t, dtype, op, i * 100 + j)
            sent = None if dtype is None else values(dtype, op, world.Get_rank(), i * 100 + j)
            compare(name, op, native, mine, seen, f"rank {world.Get_rank()}: {name} x {op}",
                    wrong, sent, world)
            computed += mine[0] == "ok"
            refused += mine[0] == "error"
    unread = sorted(name for name, t in datatypes() if mapped(t) is None)
    assert set(unread) <= set(NOT_COMPUTED) and "REAL16" in unread, unread
    documented = deviations()
    assert seen == documented, (f"{LIBRARY} computes, and mpidp refuses, "
                                f"undocumented: {sorted(seen - documented)}; "
                                f"documented but not seen: {sorted(documented - seen)}")
    assert computed > 200 and refused > 400, (computed, refused)
    if world.Get_size() > 1:  # one rank's MAX is its own value, right or not
        assert wrong == deviations(WRONG), f"{LIBRARY} computes another result: {wrong}"


def check_plain_arrays_follow_the_same_table(world):
    """No datatype given: mpi4py infers it from the array (bool: C_BOOL, S1: CHAR)."""
    comm = mpidp.Comm(world)
    seen: set[tuple[str, str]] = set()
    for i, code in enumerate("?bBhHiIlLqQefdgFDG" + "c"):
        dtype = np.dtype(code)
        name = "CHAR" if dtype.kind == "S" else f"{dtype} array"
        for j, op in enumerate(OPS[:10]):
            native = outcome(world, None, dtype, op, i * 100 + j)
            mine = outcome(comm, None, dtype, op, i * 100 + j)
            compare(name, op, native, mine, seen, f"{dtype} array x {op}")
    assert seen == {p for p in deviations() if p[0] == "CHAR"}, seen


REFUSED = [("BYTE", "SUM"), ("PACKED", "BOR"), ("C_BOOL", "BAND"), ("CHAR", "SUM"),
           ("INTEGER", "LAND"), ("DOUBLE", "BXOR"), ("C_DOUBLE_COMPLEX", "MAX"),
           ("INT", "MAXLOC"), ("FLOAT", "REPLACE"), ("AINT", "LOR")]
ALLOWED = [("BYTE", "BAND"), ("C_BOOL", "LXOR"), ("LOGICAL", "LOR"), ("INTEGER", "BXOR"),
           ("AINT", "SUM"), ("UNSIGNED_CHAR", "SUM"), ("C_FLOAT_COMPLEX", "PROD")]


def check_every_reduction_entry_point_checks_the_table(world):
    """Allreduce's I-form and persistent form, Reduce_scatter_block and Reduce_scatter
    (given and gathered counts), in place and not: refused before any message."""
    n = world.Get_size()
    comm = mpidp.Comm(world)

    def entry_points(c):
        wait = lambda req: req.Wait()  # noqa: E731
        return {
            "Allreduce": c.Allreduce,
            "Iallreduce": lambda s, r, op: wait(c.Iallreduce(s, r, op=op)),
            "Allreduce_init": lambda s, r, op: _persistent(c.Allreduce_init(s, r, op=op)),
            "in place": lambda s, r, op: c.Allreduce(MPI.IN_PLACE, r, op=op),
            "Reduce_scatter_block": c.Reduce_scatter_block,  # sendbuf's count: per block
            "Ireduce_scatter_block": lambda s, r, op: wait(c.Ireduce_scatter_block(s, r, op=op)),
            "Reduce_scatter": lambda s, r, op: c.Reduce_scatter(
                [s[0], s[1] * n, s[2]], r, [s[1]] * n, op=op),
            "Reduce_scatter gathered": lambda s, r, op: c.Reduce_scatter(
                [s[0], s[1] * n, s[2]], r, None, op=op),
        }

    for name, op in REFUSED + ALLOWED:
        t = getattr(MPI, name)
        dtype = mapped(t)
        extent = t.Get_extent()[1]
        for entry in entry_points(comm):
            results = []
            for c in (world, comm):
                send = np.zeros(n * COUNT * extent, np.uint8)
                send.view(dtype)[:] = np.tile(values(dtype, op, world.Get_rank(), 1), n)
                recv = send.copy() if entry == "in place" else np.zeros(COUNT * extent, np.uint8)
                try:
                    entry_points(c)[entry]([send, COUNT, t], [recv, COUNT, t], getattr(MPI, op))
                    results.append(("ok", recv[: COUNT * extent].view(dtype)))
                except Exception as e:  # noqa: BLE001
                    results.append(("error", e))
            where = f"{entry}: {name} x {op}"
            if (name, op) in REFUSED:
                how, e = results[1]
                assert how == "error" and isinstance(e, MPI.Exception) and \
                    e.Get_error_class() == MPI.ERR_OP, f"{where}: {results[1]}"
                assert f"MPI.{op}" in str(e) and "MPI-4.1" in str(e), f"{where}: {e}"
            else:
                assert results[0][0] == results[1][0] == "ok", f"{where}: {results}"
                assert same(results[1][1], results[0][1]), f"{where}: {results}"
    world.Barrier()


# Every multi-rank check in one launch (a launch of ranks costs seconds of start-up).

@pytest.mark.mpi(ranks=[3], timeout=300)
def test_every_datatype_and_op_matches_the_library_on_every_entry_point(mpi_ranks):
    """Every datatype with every op against the library or the standard (N = 1, 3); plain
    arrays follow the same table (N = 2); every reduction entry point checks it (N = 1, 3)."""
    on_each_size((1, 3), check_every_datatype_with_every_op_matches_the_library_or_the_standard)
    on_each_size((2,), check_plain_arrays_follow_the_same_table)
    on_each_size((1, 3), check_every_reduction_entry_point_checks_the_table)


def _persistent(request) -> None:
    request.Start()
    request.Wait()
    request.Free()


def test_ops_follow_mpi_semantics():
    a, b = np.array([1, 5, -2]), np.array([3, 2, -7])
    for name, want in [("sum", a + b), ("prod", a * b), ("max", np.maximum(a, b)),
                       ("min", np.minimum(a, b)), ("band", a & b), ("bor", a | b),
                       ("bxor", a ^ b), ("land", (a != 0) & (b != 0))]:
        acc = a.copy()
        O.OPS[name](acc, b)
        assert np.array_equal(acc, want.astype(acc.dtype)), name
    acc = np.array([2.0, 4.0])
    O.AVG(acc, np.array([2.0, 2.0]))
    O.AVG.finish(acc, 4)
    assert np.array_equal(acc, [1.0, 1.5])


@pytest.mark.parametrize("op", ["band", "bor", "bxor"])
def test_bitwise_ops_refuse_bool_as_mpi_and_mpidp_comm_do(op):
    """MPI defines BAND, BOR and BXOR on integers and bytes, not on logicals (C_BOOL): the
    library refuses them (MPI_ERR_OP), mpidp.Comm too, and so does the function API."""
    x = np.array([True, False, True])
    with pytest.raises(TypeError, match=f"op '{op}' is not defined on dtype bool"):
        mpidp.allreduce(MPI.COMM_SELF, x, np.empty_like(x), op=op)
    with pytest.raises(TypeError, match=f"op '{op}' is not defined on dtype bool"):
        mpidp.allreduce(MPI.COMM_SELF, x, np.empty_like(x), op=getattr(MPI, op.upper()))
    with pytest.raises(MPI.Exception) as by_mpi:
        MPI.COMM_SELF.Allreduce(x, np.empty_like(x), op=getattr(MPI, op.upper()))
    assert by_mpi.value.Get_error_class() == MPI.ERR_OP
    with pytest.raises(MPI.Exception, match=f"MPI.{op.upper()} is not defined on"):
        mpidp.Comm(MPI.COMM_SELF).Allreduce(x, np.empty_like(x), op=getattr(MPI, op.upper()))
    with pytest.raises(TypeError, match="is not defined on dtype bool"):
        mpidp.reduce_scatter(MPI.COMM_SELF, x, np.empty_like(x), op=op)
    y = np.array([True, False, False])  # the logical ops stay defined on bool
    mpidp.allreduce(MPI.COMM_SELF, x, y, op="lxor")
    assert y.tolist() == [True, False, True]


def test_op_dtype_rules_and_resolution():
    with pytest.raises(TypeError, match="complex"):
        O.MAX.check(np.complex128)
    with pytest.raises(TypeError):
        O.AVG.check(np.int32)  # an integer average would truncate
    with pytest.raises(TypeError):
        O.BXOR.check(np.float64)
    O.SUM.check(np.float16)
    assert resolve_op(MPI.SUM) is O.SUM and resolve_op("max") is O.MAX
    assert resolve_op(MPI.BXOR) is O.BXOR
    with pytest.raises(ValueError, match="unknown op"):
        resolve_op("mean")
    with pytest.raises(NotImplementedError, match="MAXLOC"):
        resolve_op(MPI.MAXLOC)
    with pytest.raises(TypeError):
        resolve_op(3)
