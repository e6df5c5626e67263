"""The site's pages as pure functions: typed rows (spo_lake.view.records) in, one HTML string out.

Links between pages go through `prompt_href` / `run_href`, and a page links only to what the site writes (the
`known` sets), so every href on every page resolves.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Mapping, Sequence
from itertools import groupby
from typing import Any

from spo_lake.view.html import Link, chart, esc, fmt, name_at, page, pager, slug, table
from spo_lake.view.records import Overview, Pivot, Prompt, PromptSummary, Run, RunDetail, Trajectory

TESTS_CHARS = 20_000  # a prompt's tests shown as stored JSON, cut here (a page stays a few MB)
COMPARE_ANSWERS = 3  # answers per source/run in the side-by-side comparison
COMPARE_CHARS = 2_000
OVERVIEW_RUNS = 100  # the overview's runs table; runs/index.html lists every run
VERDICT_COLORS = {"ok": "#2da44e", "not judged": "#afb8c1", "wrong_answer": "#cf222e", "runtime_error": "#bc4c00",
                  "timeout": "#8250df", "syntax": "#bf8700", "memory": "#1f6feb", "imported": "#6e7781"}


def prompt_href(prompt_id: str, page_index: int = 0) -> str:
    """Site-relative path of a prompt's page (the demo's report links here)."""
    return "prompts/" + name_at(slug(prompt_id), page_index)


def run_href(run_id: str) -> str:
    """Site-relative path of a run's page."""
    return f"runs/{slug(run_id)}.html"


# ---------------------------------------------------------------------------------------------- pivotal tokens


def delta_color(delta: float) -> str:
    """Green for a token that raised the success probability, red for one that lowered it; stronger for larger |Δ|."""
    alpha = 0.25 + 0.65 * min(1.0, abs(delta))
    return f"rgba(22, 163, 74, {alpha:.2f})" if delta >= 0 else f"rgba(220, 38, 38, {alpha:.2f})"


def highlight(text: str, pivots: Sequence[Pivot]) -> str:
    """`text` escaped, each placed pivot's characters [start, end) in a <mark> colored by its Δ, the values on
    hover (an empty span: a token with no text, such as the end of the response). Overlapping or out-of-range spans
    are skipped rather than drawn on the wrong characters."""
    out, at = [], 0
    placed = sorted((p.start, p.end, p) for p in pivots if p.start is not None and p.end is not None)
    for start, end, p in placed:
        if start < at or end > len(text) or end < start:
            continue
        title = f"pivotal token {p.position}: P(success) {p.s_before:.3f} → {p.s_after:.3f} (Δ {p.delta:+.3f})"
        # a token that spells no text (the end of the response) gets an empty mark the stylesheet draws as a sign
        cls, title = ("pivot", title) if end > start else ("pivot silent", title + ", a token with no text (EOS)")
        out.append(esc(text[at:start]))
        out.append(f'<mark class="{cls}" data-position="{p.position}" data-delta="{p.delta:.4f}" '
                   f'style="background:{delta_color(p.delta)}" title="{esc(title)}">{esc(text[start:end])}</mark>')
        at = end
    out.append(esc(text[at:]))
    return "".join(out)


# ---------------------------------------------------------------------------------------------- overview


def _rows(records: Sequence[dict[str, Any]], columns: Sequence[str], links: dict[str, Any] | None = None
          ) -> list[list[Any]]:
    """Table rows of `records`; a column named in `links` becomes a Link by its function (None: plain text)."""
    links = links or {}
    out = []
    for r in records:
        row = []
        for c in columns:
            href = links[c](r[c]) if c in links and r[c] is not None else None
            row.append(Link(r[c], href) if href else r[c])
        out.append(row)
    return out


def overview_page(o: Overview, known_prompts: Collection[str], known_runs: Collection[str]) -> str:
    def prompt_link(pid: str) -> str | None:
        return prompt_href(pid) if pid in known_prompts else None

    def run_link(rid: str) -> str | None:
        return run_href(rid) if rid in known_runs else None

    sources = sorted({r["source"] for r in o.counts})
    verdicts = sorted({r["verdict"] for r in o.counts})
    traces = [{"type": "bar", "name": v, "x": sources, "marker": {"color": VERDICT_COLORS.get(v, "#57606a")},
               "y": [sum(r["trajectories"] for r in o.counts if r["source"] == s and r["verdict"] == v)
                     for s in sources]} for v in verdicts]
    total = sum(r["trajectories"] for r in o.counts)
    at = f"snapshot {o.snapshot}" if o.snapshot else "the lake's head"
    parts = [f'<p>Read at {esc(at)}: {total} trajectories of {len(known_prompts)} '
             f'<a href="prompts/index.html">prompts</a>, {len(known_runs)} <a href="runs/index.html">runs</a>.',
             f' <a href="{esc(o.demo_report)}">The demo\'s report</a>.' if o.demo_report else "", "</p>",
             "<h2 id=\"rows\">Rows by source × task × verdict</h2>",
             chart("verdicts", traces, {"barmode": "stack", "height": 320, "margin": {"t": 20},
                                        "yaxis": {"title": "trajectories"}}) if traces else "",
             table(["source", "task", "verdict", "trajectories"],
                   _rows(o.counts, ["source", "task", "verdict", "trajectories"])),
             "<h2 id=\"snapshots\">Snapshots</h2>",
             table(["name", "note", "created", "table versions"],
                   [[s["name"], s["note"], s["created_at"], s["versions"]] for s in o.snapshots]),
             "<h2 id=\"runs\">Runs</h2>", runs_table(o.runs[:OVERVIEW_RUNS], known_runs, ""),
             f'<p class="note">The first {OVERVIEW_RUNS} of {len(o.runs)} runs; all of them: '
             '<a href="runs/index.html">runs</a>.</p>' if len(o.runs) > OVERVIEW_RUNS else "",
             "<h2 id=\"coverage\">Coverage: prompts with ≥1 correct solution, per source and run</h2>",
             table(["source", "run", "prompts solved", "solved first"],
                   _rows(o.coverage, ["source", "run_id", "prompts_solved", "first_solved"], {"run_id": run_link})),
             "<h2 id=\"first-solved\">First solved by</h2>",
             table(["prompt", "source", "run", "trajectory", "solved at"],
                   _rows(o.first_solved, ["prompt_id", "source", "run_id", "trajectory_id", "solved_at"],
                         {"prompt_id": prompt_link, "run_id": run_link})),
             f'<p class="note">{len(o.first_solved)} of {o.first_solved_total} solved prompts shown.</p>'
             if o.first_solved_total > len(o.first_solved) else "",
             "<h2 id=\"hardest\">Hardest prompts solved (lowest Q0 first)</h2>",
             table(["prompt", "π0 samples", "π0 successes", "Q0 rate", "solved by", "correct"],
                   _rows(o.hardest, ["prompt_id", "q0_n", "q0_success", "q0_rate", "solved_by", "correct"],
                         {"prompt_id": prompt_link}))]
    return page(o.title, "\n".join(parts), "", charts=bool(traces))


def runs_table(runs: Sequence[Run], known_runs: Collection[str], root: str) -> str:
    rows = [[Link(r.run_id, run_href(r.run_id)) if r.run_id in known_runs else r.run_id, r.kind, r.status,
             r.snapshot, r.started_at, r.rows_written, _short(r.config, 160)] for r in runs]
    return table(["run", "kind", "status", "snapshot", "started", "rollouts written", "config"], rows, root)


def _short(text: str | None, chars: int) -> str | None:
    if text is None:
        return None
    return text if len(text) <= chars else text[:chars] + "…"


def runs_index_page(runs: Sequence[Run], known_runs: Collection[str]) -> str:
    return page("Runs", runs_table(runs, known_runs, "../"), "../")


def prompts_index_page(summaries: Sequence[PromptSummary], page_index: int, pages: int, total: int) -> str:
    rows = [[Link(s.prompt_id, prompt_href(s.prompt_id)), s.task, s.samples, s.correct,
             round(s.correct / s.samples, 4) if s.samples else None, s.q0_rate, s.pivots] for s in summaries]
    body = (f"<p>{total} prompts.</p>" + pager(page_index, pages, "index")
            + table(["prompt", "task", "trajectories", "correct", "solve rate", "Q0 rate", "pivotal tokens"], rows,
                    "../") + pager(page_index, pages, "index"))
    return page("Prompts", body, "../")


# ---------------------------------------------------------------------------------------------- a prompt


def _verdict(t: Trajectory) -> str:
    name = t.verdict or "not judged"
    cls = "ok" if t.verdict == "ok" else ("none" if t.verdict is None else "bad")
    return f'<span class="verdict {cls}">{esc(name)}</span>'


def _response(t: Trajectory) -> str:
    more = t.response_chars - len(t.response_text)
    tail = f'<span class="note">… {more} more characters not shown</span>' if more > 0 else ""
    return f'<pre class="response">{highlight(t.response_text, t.pivots)}{tail}</pre>'


def trajectory_block(t: Trajectory, known_runs: Collection[str], q0: str) -> str:
    run = (f'<a href="../{esc(run_href(t.run_id))}">{esc(t.run_id)}</a>'
           if t.run_id is not None and t.run_id in known_runs else esc(t.run_id))
    meta = (f"{_verdict(t)} reward {esc(fmt(t.reward))} · policy version {esc(fmt(t.policy_version))} · "
            f"Q̂0 {esc(q0)} · run {run} · model {esc(t.model_id)} · verifier {esc(t.verifier)} · "
            f"{esc(t.created_at)}")
    pivots = ""
    if t.pivots:
        rows = [[p.position, p.token_id, round(p.s_before, 4), round(p.s_after, 4), round(p.delta, 4),
                 "yes" if p.start is not None else "no (no tokenizer, or its tokens do not spell the text)"]
                for p in t.pivots]
        pivots = table(["position", "token id", "P before", "P after", "Δ", "highlighted"], rows, "../", "pivots")
    detail = f'<pre class="detail">{esc(t.detail)}</pre>' if t.detail else ""
    return (f'<div class="trajectory" id="t-{esc(t.trajectory_id)}"><p class="meta">{meta}<br>'
            f'<code>{esc(t.trajectory_id)}</code></p>{_response(t)}{detail}{pivots}</div>')


def _group_key(t: Trajectory) -> tuple[str, str]:
    return t.source, t.run_id or ""


def compare_block(trajectories: Sequence[Trajectory]) -> str:
    """Two columns, each with a choice of source · run, showing that group's first answers: two runs side by side.
    Every group's answers are in the page; the site script only shows and hides them (no markup is built from data)."""
    groups = [(k, list(g)) for k, g in groupby(sorted(trajectories, key=_group_key), key=_group_key)]
    if len(groups) < 2:
        return ""
    options = "".join(f'<option value="{i}">{esc(s)} · {esc(r or "no run")} ({len(g)})</option>'
                      for i, ((s, r), g) in enumerate(groups))
    columns = []
    for side, chosen in (("a", 0), ("b", 1)):
        blocks = []
        for i, (_, g) in enumerate(groups):
            answers = "".join(f'<div class="answer">{_verdict(t)}<pre class="response">'
                              f'{esc(t.response_text[:COMPARE_CHARS])}</pre></div>' for t in g[:COMPARE_ANSWERS])
            hidden = "" if i == chosen else " hidden"
            blocks.append(f'<div class="group" data-group="{i}"{hidden}>{answers}</div>')
        select = options.replace(f'value="{chosen}"', f'value="{chosen}" selected', 1)
        columns.append(f'<div class="column" id="compare-{side}"><select class="compare">{select}</select>'
                       f'{"".join(blocks)}</div>')
    return '<h2 id="compare">Side by side</h2><div class="compare-row">' + "".join(columns) + "</div>"


def prompt_page(p: Prompt, trajectories: Sequence[Trajectory], page_index: int, pages: int,
                known_runs: Collection[str], shown: int) -> str:
    """One page of a prompt: the problem, tests and Q̂0, then its trajectories grouped by source and run; `shown` is
    how many of the prompt's trajectories its pages show in all (the rest are past the site's cap)."""
    name = name_at(slug(p.prompt_id), 0).removesuffix(".html")
    q0 = table(["model", "π0 samples", "successes", "Q̂0 rate"],
               [[q["model_id"], q["n"], q["n_success"], round(q["n_success"] / q["n"], 4) if q["n"] else None]
                for q in p.q0], "../")
    tests = p.tests or ""
    tests_text = _pretty(tests)
    if len(tests_text) > TESTS_CHARS:
        tests_text = tests_text[:TESTS_CHARS] + f"\n… {len(tests_text) - TESTS_CHARS} more characters"
    most = max(p.q0, key=lambda q: q["n"], default=None)  # the prompt's Q̂0: π0's largest count
    q0_rate = fmt(round(most["n_success"] / most["n"], 4)) if most and most["n"] else "–"
    capped = f" (its pages show the first {shown}, by source, run and time)" if shown < p.trajectories else ""
    parts = [f"<p>task {esc(p.task)} · {p.trajectories} trajectories{capped}</p>",
             f'<h2 id="problem">Problem</h2><pre class="problem">{esc(p.prompt)}</pre>',
             f'<h2 id="tests">Tests</h2><pre class="tests">{esc(tests_text) or "none"}</pre>',
             f'<h2 id="metadata">Metadata</h2><pre class="tests">{esc(_pretty(p.metadata))}</pre>'
             if p.metadata and p.metadata not in ("{}", "null") else "",
             '<h2 id="q0">Q̂0: π0\'s success rate from the prompt</h2>', q0]
    if page_index == 0:
        parts.append(compare_block(trajectories))
    parts += ['<h2 id="trajectories">Trajectories</h2>',
              '<p class="note">Pivotal tokens are marked in the responses: <mark class="legend" style="background:'
              f'{delta_color(0.6)}">green</mark> raised π0\'s success probability, <mark class="legend" style="'
              f'background:{delta_color(-0.6)}">red</mark> lowered it, stronger for a larger change; hover one for '
              "its values.</p>" if any(t.pivots for t in trajectories) else "", pager(page_index, pages, name)]
    for (source, run), group in groupby(trajectories, key=_group_key):
        items = list(group)
        parts.append(f'<section class="group"><h3>{esc(source)} · {esc(run or "no run")} '
                     f'({len(items)} here)</h3>' + "".join(trajectory_block(t, known_runs, q0_rate) for t in items)
                     + "</section>")
    if not trajectories:
        parts.append('<p class="empty">no trajectories</p>')
    parts.append(pager(page_index, pages, name))
    return page(f"Prompt {p.prompt_id}", "\n".join(parts), "../")


def _pretty(text: str) -> str:
    try:
        return json.dumps(json.loads(text), indent=1, ensure_ascii=False)
    except (TypeError, ValueError):
        return text


# ---------------------------------------------------------------------------------------------- the demo


def linked(text: str, links: Mapping[str, str]) -> str:
    """`text` escaped, each word that is a key of `links` (a prompt, run or trajectory id; trailing punctuation
    aside) a link to its page."""
    out, at = [], 0
    for m in re.finditer(r"[A-Za-z0-9_./:@-]+", text):
        word = m.group().rstrip(".,:;")
        if word in links:
            out += [esc(text[at:m.start()]), f'<a href="{esc(links[word])}">{esc(word)}</a>']
            at = m.start() + len(word)
    out.append(esc(text[at:]))
    return "".join(out)


def demo_page(report: str, images: Sequence[str], links: Mapping[str, str]) -> str:
    """The demo's report.md as text, every prompt, run and trajectory id it names linked to its page, with the plots
    it names (copied into assets/demo/) below it."""
    plots = "".join(f'<figure><img src="assets/demo/{esc(name)}" alt="{esc(name)}"><figcaption>{esc(name)}'
                    "</figcaption></figure>" for name in images)
    return page("The demo's report", f'<pre class="report">{linked(report, links)}</pre>{plots}', "")


# ---------------------------------------------------------------------------------------------- a run


def _series(steps: Sequence[dict[str, Any]], key: str) -> tuple[list[Any], list[Any]]:
    points = [(s["step"], s[key]) for s in steps
              if isinstance(s.get(key), (int, float)) and isinstance(s.get("step"), (int, float))
              and math.isfinite(s[key])]
    return [x for x, _ in points], [y for _, y in points]


def run_page(d: RunDetail, known_prompts: Collection[str]) -> str:
    r = d.run
    keys = sorted({k for s in d.steps for k in s if "pass@" in k})
    passk = [{"type": "scatter", "mode": "lines+markers", "name": k, "x": x, "y": y}
             for k in keys for x, y in [_series(d.steps, k)] if x]
    curves = []
    for key, title in (("loss", "loss"), ("kl", "KL to the reference"), ("grad_norm", "gradient norm")):
        x, y = _series([s for s in d.steps if "loss" in s], key)
        if x:
            curves.append(chart(f"curve-{key}", [{"type": "scatter", "mode": "lines", "name": key, "x": x, "y": y}],
                                {"title": {"text": title}, "height": 260, "margin": {"t": 40, "l": 50, "r": 10},
                                 "xaxis": {"title": "step"}}))
    versions = sorted({w["policy_version"] for w in d.written if w["policy_version"] is not None})
    judged = {v: [w for w in d.written if w["policy_version"] == v and w["verdict"] != "not judged"]
              for v in versions}
    rates = [(v, sum(w["rollouts"] for w in ws if w["verdict"] == "ok") / sum(w["rollouts"] for w in ws))
             for v, ws in judged.items() if ws]
    if rates:
        curves.append(chart("curve-rollouts", [{"type": "scatter", "mode": "lines+markers", "name": "passed",
                                                "x": [v for v, _ in rates], "y": [r for _, r in rates]}],
                            {"title": {"text": "its rollouts that passed"}, "height": 260,
                             "margin": {"t": 40, "l": 50, "r": 10}, "xaxis": {"title": "policy version"},
                             "yaxis": {"range": [0, 1.02]}}))
    written = [[w["policy_version"], w["source"], w["verdict"], w["rollouts"]] for w in d.written]
    streams = [[s.get("stream"), s.get("kind"), s.get("source"), s.get("sequences"), s.get("share")]
               for s in d.streams]
    parts = [table(["kind", "status", "snapshot", "started", "rollouts written"],
                   [[r.kind, r.status, r.snapshot, r.started_at, r.rows_written]], "../"),
             "".join(f'<p class="note">{esc(n)}</p>' for n in d.notes),
             '<h2 id="passk">pass@k against step (step 0 = π0)</h2>',
             chart("passk", passk, {"height": 340, "margin": {"t": 20}, "xaxis": {"title": "step"},
                                    "yaxis": {"title": "pass@k", "range": [0, 1.02]}}) if passk
             else '<p class="empty">no evaluations logged</p>',
             '<h2 id="curves">Training curves</h2>',
             f'<div class="curves">{"".join(curves)}</div>' if curves
             else '<p class="empty">no training steps logged</p>',
             '<h2 id="streams">Lake rows read, by stream</h2>',
             table(["stream", "kind", "source", "sequences", "share"], streams, "../"),
             '<h2 id="written">Rollouts written back</h2>',
             table(["policy version", "source", "verdict", "rollouts"], written, "../"),
             '<h3>By prompt</h3>',
             table(["prompt", "rollouts", "passed"],
                   [[Link(w["prompt_id"], "../" + prompt_href(w["prompt_id"])) if w["prompt_id"] in known_prompts
                     else w["prompt_id"], w["rollouts"], w["passed"]] for w in d.prompts], ""),
             '<h2 id="config">Config</h2>', f'<pre class="config">{esc(_pretty(r.config or ""))}</pre>',
             '<h2 id="summary">Summary metrics</h2>', f'<pre class="config">{esc(_pretty(r.metrics or ""))}</pre>']
    return page(f"Run {r.run_id}", "\n".join(parts), "../", charts=bool(passk or curves))
