#!/usr/bin/env bash
# Harbor verifier: run ./count_lines.sh on each fixture; reward.json holds the fraction of cases right.
# The empty file is a gate, not a case: the broken script already prints 0 for it, and a reward
# must not be had for leaving the script as it is. A script that fails it scores 0.
set -u
out="${HARBOR_VERIFIER_DIR:-/logs/verifier}"
tests="${HARBOR_TESTS_DIR:-/tests}"
mkdir -p "$out"
pass=0
total=0
if [ "$(bash ./count_lines.sh "$tests/fixtures/empty.txt" 2>/dev/null | tr -d '[:space:]')" != "0" ]; then
  echo "empty.txt: want 0" >&2
  printf '{"reward": 0, "cases_passed": 0, "cases_total": 3}\n' > "$out/reward.json"
  exit 0
fi
for case in three.txt:3 unterminated.txt:1 blank-lines.txt:4; do
  file="${case%%:*}"
  want="${case##*:}"
  total=$((total + 1))
  got="$(bash ./count_lines.sh "$tests/fixtures/$file" 2>/dev/null | tr -d '[:space:]')"
  if [ "$got" = "$want" ]; then
    pass=$((pass + 1))
  else
    echo "$file: want $want, got '$got'" >&2
  fi
done
reward=$(awk -v p="$pass" -v t="$total" 'BEGIN { printf "%.4f", p / t }')
printf '{"reward": %s, "cases_passed": %d, "cases_total": %d}\n' "$reward" "$pass" "$total" > "$out/reward.json"
