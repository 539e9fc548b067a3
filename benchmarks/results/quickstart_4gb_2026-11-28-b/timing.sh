#!/bin/bash
# The quickstart's README command 1 training run, idle, one after the other:
# the filing day's commit (5d94b44) as shipped, HEAD with the low-memory settings, HEAD as shipped.
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0
B=/work/main/.venv/bin/agentscope-rft
LOW="--set engine.compact_allocator=true --set trainer.memory_budget_gib=2.8 --set trainer.optimizer_state_dtype=bfloat16"
one() {  # name tree extra...
  name=$1; tree=$2; shift 2
  rm -rf /work/exp/$name
  echo "== $name $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  (cd $tree && PYTHONPATH=$tree /usr/bin/time -v $B train --config examples/quickstart/config.yaml \
     --set run.dir=/work/exp/$name "$@" > /work/exp/$name.log 2>&1)
  echo "$name rc=$? $(grep -E 'Maximum resident|Elapsed' /work/exp/$name.log | tr -s ' ' | tr '\n' ' ')"
}
one t_old /work/old
one t_low /work/q $LOW
one t_shipped /work/q
for name in t_low t_shipped; do
  (cd /work/q && PYTHONPATH=/work/q $B explore --config /work/exp/$name/config.yaml --split test --checkpoint best > /work/exp/$name.test.log 2>&1)
  echo "$name test rc=$? $(tail -3 /work/exp/$name.test.log | tr '\n' ' ' | cut -c1-300)"
done
date -u +%T
