#!/bin/sh
# Under one per-rank memory budget (see memory_budget.cpp), at 4 ranks:
#   ddp (default): ZeRO-3 trains a model that DDP cannot;
#   deferred:      ZeRO-3 builds with cpprun::deferred_init and trains a model whose fp32
#                  parameters alone exceed the budget; building it eagerly fails.
# usage: memory_budget.sh CPPRUN BINARY [ddp|deferred] [BUDGET_MB]
set -u
cpprun=$1 binary=$2 case=${3:-ddp}
if [ "$case" = deferred ]; then
  budget=${4:-220}
  model="--layers 64 --width 1024 --optimizer sgd"
  fits_args="--mode zero3 --init deferred" fails_args="--mode zero3 --init eager"
else
  budget=${4:-400}
  model=""
  fits_args="--mode zero3" fails_args="--mode ddp"
fi
# shellcheck disable=SC2086
fits=$("$cpprun" --standalone --nproc_per_node=4 "$binary" $fits_args $model --budget-mb "$budget" 2>&1)
status=$?
echo "$fits" | grep -E "model:|fits|out of memory|error"
if [ $status -ne 0 ] || ! echo "$fits" | grep -q "fits: zero3"; then
  echo "$fits" | tail -20
  echo "FAIL: $fits_args did not train within ${budget} MB per rank"
  exit 1
fi
if [ "$case" = deferred ]; then
  param_mb=$(echo "$fits" | sed -n 's/.*model: fp32 parameters \([0-9]*\) MB.*/\1/p' | head -1)
  if [ -z "$param_mb" ] || [ "$param_mb" -le "$budget" ]; then
    echo "FAIL: the model's fp32 parameters (${param_mb:-?} MB) do not exceed the ${budget} MB budget"
    exit 1
  fi
fi
# shellcheck disable=SC2086
fails=$("$cpprun" --standalone --nproc_per_node=4 "$binary" $fails_args $model --budget-mb "$budget" 2>&1)
status=$?
echo "$fails" | grep -E "fits|out of memory|error" | head -4
if [ $status -eq 0 ]; then
  echo "FAIL: $fails_args fit in ${budget} MB too, so the budget proves nothing"
  exit 1
fi
if ! echo "$fails" | grep -q "out of memory"; then
  echo "$fails" | tail -20
  echo "FAIL: $fails_args failed, but not for lack of memory"
  exit 1
fi
echo PASS
