#!/usr/bin/env python3
"""A small DDP training run (torch.distributed) that speaks gpupass.

The same seeded MLP regression as examples/train/train.py, trained with
DistributedDataParallel by WORLD_SIZE ranks. Each step draws one global
batch of --batch-size samples (a function of the seed and the step alone)
and rank r trains on its r-th slice of batch-size/WORLD_SIZE samples; DDP
averages the gradients, so N ranks follow the curve of 1 rank with the same
global batch, up to floating-point summation order.

- reads the rendezvous from the environment (init_process_group("env://")):
  MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK, as
  `python3 -m torch.distributed.run` and gpupass set them; without them it
  runs as a single rank;
- uses NCCL and the GPU LOCAL_RANK when CUDA is available, gloo otherwise
  (--backend overrides);
- the rank --metrics-rank (default 0) alone writes one JSON line per step
  to $GPUPASS_METRICS_FILE ({"step", "loss", "lr", "ts"}, the loss averaged
  over all ranks), or prints `gpupass:metric {...}` lines when unset;
- rank 0 saves a checkpoint every --checkpoint-every steps into
  $GPUPASS_CHECKPOINT_DIR (ckpt-<step>.pt, written atomically); every rank
  resumes from $GPUPASS_RESUME_FROM when set;
- --nan-at-step N makes the loss NaN at step N on a fresh start (every rank
  sees the averaged NaN and stops with exit code 3);
- --fail-rank R --fail-at-step N makes rank R exit 1 at step N, to show
  that a failed rank fails the whole job;
- --step-sleep S sleeps S seconds after each step, so that a rank can be
  killed mid-run (the loss curve does not change).

Every rank prints one first line ("ddp: rank R/W ...") as soon as it starts.
"""
import argparse
import datetime
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def emit(metrics_file, record):
    line = json.dumps(record, separators=(",", ":"), allow_nan=True)
    if metrics_file is not None:
        metrics_file.write(line + "\n")
        metrics_file.flush()
    else:
        print("gpupass:metric " + line, flush=True)


def make_data(seed, n, dim):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    w = torch.randn(dim, 1, generator=g)
    y = torch.sin((x @ w) / dim ** 0.5) + 0.05 * torch.randn(n, 1, generator=g)
    return x, y


def env_int(name, default):
    v = os.environ.get(name, "")
    if v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise SystemExit("ddp: %s=%r is not an integer" % (name, v))


def save_checkpoint(ckpt_dir, step, model, opt):
    os.makedirs(ckpt_dir, exist_ok=True)
    path = os.path.join(ckpt_dir, "ckpt-%08d.pt" % step)
    tmp = path + ".tmp"
    torch.save({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()}, tmp)
    os.replace(tmp, path)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=int(os.environ.get("EXAMPLE_STEPS", "100")))
    p.add_argument("--batch-size", type=int, default=64, help="global batch, split evenly over the ranks")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--checkpoint-every", type=int, default=25)
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    p.add_argument("--timeout", type=float, default=60, help="seconds to wait for the other ranks")
    p.add_argument("--metrics-rank", type=int, default=env_int("GPUPASS_METRICS_RANK", 0))
    p.add_argument("--nan-at-step", type=int, default=int(os.environ.get("EXAMPLE_NAN_AT_STEP", "0")))
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-at-step", type=int, default=0)
    p.add_argument("--step-sleep", type=float, default=0, help="seconds to sleep after each step (to kill a rank mid-run)")
    p.add_argument("--log-steps", action="store_true",
                   help="every rank prints a line for each step (to check that no rank's log loses or repeats one)")
    args = p.parse_args(argv)

    world = env_int("WORLD_SIZE", 1)
    rank = env_int("RANK", 0)
    local_rank = env_int("LOCAL_RANK", 0)
    node_rank = env_int("NODE_RANK", env_int("GROUP_RANK", 0))
    if not 0 <= rank < world:
        raise SystemExit("ddp: RANK=%d is not below WORLD_SIZE=%d" % (rank, world))
    if args.batch_size % world != 0:
        raise SystemExit("ddp: --batch-size %d is not divisible by WORLD_SIZE=%d: every rank must take the same share"
                         % (args.batch_size, world))
    use_cuda = torch.cuda.is_available() and args.backend != "gloo"
    backend = args.backend if args.backend != "auto" else ("nccl" if use_cuda else "gloo")
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    print("ddp: rank %d/%d (local rank %d, node %d) backend %s on %s, master %s:%s"
          % (rank, world, local_rank, node_rank, backend, device,
             os.environ.get("MASTER_ADDR", "-"), os.environ.get("MASTER_PORT", "-")), flush=True)

    distributed = world > 1 or "MASTER_ADDR" in os.environ
    if distributed:
        dist.init_process_group(backend, init_method="env://", world_size=world, rank=rank,
                                timeout=datetime.timedelta(seconds=args.timeout))

    torch.manual_seed(args.seed)
    x, y = make_data(args.seed, 4096, 16)
    x, y = x.to(device), y.to(device)
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)).to(device)
    model = DistributedDataParallel(net, device_ids=[local_rank] if use_cuda else None) if distributed else net
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.MSELoss()

    start_step = 0
    resume = os.environ.get("GPUPASS_RESUME_FROM", "")
    if resume:
        state = torch.load(resume, map_location=device)
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start_step = state["step"]
        print("checkpoint: rank %d resumed from %s at step %d" % (rank, resume, start_step), flush=True)

    ckpt_dir = os.environ.get("GPUPASS_CHECKPOINT_DIR", "")
    logs_metrics = rank == args.metrics_rank
    metrics_file = None
    if logs_metrics and os.environ.get("GPUPASS_METRICS_FILE", ""):
        metrics_file = open(os.environ["GPUPASS_METRICS_FILE"], "a", encoding="utf-8")

    if rank == 0:
        print("trainer: torch %s, %d ranks, %d steps from step %d, global batch %d (%d per rank), lr %g"
              % (torch.__version__, world, args.steps, start_step, args.batch_size, args.batch_size // world, args.lr),
              flush=True)
    n = x.shape[0]
    share = args.batch_size // world
    t0 = time.time()
    for step in range(start_step + 1, args.steps + 1):
        if rank == args.fail_rank and step == args.fail_at_step:
            print("trainer: rank %d failing at step %d as asked (--fail-rank)" % (rank, step), file=sys.stderr, flush=True)
            os._exit(1)
        # The global batch is a function of the step alone (a resumed run
        # sees the batches the original would have); this rank takes its
        # slice of it.
        g = torch.Generator().manual_seed(args.seed * 100003 + step)
        idx = torch.randint(0, n, (args.batch_size,), generator=g)[rank * share:(rank + 1) * share].to(device)
        opt.zero_grad()
        loss = loss_fn(model(x[idx]), y[idx])
        if args.nan_at_step and step == args.nan_at_step and not resume:
            loss = loss * float("nan")
        # The mean of the ranks' mean losses over equal shares is the
        # global batch's mean loss: the figure 1 rank would log.
        total = loss.detach().clone()
        if distributed:
            dist.all_reduce(total)
        value = total.item() / world
        if logs_metrics:
            emit(metrics_file, {"step": step, "loss": value, "lr": args.lr, "ts": utc_now()})
        if not math.isfinite(value):
            print("trainer: rank %d: non-finite loss %s at step %d" % (rank, value, step), file=sys.stderr, flush=True)
            return 3
        loss.backward()
        opt.step()
        if ckpt_dir and step % args.checkpoint_every == 0:
            if rank == 0:
                path = save_checkpoint(ckpt_dir, step, net, opt)
                print("checkpoint: saved %s" % path, flush=True)
            if distributed:
                # No rank runs ahead of a checkpoint that a restart
                # would resume from.
                dist.barrier()
        if args.step_sleep > 0:
            time.sleep(args.step_sleep)
        if args.log_steps:
            print("trainer: rank %d step %d loss %.6f" % (rank, step, value), flush=True)
        if rank == 0 and (step % 50 == 0 or step == args.steps):
            print("trainer: step %d loss %.6f" % (step, value), flush=True)
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        print("trainer: done in %.2fs" % (time.time() - t0), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
