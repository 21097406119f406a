#!/usr/bin/env bash
# The GPU path of `mhqa train`, for a machine with a CUDA GPU (nothing here needs a download):
#  1. the trainer tests (-v: a line per test as it ends, so a run stopped at a time limit still names its
#     failures), whose tiny random policy (training/tiny.py) `load_model` now puts on the GPU in bfloat16
#     (tests that build the tiny model themselves, or pin use_cpu, still run that part on the CPU), and the
#     GPU-only tests of tests/test_gpu_path.py (`python -P`: the installed package, not the source folder beside it);
#  2. one short step of each method on the GPU (scripts/gpu_check.py): MyGO, MAPGRPO (plan and analysis
#     roles), Omne (stage 1 GRPO, stage 2 SFT), checking the policy's device and dtype and that no rollout
#     failed on the device;
#  3. with two GPUs or more, the same steps under accelerate launch (configs/accelerate/multi_gpu.yaml), two
#     processes.
# Each step prints its seconds, seconds per step and peak GPU memory; MHQA_GPU_CHECK_MODEL=<model folder> runs
# the steps once more with that policy. Exits 2 with a message on a machine without a GPU. Extra arguments go
# to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ] && [ -f .venv/bin/activate ]; then
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
gpus=$(python - <<'EOF' 2>/dev/null || echo 0
import torch
print(torch.cuda.device_count() if torch.cuda.is_available() else 0)
EOF
)
if [ "$gpus" -lt 1 ]; then
  echo "gpu_check: no CUDA GPU on this machine (torch.cuda.is_available() is False, or torch is missing);" \
       "run it where one is. On the CPU the usual tests cover the trainers: pytest tests/test_gpu_path.py ..." >&2
  exit 2
fi
python -c 'import torch; print("gpu_check:", torch.cuda.device_count(), "GPU(s):", torch.cuda.get_device_name(0),
"bf16" if torch.cuda.is_bf16_supported() else "no bf16 (the policy stays float32)")'
out=$(mktemp -d "${TMPDIR:-/tmp}/mhqa-gpu-check.XXXXXX")
status=0

echo "== 1. trainer tests on the GPU"
python -P -m pytest -v -p no:cacheprovider tests/test_gpu_path.py tests/test_mygo.py tests/test_mapgrpo.py \
  tests/test_omne_training.py tests/test_weighted_sft.py tests/test_lora_gguf.py "$@" || status=1

echo "== 2. one short step of each method on one GPU (seconds per step, peak GPU memory)"
python scripts/gpu_check.py "$out/one" || status=1
if [ -n "${MHQA_GPU_CHECK_MODEL:-}" ]; then  # a real model folder: its memory and step time
  echo "== 2b. the same steps with the policy $MHQA_GPU_CHECK_MODEL"
  python scripts/gpu_check.py "$out/model" --model "$MHQA_GPU_CHECK_MODEL" || status=1
fi

if [ "$gpus" -ge 2 ]; then
  echo "== 3. the same steps on two GPUs (accelerate launch)"
  accelerate launch --config_file configs/accelerate/multi_gpu.yaml --num_processes 2 \
    scripts/gpu_check.py "$out/two" || status=1
else
  echo "== 3. skipped: one GPU (the multi-GPU launch needs two)"
fi

if [ "$status" -eq 0 ]; then
  echo "gpu_check: all passed (runs in $out)"
else
  echo "gpu_check: FAILED (see above; runs in $out)" >&2
fi
exit "$status"
