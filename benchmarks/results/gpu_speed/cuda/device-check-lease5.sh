#!/bin/bash
# lease 5, call 3: at the stop's last commit, the build, the CUDA-marked test, generate with an answer memory against HF greedy, gpu_probe A
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
git log --oneline -1 2>/dev/null || true
t0=$(date +%s); python3 setup.py build_ext --inplace -j 16 > $OUT/build.log 2>&1; echo "build rc=$? in $(( $(date +%s) - t0 )) s"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 90 python3 -m pytest -q -p no:cacheprovider -m cuda tests/torch_adapter/test_attention_backends.py 2>&1 | tail -2
t0=$(date +%s); timeout 90 python3 .lkgpu1/mem_check.py 2>&1 | tail -9; echo "mem_check in $(( $(date +%s) - t0 )) s"
t0=$(date +%s); LK_DIR=$PWD timeout 120 python3 .lkgpu1/gpu_probe.py A > $OUT/probe_a.log 2>&1; echo "probe A rc=$? in $(( $(date +%s) - t0 )) s"; tail -15 $OUT/probe_a.log
