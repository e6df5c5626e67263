"""What torchrun starts on each rank in tests/rl/test_distributed.py: `python -m spo_lake <args>`, every rank but 0
inside bubblewrap with the paths in $SPOLAKE_TEST_READONLY (os.pathsep-separated) mounted read-only, so a write
that rank attempts there (lake rows, checkpoints, metrics) fails the run."""
import os
import sys

command = [sys.executable, "-m", "spo_lake", *sys.argv[1:]]
if os.environ["RANK"] != "0":
    readonly = [a for path in os.environ["SPOLAKE_TEST_READONLY"].split(os.pathsep) for a in ("--ro-bind", path, path)]
    command = ["bwrap", "--dev-bind", "/", "/", *readonly, *command]
os.execvp(command[0], command)
