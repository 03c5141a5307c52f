#!/bin/bash
# call 2 (lease 5): join the GGUF; issue 34 item 5 on the H200: lk+heads against lk+4gram and lk (no heads), 5 groups
cat /root/part.aa .lkgpu2/part.ab > /root/smollm2.gguf && md5sum /root/smollm2.gguf
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E 'Model name|^CPU\(s\)'
B=benchmarks/gpu_speed.py; M=/tmp/md; mkdir -p $M
part() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout $limit python3 $B --device cuda --out $M/$name "$@" >> $OUT/run.log 2>&1; local rc=$?
  echo "$name rc=$rc in $(( $(date +%s) - t0 )) s" | tee -a $OUT/run.log; cp $M/$name.json $M/$name.md $OUT/ 2>/dev/null; }
part item5 400 --gguf /root/smollm2.gguf --parts acceptance --decoders lk lk+4gram lk+heads --groups 6 --budget-s 250
sed -n '/^| decoder/,$p' $M/item5.md | head -50
