#!/bin/bash
# bench2.sh BIN RUNS: big.parquet (k = 0..20M, v = 3k; 200 row groups of 100,000 rows, k ascending),
# small.parquet (100 keys, 7,000,000..7,000,099). Fresh process per run, wall time in ms.
BIN=$1; RUNS=${2:-3}; cd "${DIR:-/tmp/citizen}"
Q="SELECT count(*), sum(v) FROM big WHERE k IN (SELECT b FROM small)"
for cfg in "plain:SET setfusion.enabled = false" "filter:SET setfusion.strategy = 'cpu'" "nofilter:SET setfusion.strategy = 'cpu'; SET datafusion.optimizer.enable_join_dynamic_filter_pushdown = false"; do
  name=${cfg%%:*}; set=${cfg#*:}; ts=()
  for r in $(seq $RUNS); do
    s=$(date +%s%N); out=$($BIN -t big=big.parquet -t small=small.parquet --format csv -c "$set" -c "$Q"); e=$(date +%s%N)
    ts+=($(( (e - s) / 1000000 )))
  done
  echo "$name: $(printf '%s\n' "${ts[@]}" | sort -n | tr '\n' ' ') answer=$(echo "$out" | tail -1)"
done
$BIN -t big=big.parquet -t small=small.parquet -c "SET setfusion.strategy = 'cpu'" -c "EXPLAIN ANALYZE $Q" | grep -oE "SemiJoinExec: [^,]*, on=[^,]*, backend=[^,]*|dynamic_filter=[a-z]*|row_groups_pruned_statistics=[^,]*" | head -6
