#!/bin/bash
# call 2 (second lease): join the GGUF; HF greedy with a static cache compiled (CUDA graphs) against latticekit
cat /root/part.aa .lkgpu2/part.ab > /root/smollm2.gguf && md5sum /root/smollm2.gguf
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
B=benchmarks/gpu_speed.py; M=/tmp/md; mkdir -p $M
part() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout $limit python3 $B --device cuda --out $M/$name "$@" >> $OUT/run.log 2>&1; local rc=$?
  echo "$name rc=$rc in $(( $(date +%s) - t0 )) s" | tee -a $OUT/run.log; cp $M/$name.json $OUT/ 2>/dev/null; }
part compiled 250 --gguf /root/smollm2.gguf --parts acceptance --decoders hf-static-compile lk lk+4gram lk+heads --groups 3 --budget-s 150
sed -n '/^| decoder/,$p' $M/compiled.md | head -40
