#!/usr/bin/env bash
# Builds bench/dist_bench.cpp (Release) and measures data-parallel training
# on this machine, then regenerates
#   docs/figures/dist-bench.json   every run's figures
#   docs/benchmarks.md             the section between the dist-bench markers
# For each (B, H): 5 rounds (SEGTAPE_DIST_ROUNDS), each running 1 rank and then 2 ranks (mpirun,
# one OpenBLAS thread per rank), interleaved; weak scaling (every rank has
# B streams), efficiency = t(1 rank) / t(2 ranks) per segment, median and
# range over the rounds. The 2-rank runs also time bare all-reduces (the
# link: shared memory here). Where network namespaces can be made (root),
# the same is measured between two namespaces over TCP (tests/dist_two_hosts.sh's
# set-up). The alpha-beta model's predictions use these measurements.
#
# Usage: bash docs/figures/dist-bench.sh [--rewrite]
#   --rewrite            no measuring: rewrite the section from the runs kept in dist-bench.json
#   SEGTAPE_BENCH_BUILD  build directory (default: build-bench)
#   SEGTAPE_JOBS         parallel build jobs (default: nproc)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${SEGTAPE_BENCH_BUILD:-$root/build-bench}
jobs=${SEGTAPE_JOBS:-$(nproc 2>/dev/null || echo 2)}
json=$root/docs/figures/dist-bench.json
doc=$root/docs/benchmarks.md
out=$(mktemp -d)
trap 'rm -rf "$out"; ip netns del stb-a 2>/dev/null || true; ip netns del stb-b 2>/dev/null || true' EXIT
if [[ "${1:-}" == "--rewrite" ]]; then
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); open(sys.argv[2],'w').write(''.join(json.dumps(r)+'\n' for r in j['runs']))" \
    "$json" "$out/runs.jsonl"
  m=$(python3 -c "import json,sys; m=json.load(open(sys.argv[1]))['machine']; print(m['cpu']); print(m['cores']); print(m['load_before']); print(m['load_after'])" "$json")
  { read -r cpu; read -r cores; read -r load_before; read -r load_after; } <<< "$m"
  tcp=$(python3 -c "import json,sys; print(int(json.load(open(sys.argv[1]))['tcp_two_hosts']))" "$json")
else
cores=$(nproc --all 2>/dev/null || echo '?')  # (before OMP_NUM_THREADS=1: nproc honours it)
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSEGTAPE_WITH_CUDA=OFF -DSEGTAPE_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j "$jobs" --target dist_bench
B=$build/bench/dist_bench
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n1)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

rounds=${SEGTAPE_DIST_ROUNDS:-5}
# (B, H, timed segments): the issue's two sizes, and H = 166 (100,396
# parameters: the model's 100k-parameter GRU)
for cfg in "32 512 20" "64 1024 8" "32 166 40"; do
  read -r b h n <<< "$cfg"
  for round in $(seq "$rounds"); do
    echo "B=$b H=$h round $round" >&2
    mpirun -np 1 "$B" --batch "$b" --hidden "$h" --segments "$n" >> "$out/runs.jsonl"
    mpirun -np 2 --oversubscribe "$B" --batch "$b" --hidden "$h" --segments "$n" --link >> "$out/runs.jsonl"
  done
done

# Two "hosts" over TCP (network namespaces and a veth pair), where possible.
tcp=0
if ip netns add stb-a 2>/dev/null && ip netns add stb-b; then
  ip link add stb-va type veth peer name stb-vb
  ip link set stb-va netns stb-a && ip link set stb-vb netns stb-b
  ip -n stb-a addr add 10.98.0.1/24 dev stb-va && ip -n stb-b addr add 10.98.0.2/24 dev stb-vb
  for n in a b; do ip -n stb-$n link set lo up; ip -n stb-$n link set stb-v$n up; done
  cat > "$out/rsh" <<'EOF'
#!/bin/sh
host=$1; shift
case "$host" in 10.98.0.1) ns=stb-a ;; 10.98.0.2) ns=stb-b ;; *) exit 1 ;; esac
exec ip netns exec "$ns" sh -c "$*"
EOF
  chmod +x "$out/rsh"
  printf '10.98.0.1 slots=1\n10.98.0.2 slots=1\n' > "$out/hosts"
  for round in 1 2 3; do
    ip netns exec stb-a mpirun -np 2 --hostfile "$out/hosts" --mca plm_rsh_agent "$out/rsh" --mca btl tcp,self \
      --mca btl_tcp_if_include 10.98.0.0/24 --mca oob_tcp_if_include 10.98.0.0/24 \
      "$B" --batch 32 --hidden 166 --segments 40 --link | sed 's/^{/{"transport":"tcp-veth",/' >> "$out/runs.jsonl"
  done
  tcp=1
fi
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
fi

python3 - "$out/runs.jsonl" "$json" "$doc" "$cpu" "$load_before" "$load_after" "$cores" "$tcp" <<'PY'
import json, statistics, sys
sys.path.insert(0, sys.argv[3].rsplit('/docs/', 1)[0] + '/bench')
from markdown_section import replace_section

runs_path, json_path, doc_path, cpu, load_before, load_after, cores, tcp = sys.argv[1:9]
runs = [json.loads(l) for l in open(runs_path) if l.strip()]
shm = [r for r in runs if r.get("transport") is None]
tcp_runs = [r for r in runs if r.get("transport") == "tcp-veth"]
med = statistics.median

def rng(v, fmt):
    return f"{fmt(med(v))} [{fmt(min(v))}–{fmt(max(v))}]"

configs = []
for b, h in [(32, 512), (64, 1024), (32, 166)]:
    one = [r for r in shm if r["batch"] == b and r["hidden"] == h and r["ranks"] == 1]
    two = [r for r in shm if r["batch"] == b and r["hidden"] == h and r["ranks"] == 2]
    eff = [o["segment_seconds"]["median"] / t["segment_seconds"]["median"] for o, t in zip(one, two)]
    configs.append({"batch": b, "hidden": h, "parameters": one[0]["parameters"],
                    "t1": [o["segment_seconds"]["median"] for o in one],
                    "t2": [t["segment_seconds"]["median"] for t in two],
                    "efficiency": eff,
                    "allreduce_s": [t["allreduce_seconds_per_update"] for t in two],
                    "allreduce_last_s": [t["allreduce_seconds_per_update_last_rank"] for t in two],
                    "allreduce_bytes": two[0]["allreduce_bytes_per_update"],
                    "calls": two[0]["allreduce_calls_per_update"]})

def link_of(rs):
    small = med([r["link"]["allreduce_8B_seconds"] for r in rs])
    big = med([r["link"]["allreduce_4MiB_seconds"] for r in rs])
    nbytes = rs[0]["link"]["big_bytes"]
    # two ranks, ring all-reduce: T(M) = 2 alpha + M beta
    return {"alpha": small / 2, "beta": (big - small) / (nbytes - 8), "t8": small, "t4MiB": big, "bytes": nbytes}

links = {"shared memory (one host)": link_of([r for r in shm if r["ranks"] == 2])}
if tcp_runs:
    links["TCP between two network namespaces (veth)"] = link_of(tcp_runs)

def allreduce_time(n, m, l):  # ring all-reduce of m bytes over n ranks
    return 2 * (n - 1) * l["alpha"] + 2 * (n - 1) / n * m * l["beta"]

model_cfg = configs[2]
tc = med(model_cfg["t1"])
m_bytes = model_cfg["parameters"] * 4
preds = {name: {n: tc / (tc + allreduce_time(n, m_bytes, l)) for n in (2, 8, 64, 512)} for name, l in links.items()}
out = {"machine": {"cpu": cpu, "cores": int(cores), "load_before": load_before, "load_after": load_after},
       "configs": configs, "links": links, "model": {"segment_compute_seconds": tc, "bytes": m_bytes, "efficiency": preds},
       "tcp_two_hosts": bool(tcp_runs), "tcp_runs": tcp_runs, "runs": runs}
json.dump(out, open(json_path, "w"), indent=1)

ms = lambda s: f"{1e3 * s:.1f}"
pct = lambda x: f"{100 * x:.1f} %"
lines = [f"Measured by `bash docs/figures/dist-bench.sh` on {cpu}, {cores} cores (load average {load_before} before, "
         f"{load_after} after); every figure in docs/figures/dist-bench.json. One OpenBLAS thread per rank; the "
         "trainer's recall workload with tbptt:32 (32 steps per segment, one update each); weak scaling (each rank has "
         f"B streams of its own); {len(configs[0]['t1'])} rounds, each a 1-rank run then a 2-rank run; median [min–max] over the rounds. "
         "All-reduce per update is the time inside GradientAverager::average(): on the rank that waited longest it "
         "includes waiting for the other rank to end its backward; on the rank that arrived last it is the transfer.",
         "",
         "| B, H | parameters | 1 rank: per segment | 2 ranks: per segment | efficiency t1/t2 | all-reduce per update: waiting rank | all-reduce per update: last rank | bytes per update (buckets) |",
         "|---|---|---|---|---|---|---|---|"]
for c in configs:
    lines.append(f"| {c['batch']}, {c['hidden']} | {c['parameters']:,} | {rng(c['t1'], ms)} ms | {rng(c['t2'], ms)} ms | "
                 f"{rng(c['efficiency'], pct)} | {rng(c['allreduce_s'], ms)} ms | {rng(c['allreduce_last_s'], ms)} ms | {c['allreduce_bytes'] / 2**20:.2f} MiB ({c['calls']:.0f}) |")
lines += ["", "The link, measured in the same runs (bare in-place all-reduces between the two ranks, median):", "",
          "| link | 8 bytes | 4 MiB | α (per message) | β⁻¹ (bandwidth) | 4 MiB of gradients would take |", "|---|---|---|---|---|---|"]
for name, l in links.items():
    lines.append(f"| {name} | {1e6 * l['t8']:.1f} µs | {ms(l['t4MiB'])} ms | {1e6 * l['alpha']:.1f} µs | "
                 f"{1 / l['beta'] / 1e9:.2f} GB/s | {ms(2 * l['alpha'] + 4 * 2**20 * l['beta'])} ms |")
lines += ["", f"The model's predicted efficiency for the 100k-parameter GRU (H = 166, B = 32 per rank, {model_cfg['parameters']:,} "
          f"parameters, {m_bytes / 2**10:.0f} KiB of gradients per update, {ms(tc)} ms of compute per segment measured above):", "",
          "| link | 2 ranks | 8 ranks | 64 ranks | 512 ranks |", "|---|---|---|---|---|"]
for name, p in preds.items():
    lines.append(f"| {name} | " + " | ".join(pct(p[n]) for n in (2, 8, 64, 512)) + " |")
lines += [""]
for c in configs[:2]:
    e = med(c["efficiency"])
    lines.append(f"Target ≥ 85 % at ({c['batch']}, {c['hidden']}): median {pct(e)}, " + ("**met**." if e >= 0.85 else "**not met**."))
big = configs[0]
lines += ["", f"At ({big['batch']}, {big['hidden']}) the all-reduce of {big['allreduce_bytes'] / 2**20:.2f} MiB took "
          f"{ms(med(big['allreduce_last_s']))} ms on the rank that arrived last, against "
          f"{ms(links['shared memory (one host)']['t4MiB'])} ms for a bare all-reduce of 4 MiB."]
m2 = med(model_cfg["efficiency"])
lines += ["", f"Measured at 2 ranks for this model: {pct(m2)} (the model's 2-rank prediction on shared memory: "
          f"{pct(preds['shared memory (one host)'][2])})."]
if not tcp_runs:
    lines += ["", "(No TCP figures: network namespaces could not be made where this ran.)"]
replace_section(doc_path, "dist-bench", "\n".join(lines))
PY
