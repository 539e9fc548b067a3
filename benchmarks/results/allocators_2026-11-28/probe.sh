#!/usr/bin/env bash
# 2-step quickstart under different allocators; peaks and page faults (load-independent).
cd /work/main
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0
LOW="--set trainer.memory_budget_gib=2.8 --set trainer.optimizer_state_dtype=bfloat16"
run() { # name, env..., args
  name=$1; shift; envs=$1; shift
  rm -rf runs/probe_$name
  env $envs nice -n 19 /usr/bin/time -v -o /tmp/probe_$name.time .venv/bin/agentscope-rft train --config examples/quickstart/config.yaml --set run.steps=2 --set run.eval_every=0 --set run.name=probe_$name "$@" > /tmp/probe_$name.log 2>&1
  echo "$name rc $? $(grep -E 'Maximum resident|Minor|Elapsed' /tmp/probe_$name.time | tr -s ' ' | tr '\n' ';')"
}
for v in ${VARIANTS:-compact jemalloc}; do
  case $v in
    compact) run compact "X=1" $LOW --set engine.compact_allocator=true ;;
    jemalloc) run jemalloc "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2" $LOW ;;
    jemalloc_shipped) run jemalloc_shipped "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2" ;;
    tcmalloc) run tcmalloc "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4" $LOW ;;
    shipped) run shipped "X=1" ;;
  esac
done
