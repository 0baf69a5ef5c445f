"""examples/train_torch.py: --deterministic is the same bits on N = 1..4; FSDP2 equals gloo's.

One launch of 4 ranks; the trainer's `train(args, group)` runs on an mpidp group (and a
gloo group) of the ranks 0..k-1 for each k (tests/helpers/torchgroups.py). Rank 0, a
member of every size, keeps N = 1's parameters and compares each later size with them.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the `torch` extra: "
                            "make setup installs it)")
import torch.distributed as dist  # noqa: E402
from helpers.torchgroups import on_each_size, start  # noqa: E402

TRAIN = os.path.join(os.path.dirname(__file__), "..", "examples", "train_torch.py")
TINY = ["--steps", "3", "--eval-every", "3", "--global-batch", "24", "--context", "16",
        "--layers", "1", "--width", "32", "--heads", "2", "--corpus-mb", "0.1",
        "--eval-tokens", "256"]


def trainer():
    spec = importlib.util.spec_from_file_location("train_torch", TRAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_deterministic_needs_mpidp():
    with pytest.raises(SystemExit):
        trainer().parse_args(["--deterministic", "--backend", "gloo"])


@pytest.mark.mpi(ranks=[4], timeout=400)
def test_deterministic_is_the_same_bits_on_1_to_4_ranks_and_fsdp2_equals_gloo(mpi_ranks):
    start()
    tt = trainer()
    reference = {}

    def deterministic(k, mp, gl):
        # asserted after the runs: a rank that raised early would leave the others waiting
        # in the next run's collectives. float64 on N = 1 and 3 only (the suite's time)
        wrong = []
        for dtype in ("float32", "float64") if k in (1, 3) else ("float32",):
            args = tt.parse_args(TINY + ["--deterministic", "--micro-batch", "2", "--dtype", dtype])
            first, last, params = tt.train(args, mp)
            if not last < first:
                wrong.append(f"N={k} {dtype}: the held-out loss did not fall")
            if dist.get_rank() == 0:
                reference.setdefault(dtype, params)
                wrong += [f"N={k} {dtype}: {name} differs from N=1's"
                          for name, p in params.items()
                          if not torch.equal(p, reference[dtype][name])]
        assert not wrong, wrong

    def fsdp(k, mp, gl):
        # SGD: Adam's m / sqrt(v) turns a last-bit difference of a gradient near 0 into a
        # step of +-lr, and 3-4 ranks add in another order than gloo
        args = tt.parse_args(TINY + ["--fsdp", "--optimizer", "sgd", "--lr", "0.1"])
        mine, gloo = tt.train(args, mp), tt.train(args, gl)
        for name in mine[2]:
            a, b = mine[2][name], gloo[2][name]
            if k <= 2:
                assert torch.equal(a, b), f"N={k} FSDP2: {name} differs from gloo's"
            else:
                torch.testing.assert_close(a, b, msg=f"N={k} FSDP2: {name}")

    on_each_size(range(1, 5), deterministic)
    on_each_size((2, 4), fsdp)  # bitwise on 2, to rounding on 4 (the most orders of addition)
