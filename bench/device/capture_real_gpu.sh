#!/usr/bin/env bash
# One device session's hardware step (issue 17): capture what a real GPU's NVML answers, idle and under a
# training-shaped load that reports through the SDK, with a real `gpumon serve` scraped meanwhile and
# bench_nvml.py timing real NVML. Everything lands in $OUT (at most 8 files come back).
#
#   run on the device machine from the repository root, with .whl carried (README of the device tool):
#   bash bench/device/capture_real_gpu.sh                         # h200-*.json, daemon and SDK load too
#   BOARD=h100 CAPTURE_ONLY=1 bash bench/device/capture_real_gpu.sh   # captures and bench_nvml only
set -u
export PYTHONUNBUFFERED=1
LOG=$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
Q=name,driver_version,pci.device_id,memory.total,memory.used,power.draw,power.limit,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,temperature.gpu,temperature.memory,persistence_mode,mig.mode.current,utilization.gpu,clocks_event_reasons.active
if [ -z "${ONLY_SERVE:-}" ]; then {
  echo "== $(date -u +%FT%TZ) nvidia-smi idle"; nvidia-smi --query-gpu=$Q --format=csv
  python3 -c "import pynvml,importlib.metadata as m; print('nvidia-ml-py', m.version('nvidia-ml-py'))"
  echo "== doctor --capture idle"
  timeout 90 python3 -m gpumon doctor --capture $OUT/${BOARD:-h200}-idle.json 2>&1
  echo "== snapshot"
  timeout 60 python3 -m gpumon snapshot --json > $OUT/snapshot-idle.json 2>>$LOG
} >> $LOG 2>&1; fi
echo "== serve (real NVML)" >> $LOG
if [ -n "${CAPTURE_ONLY:-}" ]; then  # the captures and the NVML bench, no daemon (a shorter lease)
  timeout 120 python3 bench/device/gpu_load.py --seconds 45 --out /tmp/load.json > /tmp/load.log 2>&1 &
  sleep 20
  { echo "== nvidia-smi under load"; nvidia-smi --query-gpu=$Q --format=csv
    timeout 90 python3 -m gpumon doctor --capture $OUT/${BOARD:-h200}-load.json 2>&1
    nvidia-smi --query-gpu=$Q --format=csv,noheader
    echo "== bench_nvml (under load)"; timeout 60 python3 bench/bench_nvml.py --seconds 10 2>&1
  } >> $LOG 2>&1
  wait; cat /tmp/load.log >> $LOG; ls -la $OUT; exit 0
fi
setsid python3 -m gpumon serve --listen 127.0.0.1:9478 --log-level info > /tmp/serve.log 2>&1 &
SERVE=$!
sleep 6
python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:9478/metrics', timeout=10).read().decode(), end='')" > $OUT/metrics-idle.txt
timeout 120 python3 bench/device/gpu_load.py --seconds ${LOAD_SECONDS:-70} --out /tmp/load.json > /tmp/load.log 2>&1 &
LOAD=$!
sleep 25
if [ -z "${ONLY_SERVE:-}" ]; then {
  echo "== $(date -u +%FT%TZ) nvidia-smi under load"; nvidia-smi --query-gpu=$Q --format=csv
  echo "== doctor --capture load"
  timeout 90 python3 -m gpumon doctor --capture $OUT/${BOARD:-h200}-load.json 2>&1
  nvidia-smi --query-gpu=$Q --format=csv,noheader
} >> $LOG 2>&1; fi
sleep 10
python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:9478/metrics', timeout=10).read().decode(), end='')" > $OUT/metrics-load.txt
python3 - > $OUT/api-load.json <<'PY'
import json, urllib.request
get = lambda p: json.load(urllib.request.urlopen("http://127.0.0.1:9478" + p, timeout=10))
print(json.dumps({"jobs": get("/v1/jobs"), "gpus": get("/v1/gpus")}, indent=1))
PY
if [ -z "${ONLY_SERVE:-}" ]; then
  echo "== bench_nvml (under load, serve running beside)" >> $LOG
  timeout 60 python3 bench/bench_nvml.py --seconds 15 >> $LOG 2>&1
fi
wait $LOAD
{ echo "== gpu_load"; cat /tmp/load.log; } >> $LOG
sleep 8
python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:9478/v1/jobs', timeout=10).read().decode())" >> $LOG; echo >> $LOG
kill $SERVE; sleep 2
{ echo "== serve log"; cat /tmp/serve.log; } >> $LOG
ls -la $OUT
