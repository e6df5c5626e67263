"""No code from data: a model directory never runs its own code (trust_remote_code) nor unpickles weights; the
package holds no other way to run code from a file (checked over its source)."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from spo_lake.errors import InputError
from spo_lake.models.backend import TransformersPolicy
from tests.security.conftest import one_line, one_line_error
from tests.security.test_run_dirs import Payload

PACKAGE = Path(__file__).parents[2] / "spo_lake"
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 8,
              "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
              "max_position_embeddings": 32}


def model_dir(world, scripted_model_dir, config: dict) -> Path:
    """A model directory with a real tokenizer and `config`, and no safetensors weights."""
    out = world.tmp / "model"
    out.mkdir()
    for f in scripted_model_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, out / f.name)
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_pickled_weights_are_never_loaded(world, scripted_model_dir, spolake):
    directory = model_dir(world, scripted_model_dir, TINY_LLAMA)
    torch.save({"model.embed_tokens.weight": Payload(world.marker)}, directory / "pytorch_model.bin")
    with pytest.raises(InputError) as refused:
        TransformersPolicy.from_pretrained(str(directory))
    one_line(str(refused.value))
    one_line_error(spolake("model", "import", "--from-dir", directory, "--out", world.tmp / "imported"))
    assert not world.marker.exists()


def test_a_model_directory_never_runs_its_own_code(world, scripted_model_dir, spolake):
    directory = model_dir(world, scripted_model_dir, {**TINY_LLAMA, "model_type": "evil", "auto_map": {
        "AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}})
    (directory / "evil.py").write_text(f"import pathlib\npathlib.Path({str(world.marker)!r}).touch()\n")
    with pytest.raises(InputError) as refused:
        TransformersPolicy.from_pretrained(str(directory))
    one_line(str(refused.value))
    one_line_error(spolake("model", "import", "--from-dir", directory, "--out", world.tmp / "imported"))
    assert not world.marker.exists()


# Every way to run code from data, and where the package may use it (path: why). Anything new must be added here
# with its reason, which a reviewer then sees.
ALLOWED = {
    r"torch\.load\(": {"rl/run.py": "pickled .pt state of old run dirs, only with --trust-pickles"},
    r"weights_only\s*=\s*False": {"rl/run.py": "the same, behind --trust-pickles"},
    r"\bpickle\b": {"sandbox/harness.py": "a comment on the sample's own __main__, inside the sandbox"},
    r"yaml\.(unsafe_)?load\(": {},
    r"trust_remote_code\s*=\s*True": {},
    r"\bexec\(": {"sandbox/harness.py": "runs the sample inside the sandbox",
                  "tasks/verifiers.py": "the problem's own (trusted) HumanEval check, never a response",
                  "tasks/pyfunc.py": "the generated reference solution, never a response"},
    r"(?<![.\w])eval\(": {"tasks/countdown.py": "inside the sandbox harness text, never on the host"},
}


@pytest.mark.parametrize("pattern", sorted(ALLOWED))
def test_the_package_runs_code_from_data_only_where_listed(pattern):
    found = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
             if re.search(pattern, "\n".join(line for line in p.read_text().splitlines()
                                            if not line.lstrip().startswith("#")))}
    assert found == set(ALLOWED[pattern]), found
