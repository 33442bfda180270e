"""One segment's kernels from ncu's CSV (bench/device_profile.sh): each
kernel's launches and microseconds per segment, largest first, and their sum.

    python3 bench/ncu_summary.py PROFILE.csv BxH SEGMENTS
"""
import collections
import csv
import sys

path, size, segments = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(path, encoding="utf-8") as f:
    rows = list(csv.reader(line for line in f if line.startswith('"')))
head, rows = rows[0], rows[1:]
name, unit, value = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
to_us = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}
total, count = collections.Counter(), collections.Counter()
for r in rows:
    if r[unit] not in to_us:
        sys.exit(f"{path}: unknown unit {r[unit]!r} for {r[name][:60]}")
    k = r[name][:90]
    total[k] += float(r[value].replace(",", "")) * to_us[r[unit]]
    count[k] += 1
print(f"## {size}: kernels of one segment (sequence mode; sum over {segments} segments / {segments})\n")
print("| kernel | launches | µs |")
print("|---|---|---|")
for k, us in total.most_common():
    print(f"| `{k}` | {count[k] / segments:.1f} | {us / segments:.1f} |")
print(f"| all | {sum(count.values()) / segments:.1f} | {sum(total.values()) / segments:.1f} |\n")
