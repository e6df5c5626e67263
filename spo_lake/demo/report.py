"""The demo's outputs over all seeds: the paper-style table with π0, the claims with paired bootstrap intervals,
a markdown report, demo_metrics.json and PNG plots (Figure 1 with error bars; a PTS curve)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

from spo_lake.demo.stats import Paired, mean_std, paired_prompt_difference, paired_seed_difference, per_prompt_pass
from spo_lake.lake import Lake

PI0 = "π0"
HEADLINE = "SPO half-online"
COLUMNS = ("method", "pass@1", "pass@10", "gap", "train pass@1", "train pass@10", "s/step", "peak MB")


@dataclass(frozen=True)
class Claim:
    """`a` beats `b` on `metric`: per prompt (pass@1, pass@10, gap) or per seed (step_s, peak_rss_mb: lower wins)."""

    text: str
    a: str
    b: str
    metric: str


CLAIMS = (
    Claim("SPO half-online pass@1 > π0 pass@1 (RL improves the model)", HEADLINE, PI0, "pass@1"),
    Claim("SPO half-online pass@10 ≥ π0 pass@10", HEADLINE, PI0, "pass@10"),
    Claim("PPO pass@1 > π0 pass@1", "PPO", PI0, "pass@1"),
    Claim("SPO pass@10 > PPO pass@10 (same online data)", "SPO online", "PPO", "pass@10"),
    Claim("SPO half-online pass@10 > PPO pass@10", HEADLINE, "PPO", "pass@10"),
    Claim("half-online > online at equal online budget (pass@10)", HEADLINE, "SPO online", "pass@10"),
    Claim("Monte-Carlo targets help (pass@10)", "SPO + MC (50/25/25)", HEADLINE, "pass@10"),
    Claim("SPO keeps a larger pass@10 − pass@1 gap than PPO", "SPO online", "PPO", "gap"),
    Claim("SPO steps faster than PPO (seconds per step, lower is better)", "SPO online", "PPO", "step_s"),
    Claim("SPO needs less memory than PPO (peak RSS, lower is better)", "SPO online", "PPO", "peak_rss_mb"),
)


def _fmt(v: Any, digits: int = 3) -> str:
    return "–" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _pm(values: list[float], digits: int = 3) -> str:
    if not values:
        return "–"
    mean, std = mean_std(values)
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if len(values) > 1 else f"{mean:.{digits}f}"


# ---------------------------------------------------------------------------------------------- per-prompt data


def _counts(out: Path, seed: int, run_id: str, step: int) -> dict[str, list]:
    return json.loads((out / f"seed-{seed}" / "runs" / run_id / "evals" / f"step-{step}.json").read_text())


def prompt_values(out: Path, seeds: list[dict[str, Any]], split: str = "held_out") -> dict[str, list[dict]]:
    """{method: [per seed {metric: {prompt: value}}]} at each run's last evaluation; π0 from the step-0 evaluation
    (the same for every method of a seed: same model, prompts and sampling seed)."""
    out_values: dict[str, list[dict]] = {}
    for s in seeds:
        for m in s["methods"]:
            last = m["curve"][-1]["step"]
            for name, step in ((m["method"], last), (PI0, 0)):
                counts = _counts(out, s["seed"], m["run_id"], step)[split]
                p1, p10 = per_prompt_pass(counts, 1), per_prompt_pass(counts, 10)
                entry = {"pass@1": p1, "pass@10": p10, "gap": {p: p10[p] - p1[p] for p in p1}}
                values = out_values.setdefault(name, [])
                if name == PI0 and len(values) > seeds.index(s):
                    continue  # π0 once per seed
                values.append(entry)
    return out_values


def test_claims(out: Path, seeds: list[dict[str, Any]]) -> list[tuple[Claim, Paired]]:
    values = prompt_values(out, seeds)
    cost: dict[str, dict[str, list[float]]] = {m["method"]: {} for m in seeds[0]["methods"]}
    for s in seeds:
        for m in s["methods"]:
            for key in ("step_s", "peak_rss_mb"):
                cost[m["method"]].setdefault(key, []).append(m[key])
    results = []
    for claim in CLAIMS:
        if claim.metric in ("step_s", "peak_rss_mb"):  # lower is better: test b − a > 0
            paired = paired_seed_difference(cost[claim.b][claim.metric], cost[claim.a][claim.metric])
        else:
            paired = paired_prompt_difference([v[claim.metric] for v in values[claim.a]],
                                              [v[claim.metric] for v in values[claim.b]])
        results.append((claim, paired))
    return results


# ---------------------------------------------------------------------------------------------- the table


def table_rows(seeds: list[dict[str, Any]]) -> list[list[str]]:
    """Mean ± std over seeds per method, π0 (the step-0 evaluation) first."""
    rows: dict[str, dict[str, list[float]]] = {}

    def add(name: str, key: str, value: float | None) -> None:
        if value is not None:
            rows.setdefault(name, {}).setdefault(key, []).append(value)

    for s in seeds:
        first = s["methods"][0]["curve"][0]
        for key in ("pass@1", "pass@10", "train/pass@1", "train/pass@10"):
            add(PI0, key, first.get(key))
        add(PI0, "gap", first["pass@10"] - first["pass@1"])
        for m in s["methods"]:
            for key in ("pass@1", "pass@10", "train/pass@1", "train/pass@10"):
                add(m["method"], key, m["final"].get(key))
            add(m["method"], "gap", m["gap"])
            add(m["method"], "step_s", m["step_s"])
            add(m["method"], "peak_rss_mb", m["peak_rss_mb"])
    return [[name, _pm(r.get("pass@1", [])), _pm(r.get("pass@10", [])), _pm(r.get("gap", [])),
             _pm(r.get("train/pass@1", [])), _pm(r.get("train/pass@10", [])), _pm(r.get("step_s", []), 2),
             _pm(r.get("peak_rss_mb", []), 0)] for name, r in rows.items()]


def print_table(rows: list[list[str]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for c in COLUMNS:
        table.add_column(c, justify="left" if c == "method" else "right")
    for row in rows:
        table.add_row(*row)
    Console().print(table)


# ---------------------------------------------------------------------------------------------- plots


def plot_curves(seeds: list[dict[str, Any]], path: Path) -> None:
    """pass@1 / pass@10 against training step per method, mean over seeds with ± std bars, π0 at step 0; held-out
    prompts on top, training prompts below (the paper's Figure 1, plus optimisation vs generalisation)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)
    names = [m["method"] for m in seeds[0]["methods"]]
    for name in names:
        curves = [next(m for m in s["methods"] if m["method"] == name)["curve"] for s in seeds]
        steps = [p["step"] for p in curves[0]]
        for row, prefix in enumerate(("", "train/")):
            for col, k in enumerate(("pass@1", "pass@10")):
                key = prefix + k
                if key not in curves[0][0]:
                    continue
                stats = [mean_std([c[i][key] for c in curves]) for i in range(len(steps))]
                axes[row][col].errorbar(steps, [m for m, _ in stats], yerr=[s for _, s in stats], marker="o",
                                        capsize=3, label=name)
    for row, where in enumerate(("held-out prompts", "training prompts")):
        for col, k in enumerate(("pass@1", "pass@10")):
            ax = axes[row][col]
            ax.set_title(f"{k} on {where}")
            ax.set_ylabel(f"{k} (20 samples, T=0.4)")
            ax.set_xlabel("training step (step 0 = π0)")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"countdown, mean ± std over {len(seeds)} seed(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def pts_curve(lake: Lake, snapshot: str) -> dict[str, Any] | None:
    """The searched trajectory with the most pivots: its prompt, prefix success estimates and pivotal tokens."""
    best = lake.sql("""SELECT trajectory_id, count(*) AS n FROM pivots GROUP BY 1 ORDER BY n DESC, trajectory_id
                       LIMIT 1""", snapshot).to_pylist()
    if not best:
        best = lake.sql("""SELECT trajectory_id FROM "values" WHERE trajectory_id IS NOT NULL
                           ORDER BY trajectory_id LIMIT 1""", snapshot).to_pylist()
    if not best:
        return None
    tid = best[0]["trajectory_id"]
    params = {"tid": tid}
    points = lake.sql("""SELECT position, max_by(n_success::DOUBLE / n, n) AS s FROM "values"
                         WHERE trajectory_id = $tid GROUP BY position ORDER BY position""",
                      snapshot, params).to_pylist()
    pivots = lake.sql("SELECT position, token_id, s_before, s_after FROM pivots WHERE trajectory_id = $tid "
                      "ORDER BY position", snapshot, params).to_pylist()
    row = lake.sql("SELECT t.response_text, p.prompt FROM trajectories t JOIN prompts p USING (prompt_id) "
                   "WHERE t.trajectory_id = $tid", snapshot, params).to_pylist()
    return {"trajectory_id": tid, "points": points, "pivots": pivots,
            "response": row[0]["response_text"] if row else "", "prompt": row[0]["prompt"] if row else ""}


def plot_pts(curve: dict[str, Any], path: Path, tokens: list[str] | None = None) -> None:
    """The success-probability curve along the response; x ticks are the response's tokens when given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    xs, ys = [p["position"] for p in curve["points"]], [p["s"] for p in curve["points"]]
    ax.step(xs, ys, where="post", marker="o", label="estimated P(success | first t tokens)")
    for p in curve["pivots"]:
        ax.axvspan(p["position"], p["position"] + 1, color="red", alpha=0.2)
        ax.annotate(f"{p['s_before']:.2f}→{p['s_after']:.2f}", (p["position"] + 0.5, p["s_after"]), ha="center",
                    fontsize=8, color="red")
    if tokens:  # token t sits between positions t and t+1
        ax.set_xticks([i + 0.5 for i in range(len(tokens))], [repr(t)[1:-1] for t in tokens], fontsize=8)
        ax.set_xlabel("response tokens (a pivotal token is shaded: choosing it moved P(success) most)")
    else:
        ax.set_xlabel("response tokens t")
    ax.set_ylabel("P(success | prefix), π0 rollouts")
    ax.set_ylim(-0.05, 1.05)
    prompt = " ".join(curve.get("prompt", "").split())
    ax.set_title(f"Pivotal Token Search\n{prompt[:110]}\nresponse: {curve['response'][:80]!r}", fontsize=8)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _response_tokens(model_dir: Path, curve: dict[str, Any]) -> list[str] | None:
    """The searched response as π0's tokenizer splits it (PTS positions count those tokens)."""
    try:
        from transformers import AutoTokenizer

        from spo_lake.models.backend import tokenize_response

        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        _, ids = tokenize_response(tokenizer, curve["prompt"], curve["response"])
        return [cast(str, tokenizer.decode([i])) for i in ids]  # (its annotation also covers decoding a batch)
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------- the report


def write_report(out: Path, seeds: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """report.md, demo_metrics.json, pass_at_k.png and pts_curve.png in `out`; returns the aggregated summary."""
    rows = table_rows(seeds)
    claims = test_claims(out, seeds)
    mode = "quick" if meta["quick"] else "full"
    print_table(rows, f"countdown, {mode} mode, {len(seeds)} seed(s): mean ± std")
    plot_curves(seeds, out / "pass_at_k.png")
    first = seeds[0]["seed"]
    curve = pts_curve(Lake.open(str(out / f"seed-{first}" / "lake")), f"demo-{first}")
    if curve:
        plot_pts(curve, out / "pts_curve.png", _response_tokens(out / f"seed-{first}" / "models" / "pi0", curve))
    summary = {**meta, "seeds": seeds, "table": {"columns": list(COLUMNS), "rows": rows},
               "claims": [{**asdict(c), **asdict(p), "verdict": p.verdict} for c, p in claims]}
    (out / "demo_metrics.json").write_text(json.dumps(summary, indent=2, default=str))
    lines = [
        "# spo-lake demo report", "",
        f"{mode.capitalize()} mode, seeds {', '.join(str(s['seed']) for s in seeds)}. pass@k on held-out countdown "
        "prompts (and on the training prompts, `train`): 20 samples per prompt, temperature 0.4, top-p 0.95, "
        f"unbiased estimator; mean ± std over seeds. {PI0} is the step-0 evaluation of the starting model. Every "
        "method used the same number of online rollouts; mixed runs add lake rows on top.", "",
        "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS),
        *["| " + " | ".join(row) + " |" for row in rows], "",
        "## The paper's claims at this scale", "",
        "Paired differences (a − b; for cost, b − a), prompt by prompt within each seed, averaged over seeds; 95 % "
        "stratified bootstrap interval over prompts (over seeds for cost). *holds*: the interval lies above 0; "
        "*reversed*: below 0; *not shown*: it contains 0.", "",
        "| claim | difference | 95 % interval | per seed | verdict |", "|---|---|---|---|---|",
        *[f"| {c.text} | {p.mean:+.3f} | [{p.low:+.3f}, {p.high:+.3f}] | "
          f"{' / '.join(f'{d:+.3f}' for d in p.per_seed)} | **{p.verdict}** |" for c, p in claims], "",
        "![pass@k against step](pass_at_k.png)", "",
    ]
    if curve:
        lines += [f"PTS success-probability curve of trajectory `{curve['trajectory_id']}` "
                  f"({len(curve['pivots'])} pivotal tokens):", "", "![PTS curve](pts_curve.png)", ""]
    lines += ["## Per seed", ""]
    for s in seeds:
        resumed = [m["method"] for m in s["methods"] if m["resumed"]]
        note = f" (resumed runs, wall time of the continuation only: {', '.join(resumed)})" if resumed else ""
        lines += [f"Seed {s['seed']}: lake built in {s['recipe_seconds']} s, seed total {s['total_seconds']} s{note}.",
                  "", "| step | summary | seconds |", "|---|---|---|",
                  *[f"| {r['step']} | {r['summary']} | {r['seconds']} |" for r in s["recipe_steps"]], ""]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return summary
