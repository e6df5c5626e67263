"""What the site shows, read from a lake at one snapshot (and from run directories): the I/O side of `spolake view`.

Every query reads at the chosen snapshot through `Lake.sql`; the report views are spo_lake.pipelines.views' own.
Run directories are found by run id under the `runs` roots given, and only there: a run id that is not one plain
path component (no '/', no '..') has no directory, so nothing in a lake leads the viewer out of those roots.
"""
from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spo_lake.errors import InputError
from spo_lake.lake import Lake
from spo_lake.lake.sql import VERDICT_SQL
from spo_lake.pipelines.common import TRAJECTORY_WITH_PROMPT
from spo_lake.pipelines.views import coverage, first_solved, hardest_solved
from spo_lake.view.records import Overview, Pivot, Prompt, PromptSummary, Run, RunDetail, Trajectory

FIRST_SOLVED_ROWS = 200  # the overview's first-solver table; the rest is in the prompt pages
HARDEST_ROWS = 50
RUN_PROMPTS = 100  # a run page's prompts it wrote most rollouts for
METRICS_RECORDS = 20_000  # a run page charts at most this many metrics.jsonl records (evenly thinned beyond)
# The judge's detail and the verifier of the verdict VERDICT_SQL picks (same order: a real verifier over an
# imported one, the latest among equals).
DETAIL_SQL = """
SELECT trajectory_id, arg_max(detail, (verifier <> 'imported', created_at)) AS detail,
       arg_max(verifier, (verifier <> 'imported', created_at)) AS verifier
FROM evaluations GROUP BY trajectory_id
"""


@dataclass(frozen=True)
class Limits:
    """What one page shows at most (the site for a large lake stays a set of pages of a few MB each)."""

    trajectories_per_page: int = 50
    trajectories_per_prompt: int = 1000
    response_chars: int = 8000
    prompts_per_page: int = 200


LIMITS = Limits()


def overview(lake: Lake, snapshot: str | None, title: str) -> Overview:
    counts = lake.sql(f"""
        SELECT t.source, coalesce(p.task, '(no prompt row)') AS task, coalesce(v.verdict, 'not judged') AS verdict,
               count(*) AS trajectories
        FROM trajectories t LEFT JOIN prompts p USING (prompt_id) LEFT JOIN ({VERDICT_SQL}) v USING (trajectory_id)
        GROUP BY ALL ORDER BY 1, 2, 3""", snapshot).to_pylist()
    snaps = [{"name": s.name, "note": s.note, "created_at": str(s.created_at),
              "versions": ", ".join(f"{t} {v}" for t, v in sorted(s.versions.items()))} for s in lake.snapshots()]
    solved_first = first_solved(lake, snapshot).to_pylist()
    return Overview(title=title, snapshot=snapshot, counts=counts, snapshots=snaps, runs=runs(lake, snapshot),
                    coverage=coverage(lake, snapshot).to_pylist(), first_solved=solved_first[:FIRST_SOLVED_ROWS],
                    first_solved_total=len(solved_first),
                    hardest=hardest_solved(lake, snapshot, limit=HARDEST_ROWS).to_pylist())


def runs(lake: Lake, snapshot: str | None) -> list[Run]:
    """Every run of the `runs` table (its latest status), then run ids that only trajectories name (imports)."""
    rows = lake.sql("""
        WITH written AS (SELECT run_id, count(*) AS n FROM trajectories WHERE run_id IS NOT NULL GROUP BY 1),
        recorded AS (
            SELECT run_id, arg_min(kind, created_at) AS kind,
                   arg_max(status, (created_at, status <> 'running')) AS status,
                   arg_max(snapshot, created_at) AS snapshot, CAST(arg_max(config, created_at) AS VARCHAR) AS config,
                   CAST(arg_max(metrics, created_at) AS VARCHAR) AS metrics, min(created_at) AS started
            FROM runs GROUP BY run_id)
        SELECT coalesce(r.run_id, w.run_id) AS run_id, coalesce(r.kind, '(no runs row)') AS kind,
               coalesce(r.status, '–') AS status, r.snapshot, r.config, r.metrics,
               CAST(r.started AS VARCHAR) AS started_at, coalesce(w.n, 0) AS rows_written
        FROM recorded r FULL JOIN written w USING (run_id)
        ORDER BY r.started NULLS LAST, run_id""", snapshot).to_pylist()
    return [Run(**r) for r in rows]


def prompt_summaries(lake: Lake, snapshot: str | None) -> list[PromptSummary]:
    rows = lake.sql(f"""
        WITH ids AS (SELECT prompt_id FROM prompts UNION SELECT prompt_id FROM trajectories),
        t AS (SELECT t.prompt_id, count(*) AS samples, count(*) FILTER (WHERE v.passed) AS correct
              FROM trajectories t LEFT JOIN ({VERDICT_SQL}) v USING (trajectory_id) GROUP BY 1),
        q AS (SELECT prompt_id, arg_max(n_success / n, (n, created_at)) AS q0_rate FROM "values"
              WHERE trajectory_id IS NULL AND position IS NULL AND n > 0 GROUP BY 1),
        pv AS (SELECT t.prompt_id, count(*) AS pivots FROM pivots JOIN trajectories t USING (trajectory_id) GROUP BY 1)
        SELECT ids.prompt_id, any_value(p.task) AS task, coalesce(any_value(t.samples), 0) AS samples,
               coalesce(any_value(t.correct), 0) AS correct, round(any_value(q.q0_rate), 4) AS q0_rate,
               coalesce(any_value(pv.pivots), 0) AS pivots
        FROM ids LEFT JOIN prompts p USING (prompt_id) LEFT JOIN t USING (prompt_id) LEFT JOIN q USING (prompt_id)
        LEFT JOIN pv USING (prompt_id)
        GROUP BY ids.prompt_id ORDER BY ids.prompt_id""", snapshot).to_pylist()
    return [PromptSummary(**r) for r in rows]


def prompts(lake: Lake, snapshot: str | None) -> dict[str, Prompt]:
    """Every prompt row (the latest per id) with its Q̂0 counts per model, by prompt id."""
    q0: dict[str, list[dict[str, Any]]] = {}
    for r in lake.sql("""
            SELECT prompt_id, model_id, n, n_success FROM "values"
            WHERE trajectory_id IS NULL AND position IS NULL AND temperature = 1.0 AND top_p = 1.0
            QUALIFY row_number() OVER (PARTITION BY prompt_id, model_id ORDER BY n DESC, created_at DESC) = 1
            ORDER BY prompt_id, model_id""", snapshot).to_pylist():
        q0.setdefault(r.pop("prompt_id"), []).append(r)
    counts = {r["prompt_id"]: r["n"] for r in lake.sql(
        "SELECT prompt_id, count(*) AS n FROM trajectories GROUP BY 1", snapshot).to_pylist()}
    rows = lake.sql("""
        SELECT prompt_id, task, prompt, CAST(tests AS VARCHAR) AS tests, CAST(metadata AS VARCHAR) AS metadata
        FROM prompts QUALIFY row_number() OVER (PARTITION BY prompt_id ORDER BY created_at DESC) = 1""",
                    snapshot).to_pylist()
    out = {r["prompt_id"]: Prompt(**r, q0=q0.get(r["prompt_id"], []), trajectories=counts.get(r["prompt_id"], 0))
           for r in rows}
    for pid, n in counts.items():  # trajectories of a prompt the prompts table lacks still get a page
        out.setdefault(pid, Prompt(pid, None, None, None, None, q0.get(pid, []), n))
    return out


def trajectories_by_prompt(lake: Lake, snapshot: str | None, limits: Limits,
                           pivots: dict[str, tuple[Pivot, ...]]) -> Iterator[tuple[str, list[Trajectory]]]:
    """(prompt_id, its first `trajectories_per_prompt` trajectories by source, run and time), prompt by prompt.
    The rows stream from DuckDB in batches: a large lake's responses are never all in memory at once."""
    query = f"""
        SELECT t.prompt_id, t.trajectory_id, t.source, t.run_id, t.model_id, t.policy_version,
               CAST(t.created_at AS VARCHAR) AS created_at, left(t.response_text, $chars) AS response_text,
               length(t.response_text) AS response_chars, v.verdict, v.reward, left(d.detail, 2000) AS detail,
               d.verifier
        FROM trajectories t LEFT JOIN ({VERDICT_SQL}) v USING (trajectory_id) LEFT JOIN ({DETAIL_SQL}) d
             USING (trajectory_id)
        QUALIFY row_number() OVER (PARTITION BY t.prompt_id
                                   ORDER BY t.source, t.run_id NULLS FIRST, t.created_at, t.trajectory_id) <= $cap
        ORDER BY t.prompt_id, t.source, t.run_id NULLS FIRST, t.created_at, t.trajectory_id"""
    con = lake.connect(snapshot, tables=["trajectories", "evaluations"])
    try:
        reader = con.sql(query, params={"chars": limits.response_chars, "cap": limits.trajectories_per_prompt}
                         ).to_arrow_reader(10_000)
        current: str | None = None
        group: list[Trajectory] = []
        for batch in reader:
            for r in batch.to_pylist():
                pid = r.pop("prompt_id")
                if pid != current and group:
                    yield current or "", group
                    group = []
                current = pid
                group.append(Trajectory(**r, pivots=pivots.get(r["trajectory_id"], ())))
        if group:
            yield current or "", group
    finally:
        con.close()


def pivots(lake: Lake, snapshot: str | None, tokenizer_dir: Path | None) -> dict[str, tuple[Pivot, ...]]:
    """Every pivotal token by trajectory id, placed on its characters when π0's tokenizer is given."""
    by_trajectory: dict[str, list[dict[str, Any]]] = {}
    for r in lake.sql("""SELECT trajectory_id, position, token_id, s_before, s_after FROM pivots
                         QUALIFY row_number() OVER (PARTITION BY trajectory_id, position ORDER BY created_at DESC) = 1
                         ORDER BY trajectory_id, position""", snapshot).to_pylist():
        by_trajectory.setdefault(r.pop("trajectory_id"), []).append(r)
    if not by_trajectory:
        return {}
    spans: dict[str, dict[int, tuple[int, int]]] = {}
    if tokenizer_dir is not None:
        tokenizer = load_tokenizer(tokenizer_dir)
        rows = lake.sql(f"SELECT * FROM ({TRAJECTORY_WITH_PROMPT}) WHERE trajectory_id IN "
                        "(SELECT DISTINCT trajectory_id FROM pivots)", snapshot).to_pylist()
        for row in rows:
            spans[row["trajectory_id"]] = token_spans(tokenizer, row, by_trajectory[row["trajectory_id"]])
    out = {}
    for tid, ps in by_trajectory.items():
        placed = spans.get(tid, {})
        out[tid] = tuple(Pivot(**p, start=placed[p["position"]][0], end=placed[p["position"]][1])
                         if p["position"] in placed else Pivot(**p) for p in ps)
    return out


def require_tokenizer(directory: Path) -> None:
    if not (directory / "tokenizer_config.json").is_file() and not (directory / "tokenizer.json").is_file():
        raise InputError(f"--tokenizer {directory}: not a model directory with a tokenizer (no tokenizer.json)")


def load_tokenizer(directory: Path) -> Any:
    """π0's tokenizer from a local model directory (never the hub: the viewer works offline)."""
    from transformers import AutoTokenizer

    require_tokenizer(directory)
    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)


def token_spans(tokenizer: Any, row: dict[str, Any],
                pivot_rows: Sequence[dict[str, Any]]) -> dict[int, tuple[int, int]]:
    """Characters [start, end) of each pivot's token in the response text. The token ids are those PTS searched
    (spo_lake.models.tokens.trajectory_token_ids): the row's own when they hold the pivots' tokens, else the text
    tokenised after its prompt. A pivot is placed only when its token is at its position and the decoded tokens
    spell the stored text up to its end; otherwise it stays unplaced rather than marking wrong characters."""
    from spo_lake.models.backend import tokenize_response
    from spo_lake.models.tokens import render_prompt
    from spo_lake.tasks import Problem

    ids = list(row["token_ids"] or [])
    if not all(p["position"] < len(ids) and ids[p["position"]] == p["token_id"] for p in pivot_rows):
        _, ids = tokenize_response(tokenizer, render_prompt(Problem.from_row(row)), row["response_text"])
    text = row["response_text"]
    out = {}
    for p in pivot_rows:
        i = p["position"]
        if i >= len(ids) or ids[i] != p["token_id"]:
            continue
        before, through = (tokenizer.decode(ids[:j], skip_special_tokens=True, clean_up_tokenization_spaces=False)
                           for j in (i, i + 1))
        if text.startswith(through):  # (a token with no text, EOS, gets an empty span where it stands)
            out[i] = (len(before), len(through))
    return out


# ---------------------------------------------------------------------------------------------- runs


def run_directory(run_id: str, roots: Sequence[Path]) -> Path | None:
    """The run's directory under one of `roots`, if there is one; a run id that is not a plain name has none."""
    if not run_id or run_id in (".", "..") or "/" in run_id or "\\" in run_id or run_id.startswith("."):
        return None
    for root in roots:
        candidate = root / run_id
        if candidate.is_dir() and candidate.resolve().parent == root.resolve():
            return candidate
    return None


def read_steps(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """metrics.jsonl's records (thinned evenly to METRICS_RECORDS), or what was wrong with the file."""
    records: list[dict[str, Any]] = []
    with path.open(encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                return records, f"{path} line {number}: not JSON; the records before it are shown"
            if isinstance(record, dict):
                records.append(record)
    stride = -(-len(records) // METRICS_RECORDS)
    return records[::stride] if stride > 1 else records, None


@dataclass(frozen=True)
class RunRows:
    """What every run wrote to the lake, read in two queries for all runs (a lake holds one run per pipeline call)."""

    written: dict[str, list[dict[str, Any]]]  # run id -> policy_version, source, verdict, rollouts
    prompts: dict[str, list[dict[str, Any]]]  # run id -> its RUN_PROMPTS prompts with most rollouts


def run_rows(lake: Lake, snapshot: str | None) -> RunRows:
    written: dict[str, list[dict[str, Any]]] = {}
    for r in lake.sql(f"""
            SELECT t.run_id, t.policy_version, t.source, coalesce(v.verdict, 'not judged') AS verdict,
                   count(*) AS rollouts
            FROM trajectories t LEFT JOIN ({VERDICT_SQL}) v USING (trajectory_id) WHERE t.run_id IS NOT NULL
            GROUP BY ALL ORDER BY 1, 2 NULLS FIRST, 3, 4""", snapshot).to_pylist():
        written.setdefault(r.pop("run_id"), []).append(r)
    prompts: dict[str, list[dict[str, Any]]] = {}
    for r in lake.sql(f"""
            SELECT t.run_id, t.prompt_id, count(*) AS rollouts, count(*) FILTER (WHERE v.passed) AS passed
            FROM trajectories t LEFT JOIN ({VERDICT_SQL}) v USING (trajectory_id) WHERE t.run_id IS NOT NULL
            GROUP BY 1, 2
            QUALIFY row_number() OVER (PARTITION BY t.run_id ORDER BY count(*) DESC, t.prompt_id) <= {RUN_PROMPTS}
            ORDER BY 1, 3 DESC, 2""", snapshot).to_pylist():
        prompts.setdefault(r.pop("run_id"), []).append(r)
    return RunRows(written, prompts)


def run_detail(lake: Lake, run: Run, rows: RunRows, roots: Sequence[Path]) -> RunDetail:
    """A run's page data: its lake rows (`rows`), and from its directory, if found, metrics.jsonl and the rows it read
    per stream (rebuilt from its manifest, as `spolake report batch` does)."""
    from spo_lake.rl.batches import batch_sources

    directory = run_directory(run.run_id, roots)
    steps: list[dict[str, Any]] = []
    streams: list[dict[str, Any]] = []
    notes = []
    if directory is None:
        notes.append("No run directory found under the --runs roots given: no metrics.jsonl curves, no stream "
                     "breakdown.")
    else:
        if (directory / "metrics.jsonl").is_file():
            steps, problem = read_steps(directory / "metrics.jsonl")
            notes += [problem] if problem else []
        if (directory / "manifest.json").is_file():
            try:
                streams = batch_sources(lake, directory).to_pylist()
            except (InputError, OSError, KeyError, TypeError, ValueError) as exc:  # a damaged or foreign manifest
                notes.append(f"{directory / 'manifest.json'}: the lake rows read by stream could not be rebuilt "
                             f"({type(exc).__name__}: {exc})")
    return RunDetail(run=run, steps=steps, streams=streams, written=rows.written.get(run.run_id, []),
                     prompts=rows.prompts.get(run.run_id, []), notes=notes)
