"""Tables (Markdown) and the plot from compare.json's runs."""

from __future__ import annotations

import shlex
import statistics
from collections import defaultdict

MIB = 2**20
ORDER = ["plain", "dataloader", "batchcast", "batchcast+copy", "batchcast+ring", "mpqueue",
         "tensorsocket"]
COLORS = {"dataloader": "C0", "batchcast": "C1", "mpqueue": "C2", "tensorsocket": "C3",
          "batchcast+ring": "C4", "batchcast+copy": "C5", "plain": "C7"}
NAMES = {"plain": "plain loop", "dataloader": "DataLoader per trainer", "batchcast": "batchcast",
         "batchcast+ring": "batchcast, larger ring", "mpqueue": "mp queue fan-out",
         "batchcast+copy": "batchcast, producer copies",
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


def pct(x, flag_below=None, flag_above=None, digits=0) -> str:
    if x is None:
        return "–"
    text = f"{x:.{digits}%}"
    bad = ((flag_below is not None and x < flag_below)
           or (flag_above is not None and x >= flag_above))
    return f"**{text}**" if bad else text


def startup_cell(runs, limit=0.10) -> str:
    """Start-up (s) and its share of the window, median [min, max]; a share at or
    over the limit in bold."""
    shares = [r.get("startup_share") for r in runs if r.get("startup_share") is not None]
    if not shares:
        return "–"
    worst = max(shares)
    text = f"{spread([r.get('startup_s') for r in runs], '{:.2f}')} s, {spread(shares, '{:.1%}')}"
    return f"**{text}**" if worst >= limit else text


def startup_share_cell(runs, limit=0.10) -> str:
    shares = [r.get("startup_share") for r in runs if r.get("startup_share") is not None]
    if not shares:
        return "–"
    text = spread(shares, "{:.1%}")
    return f"**{text}**" if max(shares) >= limit else text


def read_ms(runs) -> str:
    """The read's median per batch (ms) and all the trainers' reads as a share of the CPUs."""
    text = spread([r.get("read_median_s") for r in runs], "{:.2f}", scale=1e3)
    shares = [r.get("read_cpu_share") for r in runs if r.get("read_cpu_share") is not None]
    return text + (f" ({statistics.median(shares):.1%})" if shares else "")


def delivered_share(runs):
    """Distinct samples the trainers received / what every trainer getting every
    sample once per epoch gives (median over runs)."""
    shares = []
    for r in runs:
        per_epoch = max([t.get("expected_per_epoch", 0) for t in r["trainers"]] or [0])
        want = len(r["trainers"]) * per_epoch * r["spec"]["epochs"]
        got = sum(e["distinct"] for t in r["trainers"] for e in t.get("epochs", []))
        if want:
            shares.append(got / want)
    return med(shares)


def alone_of(doc, g, cfg) -> dict | None:
    """One loader alone for cfg's workload: median window (s), first batch (s),
    samples and rate, from its runs."""
    aid = cfg.get("alone") if cfg.get("experiment") != "alone" else cfg["id"]
    runs = measured(g.get((aid, "dataloader"), [])) if aid else []
    runs = [r for r in runs if r.get("samples") and r.get("first_batch_s")]
    if not runs:
        return None
    return {"id": aid, "runs": runs, "window_s": med([r["window_s"] for r in runs]),
            "first_s": med([r["first_batch_s"][0] for r in runs]),
            "samples": med([r["samples"] for r in runs]),
            "rate": med([r["aggregate"] for r in runs])}


def bound(doc, g, cfg) -> dict | None:
    """What sharing one loader can give these trainers at best: every trainer gets
    every batch the moment one loader alone produced it (its last batch at T, its
    first at T1, the alone run's medians) and steps on it. Trainer i (batch b_i,
    step s_i, n_i batches) then ends at T_i = max(T + s_i, T1 + n_i * s_i); its
    rate is at most S / T_i and the aggregate (over the window to the last end)
    at most K * S / max T_i, i.e. K x the rate of one loader alone unless the
    steps are the tighter limit."""
    a = alone_of(doc, g, cfg)
    if a is None:
        return None
    total = a["samples"]  # samples per trainer over all epochs (the loader's)
    per_epoch = cfg["workload"]["samples"]
    ends, stepped = [], []
    for t in cfg["trainers"]:
        s = t["step_ms"] / 1e3
        n = -(-per_epoch // t["batch_size"]) * cfg["epochs"]
        ends.append(max(a["window_s"] + s, a["first_s"] + n * s))
        stepped.append(a["first_s"] + n * s > a["window_s"] + s)
    k = len(cfg["trainers"])
    return {"aggregate": k * total / max(ends), "per_trainer": [total / e for e in ends],
            "loader": total / a["window_s"], "k_loader": k * total / a["window_s"],
            "steps_bind": any(stepped), "alone": a}


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
    return (f"compare: {env['date']}, {m['cpu']}, {m['cpus']} CPUs "
            f"(all processes on {m['cpu_set']}), "
            f"python {env['python']}, torch {env['torch']}, batchcast {env['batchcast']}"
            f" ({env.get('batchcast_git')})"
            + (f", tensorsocket {env['tensorsocket']}" if env.get("tensorsocket") else "")
            + f"; GPU step {env['gpu_step']}")


def one_line(r) -> str:
    head = f"{r['config']:<12} {r['system']:<15} #{r['repeat']}"
    if r.get("skipped"):
        return f"{head} skipped: {r['skipped']}"
    if "aggregate" not in r:
        return f"{head} FAILED: {'; '.join(r['errors'])[:400]}"
    pss = (r.get("pss_peak") or {}).get("total", 0) / MIB
    line = (f"{head} {r['aggregate']:7.0f} samples/s over {r['window_s']:.2f} s, "
            f"start-up {r.get('startup_s') or 0:.2f} s ({r.get('startup_share') or 0:.1%}), "
            f"read {(r.get('read_median_s') or 0) * 1e3:.2f} ms/batch "
            f"({r.get('read_cpu_share') or 0:.1%} of the CPUs), "
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
STARTUP_LIMIT = 0.10  # start-up's share of the window a configuration should stay under
BOUND_GOAL = 0.95  # batchcast's share of the bound


def markdown(doc) -> str:
    env = doc["env"]
    m = env["machine"]
    s = env["settings"]
    g = groups(doc)
    configs = {c["id"]: c for c in doc["configs"]}
    command = " ".join(["python benchmarks/compare.py", *map(shlex.quote, env.get("argv", []))])
    lines = [
        f"# batchcast against the alternatives ({env['date'][:10]})",
        "",
        f"- Machine: {m['cpu']}, {m['cpus']} CPUs, {m['memory_gib']} GiB; every process of a "
        f"configuration on CPUs {m['cpu_set']}; {m['arch']}, Linux {m['kernel']}.",
        f"- Python {env['python']}, torch {env['torch']}, batchcast {env['batchcast']} "
        f"(git {env.get('batchcast_git')})"
        + (f", TensorSocket {env['tensorsocket']}" if env.get("tensorsocket") else "") + ".",
        f"- Command: `{command}` "
        f"({doc.get('elapsed_s', 0) / 60:.1f} min). {s['repeats']} run(s) of each configuration, "
        "systems interleaved; cells are median [min, max].",
        f"- {env['gpu_step'][0].upper()}{env['gpu_step'][1:]}. " + read_text(doc, g)
        + f" DataLoaders: {s['workers']} workers, shuffled with a fixed seed; batchcast ring / "
        f"queue depth {s['slots']} batches unless said otherwise.",
        "- Bound: one loader alone (the same DataLoader, workers and CPUs, iterated by one "
        "process that reads every batch and never sleeps) delivers S samples in T s, its first "
        "batch at T1. Sharing it, trainer i (batch b, step s, n batches) cannot end before "
        "max(T + s, T1 + n·s), so the aggregate cannot exceed K·S / the latest of those: K × "
        "the rate of one loader alone, unless the steps are the tighter limit. Share: a system's "
        "aggregate / that bound.",
        "- Aggregate: samples every trainer received / one common window (the start signal, "
        "given to all processes at once after every one is set up, to the last trainer's last "
        "step); start-up is inside it. First batch: seconds from the start to a trainer's first "
        "batch (median over the trainers). Start-up: from the start until every trainer has its "
        "first batch, and its share of the window (bold at "
        f"{STARTUP_LIMIT:.0%} or more). Steady: samples that arrived while every trainer was "
        "running (from the last trainer's first batch to the first trainer's last), over that "
        "span. CPU: every process of the configuration, loader workers included, from the start "
        "to the last trainer's last step, per sample delivered. PSS: summed over all processes, "
        "the peak of samples taken from the start to the last trainer's end every "
        f"{s.get('pss_interval', 1):g} s (and when every trainer has its first batch). Waiting: "
        "the trainer's share of its time inside next().",
        "",
    ]
    lines += targets(doc, g, configs)
    lines += alone_table(doc, g)
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


def read_text(doc, g) -> str:
    """What the trainers' read of each batch cost, per workload."""
    parts = []
    for exp in ("busy", "jpeg", "mixed", "speeds", "overhead"):
        cfgs = [c for c in doc["configs"] if c["experiment"] == exp]
        if not cfgs:
            continue
        reads = [r.get("read_median_s") for c in cfgs for system in c["systems"]
                 for r in measured(g.get((c["id"], system), []))]
        reads = [x for x in reads if x is not None]
        if not reads:
            continue
        c = cfgs[0]
        mib = max(t["batch_size"] for t in c["trainers"]) * sample_bytes(c["workload"]) / MIB
        parts.append(f"{exp} {statistics.median(reads) * 1e3:.2f} ms "
                     f"[{min(reads) * 1e3:.2f}, {max(reads) * 1e3:.2f}] "
                     f"({mib:.1f} MiB batches{' and less' if exp == 'mixed' else ''})")
    text = ("The read is a copy of every tensor of the batch into a buffer kept across steps, as "
            "a host-to-device copy would do, the same for every system")
    if parts:
        text += ("; it costs per batch (median [min, max] of every run's trainers' medians): "
                 + "; ".join(parts))
    return text + "."


def sample_bytes(w) -> int:
    if w["kind"] == "jpeg":
        shape = [3, w.get("size", 224), w.get("size", 224)]
    else:
        shape = w["shape"]
    n = 1
    for d in shape:
        n *= d
    return 4 * n + 16


def workload_text(c) -> str:
    w = c["workload"]
    if w["kind"] == "busy":
        return (f"synthetic, {w['cost_ms']:g} ms CPU per sample, "
                f"float32 {'x'.join(map(str, w['shape']))}, "
                f"{w['samples']} samples per epoch")
    if w["kind"] == "jpeg":
        return (f"{w['samples']} JPEG samples per epoch "
                f"(decoding {w.get('files', w['samples'])} files "
                f"of ~100 KB, 400-640 x 300-500, in turn): PIL decode, "
                f"RandomResizedCrop({w.get('size', 224)}), flip, normalize")
    return f"{w['samples'] // w['loader_batch']} batches made up front (no loading cost)"


def ts_cell(doc, g, cid, b_agg) -> str:
    runs = g.get((cid, "tensorsocket"), [])
    ok = measured(runs)
    if not runs:
        return "not run"
    if not ok:
        return "skipped" if any(r.get("skipped") for r in runs) else "failed"
    ta = med([r["aggregate"] for r in ok])
    share = delivered_share(ok)
    pbs = ok[0]["spec"].get("ts", {}).get("producer_batch_size")
    return (f"{ratio(b_agg, ta)} (it delivered {share:.1%} of the samples; "
            f"producer batch {pbs})")


def targets(doc, g, configs) -> list[str]:
    out = []
    rows = []
    for exp in ("busy", "jpeg", "mixed"):
        for c in doc["configs"]:
            if c["experiment"] != exp:
                continue
            k = len(c["trainers"])
            bd = bound(doc, g, c)
            b = measured(g.get((c["id"], "batchcast"), []))
            if not bd or not b:
                continue
            agg = med([r["aggregate"] for r in b])
            share = agg / bd["aggregate"]
            slowest = min(med([r["per_trainer"][i] for r in b]) / bd["per_trainer"][i]
                          for i in range(k))

            def vs(system):
                ok = measured(g.get((c["id"], system), []))
                return ratio(agg, med([r["aggregate"] for r in ok])) if ok else "–"

            exact = all(r["exact"] for r in b)
            rows.append(
                f"| {exp} | {k} | {bd['aggregate']:.0f}{' (steps)' if bd['steps_bind'] else ''} | "
                f"{spread([r['aggregate'] for r in b])} | "
                f"{pct(share, flag_below=BOUND_GOAL, digits=1)} | "
                f"{pct(slowest, flag_below=BOUND_GOAL, digits=1)} | "
                f"{'yes' if share >= BOUND_GOAL and k <= 8 and exact else '**no**'} | "
                f"{vs('dataloader')} | {vs('mpqueue')} | {ts_cell(doc, g, c['id'], agg)} |")
    if rows:
        out += ["## Targets (issues 12 and 24)", "",
                f"batchcast's aggregate against the bound (goal: ≥ {BOUND_GOAL:.0%} of it at "
                "K ≤ 8, every sample delivered exactly once), its slowest trainer against that "
                "trainer's "
                "bound, and its aggregate over each alternative's. TensorSocket: what it "
                "delivered (distinct samples of those due) beside the ratio.", "",
                "| workload | K | bound samples/s | batchcast samples/s | share of bound | slowest "
                "trainer, share of its bound | met | vs DataLoader per trainer "
                "| vs mp queue fan-out | vs TensorSocket 0.0.5 |",
                "|---|---|---|---|---|---|---|---|---|---|", *rows, ""]
    rows = []
    # start-up: every configuration that measures a rate
    over, n, worst = [], 0, None
    for c in doc["configs"]:
        if c["experiment"] in ("exact",):
            continue
        for system in c["systems"]:
            ok = measured(g.get((c["id"], system), []))
            shares = [r.get("startup_share") for r in ok if r.get("startup_share") is not None]
            if not shares:
                continue
            n += 1
            share = max(shares)
            if worst is None or share > worst[0]:
                worst = (share, c["id"], system)
            if share >= STARTUP_LIMIT:
                over.append(f"{c['id']} {NAMES.get(system, system)} {share:.0%}")
    if n:
        rows.append((f"start-up under {STARTUP_LIMIT:.0%} of the window, every run of every "
                     "configuration (exact excepted)",
                     (f"under in {n - len(over)} of {n} (configuration, system) pairs; worst "
                      f"{worst[0]:.1%} ({worst[1]}, {NAMES.get(worst[2], worst[2])})"
                      + (f"; at or over: {', '.join(over)}" if over else "")),
                     f"< {STARTUP_LIMIT:.0%}", not over))
    for exp in ("busy", "jpeg"):
        cells, met = [], True
        for c in doc["configs"]:
            if c["experiment"] != exp:
                continue
            b = measured(g.get((c["id"], "batchcast"), []))
            t = measured(g.get((c["id"], "tensorsocket"), []))
            if not b or not t or not med([r["aggregate"] for r in t]):
                continue
            bc_ = med([r["cpu_per_sample_ms"] for r in b])
            tc = med([r["cpu_per_sample_ms"] for r in t])
            cells.append(f"K={len(c['trainers'])}: {bc_ / tc:.2f}")
            met &= bc_ / tc <= 2 / 3
        if cells:
            rows.append((f"{exp}: CPU per sample, batchcast / TensorSocket", ", ".join(cells),
                         "≤ 0.67", met))
    tol = doc["env"]["settings"].get("pss_tolerance", 0.03)
    for exp in ("busy", "jpeg"):
        ks = sorted(len(c["trainers"]) for c in doc["configs"] if c["experiment"] == exp)
        if len(ks) < 2:
            continue
        lo, hi = ks[0], ks[-1]
        one = measured(g.get((f"{exp}/K={lo}", "batchcast"), []))
        many = measured(g.get((f"{exp}/K={hi}", "batchcast"), []))
        if not one or not many:
            continue

        def pss(runs, key):
            return med([r[key]["total"] for r in runs]) / MIB

        def buffers(runs):
            return med([sum(t.get("read_buffer_bytes") or 0 for t in r["trainers"])
                        for r in runs]) / MIB

        p1, pk = pss(one, "pss_peak"), pss(many, "pss_peak")
        r1, rk = pss(one, "pss_ready"), pss(many, "pss_ready")
        b1, bk = buffers(one), buffers(many)
        allowed = p1 + (rk - r1) + (bk - b1)
        rows.append((f"{exp}: batchcast total PSS, K={hi} vs K={lo} + {hi - lo} more trainers "
                     "(interpreters at set-up, read buffers)",
                     f"{pk:.0f} MiB vs {p1:.0f} + {rk - r1:.0f} + {bk - b1:.0f} = "
                     f"{allowed:.0f} MiB "
                     f"({pk / allowed:.3f}×); data beyond the set-up processes and read buffers: "
                     f"{pk - rk - bk:.0f} vs {p1 - r1 - b1:.0f} MiB",
                     f"≤ {1 + tol:.2f}× (peaks sampled every "
                     f"{doc['env']['settings'].get('pss_interval', 1):g} s over the whole run)",
                     pk <= allowed * (1 + tol)))
    for c in doc["configs"]:
        if c["experiment"] != "overhead":
            continue
        plain = cpu_per_batch(measured(g.get((c["id"], "plain"), [])))
        b = cpu_per_batch(measured(g.get((c["id"], "batchcast"), [])))
        if plain is not None and b is not None:
            rows.append(("consumer CPU per batch beyond a plain loop (20 ms step)",
                         f"{(b - plain) * 1e6:.0f} µs ({b * 1e6:.0f} vs {plain * 1e6:.0f} µs)",
                         "< 60 µs", (b - plain) < 60e-6))
    if rows:
        if not out:
            out += ["## Targets (issues 12 and 24)", ""]
        out += ["| target | measured | goal | met |", "|---|---|---|---|"]
        out += [f"| {a} | {b} | {c} | {'yes' if d else '**no**'} |" for a, b, c, d in rows]
        out.append("")
    return out


def cpu_per_batch(runs):
    xs = [r["trainers"][0]["proc_cpu_s"] / r["trainers"][0]["batches"] for r in runs
          if r["trainers"] and r["trainers"][0].get("batches")]
    return med(xs)


def alone_table(doc, g) -> list[str]:
    cfgs = [c for c in doc["configs"] if c["experiment"] == "alone"]
    if not cfgs:
        return []
    out = ["## One loader alone (the bound)", "",
           "The loader of each experiment, iterated by one process on the same CPUs that reads "
           "every batch (the trainers' read) and never sleeps: the most one loader gives.", "",
           "| experiment | workload | loader batch | samples/s | window (s) | first batch (s) "
           "| start-up share | read ms / batch | CPU ms / sample | PSS MiB |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    foot = []
    for c in cfgs:
        runs = g.get((c["id"], "dataloader"), [])
        ok = measured(runs)
        n = notes(runs)
        if n:
            foot.append(f"- {c['of']}: {n}")
        if not ok:
            out.append(f"| {c['of']} | {workload_text(c)} | {c['loader_batch']} | failed "
                       "| – | – | – | – | – | – |")
            continue
        out.append(f"| {c['of']} | {workload_text(c)} | {c['loader_batch']} | "
                   f"{spread([r['aggregate'] for r in ok])} | "
                   f"{spread([r['window_s'] for r in ok], '{:.2f}')} | "
                   f"{spread([r['first_batch_s'][0] for r in ok], '{:.2f}')} | "
                   f"{startup_share_cell(ok)} | {read_ms(ok)} | "
                   f"{spread([r['cpu_per_sample_ms'] for r in ok], '{:.2f}')} | "
                   f"{spread([r['pss_peak']['total'] for r in ok], scale=1 / MIB)} |")
    return out + [""] + foot + ([""] if foot else [])


def scale_table(doc, g, configs, ids, title) -> list[str]:
    c0 = configs[ids[0]]
    t0 = c0["trainers"][0]
    a = alone_of(doc, g, c0)
    batches = -(-c0["workload"]["samples"] // c0["loader_batch"])
    intro = (f"{workload_text(c0)}; loader batch {c0['loader_batch']}, "
             f"trainers of {t0['batch_size']}, {c0['epochs']} epoch(s) ({batches} loader "
             f"batches per trainer per epoch; the ring / queues hold {c0['slots']}), emulated step "
             f"{t0['step_ms']:g} ms.")
    if a:
        intro += (f" One loader alone: {a['rate']:.0f} samples/s "
                  f"(first batch {a['first_s']:.2f} s); "
                  "the bound row is what sharing it can give K trainers at best.")
    out = [f"## {title}", "", intro, "",
           "| K | system | aggregate samples/s | share of bound | vs DataLoader per trainer "
           "| steady samples/s | first batch (s) | start-up (s, share of window) "
           "| per trainer samples/s | read ms / batch (all reads, share of CPUs) "
           "| CPU ms / sample | PSS MiB | waiting for data | delivered |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    foot = []
    for cid in ids:
        c = configs[cid]
        k = len(c["trainers"])
        bd = bound(doc, g, c)
        if bd:
            out.append(f"| {k} | bound: {k} × one loader alone"
                       f"{', steps bind' if bd['steps_bind'] else ''} | "
                       f"{bd['aggregate']:.0f} | 100% "
                       f"| | | | | {med(bd['per_trainer']):.0f} | | | | | |")
        dl = med([r["aggregate"] for r in measured(g.get((cid, "dataloader"), []))])
        for system in sorted(c["systems"], key=ORDER.index):
            runs = g.get((cid, system), [])
            ok = measured(runs)
            n = notes(runs)
            if n:
                foot.append(f"- K={k}, {NAMES[system]}: {n}")
            if not ok:
                out.append(f"| {k} | {NAMES[system]} | " + "– | " * 11 +
                           f"{'skipped' if any(r.get('skipped') for r in runs) else 'failed'} |")
                continue
            agg = [r["aggregate"] for r in ok]
            per = [med(r["per_trainer"]) for r in ok]
            wait = [med(r["wait_share"]) for r in ok]
            share = spread([x / bd["aggregate"] for x in agg], "{:.0%}") if bd else "–"
            out.append(
                f"| {k} | {NAMES[system]} | {spread(agg)} | {share} | {ratio(med(agg), dl)} | "
                f"{spread([r.get('steady') for r in ok])} | "
                f"{spread([med(r.get('first_batch_s') or [None]) for r in ok], '{:.2f}')} | "
                f"{startup_cell(ok, STARTUP_LIMIT)} | {spread(per)} | {read_ms(ok)} | "
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
                 "of the run), so a fast trainer is never held back by a slow one, for up to "
                 f"{c['ring_slots'] / c['slots']:.3g}× the ring memory (pages are used only as "
                 "written).")
    bd = bound(doc, g, c)
    if bd:
        extra += (f" One loader alone: {bd['loader']:.0f} samples/s; the bound rows are what "
                  "sharing it can give each trainer at best (its step can be the tighter limit).")
    out = [f"## {title}", "",
           f"{workload_text(c)}; loader batch {c['loader_batch']}, {c['epochs']} epoch(s); "
           f"{c['title']}. \"vs own DataLoader\": the same trainer's rate in the DataLoader-per-"
           f"trainer configuration.{extra}", "",
           "| system | trainer (batch, step) | samples/s | share of its bound | vs own DataLoader "
           "| waiting for data | read ms / batch | aggregate samples/s | share of bound "
           "| start-up (s, share of window) | CPU ms / sample | PSS MiB | delivered |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    if bd:
        for i, t in enumerate(c["trainers"]):
            out.append(f"| {'bound' if i == 0 else ''} | {t['batch_size']}, {t['step_ms']:g} ms | "
                       f"{bd['per_trainer'][i]:.0f} | 100% | | | | "
                       + (f"{bd['aggregate']:.0f} | 100% | | | | |" if i == 0 else "| | | | | |"))
    dl = measured(g.get((c["id"], "dataloader"), []))
    dl_rates = ([med([r["per_trainer"][i] for r in dl]) for i in range(len(c["trainers"]))]
                if dl else None)
    foot = []
    for system in sorted(c["systems"], key=ORDER.index):
        runs = g.get((c["id"], system), [])
        ok = measured(runs)
        n = notes(runs)
        if n:
            foot.append(f"- {NAMES[system]}: {n}")
        if not ok:
            out.append(f"| {NAMES[system]} | " + "– | " * 11 +
                       f"{'skipped' if any(r.get('skipped') for r in runs) else 'failed'} |")
            continue
        for i, t in enumerate(c["trainers"]):
            rates = [r["per_trainer"][i] for r in ok]
            first = i == 0
            reads = [r["trainers"][i].get("read_median_s") for r in ok]
            row = (f"| {NAMES[system] if first else ''} | {t['batch_size']}, {t['step_ms']:g} ms | "
                   f"{spread(rates)} | "
                   + (spread([x / bd["per_trainer"][i] for x in rates], "{:.0%}") if bd else "–")
                   + " | "
                   f"{ratio(med(rates), dl_rates[i] if dl_rates else None)} | "
                   f"{spread([r['wait_share'][i] for r in ok], '{:.0%}')} | "
                   f"{spread(reads, '{:.2f}', scale=1e3)} | ")
            if not first:
                out.append(row + "| | | | | |")
                continue
            share = (spread([r["aggregate"] / bd["aggregate"] for r in ok], "{:.0%}")
                     if bd else "–")
            out.append(row + f"{spread([r['aggregate'] for r in ok])} | {share} | "
                       f"{startup_cell(ok, STARTUP_LIMIT)} | "
                       f"{spread([r['cpu_per_sample_ms'] for r in ok], '{:.2f}')} | "
                       f"{spread([r['pss_peak']['total'] for r in ok], scale=1 / MIB)} | "
                       f"{delivered(runs)} |")
    out.append("")
    small = measured(g.get((c["id"], "batchcast"), []))
    large = measured(g.get((c["id"], "batchcast+ring"), []))
    if c["experiment"] == "speeds" and small and large:
        parts = []
        for i, t in enumerate(c["trainers"]):
            a = med([r["per_trainer"][i] for r in small])
            b = med([r["per_trainer"][i] for r in large])
            parts.append(f"{t['step_ms']:g} ms: {a:.0f} → {b:.0f} samples/s ({ratio(b, a)})")
        pa = med([r["pss_peak"]["total"] for r in small]) / MIB
        pb = med([r["pss_peak"]["total"] for r in large]) / MIB
        out += ["What the larger ring buys back (batchcast, default ring → "
                f"{c['ring_slots']} slots): "
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
            cell = "; ".join(f"{e['received']}/{e['distinct']}/{e['duplicated']}/{e['missing']}"
                             for e in eps)
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
           f"One trainer, {w['samples'] // w['loader_batch']} batches of {w['loader_batch']} x "
           f"float32 {'x'.join(map(str, w['shape']))} made up front (the producer is never the "
           f"bottleneck), {c['trainers'][0]['step_ms']:g} ms step (the read, then a sleep) per "
           "batch. Process CPU: the trainer's own CPU time (all its threads) per batch over "
           "the loop; the plain loop iterates a list of the same batches. next(): main-thread "
           "time inside next(), "
           "per batch. Trainer and producer: the trainer's CPU plus the producer's (or "
           "fan-out's) while serving, per batch. Every trainer, the plain loop included, reads "
           "each batch once (read: its median per batch), which is in its process CPU.", "",
           "| system | process CPU per batch (µs) | beyond the plain loop (µs) "
           "| next() wall, median [p10, p90] (µs) | main-thread CPU in next() (µs / batch) "
           "| read (µs / batch) "
           "| trainer + producer CPU per batch (µs) | delivered |",
           "|---|---|---|---|---|---|---|---|"]
    plain = cpu_per_batch(measured(g.get((c["id"], "plain"), [])))
    foot = []
    for system in sorted(c["systems"], key=ORDER.index):
        runs = g.get((c["id"], system), [])
        ok = [r for r in measured(runs) if r["trainers"] and r["trainers"][0].get("batches")]
        n = notes(runs)
        if n:
            foot.append(f"- {NAMES[system]}: {n}")
        if not ok:
            out.append(f"| {NAMES[system]} | – | – | – | – | – | – | failed |")
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
                   f"{spread([r.get('read_median_s') for r in ok], scale=1e6)} | "
                   f"{spread([all_cpu(r) / r['trainers'][0]['batches'] for r in ok], scale=1e6)} | "
                   f"{delivered(runs)} |")
    return out + [""] + foot + ([""] if foot else [])


# ---- plot ---------------------------------------------------------------------------------
def plot(doc, path) -> str | None:
    """Aggregate samples/s (with the bound), CPU per sample and PSS against K,
    the consumer cost per batch and the speeds experiment's rates; None when
    written, else a note saying why not."""
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
    metrics = [("aggregate", "aggregate samples/s", 1.0),
               ("cpu_per_sample_ms", "CPU ms per sample", 1.0),
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
                    vals = [(r["pss_peak"]["total"] if key == "pss" else r[key]) * scale
                            for r in ok]
                    ks.append(len(c["trainers"]))
                    ys.append(statistics.median(vals))
                    lo.append(ys[-1] - min(vals))
                    hi.append(max(vals) - ys[-1])
                if ks:
                    ax.errorbar(ks, ys, yerr=[lo, hi], marker="o", capsize=3, label=NAMES[system],
                                color=COLORS[system])
            if key == "aggregate":
                pts = [(len(c["trainers"]), bound(doc, g, c)) for c in cfgs]
                pts = [(k, b["aggregate"]) for k, b in pts if b]
                if pts:
                    ax.plot(*zip(*pts), "k--", marker="x", label="bound: K × one loader alone")
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
            ok = [r for r in measured(g.get((c["id"], system), []))
                  if r["trainers"][0].get("batches")]
            if not ok:
                continue
            names.append(NAMES[system].replace(" ", "\n", 1))
            colors.append(COLORS[system])
            cpu.append(med([r["trainers"][0]["proc_cpu_s"] / r["trainers"][0]["batches"]
                            for r in ok]) * 1e6)
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
            systems = [x for x in sorted(c["systems"], key=ORDER.index)
                       if measured(g.get((c["id"], x), []))]
            width = 0.8 / max(1, len(systems))
            for j, system in enumerate(systems):
                ok = measured(g[(c["id"], system)])
                rates = [med([r["per_trainer"][i] for r in ok]) for i in range(len(c["trainers"]))]
                xs = [i + (j - (len(systems) - 1) / 2) * width for i in range(len(rates))]
                ax[2].bar(xs, rates, width, label=NAMES[system], color=COLORS[system])
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
                 f"torch {env['torch']}; GPU step emulated: read the batch once, sleep the rest",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
