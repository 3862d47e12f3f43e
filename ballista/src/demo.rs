//! The loopback cluster's data and queries, shared by
//! `setfusion bench cluster`, the cluster test and its timing: small
//! Parquet tables (several files each, so that scans have several
//! partitions), with duplicate keys and NULLs, and the queries that put each
//! distributed setfusion operator to work.

use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int64Array, ListArray, RecordBatch};
use datafusion::arrow::datatypes::Int64Type;
use datafusion::dataframe::DataFrameWriteOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use rand::{Rng, SeedableRng};

/// Files per table: each is a partition of the table's scan.
const FILES: usize = 3;

/// The queries, by name. Keys repeat (INTERSECT ALL keeps min(m, n) copies),
/// `t.k` holds NULLs (NOT IN reads a subquery without them: one NULL would
/// empty the answer).
pub const QUERIES: &[(&str, &str)] = &[
    ("intersect all", "SELECT k FROM r INTERSECT ALL SELECT k FROM t"),
    ("except all", "SELECT k FROM r EXCEPT ALL SELECT k FROM t"),
    ("intersect", "SELECT k, v % 3 AS g FROM r INTERSECT SELECT k, v % 3 FROM t"),
    ("in", "SELECT k, v FROM r WHERE k IN (SELECT k FROM t)"),
    ("not in", "SELECT k, v FROM r WHERE k NOT IN (SELECT k FROM t WHERE k < 500)"),
    ("in under or", "SELECT k, v, k IN (SELECT k FROM t) OR v > 990 AS m FROM r"),
    ("exists with a filter", "SELECT k, v FROM r WHERE EXISTS (SELECT 1 FROM t WHERE t.k = r.k AND t.v > r.v)"),
    ("not exists with a filter", "SELECT k, v FROM r WHERE NOT EXISTS (SELECT 1 FROM t WHERE t.k = r.k AND t.v > r.v)"),
    ("similarity join", "SELECT a.id, b.id FROM docs_a a JOIN docs_b b ON jaccard(a.elements, b.elements) >= 0.8"),
];

/// Write tables `r`, `t` (k, v BIGINT) of about `rows` rows each and
/// `docs_a`, `docs_b` (id BIGINT, elements BIGINT[]: tables of sets) of `rows / 10` sets under
/// `dir`, each as [`FILES`] Parquet files.
pub async fn write_tables(dir: &Path, rows: usize) -> Result<()> {
    let ctx = SessionContext::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let per_file = rows.div_ceil(FILES).max(1);
    for (name, nulls) in [("r", false), ("t", true)] {
        for f in 0..FILES {
            let k: Int64Array = (0..per_file)
                .map(|_| (!nulls || rng.random_range(0..50) > 0).then(|| rng.random_range(0..(rows as i64 / 4).max(1))))
                .collect();
            let v = Int64Array::from_iter_values((0..per_file).map(|_| rng.random_range(0..1000)));
            let batch = RecordBatch::try_from_iter([("k", Arc::new(k) as ArrayRef), ("v", Arc::new(v) as ArrayRef)])?;
            write_file(&ctx, batch, &dir.join(name).join(format!("part-{f}.parquet"))).await?;
        }
    }
    let sets = (rows / 10).max(1);
    let per_file = sets.div_ceil(FILES);
    for (name, seed) in [("docs_a", 0i64), ("docs_b", 1)] {
        for f in 0..FILES {
            let ids = Int64Array::from_iter_values(
                (0..per_file as i64).map(|i| seed * 1_000_000 + (f * per_file) as i64 + i),
            );
            // Sets drawn from a few templates with small changes, so that many pairs pass 0.8.
            let tags = ListArray::from_iter_primitive::<Int64Type, _, _>((0..per_file).map(|_| {
                let template = rng.random_range(0..(sets as i64 / 8).max(1)) * 100;
                let mut set: Vec<Option<i64>> = (0..10).map(|e| Some(template + e)).collect();
                if rng.random_bool(0.5) {
                    set[rng.random_range(0..10)] = Some(template + 50 + rng.random_range(0..5));
                }
                Some(set)
            }));
            let batch = RecordBatch::try_from_iter([
                ("id", Arc::new(ids) as ArrayRef),
                ("elements", Arc::new(tags) as ArrayRef),
            ])?;
            write_file(&ctx, batch, &dir.join(name).join(format!("part-{f}.parquet"))).await?;
        }
    }
    Ok(())
}

async fn write_file(ctx: &SessionContext, batch: RecordBatch, path: &Path) -> Result<()> {
    let path = path.to_str().ok_or_else(|| DataFusionError::Configuration(format!("path {path:?} is not UTF-8")))?;
    ctx.read_batch(batch)?
        .write_parquet(path, DataFrameWriteOptions::new().with_single_file_output(true), None)
        .await?;
    Ok(())
}

/// Register the tables [`write_tables`] wrote under `dir` in `ctx`.
pub async fn register_tables(ctx: &SessionContext, dir: &Path) -> Result<()> {
    for name in ["r", "t", "docs_a", "docs_b"] {
        let path = dir.join(name);
        let path =
            path.to_str().ok_or_else(|| DataFusionError::Configuration(format!("path {path:?} is not UTF-8")))?;
        ctx.register_parquet(name, &format!("{path}/"), ParquetReadOptions::default()).await?;
    }
    Ok(())
}

/// A query's answer as sorted lines (row order is not part of the answer).
pub async fn sorted_rows(ctx: &SessionContext, sql: &str) -> Result<Vec<String>> {
    let batches = ctx.sql(sql).await?.collect().await?;
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)?.to_string();
    // The table's border and header are the first three lines and the last one.
    let mut lines: Vec<String> = text.lines().filter(|l| l.starts_with('|')).skip(1).map(str::to_string).collect();
    lines.sort();
    Ok(lines)
}
