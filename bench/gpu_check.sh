#!/usr/bin/env bash
# GPU validation (issue 3), in one go, on a machine with an NVIDIA GPU and a CUDA PyTorch:
#   1. nvidia-smi and `stallscope doctor`: every GPU, link and capability, present or why not;
#   2. `stallscope nvml-bench`: what each NVML call the GPU source makes costs there;
#   3. the example training on CUDA (1 GPU, nccl), plain and under `stallscope run`: the
#      summary's `gpu:` line puts PCIe bytes received per iteration next to the batch's bytes,
#      and the two iteration times give the overhead on a GPU job.
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
step() { echo "== $*" | tee -a "$out/steps.txt"; }

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

# 224×224 images, batch 64: 38.5 MB of float32 per batch, copied from pinned memory.
train=("$python" examples/pytorch_ddp/train.py --backend nccl --iters 80 --batch 64
    --image-size 224 --images 2048 --width 32 --workers 4)
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
    tee -a "$out/steps.txt"
