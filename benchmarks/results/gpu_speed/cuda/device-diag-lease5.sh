#!/bin/bash
t0=$(date +%s); python3 setup.py build_ext --inplace -j 16 > $OUT/build.log 2>&1; echo "build rc=$? in $(( $(date +%s) - t0 )) s"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 100 python3 .lkgpu1/diag.py 2>&1 | tail -12
