"""Tables (Markdown) and the plot from compare.json's runs."""

from __future__ import annotations

import shlex
import statistics
from collections import defaultdict

MIB = 2**20
ORDER = ["plain", "dataloader", "batchcast", "batchcast+ring", "mpqueue", "tensorsocket"]
COLORS = {"dataloader": "C0", "batchcast": "C1", "mpqueue": "C2", "tensorsocket": "C3",
          "batchcast+ring": "C4", "plain": "C7"}
NAMES = {"plain": "plain loop", "dataloader": "DataLoader per trainer", "batchcast": "batchcast",
         "batchcast+ring": "batchcast, larger ring", "mpqueue": "mp queue fan-out",
         "tensorsocket": "TensorSocket 0.0.5"}


# ---- helpers ------------------------------------------------------------------------------
def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def spread(xs, fmt="{:.0f}", scale=1.0) -> str:
    xs = [x * scale for x in xs if x is not None]
    if not xs:
        return "–"
    m = statistics.median(xs)
    if len(xs) == 1:
        return fmt.format(m)
    return f"{fmt.format(m)} [{fmt.format(min(xs))}, {fmt.format(max(xs))}]"


def groups(doc) -> dict:
    g = defaultdict(list)
    for r in doc["runs"]:
        g[(r["config"], r["system"])].append(r)
    return g


def measured(runs):
    return [r for r in runs if "aggregate" in r and not r.get("skipped")]


def ratio(a, b) -> str:
    return f"{a / b:.2f}×" if a and b else "–"


def delivered(runs) -> str:
    """'exact' when every trainer of every run got every sample once per epoch;
    else the worst run's shortfall."""
    runs = measured(runs)
    if not runs:
        return "–"
    if all(r["exact"] for r in runs):
        return "exact"
    worst = min(runs, key=lambda r: sum(
        e["distinct"] - e["duplicated"] for t in r["trainers"] for e in t.get("epochs", [])))
    n = worst["trainers"][0].get("expected_per_epoch", 0)
    parts = []
    for t in worst["trainers"]:
        eps = t.get("epochs", [])
        if not eps:
            parts.append(f"bs {t.get('batch_size', '?')}: nothing")
            continue
        d = min(e["distinct"] for e in eps)
        dup = max(e["duplicated"] for e in eps)
        parts.append(f"{d}/{n}" + (f" +{dup} dup" if dup else "")
                     + (f", {t['corrupt']} corrupt" if t.get("corrupt") else ""))
    bad = sum(not r["exact"] for r in runs)
    return f"**{bad}/{len(runs)} runs short**: " + ", ".join(parts)


def notes(runs) -> str:
    out = []
    for r in runs:
        if r.get("skipped"):
            out.append(r["skipped"])
        out += r.get("errors", [])
    seen, uniq = set(), []
    for n in out:
        short = n[:300]
        if short not in seen:
            seen.add(short)
            uniq.append(short)
    return "; ".join(uniq)


# ---- console ------------------------------------------------------------------------------
def header(env) -> str:
    m = env["machine"]
    return (f"compare: {env['date']}, {m['cpu']}, {m['cpus']} CPUs (all processes on {m['cpu_set']}), "
            f"python {env['python']}, torch {env['torch']}, batchcast {env['batchcast']}"
            f" ({env.get('batchcast_git')})"
            + (f", tensorsocket {env['tensorsocket']}" if env.get("tensorsocket") else "")
            + f"; GPU step {env['gpu_step']}")


def one_line(r) -> str:
    head = f"{r['config']:<11} {r['system']:<15} #{r['repeat']}"
    if r.get("skipped"):
        return f"{head} skipped: {r['skipped']}"
    if "aggregate" not in r:
        return f"{head} FAILED: {'; '.join(r['errors'])[:400]}"
    pss = (r.get("pss_peak") or {}).get("total", 0) / MIB
    line = (f"{head} {r['aggregate']:7.0f} samples/s over {r['window_s']:.2f} s, "
            f"{r['cpu_per_sample_ms'] or 0:.2f} CPU ms/sample, PSS {pss:.0f} MiB, "
            f"{'exact' if r['exact'] else 'NOT exact'}")
    if r["experiment"] == "overhead":
        t = r["trainers"][0]
        if t.get("batches"):
            line += (f", {t['proc_cpu_s'] / t['batches'] * 1e6:.0f} us CPU/batch, next() "
                     f"{(t.get('next_median_s') or 0) * 1e6:.0f} us median")
    if r["errors"]:
        line += f" | {'; '.join(r['errors'])[:300]}"
    return line


# ---- Markdown -----------------------------------------------------------------------------
def markdown(doc) -> str:
    env = doc["env"]
    m = env["machine"]
    s = env["settings"]
    g = groups(doc)
    configs = {c["id"]: c for c in doc["configs"]}
    lines = [
        f"# batchcast against the alternatives ({env['date'][:10]})",
        "",
        f"- Machine: {m['cpu']}, {m['cpus']} CPUs, {m['memory_gib']} GiB; every process of a "
        f"configuration on CPUs {m['cpu_set']}; {m['arch']}, Linux {m['kernel']}.",
        f"- Python {env['python']}, torch {env['torch']}, batchcast {env['batchcast']} "
        f"(git {env.get('batchcast_git')})"
        + (f", TensorSocket {env['tensorsocket']}" if env.get("tensorsocket") else "") + ".",
        f"- Command: `{' '.join(['python benchmarks/compare.py', *map(shlex.quote, env.get('argv', []))])}` "
        f"({doc.get('elapsed_s', 0) / 60:.1f} min). {s['repeats']} run(s) of each configuration, "
        "systems interleaved; cells are median [min, max].",
        f"- {env['gpu_step'][0].upper()}{env['gpu_step'][1:]}. DataLoaders: {s['workers']} workers, "
        "shuffled with a fixed seed; batchcast ring / queue depth "
        f"{s['slots']} batches unless said otherwise.",
        "- Aggregate: samples every trainer received / one common window (the start signal, "
        "given to all processes at once after every one is set up, to the last trainer's last "
        "step); start-up (loader workers, ring, connections) is inside it. Steady: samples that "
        "arrived while every trainer was running (from the last trainer's first batch to the "
        "first trainer's last), over that span. First batch: seconds from the start to a "
        "trainer's first batch. CPU: every process of the configuration, loader workers "
        "included, from the start to the last trainer's last step, per sample delivered. PSS: "
        "summed over all processes, the peak of samples taken once every trainer has its first "
        f"batch and then every {s.get('pss_interval', 2):g} s. Waiting: the trainer's share of its "
        "time inside next().",
        "",
    ]
    lines += targets(doc, g, configs)
    for exp, title in (("busy", "Trainer count, synthetic CPU-bound dataset"),
                       ("jpeg", "Trainer count, ImageNet-like JPEG pipeline")):
        ids = [c["id"] for c in doc["configs"] if c["experiment"] == exp]
        if ids:
            lines += scale_table(doc, g, configs, ids, title)
    for exp, fn in (("mixed", per_trainer_table), ("speeds", per_trainer_table),
                    ("exact", exact_table), ("overhead", overhead_table)):
        for c in doc["configs"]:
            if c["experiment"] == exp:
                lines += fn(doc, g, c)
    return "\n".join(lines) + "\n"


def workload_text(c) -> str:
    w = c["workload"]
    if w["kind"] == "busy":
        return (f"synthetic, {w['cost_ms']:g} ms CPU per sample, float32 {'x'.join(map(str, w['shape']))}, "
                f"{w['samples']} samples per epoch")
    if w["kind"] == "jpeg":
        return (f"{w['samples']} JPEGs (~100 KB, 400-640 x 300-500) per epoch: PIL decode, "
                f"RandomResizedCrop({w.get('size', 224)}), flip, normalize")
    return f"{w['samples'] // w['loader_batch']} batches made up front (no loading cost)"


def targets(doc, g, configs) -> list[str]:
    rows = []

    def agg(cid, system):
        return med([r["aggregate"] for r in measured(g.get((cid, system), []))])

    for exp in ("busy", "jpeg"):
        ids = [c["id"] for c in doc["configs"] if c["experiment"] == exp]
        one_trainer = med([r["per_trainer"][0] for r in measured(g.get((f"{exp}/K=1", "dataloader"), []))])
        cells, met, per = [], True, []
        for cid in ids:
            k = len(configs[cid]["trainers"])
            if k > 4:
                continue
            b, d = agg(cid, "batchcast"), agg(cid, "dataloader")
            if b and d:
                cells.append(f"K={k}: {b / d:.2f}× (goal {0.95 * k:.2f}×)")
                met &= b / d >= 0.95 * k
            runs = measured(g.get((cid, "batchcast"), []))
            if runs and one_trainer:
                rates = [med([r["per_trainer"][i] for r in runs]) for i in range(k)]
                per.append(f"K={k}: {min(rates) / one_trainer:.0%}")
        if cells:
            rows.append((f"{exp}: aggregate, batchcast / DataLoader per trainer (K ≤ 4)",
                         ", ".join(cells), "≥ 0.95·K", met))
        if per:
            worst = min(float(p.split(": ")[1].rstrip("%")) for p in per) / 100
            rows.append((f"{exp}: slowest batchcast trainer / one unshared DataLoader trainer (K=1)",
                         ", ".join(per), "≥ 95%", worst >= 0.95))
    for exp in ("busy", "jpeg"):
        ids = [c["id"] for c in doc["configs"] if c["experiment"] == exp]
        cells, cpu_cells, met, cpu_met = [], [], True, True
        for cid in ids:
            k = len(configs[cid]["trainers"])
            b, t = measured(g.get((cid, "batchcast"), [])), measured(g.get((cid, "tensorsocket"), []))
            if not b or not t:
                continue
            if not med([r["aggregate"] for r in t]):
                cells.append(f"K={k}: TensorSocket delivered nothing")
                met = cpu_met = False
                continue
            ba, ta = med([r["aggregate"] for r in b]), med([r["aggregate"] for r in t])
            bc_, tc = med([r["cpu_per_sample_ms"] for r in b]), med([r["cpu_per_sample_ms"] for r in t])
            exact = all(r["exact"] for r in b)
            cells.append(f"K={k}: {ba / ta:.2f}×" + ("" if exact else " (batchcast not exact!)"))
            cpu_cells.append(f"K={k}: {bc_ / tc:.2f}")
            met &= ba / ta >= 1.5 and exact
            cpu_met &= bc_ / tc <= 2 / 3
        if cells:
            rows.append((f"{exp}: aggregate, batchcast / TensorSocket", ", ".join(cells),
                         "≥ 1.5×, every sample", met))
            rows.append((f"{exp}: CPU per sample, batchcast / TensorSocket", ", ".join(cpu_cells),
                         "≤ 0.67", cpu_met))
    for exp in ("busy", "jpeg"):
        one, eight = measured(g.get((f"{exp}/K=1", "batchcast"), [])), measured(g.get((f"{exp}/K=8", "batchcast"), []))
        if one and eight:
            p1 = med([r["pss_peak"]["total"] for r in one]) / MIB
            p8 = med([r["pss_peak"]["total"] for r in eight]) / MIB
            r1 = med([r["pss_ready"]["total"] for r in one]) / MIB
            r8 = med([r["pss_ready"]["total"] for r in eight]) / MIB
            allowed = p1 + (r8 - r1)
            rows.append((f"{exp}: batchcast total PSS, K=8 vs K=1 + 7 trainers' interpreters",
                         f"{p8:.0f} MiB vs {p1:.0f} + {r8 - r1:.0f} = {allowed:.0f} MiB ({p8 / allowed:.2f}×); "
                         f"data beyond the set-up processes: {p8 - r8:.0f} vs {p1 - r1:.0f} MiB",
                         "≤ 1.00×", p8 <= allowed))
    for c in doc["configs"]:
        if c["experiment"] != "overhead":
            continue
        plain = cpu_per_batch(measured(g.get((c["id"], "plain"), [])))
        b = cpu_per_batch(measured(g.get((c["id"], "batchcast"), [])))
        if plain is not None and b is not None:
            rows.append(("consumer CPU per batch beyond a plain loop (20 ms step)",
                         f"{(b - plain) * 1e6:.0f} µs ({b * 1e6:.0f} vs {plain * 1e6:.0f} µs)",
                         "< 60 µs", (b - plain) < 60e-6))
    if not rows:
        return []
    out = ["## Targets (issue 12)", "", "| target | measured | goal | met |", "|---|---|---|---|"]
    out += [f"| {a} | {b} | {c} | {'yes' if d else '**no**'} |" for a, b, c, d in rows]
    return out + [""]


def cpu_per_batch(runs):
    xs = [r["trainers"][0]["proc_cpu_s"] / r["trainers"][0]["batches"] for r in runs
          if r["trainers"] and r["trainers"][0].get("batches")]
    return med(xs)


def scale_table(doc, g, configs, ids, title) -> list[str]:
    c0 = configs[ids[0]]
    t0 = c0["trainers"][0]
    out = [f"## {title}", "",
           f"{workload_text(c0)}; loader batch {c0['loader_batch']}, trainers of {t0['batch_size']}, "
           f"{c0['epochs']} epoch(s), emulated step {t0['step_ms']:g} ms.", "",
           "| K | system | aggregate samples/s | vs DataLoader per trainer | steady samples/s "
           "| first batch (s) | per trainer samples/s | CPU ms / sample | PSS MiB | waiting for data "
           "| delivered |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    foot = []
    for cid in ids:
        c = configs[cid]
        k = len(c["trainers"])
        dl = med([r["aggregate"] for r in measured(g.get((cid, "dataloader"), []))])
        for system in sorted(c["systems"], key=ORDER.index):
            runs = g.get((cid, system), [])
            ok = measured(runs)
            n = notes(runs)
            if n:
                foot.append(f"- K={k}, {NAMES[system]}: {n}")
            if not ok:
                out.append(f"| {k} | {NAMES[system]} | – | – | – | – | – | – | – | – | "
                           f"{'skipped' if any(r.get('skipped') for r in runs) else 'failed'} |")
                continue
            agg = [r["aggregate"] for r in ok]
            per = [med(r["per_trainer"]) for r in ok]
            wait = [med(r["wait_share"]) for r in ok]
            out.append(
                f"| {k} | {NAMES[system]} | {spread(agg)} | {ratio(med(agg), dl)} | "
                f"{spread([r.get('steady') for r in ok])} | "
                f"{spread([med(r.get('first_batch_s') or [None]) for r in ok], '{:.2f}')} | {spread(per)} | "
                f"{spread([r['cpu_per_sample_ms'] for r in ok], '{:.2f}')} | "
                f"{spread([r['pss_peak']['total'] for r in ok], scale=1 / MIB)} | "
                f"{spread(wait, '{:.0%}')} | {delivered(runs)} |")
    return out + [""] + foot + ([""] if foot else [])


def per_trainer_table(doc, g, c) -> list[str]:
    title = {"mixed": "Trainers with different batch sizes",
             "speeds": "Trainers of different speeds"}[c["experiment"]]
    extra = ""
    if c["experiment"] == "speeds":
        extra = (f" The larger ring: {c['ring_slots']} slots instead of {c['slots']} (every batch "
                 "of the run), so a fast trainer is never held back by a slow one, for "
                 f"{c['ring_slots'] / c['slots']:.3g}× the ring memory.")
    out = [f"## {title}", "",
           f"{workload_text(c)}; loader batch {c['loader_batch']}, {c['epochs']} epoch(s); "
           f"{c['title']}. \"vs own DataLoader\": the same trainer's rate in the DataLoader-per-"
           f"trainer configuration.{extra}", "",
           "| system | trainer (batch, step) | samples/s | vs own DataLoader | waiting for data "
           "| aggregate samples/s | CPU ms / sample | PSS MiB | delivered |",
           "|---|---|---|---|---|---|---|---|---|"]
    dl = measured(g.get((c["id"], "dataloader"), []))
    dl_rates = [med([r["per_trainer"][i] for r in dl]) for i in range(len(c["trainers"]))] if dl else None
    foot = []
    for system in sorted(c["systems"], key=ORDER.index):
        runs = g.get((c["id"], system), [])
        ok = measured(runs)
        n = notes(runs)
        if n:
            foot.append(f"- {NAMES[system]}: {n}")
        if not ok:
            out.append(f"| {NAMES[system]} | – | – | – | – | – | – | – | "
                       f"{'skipped' if any(r.get('skipped') for r in runs) else 'failed'} |")
            continue
        for i, t in enumerate(c["trainers"]):
            rates = [r["per_trainer"][i] for r in ok]
            first = i == 0
            out.append(
                f"| {NAMES[system] if first else ''} | {t['batch_size']}, {t['step_ms']:g} ms | "
                f"{spread(rates)} | {ratio(med(rates), dl_rates[i] if dl_rates else None)} | "
                f"{spread([r['wait_share'][i] for r in ok], '{:.0%}')} | "
                + (f"{spread([r['aggregate'] for r in ok])} | "
                   f"{spread([r['cpu_per_sample_ms'] for r in ok], '{:.2f}')} | "
                   f"{spread([r['pss_peak']['total'] for r in ok], scale=1 / MIB)} | "
                   f"{delivered(runs)} |" if first else "| | | |"))
    out.append("")
    small, large = measured(g.get((c["id"], "batchcast"), [])), measured(g.get((c["id"], "batchcast+ring"), []))
    if c["experiment"] == "speeds" and small and large:
        parts = []
        for i, t in enumerate(c["trainers"]):
            a, b = med([r["per_trainer"][i] for r in small]), med([r["per_trainer"][i] for r in large])
            parts.append(f"{t['step_ms']:g} ms: {a:.0f} → {b:.0f} samples/s ({ratio(b, a)})")
        pa = med([r["pss_peak"]["total"] for r in small]) / MIB
        pb = med([r["pss_peak"]["total"] for r in large]) / MIB
        out += [f"What the larger ring buys back (batchcast, default ring → {c['ring_slots']} slots): "
                + "; ".join(parts) + f"; total PSS {pa:.0f} → {pb:.0f} MiB.", ""]
    return out + foot + ([""] if foot else [])


def exact_table(doc, g, c) -> list[str]:
    n = c["workload"]["samples"]
    out = [f"## What each trainer received ({c['title']})", "",
           f"{workload_text(c)}, {c['epochs']} epochs. Per epoch: samples received / distinct / "
           f"duplicated / missing (of {n}).", "",
           "| system | " + " | ".join(f"batch {t['batch_size']}" for t in c["trainers"]) + " |",
           "|---|" + "---|" * len(c["trainers"])]
    foot = []
    for system in sorted(c["systems"], key=ORDER.index):
        runs = g.get((c["id"], system), [])
        ok = measured(runs)
        n_ = notes(runs)
        if n_:
            foot.append(f"- {NAMES[system]}: {n_}")
        if not ok:
            out.append(f"| {NAMES[system]} | " + " | ".join("–" for _ in c["trainers"]) + " |")
            continue
        r = ok[0]
        cells = []
        for t in r["trainers"]:
            eps = t.get("epochs", [])
            cell = "; ".join(f"{e['received']}/{e['distinct']}/{e['duplicated']}/{e['missing']}" for e in eps)
            if t.get("corrupt"):
                cell += f"; {t['corrupt']} corrupt"
            if t.get("exact"):
                cell += " (exact)"
            elif t.get("status", "complete") != "complete":
                cell += f" ({t['status']})"
            cells.append(cell or "nothing")
        out.append(f"| {NAMES[system]} | " + " | ".join(cells) + " |")
    return out + [""] + foot + ([""] if foot else [])


def all_cpu(r) -> float:
    """The trainer's CPU plus its producer's while serving, both from the
    processes' own clocks (exact; psutil's per-process times tick at 10 ms)."""
    producer = (r.get("producer") or {}).get("serve_cpu_s") or 0.0
    return r["trainers"][0]["proc_cpu_s"] + producer


def overhead_table(doc, g, c) -> list[str]:
    w = c["workload"]
    out = ["## What receiving a batch costs a trainer", "",
           f"One trainer, {w['samples'] // w['loader_batch']} batches of {w['loader_batch']} x float32 "
           f"{'x'.join(map(str, w['shape']))} made up front (the producer is never the bottleneck), "
           f"{c['trainers'][0]['step_ms']:g} ms step (sleep) between batches. Process CPU: the "
           "trainer's own CPU time (all its threads) per batch over the loop; the plain loop "
           "iterates a list of the same batches. next(): main-thread time inside next(), "
           "per batch. Trainer and producer: the trainer's CPU plus the producer's (or "
           "fan-out's) while serving, per batch.", "",
           "| system | process CPU per batch (µs) | beyond the plain loop (µs) | next() wall, median "
           "[p10, p90] (µs) | main-thread CPU in next() (µs / batch) | trainer + producer CPU per "
           "batch (µs) | delivered |",
           "|---|---|---|---|---|---|---|"]
    plain = cpu_per_batch(measured(g.get((c["id"], "plain"), [])))
    foot = []
    for system in sorted(c["systems"], key=ORDER.index):
        runs = g.get((c["id"], system), [])
        ok = [r for r in measured(runs) if r["trainers"] and r["trainers"][0].get("batches")]
        n = notes(runs)
        if n:
            foot.append(f"- {NAMES[system]}: {n}")
        if not ok:
            out.append(f"| {NAMES[system]} | – | – | – | – | – | failed |")
            continue
        per = [r["trainers"][0]["proc_cpu_s"] / r["trainers"][0]["batches"] for r in ok]
        beyond = [x - plain for x in per] if plain is not None else []
        nxt = [r["trainers"][0]["next_median_s"] for r in ok]
        p10 = med([r["trainers"][0]["next_p10_s"] for r in ok])
        p90 = med([r["trainers"][0]["next_p90_s"] for r in ok])
        thread = [r["trainers"][0]["next_cpu_s"] / r["trainers"][0]["batches"] for r in ok]
        out.append(f"| {NAMES[system]} | {spread(per, scale=1e6)} | "
                   f"{spread(beyond, scale=1e6) if system != 'plain' else '–'} | "
                   f"{med(nxt) * 1e6:.0f} [{p10 * 1e6:.0f}, {p90 * 1e6:.0f}] | "
                   f"{spread(thread, '{:.1f}', scale=1e6)} | "
                   f"{spread([all_cpu(r) / r['trainers'][0]['batches'] for r in ok], scale=1e6)} | "
                   f"{delivered(runs)} |")
    return out + [""] + foot + ([""] if foot else [])


# ---- plot ---------------------------------------------------------------------------------
def plot(doc, path) -> str | None:
    """Aggregate samples/s, CPU per sample and PSS against K; None when written,
    else a note saying why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "(No plot: matplotlib is not installed; `pip install matplotlib` and rerun.)"
    g = groups(doc)
    exps = [e for e in ("busy", "jpeg") if any(c["experiment"] == e for c in doc["configs"])]
    over = [c for c in doc["configs"] if c["experiment"] == "overhead"]
    if not exps and not over:
        return "(No plot: neither a trainer-count nor the overhead experiment was run.)"
    rows = len(exps) + bool(over)
    fig, axes = plt.subplots(rows, 3, figsize=(15, 4.2 * rows), squeeze=False)
    metrics = [("aggregate", "aggregate samples/s", 1.0), ("cpu_per_sample_ms", "CPU ms per sample", 1.0),
               ("pss", "total PSS (MiB)", 1 / MIB)]
    for row, exp in enumerate(exps):
        cfgs = [c for c in doc["configs"] if c["experiment"] == exp]
        systems = sorted({s for c in cfgs for s in c["systems"]}, key=ORDER.index)
        for col, (key, label, scale) in enumerate(metrics):
            ax = axes[row][col]
            for system in systems:
                ks, ys, lo, hi = [], [], [], []
                for c in cfgs:
                    ok = measured(g.get((c["id"], system), []))
                    if not ok:
                        continue
                    vals = [(r["pss_peak"]["total"] if key == "pss" else r[key]) * scale for r in ok]
                    ks.append(len(c["trainers"]))
                    ys.append(statistics.median(vals))
                    lo.append(ys[-1] - min(vals))
                    hi.append(max(vals) - ys[-1])
                if ks:
                    ax.errorbar(ks, ys, yerr=[lo, hi], marker="o", capsize=3, label=NAMES[system],
                                color=COLORS[system])
            ax.set_xscale("log", base=2)
            ax.set_xticks([len(c["trainers"]) for c in cfgs])
            ax.set_xticklabels([str(len(c["trainers"])) for c in cfgs])
            ax.set_xlabel("trainers (K)")
            ax.set_ylabel(label)
            ax.set_title(f"{exp}: {label}")
            ax.grid(alpha=0.3)
            if row == 0 and col == 0:
                ax.legend(fontsize=8)
    if over:
        c = over[0]
        names, cpu, nxt, colors = [], [], [], []
        for system in sorted(c["systems"], key=ORDER.index):
            ok = [r for r in measured(g.get((c["id"], system), [])) if r["trainers"][0].get("batches")]
            if not ok:
                continue
            names.append(NAMES[system].replace(" ", "\n", 1))
            colors.append(COLORS[system])
            cpu.append(med([r["trainers"][0]["proc_cpu_s"] / r["trainers"][0]["batches"] for r in ok]) * 1e6)
            nxt.append(med([r["trainers"][0]["next_median_s"] for r in ok]) * 1e6)
        ax = axes[rows - 1]
        for a, values, label in ((ax[0], cpu, "trainer process CPU per batch (µs)"),
                                 (ax[1], nxt, "next() wall, median (µs)")):
            a.bar(names, values, color=colors)
            a.set_ylabel(label)
            a.set_title(f"overhead: {label}, {c['trainers'][0]['step_ms']:g} ms step")
            a.grid(alpha=0.3, axis="y")
            for i, v in enumerate(values):
                a.annotate(f"{v:.0f}", (i, v), ha="center", va="bottom", fontsize=8)
        speeds = [c for c in doc["configs"] if c["experiment"] == "speeds"]
        if speeds:
            c = speeds[0]
            systems = [x for x in sorted(c["systems"], key=ORDER.index) if measured(g.get((c["id"], x), []))]
            width = 0.8 / max(1, len(systems))
            for j, system in enumerate(systems):
                ok = measured(g[(c["id"], system)])
                rates = [med([r["per_trainer"][i] for r in ok]) for i in range(len(c["trainers"]))]
                ax[2].bar([i + (j - (len(systems) - 1) / 2) * width for i in range(len(rates))], rates,
                          width, label=NAMES[system], color=COLORS[system])
            ax[2].set_xticks(range(len(c["trainers"])))
            ax[2].set_xticklabels([f"{t['step_ms']:g} ms step" for t in c["trainers"]])
            ax[2].set_ylabel("samples/s per trainer")
            ax[2].set_title("speeds: each trainer's rate")
            ax[2].legend(fontsize=7)
            ax[2].grid(alpha=0.3, axis="y")
        else:
            ax[2].axis("off")
    env = doc["env"]
    fig.suptitle(f"{env['date'][:10]}, {env['machine']['cpu']}, {env['machine']['cpus']} CPUs; "
                 f"torch {env['torch']}; GPU step emulated by sleeping", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
