//! Generated tables for the demo and the benchmarks (no download needed).

use std::sync::Arc;

use datafusion::arrow::array::{Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::error::Result;

/// Key of row `i` (1-based) of the benchmark's table a: (i * 2654435761) % 400000000.
pub fn key_a(i: u64) -> i64 {
    ((i as u128 * 2_654_435_761u128) % 400_000_000) as i64
}

/// Key of row `i` (1-based) of the benchmark's table b: (i * 40503 + 7) % 400000000.
pub fn key_b(i: u64) -> i64 {
    ((i as u128 * 40_503 + 7) % 400_000_000) as i64
}

/// `k` spread over all 64 bits by a bijection (multiplication by an odd
/// constant mod 2^64): equal keys stay equal and distinct ones distinct, so
/// every query's answer keeps its size, but the keys have no dense domain.
fn spread(k: i64) -> i64 {
    (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) as i64
}

/// [`key_a`] spread over 64 bits (`SETFUSION_BENCH_SPARSE`).
pub fn key_a_sparse(i: u64) -> i64 {
    spread(key_a(i))
}

/// [`key_b`] spread over 64 bits (`SETFUSION_BENCH_SPARSE`).
pub fn key_b_sparse(i: u64) -> i64 {
    spread(key_b(i))
}

/// An in-memory table of `n` rows with column `k` = key(i) for i in 1..=n and,
/// if `payload`, a column `v` = i. Split into `partitions` partitions of
/// 65536-row batches, generated in parallel.
pub fn key_table(n: u64, key: fn(u64) -> i64, payload: bool, partitions: usize) -> Result<MemTable> {
    let mut fields = vec![Field::new("k", DataType::Int64, false)];
    if payload {
        fields.push(Field::new("v", DataType::Int64, false));
    }
    let schema = Arc::new(Schema::new(fields));
    let partitions = partitions.max(1);
    let per = n.div_ceil(partitions as u64);
    let parts: Vec<Vec<RecordBatch>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..partitions as u64)
            .map(|p| {
                let schema = schema.clone();
                s.spawn(move || {
                    let (start, end) = (p * per + 1, ((p + 1) * per).min(n) + 1);
                    let mut batches = Vec::new();
                    let mut i = start;
                    while i < end {
                        let j = (i + 65536).min(end);
                        let k = Int64Array::from_iter_values((i..j).map(key));
                        let mut cols: Vec<Arc<dyn datafusion::arrow::array::Array>> = vec![Arc::new(k)];
                        if payload {
                            cols.push(Arc::new(Int64Array::from_iter_values((i..j).map(|x| x as i64))));
                        }
                        batches.push(RecordBatch::try_new(schema.clone(), cols).unwrap());
                        i = j;
                    }
                    batches
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    MemTable::try_new(schema, parts)
}

/// The benchmark / demo queries, by name.
pub const SET_QUERIES: &[(&str, &str)] = &[
    ("INTERSECT", "SELECT count(*) FROM (SELECT k FROM a INTERSECT SELECT k FROM b)"),
    ("EXCEPT", "SELECT count(*) FROM (SELECT k FROM a EXCEPT SELECT k FROM b)"),
    ("INTERSECT ALL", "SELECT count(*) FROM (SELECT k FROM a INTERSECT ALL SELECT k FROM b)"),
    ("EXCEPT ALL", "SELECT count(*) FROM (SELECT k FROM a EXCEPT ALL SELECT k FROM b)"),
    ("IN", "SELECT count(*) FROM a WHERE k IN (SELECT k FROM b)"),
    ("NOT IN", "SELECT count(*) FROM a WHERE k NOT IN (SELECT k FROM b)"),
    ("EXISTS", "SELECT count(*) FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k = a.k)"),
    ("IN, rows + payload", "SELECT k, v FROM a WHERE k IN (SELECT k FROM b)"),
    // A mark join: DataFusion's LeftMark join answers it (rightly, b.k has no NULL).
    ("IN OR (mark join)", "SELECT count(*) FROM a WHERE k IN (SELECT k FROM b) OR v < 10"),
];
