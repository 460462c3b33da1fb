#!/usr/bin/env python3
"""A stand-in training job for the component pipeline: a fixed, decaying
loss curve, one JSON line per step to $GPUPASS_METRICS_FILE (or gpupass:metric
lines on stdout), so every region reports the same curve in a second."""
import datetime
import json
import os

path = os.environ.get("GPUPASS_METRICS_FILE")
out = open(path, "a") if path else None
for step in range(1, 21):
    ts = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    line = json.dumps({"step": step, "loss": round(1.0 / step, 6), "lr": 0.01, "ts": ts})
    if out:
        out.write(line + "\n")
        out.flush()
    else:
        print("gpupass:metric " + line, flush=True)
