#!/usr/bin/env bash
# The device checks of one GPU session, in one call (the lent machine's time is short): the CUDA tests first, then
# the GPU throughput benchmark (raw vs ours vs Lightning) and the bf16 diagnosis. Results under $OUT (default ./gpu_out).
# Run from the repository root on the GPU machine: `bash benchmarks/gpu_checks.sh`.
set -u
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
PY=${PY:-python3}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/nvidia_smi.txt" 2>&1
$PY -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name(0))" \
  > "$OUT/env.txt" 2>&1
timeout 170 $PY -m pytest -q -p no:cacheprovider -p no:benchmark -o addopts="" --timeout 120 \
  tests/strategies/test_cuda.py tests/trainer/test_host_syncs.py tests/strategies/test_dp.py \
  tests/trainer/test_compile.py::test_dataparallel_refuses_a_compiled_module \
  tests/strategies/test_model_parallel.py::test_a_2x2_mesh_on_four_gpus_over_nccl_trains_like_one_gpu \
  tests/compat/test_trainer_flags.py --junitxml="$OUT/gpu_tests.xml" > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: exit $?"
timeout 60 $PY -m pytest -q -p no:cacheprovider -p no:benchmark -o addopts="" --timeout 50 tests/strategies/test_precision.py -k cuda \
  --junitxml="$OUT/gpu_precision.xml" >> "$OUT/gpu_tests.log" 2>&1
echo "gpu precision tests: exit $?"
timeout 290 $PY benchmarks/gpu.py --mlp-rounds 5 --out "$OUT/gpu.json" > "$OUT/gpu.log" 2>&1
echo "gpu.py: exit $?"
timeout 80 $PY benchmarks/gpu_diagnose.py --out "$OUT/gpu_diagnose.json" > "$OUT/gpu_diagnose.log" 2>&1
echo "gpu_diagnose.py: exit $?"
tail -n 3 "$OUT/gpu_tests.log"
