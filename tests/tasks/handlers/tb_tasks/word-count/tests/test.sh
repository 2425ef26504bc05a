#!/bin/bash
# terminal-bench style: the verdict goes to /logs/verifier/reward.txt.
mkdir -p /logs/verifier
if [ "$(cat /app/count.txt 2>/dev/null)" = "9" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
