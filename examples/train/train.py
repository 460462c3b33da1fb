#!/usr/bin/env python3
"""A small, real PyTorch training run that speaks gpupass.

It trains a two-layer MLP on a generated regression problem (seeded, so
every region computes the same curve on the same hardware class) and:

- writes one JSON line per step to $GPUPASS_METRICS_FILE
  ({"step", "loss", "lr", "ts"} with UTC timestamps), or prints
  `gpupass:metric {...}` lines when the variable is unset;
- saves a checkpoint every --checkpoint-every steps into
  $GPUPASS_CHECKPOINT_DIR (ckpt-<step>.pt, written atomically);
- resumes from $GPUPASS_RESUME_FROM when set (model, optimizer, RNG, step);
- with --nan-at-step N (or EXAMPLE_NAN_AT_STEP) makes the loss NaN at
  step N on a fresh start, to exercise gpupass's NaN guard. A resumed run
  does not inject again, as a transient fault would not recur.

Runs on CPU (Debian's python3-torch) and on CUDA when available.
"""
import argparse
import datetime
import json
import math
import os
import sys
import time

import torch


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
    # Scale the projection to unit variance so the target is smooth and a
    # small MLP visibly learns it within a few hundred steps.
    y = torch.sin((x @ w) / dim ** 0.5) + 0.05 * torch.randn(n, 1, generator=g)
    return x, y


def save_checkpoint(ckpt_dir, step, model, opt):
    os.makedirs(ckpt_dir, exist_ok=True)
    path = os.path.join(ckpt_dir, "ckpt-%08d.pt" % step)
    tmp = path + ".tmp"
    torch.save({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict(),
                "rng": torch.get_rng_state()}, tmp)
    os.replace(tmp, path)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=int(os.environ.get("EXAMPLE_STEPS", "200")))
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--checkpoint-every", type=int, default=25)
    p.add_argument("--nan-at-step", type=int, default=int(os.environ.get("EXAMPLE_NAN_AT_STEP", "0")))
    p.add_argument("--sleep", type=float, default=float(os.environ.get("EXAMPLE_STEP_SLEEP", "0")),
                   help="seconds to sleep per step (to watch logs stream)")
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print("dataloader: generating %d samples (seed %d) on %s" % (4096, args.seed, device), flush=True)
    x, y = make_data(args.seed, 4096, 16)
    x, y = x.to(device), y.to(device)

    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.MSELoss()

    start_step = 0
    resume = os.environ.get("GPUPASS_RESUME_FROM", "")
    if resume:
        state = torch.load(resume, map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        start_step = state["step"]
        print("checkpoint: resumed from %s at step %d" % (resume, start_step), flush=True)

    ckpt_dir = os.environ.get("GPUPASS_CHECKPOINT_DIR", "")
    mpath = os.environ.get("GPUPASS_METRICS_FILE", "")
    metrics_file = open(mpath, "a", encoding="utf-8") if mpath else None

    print("trainer: torch %s, %d steps from step %d, batch %d, lr %g"
          % (torch.__version__, args.steps, start_step, args.batch_size, args.lr), flush=True)
    n = x.shape[0]
    t0 = time.time()
    for step in range(start_step + 1, args.steps + 1):
        # Batches are a function of the step alone, so a resumed run sees
        # exactly the batches the original would have.
        g = torch.Generator().manual_seed(args.seed * 100003 + step)
        idx = torch.randint(0, n, (args.batch_size,), generator=g).to(device)
        opt.zero_grad()
        loss = loss_fn(model(x[idx]), y[idx])
        if args.nan_at_step and step == args.nan_at_step and not resume:
            loss = loss * float("nan")
        value = loss.item()
        emit(metrics_file, {"step": step, "loss": value, "lr": args.lr, "ts": utc_now()})
        if not math.isfinite(value):
            print("trainer: non-finite loss %s at step %d" % (value, step), file=sys.stderr, flush=True)
            # gpupass's NaN guard stops and restarts the process; on its
            # own, stop here rather than corrupt the weights.
            return 3
        loss.backward()
        opt.step()
        if ckpt_dir and step % args.checkpoint_every == 0:
            path = save_checkpoint(ckpt_dir, step, model, opt)
            print("checkpoint: saved %s" % path, flush=True)
        if args.sleep:
            time.sleep(args.sleep)
        if step % 50 == 0 or step == args.steps:
            print("trainer: step %d loss %.6f" % (step, value), flush=True)
    print("trainer: done in %.2fs" % (time.time() - t0), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
