"""The demo's outputs over all seeds: the paper-style table with π0, the claims with paired bootstrap intervals,
a markdown report, demo_metrics.json and PNG plots (Figure 1 with error bars; a PTS curve)."""
from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, cast

from spo_lake.console import console
from spo_lake.demo.experiment import COUNTDOWN, EXPERIMENTS
from spo_lake.demo.experiment import countdown_groups as problem_groups
from spo_lake.demo.lake_fit import PI0, seed_fit
from spo_lake.demo.stats import Paired, mean_std, paired_prompt_difference, paired_seed_difference, per_prompt_pass
from spo_lake.lake import Lake
from spo_lake.models.identity import model_identity
from spo_lake.pipelines.q0 import latest_prompt_values

HEADLINE = "SPO half-online"
BEST_ONLINE = "best online-only arm"  # resolved per report: the online-only arm with the highest mean
ONLINE_ONLY = ("PPO", "GRPO", "SPO online")
GROUPS = {"skill": "held-out problems that need * or / (the lake's knowledge)", "other": "the other held-out problems",
          "all": "all held-out problems"}
COLUMNS = ("method", "skill pass@1", "skill pass@k", "other pass@1", "other pass@k", "skill Δ nats",
           "other Δ nats", "train pass@1", "s/step", "state MB", "peak RSS MB", "lr", "lake rows")


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
    Claim("Monte-Carlo targets help (pass@10, skill problems)", "SPO + MC (50/25/25)", HEADLINE, "pass@k", "skill"),
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
    """{prompt_id: "skill" | "other"} of a seed's prompts, as the demo fixed them before training (groups.json:
    spo_lake.demo.experiment); a seed without that file is a countdown one: "skill" when every solution needs * or /."""
    fixed = out / f"seed-{seed}" / "groups.json"
    if fixed.is_file():
        return cast(dict[str, str], json.loads(fixed.read_text())["groups"])
    return problem_groups(Lake.open(str(out / f"seed-{seed}" / "lake")))


def starting_point(out: Path, seed: int, prefix: str | None = None) -> dict[str, dict[str, Any]]:
    """Where π0 and the lake stand before any training, per group of a seed's training prompts (skill / other), at
    the snapshot the runs pin: π0's success per sample and the prompts it solved at least once (the q0 step's
    Monte-Carlo counts, temperature 1), and the prompts the lake holds a correct solution to, per source."""
    lake, snapshot = Lake.open(str(out / f"seed-{seed}" / "lake")), f"demo-{seed}"
    prefix = prefix or f"countdown/{seed}/"
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


def top_k(seeds: list[dict[str, Any]]) -> int:
    """The larger k the runs evaluated (pass@k beside pass@1): 10 for the tiny demo's 20 samples."""
    return max(int(key.split("@")[1]) for key in seeds[0]["methods"][0]["curve"][0] if key.startswith("pass@"))


def prompt_values(out: Path, seeds: list[dict[str, Any]], group: str = "all",
                  split: str = "held_out") -> dict[str, list[dict]]:
    """{method: [per seed {metric: {prompt: value}}]} over the prompts of `group` at each run's last evaluation; π0
    from the step-0 evaluation (the same for every method of a seed: same model, prompts and sampling seed). `nats`
    (held-out only): the log-likelihood of a prompt's solver solutions under the run's last checkpoint minus π0's."""
    out_values: dict[str, list[dict]] = {}
    k = top_k(seeds)
    for s in seeds:
        groups = prompt_groups(out, s["seed"])
        fit = held_out_fit(out, s) if split == "held_out" else {}
        for m in s["methods"]:
            last = m["curve"][-1]["step"]
            for name, step, fit_key in ((m["method"], last, m["run_id"]), (PI0, 0, PI0)):
                counts = _in_group(_counts(out, s["seed"], m["run_id"], step)[split], groups, group)
                p1, pk = per_prompt_pass(counts, 1), per_prompt_pass(counts, k)
                entry = {"pass@1": p1, "pass@k": pk, "gap": {p: pk[p] - p1[p] for p in p1}}
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
            if not any(v[claim.metric] for v in group[claim.a]):
                continue  # no held-out problem of this group at this size (decisions says so)
            paired = paired_prompt_difference([v[claim.metric] for v in group[claim.a]],
                                              [v[claim.metric] for v in group[claim.b]])
        results.append((claim, paired))
    return results


# ---------------------------------------------------------------------------------------------- the table


def table_rows(out: Path, seeds: list[dict[str, Any]]) -> list[list[str]]:
    """Mean ± std over seeds per method, π0 (the step-0 evaluation) first: held-out pass@k on the skill problems and
    on the others, training-prompt pass@1, cost."""
    rows: dict[str, dict[str, list[float]]] = {PI0: {}}  # π0's row stands even where no group has a problem
    for group in ("skill", "other"):
        for name, per_seed in prompt_values(out, seeds, group).items():
            for metric in ("pass@1", "pass@k", "nats"):
                for v in per_seed:
                    column = f"{group} Δ nats" if metric == "nats" else f"{group} {metric}"
                    if v.get(metric):  # a group without held-out problems shows "–", not a mean of nothing
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
            if m.get("peak_rss_mb") is not None:
                r.setdefault("peak RSS MB", []).append(m["peak_rss_mb"])
            if m.get("lr") is not None:
                r.setdefault("lr", []).append(m["lr"])
    order = [PI0] + [m["method"] for m in seeds[0]["methods"]]
    share = {m["method"]: m.get("lake_share", "–") for m in seeds[0]["methods"]} | {PI0: "–"}
    lrs = {name: f"{rows[name]['lr'][0]:g}" if rows[name].get("lr") else "–" for name in rows}
    return [[name] + [_pm(rows[name].get(c, []), 2 if c == "s/step" or "nats" in c else 0 if c.endswith("MB") else 3)
                      for c in COLUMNS[1:-2]] + [lrs[name], share.get(name, "–")] for name in order if name in rows]


def print_table(rows: list[list[str]], title: str, columns: list[str] | None = None) -> None:
    from rich.table import Table

    from spo_lake.console import print_table as show

    table = Table(title=title)
    for c in columns or COLUMNS:
        table.add_column(c, justify="left" if c == "method" else "right")
    for row in rows:
        table.add_row(*row)
    show(table)  # drawn on a terminal, Markdown with every number in full in a log


# ---------------------------------------------------------------------------------------------- plots


def _group_pass(out: Path, seed: int, run_id: str, step: int, groups: dict[str, str], group: str, k: int) -> float:
    return _prompt_mean(per_prompt_pass(_in_group(_counts(out, seed, run_id, step)["held_out"], groups, group), k))


def plot_curves(out: Path, seeds: list[dict[str, Any]], path: Path, labels: dict[str, str] | None = None,
                title: str = "countdown with a skill-gap π0", n: int = 20) -> None:
    """pass@k against training step per method, mean over seeds with ± std bars, π0 at step 0: held-out problems that
    need the skill, the other held-out problems, and the training prompts (optimisation vs generalisation), or all
    held-out problems where the runs did not evaluate the training prompts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = top_k(seeds)
    train = "train/pass@1" in seeds[0]["methods"][0]["curve"][0]
    panels = (("skill", "pass@1"), ("skill", f"pass@{k}"), ("other", "pass@1"), ("train" if train else "all", "pass@1"))
    described = {g: display(d, labels or {}, k) for g, d in GROUPS.items()}
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    names = [m["method"] for m in seeds[0]["methods"]]
    groups = {s["seed"]: prompt_groups(out, s["seed"]) for s in seeds}
    for name in names:
        runs = [(s["seed"], next(m for m in s["methods"] if m["method"] == name)) for s in seeds]
        steps = [p["step"] for p in runs[0][1]["curve"]]
        for ax, (group, metric) in zip(axes.flat, panels):
            per_step = []
            for i, _ in enumerate(steps):
                if group == "train":
                    per_step.append([m["curve"][i].get("train/" + metric, 0.0) for _, m in runs])
                else:
                    per_step.append([_group_pass(out, seed, m["run_id"], m["curve"][i]["step"], groups[seed], group,
                                                 int(metric.split("@")[1])) for seed, m in runs])
            stats = [mean_std(v) for v in per_step]
            ax.errorbar(steps, [m for m, _ in stats], yerr=[s for _, s in stats], marker="o", capsize=3, label=name)
    for ax, (group, metric) in zip(axes.flat, panels):
        where = "training prompts" if group == "train" else described[group]
        ax.set_title(f"{metric} on {where}", fontsize=9)
        ax.set_ylabel(f"{metric} ({n} samples, T=0.4)")
        ax.set_xlabel("training step (step 0 = π0)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{title}, mean ± std over {len(seeds)} seed(s)")
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


def _pi0_fit(out: Path, seeds: list[dict[str, Any]], labels: dict[str, str]) -> str:
    """π0's mean log-likelihood of the held-out solver solutions per group, mean over seeds."""
    per_group: dict[str, list[float]] = {}
    for s in seeds:
        groups, fit = prompt_groups(out, s["seed"]), held_out_fit(out, s)[PI0]
        for group in ("skill", "other"):
            values = [v for p, v in fit.items() if groups.get(p) == group]
            if values:
                per_group.setdefault(group, []).append(sum(values) / len(values))
    return ", ".join(f"{labels.get(g, g)} {sum(v) / len(v):.2f} nats" for g, v in per_group.items())


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


def display(text: str, labels: dict[str, str], k: int) -> str:
    """A column, claim or group text as the report names things: pass@k with its k, the groups by their labels."""
    text = text.replace("pass@k", f"pass@{k}")
    skill, other = labels.get("skill", "skill"), labels.get("other", "other")
    text = re.sub(r"\bskill's solutions\b", f"{skill} problems' solutions", text) if skill != "skill" else text
    text = re.sub(r"\bskill\b", skill, text)
    return re.sub(r"\bother (pass|Δ|problems|held-out)", lambda m: f"{other} {m[1]}", text)


def choose_lrs(seeds: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each arm's lr from the sweep, the same rule for every arm: the lr whose runs reached the highest mean online
    reward (training problems, last half of the steps; ties: the smaller lr), never a held-out figure. Returns the
    seeds with only the chosen runs, and the sweep's rows (every run, `chosen` marked)."""
    reward: dict[tuple[str, float], list[float]] = {}
    for s in seeds:
        for m in s["methods"]:
            value = m.get("online_reward")
            reward.setdefault((m["method"], m.get("lr") or 0.0), []).append(-1e9 if value is None else value)
    best: dict[str, tuple[float, float]] = {}
    for (method, lr), values in sorted(reward.items(), key=lambda kv: kv[0][1]):
        mean = sum(values) / len(values)
        if method not in best or mean > best[method][1]:
            best[method] = (lr, mean)
    chosen = [{**s, "methods": [m for m in s["methods"] if best[m["method"]][0] == (m.get("lr") or 0.0)]}
              for s in seeds]
    rows = [{"seed": s["seed"], "method": m["method"], "lr": m.get("lr"), "run_id": m["run_id"],
             "online_reward": m.get("online_reward"), "chosen": best[m["method"]][0] == (m.get("lr") or 0.0)}
            for s in seeds for m in s["methods"]]
    return chosen, rows


def decisions(claims: list[tuple[Claim, Paired]], rows: list[list[str]], labels: dict[str, str], k: int,
              shape: str) -> list[str]:
    """What this run can and cannot say, in plain words: each target's verdict, a run too small to decide one, a
    table whose target-group figures are all zero, and every arm that collapsed the other problems."""
    column = {name: i for i, name in enumerate(COLUMNS)}
    lines = [f"This run has no held-out {labels.get(g, g)} problem: every claim about that group is left out."
             for g in ("skill", "other") if all(r[column[f"{g} pass@1"]] == "–" for r in rows)]
    skill = [float(r[column["skill pass@1"]].split(" ±")[0]) for r in rows if r[column["skill pass@1"]] != "–"]
    if skill and max(skill) == 0.0:
        lines.append(f"Neither π0 nor any arm solved a single {labels.get('skill', 'skill')} problem in this run "
                     f"({shape}): its zeros do not rank the arms, and this run cannot decide any claim about that "
                     "group. Full mode has the size that can.")
    for c, p in claims:
        text = display(c.text, labels, k)
        verdict = c.verdict(p)
        if c.b == PI0 and c.group == "other" and verdict == "reversed":
            lines.append(f"{c.a} collapsed the {labels.get('other', 'other')} problems: {p.mean:+.3f} pass@1 against "
                         f"π0 [{p.low:+.3f}, {p.high:+.3f}].")
        elif c.target and verdict == "not shown":
            lines.append(f"Cannot decide at this size: {text} (measured {p.mean:+.3f}, 95 % interval [{p.low:+.3f}, "
                         f"{p.high:+.3f}]; holding needs a mean of at least {c.at_least:+.2f} with the interval above "
                         f"{min(c.at_least, 0.0):+.2f}, reversing an interval below that).")
        elif c.target:
            lines.append(f"{text}: **{verdict}** ({p.mean:+.3f} [{p.low:+.3f}, {p.high:+.3f}]).")
    return lines


def _lr(value: float | None) -> str:
    return "–" if value is None else f"{value:g}"


def all_seeds_methods(seeds: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    return next(s["methods"] for s in seeds if s["seed"] == seed)


def strata_lines(out: Path, seeds: list[dict[str, Any]], train_prefix: Callable[[int], str]) -> list[str]:
    """The real experiment's strata per seed: each family's π0 Q0 counts on the training problems and its stratum."""
    lines = []
    for s in seeds:
        path = out / f"seed-{s['seed']}" / "groups.json"
        strata = json.loads(path.read_text()).get("strata") if path.is_file() else None
        if not strata:
            continue
        held = Counter(v for p, v in strata["prompts"].items() if not p.startswith(train_prefix(s["seed"])))
        lines += [f"Seed {s['seed']}: held-out problems per stratum: " +
                  ", ".join(f"{g} {held.get(g, 0)}" for g in ("never", "rare", "common", "unmeasured")) +
                  " (unmeasured: a family no training problem has; in neither group).", "",
                  "| family | π0 Q0 samples | successes | per sample | stratum |", "|---|---|---|---|---|",
                  *[f"| {f} | {v['n']} | {v['n_success']} | {_rate(v['rate'])} | {v['stratum']} |"
                    for f, v in strata["families"].items()], ""]
    return lines


def _rate(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


def deciding_problems(out: Path, seeds: list[dict[str, Any]], label: str) -> list[str]:
    """The held-out problems of the lake's group, per seed: the ones the skill claims are decided on, named by id so
    `spolake view --demo-report` links each to its page."""
    lines = ["## The problems that decide the claims", "",
             f"The held-out `{label}` problems each seed's claims on that group are decided on (π0's step-0 "
             "evaluation; `spolake view --demo-report` links each id to its prompt page):", ""]
    for s in seeds:
        held_out = _counts(out, s["seed"], s["methods"][0]["run_id"], 0)["held_out"]
        ids = sorted({c[0] for c in _in_group(held_out, prompt_groups(out, s["seed"]), "skill")})
        lines.append(f"- seed {s['seed']}: {', '.join(ids) if ids else 'none at this size'}")
    return [*lines, ""]


def write_report(out: Path, seeds: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """report.md, demo_metrics.json, pass_at_k.png and pts_curve.png in `out`; returns the aggregated summary. A seed
    whose arms ran at several lrs is reduced to each arm's chosen lr first (choose_lrs); the sweep is reported."""
    exp = next((e for e in EXPERIMENTS.values() if e.name == meta.get("experiment", "countdown")), COUNTDOWN)
    labels, scale = dict(exp.labels), meta.get("scale") or {}
    all_seeds = seeds
    seeds, sweep = choose_lrs(seeds)
    k, n = top_k(seeds), scale.get("eval_n", 20)
    rows = table_rows(out, seeds)
    claims = test_claims(out, seeds)
    mode = "quick" if meta["quick"] else "full"
    columns = [display(c, labels, k) for c in COLUMNS]
    print_table(rows, f"{exp.name}, {mode} mode, {len(seeds)} seed(s): mean ± std", columns)
    plot_curves(out, seeds, out / "pass_at_k.png", labels,
                "countdown with a skill-gap π0" if exp.name == "countdown" else "pyfunc on SmolLM2-135M-Instruct", n)
    first = seeds[0]["seed"]
    curve = pts_curve(Lake.open(str(out / f"seed-{first}" / "lake")), f"demo-{first}")
    if curve:
        plot_pts(curve, out / "pts_curve.png", _response_tokens(out / f"seed-{first}" / "models" / "pi0", curve))
    start = {s["seed"]: starting_point(out, s["seed"], exp.train_prefix(s["seed"])) for s in seeds}
    for row in sweep:  # each run's held-out pass@1 per group beside its selection criterion
        groups = prompt_groups(out, row["seed"])
        last = next(m for m in all_seeds_methods(all_seeds, row["seed"]) if m["run_id"] == row["run_id"])
        for group in ("skill", "other"):
            row[f"{group} pass@1"] = _group_pass(out, row["seed"], row["run_id"], last["curve"][-1]["step"], groups,
                                                 group, 1)
    shape = (f"{scale.get('eval_max_prompts', '?')} held-out problems × {n} samples, {scale.get('train_steps', '?')} "
             f"steps, {len(seeds)} seed(s)")
    plain = [f"Partial report: seed {s['seed']}'s runs {', '.join(s['unfinished'])} did not finish; the claims that "
             "need them are left out, and each arm's lr is chosen among its finished runs only."
             for s in all_seeds if s.get("unfinished")] + decisions(claims, rows, labels, k, shape)
    summary = {**meta, "seeds": seeds, "starting_point": start, "table": {"columns": columns, "rows": rows},
               "lr_sweep": sweep, "decisions": plain,
               "claims": [{**asdict(c), "text": display(c.text, labels, k), **asdict(p), "verdict": c.verdict(p)}
                          for c, p in claims]}
    (out / "demo_metrics.json").write_text(json.dumps(summary, indent=2, default=str))
    for line in plain:
        console.print(line)
    fit = _pi0_fit(out, seeds, labels)
    intro = (f"{mode.capitalize()} mode, seeds {', '.join(str(s['seed']) for s in seeds)}. {exp.describe} pass@k on "
             f"held-out problems of each group (`{labels['skill']}`: the lake's knowledge; `{labels['other']}`: the "
             "rest)" + (" and on the training prompts (`train`)" if exp.name == "countdown" else "") +
             f": {n} samples per prompt, temperature 0.4, top-p 0.95, unbiased estimator; mean ± std over seeds. "
             f"{PI0} is the step-0 evaluation of the starting model. Δ nats: the mean log-likelihood of the held-out "
             f"problems' reference solutions (never trained on) under the run's last checkpoint minus π0's ({fit}): "
             "what a run absorbed of the lake's kind of answer, which pass@1 at temperature 0.4 shows only once such "
             "an answer becomes the policy's mode. Every method sampled the same number of online rollouts; mixed "
             "runs add lake rows on top (`lake rows`: their share of each arm's training rows), SFT→GRPO's SFT steps "
             "read as many lake rows as SPO half-online before its online steps. `lr`: each arm's lr, chosen from the "
             "sweep below by the same rule for every arm.")
    lines = [
        "# spo-lake demo report", "", intro, "",
        "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
        *["| " + " | ".join(row) + " |" for row in rows], "",
        "## What this run can and cannot say", "", *[f"- {line}" for line in plain], "",
        "## Learning-rate sweep", "",
        "Every arm ran at every lr below; the report uses, per arm, the lr whose runs reached the highest mean reward "
        "of their online rollouts over the last half of the steps (training problems only: choosing never looks at "
        "the held-out problems). Held-out pass@1 at the last evaluation is shown for reading, not for choosing.", "",
        f"| seed | method | lr | online reward (train, last half) | {labels['skill']} pass@1 | {labels['other']} "
        "pass@1 | chosen |", "|---|---|---|---|---|---|---|",
        *[f"| {r['seed']} | {r['method']} | {_lr(r['lr'])} | "
          f"{_fmt(r['online_reward'])} | {r['skill pass@1']:.3f} | {r['other pass@1']:.3f} | "
          f"{'yes' if r['chosen'] else ''} |" for r in sweep], "",
        "## Before any training", "",
        "The training prompts, from the lake at the snapshot every run pins: π0's success per sample at temperature 1 "
        "(the q0 step's Monte-Carlo counts, from which Q̂0 is computed), the prompts it solved at least once, and the "
        "prompts the lake holds a correct solution to, per source.", "",
        "| seed | problems | prompts | π0 success per sample | π0 solved ≥ once | the lake solves (per source) |",
        "|---|---|---|---|---|---|",
        *[f"| {seed} | {labels.get(group, group)} | {g['prompts']} | {_rate(g['pi0_success_per_sample'])} "
          f"({g['q0_samples']} samples) | "
          f"{g['pi0_solved_prompts']} / {g['q0_prompts']} | "
          f"{', '.join(f'{src} {v}' for src, v in g['lake_solved_prompts'].items()) or '–'} |"
          for seed, groups in start.items() for group, g in groups.items()], "",
        *strata_lines(out, seeds, exp.train_prefix),
        "## Claims", "",
        "Paired differences (a − b; for cost, b − a), prompt by prompt within each seed, averaged over seeds; 95 % "
        "stratified bootstrap interval over prompts (over seeds for cost). *holds*: the mean difference reaches the "
        "claim's bound (0 unless the claim names one) and the interval lies above min(bound, 0); *reversed*: the "
        "interval lies below that; *not shown*: neither.", "",
        "| claim | difference | 95 % interval | per seed | verdict |", "|---|---|---|---|---|",
        *[f"| {display(c.text, labels, k)} | {p.mean:+.3f} | [{p.low:+.3f}, {p.high:+.3f}] | "
          f"{' / '.join(f'{d:+.3f}' for d in p.per_seed)} | **{c.verdict(p)}** |" for c, p in claims], "",
        *deciding_problems(out, seeds, labels["skill"]),
        "## Where the targets stand", "", *[display(line, labels, k) for line in reading(rows, claims)], "",
        "![pass@k against step](pass_at_k.png)", "",
    ]
    if curve:
        lines += [f"PTS success-probability curve of trajectory `{curve['trajectory_id']}` "
                  f"({len(curve['pivots'])} pivotal tokens):", "", "![PTS curve](pts_curve.png)", ""]
    lines += ["## Per seed", ""]
    for s in seeds:
        resumed = [m["method"] for m in s["methods"] if m["resumed"]]
        note = f" (resumed runs, wall time of the continuation only: {', '.join(resumed)})" if resumed else ""
        timing = f"lake built in {s['recipe_seconds']} s, seed total {s['total_seconds']} s" \
            if s.get("total_seconds") is not None else "read back from its finished runs (--partial)"
        lines += [f"Seed {s['seed']}: {timing}{note}.",
                  "", "| step | summary | seconds |", "|---|---|---|",
                  *[f"| {r['step']} | {r['summary']} | {r['seconds']} |" for r in s["recipe_steps"]], ""]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return summary
