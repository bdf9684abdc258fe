#!/usr/bin/env bash
# Planner search time: the whole search for the 1T-parameter model of
# Narayanan et al. 2021 on 3072 A100-80GB (BenchmarkSearch1T), and one
# candidate's evaluation (BenchmarkEvaluate), each measured COUNT times
# (default 5); prints every run and the median ns/op of each benchmark.
set -euo pipefail
count=${1:-5}
cd "$(dirname "$0")/../.."
out=$(go test -run '^$' -bench 'Search1T|Evaluate' -count "$count" ./planner/)
echo "$out"
for b in BenchmarkSearch1T BenchmarkEvaluate; do
	echo "$out" | awk -v b="$b" '$1 ~ "^"b"(-[0-9]+)?$" { print $3 }' | sort -n |
		awk -v b="$b" '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%s median: %.0f ns/op over %d runs\n", b, m, NR }'
done
