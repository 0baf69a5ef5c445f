"""Across emulated hosts: collectives over real TCP through shaped links, and faults.

Each test builds a `mpidp.cluster.Cluster` (network namespaces, a bridge, veth
links with a tbf rate limit), launches this file as the rank program with the
mpich wheel's mpiexec, and tears everything down. They need root and iproute2
(`ip`, `tc`); without them they skip with the reason. As root with both, they
run, and fail if the cluster cannot be built: a probe that wrongly says "no"
must not turn them all into skips. The launching ones skip under Open MPI
(``make test MPI=openmpi``): they pass Hydra's options. Run by hand::

    python -m mpidp.cluster run --hosts 4 -- python tests/test_cluster.py collectives
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
from mpi4py import MPI

from mpidp import cluster

HERE = os.path.dirname(os.path.abspath(__file__))
RATE_BPS = 1e9 / 8  # the links' rate in bytes/s ("1gbit")
BIG = 1 << 20  # float64 items: an 8 MiB all-reduce for the traffic checks
WATCHDOG_S = 5.0



def _why_not() -> str | None:
    """Why these tests cannot run here, from the facts alone (not cluster.available())."""
    if sys.platform != "linux":
        return "the emulated cluster needs Linux network namespaces"
    if os.geteuid() != 0:
        return "the emulated cluster needs root (network namespaces, tc)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"the emulated cluster needs iproute2 ({', '.join(missing)} not found)"
    return None


WHY = None if __name__ == "__main__" else _why_not()  # the rank program probes nothing
needs_cluster = pytest.mark.skipif(WHY is not None, reason=WHY or "")
OPEN_MPI = __name__ != "__main__" and "Open MPI" in MPI.Get_library_version()
needs_hydra = pytest.mark.skipif(OPEN_MPI, reason="launches ranks with MPICH's Hydra options "
                                 "(-launcher ssh, -hosts, -genv); this MPI library is Open MPI")


# ---------------------------------------------------------------- the rank programs


def rank_collectives() -> None:
    """Every collective, every algorithm, against the native MPI call; then busbw."""
    import numpy as np
    from mpi4py import MPI

    import mpidp
    from mpidp import watchdog

    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(rank)
    with watchdog.guard(60, "collectives across hosts"):
        for count in (1, 1001, 100_000):
            for dtype, op, mop in ((np.int64, mpidp.SUM, MPI.SUM),
                                   (np.float64, mpidp.MAX, MPI.MAX)):
                x = rng.integers(-1000, 1000, count).astype(dtype)
                expect = np.empty_like(x)
                comm.Allreduce(x, expect, op=mop)
                for algorithm in mpidp.ALGORITHMS["allreduce"]:  # read now: it grows
                    got = np.empty_like(x)
                    mpidp.allreduce(comm, x, got, op=op, algorithm=algorithm)
                    assert np.array_equal(got, expect), ("allreduce", algorithm, count)
                    h = mpidp.iallreduce(comm, x, got * 0, op=op, algorithm=algorithm)
                    watchdog.wait(h, 30)
            per = count // n + 1
            x = rng.integers(-1000, 1000, per * n).astype(np.int64)
            expect = np.empty(per, np.int64)
            comm.Reduce_scatter_block(x, expect, op=MPI.SUM)
            for algorithm in mpidp.ALGORITHMS["reduce_scatter"]:
                got = np.empty(per, np.int64)
                mpidp.reduce_scatter(comm, x, got, algorithm=algorithm)
                assert np.array_equal(got, expect), ("reduce_scatter", algorithm, count)
            mine = rng.integers(-1000, 1000, per).astype(np.int64)
            expect = np.empty(per * n, np.int64)
            comm.Allgather(mine, expect)
            for algorithm in mpidp.ALGORITHMS["allgather"]:
                got = np.empty(per * n, np.int64)
                mpidp.allgather(comm, mine, got, algorithm=algorithm)
                assert np.array_equal(got, expect), ("allgather", algorithm, count)
            for root in sorted({0, n - 1}):
                expect = rng.integers(-1000, 1000, count).astype(np.int64)
                comm.Bcast(expect, root=root)  # everyone gets root's draw
                for algorithm in mpidp.ALGORITHMS["bcast"]:
                    got = expect.copy() if rank == root else np.zeros_like(expect)
                    mpidp.bcast(comm, got, root=root, algorithm=algorithm)
                    assert np.array_equal(got, expect), ("bcast", algorithm, root, count)

        # bus bandwidth of an 8 MiB all-reduce: native, then mpidp's ring
        x = np.ones(BIG)
        out = {}
        for name in ("native", "ring"):
            comm.Barrier()
            t0 = MPI.Wtime()
            for _ in range(2):
                if name == "native":
                    comm.Allreduce(MPI.IN_PLACE, x)
                else:
                    mpidp.allreduce(comm, mpidp.IN_PLACE, x, algorithm="ring")
            seconds = comm.allreduce(MPI.Wtime() - t0, op=MPI.MAX) / 2
            out[name] = x.nbytes * 2 * (n - 1) / n / seconds
    if rank == 0:
        print("BUSBW " + json.dumps(out), flush=True)


def rank_placed(algorithm: str, items: int, calls: int) -> None:
    """`calls` in-place all-reduces of `items` float32 with `algorithm`, checked."""
    import numpy as np
    from mpi4py import MPI

    import mpidp
    from mpidp.collectives import placement

    comm = MPI.COMM_WORLD
    x = np.ones(items, np.float32)
    for _ in range(calls):
        x.fill(1.0)
        mpidp.allreduce(comm, mpidp.IN_PLACE, x, algorithm=algorithm)
        assert (x == comm.Get_size()).all(), algorithm
    hosts = placement.placement(comm)  # collective (learned already, or now: every rank)
    if comm.Get_rank() == 0:
        print("PLACEMENT " + json.dumps(hosts), flush=True)


def rank_fault(mode: str, logdir: str) -> None:
    """All-reduce in a loop until the test cuts a link or a rank dies; the watchdog ends it.

    Each rank's stderr goes to its own file: a rank whose link is down cannot send
    its output back to mpiexec, and the test must see that it, too, gave up.
    """
    import numpy as np
    from mpi4py import MPI

    import mpidp
    from mpidp import watchdog

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    log = os.open(os.path.join(logdir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.dup2(log, 2)
    x = np.ones(1 << 16)
    # "link": the guard's timer ends the blocking loop; "kill": the polling wait's
    # TimeoutError does (MPIDP_TIMEOUT), and the guard turns it into an Abort
    with watchdog.guard(WATCHDOG_S * (1 if mode == "link" else 4), "all-reduce loop") as dog:
        for step in range(100_000):
            if mode == "kill" and rank == 1 and step == 20:
                h = mpidp.iallreduce(comm, mpidp.IN_PLACE, x)  # die mid-collective
                h.test()
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == "link" and step == 20:
                open(os.path.join(logdir, f"ready{rank}"), "w").close()
            if mode == "link":
                mpidp.allreduce(comm, mpidp.IN_PLACE, x)  # blocking: the timer thread's case
            else:
                watchdog.wait(mpidp.iallreduce(comm, mpidp.IN_PLACE, x))  # MPIDP_TIMEOUT
            x /= comm.Get_size()
            dog.kick()
    sys.stderr.write(f"rank {rank}: loop ended without a fault\n")


def rank_ddp() -> None:
    """DataParallel across hosts, with its defaults and with every progress design forced
    on, against one process on the global batch (computed here, on every rank)."""
    import numpy as np
    from mpi4py import MPI

    from mpidp.training import MLP, SGD, DataParallel, softmax_cross_entropy

    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    sizes, local, steps = [24, 32, 16, 5], 6, 3
    rng = np.random.default_rng(5)
    x = rng.standard_normal((steps, n * local, sizes[0]))  # (steps, global batch, D)
    y = rng.integers(0, sizes[-1], (steps, n * local))

    def trained(ddp_kw: dict | None) -> dict:
        model = MLP(sizes, dtype="float64", seed=rank if ddp_kw is not None else 0)
        opt = SGD(model.params, model.grads, lr=0.1, momentum=0.9)
        ddp = None if ddp_kw is None else DataParallel(model, comm, **ddp_kw)
        for t in range(steps):
            mine = slice(rank * local, (rank + 1) * local) if ddp else slice(None)
            front = ddp or model
            _, d = softmax_cross_entropy(front.forward(x[t, mine]), y[t, mine])
            front.backward(d)
            opt.step()
        if ddp is not None:
            designs[repr(ddp_kw)] = (ddp.across, ddp.thread and ddp.thread.kind,
                                      len(ddp.reducer.pieces) > 0)
            ddp.close()
        return model.params

    designs = {}
    expect = trained(None)
    for kw in ({}, {"bucket_mb": 0}, {"bucket_mb": 0, "piece_mb": 0.0005,
                                       "progress_thread": "wait"},
               {"bucket_mb": 0, "piece_mb": "auto", "progress_thread": "poll"}):
        got = trained(kw)
        for name in expect:
            np.testing.assert_allclose(got[name], expect[name], rtol=1e-11, atol=1e-13,
                                       err_msg=f"{kw} {name}")
    if rank == 0:
        print("DESIGNS " + json.dumps(designs), flush=True)


def rank_timeline(steps: int) -> None:
    """`DataParallel`'s defaults (one bucket per layer) on a model whose backward is long
    beside the link's time for its gradients: each step's bucket timeline and, from the
    trace, where the pieces completed."""
    import numpy as np
    from mpi4py import MPI

    from mpidp.trace import Tracer
    from mpidp.training import MLP, SGD, DataParallel, softmax_cross_entropy
    from mpidp.training.trainer import blas_threads

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    model = MLP([256, 512, 512, 512, 10], dtype="float32", seed=0)  # 2.53 MiB of gradients
    opt = SGD(model.params, model.grads, lr=1e-3)
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((2048, 256)).astype(np.float32)  # (b, D)
    y = rng.integers(0, 10, 2048)
    tracer = Tracer(rank)
    rows = []
    with blas_threads(1), DataParallel(model, comm, bucket_mb=0) as ddp:
        tracer.follow(ddp)
        for _ in range(steps):
            comm.Barrier()
            t0 = time.perf_counter()  # every rank's step starts here, within microseconds
            _, d = softmax_cross_entropy(ddp.forward(x), y)
            ddp.backward(d)
            opt.step()
            start = ddp.t_backward - t0  # times from the step's start, comparable across ranks
            rows.append({"backward_end": start + ddp.timings["backward"],
                         "complete": [start + b["complete"] for b in ddp.bucket_times()]})
        design = {"across": ddp.across, "progress": ddp.thread and ddp.thread.kind,
                  "pieces": sum(map(len, ddp.reducer.pieces.values()))}
    marks = [e for e in tracer.events if e.get("ph") == "i" and e["name"].startswith("piece")]
    ranks = comm.gather(rows, root=0)
    if rank == 0:
        print("TIMELINE " + json.dumps({"design": design, "ranks": ranks,
                                        "marks": len(marks)}), flush=True)


# ---------------------------------------------------------------- the tests

def rank_torch() -> None:
    """mpidp.torch's start-up across hosts: the store rank 0 serves is found at an address
    the other hosts reach (not its loopback), and a collective and DDP's step run."""
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    import mpidp.torch
    from mpidp.torch import start

    rank = MPI.COMM_WORLD.Get_rank()
    mpidp.torch.init_process_group()
    t = torch.arange(4, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(t)
    size = dist.get_world_size()
    assert torch.equal(t, torch.arange(4, dtype=torch.float32) * size * (size + 1) / 2), t
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2))
    model(torch.ones(5, 3) * rank).sum().backward()
    grads = [torch.zeros(2, 3) for _ in range(size)]
    dist.all_gather(grads, model.module.weight.grad)
    assert all(torch.equal(g, grads[0]) for g in grads)  # averaged alike on every rank
    hosts = MPI.COMM_WORLD.bcast(start.addresses(), root=0)
    # one write, its newline in it (print writes the end apart: the ranks' lines interleaved)
    sys.stdout.write(f"TORCH rank {rank} store at {hosts[0]}\n")
    sys.stdout.flush()
    dist.destroy_process_group()


def _rank_argv(*args: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), *args]


def _clean() -> None:
    ns, links = cluster.names()
    assert (ns, links) == ([], []), f"left behind: {ns} {links}"


@needs_cluster
@needs_hydra
@pytest.mark.parametrize("hosts, ppn", [(2, 1), (4, 1), (2, 2)])
def test_collectives_across_hosts_match_native_and_cross_the_links(hosts, ppn):
    with cluster.Cluster(hosts, rate="1gbit") as c:
        before = [c.counters(h) for h in range(hosts)]
        result = c.run(hosts * ppn, _rank_argv("collectives"), ppn=ppn, timeout=150,
                       capture=True)
        after = [c.counters(h) for h in range(hosts)]
    _clean()
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    busbw = json.loads(out.split("BUSBW ", 1)[1].splitlines()[0])
    # Traffic crossed the links: each host sent at least what it must send for the
    # two ring all-reduces of G = 8 MiB (its ring edge to the next host carries
    # 2·G·(N-1)/N each) and the two native ones (at least 2·G·(H-1)/H across H hosts).
    # TCP headers only add to that.
    n, g = hosts * ppn, 8 * BIG
    need = 2 * 2 * g * (n - 1) / n + 2 * 2 * g * (hosts - 1) / hosts
    for h in range(hosts):
        sent = after[h]["rx"] - before[h]["rx"]  # the bridge side receives what h sends
        assert sent >= 0.95 * need, f"host {h} sent {sent} B over its link, expected >= {need}"
    # ...and through the rate limit: with one rank per host every byte crosses a link,
    # so no all-reduce's busbw beats the link rate (shared memory gives ~1 GB/s here).
    # With more ranks per host MPICH's native one may reduce within a host first.
    for name, value in busbw.items():
        if name == "ring" or ppn == 1:
            assert value <= 1.15 * RATE_BPS, f"{name} busbw {value / 1e9:.3f} GB/s beats link"


@needs_cluster
@needs_hydra
def test_data_parallel_across_hosts_equals_one_rank_with_its_defaults_and_every_design():
    """3 hosts x 1 rank (a non-power of two, every exchange over a link): every progress
    design equals one rank on the global batch; piece_mb="auto" sees the hosts."""
    with cluster.Cluster(3, rate="1gbit") as c:
        result = c.run(3, _rank_argv("ddp"), timeout=150, capture=True)
    _clean()
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    designs = json.loads(out.split("DESIGNS ", 1)[1].splitlines()[0])
    assert designs["{}"] == [True, None, True], designs  # the default: pieces across hosts
    assert designs["{'bucket_mb': 0, 'piece_mb': 'auto', 'progress_thread': 'poll'}"][:2] \
        == [True, "poll"], designs
    assert designs["{'bucket_mb': 0, 'piece_mb': 0.0005, 'progress_thread': 'wait'}"] == \
        [False, "wait", True], designs


@needs_cluster
@needs_hydra
def test_mpidp_torch_starts_across_hosts_with_nothing_to_set():
    """3 hosts x 1 rank: init_process_group() under mpiexec alone (no MASTER_ADDR/PORT);
    the store's address that rank 0 sends is one the other hosts reach."""
    pytest.importorskip("torch", reason="mpidp.torch needs PyTorch (make test installs it)")
    with cluster.Cluster(3, rate="1gbit") as c:
        result = c.run(3, _rank_argv("torch"), timeout=120, capture=True)
    _clean()
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    stores = dict(re.findall(r"TORCH rank (\d) store at (\d+\.\d+\.\d+\.\d+)", out))
    assert sorted(stores) == ["0", "1", "2"], out  # every rank, its line whole or not
    assert not any(a.startswith("127.") for a in stores.values()), out


@needs_cluster
@needs_hydra
def test_the_default_completes_every_bucket_but_the_last_during_backward_across_hosts():
    """Issue 25's item 4: with DataParallel's defaults, across 2 hosts at 1 Gbit/s, a
    backward about three times the link's time for the gradients (local batch 2048)
    hides the reductions: every bucket but the last (the first layer's, written last)
    is complete before backward ends on the rank that finishes backward last (a rank
    ahead of its peer waits for the peer's gradients, not for the link). Plain polling
    between layers does not do it (a bucket's rendezvous messages wait for the next
    layer's poll): measured, its first bucket completed after backward ended
    (docs/overlap.md)."""
    steps = 6
    with cluster.Cluster(2, rate="1gbit") as c:
        result = c.run(2, _rank_argv("timeline", str(steps)), timeout=150, capture=True)
    _clean()
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    got = json.loads(out.split("TIMELINE ", 1)[1].splitlines()[0])
    assert got["design"]["across"] and got["design"]["pieces"] > 4, got["design"]
    late = []  # (step, bucket, ms after backward ended), after 2 warm-up steps
    for k in range(2, steps):
        row = max((r[k] for r in got["ranks"]), key=lambda r: r["backward_end"])
        late += [(k, b, round(1e3 * (done - row["backward_end"]), 2))
                 for b, done in enumerate(row["complete"][:-1]) if done > row["backward_end"]]
    # one step in four may lose a bucket to a scheduler hiccup (a shared machine)
    assert len({k for k, _, _ in late}) <= (steps - 2) // 4, \
        f"buckets complete only after backward: {late} ({got['ranks']})"
    assert got["marks"] >= steps * got["design"]["pieces"], got  # the trace shows them


def _wait_for(predicate, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return False


@needs_cluster
@needs_hydra
def test_a_host_cut_off_mid_collective_ends_every_rank(tmp_path):
    hosts = 4
    with cluster.Cluster(hosts, rate="1gbit") as c:
        proc_start = time.monotonic()
        result = {}
        job = threading.Thread(target=lambda: result.update(r=c.run(
            hosts, _rank_argv("fault", "link", str(tmp_path)), timeout=90, capture=True)))
        job.start()
        ready = _wait_for(lambda: all((tmp_path / f"ready{r}").exists() for r in range(hosts)),
                          60)
        cut_at = time.monotonic()
        c.link(hosts - 1, "down")  # the last host drops off the network
        job.join()
        elapsed = time.monotonic() - cut_at
        stragglers, timed_out = c.stragglers, c.timed_out
    _clean()
    r = result["r"]
    logs = {rank: (tmp_path / f"rank{rank}.log").read_text() for rank in range(hosts)}
    report = f"{r.stdout}\n{r.stderr}\n" + "\n".join(f"rank {k}: {v}" for k, v in logs.items())
    assert ready, f"ranks did not start within 60 s ({time.monotonic() - proc_start:.0f} s)\n"
    assert r.returncode != 0 and not timed_out, report  # failed, and not by our outer timeout
    assert elapsed < WATCHDOG_S + 20, f"took {elapsed:.0f} s after the cut\n{report}"
    # the cut-off rank cannot be reached by mpiexec: it ended itself, saying why
    assert "made no progress for 5 s" in logs[hosts - 1], report
    assert any("made no progress" in logs[rank] for rank in range(hosts - 1)), report
    assert not stragglers, f"processes outlived the job: {stragglers}\n{report}"


@needs_cluster
@needs_hydra
@pytest.mark.parametrize("cleanup", ["hydra", "watchdog"])
def test_a_rank_killed_mid_collective_ends_every_rank(tmp_path, cleanup):
    """Hydra's default kills the job when a rank dies; without it, the watchdog does."""
    hosts = 2
    extra = ["-disable-auto-cleanup"] if cleanup == "watchdog" else []
    with cluster.Cluster(hosts, rate="1gbit") as c:
        t0 = time.monotonic()
        r = c.run(hosts, _rank_argv("fault", "kill", str(tmp_path)), timeout=90, capture=True,
                  env={"MPIDP_TIMEOUT": str(WATCHDOG_S)}, extra=extra)
        elapsed = time.monotonic() - t0
        stragglers, timed_out = c.stragglers, c.timed_out
    _clean()
    log0 = (tmp_path / "rank0.log").read_text()
    report = f"{r.stdout}\n{r.stderr}\nrank 0: {log0}"
    assert r.returncode != 0 and not timed_out, report
    assert elapsed < 60, report
    assert not stragglers, f"processes outlived the job: {stragglers}\n{report}"
    if cleanup == "hydra":
        assert "BAD TERMINATION" in r.stdout + r.stderr and "10.77.0.2" in r.stdout, report
    else:
        assert "not complete after 5 s" in log0, report
        assert "TimeoutError" in log0, report


@needs_cluster
@needs_hydra
def test_training_with_a_host_cut_off_ends_every_rank(tmp_path):
    """examples/train_mlp.py under MPIDP_TIMEOUT: a link lost mid-training ends the job
    with the watchdog's message, within a bounded time, and leaves no process behind."""
    train = os.path.join(os.path.dirname(HERE), "examples", "train_mlp.py")
    ckpt = str(tmp_path / "run.npz")
    argv = [sys.executable, train, "--epochs", "200", "--progress", "never",
            "--checkpoint", ckpt, "--checkpoint-every", "5"]
    with cluster.Cluster(2, rate="20mbit") as c:
        result = {}
        job = threading.Thread(target=lambda: result.update(r=c.run(
            2, argv, timeout=120, capture=True, env={"MPIDP_TIMEOUT": str(WATCHDOG_S)})))
        job.start()
        started = _wait_for(lambda: os.path.exists(ckpt), 60)  # training is under way
        cut_at = time.monotonic()
        c.link(1, "down")
        job.join()
        elapsed = time.monotonic() - cut_at
        stragglers, timed_out = c.stragglers, c.timed_out
    _clean()
    r = result["r"]
    report = f"{r.stdout}\n{r.stderr}"
    assert started, "no checkpoint within 60 s: training never got going\n" + report
    assert r.returncode != 0 and not timed_out, report
    assert elapsed < WATCHDOG_S + 25, f"took {elapsed:.0f} s after the cut\n{report}"
    assert "made no progress" in report, report
    assert not stragglers, f"processes outlived the job: {stragglers}\n{report}"


@needs_cluster
@needs_hydra
def test_training_resumed_after_a_fault_matches_an_uninterrupted_run(tmp_path):
    """Kill a rank mid-training across hosts; resuming from the last checkpoint ends
    with bitwise the same parameters as a run that was never interrupted."""
    import numpy as np

    train = os.path.join(os.path.dirname(HERE), "examples", "train_mlp.py")
    steps = 60  # of 66 in 3 epochs of digits
    common = [sys.executable, train, "--epochs", "3", "--max-steps", str(steps),
              "--progress", "never", "--checkpoint-every", "5"]
    full, cut = str(tmp_path / "full.npz"), str(tmp_path / "cut.npz")
    # 20 Mbit/s: ~30 ms per step for the 17k-parameter MLP, time enough to strike
    with cluster.Cluster(2, rate="20mbit") as c:
        r = c.run(2, [*common, "--checkpoint", full], timeout=120, capture=True)
        assert r.returncode == 0, r.stdout + r.stderr
        result = {}
        job = threading.Thread(target=lambda: result.update(r=c.run(
            2, [*common, "--checkpoint", cut], timeout=120, capture=True)))
        job.start()
        assert _wait_for(lambda: os.path.exists(cut), 60), "no checkpoint was written"
        victims = _pids_of(c.namespaces[1], b"train_mlp")  # the rank on host 1
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        job.join()
        killed = result["r"]
        assert victims and killed.returncode != 0, killed.stdout + killed.stderr
        with np.load(cut) as f:
            at = int(f["optim/steps"])
        assert 0 < at < steps, f"the fault came too late (checkpoint at step {at})"
        r = c.run(2, [*common, "--checkpoint", cut, "--resume"], timeout=120, capture=True)
        assert r.returncode == 0, r.stdout + r.stderr
    _clean()
    with np.load(full) as a, np.load(cut) as b:
        params = [k for k in a.files if k.startswith(("param/", "optim/"))]
        assert params and int(b["optim/steps"]) == steps
        for k in params:
            assert np.array_equal(a[k], b[k]), f"{k} differs after resuming from step {at}"


@needs_cluster
@needs_hydra
def test_bytes_through_a_host_link_hierarchical_vs_the_articles_order():
    """2 hosts x 2 ranks: the hierarchical all-reduce sends G through a host's link per
    direction, Rabenseifner in the article's order 2·G (the link counters, TCP/MPI
    overhead and the launch's own traffic within 3% + 0.5 MiB), nearest first G too;
    the ranks learn the placement themselves (Split_type)."""
    items, calls = 1 << 20, 2  # G = 4 MiB, twice
    G = 4 * items
    with cluster.Cluster(2, rate="1gbit") as c:
        through = {}
        for algorithm in ("hierarchical", "rabenseifner_article", "rabenseifner"):
            before = c.counters(0)
            r = c.run(4, _rank_argv("placed", algorithm, str(items), str(calls)), ppn=2,
                      timeout=60, capture=True)
            after = c.counters(0)
            assert r.returncode == 0, r.stdout + r.stderr
            assert "PLACEMENT [0, 0, 1, 1]" in r.stdout, r.stdout
            # the bridge side: rx is what host 0 sent, tx what it received
            through[algorithm] = [(after[k] - before[k]) / (calls * G) for k in ("rx", "tx")]
    _clean()
    slack = 0.03 + (1 << 19) / (calls * G)
    for algorithm, want in (("hierarchical", 1.0), ("rabenseifner_article", 2.0),
                            ("rabenseifner", 1.0)):
        for got in through[algorithm]:
            assert want <= got <= want + slack, (algorithm, through)


@needs_cluster
def test_the_cluster_is_available_as_root_with_iproute2():
    ok, why = cluster.available()
    assert ok, f"root, with ip and tc, yet: {why}"


def _start_run(*extra: str) -> subprocess.Popen:
    """`python -m mpidp.cluster run --hosts 2 -- sleep 60`, once its ranks sleep."""
    cmd = [sys.executable, "-m", "mpidp.cluster", "run", "--hosts", "2", *extra, "--",
           "sleep", "60"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if not _wait_for(lambda: len(cluster.names()[0]) == 2 and _sleeping(2), 30):
        proc.kill()
        pytest.fail("the cluster's ranks did not start: " + proc.communicate()[0])
    return proc


@needs_cluster
@needs_hydra
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_tears_down(sig):
    proc = _start_run()
    try:
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, out
    assert f"interrupted ({signal.Signals(sig).name}); torn down" in out, out
    _clean()
    assert not _sleeping(1)


@needs_cluster
@needs_hydra
def test_down_refuses_while_a_job_holds_the_cluster_unless_forced():
    proc = _start_run()
    try:
        down = subprocess.run([sys.executable, "-m", "mpidp.cluster", "down"],
                              capture_output=True, text=True, timeout=60)
        assert down.returncode == 2, down.stdout + down.stderr
        assert f"in use by pid {proc.pid}" in down.stderr and "sleep 60" in down.stderr, \
            down.stderr
        assert "--force" in down.stderr
        assert len(cluster.names()[0]) == 2 and _sleeping(2), "down tore the job's hosts down"
        assert proc.poll() is None, "the job died"
        forced = subprocess.run([sys.executable, "-m", "mpidp.cluster", "down", "--force"],
                                capture_output=True, text=True, timeout=60)
        assert forced.returncode == 0, forced.stdout + forced.stderr
        assert "removed: mpidpc-h" in forced.stdout, forced.stdout
        proc.communicate(timeout=30)  # its job was killed: the run ends
    finally:
        proc.kill()
        proc.wait()
    _clean()
    again = subprocess.run([sys.executable, "-m", "mpidp.cluster", "down"],
                           capture_output=True, text=True, timeout=60)  # no holder now
    assert again.returncode == 0 and "removed: nothing" in again.stdout, again.stderr


@needs_cluster
@needs_hydra
def test_a_killed_run_is_cleaned_up_by_the_next():
    cmd = [sys.executable, "-m", "mpidp.cluster", "run", "--hosts", "2", "--", "sleep", "60"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait_for(lambda: _sleeping(2), 30)
    finally:
        proc.kill()  # SIGKILL: no teardown; mpiexec and the ranks live on
        proc.wait()
    ns, links = cluster.names()
    assert len(ns) == 2 and links, "expected the killed run's hosts to be left behind"
    with cluster.Cluster(3) as c:  # cleans up first, then builds its own
        assert sorted(cluster.names()[0]) == c.namespaces
        assert not _sleeping(1)
    _clean()


def _pids_of(ns: str, word: bytes, program: bool = False) -> list[int]:
    """Live processes in namespace `ns` with `word` in their command line (or as it)."""
    pids = []
    for pid in cluster._live_pids(ns):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if (argv[0] == word) if program else any(word in arg for arg in argv):
                pids.append(pid)
        except OSError:  # gone meanwhile
            pass
    return pids


def _sleeping(count: int) -> bool:
    """`count` ranks of `sleep` are running in our namespaces."""
    return sum(len(_pids_of(ns, b"sleep", program=True)) for ns in cluster.names()[0]) >= count


@pytest.mark.skipif(sys.platform != "linux", reason="network namespaces are Linux-only")
def test_without_root_it_says_so(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    ok, why = cluster.available()
    assert not ok and "root" in why
    with pytest.raises(cluster.ClusterError, match="root"):
        cluster.Cluster(2).up()


@needs_cluster
def test_a_delay_needs_netem():
    if cluster.netem_available():
        with cluster.Cluster(2, delay="1ms") as c:
            out = subprocess.run(["tc", "qdisc", "show", "dev", f"{c.prefix}-v0"],
                                 capture_output=True, text=True).stdout
            assert "netem" in out and "tbf" in out, out
    else:
        with pytest.raises(cluster.ClusterError, match="netem"):
            cluster.Cluster(2, delay="1ms").up()
    _clean()


# ---------------------------------------------------------------- the command line

@pytest.mark.parametrize("argv, says", [
    (["up", "--hosts", "0"], "--hosts: must be >= 1"),
    (["run", "--hosts", "-2", "--", "true"], "--hosts: must be >= 1"),
    (["up", "--hosts", "251"], "--hosts: must be <= 250"),
    (["up", "--hosts", "two"], "--hosts: invalid"),
    (["up", "--subnet", "10.77.0/24"], "--subnet: '10.77.0/24' is not a subnet"),
    (["up", "--subnet", "10.77.0.1/24"], "--subnet: '10.77.0.1/24' is not a subnet"),
    (["up", "--subnet", "8.8.8.0/24"], "--subnet: 8.8.8.0/24 is not a private subnet"),
    (["bench", "--hosts", "7", "--subnet", "10.77.0.0/29"], "7 hosts do not fit in 10.77.0.0/29"),
    (["bench", "--ppn", "0"], "--ppn: must be >= 1"),
    (["bench", "--iters", "0"], "--iters: must be >= 1"),
    (["run", "-n", "0", "--", "true"], "--np: must be >= 1"),
    (["run", "-n", "5", "--ppn", "2", "--", "true"], "5 ranks do not fit on 2 hosts x 2"),
    (["run", "--timeout", "0", "--", "true"], "--timeout: must be > 0"),
    (["run", "--rate", "fast", "--", "true"], "--rate: 'fast'"),
    (["up", "--delay", "soon"], "--delay: 'soon'"),
])
def test_a_bad_flag_is_a_usage_error_before_anything_is_built(argv, says, monkeypatch, capsys):
    """argparse's error (exit 2, one line after the usage), and no cluster is ever made:
    as root, a flag checked too late would build the namespaces first."""
    from mpidp.cluster import __main__ as cli

    def built(*args, **kwargs):
        raise AssertionError(f"{argv}: a Cluster was made")

    monkeypatch.setattr(cli, "Cluster", built)
    with pytest.raises(SystemExit) as exit:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit.value.code == 2, err
    assert says in err and "Traceback" not in err, err
    assert err.splitlines()[-1].startswith("python -m mpidp.cluster"), err



@pytest.mark.parametrize("command, runs", [
    (["python", "-m", "mpidp", "x.py"], [sys.executable, "-m", "mpidp", "x.py"]),
    (["python3", "-c", "pass"], [sys.executable, "-c", "pass"]),
    (["/usr/bin/python3", "x.py"], ["/usr/bin/python3", "x.py"]),  # a path: as given
    (["true"], ["true"]),
])
def test_run_takes_python_for_its_own_interpreter(command, runs, monkeypatch):
    """``run -- python ...`` runs the launcher's own interpreter (the venv's, where mpidp and
    mpi4py are), not the first python on PATH (the system's, without them)."""
    from mpidp.cluster import __main__ as cli

    started = []

    class Recorded:  # the cluster, minus the namespaces: what it would run
        timed_out = False

        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def run(self, np_, argv, **kw):
            started.append(argv)
            return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(cli, "Cluster", Recorded)
    monkeypatch.setattr(cli.signal, "signal", lambda *args: None)  # the test's own handlers
    assert cli.main(["run", "--hosts", "2", "--", *command]) == 0
    assert started == [runs]


if __name__ == "__main__":
    if sys.argv[1] == "collectives":
        rank_collectives()
    elif sys.argv[1] == "ddp":
        rank_ddp()
    elif sys.argv[1] == "torch":
        rank_torch()
    elif sys.argv[1] == "timeline":
        rank_timeline(int(sys.argv[2]))
    elif sys.argv[1] == "placed":
        rank_placed(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1] == "fault":
        rank_fault(sys.argv[2], sys.argv[3])


def test_the_launcher_is_written_by_the_one_writer_no_link_followed(tmp_path):
    """A link planted at the launcher's old temporary name (launcher.sh.tmp) is neither
    followed nor made executable; the launcher itself is written whole, mode 0755."""
    import stat
    import types

    from mpidp.cluster import Cluster

    victim = tmp_path / "victim"
    victim.write_text("keep")
    os.chmod(victim, 0o600)
    os.symlink(victim, tmp_path / "launcher.sh.tmp")
    fake = types.SimpleNamespace(addresses=["10.0.0.1"], namespaces=["ns0"],
                                 launcher=str(tmp_path / "launcher.sh"))
    Cluster._write_launcher(fake)
    assert victim.read_text() == "keep" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert stat.S_IMODE(os.stat(fake.launcher).st_mode) == 0o755
    assert "10.0.0.1) ns=ns0" in open(fake.launcher).read()
