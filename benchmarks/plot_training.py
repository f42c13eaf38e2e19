"""The training side's plot from the results of make bench-data and make bench-easgd.

    python benchmarks/plot_training.py   # reads benchmarks/results/{data,easgd}_bench.txt

Left: the host's summed PSS once 4 ranks loaded 256 MiB of JPEG, per mode, as a multiple of the
files (with no DataLoader worker and with 2 per rank, the latter at the end of an epoch, less
the disk mode's growth). Right: steps/s as a multiple of DDP's across 2 emulated hosts x 2 ranks
at 1 Gbit/s, by tau, for ElasticAveraging with and without overlap.
"""

import re
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def data_rows(text):
    """{workers: {mode: (loaded, beyond)}} from data_bench.txt."""
    rows, workers = {}, None
    for line in text.splitlines():
        m = re.search(r"(\d+) workers each", line)
        if m:
            workers = int(m.group(1))
            continue
        parts = line.split()
        if workers is not None and parts and parts[0] in ("disk", "memory", "copy"):
            rows.setdefault(workers, {})[parts[0]] = (float(parts[5].rstrip("x")),
                                                      float(parts[7].rstrip("x")))
    return rows


def easgd_rows(text):
    """{(tau, overlap): x DDP} from easgd_bench.txt."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"EASGD tau (\d+)( ov)?\s+[\d.]+\s+([\d.]+)x", line)
        if m:
            rows[(int(m.group(1)), bool(m.group(2)))] = float(m.group(3))
    return rows


def main():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = data_rows((RESULTS / "data_bench.txt").read_text())
    easgd = easgd_rows((RESULTS / "easgd_bench.txt").read_text())
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    modes = ["disk", "memory", "copy"]
    labels = ["files from disk", "InMemoryDataset", "own copy per rank"]
    width = 0.38
    for k, (workers, what, column) in enumerate([(0, "loaded, no worker", 0),
                                                 (2, "end of epoch, 2 workers per rank", 1)]):
        values = [data[workers][m][column] for m in modes]
        bars = left.bar([i + (k - 0.5) * width for i in range(3)], values, width, label=what)
        left.bar_label(bars, fmt="%.2fx", fontsize=8)
    left.set_xticks(range(3), labels)
    left.set_ylabel("host PSS grown / files' size")
    left.set_title("4 ranks, 256 MiB of JPEG")
    left.legend(fontsize=8)
    taus = sorted({t for t, _ in easgd})
    for overlap in (False, True):
        right.plot(taus, [easgd[(t, overlap)] for t in taus], marker="o",
                   label="ElasticAveraging" + (", overlap" if overlap else ""))
    right.axhline(1.0, color="grey", linestyle="--", label="DDP")
    right.set_xscale("log", base=2)
    right.set_xticks(taus, [str(t) for t in taus])
    right.set_xlabel("tau (steps between averagings)")
    right.set_ylabel("steps/s / DDP's")
    right.set_title("2 emulated hosts x 2 ranks, 1 Gbit/s, 25.6 M parameters")
    right.legend(fontsize=8)
    fig.tight_layout()
    out = RESULTS / "training.png"
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
