"""The chart of one run (matplotlib, from the bench dependency group)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.commands import OPS
from benchmarks.paths import PATHS
from benchmarks.report import Results
from benchmarks.timing import FLOOR, LOCK_FLOOR, Samples, ratio
from benchmarks.verdicts import PLAIN

COLORS = {
    PLAIN: "#9e9e9e",
    "celery-once": "#e6a23c",
    "celery-singleton": "#d9822b",
    "UniqueJob": "#2f6fb0",
    "UniqueUntilProcessingJob": "#5b9bd5",
    "DebouncedJob": "#8fbce6",
    "UniqueJob on Django's RedisCache": "#1f4e79",
    FLOOR: "#3c9d5d",
    LOCK_FLOOR: "#7cc08f",
}


def draw(r: Results, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    names = [n for n in r.timing if n not in (FLOOR, LOCK_FLOOR)]
    ax = axes[0][0]
    first_names = names + [n for n in (LOCK_FLOOR,) if n in r.timing]
    firsts = [Samples.median(r.timing[n].first) for n in first_names]
    bars = ax.bar(
        range(len(first_names)), firsts, color=[COLORS.get(n, "#777777") for n in first_names]
    )
    for bar, name in zip(bars, first_names, strict=True):
        times = ratio(r.timing[name].first, r.timing[PLAIN].first).value
        ax.annotate(
            f"{times:.2f}x",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    ax.set_title("First dispatch (fresh key), median µs/call\nmedian ÷ plain Celery's median")
    _names(ax, first_names)

    ax = axes[0][1]
    dup_names = [n for n in names if n != PLAIN] + [FLOOR]
    dups = [Samples.median(r.timing[n].duplicate) for n in dup_names]
    bars = ax.bar(range(len(dup_names)), dups, color=[COLORS.get(n, "#777") for n in dup_names])
    floor = r.timing[FLOOR].duplicate
    for bar, name in zip(bars, dup_names, strict=True):
        rate = ratio(floor, r.timing[name].duplicate).value
        ax.annotate(
            f"{rate:.2f}x",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    ax.set_title("Duplicate dispatch (held key), median µs/call\n"
                 "raw SET NX PX median ÷ this median")
    _names(ax, dup_names)

    ax = axes[1][0]
    op_names = list(r.ops)
    width = 0.8 / len(op_names)
    for index, name in enumerate(op_names):
        values = [r.ops[name][op].round_trips if op in r.ops[name] else 0 for op in OPS]
        ax.bar(
            [i + index * width for i in range(len(OPS))],
            values,
            width,
            label=name,
            color=COLORS.get(name, "#777"),
        )
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(OPS))], OPS)
    ax.axhline(1, color="black", linewidth=0.8, linestyle="--")
    ax.set_title("Store round trips per operation (dashed: SPEC budget of 1)")
    ax.legend(fontsize=8)

    ax = axes[1][1]
    path_names = list(r.paths)
    width = 0.8 / len(path_names)
    for index, name in enumerate(path_names):
        values = [r.paths[name].get(p, 0) for p in PATHS]
        ax.bar(
            [i + index * width for i in range(len(PATHS))],
            values,
            width,
            label=name,
            color=COLORS.get(name, "#777"),
        )
    ax.set_xticks(
        [i + 0.4 - width / 2 for i in range(len(PATHS))],
        [p.replace(" vs ", "\nvs ") for p in PATHS],
        fontsize=8,
    )
    ax.axhline(1, color="black", linewidth=0.8, linestyle="--")
    ax.set_title("Executions when a second copy reaches the worker (correct: 1)")
    ax.legend(fontsize=8)

    fig.suptitle(
        "dedup_jobs vs plain Celery, celery-once, celery-singleton (one Redis as broker and store)"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _names(ax: object, names: list[str]) -> None:
    labels = [
        n.replace("UniqueUntilProcessingJob", "UniqueUntil-\nProcessingJob")
        .replace(" on Django's", "\non Django's")
        .replace("celery-singleton", "celery-\nsingleton")
        .replace(" + ", " +\n")
        for n in names
    ]
    ax.set_xticks(range(len(names)), labels, fontsize=8)  # type: ignore[attr-defined]
