#!/bin/sh
# ZeRO-3 trains a model that DDP cannot, under the same per-rank memory budget (see
# memory_budget.cpp). usage: memory_budget.sh CPPRUN BINARY [BUDGET_MB]
set -u
cpprun=$1 binary=$2 budget=${3:-400}
zero3=$("$cpprun" --standalone --nproc_per_node=4 "$binary" --mode zero3 --budget-mb "$budget" 2>&1)
status=$?
echo "$zero3" | grep -E "fits|out of memory|error"
if [ $status -ne 0 ] || ! echo "$zero3" | grep -q "fits: zero3"; then
  echo "$zero3" | tail -20
  echo "FAIL: ZeRO-3 did not train within ${budget} MB per rank"
  exit 1
fi
ddp=$("$cpprun" --standalone --nproc_per_node=4 "$binary" --mode ddp --budget-mb "$budget" 2>&1)
status=$?
echo "$ddp" | grep -E "fits|out of memory|error" | head -4
if [ $status -eq 0 ]; then
  echo "FAIL: DDP fit in ${budget} MB too, so the budget proves nothing"
  exit 1
fi
if ! echo "$ddp" | grep -q "out of memory"; then
  echo "$ddp" | tail -20
  echo "FAIL: DDP failed, but not for lack of memory"
  exit 1
fi
echo PASS
