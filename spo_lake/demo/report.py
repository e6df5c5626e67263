"""The demo's outputs over all seeds: the paper-style table with π0, the claims with paired bootstrap intervals,
a markdown report, demo_metrics.json and PNG plots (Figure 1 with error bars; a PTS curve)."""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, cast

from spo_lake.demo.lake_fit import PI0, seed_fit
from spo_lake.demo.stats import Paired, mean_std, paired_prompt_difference, paired_seed_difference, per_prompt_pass
from spo_lake.lake import Lake
from spo_lake.models.identity import model_identity
from spo_lake.pipelines.q0 import latest_prompt_values
from spo_lake.tasks.countdown import needs_product

HEADLINE = "SPO half-online"
BEST_ONLINE = "best online-only arm"  # resolved per report: the online-only arm with the highest mean
ONLINE_ONLY = ("PPO", "GRPO", "SPO online")
GROUPS = {"skill": "held-out problems that need * or / (the lake's knowledge)", "other": "the other held-out problems",
          "all": "all held-out problems"}
COLUMNS = ("method", "skill pass@1", "skill pass@10", "other pass@1", "other pass@10", "skill Δ nats",
           "other Δ nats", "train pass@1", "s/step", "state MB", "peak RSS MB")


@dataclass(frozen=True)
class Claim:
    """`a` − `b` ≥ `at_least` on `metric` over the prompts of `group`: per prompt (pass@1, pass@10, gap) or per seed
    (step_s, state_mb: lower wins). It holds when the mean difference reaches `at_least` and its interval lies
    above min(at_least, 0); it is reversed when the interval lies below that."""

    text: str
    a: str
    b: str
    metric: str
    group: str = "all"
    at_least: float = 0.0
    target: bool = False  # one of issue 25's targets (the report lists those that do not hold)

    def verdict(self, p: Paired) -> str:
        floor = min(self.at_least, 0.0)
        if p.mean >= self.at_least and p.low > floor:
            return "holds"
        return "reversed" if p.high < floor else "not shown"


CLAIMS = (
    # what only a lake gives (issue 25's targets): the problems that need the skill π0 rarely has
    Claim("SPO half-online − the best online-only arm ≥ +0.10 pass@1 on the skill problems", HEADLINE, BEST_ONLINE,
          "pass@1", "skill", 0.10, target=True),
    Claim("SPO half-online ≥ SFT→GRPO − 0.02 pass@1 on the skill problems", HEADLINE, "SFT→GRPO", "pass@1", "skill",
          -0.02, target=True),
    Claim("SPO half-online ≥ GRPO + lake solutions pass@1 on the skill problems", HEADLINE, "GRPO + lake solutions",
          "pass@1", "skill", target=True),
    Claim("SPO half-online pass@1 > π0 pass@1 on the skill problems", HEADLINE, PI0, "pass@1", "skill"),
    Claim("SFT→GRPO pass@1 > π0 pass@1 on the skill problems", "SFT→GRPO", PI0, "pass@1", "skill"),
    Claim("Monte-Carlo targets help (pass@10, skill problems)", "SPO + MC (50/25/25)", HEADLINE, "pass@10", "skill"),
    # what the runs absorbed of the lake, without sampling noise: log-likelihood of the held-out solver solutions
    Claim("SPO half-online absorbs more of the skill's solutions than the best online-only arm (nats)", HEADLINE,
          BEST_ONLINE, "nats", "skill"),
    Claim("SPO half-online absorbs more of the skill's solutions than SFT→GRPO (nats)", HEADLINE, "SFT→GRPO", "nats",
          "skill"),
    # nothing lost elsewhere
    *(Claim(f"{m} loses at most 0.02 pass@1 to π0 on the other problems", m, PI0, "pass@1", "other", -0.02, target=True)
      for m in ("PPO", "GRPO", "SPO online", HEADLINE, "SPO + MC (50/25/25)", "SFT→GRPO", "GRPO + lake solutions")),
    # the paper's cost claims
    Claim("SPO keeps a larger pass@10 − pass@1 gap than PPO", "SPO online", "PPO", "gap"),
    Claim("SPO steps faster than PPO (seconds per step, lower is better)", "SPO online", "PPO", "step_s"),
    # the training state by tensor: a process's RSS is mostly the runtime at the tiny model's size (issue 27)
    Claim("SPO needs less memory than PPO (training state, lower is better)", "SPO online", "PPO", "state_mb"),
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


def prompt_groups(out: Path, seed: int) -> dict[str, str]:
    """{prompt_id: "skill" | "other"} of a seed's countdown prompts: "skill" when every solution needs * or /."""
    return problem_groups(Lake.open(str(out / f"seed-{seed}" / "lake")))


def problem_groups(lake: Lake, snapshot: str | None = None) -> dict[str, str]:
    """{prompt_id: "skill" | "other"} of a lake's countdown prompts."""
    rows = lake.sql("SELECT prompt_id, tests FROM prompts WHERE task = 'countdown'", snapshot).to_pylist()
    groups = {}
    for r in rows:
        tests = json.loads(r["tests"]) if isinstance(r["tests"], str) else r["tests"]
        groups[r["prompt_id"]] = "skill" if needs_product(tests["numbers"], tests["target"]) else "other"
    return groups


def starting_point(out: Path, seed: int) -> dict[str, dict[str, Any]]:
    """Where π0 and the lake stand before any training, per group of a seed's training prompts (skill / other), at
    the snapshot the runs pin: π0's success per sample and the prompts it solved at least once (the q0 step's
    Monte-Carlo counts, temperature 1), and the prompts the lake holds a correct solution to, per source."""
    lake, prefix, snapshot = Lake.open(str(out / f"seed-{seed}" / "lake")), f"countdown/{seed}/", f"demo-{seed}"
    groups = {pid: g for pid, g in prompt_groups(out, seed).items() if pid.startswith(prefix)}
    # the counts Q̂0 is read from (the trainer's rule: the row with the largest n per prompt)
    q0 = latest_prompt_values(lake, model_identity(str(out / f"seed-{seed}" / "models" / "pi0")), snapshot)
    solved = lake.sql("""SELECT DISTINCT t.prompt_id, t.source FROM trajectories t JOIN evaluations e
                         USING (trajectory_id) WHERE e.passed AND t.prompt_id LIKE $prefix""",
                      snapshot, {"prefix": prefix + "%"}).to_pylist()
    result: dict[str, dict[str, Any]] = {}
    for group in ("skill", "other"):
        counts = [r for r in q0 if groups.get(r["prompt_id"]) == group]
        samples = sum(r["n"] for r in counts)
        sources = Counter(r["source"] for r in solved if groups.get(r["prompt_id"]) == group)
        result[group] = {"prompts": sum(1 for g in groups.values() if g == group), "q0_prompts": len(counts),
                         "q0_samples": samples,
                         "pi0_success_per_sample": sum(r["n_success"] for r in counts) / samples if samples else None,
                         "pi0_solved_prompts": sum(1 for r in counts if r["n_success"] > 0),
                         "lake_solved_prompts": dict(sorted(sources.items()))}
    return result


def _in_group(counts: list, groups: dict[str, str], group: str) -> list:
    return [c for c in counts if group == "all" or groups.get(c[0]) == group]


def held_out_fit(out: Path, seed: dict[str, Any]) -> dict[str, dict[str, float]]:
    """{π0 or run_id: {prompt_id: log-likelihood of its solver solutions}} over a seed's evaluated held-out prompts
    (spo_lake.demo.lake_fit; scored once, then read from the seed's lake_fit.json)."""
    first = seed["methods"][0]
    prompt_ids = [c[0] for c in _counts(out, seed["seed"], first["run_id"], 0)["held_out"]]
    return seed_fit(out / f"seed-{seed['seed']}", prompt_ids, f"demo-{seed['seed']}",
                    [m["run_id"] for m in seed["methods"]])


def prompt_values(out: Path, seeds: list[dict[str, Any]], group: str = "all",
                  split: str = "held_out") -> dict[str, list[dict]]:
    """{method: [per seed {metric: {prompt: value}}]} over the prompts of `group` at each run's last evaluation; π0
    from the step-0 evaluation (the same for every method of a seed: same model, prompts and sampling seed). `nats`
    (held-out only): the log-likelihood of a prompt's solver solutions under the run's last checkpoint minus π0's."""
    out_values: dict[str, list[dict]] = {}
    for s in seeds:
        groups = prompt_groups(out, s["seed"])
        fit = held_out_fit(out, s) if split == "held_out" else {}
        for m in s["methods"]:
            last = m["curve"][-1]["step"]
            for name, step, fit_key in ((m["method"], last, m["run_id"]), (PI0, 0, PI0)):
                counts = _in_group(_counts(out, s["seed"], m["run_id"], step)[split], groups, group)
                p1, p10 = per_prompt_pass(counts, 1), per_prompt_pass(counts, 10)
                entry = {"pass@1": p1, "pass@10": p10, "gap": {p: p10[p] - p1[p] for p in p1}}
                if fit:
                    entry["nats"] = {p: fit[fit_key][p] - fit[PI0][p] for p in p1 if p in fit[PI0]}
                values = out_values.setdefault(name, [])
                if name == PI0 and len(values) > seeds.index(s):
                    continue  # π0 once per seed
                values.append(entry)
    return out_values


def _prompt_mean(by_prompt: dict[str, float]) -> float:
    """The mean over prompts (0 for none): a seed's pass@k over a problem group."""
    return sum(by_prompt.values()) / max(len(by_prompt), 1)


def _mean(values: list[dict], metric: str) -> float:
    per_seed = [_prompt_mean(v[metric]) for v in values]
    return sum(per_seed) / max(len(per_seed), 1)


def test_claims(out: Path, seeds: list[dict[str, Any]]) -> list[tuple[Claim, Paired]]:
    """Every claim whose methods ran, with its paired difference; BEST_ONLINE resolved to a named arm."""
    values = {group: prompt_values(out, seeds, group) for group in GROUPS}
    cost: dict[str, dict[str, list[float]]] = {m["method"]: {} for m in seeds[0]["methods"]}
    for s in seeds:
        for m in s["methods"]:
            for key in ("step_s", "state_mb"):  # state_mb: None in a summary written before it was counted
                if m.get(key) is not None:
                    cost[m["method"]].setdefault(key, []).append(m[key])
    results = []
    for claim in CLAIMS:
        if claim.b == BEST_ONLINE:
            online = [m for m in ONLINE_ONLY if m in cost]
            if not online:
                continue
            best = max(online, key=lambda m: _mean(values[claim.group][m], claim.metric))
            claim = replace(claim, b=best, text=claim.text.replace(BEST_ONLINE, f"{BEST_ONLINE} ({best})"))
        if not {claim.a, claim.b} <= set(cost) | {PI0}:
            continue  # a method this demo did not run
        if claim.metric in ("step_s", "state_mb"):  # lower is better: test b − a > 0
            if any(len(cost[m].get(claim.metric, [])) != len(seeds) for m in (claim.a, claim.b)):
                continue  # not measured in every seed
            paired = paired_seed_difference(cost[claim.b][claim.metric], cost[claim.a][claim.metric])
        else:
            group = values[claim.group]
            paired = paired_prompt_difference([v[claim.metric] for v in group[claim.a]],
                                              [v[claim.metric] for v in group[claim.b]])
        results.append((claim, paired))
    return results


# ---------------------------------------------------------------------------------------------- the table


def table_rows(out: Path, seeds: list[dict[str, Any]]) -> list[list[str]]:
    """Mean ± std over seeds per method, π0 (the step-0 evaluation) first: held-out pass@k on the skill problems and
    on the others, training-prompt pass@1, cost."""
    rows: dict[str, dict[str, list[float]]] = {}
    for group in ("skill", "other"):
        for name, per_seed in prompt_values(out, seeds, group).items():
            for metric in ("pass@1", "pass@10", "nats"):
                for v in per_seed:
                    column = f"{group} Δ nats" if metric == "nats" else f"{group} {metric}"
                    rows.setdefault(name, {}).setdefault(column, []).append(_prompt_mean(v[metric]))
    for s in seeds:
        first = s["methods"][0]["curve"][0]
        if first.get("train/pass@1") is not None:
            rows[PI0].setdefault("train pass@1", []).append(first["train/pass@1"])
        for m in s["methods"]:
            r = rows.setdefault(m["method"], {})
            if m["final"].get("train/pass@1") is not None:
                r.setdefault("train pass@1", []).append(m["final"]["train/pass@1"])
            r.setdefault("s/step", []).append(m["step_s"])
            if m.get("state_mb") is not None:
                r.setdefault("state MB", []).append(m["state_mb"])
            r.setdefault("peak RSS MB", []).append(m["peak_rss_mb"])
    order = [PI0] + [m["method"] for m in seeds[0]["methods"]]
    return [[name] + [_pm(rows[name].get(c, []), 2 if c == "s/step" or "nats" in c else 0 if c.endswith("MB") else 3)
                      for c in COLUMNS[1:]] for name in order if name in rows]


def print_table(rows: list[list[str]], title: str) -> None:
    from rich.table import Table

    from spo_lake.console import print_table as show

    table = Table(title=title)
    for c in COLUMNS:
        table.add_column(c, justify="left" if c == "method" else "right")
    for row in rows:
        table.add_row(*row)
    show(table)  # drawn on a terminal, Markdown with every number in full in a log


# ---------------------------------------------------------------------------------------------- plots


def _group_pass(out: Path, seed: int, run_id: str, step: int, groups: dict[str, str], group: str, k: int) -> float:
    return _prompt_mean(per_prompt_pass(_in_group(_counts(out, seed, run_id, step)["held_out"], groups, group), k))


PANELS = (("skill", "pass@1"), ("skill", "pass@10"), ("other", "pass@1"), ("train", "pass@1"))


def plot_curves(out: Path, seeds: list[dict[str, Any]], path: Path) -> None:
    """pass@k against training step per method, mean over seeds with ± std bars, π0 at step 0: held-out problems that
    need the skill, the other held-out problems, and the training prompts (optimisation vs generalisation)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    names = [m["method"] for m in seeds[0]["methods"]]
    groups = {s["seed"]: prompt_groups(out, s["seed"]) for s in seeds}
    for name in names:
        runs = [(s["seed"], next(m for m in s["methods"] if m["method"] == name)) for s in seeds]
        steps = [p["step"] for p in runs[0][1]["curve"]]
        for ax, (group, metric) in zip(axes.flat, PANELS):
            per_step = []
            for i, _ in enumerate(steps):
                if group == "train":
                    per_step.append([m["curve"][i].get("train/" + metric, 0.0) for _, m in runs])
                else:
                    k = int(metric.split("@")[1])
                    per_step.append([_group_pass(out, seed, m["run_id"], m["curve"][i]["step"], groups[seed], group, k)
                                     for seed, m in runs])
            stats = [mean_std(v) for v in per_step]
            ax.errorbar(steps, [m for m, _ in stats], yerr=[s for _, s in stats], marker="o", capsize=3, label=name)
    for ax, (group, metric) in zip(axes.flat, PANELS):
        where = "training prompts" if group == "train" else GROUPS[group]
        ax.set_title(f"{metric} on {where}", fontsize=9)
        ax.set_ylabel(f"{metric} (20 samples, T=0.4)")
        ax.set_xlabel("training step (step 0 = π0)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"countdown with a skill-gap π0, mean ± std over {len(seeds)} seed(s)")
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

        tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
        _, ids = tokenize_response(tokenizer, curve["prompt"], curve["response"])
        return [cast(str, tokenizer.decode([i])) for i in ids]  # (its annotation also covers decoding a batch)
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------- the report


def _pi0_fit(out: Path, seeds: list[dict[str, Any]]) -> str:
    """π0's mean log-likelihood of the held-out solver solutions per group, mean over seeds."""
    per_group: dict[str, list[float]] = {}
    for s in seeds:
        groups, fit = prompt_groups(out, s["seed"]), held_out_fit(out, s)[PI0]
        for group in ("skill", "other"):
            values = [v for p, v in fit.items() if groups.get(p) == group]
            if values:
                per_group.setdefault(group, []).append(sum(values) / len(values))
    return ", ".join(f"{g} {sum(v) / len(v):.2f} nats" for g, v in per_group.items())


def reading(rows: list[list[str]], claims: list[tuple[Claim, Paired]]) -> list[str]:
    """The report's plain reading under the claims: issue 25's targets that do not hold, and each arm's skill pass@1
    beside its skill Δ nats, which tells "learned nothing from the lake" from "absorbed it, not yet as the mode"."""
    targets = [(c, p) for c, p in claims if c.target]
    missed = [(c, p) for c, p in targets if c.verdict(p) != "holds"]
    lines = [f"{len(targets) - len(missed)} of {len(targets)} targets hold." + (" Those that do not:" * bool(missed))]
    lines += [f"- {c.text}: **{c.verdict(p)}**, {p.mean:+.3f} [{p.low:+.3f}, {p.high:+.3f}]" for c, p in missed]
    column = {name: i for i, name in enumerate(COLUMNS)}
    lines += ["", "Skill pass@1 beside skill Δ nats (mean over seeds): " + "; ".join(
        f"{r[0]} {r[column['skill pass@1']].split(' ±')[0]} / {r[column['skill Δ nats']].split(' ±')[0]}"
        for r in rows) + ". An arm whose Δ nats rose while its skill pass@1 stayed near π0's absorbed the lake's "
        "answers without one becoming its mode at temperature 0.4; an arm whose pass@1 rose with few nats moved its "
        "mode to answers of its own. The mechanisms, measured: docs/results-skill-gap.md."]
    return lines


def _rate(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


def write_report(out: Path, seeds: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """report.md, demo_metrics.json, pass_at_k.png and pts_curve.png in `out`; returns the aggregated summary."""
    rows = table_rows(out, seeds)
    claims = test_claims(out, seeds)
    mode = "quick" if meta["quick"] else "full"
    print_table(rows, f"countdown, {mode} mode, {len(seeds)} seed(s): mean ± std")
    plot_curves(out, seeds, out / "pass_at_k.png")
    first = seeds[0]["seed"]
    curve = pts_curve(Lake.open(str(out / f"seed-{first}" / "lake")), f"demo-{first}")
    if curve:
        plot_pts(curve, out / "pts_curve.png", _response_tokens(out / f"seed-{first}" / "models" / "pi0", curve))
    start = {s["seed"]: starting_point(out, s["seed"]) for s in seeds}
    summary = {**meta, "seeds": seeds, "starting_point": start, "table": {"columns": list(COLUMNS), "rows": rows},
               "claims": [{**asdict(c), **asdict(p), "verdict": c.verdict(p)} for c, p in claims]}
    (out / "demo_metrics.json").write_text(json.dumps(summary, indent=2, default=str))
    lines = [
        "# spo-lake demo report", "",
        f"{mode.capitalize()} mode, seeds {', '.join(str(s['seed']) for s in seeds)}. π0 rarely multiplies: problems "
        "that need * or / were rare in its training, while the lake holds solutions to them (solver, the CoT-like "
        "model). pass@k on held-out countdown problems that need the skill (`skill`) and on the others (`other`), "
        "and on the training prompts (`train`): 20 samples per prompt, temperature 0.4, top-p 0.95, unbiased "
        f"estimator; mean ± std over seeds. {PI0} is the step-0 evaluation of the starting model. Δ nats: the mean "
        "log-likelihood of the held-out problems' solver solutions (never trained on) under the run's last checkpoint "
        f"minus π0's ({_pi0_fit(out, seeds)}): what a run absorbed of the lake's kind of answer, which pass@1 at "
        "temperature 0.4 shows only once such an answer becomes the policy's mode. Every method "
        "sampled the same number of online rollouts; mixed runs add lake rows on top, SFT→GRPO's SFT steps read "
        "as many lake rows as SPO half-online before its online steps.", "",
        "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS),
        *["| " + " | ".join(row) + " |" for row in rows], "",
        "## Before any training", "",
        "The training prompts, from the lake at the snapshot every run pins: π0's success per sample at temperature 1 "
        "(the q0 step's Monte-Carlo counts, from which Q̂0 is computed), the prompts it solved at least once, and the "
        "prompts the lake holds a correct solution to, per source.", "",
        "| seed | problems | prompts | π0 success per sample | π0 solved ≥ once | the lake solves (per source) |",
        "|---|---|---|---|---|---|",
        *[f"| {seed} | {group} | {g['prompts']} | {_rate(g['pi0_success_per_sample'])} ({g['q0_samples']} samples) | "
          f"{g['pi0_solved_prompts']} / {g['q0_prompts']} | "
          f"{', '.join(f'{k} {v}' for k, v in g['lake_solved_prompts'].items()) or '–'} |"
          for seed, groups in start.items() for group, g in groups.items()], "",
        "## Claims", "",
        "Paired differences (a − b; for cost, b − a), prompt by prompt within each seed, averaged over seeds; 95 % "
        "stratified bootstrap interval over prompts (over seeds for cost). *holds*: the mean difference reaches the "
        "claim's bound (0 unless the claim names one) and the interval lies above min(bound, 0); *reversed*: the "
        "interval lies below that; *not shown*: neither.", "",
        "| claim | difference | 95 % interval | per seed | verdict |", "|---|---|---|---|---|",
        *[f"| {c.text} | {p.mean:+.3f} | [{p.low:+.3f}, {p.high:+.3f}] | "
          f"{' / '.join(f'{d:+.3f}' for d in p.per_seed)} | **{c.verdict(p)}** |" for c, p in claims], "",
        "## Where the targets stand", "", *reading(rows, claims), "",
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
