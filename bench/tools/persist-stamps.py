#!/usr/bin/env python3
"""Sums up FERRY_CUDA_PERSIST_STAMPS=1 output (the persistent step's per-phase stamps, printed on
stderr when the backend goes: one `stamps PHASE KIND blocks N start .. input .. (max ..) tiles ..
(max ..) end .. (max ..)` line a phase, us from the step's start; main's since stop 61 add
`producer .. free ..% cap ..%`: the producer's span in the phase and the shares of it spent
waiting for a free ring stage and under the cap on copies in flight, medians over the blocks).

    FERRY_CUDA_PERSIST_STAMPS=1 ferry bench -m M --device CUDA0 -p 0 -n 32 -r 1 2> stamps.txt
    python3 bench/tools/persist-stamps.py stamps.txt

Prints, as medians over the layers: each hop (the producing phase's last block's rows stored to
the next phase's median input read), each product's tiles (input read to tiles summed), the
attention (q/k/v's last store to its median end; where the lines have them, its hop from q/k/v
and its sums), and the step's end; where the lines have them, each product's producer span and
its shares waiting for a free stage and under the cap."""
import re
import statistics
import sys

LINE = re.compile(r"stamps\s+(\d+) (\w+)\s+blocks\s+(\d+) start\s+([-\d.]+) input\s+([-\d.]+) "
                  r"\(max\s+([-\d.]+)\) tiles\s+([-\d.]+) \(max\s+([-\d.]+)\) end\s+([-\d.]+) "
                  r"\(max\s+([-\d.]+)\)(?: producer\s+([-\d.]+) free\s+([-\d.]+)% cap\s+([-\d.]+)%)?")


def main(path):
    rows = {}
    prod = {}  # phase: (kind, producer span, free share, cap share)
    for line in open(path):
        m = LINE.match(line)
        if m:
            pi = int(m[1])
            rows[pi] = (m[2], *map(float, m.groups()[3:10]))
            if m[11] is not None:
                prod[pi] = (m[2], *map(float, m.groups()[10:13]))
    if not rows:
        sys.exit(f"{path}: no stamps lines")
    # (kind, start, input, input max, tiles, tiles max, end, end max)
    out = {}
    for pi in sorted(rows):
        k, _, inp, _, tiles, _, end, _ = rows[pi]
        prev = rows.get(pi - 1)
        if k == "attn" and prev:
            out.setdefault("attention", []).append(end - prev[7])
            if inp >= 0 and tiles >= 0:  # (main's since stop 61: its input read, sums done)
                out.setdefault("hop qkv -> attn", []).append(inp - prev[7])
                out.setdefault("attn sums", []).append(tiles - inp)
            continue
        if prev and k != "out":
            out.setdefault(f"hop {prev[0]} -> {k}", []).append(inp - prev[7])
        out.setdefault(f"{k} tiles", []).append(tiles - inp)
    for name, v in out.items():
        print(f"{name:20s} median {statistics.median(v):6.1f} us (min {min(v):6.1f}, max {max(v):6.1f}, {len(v)})")
    spans = {}
    for k, span, free, cap in prod.values():
        if span >= 0:
            spans.setdefault(k, []).append((span, free, cap))
    for k, v in spans.items():
        med = [statistics.median(x[i] for x in v) for i in range(3)]
        print(f"{k + ' producer':20s} median {med[0]:6.1f} us, waiting for a stage {med[1]:4.1f}%, "
              f"under the cap {med[2]:4.1f}% ({len(v)})")
    last = rows[max(rows)]
    print(f"step end {last[6]:.1f} us (the output phase's input {last[2]:.1f})")


if __name__ == "__main__":
    main(sys.argv[1])
