"""A deadlock across two process groups (the shape of torchrec#4149).

    python examples/bugs/crossed_groups.py

Groups "dp" and "mp" hold the same 3 ranks. Rank 0 all-reduces gradients on dp,
then embeddings on mp; ranks 1 and 2 do it the other way round. Each group on its
own just looks stuck: on dp ranks 1,2 have not arrived, on mp rank 0 has not.
After 2 s (TORCH_EXT_WARN_AFTER; 10 s by default) the ranks look at who waits
for whom: the missing ranks are followed into the group where they wait, and the
waits close a loop in which every rank blocks, so it can never resolve. One rank
logs the report, naming every edge, and every rank raises DeadlockError (a
CollectiveTimeoutError) at once, whose first line says "deadlock across groups
dp and mp". The dumps alone show the same cycle:
    python -m torch_ext.diagnose torch_ext_dumps
"""
import torch
import torch.distributed as dist

from _launch import launch


def sync_grads(dp) -> None:
    dist.all_reduce(torch.ones(4), group=dp)


def sync_embeddings(mp) -> None:
    dist.all_reduce(torch.ones(2), group=mp)


def train(rank: int, world: int) -> None:
    dp = dist.new_group(list(range(world)), backend="guard", group_desc="dp")
    mp = dist.new_group(list(range(world)), backend="guard", group_desc="mp")
    if rank == 0:
        sync_grads(dp)
        sync_embeddings(mp)
    else:
        sync_embeddings(mp)
        sync_grads(dp)


if __name__ == "__main__":
    launch(train, 3, TORCH_EXT_WARN_AFTER="2", TORCH_EXT_DUMP_DIR="torch_ext_dumps")
