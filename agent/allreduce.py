# gpupass's link measurement at gang start (issue #34): an all-reduce of a
# fixed size across the gang's ranks, timed. Prints one JSON line.
import json, os, sys, time
import torch
import torch.distributed as dist

size = int(sys.argv[1])      # bytes per rank
iters = int(sys.argv[2])
backend = "nccl" if torch.cuda.is_available() else "gloo"
dist.init_process_group(backend, init_method="env://", timeout=__import__("datetime").timedelta(seconds=int(sys.argv[3])))
n = dist.get_world_size()
dev = "cuda" if backend == "nccl" else "cpu"
if dev == "cuda":
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
t = torch.ones(size // 4, dtype=torch.float32, device=dev)
dist.all_reduce(t)  # warm-up: connections set up
dist.barrier()
times = []
for _ in range(iters):
    if dev == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    dist.all_reduce(t)
    if dev == "cuda":
        torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
# Every rank uses the slowest rank's time: the collective is as fast as it.
worst = torch.tensor([sorted(times)[len(times) // 2]], dtype=torch.float64)
dist.all_reduce(worst.to(dev) if dev == "cuda" else worst, op=dist.ReduceOp.MAX)
sec = float(worst.item())
algbw = size / sec
busbw = algbw * 2 * (n - 1) / n
print(json.dumps({"backend": backend, "ranks": n, "bytes": size, "iterations": iters, "seconds": sec,
                  "algbw_gbps": algbw * 8 / 1e9, "busbw_gbps": busbw * 8 / 1e9}))
dist.destroy_process_group()
