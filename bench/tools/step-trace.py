#!/usr/bin/env python3
"""Lines a remote client's decode steps up with its server's, from FERRY_STEP_TRACE files.

    FERRY_STEP_TRACE=DIR ferry serve ...  and  FERRY_STEP_TRACE=DIR ferry bench --remote ...
    python3 bench/tools/step-trace.py DIR

Each process writes DIR/ROLE-PID-N.txt per connection ("T_NS KIND CMD" lines; both sides stamp
CLOCK_MONOTONIC, one clock for the host). Every request gets one reply in order, so the
client's replies pair with the server's requests in order. A decode step is a GRAPH_COMPUTE
followed by the read of its result (TENSOR_GET over tcp, TENSOR_COPY into shared memory over
unix), or, where the result lies in memory the client maps (a CPU device over unix), the
compute alone (its reply then stands for the read's). Prints, per client/server pair, the medians (us) of each event
after the client's send that carried the step's compute, and the step period. Striped tcp
replies add the lanes' files (lane-send-*, lane-receive-*: a thread each, moving stripes
1..n-1): the last of a step's lane sends to start ('w') and to return ('s') on the server, and
the last stripe all received ('r') on the client, each the latest over the lanes.
"""
import bisect
import glob
import os
import statistics
import sys

GRAPH_COMPUTE, TENSOR_GET, TENSOR_COPY = 12, 9, 11
MAX_PIECES = 16  # the pieces between the first and the last shown, at most


def load(path):
    ev = []
    with open(path) as f:
        for line in f:
            t, k, c = line.split()
            ev.append((int(t), k, int(c)))
    return ev


def steps(client, server):
    c_h = [e for e in client if e[1] == "H" and e[2] != 1]  # HELLO is not the frame loop's
    c_e = [e for e in client if e[1] == "E" and e[2] != 1]
    c_s = [e[0] for e in client if e[1] == "S"]
    # The server's events grouped by request: H, then D, R and a progressive reply's F, its
    # later pieces P (a list), L, stripe 0 sent (0) and all stripes sent (A).
    reqs = []
    for t, k, c in server:
        if k == "H":
            reqs.append({"cmd": c, "H": t, "P": []})
        elif reqs and k == "P":
            reqs[-1]["P"].append(t)
        elif reqs and k not in reqs[-1]:
            reqs[-1][k] = t
    # The client's replies are a subsequence of the server's requests (a request of the
    # session's end may go unanswered): paired in order, skipping server requests that differ.
    pairs, j = [], 0
    for i, (t, _, c) in enumerate(c_h):
        while j < len(reqs) and reqs[j]["cmd"] != c:
            j += 1
        if j == len(reqs):
            return None
        pairs.append((i, j))
        j += 1
    rows = []
    for (i, j), (i2, j2) in zip(pairs, pairs[1:]):
        a, b = reqs[j], reqs[j2]
        if a["cmd"] != GRAPH_COMPUTE:
            continue
        if b["cmd"] not in (TENSOR_GET, TENSOR_COPY):
            # No read: the result is in shared memory the client maps (a CPU device over
            # unix), and the compute's reply ends the step.
            if b["cmd"] != GRAPH_COMPUTE:
                continue
            b, i2 = a, i
        sends = [t for t in c_s if t <= a["H"]]
        if not sends:
            continue
        t0 = sends[-1]
        r = {"server: compute header": a["H"], "server: compute handled": a.get("D")}
        if "F" in b:
            r["server: first piece"] = b["F"]
            for n, t in enumerate(b["P"][:MAX_PIECES]):
                r[f"server: piece {n + 2}"] = t
            r["server: last piece"] = b.get("L")
            r["server: stripe 0 sent"] = b.get("0")
            r["server: stripes sent"] = b.get("A")
        r["server: read handled"] = b.get("D")
        r["server: read reply sent"] = b.get("R")
        r["client: read reply header"] = c_h[i2][0]
        r["client: read reply in"] = c_e[i2][0]
        rows.append((t0, {k: (v - t0) / 1e3 for k, v in r.items() if v is not None}))
    return rows


def lane_events(d):
    """Each lane event kind ('w', 's', 'r') with its times over every lane file, sorted."""
    ev = {}
    for p in glob.glob(os.path.join(d, "lane-*.txt")):
        for t, k, _ in load(p):
            ev.setdefault(k, []).append(t)
    return {k: sorted(v) for k, v in ev.items()}


def add_lanes(rows, lanes):
    """Adds to each step the last lane event of each kind before the next step's send."""
    names = {"w": "lane: last send starts", "s": "lane: last send returns",
             "r": "client lane: stripe in"}
    for n, (t0, r) in enumerate(rows):
        t1 = rows[n + 1][0] if n + 1 < len(rows) else float("inf")
        for k, name in names.items():
            ts = lanes.get(k, [])
            i = bisect.bisect_left(ts, t1)
            if i > 0 and ts[i - 1] > t0:
                r[name] = (ts[i - 1] - t0) / 1e3


def main():
    d = sys.argv[1]
    lanes = lane_events(d)
    clients = sorted(glob.glob(os.path.join(d, "client-*.txt")))
    servers = sorted(glob.glob(os.path.join(d, "server-*.txt")))
    sv = [(p, load(p)) for p in servers]
    for cp in clients:
        c = load(cp)
        if not c:
            continue
        # The server connection whose events overlap this client's in time.
        best = None
        for sp, s in sv:
            if not s or s[0][0] > c[-1][0] or s[-1][0] < c[0][0]:
                continue
            rows = steps(c, s)
            if rows and (best is None or len(rows) > len(best[1])):
                best = (sp, rows)
        if not best:
            print(f"{os.path.basename(cp)}: no server connection lines up")
            continue
        sp, rows = best
        add_lanes(rows, lanes)
        rows = rows[len(rows) // 8:]  # past the warm-up
        keys = []
        for r in rows:
            keys += [k for k in r[1] if k not in keys]
        period = [b[0] - a[0] for a, b in zip(rows, rows[1:])]
        print(f"{os.path.basename(cp)} <-> {os.path.basename(sp)}: {len(rows)} steps, "
              f"period median {statistics.median(period) / 1e3:.1f} us")
        for k in keys:
            v = [r[1][k] for r in rows if k in r[1]]
            q = statistics.quantiles(v, n=10)
            print(f"  {k:28s} {statistics.median(v):8.1f}  (p10 {q[0]:.1f}, p90 {q[-1]:.1f})")


if __name__ == "__main__":
    main()
