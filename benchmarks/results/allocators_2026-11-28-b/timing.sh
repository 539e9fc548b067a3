#!/bin/bash
# README command 1's training run, idle, one after the other, at one commit (a worktree in
# /work/q): glibc as shipped, then tcmalloc with the low-memory settings (budget 2.8 GiB and
# 3.2 GiB, bf16 AdamW moments). Each run is followed by its greedy test.
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0
B=/work/main/.venv/bin/agentscope-rft
OUT=/work/exp
mkdir -p $OUT
one() {  # name extra...
  name=$1; shift
  rm -rf $OUT/$name
  echo "== $name $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  (cd /work/q && PYTHONPATH=/work/q /usr/bin/time -v -o $OUT/$name.time $B train --config examples/quickstart/config.yaml \
     --set run.dir=$OUT/$name "$@" > $OUT/$name.log 2>&1)
  echo "$name rc=$? $(grep -E 'Maximum resident|Elapsed|Minor' $OUT/$name.time | tr -s ' ' | tr '\n' ' ')"
  (cd /work/q && PYTHONPATH=/work/q $B explore --config $OUT/$name/config.yaml --split test --checkpoint best > $OUT/$name.test.log 2>&1)
  echo "$name test rc=$? $(grep -E 'reward/mean|success_rate' $OUT/$name.test.log | tr -s ' ' | tr '\n' ' ')"
}
BF16="--set trainer.optimizer_state_dtype=bfloat16"
for v in ${VARIANTS:-glibc tc28 tc32}; do
  case $v in
    glibc) one t_glibc --set run.allocator=glibc ;;
    tc28) one t_tcmalloc_28 --set run.allocator=tcmalloc --set trainer.memory_budget_gib=2.8 $BF16 ;;
    tc32) one t_tcmalloc_32 --set run.allocator=tcmalloc --set trainer.memory_budget_gib=3.2 $BF16 ;;
    tc) one t_tcmalloc --set run.allocator=tcmalloc ;;
    je32) one t_jemalloc_32 --set run.allocator=jemalloc --set trainer.memory_budget_gib=3.2 $BF16 ;;
  esac
done
date -u +%T
