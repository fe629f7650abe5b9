#!/usr/bin/env bash
# GPU validation (issue 3), in one go, on a machine with an NVIDIA GPU and a CUDA PyTorch:
#   1. nvidia-smi and `stallscope doctor`: every GPU, link and capability, present or why not;
#   2. `stallscope nvml-bench`: what each NVML call the GPU source makes costs there;
#   3. the example training on CUDA (1 GPU, DDP over nccl, world size 1), plain and under
#      `stallscope run`: the summary's `gpu:` line puts PCIe bytes received per iteration next
#      to the batch's bytes, and the two iteration times give the overhead on a GPU job;
#   4. the same training joined to a node agent that ships to a collector on loopback: the
#      GPU's readings must reach the job summary (`gpu: rank 0 on gpu-node GPU 0: …`).
#
# At most 8 files come back from the device tool, so this writes 8: nvidia-smi.txt,
# doctor.txt, nvml-bench.txt, plain.txt, run.txt, summary.json, cuda.stallscope, job.txt.
# BACKEND (default nccl) and ITERS (default 80) may be set to dry-run it elsewhere, e.g. on
# the scripted library: STALLSCOPE_NVML_LIB=target/release/libstallscope_fake_nvml.so
# BACKEND=gloo ITERS=6 bash bench/gpu_check.sh
#
#   bash bench/gpu_check.sh [STALLSCOPE_BINARY] [OUT_DIR]
#
# The binary defaults to target/release/stallscope; OUT_DIR to $OUT (the device tool's
# folder that comes back), else /tmp/stallscope-gpu-check. A GPU machine without a Rust
# toolchain takes a binary built elsewhere (it needs only glibc):
#   cargo build --release --locked -p stallscope && mkdir -p .device && cp target/release/stallscope .device/
#   then run `bash bench/gpu_check.sh .device/stallscope` there, carrying `.device`.
# Every step is bounded in time and a failing step does not stop the next ones.
set -u
cd "$(dirname "$0")/.."
bin=${1:-target/release/stallscope}
out=${2:-${OUT:-/tmp/stallscope-gpu-check}}
mkdir -p "$out"
python=${PYTHON:-python3}
step() { echo "== $*"; }

step "machine"
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv; } >"$out/nvidia-smi.txt" 2>&1
"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' >>"$out/nvidia-smi.txt" 2>&1
cat "$out/nvidia-smi.txt"

step "stallscope doctor"
timeout 120 "$bin" doctor >"$out/doctor.txt" 2>&1
echo "exit $?" >>"$out/doctor.txt"
cat "$out/doctor.txt"

step "stallscope nvml-bench"
timeout 180 "$bin" nvml-bench --rounds 500 >"$out/nvml-bench.txt" 2>&1
echo "exit $?" >>"$out/nvml-bench.txt"
cat "$out/nvml-bench.txt"

# 224×224 images, batch 64: 38.5 MB of float32 per batch, copied from pinned memory. One
# rank of a DDP job (world size 1), so that nccl, the comm hook and its CUDA events run.
iters=${ITERS:-80}
train=(env RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511
    "$python" examples/pytorch_ddp/train.py --backend "${BACKEND:-nccl}" --iters "$iters"
    --batch 64 --image-size 224 --images 2048 --width 32 --workers 4)
step "example on CUDA without stallscope"
timeout 240 "${train[@]}" >"$out/plain.txt" 2>&1
echo "exit $?" >>"$out/plain.txt"
tail -3 "$out/plain.txt"

step "example on CUDA under stallscope run"
timeout 300 "$bin" run -q -o "$out/cuda.stallscope" --summary-json "$out/summary.json" -- \
    "${train[@]}" >"$out/run.txt" 2>&1
echo "exit $?" >>"$out/run.txt"
grep -v '^iter ' "$out/run.txt"
# Profiles over 16 MiB do not come back from the device tool; the summary does.
if [ -f "$out/cuda.stallscope" ] && [ "$(stat -c %s "$out/cuda.stallscope")" -gt 16000000 ]; then
    rm -f "$out/cuda.stallscope"
fi
median() { grep -o 'time_ms [0-9.]*' "$1" | awk 'NR > 5 {print $2}' | sort -n |
    awk '{a[NR] = $1} END {if (NR) print a[int((NR + 1) / 2)]; else print "none"}'; }
echo "median iteration ms: plain $(median "$out/plain.txt"), under stallscope $(median "$out/run.txt")" |
    tee -a "$out/run.txt"

step "the same training through a node agent and a collector on loopback"
job=$(mktemp -d)
echo token >"$job/token"
"$bin" collector --listen 127.0.0.1:17571 --token-file "$job/token" --out "$job/job.stallscope" \
    --summary-json "$job/job.json" >"$job/collector.log" 2>&1 &
collector=$!
sleep 1
"$bin" agent --collector 127.0.0.1:17571 --token-file "$job/token" --socket "$job/agent.sock" \
    --node gpu-node >"$job/agent.log" 2>&1 &
agent=$!
sleep 2
STALLSCOPE_SOCKET="$job/agent.sock" timeout 240 "$bin" run -q -- "${train[@]}" --iters $((iters / 2)) \
    >"$job/rank.log" 2>&1
echo "rank exit $?" >>"$job/rank.log"
sleep 3
# Each ends on SIGTERM (the collector writes the summary then); waits are bounded.
for pid in $agent $collector; do
    kill -TERM "$pid" 2>/dev/null
    timeout 30 tail --pid="$pid" -f /dev/null
    kill -KILL "$pid" 2>/dev/null
done
for f in agent.log rank.log collector.log job.json; do
    echo "--- $f"
    grep -v '^iter ' "$job/$f"
done >"$out/job.txt" 2>&1
grep '^gpu: \|^--- \|refused\|exit' "$out/job.txt"
rm -rf "$job"
