#!/usr/bin/env python3
"""Sums an `ncu --csv --print-units base` report (gpu__time_duration.sum, dram__bytes_read.sum)
per kernel: launches, total and mean time, DRAM bytes read and the achieved read bandwidth."""
import collections
import csv
import sys


def main():
    rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
    if not rows:
        print("no ncu rows (see the .err file)")
        return
    head = rows[0]
    ki, mi, vi, ii = (head.index(k) for k in ("Kernel Name", "Metric Name", "Metric Value", "ID"))
    per = collections.defaultdict(dict)
    name = {}
    for r in rows[1:]:
        v = r[vi].replace(",", "")
        try:
            per[r[ii]][r[mi]] = float(v)
        except ValueError:
            continue
        n = r[ki].split("(")[0]
        name[r[ii]] = n.replace("ferry::cuda::", "").replace("(anonymous namespace)::", "")
    agg = collections.defaultdict(lambda: [0, 0.0, 0.0])
    total = 0.0
    for i, m in per.items():
        a = agg[name[i]]
        a[0] += 1
        a[1] += m.get("gpu__time_duration.sum", 0.0)
        a[2] += m.get("dram__bytes_read.sum", 0.0)
        total += m.get("gpu__time_duration.sum", 0.0)
    print("%d kernels, %.1f us of kernel time" % (len(per), total / 1e3))
    for k, (n, t, b) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print("%9.1f us %5.1f%% %5d x %8.2f us %7.0f GB/s  %s" %
              (t / 1e3, 100 * t / max(total, 1), n, t / n / 1e3, b / max(t, 1), k[:110]))


if __name__ == "__main__":
    main()
