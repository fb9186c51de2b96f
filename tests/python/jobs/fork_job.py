"""Each rank forks a child that ends through the interpreter's own exit (``sys.exit(3)``, or an
uncaught exception: status 1), as a program forking a checkpoint writer or a worker of its own does.
The child inherits the guard group and a plain gloo group, none of their threads: it must end by
itself with its own status, and say nothing for its parent's rank. The parent waits for it
(bounded), then runs a collective on each group: the peers must still see this rank alive."""
import os
import select
import sys

import torch
import torch.distributed as dist

import torch_ext  # noqa: F401 - registers the guard backend

how = sys.argv[1]
dist.init_process_group("guard")
plain = dist.new_group(backend="gloo")
t = torch.ones(1)
dist.all_reduce(t)
pid = os.fork()
if pid == 0:
    if how == "raise":
        raise RuntimeError("the child's own error")
    sys.exit(3)
ended = os.pidfd_open(pid)
if not select.select([ended], [], [], 30)[0]:
    print(f"rank {dist.get_rank()}: the forked child did not end within 30 s", flush=True)
    os._exit(7)
_, status = os.waitpid(pid, 0)
after = torch.full((1,), float(dist.get_rank() + 1))
dist.all_reduce(after)
dist.all_reduce(after, group=plain)
print(f"rank {dist.get_rank()}: child exit {os.waitstatus_to_exitcode(status)}; sums {t.item():g} {after.item():g}",
      flush=True)
dist.destroy_process_group()
