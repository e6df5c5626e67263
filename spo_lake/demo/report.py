"""The demo's outputs: the paper-style table, a markdown report, and PNG plots (Figure 1; a PTS curve)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from spo_lake.lake import Lake

COLUMNS = ("method", "pass@1", "pass@10", "gap", "wall s", "peak MB", "online samples")


def _fmt(v: Any, digits: int = 3) -> str:
    return "–" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def table_rows(methods: list[dict[str, Any]]) -> list[list[str]]:
    return [[m["method"], _fmt(m["pass1"]), _fmt(m["pass10"]), _fmt(m["gap"]), _fmt(m["wall_s"], 0),
             _fmt(m["peak_rss_mb"], 0), str(m["online_samples"])] for m in methods]


def print_table(methods: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="held-out countdown: pass@k (20 samples, T=0.4, top-p 0.95)")
    for c in COLUMNS:
        table.add_column(c, justify="left" if c == "method" else "right")
    for row in table_rows(methods):
        table.add_row(*row)
    Console().print(table)


def plot_curves(methods: list[dict[str, Any]], path: Path) -> None:
    """pass@10 and pass@1 against training step for every method (the paper's Figure 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    for m in methods:
        steps = [p["step"] for p in m["curve"]]
        for ax, key in zip(axes, ("pass@10", "pass@1")):
            ax.plot(steps, [p[key] for p in m["curve"]], marker="o", label=m["method"])
    for ax, key in zip(axes, ("pass@10", "pass@1")):
        ax.set_title(f"{key} on held-out prompts")
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def pts_curve(lake: Lake, snapshot: str) -> dict[str, Any] | None:
    """The searched trajectory with the most pivots: its prefix success estimates and pivotal tokens."""
    best = lake.sql("""SELECT trajectory_id, count(*) AS n FROM pivots GROUP BY 1 ORDER BY n DESC, trajectory_id LIMIT 1""",
                    snapshot).to_pylist()
    if not best:
        best = lake.sql("""SELECT trajectory_id FROM "values" WHERE trajectory_id IS NOT NULL
                           ORDER BY trajectory_id LIMIT 1""", snapshot).to_pylist()
    if not best:
        return None
    tid = best[0]["trajectory_id"].replace("'", "''")
    points = lake.sql(f"""SELECT position, max_by(n_success::DOUBLE / n, n) AS s FROM "values"
                          WHERE trajectory_id = '{tid}' GROUP BY position ORDER BY position""", snapshot).to_pylist()
    pivots = lake.sql(f"SELECT position, s_before, s_after FROM pivots WHERE trajectory_id = '{tid}' ORDER BY position",
                      snapshot).to_pylist()
    text = lake.sql(f"SELECT response_text FROM trajectories WHERE trajectory_id = '{tid}'", snapshot).to_pylist()
    return {"trajectory_id": tid, "points": points, "pivots": pivots,
            "response": text[0]["response_text"] if text else ""}


def plot_pts(curve: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    xs, ys = [p["position"] for p in curve["points"]], [p["s"] for p in curve["points"]]
    ax.step(xs, ys, where="post", marker="o", label="estimated P(success | first t tokens)")
    for p in curve["pivots"]:
        ax.axvspan(p["position"], p["position"] + 1, color="red", alpha=0.2)
        ax.annotate(f"{p['s_before']:.2f}→{p['s_after']:.2f}", (p["position"] + 0.5, p["s_after"]), ha="center",
                    fontsize=8, color="red")
    ax.set_xlabel("response tokens t")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(f"Pivotal Token Search: {curve['response'][:60]!r}", fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(out: Path, lake: Lake, summary: dict[str, Any], snapshot: str) -> Path:
    methods = summary["methods"]
    print_table(methods)
    plot_curves(methods, out / "pass_at_k.png")
    curve = pts_curve(lake, snapshot)
    if curve:
        plot_pts(curve, out / "pts_curve.png")
    lines = [
        "# spo-lake demo report", "",
        f"Seed {summary['seed']}, {'quick' if summary['quick'] else 'full'} mode; lake built in "
        f"{summary['recipe_seconds']} s, total {summary['total_seconds']} s. Snapshot `{snapshot}`.", "",
        "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS),
        *["| " + " | ".join(row) + " |" for row in table_rows(methods)], "",
        "pass@k on held-out countdown prompts: 20 samples per prompt, temperature 0.4, top-p 0.95, unbiased estimator.",
        "Every method used the same number of online rollouts; mixed runs add lake rows on top.", "",
        "![pass@k against step](pass_at_k.png)", "",
    ]
    if curve:
        lines += [f"PTS success-probability curve of trajectory `{curve['trajectory_id']}` "
                  f"({len(curve['pivots'])} pivotal tokens):", "", "![PTS curve](pts_curve.png)", ""]
    lines += ["## Lake build", "", "| step | summary | seconds |", "|---|---|---|",
              *[f"| {s['step']} | {s['summary']} | {s['seconds']} |" for s in summary["recipe_steps"]]]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
