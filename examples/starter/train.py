"""Starter training script for gpupass.

Fits a small linear model and reports one metric line per step: as JSON
lines to $GPUPASS_METRICS_FILE when the agent sets it, else as
`gpupass:metric {...}` lines on stdout. Resumes from
$GPUPASS_RESUME_FROM after a NaN-guard restart.
"""
import json
import os
import sys
import time

import torch


def emit(record, sink):
    line = json.dumps(record, sort_keys=True)
    if sink is not None:
        sink.write(line + "\n")
        sink.flush()
    else:
        print("gpupass:metric " + line, flush=True)


def main():
    torch.manual_seed(int(os.environ.get("GPUPASS_SEED", "0")))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    steps = int(os.environ.get("GPUPASS_STEPS", "200"))
    ckpt_dir = os.environ.get("GPUPASS_CHECKPOINT_DIR", "checkpoints")
    os.makedirs(ckpt_dir, exist_ok=True)

    true_w = torch.tensor([[2.0], [-3.0], [0.5]], device=device)
    model = torch.nn.Linear(3, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    resume = os.environ.get("GPUPASS_RESUME_FROM")
    if resume:
        state = torch.load(resume, map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1

    path = os.environ.get("GPUPASS_METRICS_FILE")
    sink = open(path, "a", encoding="utf-8") if path else None
    for step in range(start, steps):
        x = torch.randn(64, 3, device=device)
        y = x @ true_w + 0.01 * torch.randn(64, 1, device=device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        emit({"step": step, "loss": loss.item(),
              "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, sink)
        if step % 50 == 49:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                       os.path.join(ckpt_dir, "step-%06d.pt" % step))
    if sink is not None:
        sink.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
