"""``python -m mpidp.cluster bench``'s ranks: busbw of the native all-reduce against
each of mpidp's, per size, and the bytes through each host's link (`bench_rank`)."""

from __future__ import annotations


def bench_rank(sizes_mib: list[float], iters: int, rate_bps: float | None,
               algorithms: list[str] | None = None) -> None:
    """The ranks' side of ``bench``: busbw of native vs each mpidp all-reduce, per size.

    Sizes and algorithms are interleaved in one run, so a ratio compares figures
    taken under the same load. busbw = bytes·2(N-1)/N / time, the rate each link
    must carry for a ring all-reduce with one rank per host. With several ranks per
    host the lower bound is lower (2 hosts: G per direction, busbw up to 1.5x the
    link rate with 2 ranks per host). Bytes per link: what the host's link carried
    per call, out and in, read from its counters (the host side of the veth that
    `Cluster.counters` reads from the bridge side) by each host's first rank; the
    busiest host, as a multiple of the vector's bytes G.
    """
    import numpy as np
    from mpi4py import MPI

    from ..collectives import api, placement

    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    hosts = placement.placement(comm)
    leader = hosts.index(hosts[comm.Get_rank()]) == comm.Get_rank()
    algorithms = algorithms or [a for a in api.ALGORITHMS["allreduce"] if a != "auto"]

    def link() -> np.ndarray:  # bytes out of and into this host so far (0 on other ranks)
        if not leader:
            return np.zeros(2)
        stats = "/sys/class/net/mpidp0/statistics/"
        try:
            return np.array([int(open(stats + f"{k}_bytes").read()) for k in ("tx", "rx")],
                            float)
        except OSError:  # not in an emulated host: no counters
            return np.full(2, np.nan)

    if comm.Get_rank() == 0:
        link_rate = f"{rate_bps / 1e9:.3f} GB/s" if rate_bps else "unlimited"
        print(f"# {n} ranks on {max(hosts) + 1} hosts; link {link_rate}; busbw in GB/s "
              f"(median of {iters}); ratio = mpidp / native; link% = busbw / link rate; "
              "out/in = bytes per call through the busiest host link, in G", flush=True)
    for size in sizes_mib:
        x = np.ones(max(1, int(size * 2**20) // 4), dtype=np.float32)
        row, through = {}, {}
        for name in ("native", *algorithms):
            times = []
            for i in range(iters + 1):  # the first one warms up connections and pools
                comm.Barrier()
                if i == 1:
                    before = link()
                t0 = MPI.Wtime()
                if name == "native":
                    comm.Allreduce(MPI.IN_PLACE, x)
                else:
                    api.allreduce(comm, api.IN_PLACE, x, algorithm=name)
                dt = comm.allreduce(MPI.Wtime() - t0, op=MPI.MAX)
                if i:
                    times.append(dt)
                x.fill(1.0)
            mine = (link() - before) / iters / x.nbytes  # the barriers' bytes: negligible
            through[name] = np.empty(2)
            comm.Allreduce(mine, through[name], op=MPI.MAX)
            row[name] = x.nbytes * 2 * (n - 1) / n / float(np.median(times)) / 1e9
        if comm.Get_rank() == 0:
            for name, busbw in row.items():
                pct = f"{100 * busbw * 1e9 / rate_bps:5.0f}%" if rate_bps else ""
                out, into = through[name]
                print(f"{size:8.2f} MiB  {name:>20}  {busbw:7.4f}  "
                      f"ratio {busbw / row['native']:5.2f}  link{pct}  "
                      f"out/in {out:5.2f} {into:5.2f} G", flush=True)
