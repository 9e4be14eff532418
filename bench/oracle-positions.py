#!/usr/bin/env python3
"""Per-position comparison of `ferry logits` against the tiny-llama float64 oracle.

For every prompt of reference.json and every position whose argmax differs from the oracle's,
prints the oracle's margin (its top-1 logit minus the logit of the run's choice) and the run's
margin the other way: a flip where both are small is a coin toss between two near-equal tokens;
a large oracle margin points at a real error. Plain Python (no numpy).

    bench/oracle-positions.py FERRY MODEL [ferry logits options...]
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

VOCAB = 1024


def rows(path, n):
    data = open(path, "rb").read()
    vals = struct.unpack("<%df" % (len(data) // 4), data)
    return [vals[i * VOCAB:(i + 1) * VOCAB] for i in range(n)]


def argmax(r):
    return max(range(VOCAB), key=lambda i: r[i])


def main():
    ferry, model, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
    fx = os.environ.get("FIXTURES", os.path.join(os.path.dirname(__file__), "..", "..", "shared",
                                                 "fixtures"))
    d = os.path.join(fx, "tiny-llama")
    ref = json.load(open(os.path.join(d, "reference.json")))
    total_flips = 0
    for ci, c in enumerate(ref["cases"]):
        toks = c["tokens"]
        with tempfile.NamedTemporaryFile(suffix=".f32") as out:
            cmd = [ferry, "logits", "-m", model, "--tokens", ",".join(map(str, toks)), "-o",
                   out.name] + extra
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            run = rows(out.name, len(toks))
        orc = rows(os.path.join(d, c["logits_file"]), len(toks))
        agree = 0
        for p in range(len(toks)):
            a, b = argmax(orc[p]), argmax(run[p])
            if a == b:
                agree += 1
                continue
            total_flips += 1
            print("case %d pos %2d: oracle %4d run %4d  oracle margin %.4f  run margin %.4f" %
                  (ci, p, a, b, orc[p][a] - orc[p][b], run[p][b] - run[p][a]))
        print("case %d: top1 %d/%d = %.3f" % (ci, agree, len(toks), agree / len(toks)))
    print("flips: %d" % total_flips)


if __name__ == "__main__":
    main()
