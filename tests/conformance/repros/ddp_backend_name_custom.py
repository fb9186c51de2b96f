#!/usr/bin/env python
"""Why test_ddp_logging_data_cpu fails on guard: DDP logs backend_name "custom".

Not a guard bug. DDP's logger takes ``backend_name`` from the C++
``ProcessGroup::getBackendName()``, which returns the name of the group's
*backend type*; every backend registered through ``Backend.register_backend``
has type CUSTOM, so the name is "custom" whatever the backend calls itself
(``GuardBackend::getBackendName()`` returns "guard", but the ProcessGroup does
not ask it). ``dist.get_backend()`` returns the registered name, "guard", and
the test compares the two. torch's own plugin backend "fake" shows the same.

    PYTHONPATH=$PWD python tests/conformance/repros/ddp_backend_name_custom.py

Prints, for guard and for fake: dist.get_backend(), ProcessGroup.name(), the
wrapped Backend's name, and DDP's logged backend_name.
"""
import sys
import tempfile

import torch
import torch.distributed as dist


def show(label: str) -> str:
    pg = dist.group.WORLD
    be = pg._get_backend(torch.device("cpu"))
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    logged = ddp._get_ddp_logging_data().get("backend_name")
    print(f"{label:6s} dist.get_backend()={dist.get_backend()!r:8s} ProcessGroup.name()={pg.name()!r:9s} "
          f"Backend.name()={be.name()!r:8s} DDP backend_name={logged!r}")
    return logged


def main() -> int:
    import torch_ext  # noqa: F401

    init = tempfile.mktemp()
    dist.init_process_group("guard", init_method=f"file://{init}", rank=0, world_size=1)
    guard_logged = show("guard")
    dist.destroy_process_group()

    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    show("fake")
    dist.destroy_process_group()
    # Exit 1 while the mismatch exists, so this file doubles as a regression check.
    return 1 if guard_logged != "guard" else 0


if __name__ == "__main__":
    sys.exit(main())
