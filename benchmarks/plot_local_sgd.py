"""The plot of make bench-local-sgd: test accuracy against training time, per task and link.

    python benchmarks/plot_local_sgd.py   # reads benchmarks/results/local_sgd.json

One panel per task (rows) and link (columns): each method's accuracy at each evaluation against
the training time (the slowest rank's, evaluation not counted) up to it, on a log scale; the
dashed line is the task's target.
"""

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from local_sgd_bench import METHODS, TARGETS

    runs = json.loads((RESULTS / "local_sgd.json").read_text())
    tasks = list(dict.fromkeys(k.split("@")[0] for k in runs))
    links = list(dict.fromkeys(k.split("@")[1] for k in runs))
    fig, axes = plt.subplots(len(tasks), len(links), figsize=(5.5 * len(links), 4 * len(tasks)),
                             squeeze=False)
    for i, task in enumerate(tasks):
        for j, link in enumerate(links):
            ax, got = axes[i][j], runs[f"{task}@{link}"]
            for method in METHODS:
                if method in got:
                    curve = got[method]["curve"]
                    ax.plot([t for _, t, _ in curve], [a for _, _, a in curve], marker=".",
                            label=method)
            ax.axhline(TARGETS[task], color="grey", linestyle="--", linewidth=0.8)
            ax.set_xscale("log")
            ax.set_title(f"{task}, 2 hosts x 2 ranks at {link}")
            ax.set_xlabel("training time (s)")
            ax.set_ylabel("test accuracy")
            lowest = min(a for m in METHODS if m in got for _, _, a in got[m]["curve"])
            ax.set_ylim(max(0.5, lowest - 0.02), 1.0)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "local_sgd.png", dpi=110)
    print(f"wrote {RESULTS / 'local_sgd.png'}")


if __name__ == "__main__":
    main()
