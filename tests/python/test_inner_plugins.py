"""Inner backends offered by other packages (torch_ext/backend.py, ON_DEMAND_GROUP): a package
that lists a backend under the ``torch_ext.inner_backends`` entry points is imported when a guard
group's ``inner`` first names it, as torch_ext's own nccl_sim is; the job imports nothing itself."""
from __future__ import annotations

import json
import os
import textwrap

import pytest

from harness import ROOT, launch_script

JOB = ["tests/python/jobs/join_job.py"]  # init_process_group("guard"), 20 all_reduces, its description


def _plugin(where) -> None:
    """An installed package (its dist-info on sys.path) offering inner backend 'loopgloo': gloo, under its own name."""
    (where / "loopgloo.py").write_text(textwrap.dedent("""
        import torch.distributed as dist

        def _create(store, rank, size, timeout):
            return dist.ProcessGroupGloo(store, rank, size, timeout)

        dist.Backend.register_backend("loopgloo", _create, devices=["cpu"])
    """))
    info = where / "loopgloo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: loopgloo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[torch_ext.inner_backends]\nloopgloo = loopgloo\n")


def test_a_package_offers_an_inner_backend_by_its_entry_point(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    _plugin(site)
    results = launch_script(JOB, 2, timeout=90, env={
        "OUT": str(tmp_path), "TORCH_EXT_INNER": "cpu:loopgloo",
        "PYTHONPATH": os.pathsep.join([ROOT, str(site)]),
    })
    text = "\n".join(r.describe() for r in results)
    assert all(r.returncode == 0 for r in results), text
    for rank in range(2):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert "inner=cpu:loopgloo" in record["describe"], record
        assert record["sums"] == [float(2 * i + 1) for i in range(20)] + [1], record


@pytest.mark.parametrize("store", ["parent", "rank0"])
def test_an_inner_backend_nobody_offers_is_refused_naming_the_ones_there_are(tmp_path, store):
    results = launch_script(JOB, 2, store=store, timeout=90,
                            env={"OUT": str(tmp_path), "TORCH_EXT_INNER": "cpu:loopgloo"})
    text = "\n".join(r.describe() for r in results)
    for rank in range(2):
        assert results[rank].returncode == 3, text
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        if store == "rank0" and rank == 1 and record["error"] == "GroupJoinError":
            # The inner backend is named after the join (the setting is rank 0's for the job): rank 0
            # may raise and end, taking the store its process hosts, while rank 1 still reads the join's
            # conclusion. Rank 1 then says so, typed, at once, rather than the ValueError.
            assert "the store failed" in record["message"] and record["after_s"] < 30, record
            continue
        assert record["error"] == "ValueError", record
        assert "names inner backend 'loopgloo'" in record["message"] and "nccl_sim" in record["message"], record
