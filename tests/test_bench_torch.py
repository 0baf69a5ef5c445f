"""examples/bench_torch.py's serial mode: DDP's reductions, bucket by bucket, after backward.

The overlap efficiency compares the serial step with the overlapped one; the serial step
must make the reductions DDP makes (its buckets), or a backend's per-call cost counts as
"hidden" (gloo's efficiency read above 1 when serial reduced each gradient alone).
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the `torch` extra: "
                            "make setup installs it)")

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


def bench():
    sys.path.insert(0, EXAMPLES)  # bench_torch imports train_torch from beside it
    try:
        spec = importlib.util.spec_from_file_location(
            "bench_torch", os.path.join(EXAMPLES, "bench_torch.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(EXAMPLES)
    return module


def test_buckets_are_ddps_order_and_at_least_the_cap():
    b = bench()
    ts = [torch.zeros(n) for n in (5, 3, 8, 1, 4)]  # float32: 4 bytes an item
    got = b.buckets(ts, 16)  # from the last: 4 items (16 B), 1 + 8, 3 + 5
    assert [[t.numel() for t in bucket] for bucket in got] == [[4], [1, 8], [3, 5]]
    assert [[t.numel() for t in bucket] for bucket in b.buckets(ts, 1e9)] == [[4, 1, 8, 3, 5]]
    assert b.buckets([], 16) == []


def test_reduce_in_buckets_reduces_every_gradient_once_in_few_calls():
    b = bench()
    grads = [torch.arange(n, dtype=torch.float64).reshape(-1, 1) + n for n in (6, 2, 9, 3)]
    want = [2 * g for g in grads]
    calls = []

    def double(flat):  # an all-reduce over two ranks holding the same gradients
        calls.append(flat.numel())
        flat.mul_(2)

    b.reduce_in_buckets(grads, 8 * 10, double)
    assert all(torch.equal(g, w) for g, w in zip(grads, want, strict=True))
    assert calls == [12, 8]  # buckets of 3 + 9 and 2 + 6 items, not one call a gradient


def test_torch_table_takes_the_median_over_jobs(tmp_path):
    """tools/torch_table: a row is the median over its jobs (three here), each job's ratio
    listed; a setting without jobs has no row."""
    import json

    from tools import torch_table

    for j, (mpidp_s, gloo_s, eff) in enumerate([(100, 50, 0.9), (90, 60, 0.5), (300, 100, 0.7)]):
        rows = [{"backend": b, "mode": "overlap", "samples_per_s": s, "efficiency": e}
                for b, s, e in (("mpidp", mpidp_s, eff), ("gloo", gloo_s, 0.1))]
        (tmp_path / f"hosts2-big-r{j + 1}.json").write_text(json.dumps(
            {"load": 1.0 + j, "rows": rows}))
    lines = torch_table.table(str(tmp_path))
    assert len(lines) == 3  # the header, its rule, one row
    assert lines[2] == ("| 2 hosts x 1 rank, 1 Gbit/s | 9.3 MiB | 60.0 | 100.0 | "
                        "2.00x (2.00, 1.50, 3.00) | 0.70 (0.10) | 1.0-3.0 |")


def test_torch_table_shows_an_efficiency_with_nothing_to_hide_as_a_dash(tmp_path):
    """Where a job exposed no communication, bench_torch writes its efficiency as null
    (not NaN, which no strict JSON reader takes) and the table shows a dash."""
    import json

    from tools import torch_table

    rows = [{"backend": b, "mode": "overlap", "samples_per_s": 10.0, "efficiency": None}
            for b in ("mpidp", "gloo")]
    (tmp_path / "n2-default-r1.json").write_text(json.dumps({"load": 0.5, "rows": rows}))
    assert torch_table.table(str(tmp_path))[2] == (
        "| 2 ranks, one host | default | 10.0 | 10.0 | 1.00x (1.00) | - (-) | 0.5-0.5 |")


@pytest.mark.parametrize("job, says", [
    ({"load": 1.0, "rows": [{"backend": "mpidp", "mode": "overlap", "samples_per_s": 5.0,
                             "efficiency": 0.5}]}, "no timed overlap row of gloo"),
    ({"load": 1.0, "rows": "many"}, "rows: 'many' is not a list"),
    ({"load": -1, "rows": []}, "load: -1 is out of range"),
    ({"rows": []}, "no field 'load'"),
])
def test_torch_table_refuses_a_bad_job_file_in_one_line(tmp_path, capsys, job, says):
    """A job file is read through mpidp.untrusted: a missing backend, a wrong type or a
    bound broken is one line naming the file and the field, exit code 2."""
    import json

    from tools import torch_table

    (tmp_path / "n2-big-r1.json").write_text(json.dumps(job))
    assert torch_table.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "n2-big-r1.json" in err and says in err, err
