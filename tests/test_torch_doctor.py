"""A hung torch job, dumped and diagnosed: the doctor names the rank and the user's line.

Two ranks under ``python -m mpidp`` on the mpidp backend, the group's timeout 3 s; rank
1 skips a ``dist.all_reduce`` (or, under DDP, a ``loss.backward()``: its buckets'
all-reduces). Both ranks time out, write their flight records, and ``python -m
mpidp.doctor`` must name rank 1 and the line of the skipped call in the script (marked
``# <site>``), not a line inside torch.distributed; under DDP, with the bucket.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch", reason="torch is not installed (the `torch` extra: make setup "
                    "installs it)")
from helpers import launch  # noqa: E402

START = textwrap.dedent("""\
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    import mpidp.torch
    mpidp.torch.init_process_group(timeout=timedelta(seconds=3))
    rank = dist.get_rank()
    t = torch.ones(4)
""")
SCRIPTS = {
    "all_reduce": (START + textwrap.dedent("""\
        dist.all_reduce(t)
        if rank != 1:
            dist.all_reduce(t)  # <site>
        dist.broadcast(t, 0)
    """), ""),
    # buckets of 10 KB: the first layer's weight (16 KiB) is a bucket of its own (the last
    # one: DDP's buckets run from the last layer back), the rest the first bucket
    "ddp": (START + textwrap.dedent("""\
        from torch import nn
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(
            nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 4)), bucket_cap_mb=0.01)
        for step in range(2):
            loss = model(torch.ones(8, 64)).sum()
            if rank != 1 or step == 0:
                loss.backward()  # <site>
        dist.broadcast(t, 0)
    """), " (DDP bucket 0)"),
}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_the_doctor_names_the_rank_and_the_line_of_a_skipped_all_reduce(tmp_path, name):
    script, bucket = SCRIPTS[name]
    (tmp_path / "skip.py").write_text(script)
    env = {"MPIDP_DEBUG": "0", "MPIDP_COST": "default",
           "MPIDP_FLIGHT_DIR": str(tmp_path / "flight")}
    code, out, err, _ = launch.run(2, [sys.executable, "-m", "mpidp", "skip.py"], env=env,
                                   timeout=120, cwd=str(tmp_path))
    assert code not in (0, None), out + err  # the deadline ended it (None: it hung)
    doctor = subprocess.run([sys.executable, "-m", "mpidp.doctor", str(tmp_path / "flight"),
                             "--json"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert doctor.returncode == 0, doctor.stderr + err[-3000:]
    cause = json.loads(doctor.stdout)["cause"]
    line = next(i for i, text in enumerate(script.splitlines(), 1) if "# <site>" in text)
    assert cause["kind"] == "different_collective" and cause["ranks"] == [1], cause
    assert f"skip.py:{line}{bucket}" in cause["text"], cause["text"]
    assert "distributed_c10d" not in cause["text"], cause["text"]
