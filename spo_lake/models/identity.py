"""Which model a `--model` argument names, and the `model_id` the lake records for it.

The lake finds earlier work of a model (q0 samples, PTS rollouts, cached log-probs) by `model_id`, so one model
must always get the same id, and two different models different ids:

- a local directory: `<resolved absolute path>@<fingerprint>`. `models/pi0`, `./models/pi0` and its absolute
  path are one model; a model rebuilt in place is another. The fingerprint is 12 hex digits of a SHA-256 over
  every file directly in the directory except documentation (name, size, and bytes; files over 64 MiB
  contribute 16 evenly spaced 64 KiB samples instead of all their bytes, so an 8B model costs milliseconds, and
  any retraining, which changes every tensor, still changes it).
- a hub name (`org/name`): `org/name@<commit>` with the commit the local hub cache resolved it to, or the bare
  name when it is not cached (the loader then downloads it, and the id it records has the commit).

Ids written before this scheme (the argument as typed, e.g. `models/pi0`) stay in the lake as they are: queries
read them, and `--model-id` on the annotation verbs (or `reference_id` in a run config) names one explicitly to
keep extending it.

A local-looking argument that does not exist is an error here, before any hub access: one that starts with
`/`, `./`, `../` or `~`; one with more than one `/` (a hub name has exactly one); one whose first component is an
existing directory (`models/pi1` when `models/` exists).
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from spo_lake.errors import InputError

HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+|[A-Za-z0-9][\w.-]*")
BIG_FILE = 64 << 20
SAMPLES, SAMPLE_BYTES = 16, 64 << 10
NOT_CONTENT = {"README.md", "tiny_config.json"}  # documentation and build notes: not part of what the model computes


def is_local(name: str) -> bool:
    """Whether `name` means a path on this machine (existing or not) rather than a hub name."""
    if Path(name).expanduser().exists() or name.startswith(("/", "./", "../", "~")) or name in (".", ".."):
        return True
    parts = name.split("/")
    return len(parts) > 2 or os.sep != "/" and os.sep in name or len(parts) == 2 and Path(parts[0]).is_dir() \
        or not HUB_NAME.fullmatch(name)


def resolve_model(name: str) -> str:
    """What to hand to `from_pretrained`: the absolute directory for a local model, else the hub name.

    Raises ValueError (one line) for a local-looking name that is not a model directory."""
    name = str(name)
    if not is_local(name):
        return name
    path = Path(name).expanduser().resolve()
    if not path.is_dir():
        raise InputError(f"model {name}: no such directory ({path})")
    if not (path / "config.json").is_file():
        raise InputError(f"model {name}: {path} has no config.json (not a transformers model directory)")
    return str(path)


def model_identity(name: str, revision: str | None = None) -> str:
    """The `model_id` of a local directory or hub name (see the module doc)."""
    target = resolve_model(name)
    if Path(target).is_absolute():
        return f"{target}@{fingerprint(Path(target))}"
    commit = hub_commit(target, revision)
    return f"{target}@{commit}" if commit else target


def weights_identity(model_id: str) -> str:
    """What names a model's weights in its `model_id`, not where they live: a local directory's fingerprint (or a
    hub name with its commit). Sampled rows derive their ids from it, so a lake rebuilt elsewhere has the same ids."""
    target, at, version = model_id.rpartition("@")
    return version if at and Path(target).is_absolute() else model_id


def fingerprint(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.iterdir() if p.is_file() and p.name not in NOT_CONTENT):
        size = path.stat().st_size
        digest.update(f"{path.name}\0{size}\0".encode())
        with path.open("rb") as fh:
            if size <= BIG_FILE:
                digest.update(fh.read())
                continue
            for i in range(SAMPLES):
                fh.seek((size - SAMPLE_BYTES) * i // (SAMPLES - 1))
                digest.update(fh.read(SAMPLE_BYTES))
    return digest.hexdigest()[:12]


def hub_commit(name: str, revision: str | None = None) -> str | None:
    """The commit the local hub cache resolves `name` (at `revision`, default main) to; None if not cached."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(name, "config.json", revision=revision)
    return Path(found).parent.name if isinstance(found, str) else None
