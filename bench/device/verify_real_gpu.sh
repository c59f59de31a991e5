#!/usr/bin/env bash
# The second hardware step (after capture_real_gpu.sh): what issues 18 to 20 left unmeasured on a real GPU.
# - NVML calls and time per sweep of today's sampler (the simulator says 11.5 calls), idle and under load;
# - a capture of today's calls under load (fields 185/190/165 in the batch), for the replay fixtures;
# - the SDK's allocator view against torch's own figures (bench/device/allocator_check.py);
# - doctor as an unprivileged user: does Hopper's GPM honour NVreg_RestrictProfilingToAdminUsers?
# Everything lands in $OUT (at most 8 files come back). Run on the device machine from the repository root
# with .whl carried:   bash bench/device/verify_real_gpu.sh
set -u
export PYTHONUNBUFFERED=1
LOG=$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
cp -r gpumon /tmp/site/  # readable by the unprivileged user below, whatever the checkout's folder allows
export PYTHONPATH=/tmp/site
B=${BOARD:-h200}
{
  echo "== $(date -u +%FT%TZ) $(uname -r)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,power.draw,clocks.sm,persistence_mode,mig.mode.current --format=csv
  cat /proc/driver/nvidia/params 2>/dev/null | grep -i -E "RmProfilingAdminOnly|ModifyDeviceFiles"
  ls -la /dev/nvidia* 2>&1 | head -8
  echo "== bench_nvml idle"; timeout 40 python3 bench/bench_nvml.py --seconds 8 --json $OUT/nvml-idle.json 2>&1
  echo "== doctor as nobody (uid 65534, no capabilities)"
  (cd /tmp && timeout 60 python3 -c "import os; os.setgroups([]); os.setgid(65534); os.setuid(65534); os.execvp('python3', ['python3', '-m', 'gpumon', 'doctor', '--json'])" > $OUT/doctor-nobody.json 2>&1; echo "exit $?")
  echo "== doctor as root"; timeout 60 python3 -m gpumon doctor 2>&1 | head -60
} >> $LOG 2>&1
setsid python3 -m gpumon serve --listen 127.0.0.1:9478 --log-level info > /tmp/serve.log 2>&1 &
SERVE=$!
sleep 5
{ echo "== allocator_check"; timeout 120 python3 bench/device/allocator_check.py --out $OUT/alloc.json 2>&1; } >> $LOG
timeout 90 python3 bench/device/gpu_load.py --seconds 40 --out /tmp/load.json > /tmp/load.log 2>&1 &
LOAD=$!
sleep 12
{
  echo "== doctor --capture under load"
  timeout 60 python3 -m gpumon doctor --capture $OUT/$B-load-2.json 2>&1 | tail -25
  echo "== bench_nvml under load (serve beside)"; timeout 40 python3 bench/bench_nvml.py --seconds 10 --json $OUT/nvml-load.json 2>&1
} >> $LOG 2>&1
python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:9478/metrics', timeout=10).read().decode(), end='')" > $OUT/metrics-load.txt 2>>$LOG
wait $LOAD
{ echo "== gpu_load"; cat /tmp/load.log; } >> $LOG
kill $SERVE; sleep 1
{ echo "== serve log"; tail -40 /tmp/serve.log; } >> $LOG
ls -la $OUT
