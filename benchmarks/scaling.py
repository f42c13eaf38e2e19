"""Weak-scaling efficiency of data-parallel training, predicted from the simulator.

    python benchmarks/scaling.py                      # the table and the sweep (about 15 minutes)
    python benchmarks/scaling.py --points             # the three published points only
    python benchmarks/scaling.py --png benchmarks/results/scaling.png --json ...

A step is the forward pass, then the backward pass with the gradients' allreduces overlapped as
DistributedDataParallel overlaps them: parameters in reverse order cut into buckets (the first
1 MiB, then 25 MiB), each bucket's allreduce started when backward has produced its last
gradient and the previous bucket's allreduce is done; the step ends when backward and the last
allreduce are. Backward produces gradients layer by layer, last layer first, each after a share of
backward time proportional to its layer's multiply-adds (forward : backward = 1 : 2). Weak
scaling: the per-GPU batch is fixed, so efficiency at P GPUs = step time without communication /
step time at P (or, for a baseline of B GPUs, step(B) / step(P)).

Each allreduce's time is the simulator's (torch_ddl.sim: the real planner and algorithms over a
modelled network) for that bucket's bytes, P ranks, the machine's GPUs per host and its link
figures; the cost model's prediction for the same plan is kept beside it. Plans: `auto` (what
ddl picks), `ring` (a flat ring over every GPU: gloo's and Baidu's ring allreduce, NCCL's ring)
and `two-level` (a ring within each host, then rings across hosts: Horovod's hierarchical
allreduce; multidim with one colour). The hardware figures and their sources are in
docs/scaling.md; nothing here is fitted to a published result.

Beside that prediction: each published efficiency as time lost per step, as a share of the step's
whole simulated allreduce, and each point predicted from the mean share of the other two (leave
one out: nothing taken from the point itself), with how far each assumed input moves it.
"""

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TORCH_DDL_TRACE_ENTRIES", "0")

MIB = 1 << 20

# ResNet (He et al. 2016; torchvision's layout): bottleneck blocks per stage.
BLOCKS = {50: [3, 4, 6, 3], 101: [3, 4, 23, 3]}


def resnet_layers(depth, classes=1000, image=224):
    """The parameter tensors of ResNet-`depth` in forward order, each as (elements, multiply-adds
    of the layer it belongs to, forward, per image): torchvision's ResNet-50 has 25 557 032
    parameters, ResNet-101 44 549 160."""
    layers = []

    def conv(cin, cout, k, size):
        layers.append((cin * cout * k * k, cin * cout * k * k * size * size))

    def bn(c, size):
        layers.append((c, c * size * size))  # weight
        layers.append((c, 0))  # bias

    size = image // 2
    conv(3, 64, 7, size)
    bn(64, size)
    size //= 2  # max pool
    cin = 64
    for stage, count in enumerate(BLOCKS[depth]):
        width = 64 << stage
        for block in range(count):
            stride = 2 if stage > 0 and block == 0 else 1
            out = size // stride
            conv(cin, width, 1, size)
            bn(width, size)
            conv(width, width, 3, out)
            bn(width, out)
            conv(width, width * 4, 1, out)
            bn(width * 4, out)
            if block == 0:
                conv(cin, width * 4, 1, out)
                bn(width * 4, out)
            cin, size = width * 4, out
    layers.append((cin * classes, cin * classes))  # fc weight
    layers.append((classes, 0))  # fc bias
    return layers


def buckets(layers, first=1 * MIB, cap=25 * MIB, element=4):
    """DDP's buckets: parameters in reverse order, a bucket closed once it holds its limit (the
    first 1 MiB, the rest 25 MiB). Each as (bytes, fraction of backward done when its last
    gradient is ready)."""
    total = sum(m for _, m in layers) or 1
    out, size, done, limit = [], 0, 0.0, first
    for elements, macs in reversed(layers):
        done += macs / total
        size += elements * element
        if size >= limit:
            out.append((size, done))
            size, limit = 0, cap
    if size:
        out.append((size, done))
    return out


class Allreduce:
    """Allreduce times from the simulator, cached by (machine, ranks, bytes, plan)."""

    PLANS = {"auto": dict(algo="auto", colors=0, waves=0),
             "ring": dict(algo="ring", colors=0, waves=0),
             "two-level": dict(algo="multidim", colors=1, waves=0)}

    def __init__(self, cache=None, path=None):
        from torch_ddl import _C
        self._C = _C
        self.cache = cache if cache is not None else {}
        self.path = path  # where each new result is saved at once

    def __call__(self, machine, ranks, nbytes, plan):
        if ranks == 1:
            return 0.0, 0.0, "none"
        key = json.dumps([machine["links"], machine["reduce_bw"], machine["gpus_per_host"],
                          machine.get("hosts_per_rack", 0), ranks, nbytes, plan])
        if key not in self.cache:
            per_host = min(machine["gpus_per_host"], ranks)
            r = self._C.simulate(dict(
                host_sizes=[], ranks=ranks, ranks_per_host=per_host,
                hosts_per_rack=machine.get("hosts_per_rack", 0),
                links=machine["links"], reduce_bw=machine["reduce_bw"],
                copy_bw=machine["reduce_bw"], payload=False, timeout_ms=600000,
                collective="allreduce", bytes=nbytes, seed=1, kill_ranks=[], kill_fraction=0.5,
                **self.PLANS[plan]))
            self.cache[key] = (r["sim_us"] * 1e-6, r["model_us"] * 1e-6, r["algo"])
            if self.path:
                Path(self.path).write_text(json.dumps(self.cache))
        return tuple(self.cache[key])


def step_seconds(compute, bucket_list, allreduce, model=False, overlap=True, split=None):
    """Forward, then backward with each bucket's allreduce started when its gradients are ready
    and the previous allreduce is done (overlap=False: once backward is done, as frameworks that
    do not overlap). `allreduce(bytes)` -> (sim seconds, model seconds). `split`: (forward,
    backward) seconds where measured, else compute split 1 : 2."""
    forward, backward = split if split else (compute / 3, compute * 2 / 3)
    end = 0.0
    for nbytes, done in bucket_list:
        done = done if overlap else 1.0
        took = allreduce(nbytes)[1 if model else 0]
        end = max(end, done * backward) + took
    return forward + max(backward, end)


# The machines and the published points (docs/scaling.md gives each figure's source).
MACHINES = {
    "minsky": dict(  # IBM S822LC "Minsky": 4 P100 (NVLink), InfiniBand EDR between hosts
        gpus_per_host=4, links="0:10us:40GB,1:5us:12.5GB", reduce_bw=200e9),
    "big-basin": dict(  # Facebook Big Basin: 8 P100 (NVLink), 50 Gbit/s Ethernet
        gpus_per_host=8, links="0:10us:20GB,1:20us:6.25GB", reduce_bw=200e9),
    "uber": dict(  # 4 Pascal GPUs per server (PCIe), 25 Gbit/s RoCE
        gpus_per_host=4, links="0:10us:10GB,1:10us:3.125GB", reduce_bw=200e9),
}
POINTS = [
    dict(name="PowerAI DDL, ResNet-50, 256 P100", machine="minsky", depth=50, gpus=256,
         batch=32, images_per_s=None, baseline=1, plan="auto", published=0.95),
    dict(name="Goyal et al., ResNet-50, 256 P100", machine="big-basin", depth=50, gpus=256,
         batch=32, images_per_s=None, baseline=8, plan="two-level", published=0.90),
    dict(name="Horovod, ResNet-101, 512 Pascal", machine="uber", depth=101, gpus=512,
         batch=64, images_per_s=None, baseline=1, plan="ring", published=0.90),
]
# A P100 trains 138 ResNet-50 images/s at batch 32 (Goyal et al.: 90 epochs of 1.28 M images in
# 29 hours on 8 GPUs); ResNet-101 at the same multiply-adds per second.
P100_RESNET50 = 138.0


def images_per_s(point):
    if point["images_per_s"]:
        return point["images_per_s"]
    macs = {d: sum(m for _, m in resnet_layers(d)) for d in (50, point["depth"])}
    return P100_RESNET50 * macs[50] / macs[point["depth"]]
# What the answer moves with: each assumed input halved and doubled (compute: -25 %, x2).
SENSITIVITY = [("GPU images/s x0.75", "images_per_s", 0.75),
               ("GPU images/s x2 (or half the batch)", "images_per_s", 2.0),
               ("host link bandwidth x0.5", "bw1", 0.5), ("host link bandwidth x2", "bw1", 2.0),
               ("host link latency x0.5", "lat1", 0.5), ("host link latency x2", "lat1", 2.0)]


def scaled_machine(machine, what, factor):
    m = dict(machine)
    levels = [e.split(":") for e in m["links"].split(",")]
    if what == "bw1":
        levels[1][2] = f"{float(levels[1][2][:-2]) * factor:g}GB"
    if what == "lat1":
        levels[1][1] = f"{float(levels[1][1][:-2]) * factor:g}us"
    m["links"] = ",".join(":".join(e) for e in levels)
    return m


def stepper(point, machine, allreduce, plan=None, model=False, overlap=True):
    """step(P): the seconds of one of the point's training steps at P GPUs of `machine`."""
    bl = buckets(resnet_layers(point["depth"]))
    compute = point["batch"] / images_per_s(point)
    return lambda p: step_seconds(
        compute, bl, lambda b: allreduce(machine, p, b, plan or point["plan"]), model, overlap)


def whole_allreduce(point, machine, gpus, allreduce, plan=None):
    """The seconds of every bucket's allreduce of one step at `gpus`, hidden or not."""
    return sum(allreduce(machine, gpus, b, plan or point["plan"])[0]
               for b, _ in buckets(resnet_layers(point["depth"])))


def efficiency(point, machine, gpus, allreduce, plan=None, model=False, overlap=True):
    step = stepper(point, machine, allreduce, plan, model, overlap)
    return step(point["baseline"]) / step(gpus)


def losses(point, machine, allreduce):
    """What the published efficiency says in time, beside the model, in seconds: the step at the
    baseline B as the model has it, the extra time per step at the point's GPUs that the
    published efficiency implies (step(B) / efficiency - step(B)), the model's own extra time,
    and the step's whole allreduce time at those GPUs."""
    step = stepper(point, machine, allreduce)
    base = step(point["baseline"])
    return (base, base / point["published"] - base, step(point["gpus"]) - base,
            whole_allreduce(point, machine, point["gpus"], allreduce))


def varied(point, what=None, factor=1.0):
    """The point and its machine with one assumed input scaled (as SENSITIVITY names them)."""
    machine = MACHINES[point["machine"]]
    if what == "images_per_s":
        return dict(point, images_per_s=images_per_s(point) * factor), machine
    if what:
        return point, scaled_machine(machine, what, factor)
    return point, machine


def leave_one_out(i, allreduce, changed=(), what=None, factor=1.0):
    """Point i's efficiency from the mean share of the step's allreduce that the other points'
    published results leave unhidden; `changed`: the points whose input `what` is scaled.
    Returns (efficiency, share)."""
    shares = []
    for j, point in enumerate(POINTS):
        p, m = varied(point, what, factor) if j in changed else varied(point)
        base, published, _, whole = losses(p, m, allreduce)
        if j == i:
            mine = (base, whole)
        else:
            shares.append(published / whole)
    share = sum(shares) / len(shares)
    return mine[0] / (mine[0] + share * mine[1]), share


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", action="store_true", help="the published points only")
    parser.add_argument("--gpus", default="4,8,16,32,64,128,256,512,1024")
    parser.add_argument("--sweep", default="minsky",
                        help="machines to sweep over --gpus (comma-separated: "
                             + ", ".join(MACHINES) + ")")
    parser.add_argument("--cache", default="", help="a JSON file of simulated allreduces to reuse")
    parser.add_argument("--json", default="", help="write the table and the sweep here")
    parser.add_argument("--png", default="", help="write the plot here")
    args = parser.parse_args()

    cache = {}
    if args.cache and Path(args.cache).exists():
        cache = json.loads(Path(args.cache).read_text())
    allreduce = Allreduce(cache, args.cache or None)
    for depth, expected in ((50, 25557032), (101, 44549160)):
        got = sum(e for e, _ in resnet_layers(depth))
        assert got == expected, f"ResNet-{depth}: {got} parameters, not {expected}"

    print("Published points (weak scaling; the allreduce plan the paper used):")
    print(f"{'':38} {'plan':>9} {'published':>9} {'predicted':>9} {'model':>6} {'diff':>6}"
          f" {'no overlap':>10}  sensitivity (predicted)")
    results = {"points": [], "sweep": {}}
    for point in POINTS:
        machine = MACHINES[point["machine"]]
        sim = efficiency(point, machine, point["gpus"], allreduce)
        mod = efficiency(point, machine, point["gpus"], allreduce, model=True)
        serial = efficiency(point, machine, point["gpus"], allreduce, overlap=False)
        moves = []
        for label, what, factor in SENSITIVITY:
            if what == "images_per_s":
                e = efficiency(dict(point, images_per_s=images_per_s(point) * factor), machine,
                               point["gpus"], allreduce)
            else:
                e = efficiency(point, scaled_machine(machine, what, factor), point["gpus"],
                               allreduce)
            moves.append((label, e))
        low, high = min(e for _, e in moves), max(e for _, e in moves)
        print(f"{point['name']:38} {point['plan']:>9} {point['published'] * 100:8.0f}%"
              f" {sim * 100:8.1f}% {mod * 100:5.1f}% {(sim - point['published']) * 100:+5.1f}"
              f" {serial * 100:9.1f}%  {low * 100:.1f} - {high * 100:.1f}%", flush=True)
        results["points"].append(dict(point, predicted=sim, model=mod, no_overlap=serial,
                                      sensitivity=dict(moves)))
    for point in results["points"]:
        print(f"  {point['name']}: " + ", ".join(f"{k} {v * 100:.1f}%"
                                                 for k, v in point["sensitivity"].items()))
    print("\nThe published losses in time (per step, over the baseline), against the step's whole"
          " allreduce time:")
    print(f"{'':38} {'published':>9} {'model':>7} {'allreduce':>9} {'published/allreduce':>19}")
    for point in results["points"]:
        base, published, modelled, whole = losses(point, MACHINES[point["machine"]], allreduce)
        point.update(published_loss_s=published, model_loss_s=modelled, allreduce_s=whole,
                     base_s=base)
        print(f"{point['name']:38} {published * 1e3:7.1f}ms {modelled * 1e3:5.1f}ms"
              f" {whole * 1e3:7.1f}ms {published / whole * 100:18.0f}%")
    # Leave one out: each point predicted with the share of the allreduce left unhidden that the
    # other two papers' results give (their mean), nothing taken from the point itself. Its
    # sensitivity: each assumed input halved and doubled on the point's own machine, then on the
    # other two's.
    print("\nLeave one out: each point's efficiency from the unhidden share of the other two:")
    print(f"{'':38} {'share':>6} {'published':>9} {'predicted':>9} {'diff':>6}"
          "  sensitivity (predicted)")
    for i, point in enumerate(POINTS):
        e, share = leave_one_out(i, allreduce)
        moves = []
        for _, what, factor in SENSITIVITY:
            for changed in ([i], [j for j in range(len(POINTS)) if j != i]):
                moves.append(leave_one_out(i, allreduce, changed, what, factor)[0])
        results["points"][i].update(loo_share=share, loo_predicted=e,
                                    loo_range=[min(moves), max(moves)])
        print(f"{point['name']:38} {share * 100:5.0f}% {point['published'] * 100:8.0f}%"
              f" {e * 100:8.1f}% {(e - point['published']) * 100:+5.1f}"
              f"  {min(moves) * 100:.1f} - {max(moves) * 100:.1f}%", flush=True)

    if not args.points:
        gpus = [int(g) for g in args.gpus.split(",")]
        for point in POINTS:
            if point["machine"] not in args.sweep.split(","):
                continue
            machine = MACHINES[point["machine"]]
            print(f"\n{point['name']} machine ({point['machine']}, "
                  f"{machine['gpus_per_host']} GPUs per host, {machine['links']}), "
                  f"ResNet-{point['depth']}, batch {point['batch']}: efficiency")
            print(f"{'GPUs':>6} " + " ".join(f"{p:>10}" for p in Allreduce.PLANS) +
                  "   (cost model: " + " ".join(Allreduce.PLANS) + ")")
            rows = []
            for g in gpus:
                sims = [efficiency(dict(point, baseline=1), machine, g, allreduce, plan)
                        for plan in Allreduce.PLANS]
                mods = [efficiency(dict(point, baseline=1), machine, g, allreduce, plan,
                                   model=True) for plan in Allreduce.PLANS]
                rows.append(dict(gpus=g, sim=dict(zip(Allreduce.PLANS, sims)),
                                 model=dict(zip(Allreduce.PLANS, mods))))
                print(f"{g:6d} " + " ".join(f"{e * 100:9.1f}%" for e in sims) +
                      "   (" + " ".join(f"{e * 100:.1f}%" for e in mods) + ")", flush=True)
            # The same machine under frameworks that leave the papers' mean share unhidden.
            share = sum(p["published_loss_s"] / p["allreduce_s"]
                        for p in results["points"]) / len(results["points"])
            compute = point["batch"] / images_per_s(point)
            print(f"with {share * 100:.0f} % of each step's allreduce unhidden (the three papers'"
                  " mean share):")
            for row in rows:
                row["unhidden"] = {
                    plan: compute / (compute + share * whole_allreduce(point, machine, row["gpus"],
                                                                       allreduce, plan))
                    for plan in Allreduce.PLANS}
                print(f"{row['gpus']:6d} " + " ".join(f"{row['unhidden'][p] * 100:9.1f}%"
                                                      for p in Allreduce.PLANS))
            results["sweep"][point["name"]] = rows
    if args.cache:
        Path(args.cache).write_text(json.dumps(allreduce.cache))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if args.png and results["sweep"]:
        plot(results, args.png)


def plot(results, png):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweeps = list(results["sweep"].items())
    fig, axes = plt.subplots(1, len(sweeps) + 1, figsize=(5.2 * (len(sweeps) + 1), 4))
    for ax, (name, rows) in zip(axes, sweeps):
        for i, plan in enumerate(Allreduce.PLANS):
            ax.plot([r["gpus"] for r in rows], [r["sim"][plan] * 100 for r in rows], marker="o",
                    color=f"C{i}", label=f"{plan}, DDP's overlap")
            ax.plot([r["gpus"] for r in rows], [r["unhidden"][plan] * 100 for r in rows],
                    marker=".", linestyle="--", color=f"C{i}",
                    label=f"{plan}, the papers' unhidden share")
        point = next(p for p in results["points"] if p["name"] == name)
        ax.plot([point["gpus"]], [point["published"] * 100], "k*", markersize=12,
                label="published")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{name.split(',')[0]}'s machine, ResNet-{point['depth']}", fontsize=9)
        ax.set_xlabel("GPUs")
        ax.set_ylabel("weak-scaling efficiency (%)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[-1]
    names = [p["name"].split(",")[0] for p in results["points"]]
    x = range(len(names))
    ax.plot(x, [p["published"] * 100 for p in results["points"]], "k*", markersize=12,
            label="published")
    ax.plot(x, [p["predicted"] * 100 for p in results["points"]], "ro",
            label="predicted (DDP's overlap)")
    ax.plot(x, [p["no_overlap"] * 100 for p in results["points"]], "bv",
            label="predicted, no overlap")
    ax.plot([i + 0.06 for i in x], [p["loo_predicted"] * 100 for p in results["points"]], "gs",
            label="unhidden share of the other two")
    for i, p in enumerate(results["points"]):
        low, high = min(p["sensitivity"].values()), max(p["sensitivity"].values())
        ax.plot([i, i], [low * 100, high * 100], "r-", linewidth=1)
        low, high = p["loo_range"]
        ax.plot([i + 0.06, i + 0.06], [low * 100, high * 100], "g-", linewidth=1)
    ax.set_xticks(list(x), names, fontsize=8)
    ax.set_title("the published points (their machines, their plans)", fontsize=9)
    ax.set_ylabel("efficiency (%)")
    ax.set_ylim(70, 101)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    print(f"wrote {png}")


if __name__ == "__main__":
    sys.exit(main())
