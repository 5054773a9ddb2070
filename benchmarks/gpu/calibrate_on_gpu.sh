#!/usr/bin/env bash
# The CUDA paths of the calibration collectors on one GPU (what docs/calibration.md records).
# Run from the repository root with OUT set to a results folder; python3 must have a CUDA torch.
# Wheels for packages missing there can sit in .whl/ (pip download --python-version 3.12 ...).
set -u
OUT=${OUT:-gpu-calibration}
mkdir -p "$OUT"
if [ -d .whl ]; then python3 -m pip install -q --no-index --find-links .whl pydantic simpy plotly; fi
python3 -m pip install -q --no-deps --no-build-isolation . || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())" | tee -a "$OUT/gpu.txt"
for model in factory gpu; do
  /usr/bin/time -f "%e s" simddp calibrate collect compute --model calibration/models/small_transformer.py:$model \
      --device cuda --optimizer adam --out "$OUT/compute_$model.json" 2>&1 | tail -25
done
# NCCL between two ranks needs two GPUs: on one GPU the collectors say so.
simddp calibrate collect comm --nproc-per-node 2 --backend nccl --out "$OUT/comm.json" 2>&1 | tail -3
simddp calibrate collect ddp --nproc-per-node 2 --model calibration/models/small_transformer.py:gpu \
    --optimizer adam --out "$OUT/ddp.json" 2>&1 | tail -3
ls -la "$OUT"
