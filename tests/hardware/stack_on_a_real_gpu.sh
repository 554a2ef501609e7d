#!/usr/bin/env bash
# The whole stack on this machine's real GPU: NATS, Redis, the three scheduling services and an executor on the
# nvml backend, which needs GPU 0 not in MIG mode (it runs whole-GPU jobs; nothing changes the mode). Checks:
#   1. a bf16 matrix-product job runs on the whole GPU through the stack, seeing that GPU alone;
#   2. the executor is killed (SIGKILL) under a running GPU job; its successor adopts the job, which finishes
#      with its own status and is not run again;
#   3. a running GPU job is cancelled: its process ends and frees the GPU;
#   4. run as root, a GPU job submitted with --run-as nobody runs as that user and its status is still recorded;
#   5. the executor restarted with the GPU time-sliced in two (MIGSCHED_EXECUTOR_GPUS ...:shared=2): two shares run
#      on it at once, each seeing the GPU.
# Needs nats-server and redis-server (on PATH, or NATS_BIN / REDIS_BIN), python3 with migsched importable and
# torch for the workloads. Exits non-zero when a check fails. BACKEND=sim tries the steps on a simulated node.
set -uo pipefail
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
R=$(mktemp -d)
export MIGSCHED_NATS_URL=nats://127.0.0.1:14222 MIGSCHED_REDIS_URL=redis://127.0.0.1:16379/0 MIGSCHED_NAMESPACE=hw
"${NATS_BIN:-nats-server}" -js -a 127.0.0.1 -p 14222 -sd "$R/js" > "$R/nats.log" 2>&1 &
"${REDIS_BIN:-redis-server}" --port 16379 --bind 127.0.0.1 --save '' --appendonly no > "$R/redis.log" 2>&1 &
sleep 1.5
for s in balancer registry migration_planner; do MIGSCHED_METRICS_PORT=0 $PY -m services.$s > "$R/$s.log" 2>&1 & done
start_executor() {
  MIGSCHED_METRICS_PORT=0 MIGSCHED_EXECUTOR_BACKEND=${BACKEND:-nvml} MIGSCHED_EXECUTOR_SIM_WORKLOADS=process \
  MIGSCHED_NODE=gpu0 MIGSCHED_EXECUTOR_GPUS=${GPUS:-H200-141GB:1:whole} MIGSCHED_EXECUTOR_STATE_DIR="$R/exec" \
  MIGSCHED_EXECUTOR_STOP_GRACE_S=3 $PY -m services.executor >> "$R/executor.log" 2>&1 &
  echo $! > "$R/executor.pid"
}
start_executor
sleep 6
M="$PY -m migsched"
FAILED=0
expect() {  # expect JOB PATTERN: the job's description matches
  local text; text=$($M describe "$1" 2>&1); echo "$text"
  grep -qE "$2" <<< "$text" || { echo "CHECK FAILED: $1 does not match /$2/"; FAILED=1; }
}
settle() {  # settle JOB: until the job has ended (60 s at most)
  for _ in $(seq 60); do $M describe "$1" 2>/dev/null | grep -qE "^job $1: (finished|failed|cancelled)" && return; sleep 1; done
}
ON_GPU="import time
try:
    import torch; x = torch.ones(1 << 20, device='cuda')
except ImportError: pass  # BACKEND=sim without torch"
$M status
echo "== 1. a training step on the whole GPU"
$M submit --gpus 1 --job-id train1 --duration 30 --wait 150 -- python3 -c "
import os, time, torch
n = torch.cuda.device_count(); a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)
for _ in range(3): a @ a
torch.cuda.synchronize(); t = time.time()
for _ in range(50): a @ a
torch.cuda.synchronize(); dt = time.time() - t
print('devices', n, torch.cuda.get_device_name(0), 'TFLOP/s', round(50 * 2 * 8192**3 / dt / 1e12))"
expect train1 "finished: completed: devices 1 "
echo "== 2. the executor dies under a running job and its successor adopts it"
$M submit --gpus 1 --job-id long1 --duration 25 -- python3 -c "$ON_GPU
time.sleep(20); print('long1 done')"
sleep 8
kill -9 "$(cat "$R/executor.pid")"; sleep 1; start_executor
settle long1
expect long1 "running -> finished: completed: long1 done"
$M describe long1 | grep -q "attempts 0" || { echo "CHECK FAILED: long1 ran again"; FAILED=1; }
echo "== 3. a running job cancelled: its process is stopped"
$M submit --gpus 1 --job-id long2 --duration 300 -- python3 -c "$ON_GPU
time.sleep(300)"
sleep 10; $M cancel long2; settle long2
expect long2 "running -> cancelled: stopped"
if command -v nvidia-smi > /dev/null && [ "${BACKEND:-nvml}" = nvml ]; then
  left=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)
  [ "$left" = 0 ] || { echo "CHECK FAILED: $left process(es) still on the GPU"; FAILED=1; }
fi
if [ "$(id -u)" = 0 ] && id nobody > /dev/null 2>&1; then
  echo "== 4. a job run as another user"
  $M submit --gpus 1 --job-id asuser --duration 30 --run-as nobody --wait 120 -- python3 -c "$ON_GPU
import os; print('uid', os.getuid())"
  expect asuser "running -> finished: completed: uid $(id -u nobody)"
fi
echo "== 5. the GPU time-sliced into two shares"
kill "$(cat "$R/executor.pid")"; sleep 2; GPUS=H200-141GB:1:shared=2 start_executor; sleep 6
for j in s1 s2; do
  $M submit --shared --job-id $j --duration 20 -- python3 -c "$ON_GPU
t = time.time()
while time.time() - t < 8:
    try: y = (x * 2).sum().item()
    except NameError: time.sleep(0.1)
print('$j done')" > /dev/null
done
settle s1; settle s2
expect s1 "running -> finished: completed: s1 done"
expect s2 "running -> finished: completed: s2 done"
$PY - <<'PY' || FAILED=1
import json, subprocess, sys
def span(job):
    out = subprocess.check_output([sys.executable, "-m", "migsched", "describe", "--json", job])
    steps = json.loads(out)["history"]
    return (min(e["at"] for e in steps if e["to"] == "running"),
            max(e["at"] for e in steps if e["to"] in ("finished", "failed")))
(a0, a1), (b0, b1) = span("s1"), span("s2")
print(f"the shares ran together for {min(a1, b1) - max(a0, b0):.1f} s")
sys.exit(0 if max(a0, b0) < min(a1, b1) else "CHECK FAILED: the two shares did not run at once")
PY
$M check --executors 1 || FAILED=1
kill $(jobs -p) 2>/dev/null; sleep 1
[ -n "${OUT:-}" ] && tar czf "$OUT/stack-logs.tgz" -C "$R" --exclude js --exclude exec . 2>/dev/null
rm -rf "$R"
[ $FAILED = 0 ] && echo "ALL CHECKS PASSED"
exit $FAILED
