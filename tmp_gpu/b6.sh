#!/bin/bash
cat /root/fa4/fa4_part_aa .gpu/fa4b/fa4_part_ab > /tmp/libs.tar.xz
pip install -q --no-index --no-deps --target /tmp/site .gpu/fa4b/*.whl > /dev/null 2>&1
mkdir -p /tmp/libs && tar xJf /tmp/libs.tar.xz -C /tmp/libs && cp -rn /tmp/libs/* /tmp/site/ 2>/dev/null
export PYTHONPATH=src:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages
G="GLUON=1,TMA=1,Q_IN_REGS=0,num_warps=4,BLOCK_N=128,PERSISTENT=1"
mkdir -p /tmp/st16 /tmp/st4
timeout 280 python3 scripts/gpu/stall_sass.py /tmp/st16 --shape 1,32,16384,64 --causal --metrics default --runs "fs=$G,BLOCK_M=192,num_stages=3,PINGPONG=1,LAZY_RESCALE=1,EARLY_Q=1,K_EARLY=1;fa4=fa4" > $OUT/stalls_d64_c_16k.txt 2>&1
timeout 250 python3 scripts/gpu/stall_sass.py /tmp/st4 --shape 4,32,4096,64 --causal --metrics default --runs "fs=$G,BLOCK_M=128,num_stages=3,EARLY_Q=1;fa4=fa4" > $OUT/stalls_d64_c_4k.txt 2>&1
cd /tmp && tar czf $OUT/stall_csv.tgz st16 st4
grep -v "^    " $OUT/stalls_d64_c_16k.txt $OUT/stalls_d64_c_4k.txt | grep -v "Warn\|exe_args"
