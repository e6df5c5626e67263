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


@pytest.mark.parametrize("omp, capped", [("1", True), ("1,1", True), ("", False), ("0", False), ("many", False)])
def test_omp_num_threads_caps_the_default_and_is_ignored_when_not_a_count(omp, capped):
    # in a child free to use every core of the machine (a test worker may be pinned to one)
    code = ("import os\n"
            "try:\n    os.sched_setaffinity(0, range(os.cpu_count()))\nexcept OSError:\n    pass\n"
            "from spo_lake.models.threads import available_cores, default_threads\n"
            "print(available_cores(), default_threads(), default_threads(2))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "OMP_NUM_THREADS": omp})
    cores, one_user, two_users = (int(n) for n in done.stdout.split())
    if cores < 2:
        pytest.skip("one usable core: the default is one thread with or without a cap")
    assert [one_user, two_users] == ([1, 1] if capped else [cores, max(1, cores // 2)])


def test_use_threads_sets_torch_and_rejects_negative_counts():
    before = torch.get_num_threads()
    try:
        assert use_threads(1) == 1 and torch.get_num_threads() == 1
        assert use_threads(0, concurrent=2) == default_threads(2) == torch.get_num_threads()
        with pytest.raises(ValueError, match="threads must be >= 0"):
            use_threads(-1)
    finally:
        torch.set_num_threads(before)
