"""`--dry-run` for every bench script: the same code path at tiny sizes, in seconds, so a test can tell that a
script still runs (tests/bench/test_dry_runs.py). Its figures mean nothing."""
from __future__ import annotations

import argparse
import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any


def parse_args(parser: argparse.ArgumentParser, **tiny: Any) -> argparse.Namespace:
    """`parser`'s arguments plus `--dry-run`, which sets each of `tiny` (argument name: value) over what was given."""
    shown = ", ".join(f"{k.replace('_', '-')} {v}" for k, v in tiny.items())
    parser.add_argument("--dry-run", action="store_true", help=f"tiny sizes ({shown}), seconds: does it run")
    args = parser.parse_args()
    if args.dry_run:
        for name, value in tiny.items():
            setattr(args, name, value)
    return args


def random_model(out: Any, corpus: list[str], seed: int = 0) -> str:
    """A random-weight model of the tiny model's family, 1 layer of 32 wide, with a BPE over `corpus`, saved to
    `out`: what a dry run samples from and scores with (seconds to make, where training the tiny model takes minutes)."""
    from spo_lake.models.tiny import TinyConfig, build_tokenizer, make_model

    tokenizer = build_tokenizer(corpus)
    config = TinyConfig(seed=seed, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2)
    make_model(config, tokenizer).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def scratch(prefix: str) -> Path:
    """A fresh directory, removed when the script exits."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path
