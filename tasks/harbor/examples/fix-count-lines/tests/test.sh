#!/usr/bin/env bash
# Harbor verifier: run ./count_lines.sh on each fixture; the reward is 1 when every case is right, else 0
# (the untouched script already gets one case right: a fraction would pay an agent that does nothing).
set -u
out="${HARBOR_VERIFIER_DIR:-/logs/verifier}"
tests="${HARBOR_TESTS_DIR:-/tests}"
mkdir -p "$out"
pass=0
total=0
for case in three.txt:3 unterminated.txt:1 empty.txt:0 blank-lines.txt:4; do
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
reward=0
[ "$pass" -eq "$total" ] && reward=1
printf '{"reward": %s, "cases_passed": %d, "cases_total": %d}\n' "$reward" "$pass" "$total" > "$out/reward.json"
