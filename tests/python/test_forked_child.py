"""A process forked from a rank (``os.fork()``) that ends through the interpreter's exit: it
inherits the groups but not their threads (watchdog, store, gloo), so tearing them down would hang
or abort it, and saying "exited" for its parent's rank would end the peers' waits. It leaves them
alone, keeps its own exit status, and the job goes on (torch_ext/_runtime.py, _at_exit)."""
from __future__ import annotations

import pytest

from harness import launch_script

JOB = "tests/python/jobs/fork_job.py"


@pytest.mark.timeout(150)
@pytest.mark.parametrize("store", ["rank0", "parent"])
@pytest.mark.parametrize("how, status", [("exit", 3), ("raise", 1)])
def test_a_forked_child_ends_with_its_own_status_and_the_job_goes_on(store, how, status):
    results = launch_script([JOB, how], 2, store=store, timeout=120)
    assert all(r.returncode == 0 for r in results), [r.describe() for r in results]
    for r in results:
        # 2 ranks: the first sum 2; after, 1 + 2 on the guard group, then doubled on the plain one.
        assert f"rank {r.rank}: child exit {status}; sums 2 6" in r.output, r.describe()
        assert "terminate called" not in r.output and "std::terminate" not in r.output, r.describe()
    if how == "raise":
        assert all("RuntimeError: the child's own error" in r.output for r in results), [r.describe() for r in results]
