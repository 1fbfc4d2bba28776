#!/bin/sh
# A rank that dies (SIGKILL before a context-parallel call) must end the whole
# job with an error within a bounded time, not leave the other ranks waiting.
#   dead_rank.sh MPIEXEC TEST_PROGRAM
mpiexec=$1
program=$2
start=$(date +%s)
MHLA_TEST_KILL_RANK=1 timeout 120 "$mpiexec" -np 3 --oversubscribe "$program" \
  --gtest_filter=Faults.ARankThatDiesEndsTheJob >/dev/null 2>&1
status=$?
elapsed=$(( $(date +%s) - start ))
if [ "$status" -eq 0 ]; then
  echo "FAIL: the job succeeded although rank 1 died"; exit 1
fi
if [ "$status" -eq 124 ]; then
  echo "FAIL: the job was still running after 120 s (the other ranks hung)"; exit 1
fi
echo "the job ended with exit status $status after ${elapsed} s"
