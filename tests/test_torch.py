"""mpidp.torch's collectives against gloo's: the same call on the same inputs, N = 1..4.

One launch of 4 ranks: an mpidp group and a gloo group of the ranks 0..k-1 for each k
(tests/helpers/torchgroups.py), each op and dtype run on both and compared bitwise.
The inputs are small integers (and multiples of 1/8), whose sums are exact in every
dtype, so that any order of additions gives the same bits; random floats are compared
bitwise on N <= 2 (one addition: nothing to order) and to rounding above.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the `torch` extra: "
                            "make setup installs it)")
import torch.distributed as dist  # noqa: E402
from helpers.torchgroups import on_each_size, start  # noqa: E402

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.uint8, torch.int8, torch.int32, torch.int64]
DTYPES = FLOATS + INTS + [torch.bool]
R = dist.ReduceOp
OPS = [R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR]


def inputs(rank: int, dtype, n: int = 37, seed: int = 0) -> torch.Tensor:
    """Rank `rank`'s input: exact small values (products too: 1s and 2s mostly)."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype.is_floating_point:
        return (torch.randint(-16, 17, (n,), generator=g) / 8).to(dtype)
    low = 0 if dtype == torch.uint8 else -3
    return torch.randint(low, 4, (n,), generator=g).to(dtype)


def both(k, mp, gl, call):
    """`call(group)` on each group; its results (or the exception type) for each."""
    out = []
    for group in (mp, gl):
        try:
            out.append(call(group))
        except (RuntimeError, ValueError, TypeError, NotImplementedError) as e:
            out.append(type(e))
    return out


def same(a, b, what):
    if isinstance(a, type) or isinstance(b, type):
        assert isinstance(a, type) and isinstance(b, type), f"{what}: mpidp {a}, gloo {b}"
        return
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), what
        for x, y in zip(a, b, strict=True):
            same(x, y, what)
        return
    assert (a.dtype, a.shape) == (b.dtype, b.shape), f"{what}: {a.dtype} {b.dtype}"
    assert torch.equal(a, b), f"{what}: mpidp {a} gloo {b}"


def all_reduce_checks(k, mp, gl):
    rank = dist.get_rank()
    for dtype in DTYPES:
        for op in OPS:
            def call(group, dtype=dtype, op=op):
                t = inputs(rank, dtype)
                if op == R.PRODUCT and dtype.is_floating_point:
                    t = torch.where(t.abs() > 1, torch.sign(t) * 2, torch.ones_like(t)).to(dtype)
                dist.all_reduce(t, op=op, group=group)
                return t
            mine, gloo = both(k, mp, gl, call)
            if isinstance(gloo, type) and dtype == torch.bool and op == R.AVG:
                assert isinstance(mine, type), "AVG on bool: gloo refuses, mpidp must too"
                continue
            same(mine, gloo, f"N={k} all_reduce {op} {dtype}")


def random_float_sums(k, mp, gl):
    rank = dist.get_rank()
    for dtype in FLOATS:
        def call(group, dtype=dtype):
            t = torch.randn(1000, generator=torch.Generator().manual_seed(rank)).to(dtype)
            dist.all_reduce(t, group=group)
            return t
        mine, gloo = both(k, mp, gl, call)
        if k <= 2:
            same(mine, gloo, f"N={k} random sum {dtype}")
        else:  # another order of additions: equal to rounding
            tol = {torch.float16: 4e-3, torch.bfloat16: 3e-2}.get(dtype, 1e-5)
            torch.testing.assert_close(mine, gloo, rtol=tol, atol=tol * 4)


def layout_checks(k, mp, gl):
    """Non-contiguous and zero-size tensors, async_op, coalesced all-reduce."""
    rank = dist.get_rank()

    def strided(group):
        t = (torch.arange(12.).reshape(3, 4) * (rank + 1)).t()  # a transposed view
        assert not t.is_contiguous()
        dist.all_reduce(t, group=group)
        return t
    same(*both(k, mp, gl, strided), f"N={k} non-contiguous")

    def empty(group):
        t = torch.zeros(0, 3)
        dist.all_reduce(t, group=group)
        return t
    same(*both(k, mp, gl, empty), f"N={k} zero-size")

    def asynchronous(group):
        t = inputs(rank, torch.float32)
        work = dist.all_reduce(t, group=group, async_op=True)
        fut = work.get_future()
        work.wait()
        return [t, fut.wait()[0]]
    same(*both(k, mp, gl, asynchronous), f"N={k} async")

    def coalesced(group):
        ts = [inputs(rank, torch.float32, n, seed=n) for n in (3, 0, 10)]
        with dist._coalescing_manager(group=group):
            for t in ts:
                dist.all_reduce(t, group=group)
        return ts
    same(*both(k, mp, gl, coalesced), f"N={k} coalesced")


def gather_checks(k, mp, gl):
    rank = dist.get_rank()
    for dtype in [torch.bfloat16, torch.float16, torch.float64, torch.int32, torch.bool]:
        def gather(group, dtype=dtype):
            outs = [torch.empty(5, dtype=dtype) for _ in range(k)]
            dist.all_gather(outs, inputs(rank, dtype, 5), group=group)
            return outs
        same(*both(k, mp, gl, gather), f"N={k} all_gather {dtype}")

        def into_tensor(group, dtype=dtype):
            out = torch.empty(k * 6, dtype=dtype)
            dist.all_gather_into_tensor(out, inputs(rank, dtype, 6), group=group)
            return out
        same(*both(k, mp, gl, into_tensor), f"N={k} all_gather_into_tensor {dtype}")

        def bcast(group, dtype=dtype):
            t = inputs(rank, dtype, 7)
            dist.broadcast(t, group=group, group_src=k - 1)
            return t
        same(*both(k, mp, gl, bcast), f"N={k} broadcast {dtype}")

    for op in [R.SUM, R.MAX]:
        def rs(group, op=op):
            out = torch.empty(4)
            dist.reduce_scatter(out, [inputs(rank, torch.float32, 4, seed=j) for j in range(k)],
                                op=op, group=group)
            return out
        same(*both(k, mp, gl, rs), f"N={k} reduce_scatter {op}")

        def rs_tensor(group, op=op):
            out = torch.empty(3, dtype=torch.bfloat16)
            dist.reduce_scatter_tensor(out, inputs(rank, torch.bfloat16, 3 * k), op=op,
                                       group=group)
            return out
        same(*both(k, mp, gl, rs_tensor), f"N={k} reduce_scatter_tensor {op}")


def object_and_p2p_checks(k, mp, gl):
    rank = dist.get_rank()

    def objects(group):
        got = [None] * k
        dist.all_gather_object(got, {"rank": rank, "word": "x" * rank}, group=group)
        sent = [{"from": "root", "n": k}, 3] if rank == 0 else [None, None]
        dist.broadcast_object_list(sent, group_src=0, group=group)
        return got + sent
    mine, gloo = [], []
    for group, out in ((mp, mine), (gl, gloo)):
        out.extend(objects(group))
    assert mine == gloo, f"N={k} objects: {mine} {gloo}"

    dist.barrier(group=mp)
    if k >= 2 and rank < 2:
        for group in (mp, gl):
            t = torch.tensor([rank + 0.5, 42.0])
            if rank == 0:
                dist.send(t, group_dst=1, group=group, tag=7)
            else:
                got = torch.zeros(2)
                dist.recv(got, group_src=0, group=group, tag=7)
                assert got.tolist() == [0.5, 42.0], got


def unsupported_checks(k, mp, gl):
    with pytest.raises(NotImplementedError, match="all_to_all_single is not supported"):
        dist.all_to_all_single(torch.zeros(k), torch.zeros(k), group=mp)
    with pytest.raises(NotImplementedError, match="gather is not supported"):
        dist.gather(torch.zeros(1), [torch.zeros(1)] * k if dist.get_rank() == 0 else None,
                    group=mp)
    with pytest.raises(TypeError, match="mpidp backend: all_reduce does not support"):
        dist.all_reduce(torch.zeros(2, dtype=torch.uint32), group=mp)


def every_check(k, mp, gl):
    all_reduce_checks(k, mp, gl)
    random_float_sums(k, mp, gl)
    layout_checks(k, mp, gl)
    gather_checks(k, mp, gl)
    object_and_p2p_checks(k, mp, gl)
    unsupported_checks(k, mp, gl)


def device_mesh_checks():
    """A 2 x 2 device mesh on the mpidp backend: each dimension's groups are communicators
    of their own, of 2 ranks, reducing over the mesh's rows and columns."""
    from torch.distributed.device_mesh import init_device_mesh

    import mpidp.torch

    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    row = rank // 2 * 2
    for name, peers in (("dp", [rank % 2, rank % 2 + 2]), ("tp", [row, row + 1])):
        group = mesh.get_group(name)
        assert isinstance(group, mpidp.torch.ProcessGroup), type(group)
        assert dist.get_process_group_ranks(group) == peers
        assert group.comm.Get_size() == 2 and group.comm is not dist.group.WORLD.comm
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=group)
        assert t.item() == sum(peers), (name, t)


@pytest.mark.mpi(ranks=[4], timeout=300)
def test_every_collective_and_dtype_equals_gloo_on_1_to_4_ranks(mpi_ranks):
    """N = 1..4 in one launch: mpidp and gloo groups of each size side by side; then a
    device mesh's groups."""
    start()
    on_each_size(range(1, 5), every_check)
    device_mesh_checks()
