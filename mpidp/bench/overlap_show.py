"""What `python -m mpidp.bench overlap` shows of its summary: the table it prints
(`report`), its CSV (`write_csv`) and its picture of each bucket's launch and
completion beside the step's phases (`plot`)."""

from __future__ import annotations

from .. import files
from .output import figure_format


def write_csv(s: dict, path: str) -> None:
    """One row per mode: the table `report` prints."""
    import csv

    def write(f) -> None:
        w = csv.writer(f)
        w.writerow(["ranks", "mode", "step_ms", "backward_ms", "exposed_comm_ms",
                    "hidden_fraction", "efficiency"])
        for mode, e in s["modes"].items():
            w.writerow([s["ranks"], mode, f"{e['step_ms']:.4f}", f"{e['backward_ms']:.4f}",
                        f"{e['exposed_comm_ms']:.4f}", e.get("hidden_fraction", ""),
                        e.get("efficiency", "")])

    files.replace(path, write, text=True)


MODE_COLORS = {"compute": "C7", "compute+blocks": "C9", "serial": "C0", "overlap": "C1",
               "overlap+thread": "C2",
               "overlap+wait": "C3", "overlap+blocks": "C4", "overlap+pieces": "C5",
               "pieces+wait": "C6", "default": "C8"}


def plot(s: dict, path: str) -> None:
    """Left: median step time per mode. Right: each bucket's all-reduce, launch to
    completion, against the backward pass (one row per bucket). One colour per mode in
    both panels, each panel's key beside it, off the data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(s["modes"])
    spare = iter(())
    color = {m: MODE_COLORS.get(m) or next(spare, "black") for m in modes}
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 3.8))
    for mode in modes:
        left.bar(mode, s["modes"][mode]["step_ms"], color=color[mode], label=mode)
    left.set_ylabel("median step (ms)")
    left.set_title(f"{s['ranks']} ranks, step time")
    plt.setp(left.get_xticklabels(), rotation=35, ha="right")  # long names, apart
    bucketed = [m for m in modes if "buckets" in s["modes"][m]]
    for i, mode in enumerate(bucketed):
        e = s["modes"][mode]
        for b in e["buckets"]:
            y = b["bucket"] + 0.8 * i / len(bucketed)  # each mode its lane in the bucket's band
            right.plot([b["launch_ms"], b["complete_ms"]], [y, y], lw=4, color=color[mode],
                       label=mode if b["bucket"] == 0 else None)
        right.axvline(e["backward_ms"], color=color[mode], ls=":", lw=1)
    right.set_xlabel("ms after backward starts (dotted: backward ends)")
    right.set_ylabel("bucket")
    right.set_yticks(range(max((len(s["modes"][m].get("buckets", [])) for m in modes),
                               default=0)))
    right.set_title("bucket all-reduce: launch to completion")
    for ax in (left, right):
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    files.replace(path, lambda f: fig.savefig(f, dpi=110, format=figure_format(path)))
    plt.close(fig)


def report(s: dict) -> None:
    grads_mb = sum(s["modes"][m]["buckets"][k]["mb"] for m in s["modes"] if "buckets" in
                   s["modes"][m] for k in range(len(s["modes"][m]["buckets"]))) / max(
        1, sum("buckets" in v for v in s["modes"].values()))
    print(f"mpidp overlap benchmark: {s['ranks']} ranks, MLP {s['sizes']} ({s['dtype']}, "
          f"{grads_mb:.2f} MiB of gradients), local batch {s['batch']}, "
          f"bucket_mb {s['bucket_mb']}, algorithm {s['algorithm']}, piece_mb "
          f"{s.get('piece_mb')}, async progress {s.get('async_progress', '0')}, load average "
          f"{' '.join(f'{v:.2f}' for v in s.get('load_average', []))}")
    print(f"{'mode':16s} {'step ms':>9s} {'backward ms':>12s} {'exposed comm ms':>16s} "
          f"{'cpu ms':>8s} {'sys ms':>7s} {'hidden':>7s} {'efficiency':>10s}")
    for mode, e in s["modes"].items():
        hidden = f"{e['hidden_fraction']:7.2f}" if "hidden_fraction" in e else f"{'':7s}"
        eff = f"{e['efficiency']:10.2f}" if "efficiency" in e else f"{'':10s}"
        cpu = f"{e['cpu_ms']:8.2f}" if "cpu_ms" in e else f"{'':8s}"
        system = f"{e['sys_ms']:7.2f}" if "sys_ms" in e else f"{'':7s}"
        print(f"{mode:16s} {e['step_ms']:9.2f} {e['backward_ms']:12.2f} "
              f"{e['exposed_comm_ms']:16.2f} {cpu} {system} {hidden} {eff}")
    for mode, e in s["modes"].items():
        if "buckets" not in e or mode == "serial":
            continue
        print(f"{mode}: buckets on rank 0, ms after backward starts "
              f"(backward lasts {e['backward_ms']:.2f} ms)")
        for b in e["buckets"]:
            pieces = f"  ({len(b['pieces_ms'])} pieces)" if "pieces_ms" in b else ""
            print(f"  bucket {b['bucket']} layers {','.join(map(str, b['layers'])):8s} "
                  f"{b['mb']:7.2f} MiB  launch {b['launch_ms']:8.2f}  complete "
                  f"{b['complete_ms']:8.2f}{pieces}")
