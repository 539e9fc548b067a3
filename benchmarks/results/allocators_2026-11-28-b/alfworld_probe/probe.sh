#!/bin/bash
cd /work/main
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0
timeout 780 /usr/bin/time -v -o /work/exp/alf.time .venv/bin/agentscope-rft train --config examples/alfworld/config.yaml \
  --set run.dir=/work/exp/alf --set offline.warmup_steps=1 --set run.steps=2 --set run.eval_every=0 \
  --set trainer.micro_batch_tokens=4096 --set run.allocator=tcmalloc --set trainer.memory_budget_gib=5 \
  --set trainer.optimizer_state_dtype=bfloat16 > /work/exp/alf.log 2>&1
echo rc $? >> /work/exp/alf.time
