"""A deadlock that no single process group sees whole: pipeline send/recv plus data-parallel reduces.

    python examples/bugs/pipeline_deadlock.py

Two pipeline stages of two data-parallel replicas each: stage 0 is ranks 0,1
(group "dp"), stage 1 ranks 2,3 (group "dp"); the pipeline pairs 0-2 and 1-3 are
groups "pp". Rank 0 all-reduces its gradients before it sends activations on;
rank 2 receives them before its own all-reduce; rank 1 receives gradients from
rank 3 first, and rank 3 all-reduces before it sends them. Each group on its own
just looks stuck; together: rank 2 waits for rank 0 (recv), 0 for 1 (dp), 1 for 3
(recv), 3 for 2 (dp).

Each group's analyst follows the waits out of its own group through the
positions every rank publishes when it answers an incident, so one report, after
2 s (TORCH_EXT_WARN_AFTER; 10 s by default), names the deadlock and every edge of
it, send/recv included; every rank blocks in its wait, so it can never resolve,
and every rank raises DeadlockError (a CollectiveTimeoutError) at once, whose
first line says "deadlock across groups dp and pp". The dumps alone show
the same loop, and the HTML view draws it:
    python -m torch_ext.diagnose torch_ext_dumps --html report.html
"""
import torch
import torch.distributed as dist

from _launch import launch


def reduce_grads(dp, grads) -> None:
    dist.all_reduce(grads, group=dp)


def send_activations(pp, acts, dst: int) -> None:
    dist.send(acts, dst, group=pp)


def recv_from_stage(pp, buf, src: int) -> None:
    dist.recv(buf, src, group=pp)


def train(rank: int, world: int) -> None:
    dp = [dist.new_group(r, backend="guard", group_desc="dp") for r in ([0, 1], [2, 3])][rank // 2]
    pp = [dist.new_group(r, backend="guard", group_desc="pp") for r in ([0, 2], [1, 3])][rank % 2]
    t = torch.ones(8)
    if rank == 0:
        reduce_grads(dp, t)
        send_activations(pp, t, 2)
    elif rank == 1:
        recv_from_stage(pp, t, 3)
        reduce_grads(dp, t)
    elif rank == 2:
        recv_from_stage(pp, t, 0)
        reduce_grads(dp, t)
    else:
        reduce_grads(dp, t)
        send_activations(pp, t, 1)


if __name__ == "__main__":
    launch(train, 4, TORCH_EXT_WARN_AFTER="2", TORCH_EXT_DUMP_DIR="torch_ext_dumps")
