#!/usr/bin/env bash
# Data-parallel GPT-2 124M bf16 (8x1024 per GPU) on the GPU machine's GPUs, one call:
# `helios train` on one GPU, then `--nproc N` (and with --zero), twice each with one settled
# cache directory, beside PyTorch DDP (bench/torch_ddp.py, eager and torch.compile) on 1 and
# N GPUs in the same run, and NCCL's all-reduce of the gradients alone
# (bench/nccl_allreduce.py). Prints tokens/s per run, then each run's medians from its log.csv
# (bench/dp_summary.py: step, the phases' GPU time with the gradient exchange, host gap).
# Checkpoints are deleted as each run ends (GPT-2's are ~1.5 GB).
# Usage (repo root, on the device machine): bench/gpu_data_parallel.sh OUTDIR [N]
set -uo pipefail
out=${1:?output dir}; n=${2:-2}
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null; done; ldconfig
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=${nccl:+$nccl:}${LD_LIBRARY_PATH:-}
B=${HELIOS_BIN:-target/release/helios}
$B info >/dev/null 2>&1 || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export HELIOS_VALIDATION=0 HELIOS_CACHE_DIR=/tmp/helios-dp-cache PYTHONUNBUFFERED=1
A="--preset gpt2 --precision bf16 --batch 8 --seq 1024 --eval-every 0 --sample-tokens 0"
runs=()
run() { # name, args...
  local name=$1; shift
  timeout 120 $B train $A "$@" --out "$out/$name" > "$out/$name.txt" 2>&1
  echo "$name ($*): rc=$? $(grep -E '^trained' "$out/$name.txt")"
  rm -rf "${out:?}/$name/checkpoint"
  runs+=("$name")
}
# Tunes the kernels on real work. GPT-2's output-head classes take ~800 steps; the progress
# carries over between runs (session 50), so two runs settle every class.
run settle --steps 600 > /dev/null
run settle2 --steps 300 > /dev/null
for pass in a b; do
  run one-$pass --steps 150
  run nproc$n-$pass --steps 150 --nproc "$n"
done
run nproc$n-zero --steps 150 --nproc "$n" --zero
python3 bench/dp_summary.py "$out" "${runs[@]:2}" | tee "$out/summary.txt"
(cd bench && timeout 120 python3 torch_ddp.py > "$out/torch.jsonl" 2> "$out/torch.err"
 timeout 200 python3 -m torch.distributed.run --nproc_per_node "$n" torch_ddp.py >> "$out/torch.jsonl" 2>> "$out/torch.err")
cat "$out/torch.jsonl"
# NCCL's all-reduce of the same gradients alone, with no Vulkan context: the exchange's floor.
timeout 60 python3 -m torch.distributed.run --nproc_per_node "$n" bench/nccl_allreduce.py \
  2>> "$out/torch.err" | tee "$out/nccl_allreduce.txt"
