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
    pre = None
    if os.environ.get("GPUPASS_LINK_BYTES", "").isdigit() and not torch.cuda.is_available():
        # The tensor the all-reduce sends, made while the node waits
        # for a gang: its pages are touched now (about 0.1 s for 32 MiB
        # here), not at the gang's start. Untimed either way.
        pre = torch.ones(int(os.environ["GPUPASS_LINK_BYTES"]) // 4, dtype=torch.float32)
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
timeout = datetime.timedelta(seconds=int(r["timeout_seconds"]))
rank, world, port = int(r["rank"]), int(r["world_size"]), int(r["master_port"])


def reach_rank0(deadline):
    # torch's rendezvous client retries a refused connection only once a
    # second: a rank here before rank 0 listens would lose most of that
    # second. Connect in steps of 10 ms, no longer than the measurement
    # may take (init then says why it fails).
    while True:
        try:
            return socket.create_connection((r["master_addr"], port), timeout=5)
        except OSError:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)


if out_path is None:
    # The agent's own measurement (a local gang): the port is the agent's
    # to give, and it is the measurement's alone.
    if rank != 0:
        c = reach_rank0(time.monotonic() + int(r["timeout_seconds"]))
        if c is not None:
            c.close()
    dist.init_process_group(backend, init_method="tcp://%s:%d" % (host, port), rank=rank, world_size=world, timeout=timeout)
else:
    # A step of the gang's job: MASTER_PORT is the command's rendezvous,
    # and the command may start on one node while the step still runs on
    # another, so the step's own store must never be found there. Rank 0
    # opens its store on a free port of its own and hands that port, at
    # MASTER_PORT, to each other rank of this gang once; then it closes
    # MASTER_PORT, before any rank can have measured, so no rank's
    # command ever reaches the step there.
    gang = os.environ.get("GPUPASS_GANG_RUN", "")
    deadline = time.monotonic() + int(r["timeout_seconds"])
    if rank == 0:
        store = dist.TCPStore(r["master_addr"], 0, world, True, timeout, wait_for_workers=False)
        if socket.has_dualstack_ipv6():
            srv = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
        elif ":" in r["master_addr"]:
            srv = socket.create_server(("", port), family=socket.AF_INET6)
        else:
            srv = socket.create_server(("", port))
        told = set()
        while len(told) < world - 1:
            srv.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                c, _ = srv.accept()
            except socket.timeout:
                missing = sorted(set(range(1, world)) - told)
                raise SystemExit("rank(s) %s of the gang did not reach rank 0 at port %d within %ss" % (
                    ", ".join(map(str, missing)), port, r["timeout_seconds"]))
            try:
                c.settimeout(5)
                hello = c.makefile("rb").readline(256).decode("ascii", "replace").split()
                if len(hello) == 3 and hello[0] == "gpupass-link" and hello[1] == gang and hello[2].isdigit() and 0 < int(hello[2]) < world:
                    c.sendall(("gpupass-link %d\n" % store.port).encode())
                    told.add(int(hello[2]))
            except OSError:
                pass
            finally:
                c.close()
        srv.close()
    else:
        while True:
            c = reach_rank0(deadline)
            if c is None:
                raise SystemExit("rank 0 of the gang did not answer at %s:%d within %ss" % (r["master_addr"], port, r["timeout_seconds"]))
            try:
                c.sendall(("gpupass-link %s %d\n" % (gang, rank)).encode())
                said = c.makefile("rb").readline(64).decode("ascii", "replace").split()
            except OSError:
                said = []
            finally:
                c.close()
            if len(said) == 2 and said[0] == "gpupass-link" and said[1].isdigit():
                break
            time.sleep(0.01)
        store = dist.TCPStore(r["master_addr"], int(said[1]), world, False, timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
n = dist.get_world_size()
dev = "cuda" if backend == "nccl" else "cpu"
if dev == "cuda":
    torch.cuda.set_device(int(r.get("local_rank", 0)))
if out_path is None and pre is not None and dev == "cpu" and pre.numel() == size // 4:
    t = pre
else:
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
                  "algbw_gbps": algbw * 8 / 1e9, "busbw_gbps": busbw * 8 / 1e9, "master_addr": r["master_addr"],
                  "torch": torch.__version__, "in_command": bool(globals().get("GPUPASS_IN_COMMAND"))})
if out_path:
    # Whole on this node before any rank goes on: a job step that ends
    # the job on a shortfall must not cut another rank's result short.
    with open(out_path + ".tmp", "w") as f:
        f.write(res + "\n")
    os.replace(out_path + ".tmp", out_path)
    dist.barrier()
print(res, flush=True)
dist.destroy_process_group()
# Nothing is left to clean up: the interpreter's own teardown with torch
# loaded (about 0.3 s here) would only delay what waits for this process
# (the agent, or the command a step runs before).
sys.stderr.flush()
os._exit(0)
