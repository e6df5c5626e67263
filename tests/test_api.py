"""The top-level API a notebook user reaches for first: importable from `spo_lake`, every public callable documented."""
from __future__ import annotations

import inspect
from pathlib import Path

import spo_lake


def public_callables():
    for name in spo_lake.__all__:
        obj = getattr(spo_lake, name)
        if callable(obj):
            yield name, obj
        if inspect.isclass(obj):
            for member, fn in inspect.getmembers(obj, callable):
                if not member.startswith("_") and (getattr(fn, "__module__", None) or "").startswith("spo_lake"):
                    yield f"{name}.{member}", fn


def test_every_public_name_imports_and_is_documented():
    undocumented = [name for name, obj in public_callables() if not (inspect.getdoc(obj) or "").strip()
                    or inspect.getdoc(obj) == inspect.getdoc(object)]
    assert undocumented == []
    assert {"Lake", "ingest", "ingest_prompts", "export", "verifier_reward"} <= set(spo_lake.__all__)


def test_ingest_is_both_the_package_and_the_function(tmp_path):
    import spo_lake.ingest.ids as ids  # the package's modules import as usual
    from spo_lake import Lake, ingest

    assert ids.response_hashes and callable(ingest)
    report = ingest(Lake.init(tmp_path / "lake"), [{"prompt": "reach 3", "response": "1+2"}], task="countdown")
    assert report.summary() == "1 new, 0 already present; 1 new prompts"


def test_the_documented_python_block_runs_as_written(tmp_path, monkeypatch):
    from spo_lake import Lake
    from spo_lake.ingest.datasets import ingest_dataset
    from tests.test_snapshot_readers import doc_block

    repo = Path(__file__).resolve().parents[1]
    (tmp_path / "examples").symlink_to(repo / "examples")
    ingest_dataset(Lake.init(tmp_path / "lake"), "countdown", None, n=3, seed=0)  # the tour's first step, smaller
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(doc_block("<!-- tested: tests/test_api.py -->"), scope)  # noqa: S102 (our docs)
    assert {r["source"]: r["n"] for r in scope["table"].to_pylist()} == {"human": 5, "reference": 6}
    assert len(scope["sft"]) == 5  # the solver's solutions: the samples are not judged yet
