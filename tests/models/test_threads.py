"""The torch thread policy: counts come from the cores this process may use, split between concurrent users."""
import os
import subprocess
import sys

import pytest
import torch

from spo_lake.models.threads import available_cores, cgroup_cpu_quota, default_threads, use_threads


@pytest.mark.parametrize("v2, v1, expected", [
    ("max 100000\n", None, None),
    ("150000 100000\n", None, 1.5),
    (None, ("-1", "100000"), None),
    (None, ("200000", "100000"), 2.0),
    (None, None, None),
])
def test_the_cgroup_quota_is_read_from_v2_or_v1_files(tmp_path, v2, v1, expected):
    paths = tmp_path / "cpu.max", tmp_path / "cfs_quota_us", tmp_path / "cfs_period_us"
    if v2 is not None:
        paths[0].write_text(v2)
    if v1 is not None:
        paths[1].write_text(v1[0])
        paths[2].write_text(v1[1])
    assert cgroup_cpu_quota(*paths) == expected


def test_the_default_follows_the_cpu_affinity_and_splits_between_concurrent_users():
    # A child pinned to one core: torch itself would still take every core of the machine.
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from spo_lake.models.threads import available_cores, default_threads, use_threads; "
            "import torch; print(available_cores(), default_threads(2), use_threads(), torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1", "1", "1", "1"]
    assert 1 <= available_cores() <= len(os.sched_getaffinity(0))
    assert default_threads(2) == max(1, available_cores() // 2)


@pytest.mark.parametrize("omp, expected", [("1", [1, 1]), ("1,1", [1, 1]), ("", [2, 1]), ("0", [2, 1]),
                                           ("many", [2, 1])])
@pytest.mark.skipif(available_cores() < 2, reason="needs two usable cores to tell a cap from the default")
def test_omp_num_threads_caps_the_default_and_is_ignored_when_not_a_count(omp, expected):
    # two cores (the test's machine may have more): without a cap, 2 threads for one user and 1 each for two
    code = ("import os; os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2]); "
            "from spo_lake.models.threads import default_threads; print(default_threads(), default_threads(2))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": omp}).stdout.split()
    assert [int(n) for n in out] == expected


def test_use_threads_sets_torch_and_rejects_negative_counts():
    before = torch.get_num_threads()
    try:
        assert use_threads(1) == 1 and torch.get_num_threads() == 1
        assert use_threads(0, concurrent=2) == default_threads(2) == torch.get_num_threads()
        with pytest.raises(ValueError, match="threads must be >= 0"):
            use_threads(-1)
    finally:
        torch.set_num_threads(before)
