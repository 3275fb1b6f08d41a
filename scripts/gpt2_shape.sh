# GPT-2 124M's shape as train_gpt's flags, written once for the scripts that run it
# (scripts/bench_gpt.sh --gpt2, scripts/gpu_check.sh's gpt2 and compare stages): 12 layers, 768
# wide, 12 heads (gpt2_layers) and a block of 1024 tokens (gpt2_block). Sourced, not run.
# shellcheck disable=SC2034  # used by the scripts that source it
gpt2_layers=(--layers 12 --embed 768 --heads 12)
gpt2_block=1024
