#!/bin/bash
# jemalloc with one arena, low-memory settings, whole quickstart, idle, at main's HEAD.
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0
B=/work/main/.venv/bin/agentscope-rft
LOW="--set trainer.memory_budget_gib=2.8 --set trainer.optimizer_state_dtype=bfloat16 --set run.allocator=jemalloc"
one() {  # name conf
  name=$1; conf=$2
  rm -rf /work/exp/$name
  echo "== $name $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg) MALLOC_CONF=$conf"
  (cd /work/main && MALLOC_CONF=$conf /usr/bin/time -v -o /work/exp/$name.time $B train --config examples/quickstart/config.yaml \
     --set run.dir=/work/exp/$name $LOW > /work/exp/$name.log 2>&1)
  echo "$name rc=$? $(grep -E 'Maximum resident|Elapsed|Minor' /work/exp/$name.time | tr -s ' ' | tr '\n' ' ')"
}
one t3_narenas1 narenas:1
one t3_narenas1_keep narenas:1,dirty_decay_ms:-1,muzzy_decay_ms:-1
date -u +%T
