#!/usr/bin/env python3
# How the OpenVINO CPU plugin treats a compressed-weight pattern (issue 12): builds L products
# of 4-bit weights [N, K] (the 1B model's FFN shape by default) as
# constant -> convert -> [subtract zero point] -> multiply scale -> reshape -> MatMul, over
# 64-byte aligned memory shared with the model (as ferry's backend does), and prints the
# resident memory after building the arrays, after compile_model and after the first run, then
# the wall and CPU time per run at M=1 (decode) and M=64. CPU time (all threads) is the figure to
# compare on a machine shared with other work: wall time there follows the other processes.
#
#   .venv/bin/python bench/openvino-weight-patterns.py [--pattern u4zp|i4] [--scales f16|f32]
#       [--group 32] [--layers 16] [--static] [--seconds 3]
import argparse
import time

import numpy as np
import openvino as ov
import openvino.opset13 as ops


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    return -1


def aligned(nbytes):
    buf = np.empty(nbytes + 64, np.uint8)
    off = (-buf.ctypes.data) % 64
    return buf[off : off + nbytes]


ap = argparse.ArgumentParser()
ap.add_argument("--pattern", choices=["u4zp", "i4"], default="u4zp")
ap.add_argument("--scales", choices=["f16", "f32"], default="f16")
ap.add_argument("--group", type=int, default=32)
ap.add_argument("--layers", type=int, default=16)
ap.add_argument("--rows", type=int, default=8192)
ap.add_argument("--cols", type=int, default=2048)
ap.add_argument("--static", action="store_true", help="M fixed at 1 (else a dynamic M)")
ap.add_argument("--seconds", type=float, default=3.0)
a = ap.parse_args()
N, K, G = a.rows, a.cols, a.group
sdt = np.float16 if a.scales == "f16" else np.float32
rng = np.random.default_rng(0)
arrays = []
for _ in range(a.layers):
    q = aligned(N * K // 2)
    q[:] = rng.integers(0, 256, size=q.shape, dtype=np.uint8)
    s = aligned(N * K // G * np.dtype(sdt).itemsize).view(sdt).reshape(N, K // G, 1)
    s[:] = 0.01
    arrays.append((q, s))
print(f"arrays: {rss_mib()} MiB resident ({a.layers * N * K // 2 / 2**20:.0f} MiB of 4-bit values)")

x = ops.parameter([1, 1, 1 if a.static else -1, K], np.float32, name="x")
y = x
for q, s in arrays:
    et = ov.Type.i4 if a.pattern == "i4" else ov.Type.u4
    w = ov.op.Constant(ov.Tensor(q, ov.Shape([N, K // G, G]), et))
    ft = "f16" if a.scales == "f16" else "f32"
    w = ops.convert(w, ft)
    if a.pattern == "u4zp":
        w = ops.subtract(w, ops.convert(ov.op.Constant(ov.Type.u4, ov.Shape([]), [8]), ft))
    w = ops.multiply(w, ov.op.Constant(s, shared_memory=True))
    w = ops.reshape(w, [N, K], False)
    if a.scales == "f16":
        w = ops.convert(w, "f32")
    h = ops.matmul(y, w, False, True)  # [1, 1, M, N]
    y = ops.slice(h, [0], [K], [1], [3])  # the next product's input
model = ov.Model([y], [x])
cfg = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 2}
t0 = time.time()
cm = ov.Core().compile_model(model, "CPU", cfg)
print(f"compiled: {rss_mib()} MiB resident, {time.time() - t0:.1f} s")
req = cm.create_infer_request()
req.infer({"x": np.ones((1, 1, 1, K), np.float32)})
print(f"first run: {rss_mib()} MiB resident")
for m in (1,) if a.static else (1, 64):
    xi = np.full((1, 1, m, K), 0.01, np.float32)
    req.infer({"x": xi})
    t, c, n = time.time(), time.process_time(), 0
    while time.time() - t < a.seconds:
        req.infer({"x": xi})
        n += 1
    wall, cpu = (time.time() - t) / n, (time.process_time() - c) / n
    gbs = a.layers * N * K / 2 / wall / 1e9
    print(f"M={m}: {wall * 1e3:.2f} ms/run wall, {cpu * 1e3:.2f} ms/run CPU, {gbs:.1f} GB/s of 4-bit weights")
