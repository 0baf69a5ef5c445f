"""DistributedDataParallel on mpidp against DDP on gloo: same seed, same data, N = 1..4.

One launch of 4 ranks, an mpidp group and a gloo group of each size side by side
(tests/helpers/torchgroups.py). Each configuration trains a small model a few steps on
each group; losses and parameters are bitwise equal on N <= 2 (one addition per
gradient: nothing to order) in float32 and float64, and equal to rounding on 3-4 ranks
(gloo's ring and mpidp's algorithms add in other orders). Buckets are small (many
buckets per step, reduced while backward runs), in each configuration: plain,
``no_sync`` accumulation, ``find_unused_parameters=True``, ``gradient_as_bucket_view=True``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the `torch` extra: "
                            "make setup installs it)")
import torch.distributed as dist  # noqa: E402
from helpers.torchgroups import on_each_size, start  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import mpidp.torch  # noqa: E402

STEPS, BATCH = 3, 8


class Net(nn.Module):
    """Three layers and a branch that only `skip=True` steps use (unused parameters)."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(10, 64), nn.Linear(64, 64), nn.Linear(64, 4)
        self.side = nn.Linear(64, 64)

    def forward(self, x, skip: bool = False):
        h = torch.tanh(self.a(x))
        h = torch.tanh(self.b(h) if skip else self.side(self.b(h)))
        return self.c(h)


def train(group, dtype, *, accumulate=1, unused=False, bucket_view=False, hook=None,
          bucket_mb=0.01):
    """Losses and final parameters of STEPS steps of SGD under DDP on `group`."""
    torch.manual_seed(0)
    model = Net().to(dtype)
    ddp = DDP(model, process_group=group, bucket_cap_mb=bucket_mb,  # 0.01: about 4 buckets
              find_unused_parameters=unused, gradient_as_bucket_view=bucket_view)
    if hook is not None:
        ddp.register_comm_hook(group, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    rank, k = dist.get_rank(group), dist.get_world_size(group)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for step in range(STEPS):
        x = torch.randn(k * accumulate, BATCH, 10, generator=gen).to(dtype)
        y = torch.randn(k * accumulate, BATCH, 4, generator=gen).to(dtype)
        for micro in range(accumulate):
            i = rank * accumulate + micro
            last = micro == accumulate - 1
            ctx = ddp.no_sync() if not last else _null()
            with ctx:
                loss = ((ddp(x[i], skip=unused and step % 2 == 1) - y[i]) ** 2).mean()
                loss.backward()
            losses.append(loss.detach().clone())
        opt.step()
        opt.zero_grad()
    return torch.stack(losses), [p.detach().clone() for p in model.parameters()]


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


CONFIGS = [{}, {"accumulate": 2}, {"unused": True}, {"bucket_view": True}]


def ddp_checks(k, mp, gl):
    for dtype in (torch.float32, torch.float64):
        for config in CONFIGS:
            what = f"N={k} {dtype} {config}"
            mine, gloo = train(mp, dtype, **config), train(gl, dtype, **config)
            for a, b, name in ((mine[0], gloo[0], "losses"),
                               *[(p, q, f"parameter {i}")
                                 for i, (p, q) in enumerate(zip(mine[1], gloo[1], strict=True))]):
                if k <= 2:
                    assert torch.equal(a, b), f"{what}: {name} differ: {a} {b}"
                else:
                    torch.testing.assert_close(a, b, msg=f"{what}: {name}")


def exact_hook_checks(k, mp, gl):
    """The EXACT_AVG hook: the same bits whatever the algorithm and the buckets (on 3 and
    4 ranks, where the algorithms add in different orders)."""
    runs = []
    for algorithm, bucket_mb in (("ring", 0.01), ("recursive_doubling", 25), ("naive", 0.002)):
        group = dist.new_group(list(range(k)), backend="mpidp", use_local_synchronization=True,
                               pg_options=mpidp.torch.Options(algorithm))
        runs.append(train(group, torch.float32, hook=mpidp.torch.exact_avg_hook,
                          bucket_mb=bucket_mb))
    for losses, params in runs[1:]:
        assert torch.equal(losses, runs[0][0]), f"N={k}: losses differ"
        for p, q in zip(params, runs[0][1], strict=True):
            assert torch.equal(p, q), f"N={k}: parameters differ"
    plain = [train(dist.new_group(list(range(k)), backend="mpidp",
                                  use_local_synchronization=True,
                                  pg_options=mpidp.torch.Options(a)), torch.float32)
             for a in ("ring", "recursive_doubling")]
    assert not all(torch.equal(p, q) for p, q in zip(*[r[1] for r in plain], strict=True)), \
        "the plain all-reduces agree too: this check cannot tell the exact hook apart"


@pytest.mark.mpi(ranks=[4], timeout=300)
def test_ddp_on_mpidp_equals_ddp_on_gloo(mpi_ranks):
    """N = 1..4 in one launch; bitwise on 1-2 ranks, to rounding on 3-4; then the exact
    hook on 3 and 4 ranks."""
    start()
    on_each_size(range(1, 5), ddp_checks)
    on_each_size([3, 4], exact_hook_checks)
