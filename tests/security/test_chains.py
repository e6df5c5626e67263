"""A chain directory's manifest cannot steer a chain outside it: run ids, run directories and checkpoints are the
chain's own; its name is one path part; symlinked chain directories are refused."""
from __future__ import annotations

import json
import os

import pytest

from spo_lake.chain import ChainSpec, load_chain, run_chain
from spo_lake.errors import InputError
from spo_lake.lake import Lake
from tests.security.conftest import one_line

RUN = {"run": 1, "run_id": "c-run-1", "status": "pinned"}


def chain_with_manifest(world, manifest: str) -> ChainSpec:
    """A chain directory `c` under the world's tmp holding `manifest` as its manifest.json."""
    spec = ChainSpec("c", world.tmp / "chains", {"seed": 0})
    spec.root.mkdir(parents=True)
    (spec.root / "manifest.json").write_text(manifest)
    return spec


def refused_and_contained(world, spec: ChainSpec) -> str:
    """run_chain on a fresh lake refuses `spec` with an InputError and changes nothing outside; its one-line text."""
    lake = Lake.init(world.lake)
    before = world.snapshot()
    with pytest.raises(InputError) as refused:
        run_chain(spec, lake, 1)
    world.contained(before)
    return one_line(str(refused.value))


@pytest.mark.parametrize("entry", [
    {**RUN, "run_id": "../../../outside/victim"},
    {**RUN, "run_dir": "/tmp/../outside/victim"},
    {**RUN, "status": "finished", "checkpoint": "{outside}/victim"},
    {**RUN, "config": "{outside}/victim/keep.txt"},
    {**RUN, "run": 2},
    "not an entry",
])
def test_a_manifest_entry_naming_anything_but_the_chains_own_run_is_refused(world, entry):
    if isinstance(entry, dict):
        entry = {k: v.format(outside=world.outside) if isinstance(v, str) else v for k, v in entry.items()}
    spec = chain_with_manifest(world, json.dumps({"runs": [entry]}))
    assert "manifest.json: runs[0]" in refused_and_contained(world, spec)


@pytest.mark.parametrize("manifest", ["{", "[]", '{"runs": 3}', "[" * 100000])
def test_a_garbled_manifest_is_one_line(world, manifest):
    spec = chain_with_manifest(world, manifest)
    with pytest.raises(InputError) as refused:
        run_chain(spec, Lake.init(world.lake), 1)
    assert "manifest.json" in one_line(str(refused.value))


def test_a_symlinked_runs_directory_is_refused(world):
    spec = chain_with_manifest(world, json.dumps({"runs": []}))
    os.symlink(world.outside / "victim", spec.root / "runs")
    assert "is a symlink" in refused_and_contained(world, spec)


@pytest.mark.parametrize("name", ["../../outside", "a/b", ".hidden", ""])
def test_a_chain_name_is_one_path_part(world, name):
    config = world.tmp / "chain.toml"
    config.write_text(f'model = "m"\n[chain]\nname = {json.dumps(name)}\n')
    with pytest.raises(InputError) as refused:
        load_chain(config)
    assert "chain.name" in one_line(str(refused.value))
