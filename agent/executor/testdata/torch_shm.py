# Moves tensors the ways training does through /dev/shm: a DataLoader with
# two worker processes, and a tensor in shared memory changed by a child
# process. The executor's and the agent's e2e tests run it in a run's own
# /dev/shm (a tmpfs in its mount namespace).
import os, torch, torch.multiprocessing as mp
from torch.utils.data import DataLoader, TensorDataset

def bump(q, t):
    t.add_(1)
    q.put(float(t.sum()))

if __name__ == "__main__":
    ds = TensorDataset(torch.arange(1000, dtype=torch.float32).reshape(250, 4))
    total = 0.0
    for (b,) in DataLoader(ds, batch_size=25, num_workers=2):
        total += float(b.sum())
    t = torch.zeros(1000).share_memory_()
    ctx = mp.get_context("fork")
    q = ctx.SimpleQueue()
    p = ctx.Process(target=bump, args=(q, t))
    p.start()
    got = q.get()
    p.join()
    print("dataloader-sum=%d shared=%d/%d shm=%s" % (total, got, float(t.sum()), os.statvfs("/dev/shm").f_blocks))
