#!/bin/bash
# README command 1's training run, idle, one after the other, at the same commit:
# glibc as shipped until today (run.allocator=glibc), the low-memory settings under jemalloc
# (run.allocator auto), and the shipped config under jemalloc.
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0
B=/work/main/.venv/bin/agentscope-rft
LOW="--set trainer.memory_budget_gib=2.8 --set trainer.optimizer_state_dtype=bfloat16"
one() {  # name extra...
  name=$1; shift
  rm -rf /work/exp/$name
  echo "== $name $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  (cd /work/q && PYTHONPATH=/work/q /usr/bin/time -v -o /work/exp/$name.time $B train --config examples/quickstart/config.yaml \
     --set run.dir=/work/exp/$name "$@" > /work/exp/$name.log 2>&1)
  echo "$name rc=$? $(grep -E 'Maximum resident|Elapsed|Minor' /work/exp/$name.time | tr -s ' ' | tr '\n' ' ')"
  (cd /work/q && PYTHONPATH=/work/q $B explore --config /work/exp/$name/config.yaml --split test --checkpoint best > /work/exp/$name.test.log 2>&1)
  echo "$name test rc=$? $(grep -E 'reward/mean|success_rate' /work/exp/$name.test.log | tr -s ' ' | tr '\n' ' ')"
}
for v in ${VARIANTS:-glibc low_jemalloc jemalloc}; do
  case $v in
    glibc) one t_glibc --set run.allocator=glibc ;;
    low_jemalloc) one t_low_jemalloc $LOW ;;
    jemalloc) one t_jemalloc ;;
    low_compact) one t_low_compact $LOW --set run.allocator=glibc-compact ;;
  esac
done
date -u +%T
