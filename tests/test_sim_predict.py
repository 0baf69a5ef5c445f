"""`mpidp.sim predict`: on one level the simulated time is the cost model's formula; two levels
make the node links count; the calibration and benchmark files are read as written.

Also the command line of `table` and `draw`.
"""

import os
import subprocess
import sys

import pytest

from mpidp.collectives import cost
from mpidp.sim import COLLECTIVES, names
from mpidp.sim.__main__ import main
from mpidp.sim.draw import run as draw_run
from mpidp.sim.predict import (
    Network,
    fit_inter,
    predict,
    read_calibration,
    read_measured,
    times,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NET = Network(alpha=20e-6, beta=0.25e-9, gamma=0.5e-9, fixed=10e-6)
MiB = 1 << 20


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_one_level_reproduces_the_formulas(collective):
    sizes = [64 << 10, MiB, 16 * MiB]
    for N in (2, 4, 8, 16, 32):  # powers of two: every algorithm, exactly
        for row in predict(collective, [N], sizes, NET):
            for name, seconds in row["sim"].items():
                assert seconds == pytest.approx(row["formula"][name], rel=1e-9), (N, name, row)
    exact = {"allreduce": names("allreduce"), "bcast": names("bcast"),
             "reduce_scatter": ("ring",), "allgather": ("ring",)}[collective]
    for N in (3, 5, 6, 7, 12):  # the fold of halving/doubling splits unevenly: not those
        for row in predict(collective, [N], [MiB], NET, exact):
            for name, seconds in row["sim"].items():
                assert seconds == pytest.approx(row["formula"][name], rel=1e-9), (N, name)


def test_two_levels_the_slowest_hop_and_the_node_links():
    G = 16 * MiB
    two = NET._replace(ppn=2, alpha_inter=50e-6, beta_inter=8e-9)
    ring = times("allreduce", "ring", 4, [G], two)[0]
    # every step waits for the hops 1 -> 2 and 3 -> 0 between the nodes
    hop = two.alpha_inter + G / 4 * two.beta_inter
    assert ring == pytest.approx(2 * 3 * hop + 3 * G / 4 * two.gamma + two.fixed, rel=1e-9)
    # Rabenseifner in the article's order: its first step sends half the vector from both
    # ranks of a node through its one link at once: the link carries G (2 x G/2) where the
    # flat model sees G/2; nearest partner first (the algorithms see the nodes) it carries
    # G/2 in each half, as the hierarchical all-reduce does
    article = times("allreduce", "rabenseifner_article", 4, [G], two)[0]
    flat = times("allreduce", "rabenseifner_article", 4, [G], two._replace(ppn=0))[0]
    assert article > 2 * flat
    rab, hier = (times("allreduce", name, 4, [G], two)[0] for name in ("rabenseifner",
                                                                       "hierarchical"))
    assert rab == pytest.approx(hier, rel=1e-3) and rab < 0.75 * ring and rab < 0.55 * article
    eight = NET._replace(ppn=8, alpha_inter=50e-6, beta_inter=8e-9)
    row = predict("allreduce", [16], [G], eight)[0]
    assert row["best"] in ("rabenseifner", "hierarchical")
    assert row["sim"]["rabenseifner_article"] > 3 * row["sim"]["ring"]  # what the order costs


def test_calibration_and_benchmark_files_are_read():
    net = read_calibration(os.path.join(ROOT, "docs", "bench", "calibrate-n4.txt"))
    assert net.alpha == pytest.approx(23.15e-6) and net.beta == pytest.approx(0.2430e-9)
    assert net.gamma == pytest.approx(0.2478e-9) and net.fixed == pytest.approx(14.85e-6)
    measured = read_measured(os.path.join(ROOT, "docs", "bench", "collectives-n4.json"),
                             "allreduce")
    assert measured[4, 8, "ring"] > 0 and (4, 64 * MiB, "rabenseifner") in measured
    assert not any(a in ("native", "auto") for _, _, a in measured)


def test_inter_node_alpha_and_beta_are_fitted_to_a_cluster_bench_output(tmp_path, capsys):
    """A `python -m mpidp.cluster bench` output, printed as it prints it, from a known model."""
    known = cost.Model(alpha=100e-6, beta=8e-9, gamma=0.25e-9, fixed=20e-6)
    N, lines = 4, ["# 4 ranks; link 0.125 GB/s; busbw in GB/s (median of 3); ratio = ..."]
    for size in (0.25, 1, 4, 16, 64):
        nbytes = int(size * MiB)
        for name in ("native", *names("allreduce")):
            seconds = cost.predict(known, "allreduce", "ring" if name == "native" else name,
                                   nbytes, N)
            busbw = nbytes * 2 * (N - 1) / N / seconds / 1e9
            lines.append(f"{size:8.2f} MiB  {name:>18}  {busbw:7.4f}  ratio  1.00  link   90%")
    path = tmp_path / "cluster.txt"
    path.write_text("\n".join(lines) + "\n")
    alpha, beta = fit_inter(str(path), known.gamma, known.fixed)
    assert beta == pytest.approx(known.beta, rel=0.01) and alpha == pytest.approx(known.alpha,
                                                                                  rel=0.1)
    assert main(["predict", "--ranks", "8", "--bytes", "1MiB", "--ppn", "2", "--gamma", "2.5e-10",
                 "--fixed", "2e-5", "--fit-inter", str(path)]) == 0
    assert f"beta = {beta * 1e9:.4f} ns/B" in capsys.readouterr().out
    assert main(["predict", "--fit-inter", str(path)]) == 2  # two levels need --ppn


def test_predict_command_line(capsys):
    assert main(["predict", "--ranks", "4,6", "--bytes", "8,1MiB", "--alpha", "2e-5",
                 "--beta", "2.5e-10", "--gamma", "5e-10"]) == 0
    out = capsys.readouterr().out
    assert "| 4 | 1 MiB | " in out and "| 6 | 8 B | " in out
    assert "N = 4: auto takes recursive_doubling from 8 B, rabenseifner from" in out
    row = next(line for line in out.splitlines() if line.startswith("| 4 | 1 MiB"))
    ring = cost.predict(cost.Model(2e-5, 2.5e-10, 5e-10), "allreduce", "ring", MiB, 4)
    assert row.split("|")[3].strip() == f"{ring * 1e6:.0f} ({ring * 1e6:.0f})"


def test_predict_compares_with_a_benchmark_file(capsys):
    bench = os.path.join(ROOT, "docs", "bench", "collectives-n2.json")
    assert main(["predict", "--calibration", os.path.join(ROOT, "docs", "bench",
                                                           "calibrate-n2.txt"),
                 "--compare", bench, "--bytes", "8,16MiB"]) == 0
    out = capsys.readouterr().out
    measured = read_measured(bench, "allreduce")[2, 16 * MiB, "ring"]
    assert f" / {measured:.0f} |" in next(line for line in out.splitlines()
                                          if line.startswith("| 2 | 16 MiB"))


def test_table_and_draw_command_lines(capsys, tmp_path):
    assert main(["table", "ring", "--collective", "allgather", "--ranks", "3"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[2] == "   0 | →1:0 ←2:2 | →2:1 ←0:0 | →0:2 ←1:1"
    assert main(["table", "butterfly"]) == 2
    png = tmp_path / "rh.png"
    assert main(["draw", "recursive_halving", "--collective", "reduce_scatter", "--ranks", "4",
                 "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_drawing_knows_what_each_rank_holds():
    out, snaps = draw_run("recursive_halving", "reduce_scatter", 4)
    assert len(snaps) == out.sim.steps + 1 == 3
    assert snaps[0] == [[1] * 4] * 4  # at the start: only its own input everywhere
    assert snaps[1][0] == [2, 2, 1, 1]  # after step 0, rank 0's half holds 0's and 2's inputs
    assert [snaps[2][r][r] for r in range(4)] == [4] * 4  # then block r is complete on rank r
    _, bcast = draw_run("binomial", "bcast", 4)
    assert [row[0] for row in bcast[1]] == [4, 4, 4, 0]  # step 0: the root sends to 2, then 1


def test_help_runs():
    done = subprocess.run([sys.executable, "-m", "mpidp.sim", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "table,draw,check,volume,predict" in done.stdout
