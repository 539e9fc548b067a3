#!/bin/bash
# README command 1's training run, idle, one after the other at one commit (this fresh clone):
# glibc as shipped (A) and tcmalloc + budget 2.8 GiB + bf16 AdamW moments (B), in the order
# A B B A; each run followed by its greedy test.
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0
cd /work/clone3
B=.venv/bin/agentscope-rft
OUT=/work/exp
one() {  # name extra...
  name=$1; shift
  rm -rf $OUT/$name
  echo "== $name $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  /usr/bin/time -v -o $OUT/$name.time $B train --config examples/quickstart/config.yaml \
     --set run.dir=$OUT/$name "$@" > $OUT/$name.log 2>&1
  echo "$name rc=$? $(grep -E 'Maximum resident|Elapsed|Minor' $OUT/$name.time | tr -s ' ' | tr '\n' ' ')"
  $B explore --config $OUT/$name/config.yaml --split test --checkpoint best > $OUT/$name.test.log 2>&1
  echo "$name test rc=$? $(grep -E 'reward/mean|success_rate' $OUT/$name.test.log | tr -s ' ' | tr '\n' ' ')"
}
LOW="--set run.allocator=tcmalloc --set trainer.memory_budget_gib=2.8 --set trainer.optimizer_state_dtype=bfloat16"
one a1_glibc --set run.allocator=glibc
one b1_tcmalloc $LOW
one b2_tcmalloc $LOW
one a2_glibc --set run.allocator=glibc
date -u +%T
