#!/usr/bin/env bash
# Issue 18's hardware step: field values beside their dedicated calls, idle and under load (field_probe.py).
#   BOARD=h200 bash bench/device/probe_fields.sh      (on a lent machine, .whl carried; see capture_real_gpu.sh)
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
B=${BOARD:-h200}
python3 bench/device/field_probe.py --rounds 3 --out $OUT/$B-fields-idle.json
timeout 60 python3 bench/device/gpu_load.py --seconds 25 --out /tmp/load.json > /tmp/load.log 2>&1 &
sleep 12
python3 bench/device/field_probe.py --rounds 5 --out $OUT/$B-fields-load.json
wait
nvidia-smi --query-gpu=name,driver_version,power.draw,power.limit --format=csv
ls -la $OUT
