#!/usr/bin/env bash
# On the GPU machine after bundle2/run.sh: TPC-H SF10 Q21 warm with EXPLAIN ANALYZE,
# and the composite (date, string) EXCEPT ALL on the GPU and on setfusion's CPU backend.
B=${B:-bundle2}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
D=$HOME/.cache/setfusion/tpch/sf10
T="--table supplier=$D/supplier --table lineitem=$D/lineitem --table orders=$D/orders --table nation=$D/nation"
Q="$(cat sql-tests/tpch/q21.sql)"
echo "== q21 warm, EXPLAIN ANALYZE (second run in the process)"
$B/setfusion $T -c "$Q" -c "EXPLAIN ANALYZE $Q" 2>&1 | grep -E "MarkJoin|HashJoinExec|Declined" | sed -E 's/ +/ /g' | cut -c1-900
E="SELECT count(*) FROM (SELECT l_shipdate, l_shipmode FROM lineitem WHERE l_quantity < 10 EXCEPT ALL SELECT l_commitdate, l_shipmode FROM lineitem WHERE l_quantity > 40)"
for s in "SET setfusion.min_rows = 0" "SET setfusion.strategy = 'cpu'"; do
  echo "== except_all_dates_modes: $s (run 2 of 2 timed)"
  $B/setfusion $T -c "$s" -c "$E" -c "EXPLAIN ANALYZE $E" 2>&1 | grep -E "SetOpExec|elapsed|count" | sed -E 's/ +/ /g' | cut -c1-700
done
