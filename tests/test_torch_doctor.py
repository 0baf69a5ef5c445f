"""A hung torch job, dumped and diagnosed: the doctor names the rank and the user's line.

Two ranks under ``python -m mpidp`` on the mpidp backend, the group's timeout 3 s; rank
1 skips a ``dist.all_reduce``. Both ranks time out, write their flight records, and
``python -m mpidp.doctor`` must name rank 1 and the line of the skipped call in the
script (marked ``# <site>``), not a line inside torch.distributed.
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

SCRIPT = textwrap.dedent("""\
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    import mpidp.torch
    mpidp.torch.init_process_group(timeout=timedelta(seconds=3))
    rank = dist.get_rank()
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank != 1:
        dist.all_reduce(t)  # <site>
    dist.broadcast(t, 0)
""")


def test_the_doctor_names_the_rank_and_the_line_of_a_skipped_all_reduce(tmp_path):
    (tmp_path / "skip.py").write_text(SCRIPT)
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
    line = next(i for i, text in enumerate(SCRIPT.splitlines(), 1) if "# <site>" in text)
    assert cause["kind"] == "different_collective" and cause["ranks"] == [1], cause
    assert f"skip.py:{line}" in cause["text"], cause["text"]
    assert "distributed_c10d" not in cause["text"], cause["text"]
