# gpupass's link measurement at gang start (issue #34): an all-reduce of a
# fixed size across the gang's ranks, timed. The agent starts this ahead
# of the gang (torch imported while the node waits for work), or at the
# gang's start when no warm one is there; either way it prints
# {"ready": true}, reads the gang's rendezvous as one JSON line on stdin,
# measures once and prints one JSON result line. EOF on stdin: exit.
# With arguments it is a step of a cluster gang's job (below).
import datetime, json, os, socket, sys, time
import torch
import torch.distributed as dist

if len(sys.argv) > 1:
    # A step of a cluster gang's job (a Slurm task): bytes, iterations
    # and timeout as arguments, the rendezvous from the rank's own
    # variables. One process a node: rank the node's rank, the world the
    # gang's nodes, however many processes each node's job starts. The
    # result goes into the file named last (below).
    out_path = sys.argv[4]
    r = {"bytes": sys.argv[1], "iterations": sys.argv[2], "timeout_seconds": sys.argv[3],
         "master_addr": os.environ["MASTER_ADDR"], "master_port": os.environ["MASTER_PORT"],
         "rank": os.environ["NODE_RANK"], "world_size": os.environ["NNODES"], "local_rank": 0}
else:
    out_path = None
    print(json.dumps({"ready": True}), flush=True)
    line = sys.stdin.readline()
    if not line.strip():
        sys.exit(0)
    r = json.loads(line)
size = int(r["bytes"])       # bytes per rank
iters = int(r["iterations"])
host = r["master_addr"]
if ":" in host:
    host = "[" + host + "]"
backend = "nccl" if torch.cuda.is_available() else "gloo"
if int(r["rank"]) != 0:
    # torch's rendezvous client retries a refused connection only once a
    # second: a rank here before rank 0's store listens would lose most
    # of that second. Wait for the port to answer, in steps of 10 ms, no
    # longer than the measurement may take (init then says why it fails).
    end = time.monotonic() + int(r["timeout_seconds"])
    while True:
        try:
            socket.create_connection((r["master_addr"], int(r["master_port"])), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > end:
                break
            time.sleep(0.01)
dist.init_process_group(backend, init_method="tcp://%s:%d" % (host, int(r["master_port"])),
                        rank=int(r["rank"]), world_size=int(r["world_size"]),
                        timeout=datetime.timedelta(seconds=int(r["timeout_seconds"])))
n = dist.get_world_size()
dev = "cuda" if backend == "nccl" else "cpu"
if dev == "cuda":
    torch.cuda.set_device(int(r.get("local_rank", 0)))
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
# master_addr: where the ranks met, as the step found it in its own
# variables (a Kubernetes rank 0's pod IP, which its agent never knew).
res = json.dumps({"backend": backend, "ranks": n, "bytes": size, "iterations": iters, "seconds": sec,
                  "algbw_gbps": algbw * 8 / 1e9, "busbw_gbps": busbw * 8 / 1e9, "master_addr": r["master_addr"]})
if out_path:
    # Whole on this node before any rank goes on: a job step that ends
    # the job on a shortfall must not cut another rank's result short.
    with open(out_path + ".tmp", "w") as f:
        f.write(res + "\n")
    os.replace(out_path + ".tmp", out_path)
    dist.barrier()
print(res, flush=True)
dist.destroy_process_group()
