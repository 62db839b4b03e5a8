#!/usr/bin/env python3
"""Chart of bench/compare.sh: requests/s, p99 latency and Redis CPU per request.

Usage: chart.py RAW.tsv OUT.png   (needs matplotlib; compare.sh installs it into bench/.venv)

Bars are medians of the rounds; the error bars span min–max of the rounds.
"""

import csv
import statistics
import sys

import matplotlib

matplotlib.use("Agg")  # no display on a build machine
import matplotlib.pyplot as plt  # noqa: E402

CONTENDERS = [("nolimit", "A no limiter", "#9e9e9e"),
              ("lua", "B article Lua", "#e07b39"),
              ("module", "C this module", "#2f6db3")]
SCEN_ORDER = ["allow", "deny", "mix", "keys100k"]


def main():
    raw_path, out_path = sys.argv[1:3]
    with open(raw_path, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    data = {}
    for r in rows:
        n = float(r["nginx_requests"]) or float(r["requests"])
        v = {"rps": float(r["rps"]), "p99": float(r["p99_us"]) / 1000,
             "redis": float(r["redis_cpu_s"]) * 1e6 / n if n else 0.0,
             "cpu": float(r["worker_cpu_s"]) * 1e6 / n if n else 0.0}
        data.setdefault((r["scenario"], int(r["workers"])), {}).setdefault(r["contender"], []).append(v)
    scen = sorted(data, key=lambda sw: (sw[1], SCEN_ORDER.index(sw[0]) if sw[0] in SCEN_ORDER else 99))
    labels = [f"{s}\n{w} worker{'s' if w > 1 else ''}" for s, w in scen]

    panels = [("rps", "requests/s (higher is better)"),
              ("p99", "p99 latency, ms (lower is better)"),
              ("cpu", "nginx worker CPU µs / request"),
              ("redis", "Redis CPU µs / request")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(8, 1.6 * len(scen) + 2), 3.2 * len(panels)))
    width = 0.8 / len(CONTENDERS)
    for ax, (key, title) in zip(axes, panels):
        for i, (c, label, color) in enumerate(CONTENDERS):
            xs, ys, lo, hi = [], [], [], []
            for j, sw in enumerate(scen):
                vals = [v[key] for v in data[sw].get(c, [])]
                if not vals:
                    continue
                m = statistics.median(vals)
                xs.append(j + (i - (len(CONTENDERS) - 1) / 2) * width)
                ys.append(m)
                lo.append(m - min(vals))
                hi.append(max(vals) - m)
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=label, color=color)
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(len(scen)))
        ax.set_xticklabels(labels, fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    # One legend above the panels, where it cannot hide a bar.
    handles, names = axes[0].get_legend_handles_labels()
    fig.suptitle("ngx_http_ratelimit vs the article's Lua limiter vs no limiter "
                 "(medians, min–max of rounds)", fontsize=11)
    fig.legend(handles, names, fontsize=9, ncol=len(CONTENDERS), loc="upper center",
               bbox_to_anchor=(0.5, 0.975), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.955))
    fig.savefig(out_path, dpi=110)


if __name__ == "__main__":
    main()
