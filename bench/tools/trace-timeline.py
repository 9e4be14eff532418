#!/usr/bin/env python3
"""Timeline of one decode step's products (int8 and streaming forms) from a FERRY_CUDA_TRACE build.

Usage: trace-timeline.py TRACE.bin

TRACE.bin is what trace_dump_tu writes (ops/trace.cuh, built with -DFERRY_CUDA_TRACE: the streaming
forms' records; TRACE.bin.q8 the int8 kernel's and TRACE.bin.attn the attention kernels', each read
with it when present): a u64
count, then records of u64 t0 t1 t2 t3 wait_cyc, u32 id block smid groups M kind, where t0..t3
are %globaltimer (ns) at a block's start, after griddepcontrol.wait, after b is in shared
memory and at its end. Records of one launch share its id. The last whole step (from the end
of the output product before it to the end of its own) is printed kernel by kernel, then per
kind over the step's layers (medians).
"""
import os
import struct
import sys
from collections import defaultdict
from statistics import median

REC = struct.Struct("<5Q6I")


def main():
    path = sys.argv[1]
    recs = []
    # The streaming forms' ring (mv-stream.cu), the int8 kernel's (mv-int8.cu) and attention.cu's
    # (kind bit 32: k_attn_row; bit 64: its early form): those written (a file's first launch
    # registers its dump).
    files = [f for f in (path, path + ".q8", path + ".attn") if os.path.exists(f)]
    if not files:
        sys.exit(f"no trace at {path} (nor {path}.q8, {path}.attn)")
    for f in files:
        data = open(f, "rb").read()
        (count,) = struct.unpack_from("<Q", data, 0)
        recs += [REC.unpack_from(data, 8 + i * REC.size) for i in range(count)]
    count = len(recs)
    # A replayed CUDA graph launches its nodes with the same arguments (the same id) every
    # step: steps are told apart by the biggest product (the output), whose launches end them.
    big = max(r[9] for r in recs)
    ends = sorted({r[3] for r in recs if r[9] == big})
    step_ends = []
    for t in ends:
        if step_ends and t - step_ends[-1] < 50_000:
            step_ends[-1] = t
        else:
            step_ends.append(t)
    if len(step_ends) < 2:
        sys.exit("fewer than two whole steps in the trace")
    lo, hi = step_ends[-2], step_ends[-1]
    by_id = defaultdict(list)
    for r in recs:
        if lo < r[0] <= hi:
            by_id[r[5]].append(r)
    ids = sorted(by_id, key=lambda i: min(r[0] for r in by_id[i]))
    step = ids
    grains = set()
    for r in recs[-2000:]:
        for t in r[:4]:
            grains.add(t % 32)
    print(f"records {count}; launches kept {len(ids)}; globaltimer low bits seen: "
          f"{sorted(grains)[:8]}")
    t_base = min(r[0] for r in by_id[step[0]])
    prev_end = None
    rows = []
    print(f"{'#':>3} {'kind':>12} {'M':>7} {'blk':>4} {'start0':>8} {'startN':>8} "
          f"{'wait0':>8} {'waitmed':>8} {'prolog':>7} {'rows':>7} {'endmed':>8} {'end':>8} "
          f"{'gap':>6} {'ringwait':>8} {'grp':>4}")
    for n, i in enumerate(step):
        rs = by_id[i]
        M = rs[0][9]
        kind = rs[0][10]
        if kind & 32:
            name = "attn" + (" early" if kind & 64 else "")
        else:
            name = ("glu" if kind & 1 else "") + ("epi" if kind & 2 else "") + \
                   ("+norm" if kind & 4 else "") + (" stream" if kind & 16 else ("" if kind & 8 else " noring")) + \
                   (" bulk" if kind & 128 else "") + (" chain" if kind & (1 << 24) else "") + \
                   f" t{(kind >> 8) & 0xffff}"
        s0 = min(r[0] for r in rs) - t_base
        sN = max(r[0] for r in rs) - t_base
        w0 = min(r[1] for r in rs) - t_base
        wm = median(r[1] for r in rs) - t_base
        pro = median(r[2] - r[1] for r in rs)
        rw = median(r[3] - r[2] for r in rs)
        em = median(r[3] for r in rs) - t_base
        e = max(r[3] for r in rs) - t_base
        gap = (w0 - prev_end) if prev_end is not None else 0
        ring = median(r[4] for r in rs)
        grp = median(r[8] for r in rs)
        print(f"{n:3d} {name:>12} {M:7d} {len(rs):4d} {s0/1e3:8.2f} {sN/1e3:8.2f} "
              f"{w0/1e3:8.2f} {wm/1e3:8.2f} {pro/1e3:7.2f} {rw/1e3:7.2f} {em/1e3:8.2f} "
              f"{e/1e3:8.2f} {gap/1e3:6.2f} {ring:8.0f} {grp:4.0f}")
        rows.append(dict(name=f"{name} M={M}", s0=s0, sN=sN, w0=w0, wm=wm, pro=pro, rw=rw,
                         em=em, e=e, gap=gap, prev=prev_end))
        prev_end = e
    total = rows[-1]["e"]
    print(f"step (first product's first block start .. last product's end): {total/1e3:.1f} us; "
          f"from the output product before it: {(hi - lo)/1e3:.1f} us")
    kinds = defaultdict(list)
    for r in rows[1:]:
        kinds[r["name"]].append(r)
    print("per kind (medians, us): n, prev end->first block start, prev end->wait done, "
          "prologue, rows, last block start->end, median end->end (tail), prev end->end")
    for k, rs in kinds.items():
        def med(f):
            return median(f(r) for r in rs) / 1e3
        print(f"  {k:28s} {len(rs):3d} start {med(lambda r: r['s0'] - r['prev']):6.2f} "
              f"wait {med(lambda r: r['w0'] - r['prev']):6.2f} "
              f"prolog {med(lambda r: r['pro']):5.2f} rows {med(lambda r: r['rw']):6.2f} "
              f"lastblk {med(lambda r: r['e'] - r['sN']):6.2f} tail {med(lambda r: r['e'] - r['em']):5.2f} "
              f"total {med(lambda r: r['e'] - r['prev']):6.2f}")


if __name__ == "__main__":
    main()
