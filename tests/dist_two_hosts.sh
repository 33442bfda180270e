#!/usr/bin/env bash
# Two "hosts" on one machine: network namespaces joined by a veth pair
# (10.99.0.1 and 10.99.0.2), Open MPI over TCP between the two addresses,
# launched from a hostfile as on two machines. mpirun's remote-shell agent
# (plm_rsh_agent, normally ssh) is a script that runs the command in the
# namespace of the address it is given. What crosses the network here is what
# crosses it between machines: the launch, the configuration check, the
# parameter broadcast, the gradient all-reduces and the checkpoint gather.
# Checks: the run ends like the same run on one host (bit-identical
# parameters: with two ranks the all-reduce's sum is the same either way),
# and rank 1 ran in the other namespace.
# Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2; exits 77 (ctest:
# skipped) where namespaces cannot be made, saying why.
# Usage: dist_two_hosts.sh path/to/segtape [mpiexec]
set -euo pipefail
S=$(realpath "$1")
MPI=${2:-mpirun}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
tag=st$$
A=$tag-a B=$tag-b
W=$(mktemp -d)
cleanup() {
  ip netns del "$A" 2>/dev/null || true
  ip netns del "$B" 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
if ! command -v ip > /dev/null || ! ip netns add "$A" 2> "$W/why"; then
  echo "SKIP: cannot make network namespaces here ($(cat "$W/why" 2>/dev/null || echo 'no ip command'))"
  exit 77
fi
ip netns add "$B"
ip link add "$tag-va" type veth peer name "$tag-vb"
ip link set "$tag-va" netns "$A"
ip link set "$tag-vb" netns "$B"
ip -n "$A" addr add 10.99.0.1/24 dev "$tag-va"
ip -n "$B" addr add 10.99.0.2/24 dev "$tag-vb"
for n in "$A" "$B"; do ip -n "$n" link set lo up; done
ip -n "$A" link set "$tag-va" up
ip -n "$B" link set "$tag-vb" up

cat > "$W/rsh" <<EOF
#!/bin/sh
# mpirun's "ssh": run the command in the namespace that holds the address
host=\$1; shift
case "\$host" in
  10.99.0.1) ns=$A ;;
  10.99.0.2) ns=$B ;;
  *) echo "rsh: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" sh -c "\$*"
EOF
chmod +x "$W/rsh"
printf '10.99.0.1 slots=1\n10.99.0.2 slots=1\n' > "$W/hostfile"
net=(--hostfile "$W/hostfile" --mca plm_rsh_agent "$W/rsh" --mca btl tcp,self
     --mca btl_tcp_if_include 10.99.0.0/24 --mca oob_tcp_if_include 10.99.0.0/24)
run=(--env recall --lag 4 --hidden 32 --embed 8 --history tbptt:8 --batch 8 --steps 400 --checkpoint-every 200)

# Where each rank runs: its namespace's address.
ip netns exec "$A" "$MPI" -np 2 "${net[@]}" sh -c 'echo "rank $OMPI_COMM_WORLD_RANK on $(ip -o -4 addr show | grep -o "10\.99\.0\.[0-9]*")"' > "$W/where" 2>&1 ||
  { cat "$W/where"; fail "mpirun across the namespaces failed"; }
grep -qx "rank 0 on 10.99.0.1" "$W/where" && grep -qx "rank 1 on 10.99.0.2" "$W/where" ||
  { cat "$W/where"; fail "the ranks did not run on the two hosts"; }

ip netns exec "$A" "$MPI" -np 2 "${net[@]}" "$S" train "${run[@]}" --out "$W/net" > "$W/net.log" 2>&1 ||
  { cat "$W/net.log"; fail "training across the two hosts failed"; }
"$MPI" -np 2 --oversubscribe "$S" train "${run[@]}" --out "$W/local" > "$W/local.log" 2>&1 ||
  { cat "$W/local.log"; fail "training on one host failed"; }
python3 - "$W/net/checkpoint.safetensors" "$W/local/checkpoint.safetensors" <<'EOF' || fail "the two-host run's parameters differ from the one-host run's"
import json, struct, sys
def params(path):
    b = open(path, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    h = json.loads(b[8:8 + n])
    return {k: b[8 + n + v['data_offsets'][0]:8 + n + v['data_offsets'][1]] for k, v in h.items() if k.startswith('policy.')}
a, b = params(sys.argv[1]), params(sys.argv[2])
sys.exit(0 if a and a == b else 1)
EOF
grep -q "data parallel: 2 ranks (mpi)" "$W/net.log" || fail "the two-host run does not say it ran on 2 ranks"
cat "$W/where"
echo "two hosts over TCP: parameters bit-identical to the one-host run; all passed"
