"""The benchmark tooling: the collectives sweep checks its answers, and the report reads its JSON.

The sweep runs in-process on 2 and 3 ranks at tiny sizes (the numbers are noise;
what is tested is the schema, that every algorithm of `mpidp.ALGORITHMS` and the
native call have rows, and that every result was right). A deliberately broken
all-reduce shows that `#wrong` catches a bad answer. The report generator runs
on a small synthetic JSON whose targets are met, missed and unmeasured by
construction.
"""

import csv
import json
import os

import pytest
from mpi4py import MPI

import mpidp
from mpidp.bench import collectives as bench
from mpidp.bench import report
from mpidp.collectives import api

# nccl-tests doc/PERFORMANCE.md: busbw = algbw · factor, the share of the data each
# rank's link carries (all-reduce: reduce-scatter + all-gather)
NCCL_TESTS_BUS_FACTOR = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "bcast": lambda n: 1.0,
}
ROW_KEYS = {"collective", "algorithm", "bytes", "time_us", "algbw_gbps", "busbw_gbps", "wrong",
            "min_us", "count", "inplace", "speedup", "resolved", "persistent"}
META_KEYS = {"date", "cpu", "cores", "mpi_library", "mpi4py", "numpy", "ranks", "rows"}


@pytest.mark.mpi(ranks=[2, 3], timeout=120)
def test_collectives_sweep_checks_every_algorithm_against_native(mpi_ranks, shared_dir):
    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    out = os.path.join(shared_dir, "c.json")
    table = os.path.join(shared_dir, "c.csv")
    rc = bench.main(["--min", "8", "--max", "256", "--iters", "2", "--warmup", "1",
                     "--json", out, "--csv", table])
    assert rc == 0
    comm.Barrier()
    with open(out) as f:
        data = json.load(f)
    assert META_KEYS <= data.keys() and data["ranks"] == n
    rows = data["rows"]
    for row in rows:
        assert ROW_KEYS <= row.keys(), row
        assert row["wrong"] == 0, row
        assert row["time_us"] > 0 and row["min_us"] <= row["time_us"]
        factor = NCCL_TESTS_BUS_FACTOR[row["collective"]](n)  # written out, not the bench's
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * factor, rel=1e-5)
        assert row["algbw_gbps"] == pytest.approx(row["bytes"] / row["time_us"] / 1e3, rel=1e-5)
    for collective in bench.COLLECTIVES:
        names = mpidp.ALGORITHMS[collective]
        for place in ([None] if collective == "bcast" else [False, True]):
            mine = [r for r in rows if r["collective"] == collective and r["inplace"] is place]
            assert {r["algorithm"] for r in mine} == {"native", *names}, (collective, place)
            persistent = {r["algorithm"] for r in mine if r["persistent"]}
            assert persistent == {"native", "auto"}, (collective, place)  # *_init, timed too
            assert all(r["resolved"] in names[:-1] for r in mine if r["algorithm"] == "auto")
            if collective in ("reduce_scatter", "allgather"):  # whole blocks: N divides count
                assert all(r["count"] % n == 0 for r in mine)
            largest = max(r["bytes"] for r in mine)
            for r in mine:  # memory measured at the largest size, for mpidp's plain calls
                measured = r.get("mem_first_bytes") is not None
                assert measured == (r["bytes"] == largest and r["algorithm"] != "native"
                                    and not r["persistent"])
    with open(table) as f:
        assert len(list(csv.DictReader(f))) == len(rows)


@pytest.mark.mpi(ranks=[2], timeout=60)
def test_a_wrong_answer_is_counted(mpi_ranks, monkeypatch):
    real = api.allreduce

    def off_by_one(comm, sendbuf, recvbuf, *args, **kw):
        real(comm, sendbuf, recvbuf, *args, **kw)
        if comm.Get_rank() == 1:
            recvbuf[0] += 1

    monkeypatch.setattr(api, "allreduce", off_by_one)
    rc = bench.main(["--collectives", "allreduce", "--max", "64", "--iters", "2",
                     "--warmup", "1", "--inplace", "off", "--no-memory"])
    assert rc == 1  # every mpidp row is wrong: one item per iteration on rank 1


# ------------------------------------------------------------------ the report generator

def row(collective, algorithm, nbytes, time_us, inplace=False, resolved=None, **extra):
    algbw = nbytes / time_us / 1e3
    return {"collective": collective, "algorithm": algorithm, "resolved": resolved,
            "inplace": inplace, "bytes": nbytes, "count": nbytes // 4, "time_us": time_us,
            "min_us": time_us, "algbw_gbps": algbw, "busbw_gbps": algbw, "wrong": 0,
            "speedup": None, **extra}


def synthetic_run() -> dict:
    """All-reduce on 2 ranks at 1 KiB and 2 MiB, broadcast at 1 KiB only:

    large (2 MiB): ring 80 µs vs native 100 µs = 1.25x       -> met
    auto: 10.5 µs vs ring 10 µs at 1 KiB (1.05x), 80 at 2 MiB -> met
    small (1 KiB): auto 10.5 µs vs native 2.5 µs = 4.2x       -> missed by 40%
    broadcast: no size >= 1 MiB                                -> not measured
    """
    rows = [
        row("allreduce", "native", 1024, 2.5),
        row("allreduce", "ring", 1024, 10.0),
        row("allreduce", "naive", 1024, 30.0),
        row("allreduce", "auto", 1024, 10.5, resolved="ring"),
        row("allreduce", "native", 2 << 20, 100.0),
        row("allreduce", "ring", 2 << 20, 80.0, mem_first_bytes=1 << 20, mem_steady_bytes=2048),
        row("allreduce", "naive", 2 << 20, 300.0, mem_first_bytes=2 << 20,
            mem_steady_bytes=2048),
        row("allreduce", "auto", 2 << 20, 80.0, resolved="ring", mem_first_bytes=1 << 20,
            mem_steady_bytes=2048),
        row("bcast", "native", 1024, 2.0, inplace=None),
        row("bcast", "binomial", 1024, 4.0, inplace=None),
        row("bcast", "auto", 1024, 4.0, inplace=None, resolved="binomial"),
    ]
    return {"ranks": 2, "date": "2025-01-01T00:00:00+00:00", "cpu": "Test CPU", "cores": 2,
            "host": "h", "platform": "p", "python": "3", "mpi_library": "MPICH Version: 5\nx",
            "mpi_library_short": "MPICH Version: 5", "mpi4py": "4", "numpy": "2",
            "dtype": "float32", "op": "sum", "min_bytes": 1024, "max_bytes": 2 << 20,
            "iters": 5, "warmup": 1, "rows": rows}


def test_targets_are_computed_from_the_rows():
    groups = report.group(synthetic_run()["rows"])
    large, auto, small = report.targets(groups["allreduce", False])
    assert large["met"] is True and large["worst"] == pytest.approx(1.25)
    assert large["at"] == 2 << 20
    assert auto["met"] is True and auto["worst"] == pytest.approx(1.05) and auto["at"] == 1024
    assert small["met"] is False and small["worst"] == pytest.approx(4.2)
    assert "missed by 40%" in small["detail"]
    bcast_large, bcast_auto, bcast_small = report.targets(groups["bcast", None])
    assert bcast_large["met"] is None
    assert bcast_auto["met"] is True and bcast_small["met"] is True


def test_report_writes_the_page_and_plots(tmp_path):
    data, img, out = tmp_path / "data", tmp_path / "img", tmp_path / "benchmarks.md"
    data.mkdir()
    (data / "collectives-n2.json").write_text(json.dumps(synthetic_run()))
    (data / "overlap-n2.txt").write_text("mode step ms\nserial 1.0\n")
    (data / "overlap-n2.json").write_text(json.dumps(
        {"ranks": 2, "modes": {"serial": {"step_ms": 10.0},
                               "overlap": {"step_ms": 8.0, "hidden_fraction": 0.5}}}))
    notes = tmp_path / "notes.md"
    notes.write_text("Small sizes miss because of Python call overhead.\n")
    assert report.main(["--data", str(data), "--img", str(img), "--out", str(out),
                        "--notes", str(notes), "--note", "preliminary"]) == 0
    page = out.read_text()
    assert (img / "collectives-n2.png").stat().st_size > 1000
    assert "](img/collectives-n2.png)" in page and "](data/collectives-n2.json)" in page
    assert "Test CPU, 2 cores" in page and "MPICH Version: 5" in page
    assert "4 of 5 measured targets met" in page
    assert "| 2 | all-reduce | out-of-place | ≤ 4 KiB: auto within 3x native latency | " \
           "**missed** | worst at 1 KiB: auto 10.5 µs, native 2.5 µs = 4.2x (missed by 40%) |" \
           in page
    assert "| 2 | all-reduce | 2 MiB | 100 | ring | 1.25x | ring | 1.25x |" in page  # headline
    assert "| 2 MiB | 524288 | 100.0 | 80.0 (1.25x) | 300.0 (0.33x) | 80.0 (1.25x) [ring] |" \
           in page
    assert "| 2 | all-reduce | out-of-place | ring | 2 MiB | 1 MiB | 0.50 | 2 KiB |" in page
    assert "Python call overhead" in page and "> **preliminary**" in page
    assert "overlap hides 50% of the communication" in page and "serial 1.0" in page
    assert "0 wrong items" in page


def test_report_writes_the_overlap_tables_from_the_runs_json(tmp_path):
    """docs/overlap.md's tables are the JSON's numbers, not typed by hand."""
    run = {"ranks": 2, "sizes": [4, 3, 2], "batch": 8, "dtype": "float32", "bucket_mb": 0.0,
           "algorithm": "ring", "modes": {
               "compute": {"step_ms": 1.0, "backward_ms": 0.5, "exposed_comm_ms": 0.0},
               "serial": {"step_ms": 2.0, "backward_ms": 0.5, "exposed_comm_ms": 1.0},
               "overlap": {"step_ms": 1.5, "backward_ms": 0.75, "exposed_comm_ms": 0.25,
                           "hidden_fraction": 0.5}}}
    (tmp_path / "overlap-n2.json").write_text(json.dumps(run))
    doc = tmp_path / "overlap.md"
    doc.write_text(f"a\n{report.OVERLAP_BEGIN}\nold\n{report.OVERLAP_END}\nz\n")
    paths = [str(tmp_path / "overlap-n2.json")]
    assert report.replace_marked(str(doc), report.OVERLAP_BEGIN, report.OVERLAP_END,
                                 report.overlap_tables(paths))
    text = doc.read_text()
    assert "old" not in text and text.startswith("a\n") and text.endswith("z\n")
    assert "| serial | 2.00 | 0.50 | 1.00 |  |" in text
    assert "| overlap | 1.50 | 0.75 | 0.25 | +0.50 |" in text


def test_report_updates_the_readme_headline_between_its_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.README_BEGIN}\nold numbers\n{report.README_END}\nend\n")
    assert report.update_readme(str(readme), [synthetic_run()])
    text = readme.read_text()
    assert "old numbers" not in text and text.startswith("intro\n") and text.endswith("end\n")
    assert "| ranks | collective |" in text and "measured targets met" in text
    plain = tmp_path / "OTHER.md"
    plain.write_text("no markers\n")
    assert not report.update_readme(str(plain), [synthetic_run()])
    assert plain.read_text() == "no markers\n"


@pytest.mark.mpi(ranks=[2], timeout=120)
def test_overlap_benchmark_writes_every_output(mpi_ranks, shared_dir):
    from mpidp.bench import overlap

    out = {k: os.path.join(shared_dir, f"overlap.{k}") for k in ("json", "csv", "png")}
    assert overlap.main(["--hidden", "32,32", "--features", "16", "--batch", "8",
                         "--steps", "3", "--warmup", "1", "--json", out["json"],
                         "--csv", out["csv"], "--plot", out["png"]]) == 0
    MPI.COMM_WORLD.Barrier()
    with open(out["json"]) as f:
        summary = json.load(f)
    assert summary["ranks"] == 2
    assert set(summary["modes"]) == {"compute", "serial", "overlap", "overlap+thread"}
    for mode in ("overlap", "overlap+thread"):
        e = summary["modes"][mode]
        assert "hidden_fraction" in e and len(e["buckets"]) == 3  # one bucket per layer
        assert all(b["complete_ms"] >= b["launch_ms"] >= 0 for b in e["buckets"])
    with open(out["csv"]) as f:
        rows = list(csv.DictReader(f))
    assert [r["mode"] for r in rows] == list(summary["modes"])
    assert os.path.getsize(out["png"]) > 1000
