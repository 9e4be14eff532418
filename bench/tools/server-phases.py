#!/usr/bin/env python3
"""Where a served decode step's server time goes, from one FERRY_STEP_TRACE directory of a unix
server and its client (stop 56's experiment build, branch exp56, adds the server events 'I':
waiting for the next request begins, 'Q' / 'q': the next step queued before the wait / after
the reply, 'W': the step waited for). Prints the medians (us) of each interval of a step (from
one client send S to the next): S -> the compute's header H12 -> handled D12 -> the read's
header H11 -> [Q] -> W -> handled D11 -> reply R11 -> [q] -> I; R11 -> the client's reply
E11 -> its next send S; and I -> the next H12 (the server waiting for the next request)."""
import glob
import os
import statistics
import sys


def load(p):
    return [(int(t), k + str(x)) for t, k, x in (line.split() for line in open(p))]


def main():
    d = sys.argv[1]
    c = load(glob.glob(os.path.join(d, "client-*.txt"))[0])
    s = load(glob.glob(os.path.join(d, "server-*.txt"))[0])
    sends = [t for t, n in c if n == "S0"]
    chain = ["H12", "D12", "H11", "Q11", "W11", "D11", "R11", "q0", "I0"]
    out = {}

    def add(k, v):
        out.setdefault(k, []).append(v / 1e3)

    prev_i = None
    for a, b in zip(sends, sends[1:]):
        se = {}
        for t, n in s:
            if a < t <= b and n not in se:
                se[n] = t
        if "D11" not in se or "H12" not in se:
            continue
        if prev_i is not None:
            add("I(prev) -> H12", se["H12"] - prev_i)
        last, ln = a, "S"
        for n in chain:
            if n in se and se[n] >= last:
                add(f"{ln} -> {n}", se[n] - last)
                last, ln = se[n], n
        prev_i = se.get("I0")
        e = [t for t, n in c if n == "E11" and a < t <= b]
        if e and "R11" in se:
            add("R11 -> client E11", e[0] - se["R11"])
            add("client E11 -> next S", b - e[0])
        add("period", b - a)
    for k, v in out.items():
        print(f"  {k:22s} {statistics.median(v):7.1f} us  (n {len(v)})")


main()
