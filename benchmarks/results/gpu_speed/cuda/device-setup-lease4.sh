#!/bin/bash
# (stop 46) run from a temporary branch whose tree held only latticekit, benchmarks (scripts and gpu_speed/prompts.json) and tests/torch_adapter, so that tree + half the GGUF fit the 64 MiB a call carries; the CUDA-marked test then ran in its own call (tests/torch_adapter/test_attention_backends.py: 1 passed)
# call 1: the GGUF's first half to /root, the gguf package, the build, the CUDA-marked test
cp .lkgpu1/part.aa /root/part.aa && ls -la /root/part.aa
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .lkgpu1/gguf-0.19.0-py3-none-any.whl || exit 3
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
lscpu | grep -E 'Model name|^CPU\(s\)'
python3 -c "import torch, transformers, numpy, Cython; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'transformers', transformers.__version__, 'numpy', numpy.__version__, 'cython', Cython.__version__)"
t0=$(date +%s)
python3 setup.py build_ext --inplace -j 16 > $OUT/build.log 2>&1; echo "build rc=$? in $(( $(date +%s) - t0 )) s"; tail -2 $OUT/build.log
export PYTHONPATH=$PWD:/tmp/site
timeout 150 python3 -m pytest -q -p no:cacheprovider -m cuda tests/torch_adapter 2>&1 | tail -4
python3 -c "import gguf, latticekit; print('gguf', gguf.__file__, 'latticekit', latticekit.__file__)"
