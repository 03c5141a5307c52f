#!/bin/bash
# call 2 (first lease): join the GGUF, then each part in its own process with a timeout; JSONs and one log to $OUT
cat /root/part.aa .lkgpu2/part.ab > /root/smollm2.gguf && md5sum /root/smollm2.gguf
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
B=benchmarks/gpu_speed.py; M=/tmp/md; mkdir -p $M
part() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout $limit python3 $B --device cuda --out $M/$name "$@" >> $OUT/run.log 2>&1; local rc=$?
  echo "$name rc=$rc in $(( $(date +%s) - t0 )) s" | tee -a $OUT/run.log; cp $M/$name.json $OUT/ 2>/dev/null; }
part acceptance 200 --gguf /root/smollm2.gguf --parts acceptance --decoders hf-pld lk lk+4gram lk+heads --groups 4 --budget-s 125
part compiled 130 --gguf /root/smollm2.gguf --parts acceptance --decoders hf-static-compile lk --prompts-per-domain 3 --groups 2 --budget-s 1
part costs-small 80 --parts costs --shapes smollm2-135m llama-3.2-1b
part costs-8b 70 --parts costs --shapes llama-3.1-8b
part rescore 35 --parts rescore --rescore-iters 200
grep -h -A12 '^| decoder' $M/*.md | head -60
