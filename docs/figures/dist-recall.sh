#!/usr/bin/env bash
# The acceptance run of docs/distributed.md: `mpirun -np 2 segtape train` on
# recall (the default configuration: lag 8, tbptt:32, 24,000 steps) with 16
# streams per rank, against one process with both ranks' streams
# (--batch 32 --env-shards 2) and one process with one rank's (--batch 16).
# Writes the section between the dist-recall markers of docs/distributed.md
# from the runs' metrics.json.
# Usage: bash docs/figures/dist-recall.sh [path/to/segtape]   (default build-main/agent/segtape)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
S=${1:-$root/build-main/agent/segtape}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mpirun -np 2 "$S" train --env recall --batch 16 --out "$out/two-ranks" > "$out/two-ranks.log"
"$S" train --env recall --batch 32 --env-shards 2 --out "$out/one-process" > "$out/one-process.log"
"$S" train --env recall --batch 16 --out "$out/half" > "$out/half.log"
python3 - "$out" "$root/docs/distributed.md" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[2].rsplit('/docs/', 1)[0] + '/bench')
from markdown_section import replace_section
out, doc = sys.argv[1:3]
rows = []
for name, what in [("two-ranks", "`mpirun -np 2 segtape train --env recall --batch 16`"),
                   ("one-process", "`segtape train --env recall --batch 32 --env-shards 2`"),
                   ("half", "`segtape train --env recall --batch 16` (one rank's streams alone)")]:
    j = json.load(open(f"{out}/{name}/metrics.json"))
    rows.append(f"| {what} | {100 * j['eval_accuracy']:.2f} % | {100 * j['final_accuracy']:.2f} % | {j['final_loss']:.4f} | {j['wall_seconds']:.1f} s |")
text = "\n".join(["Measured by `bash docs/figures/dist-recall.sh` (recall, lag 8, tbptt:32, 24,000 steps, seed 1; greedy "
                  "evaluation of 500 fresh steps on rank 0's batch; one run each; the wall times are not a benchmark):", "",
                  "| run | eval accuracy | train accuracy (last row) | final loss | wall time |", "|---|---|---|---|---|"] + rows)
replace_section(doc, "dist-recall", text)
PY
