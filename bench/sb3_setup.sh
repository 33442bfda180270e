#!/usr/bin/env bash
# The Python environment of bench/sb3_compare.py's SB3 worker: build-sb3, a
# venv over Debian's Python with its system packages (torch 1.13, numpy,
# pandas, matplotlib from Debian; installed when run as root) and
# Stable-Baselines3 2.3.2, sb3-contrib 2.3.0, Gymnasium 0.29.1 and popgym 1.0.7
# (bench/popgym.py) from PyPI.
# Those are the last releases that accept Debian's torch 1.13 (later ones
# need torch >= 2.3); --no-deps keeps pip from replacing Debian's torch and
# numpy with PyPI's (a 5 GiB CUDA build of torch, a numpy 2 that Debian's
# matplotlib cannot load).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../tests/setup.sh"
segtape_install_debs python3-venv python3-torch python3-numpy python3-pandas python3-matplotlib
venv="$SEGTAPE_ROOT/build-sb3"
[[ -x "$venv/bin/python" ]] || /usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install -q --no-deps "stable-baselines3==2.3.2" "sb3-contrib==2.3.0" "gymnasium==0.29.1" \
  "cloudpickle==3.1.3" "farama-notifications==0.0.6" "popgym==1.0.7"
"$venv/bin/python" -c "import sb3_contrib, stable_baselines3, torch; print('build-sb3: sb3-contrib', sb3_contrib.__version__, \
'stable-baselines3', stable_baselines3.__version__, 'torch', torch.__version__)"
