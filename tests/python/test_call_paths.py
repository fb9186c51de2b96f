"""Look-alike collectives from different lines, with the call path compared (issue 67).

A gradient hook's all_reduce and a grad-norm all_reduce of one signature: where one rank's hook
does not run, its norm pairs with the other rank's hook. With the call path compared (strict, or
the default with TORCH_EXT_CALL_PATHS=on) the pair itself fails on both ranks before either reads
the other's value: no wrong norm is printed. The default cannot see it (README, "what the default
cannot see"); examples/bugs/skipped_module.py's tests (test_examples.py) cover what its report
says when a later collective differs. Real processes, both launch ways.
"""
from __future__ import annotations

import re

import pytest

from harness import launch_script

JOB = ["tests/python/jobs/hook_lookalike_job.py"]
DEFAULTS = {"TORCH_EXT_WARN_AFTER": "", "TORCH_EXT_ABORT_AFTER": ""}  # "": the guard's defaults


@pytest.mark.timeout(120)
@pytest.mark.parametrize("store", ["rank0", "parent"])
@pytest.mark.parametrize("setting", [{"TORCH_EXT_CHECK": "strict"}, {"TORCH_EXT_CALL_PATHS": "on"}],
                         ids=["strict", "verify-call-paths"])
def test_a_hook_all_reduce_against_a_norm_all_reduce_fails_before_any_wrong_norm(store, setting):
    results = launch_script(JOB, 2, store=store, timeout=60, env={**DEFAULTS, **setting})
    text = "\n".join(r.describe() for r in results)
    for r in results:
        assert r.returncode == 3, text  # ended by itself, with the error, on both ranks
        assert f"[rank {r.rank}] raised CollectiveMismatchError:\ncollective #7 on group" in r.output, text
        assert re.search(r"at hook_lookalike_job\.py:\d+ in sync_grad", r.output), text
        assert re.search(r"at hook_lookalike_job\.py:\d+ in <module>", r.output), text
        # Steps 0-2 only, the norms plain gloo gives there; step 3's pair never returned.
        norms = [float(x) for x in re.findall(r"step \d: grad norm ([\d.]+)", r.output)]
        assert norms == [4.0, 8.0, 12.0], text
        if "TORCH_EXT_CALL_PATHS" in setting:  # verify sends each rank's history: where the paths part
            assert re.search(r"reading: the histories part at #7: rank 0 issued all_reduce at "
                             r"hook_lookalike_job\.py:\d+ in sync_grad from hook_lookalike_job\.py:\d+ in <module>, "
                             r"rank 1 issued it at hook_lookalike_job\.py:\d+ in <module>; "
                             r"a collective issued on some ranks only", r.output), text
