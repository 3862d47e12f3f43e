//! The device Parquet scan (issue 27) through SQL: semi / anti joins and set
//! operations over Parquet tables of several files and row groups, with
//! NULLs, dictionary and PLAIN pages, v1 and v2 pages, snappy and
//! uncompressed, give DataFusion's answers (the ALL forms: the exact multiset
//! answers of setfusion's host path) with the device scan and without it;
//! where a GPU is usable the plans hold `DeviceScanExec`s and EXPLAIN
//! ANALYZE shows the device read them (zstd files too, their pages
//! decompressed on the host); an input the device cannot read (LZ4 with
//! Hadoop's framing) falls back to the host scan with the reason. A probe
//! side whose rows are output has its columns decoded by the device. Filtered
//! inputs are read by the device, which runs the filter; a filter it cannot
//! evaluate leaves the input to DataFusion, and EXPLAIN says why.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{BooleanArray, Int32Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::properties::{WriterProperties, WriterVersion};

use crate::common::{block_on, explain, gpu_or_skip, rows};

/// Write `files` Parquet files of `rows` rows each under `dir` (k BIGINT with
/// NULLs every `null_every` rows, 0: none; k32 INT; p BIGINT; f BOOLEAN with NULLs; s VARCHAR, NULL
/// where k is, empty or up to 24 bytes), file i with its own
/// writer options.
/// `codec`: every file's; None: snappy and uncompressed files mixed.
fn write_table(
    dir: &Path,
    files: usize,
    rows: usize,
    seed: u64,
    domain: i64,
    null_every: usize,
    codec: Option<Compression>,
) {
    std::fs::create_dir_all(dir).unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, null_every > 0),
        Field::new("k32", DataType::Int32, true),
        Field::new("p", DataType::Int64, false),
        Field::new("f", DataType::Boolean, true),
        Field::new("s", DataType::Utf8, null_every > 0),
    ]));
    let mut x = seed;
    for f in 0..files {
        let mut next = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 33) as i64
        };
        let k: Vec<Option<i64>> =
            (0..rows).map(|i| (null_every == 0 || i % null_every != 3).then(|| next() % domain - domain / 4)).collect();
        let k32: Vec<Option<i32>> = k.iter().map(|v| v.map(|v| (v % 5000) as i32)).collect();
        let p: Vec<i64> = (0..rows as i64).map(|i| i * 3 + f as i64).collect();
        let text: Vec<Option<String>> = k
            .iter()
            .map(|v| {
                v.map(|v| {
                    if v % 7 == 0 {
                        String::new()
                    } else {
                        format!("s{}{}", v % 3000, "x".repeat(v.rem_euclid(13) as usize))
                    }
                })
            })
            .collect();
        let flag: BooleanArray =
            k.iter().enumerate().map(|(i, v)| (i % 17 != 5).then(|| v.map_or(i % 2 == 0, |v| v % 3 == 0))).collect();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(k)),
                Arc::new(Int32Array::from(k32)),
                Arc::new(Int64Array::from(p)),
                Arc::new(flag),
                Arc::new(StringArray::from(text)),
            ],
        )
        .unwrap();
        let props = WriterProperties::builder()
            .set_dictionary_enabled(f % 2 == 0)
            .set_dictionary_page_size_limit(if f % 3 == 2 { 256 } else { 1 << 20 })
            .set_writer_version(if f % 2 == 1 { WriterVersion::PARQUET_2_0 } else { WriterVersion::PARQUET_1_0 })
            .set_compression(codec.unwrap_or(if f % 3 == 1 { Compression::UNCOMPRESSED } else { Compression::SNAPPY }))
            .set_data_page_row_count_limit(700)
            .set_max_row_group_row_count(Some(2500))
            .set_encoding(Encoding::PLAIN)
            // v2 files' booleans RLE, v1 files' PLAIN (bit-packed).
            .set_column_encoding("f".into(), if f % 2 == 1 { Encoding::RLE } else { Encoding::PLAIN })
            .build();
        let file = std::fs::File::create(dir.join(format!("part-{f}.parquet"))).unwrap();
        let mut w = ArrowWriter::try_new(file, schema.clone(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }
}

fn data() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("setfusion-device-scan-test-{}", std::process::id()));
        write_table(&dir.join("a"), 3, 6000, 1, 20_000, 97, None);
        write_table(&dir.join("b"), 4, 4000, 2, 20_000, 131, None);
        write_table(&dir.join("b_no_nulls"), 2, 5000, 3, 20_000, 0, None);
        write_table(&dir.join("b_zstd"), 2, 3000, 4, 20_000, 0, Some(Compression::ZSTD(ZstdLevel::default())));
        write_table(&dir.join("b_lz4"), 2, 3000, 5, 20_000, 0, Some(Compression::LZ4));
        write_table(&dir.join("b_gzip"), 2, 3000, 7, 20_000, 0, Some(Compression::GZIP(Default::default())));
        // p of c: 0..1500, within a's first row group of each file.
        write_table(&dir.join("c"), 1, 500, 6, 20_000, 0, None);
        dir
    })
    .clone()
}

async fn session(dir: &Path, settings: &[&str], setfusion: bool) -> SessionContext {
    let config = SessionConfig::new().with_target_partitions(4);
    let ctx = if setfusion { setfusion::context_with_config(config) } else { SessionContext::new_with_config(config) };
    for s in settings {
        ctx.sql(s).await.unwrap().collect().await.unwrap();
    }
    for t in ["a", "b", "b_no_nulls", "b_zstd", "b_lz4", "b_gzip", "c"] {
        ctx.register_parquet(t, dir.join(t).to_str().unwrap(), ParquetReadOptions::default()).await.unwrap();
    }
    ctx
}

/// Queries whose answers DataFusion gets right (the ALL forms are compared with setfusion's host path).
const QUERIES: &[&str] = &[
    "SELECT count(*) FROM a WHERE k IN (SELECT k FROM b)",
    "SELECT count(*) FROM a WHERE k NOT IN (SELECT k FROM b)",
    "SELECT count(*) FROM a WHERE k NOT IN (SELECT k FROM b_no_nulls)",
    "SELECT count(*) FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k = a.k)",
    "SELECT count(*) FROM a WHERE NOT EXISTS (SELECT 1 FROM b_no_nulls WHERE b_no_nulls.k = a.k)",
    "SELECT sum(p) FROM a WHERE k NOT IN (SELECT k FROM b_no_nulls)",
    "SELECT sum(p), count(*) FROM a WHERE k IN (SELECT k FROM b)",
    "SELECT count(*) FROM a WHERE k32 IN (SELECT k32 FROM b)",
    "SELECT count(*) FROM (SELECT k FROM a INTERSECT SELECT k FROM b)",
    "SELECT count(*) FROM (SELECT k FROM a EXCEPT SELECT k FROM b)",
    "SELECT count(*) FROM (SELECT k32 FROM a INTERSECT SELECT k32 FROM b_no_nulls)",
    "SELECT count(*) FROM a WHERE k IN (SELECT k FROM b_zstd)",
    // Filtered inputs: the device decodes the filter's columns and runs it.
    "SELECT count(*) FROM a WHERE k IN (SELECT k FROM b WHERE p > 100)",
    "SELECT count(*) FROM a WHERE k IN (SELECT k FROM b WHERE p > 100 AND k32 < 2000)",
    "SELECT count(*) FROM a WHERE k NOT IN (SELECT k FROM b WHERE p < 5000 OR k IS NULL)",
    "SELECT count(*) FROM a WHERE k NOT IN (SELECT k FROM b WHERE k IS NOT NULL AND p > 3000)",
    "SELECT count(*) FROM a WHERE p > 5000 AND k IN (SELECT k FROM b WHERE k32 > 100)",
    "SELECT count(*) FROM a WHERE p BETWEEN 100 AND 9000 AND NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k AND b.p > 10)",
    "SELECT count(*) FROM (SELECT k FROM a WHERE p < 9000 INTERSECT SELECT k FROM b WHERE k32 >= 0)",
    "SELECT count(*) FROM (SELECT k FROM a WHERE k32 IS NULL OR k32 > 10 EXCEPT SELECT k FROM b WHERE p > 50)",
    "SELECT count(*) FROM (SELECT k32 FROM a WHERE k + 5 > k32 INTERSECT SELECT k32 FROM b_zstd WHERE p <> 7)",
    "SELECT count(*) FROM a WHERE k IN (SELECT k FROM b WHERE p % 3 = 1)",
    // String columns compared with literals (NULLs, empty strings; dictionary and PLAIN
    // pages): each row numbered by the literal it equals, on the device.
    STRING_FILTERED,
    "SELECT count(*) FROM a WHERE k IN (SELECT k FROM b WHERE s IN ('s1', 's17xxxx', '') AND p > 100)",
    "SELECT count(*) FROM (SELECT k FROM a WHERE s <> '' INTERSECT SELECT k FROM b WHERE s NOT IN ('s5xxxxx', 's6'))",
    "SELECT p FROM a WHERE s IS NOT NULL AND s <> 's12' AND k NOT IN (SELECT k FROM b_no_nulls WHERE s = '')",
    "SELECT count(*) FROM a WHERE s IN (SELECT s FROM b WHERE s <> '' AND k32 IN (1, 5, 7, 4000))",
    "SELECT count(*) FROM a WHERE k IN (SELECT k FROM b_zstd WHERE s = 's10xxxxxxxxxx' OR s IS NULL OR k32 < 100)",
    // LIKE with `%` only: prefix, suffix, inside, negated.
    STRING_LIKE,
    "SELECT p FROM a WHERE s LIKE '%xxx%' AND k NOT IN (SELECT k FROM b_no_nulls WHERE s NOT LIKE 's1%x')",
    // Both sides over one table: read in one pipeline, a column both read alike read once.
    SAME_TABLE,
    "SELECT k FROM a WHERE f EXCEPT SELECT k FROM a WHERE NOT f",
    "SELECT count(*) FROM a WHERE k32 > 100 AND k IN (SELECT k FROM a WHERE k32 < 4000)",
    "SELECT p FROM a WHERE k32 > 10 AND k NOT IN (SELECT k FROM a WHERE k32 < 50 AND k IS NOT NULL)",
    "SELECT count(*) FROM a WHERE k IN (SELECT k FROM a WHERE k32 < 100)",
    // The probe side's rows output: its columns decoded by the device (NULLs, INT, BIGINT).
    "SELECT k, k32, p FROM a WHERE k IN (SELECT k FROM b)",
    "SELECT k32, p FROM a WHERE k NOT IN (SELECT k FROM b_no_nulls)",
    "SELECT * FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k)",
    "SELECT p FROM a WHERE k32 IN (SELECT k32 FROM b WHERE p > 100)",
    "SELECT k FROM a EXCEPT SELECT k FROM b",
    "SELECT k32 FROM a INTERSECT SELECT k32 FROM b_zstd",
    FILTERED_OUTPUT,
    "SELECT p FROM a WHERE p < 5000 AND NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k)",
    "SELECT p FROM a WHERE k32 > 10 AND k NOT IN (SELECT k FROM b_no_nulls)",
    "SELECT k32 FROM a WHERE p > 10 AND k IN (SELECT k FROM b)",
    // BOOLEAN columns: filters, an output column, a key (PLAIN and RLE pages, NULLs).
    BOOLEAN_FILTERED,
    "SELECT count(*) FROM a WHERE NOT f AND k NOT IN (SELECT k FROM b_no_nulls WHERE f IS NOT NULL)",
    "SELECT k, f FROM a WHERE k IN (SELECT k FROM b WHERE f OR p < 100)",
    "SELECT count(*) FROM (SELECT f FROM a INTERSECT SELECT f FROM b)",
    "SELECT f, k32 FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k)",
    // The page index: p rises with the row, so a range of it reads one page of a row group.
    PAGE_PRUNED,
    "SELECT k, p FROM a WHERE p < 1500 AND k NOT IN (SELECT k FROM b_no_nulls WHERE p > 14000 OR k32 IS NULL)",
    "SELECT count(*) FROM (SELECT k FROM a WHERE p BETWEEN 2000 AND 2200 OR p = 9001 INTERSECT SELECT k FROM b)",
    // Output columns of the row groups the build side's key range leaves only (p rises with the row).
    KEY_RANGE_OUTPUT,
    "SELECT k32, p FROM a WHERE EXISTS (SELECT 1 FROM c WHERE c.p = a.p)",
    "SELECT p FROM a INTERSECT SELECT p FROM c",
    // String keys (dictionary and PLAIN pages, NULLs, empty strings): hashed by the device, proved there.
    STRING_IN,
    "SELECT k, p FROM a WHERE s IN (SELECT s FROM b WHERE p > 100)",
    "SELECT count(*) FROM a WHERE s NOT IN (SELECT s FROM b_no_nulls)",
    "SELECT sum(p) FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.s = a.s)",
    "SELECT count(*) FROM a WHERE EXISTS (SELECT 1 FROM b_zstd WHERE b_zstd.s = a.s)",
    "SELECT count(*) FROM (SELECT s FROM a INTERSECT SELECT s FROM b)",
    "SELECT count(*) FROM a WHERE s IN (SELECT s FROM (VALUES ('s1'), ('s17xxxx'), ('')) t(s))",
    // Composite keys: both sides' key columns decoded by the device and packed into one
    // 64-bit key there (INT and BIGINT, zstd); NULLs in a key column leave both sides to the host.
    COMPOSITE_INTERSECT,
    "SELECT count(*) FROM (SELECT k32, p FROM b_no_nulls EXCEPT SELECT k32, p FROM b_zstd WHERE k32 > 10)",
    "SELECT count(*) FROM b_no_nulls WHERE EXISTS (SELECT 1 FROM c WHERE c.k = b_no_nulls.k AND c.p = b_no_nulls.p)",
    "SELECT p FROM b_no_nulls WHERE NOT EXISTS \
     (SELECT 1 FROM b_no_nulls t WHERE t.k = b_no_nulls.k AND t.p = b_no_nulls.p AND t.p > 5000)",
    COMPOSITE_NULLS,
    // Aggregates absorbed by the selection (no row kept: counts 0, the rest NULL).
    AGGREGATE_ABOVE,
    "SELECT sum(p), min(k), max(k32), count(k32) FROM a WHERE k IN (SELECT k FROM b WHERE p < 0)",
    "SELECT count(*), sum(k) FROM (SELECT k FROM a INTERSECT SELECT k FROM b)",
    "SELECT max(p), sum(k32) FROM a WHERE p > 10 AND k NOT IN (SELECT k FROM b_no_nulls)",
    COMPOSITE_AGGREGATE,
];

/// Aggregates absorbed above a semi join on a composite key.
const COMPOSITE_AGGREGATE: &str = "SELECT sum(p), count(*), min(k) FROM b_no_nulls \
     WHERE EXISTS (SELECT 1 FROM b_no_nulls t WHERE t.k = b_no_nulls.k AND t.p = b_no_nulls.p AND t.k32 < 2000)";

/// A composite key (BIGINT, BIGINT) of two filters over one table, its columns output.
const COMPOSITE_INTERSECT: &str =
    "SELECT k, p FROM b_no_nulls WHERE p > 100 INTERSECT SELECT k, p FROM b_no_nulls WHERE k32 > 1000";

/// A composite key whose column k holds NULLs: packed by the host.
const COMPOSITE_NULLS: &str = "SELECT count(*) FROM (SELECT k, p FROM a INTERSECT SELECT k, p FROM a WHERE p > 100)";

/// INTERSECT ALL on a composite key (BIGINT, BIGINT), its columns output.
const COMPOSITE_ALL: &str =
    "SELECT k, p FROM b_no_nulls WHERE k32 < 3000 INTERSECT ALL SELECT k, p FROM b_no_nulls WHERE p > 2000";

/// A build side filtered by a string column's equality with a literal.
const STRING_FILTERED: &str = "SELECT count(*) FROM a WHERE k IN (SELECT k FROM b WHERE s = '')";

/// A build side filtered by LIKE patterns.
const STRING_LIKE: &str =
    "SELECT count(*) FROM a WHERE k IN (SELECT k FROM b WHERE s LIKE 's1%' AND s NOT LIKE '%x' OR s LIKE '%7x%')";

/// A semi join on string keys, both sides read by the device.
const STRING_IN: &str = "SELECT count(*) FROM a WHERE s IN (SELECT s FROM b)";

/// A probe side whose columns are output, its row groups chosen by the build side's key range.
const KEY_RANGE_OUTPUT: &str = "SELECT k, p FROM a WHERE p IN (SELECT p FROM c)";

/// A filter the page index prunes pages by (and row groups by their statistics).
const PAGE_PRUNED: &str = "SELECT count(*) FROM a WHERE k IN (SELECT k FROM b WHERE p BETWEEN 3000 AND 3600)";

/// A filter over a BOOLEAN column on both sides.
const BOOLEAN_FILTERED: &str = "SELECT count(*) FROM a WHERE f AND k IN (SELECT k FROM b WHERE f)";

/// Aggregates the selection absorbs over columns with NULLs, INT and BIGINT, string keys.
const AGGREGATE_ABOVE: &str = "SELECT count(*), count(k), sum(k32), min(k32), max(k), min(p) FROM a \
     WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.s = a.s)";

/// A filtered probe side whose (non-NULL) column is output.
const FILTERED_OUTPUT: &str = "SELECT sum(p), count(*) FROM a WHERE p > 10 AND k IN (SELECT k FROM b)";

/// Marks (IN / EXISTS under OR, in a SELECT list): DataFusion answers some of
/// these wrongly, so they are compared with setfusion's host scan. The
/// subquery side is read by the device where one key decides the marks.
const MARK_QUERIES: &[&str] = &[
    MARK_NOT_IN,
    "SELECT count(*) FROM a WHERE k IN (SELECT k FROM b_no_nulls) OR p < 100",
    "SELECT count(*) FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k = a.k) OR p > 9000",
    "SELECT count(*) FROM a WHERE NOT EXISTS (SELECT 1 FROM b_zstd WHERE b_zstd.k32 = a.k32) OR p < 10",
    "SELECT k, p, k IN (SELECT k FROM b WHERE p > 100) AS m FROM a",
    // Only NULL keys in the subquery, and an empty subquery.
    "SELECT count(*) FROM a WHERE k NOT IN (SELECT k FROM b WHERE k IS NULL) OR p = 1",
    "SELECT count(*) FROM a WHERE k NOT IN (SELECT k FROM b WHERE p < 0) OR p = 3",
    "SELECT count(*) FROM a WHERE k NOT IN (SELECT k FROM b WHERE s IN ('', 's1')) OR p > 5000",
    MARK_STRING_KEY,
    // The probe side read by the device too (every row output with its mark): filtered
    // (c's columns hold no NULL), zstd (left to DataFusion's scan, with the reason), an
    // INT key, marks in a SELECT list over every column.
    MARK_FILTERED_PROBE,
    MARK_ZSTD_PROBE,
    "SELECT k32, p, k32 IN (SELECT k32 FROM b) AS m FROM a",
    "SELECT *, EXISTS (SELECT 1 FROM b_no_nulls WHERE b_no_nulls.k = a.k) AS m FROM a",
    // The filter above absorbed by the join and run on the device: over the mark and a column
    // (NULL marks dropped), the mark and a column with NULLs output.
    MARK_FILTER_ABOVE,
    MARK_AGGREGATE_ABOVE,
    "SELECT k32, m FROM (SELECT k32, p, k IN (SELECT k FROM b_no_nulls) AS m FROM a) t WHERE m OR k32 IS NULL",
];

/// Aggregates over the rows a filter above a mark join keeps (columns with NULLs, INT and BIGINT).
const MARK_AGGREGATE_ABOVE: &str =
    "SELECT count(*), sum(p), max(k32), count(k), min(k) FROM a WHERE k NOT IN (SELECT k FROM b) OR p < 100";

/// A filter over the mark and a probe column whose output is the column and the mark.
const MARK_FILTER_ABOVE: &str =
    "SELECT p, m FROM (SELECT p, k NOT IN (SELECT k FROM b) AS m FROM a) t WHERE m OR p < 100";

/// A mark join whose probe side is filtered (its output columns hold no NULL).
const MARK_FILTERED_PROBE: &str = "SELECT count(*), sum(p) FROM (SELECT * FROM c WHERE p > 100) c \
     WHERE k NOT IN (SELECT k FROM b_no_nulls) OR p < 600";

/// A mark join whose probe side's pages are zstd: DataFusion's scan reads it.
const MARK_ZSTD_PROBE: &str = "SELECT count(*) FROM b_zstd WHERE k NOT IN (SELECT k FROM b) OR p > 5000";
/// A probe side whose pages host threads inflate (gzip).
const MARK_GZIP_PROBE: &str = "SELECT count(*) FROM b_gzip WHERE k NOT IN (SELECT k FROM b) OR p > 5000";

/// A mark on a string key: the host reads the subquery side (EXPLAIN says why).
const MARK_STRING_KEY: &str = "SELECT count(*) FROM a WHERE s NOT IN (SELECT s FROM b) OR p > 5000";

/// NOT IN under OR: an uncorrelated IN mark, NULL keys on both sides.
const MARK_NOT_IN: &str = "SELECT count(*) FROM a WHERE k NOT IN (SELECT k FROM b) OR p > 5000";

const ALL_QUERIES: &[&str] = &[
    "SELECT count(*) FROM (SELECT k FROM a INTERSECT ALL SELECT k FROM b)",
    "SELECT count(*) FROM (SELECT k FROM a EXCEPT ALL SELECT k FROM b)",
    "SELECT count(*) FROM (SELECT k32 FROM a EXCEPT ALL SELECT k32 FROM b)",
    "SELECT count(*) FROM (SELECT k FROM a WHERE p > 1000 INTERSECT ALL SELECT k FROM b WHERE p < 8000)",
    "SELECT count(*) FROM (SELECT k FROM a WHERE k32 < 3000 EXCEPT ALL SELECT k FROM b WHERE k IS NULL OR p > 20)",
    "SELECT k FROM a INTERSECT ALL SELECT k FROM b",
    "SELECT k32 FROM a EXCEPT ALL SELECT k32 FROM b",
    "SELECT count(*) FROM (SELECT s FROM a INTERSECT ALL SELECT s FROM b)",
    "SELECT count(*) FROM (SELECT k FROM a WHERE f INTERSECT ALL SELECT k FROM a WHERE k32 > 2500)",
    "SELECT count(*) FROM (SELECT k FROM a EXCEPT ALL SELECT k FROM b WHERE s = '')",
    "SELECT count(*) FROM (SELECT k FROM a WHERE s LIKE '%xx%' INTERSECT ALL SELECT k FROM b WHERE s NOT LIKE 's2%')",
    // One side collected on the host (a filter the device cannot run): the other's keys read meanwhile.
    "SELECT count(*) FROM (SELECT k FROM a EXCEPT ALL SELECT k FROM b WHERE p % 3 = 1)",
    // Composite keys packed on the device (INT and BIGINT, zstd), and by the host where a key column holds NULLs.
    COMPOSITE_ALL,
    "SELECT count(*) FROM (SELECT k32, k FROM b_zstd EXCEPT ALL SELECT k32, k FROM b_no_nulls WHERE p < 9000)",
    "SELECT count(*) FROM (SELECT k32, p FROM a EXCEPT ALL SELECT k32, p FROM a WHERE k > 0)",
];

/// Two filters over one table: their key and filter columns (read in the same
/// row groups) read once for both sides.
const SAME_TABLE: &str =
    "SELECT count(*) FROM (SELECT k FROM a WHERE k32 < 2000 INTERSECT SELECT k FROM a WHERE k32 >= 1000)";

#[test]
fn device_scan_answers_equal_host_scan() {
    let _device = crate::common::shared_device();
    let gpu = gpu_or_skip().is_ok();
    let dir = data();
    block_on(move || async move {
        let plain = session(&dir, &[], false).await;
        let forced = ["SET setfusion.min_rows = 0"];
        let device = session(&dir, &forced, true).await;
        let host = session(&dir, &["SET setfusion.min_rows = 0", "SET setfusion.device_scan = false"], true).await;
        for sql in QUERIES {
            let want = rows(&plain, sql).await;
            assert_eq!(rows(&host, sql).await, want, "host scan: {sql}");
            assert_eq!(rows(&device, sql).await, want, "device scan: {sql}");
        }
        for sql in ALL_QUERIES.iter().chain(MARK_QUERIES) {
            let want = rows(&host, sql).await;
            assert_eq!(rows(&device, sql).await, want, "device scan: {sql}");
        }
        // A LIMIT pushed into the node survives the device scan rule (it runs
        // after DataFusion's limit and filter pushdown): 3 rows, all answers.
        let limited = "SELECT k FROM a WHERE k IN (SELECT k FROM b) LIMIT 3";
        let got = rows(&device, limited).await;
        let all = rows(&plain, "SELECT k FROM a WHERE k IN (SELECT k FROM b)").await;
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(got.iter().all(|r| all.contains(r)), "{got:?}");
        if gpu {
            let plan = explain(&device, limited, false).await;
            assert!(plan.contains("DeviceScanExec"), "{plan}");
            assert!(
                plan.lines()
                    .any(|l| l.contains("SemiJoinExec") && l.contains("fetch=3") && l.contains("dynamic_filter=probe")),
                "{plan}"
            );
        }
        // A filter the device evaluates: the scan carries it, and EXPLAIN
        // ANALYZE says the device ran it; one it cannot stays with DataFusion, with the reason.
        let filtered = "SELECT count(*) FROM a WHERE p > 5000 AND k IN (SELECT k FROM b WHERE p > 100)";
        let plan = explain(&device, filtered, false).await;
        let unfit =
            explain(&device, "SELECT count(*) FROM a WHERE k IN (SELECT k FROM b WHERE p % 3 = 1)", false).await;
        if gpu {
            assert_eq!(plan.matches("DeviceScanExec: column=k").count(), 2, "{plan}");
            assert!(plan.contains("filter=p@") && plan.contains("> 5000") && plan.contains("> 100"), "{plan}");
            let analyzed = explain(&device, filtered, true).await;
            assert!(analyzed.matches("filtered on the device").count() == 2, "{analyzed}");
            assert!(!analyzed.contains("fell back"), "{analyzed}");
            assert!(unfit.contains("device_scan=\"build: filter "), "{unfit}");
            // A string column's equality with a literal: evaluated by the device.
            for sql in [STRING_FILTERED, STRING_LIKE] {
                let analyzed = explain(&device, sql, true).await;
                assert!(analyzed.contains("filtered on the device"), "{analyzed}");
                assert!(!analyzed.contains("fell back"), "{analyzed}");
            }
            // The build side (and the probe side under count(*)) is read by the device.
            let plan = explain(&device, QUERIES[0], false).await;
            assert_eq!(plan.matches("DeviceScanExec").count(), 2, "{plan}");
            let analyzed = explain(&device, QUERIES[0], true).await;
            assert!(analyzed.contains("device scan probe:") && analyzed.contains("build:"), "{analyzed}");
            // A zstd input is read by the device (its pages decompressed by kernels/zstd.cu, or on
            // host threads under SETFUSION_DEVICE_ZSTD=0).
            let analyzed = explain(&device, "SELECT count(*) FROM a WHERE k IN (SELECT k FROM b_zstd)", true).await;
            assert!(analyzed.contains("build: 6000 rows") && !analyzed.contains("fell back"), "{analyzed}");
            // Hadoop-framed LZ4 is planned for the device and read by the host, with the reason.
            let lz4 = "SELECT count(*) FROM a WHERE k IN (SELECT k FROM b_lz4)";
            assert_eq!(rows(&device, lz4).await, rows(&plain, lz4).await);
            let analyzed = explain(&device, lz4, true).await;
            assert!(analyzed.contains("device scan fell back to the host: build side: codec LZ4"), "{analyzed}");
            // The probe side's rows are output: the device decodes its columns too,
            // unless the input is filtered.
            let plan = explain(&device, QUERIES[5], false).await;
            assert_eq!(plan.matches("DeviceScanExec").count(), 2, "{plan}");
            assert!(plan.contains("output=[k, p]"), "{plan}");
            let analyzed = explain(&device, QUERIES[5], true).await;
            assert!(!analyzed.contains("fell back"), "{analyzed}");
            // The aggregate above (count, sum, min, max without grouping) absorbed by the selection
            // and reduced on the device: no AggregateExec left, nothing but its row back (a
            // filtered probe side's two segments, string keys among them).
            let no_cache = session(&dir, &["SET setfusion.min_rows = 0", "SET setfusion.cache_limit = 0"], true).await;
            for sql in [QUERIES[5], QUERIES[6], FILTERED_OUTPUT, AGGREGATE_ABOVE, COMPOSITE_AGGREGATE] {
                let plan = explain(&device, sql, false).await;
                assert!(plan.contains("aggregate_above=[") && !plan.contains("AggregateExec"), "{plan}");
                let analyzed = explain(&no_cache, sql, true).await;
                assert!(analyzed.contains("the aggregate above reduced on the device"), "{analyzed}");
                assert!(!analyzed.contains("fell back"), "{analyzed}");
            }
            // Grouping leaves DataFusion's aggregate in place.
            let grouped = "SELECT k32, sum(p) FROM a WHERE k IN (SELECT k FROM b) GROUP BY k32";
            let plan = explain(&device, grouped, false).await;
            assert!(plan.contains("AggregateExec") && !plan.contains("aggregate_above"), "{plan}");
            // Output and filtered: the device puts the output column in its keys' order
            // (NULL keys last: NOT EXISTS outputs those rows too).
            for sql in
                [FILTERED_OUTPUT, "SELECT p FROM a WHERE p < 5000 AND NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k)"]
            {
                let plan = explain(&device, sql, false).await;
                assert!(plan.contains("filter=") && plan.contains("output=[k, p]"), "{plan}");
                let analyzed = explain(&device, sql, true).await;
                assert!(!analyzed.contains("fell back"), "{analyzed}");
            }
            // BOOLEAN filter columns are decoded and evaluated by the device.
            let plan = explain(&device, BOOLEAN_FILTERED, false).await;
            assert_eq!(plan.matches("DeviceScanExec: column=k").count(), 2, "{plan}");
            assert_eq!(plan.matches("filter=f@").count(), 2, "{plan}");
            let analyzed = explain(&device, BOOLEAN_FILTERED, true).await;
            assert!(analyzed.matches("filtered on the device").count() == 2, "{analyzed}");
            assert!(!analyzed.contains("fell back"), "{analyzed}");
            // Two filters over one table, both run by the device over columns read once.
            let analyzed = explain(&no_cache, SAME_TABLE, true).await;
            assert_eq!(analyzed.matches("DeviceScanExec: column=k").count(), 2, "{analyzed}");
            assert!(analyzed.contains("2 of its columns read once with the other side's"), "{analyzed}");
            assert!(analyzed.matches("filtered on the device").count() == 2, "{analyzed}");
            assert!(!analyzed.contains("fell back"), "{analyzed}");
            // The page index: pages of the build side's row group that the filter rules out are not
            // read (the column cache off: a hit would read nothing at all).
            let uncached = session(&dir, &["SET setfusion.min_rows = 0", "SET setfusion.cache_limit = 0"], true).await;
            let analyzed = explain(&uncached, PAGE_PRUNED, true).await;
            assert!(analyzed.contains("data pages not read") && analyzed.contains("by the page index"), "{analyzed}");
            assert!(!analyzed.contains("fell back"), "{analyzed}");
            // Output columns are read from the row groups the build side's key range leaves (6 of 9 pruned).
            let analyzed = explain(&uncached, KEY_RANGE_OUTPUT, true).await;
            assert!(analyzed.contains("6 of 9 row groups pruned by the build side's key range"), "{analyzed}");
            assert!(analyzed.contains("output=[k, p]") && !analyzed.contains("fell back"), "{analyzed}");
            // String keys: both sides read, decoded and hashed by the device, the hashes proved there.
            let plan = explain(&device, STRING_IN, false).await;
            assert_eq!(plan.matches("DeviceScanExec: column=s").count(), 2, "{plan}");
            let analyzed = explain(&uncached, STRING_IN, true).await;
            assert!(analyzed.contains("device scan probe:") && !analyzed.contains("fell back"), "{analyzed}");
            // Composite keys: both sides' key columns decoded and packed into one 64-bit key by the
            // device, the output columns taken from the decoded ones.
            for sql in [COMPOSITE_ALL, COMPOSITE_INTERSECT] {
                let plan = explain(&device, sql, false).await;
                assert_eq!(plan.matches("DeviceScanExec: columns=[k, p]").count(), 2, "{plan}");
                let analyzed = explain(&uncached, sql, true).await;
                assert_eq!(analyzed.matches("filtered on the device").count(), 2, "{analyzed}");
                assert!(!analyzed.contains("fell back"), "{analyzed}");
            }
            // ... a NULL in a key column: the host reads both sides, and says why.
            let analyzed = explain(&uncached, COMPOSITE_NULLS, true).await;
            assert!(analyzed.contains("with a NULL in a composite key column"), "{analyzed}");
            // ... both or neither: a side that is not a Parquet scan leaves the other to DataFusion's scan.
            let values = "SELECT count(*) FROM a WHERE s IN (SELECT s FROM (VALUES ('s1'), ('')) t(s))";
            let plan = explain(&device, values, false).await;
            assert!(!plan.contains("DeviceScanExec"), "{plan}");
            assert!(plan.contains("string keys: the device reads both sides or neither"), "{plan}");
            // A mark join's subquery side is read by the device (keys only, the marks' NULLs exact),
            // and its probe side, every row output with its mark (the key's NULLs among them).
            let plan = explain(&device, MARK_NOT_IN, false).await;
            assert!(plan.contains("MarkJoinExec") && plan.matches("DeviceScanExec").count() == 2, "{plan}");
            assert!(plan.contains("output=[k, p]"), "{plan}");
            let analyzed = explain(&uncached, MARK_NOT_IN, true).await;
            assert!(analyzed.contains("device scan probe:") && analyzed.contains("build:"), "{analyzed}");
            assert!(!analyzed.contains("fell back"), "{analyzed}");
            // The filter above (NOT mark OR p > 5000) run on the device: no FilterExec, no column back.
            for (sql, output) in [(MARK_NOT_IN, "output=[]"), (MARK_FILTER_ABOVE, "output=[p, ")] {
                let plan = explain(&device, sql, false).await;
                assert!(
                    plan.contains("filter_above=") && plan.contains(output) && !plan.contains("FilterExec"),
                    "{plan}"
                );
                let analyzed = explain(&uncached, sql, true).await;
                assert!(analyzed.contains("the filter above run on the device"), "{analyzed}");
                assert!(!analyzed.contains("fell back"), "{analyzed}");
            }
            // The aggregate above that filter absorbed too and reduced on the device.
            let plan = explain(&device, MARK_AGGREGATE_ABOVE, false).await;
            assert!(plan.contains("aggregate_above=[") && !plan.contains("AggregateExec"), "{plan}");
            let analyzed = explain(&uncached, MARK_AGGREGATE_ABOVE, true).await;
            assert!(analyzed.contains("the aggregate above reduced on the device"), "{analyzed}");
            assert!(!analyzed.contains("fell back"), "{analyzed}");
            let analyzed = explain(&uncached, MARK_FILTERED_PROBE, true).await;
            assert_eq!(analyzed.matches("DeviceScanExec").count(), 2, "{analyzed}");
            assert!(analyzed.contains("filtered on the device") && !analyzed.contains("fell back"), "{analyzed}");
            let plan = explain(&device, MARK_GZIP_PROBE, false).await;
            assert!(plan.contains("device_scan=\"probe: its pages are inflated on host threads"), "{plan}");
            assert_eq!(plan.matches("DeviceScanExec").count(), 1, "{plan}");
            assert_eq!(rows(&device, MARK_GZIP_PROBE).await, rows(&host, MARK_GZIP_PROBE).await);
            // A zstd probe side is refused for its codec unless the device decompresses its pages.
            let plan = explain(&device, MARK_ZSTD_PROBE, false).await;
            assert_eq!(plan.contains("inflated on host threads"), !setfusion::env::device_zstd(), "{plan}");
            // A filtered probe side whose output columns may hold NULLs stays with DataFusion's scan.
            let nullable =
                "SELECT count(*) FROM (SELECT * FROM a WHERE p > 100) a WHERE k NOT IN (SELECT k FROM b) OR p < 600";
            assert_eq!(rows(&device, nullable).await, rows(&host, nullable).await);
            let plan = explain(&device, nullable, false).await;
            assert!(plan.contains("probe: a filtered input whose output column k may hold NULLs"), "{plan}");
            let plan = explain(&device, MARK_STRING_KEY, false).await;
            assert!(plan.contains("device_scan=\"build: string keys"), "{plan}");
            // An output column that may hold NULLs under a filter: the host reads that input.
            let analyzed = explain(&device, "SELECT k32 FROM a WHERE p > 10 AND k IN (SELECT k FROM b)", true).await;
            assert!(analyzed.contains("fell back to the host: probe side: output column k32"), "{analyzed}");
        }
    });
}

/// The device column cache: a repeated query is answered from the device
/// (EXPLAIN ANALYZE says "cache hit"), string keys too (their spans and page
/// bodies kept, the hashes proved against them again), a rewritten file is
/// read again (the answer follows the new file), and `cache_limit = 0` turns it off.
#[test]
fn device_cache_serves_unchanged_files_only() {
    let _device = crate::common::shared_device();
    let gpu = gpu_or_skip().is_ok();
    let dir = std::env::temp_dir().join(format!("setfusion-device-cache-test-{}", std::process::id()));
    write_table(&dir.join("a"), 2, 5000, 11, 8000, 0, None);
    write_table(&dir.join("b"), 2, 5000, 12, 8000, 0, None);
    let sql = "SELECT count(*) FROM a WHERE k IN (SELECT k FROM b)";
    let strings = "SELECT count(*) FROM a WHERE s IN (SELECT s FROM b)";
    block_on(move || async move {
        let open = |settings: &'static [&'static str], setfusion: bool| {
            let dir = dir.clone();
            async move {
                let config = SessionConfig::new().with_target_partitions(4);
                let ctx = if setfusion {
                    setfusion::context_with_config(config)
                } else {
                    SessionContext::new_with_config(config)
                };
                for s in settings {
                    ctx.sql(s).await.unwrap().collect().await.unwrap();
                }
                for t in ["a", "b"] {
                    ctx.register_parquet(t, dir.join(t).to_str().unwrap(), ParquetReadOptions::default())
                        .await
                        .unwrap();
                }
                ctx
            }
        };
        let device = open(&["SET setfusion.min_rows = 0"], true).await;
        let want = rows(&open(&[], false).await, sql).await;
        assert_eq!(rows(&device, sql).await, want);
        let again = explain(&device, sql, true).await;
        assert_eq!(rows(&device, sql).await, want);
        let want_strings = rows(&open(&[], false).await, strings).await;
        assert_eq!(rows(&device, strings).await, want_strings);
        let strings_again = explain(&device, strings, true).await;
        assert_eq!(rows(&device, strings).await, want_strings, "string keys from the cache");
        // Rewrite b with other keys: the cache must not answer for the old file.
        write_table(&dir.join("b"), 2, 5200, 13, 8000, 0, None);
        let want_new = rows(&open(&[], false).await, sql).await;
        assert_ne!(want, want_new, "the rewrite changes the answer");
        let want_strings_new = rows(&open(&[], false).await, strings).await;
        assert_ne!(want_strings, want_strings_new, "the rewrite changes the answer");
        // A new session in this process: the device cache is the process's, while
        // DataFusion's own per-session file metadata may still describe the old file.
        let device_again = open(&["SET setfusion.min_rows = 0"], true).await;
        assert_eq!(rows(&device_again, sql).await, want_new, "a rewritten file was served from the cache");
        assert_eq!(rows(&device_again, strings).await, want_strings_new, "rewritten strings served from the cache");
        let off = open(&["SET setfusion.min_rows = 0", "SET setfusion.cache_limit = 0"], true).await;
        let analyzed_off = explain(&off, sql, true).await;
        assert_eq!(rows(&off, sql).await, want_new);
        if gpu {
            assert!(again.contains("cache hit"), "{again}");
            assert!(strings_again.matches("cache hit").count() >= 2, "{strings_again}");
            assert!(!strings_again.contains("fell back"), "{strings_again}");
            assert!(analyzed_off.contains("cache off") && !analyzed_off.contains("cache hit"), "{analyzed_off}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    });
}

/// A filtered input whose filter rules out all but two row groups of a sorted column.
const PRUNED_BY_FILTER: &str = "SELECT count(*) FROM big WHERE k BETWEEN 4000 AND 5999 AND k IN (SELECT k FROM small)";

/// IN / INTERSECT read only the probe row groups the build side's key range
/// (its files' statistics) can match, as DataFusion's dynamic filter prunes
/// them; NOT IN / EXCEPT read every row group. A filtered input reads only
/// the row groups whose statistics allow a row its filter keeps, as
/// DataFusion's scan prunes them. Answers equal DataFusion's.
#[test]
fn probe_row_groups_outside_the_build_range_are_not_read() {
    let _device = crate::common::shared_device();
    let gpu = gpu_or_skip().is_ok();
    let dir = std::env::temp_dir().join(format!("setfusion-device-prune-test-{}", std::process::id()));
    let write_sorted = |name: &str, keys: std::ops::Range<i64>, nulls: bool| {
        std::fs::create_dir_all(dir.join(name)).unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true)]));
        let k: Vec<Option<i64>> = keys.map(|v| (!nulls || v % 1000 != 7).then_some(v)).collect();
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(k))]).unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(1000))
            .set_compression(Compression::SNAPPY)
            .build();
        let mut w = ArrowWriter::try_new(
            std::fs::File::create(dir.join(name).join("part-0.parquet")).unwrap(),
            schema,
            Some(props),
        )
        .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    };
    write_sorted("big", 0..20_000, false);
    write_sorted("big_nulls", 0..20_000, true);
    write_sorted("small", 5_000..5_300, false);
    block_on(move || async move {
        let open = |setfusion: bool| {
            let dir = dir.clone();
            async move {
                let config = SessionConfig::new().with_target_partitions(4);
                let ctx = if setfusion {
                    setfusion::context_with_config(config)
                } else {
                    SessionContext::new_with_config(config)
                };
                if setfusion {
                    // Without the device cache, so each EXPLAIN ANALYZE reports the files' row groups.
                    ctx.sql("SET setfusion.min_rows = 0").await.unwrap().collect().await.unwrap();
                    ctx.sql("SET setfusion.cache_limit = 0").await.unwrap().collect().await.unwrap();
                }
                for t in ["big", "big_nulls", "small"] {
                    ctx.register_parquet(t, dir.join(t).to_str().unwrap(), ParquetReadOptions::default())
                        .await
                        .unwrap();
                }
                ctx
            }
        };
        let (plain, device) = (open(false).await, open(true).await);
        for sql in [
            "SELECT count(*) FROM big WHERE k IN (SELECT k FROM small)",
            "SELECT count(*) FROM big_nulls WHERE k IN (SELECT k FROM small)",
            "SELECT count(*) FROM (SELECT k FROM big INTERSECT SELECT k FROM small)",
            "SELECT count(*) FROM (SELECT k FROM big_nulls INTERSECT ALL SELECT k FROM small)",
            "SELECT count(*) FROM big WHERE k NOT IN (SELECT k FROM small)",
            "SELECT count(*) FROM (SELECT k FROM big EXCEPT SELECT k FROM small)",
            // Filtered inputs: their row groups pruned by the statistics against the filter.
            PRUNED_BY_FILTER,
            "SELECT count(*) FROM small WHERE k NOT IN (SELECT k FROM big_nulls WHERE k >= 5100)",
            "SELECT count(*) FROM small WHERE k NOT IN (SELECT k FROM big_nulls WHERE k >= 5100 OR k IS NULL)",
            "SELECT count(*) FROM (SELECT k FROM big_nulls WHERE k < 5200 EXCEPT ALL SELECT k FROM small)",
            "SELECT k FROM big WHERE k < 2500 AND k NOT IN (SELECT k FROM small)",
            "SELECT k FROM big_nulls WHERE k > 17000 AND NOT EXISTS (SELECT 1 FROM small WHERE small.k = big_nulls.k)",
        ] {
            assert_eq!(rows(&device, sql).await, rows(&plain, sql).await, "{sql}");
        }
        if gpu {
            let analyzed = explain(&device, PRUNED_BY_FILTER, true).await;
            assert!(analyzed.contains("filtered on the device"), "{analyzed}");
            assert!(
                analyzed.contains("18 of 20 row groups pruned by their statistics against the filter"),
                "{analyzed}"
            );
        }
        if gpu {
            let analyzed = explain(&device, "SELECT count(*) FROM big WHERE k IN (SELECT k FROM small)", true).await;
            assert!(analyzed.contains("19 of 20 row groups pruned by the build side's key range"), "{analyzed}");
            let analyzed =
                explain(&device, "SELECT count(*) FROM big WHERE k NOT IN (SELECT k FROM small)", true).await;
            assert!(!analyzed.contains("pruned by the build side"), "{analyzed}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    });
}

/// Late materialization: a filtered probe side's output column that its
/// filter does not read is read, once the selection is known, only from the
/// data pages that hold a kept row (the filter's own columns, the key among
/// them, are kept from the filter and not read again); so are an unfiltered
/// probe side's output columns where the build side is small, and those a
/// filter above a mark join outputs but does not read. On sorted columns of
/// one row group in pages of 1000 rows, the 500 keys the build side matches
/// lie in one block of 4096 rows, so 35 of the 40 pages of `q` are not read;
/// where the kept rows fill most blocks, every page is read. Answers equal
/// DataFusion's.
#[test]
fn payload_pages_of_rejected_rows_are_not_read() {
    let _device = crate::common::shared_device();
    let gpu = gpu_or_skip().is_ok();
    let dir = std::env::temp_dir().join(format!("setfusion-device-late-test-{}", std::process::id()));
    let write = |name: &str, keys: std::ops::Range<i64>| {
        std::fs::create_dir_all(dir.join(name)).unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("p", DataType::Int64, false),
            Field::new("q", DataType::Int64, false),
        ]));
        let k: Vec<i64> = keys.collect();
        let p: Vec<i64> = k.iter().map(|v| v * 3).collect();
        let q: Vec<i64> = k.iter().map(|v| v * 7).collect();
        let columns: Vec<datafusion::arrow::array::ArrayRef> =
            vec![Arc::new(Int64Array::from(k)), Arc::new(Int64Array::from(p)), Arc::new(Int64Array::from(q))];
        let batch = RecordBatch::try_new(schema.clone(), columns).unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(40_000))
            .set_data_page_row_count_limit(1000)
            .set_write_batch_size(1000)
            .set_dictionary_enabled(false)
            .set_compression(Compression::SNAPPY)
            .build();
        let file = std::fs::File::create(dir.join(name).join("part-0.parquet")).unwrap();
        let mut w = ArrowWriter::try_new(file, schema, Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    };
    write("wide", 0..40_000);
    write("few", 30_000..30_500);
    let sparse = "SELECT k, p, q FROM wide WHERE p >= 0 AND k IN (SELECT k FROM few)";
    let dense = "SELECT q FROM wide WHERE p < 93000 AND NOT EXISTS (SELECT 1 FROM few WHERE few.k = wide.k)";
    // Unfiltered: the build side has a sixteenth of the probe's rows or less, so p and q are read
    // after the selection, each from the 5 of its 40 pages that hold a kept row.
    let unfiltered = "SELECT k, p, q FROM wide WHERE k IN (SELECT k FROM few)";
    // A mark join whose filter above reads the mark and p: q is read after the filter, from the
    // pages of the 500 rows it keeps (the same rows as the semi join's, p never being negative).
    let marked = "SELECT q FROM wide WHERE k IN (SELECT k FROM few) OR p < 0";
    block_on(move || async move {
        let open = |setfusion: bool| {
            let dir = dir.clone();
            async move {
                let ctx = if setfusion {
                    let ctx = setfusion::context_with_config(SessionConfig::new().with_target_partitions(4));
                    for s in ["SET setfusion.min_rows = 0", "SET setfusion.cache_limit = 0"] {
                        ctx.sql(s).await.unwrap().collect().await.unwrap();
                    }
                    ctx
                } else {
                    SessionContext::new_with_config(SessionConfig::new().with_target_partitions(4))
                };
                for t in ["wide", "few"] {
                    ctx.register_parquet(t, dir.join(t).to_str().unwrap(), ParquetReadOptions::default())
                        .await
                        .unwrap();
                }
                ctx
            }
        };
        let (plain, device) = (open(false).await, open(true).await);
        for sql in [sparse, dense, unfiltered] {
            assert_eq!(rows(&device, sql).await, rows(&plain, sql).await, "{sql}");
        }
        assert_eq!(rows(&device, sparse).await.len(), 500);
        let semi = "SELECT q FROM wide WHERE k IN (SELECT k FROM few)";
        assert_eq!(rows(&device, marked).await, rows(&plain, semi).await, "{marked}");
        if gpu {
            let analyzed = explain(&device, sparse, true).await;
            assert!(analyzed.contains("payload of the kept rows only: 35 of 40 data pages not read"), "{analyzed}");
            assert!(!analyzed.contains("fell back"), "{analyzed}");
            let analyzed = explain(&device, unfiltered, true).await;
            assert!(analyzed.contains("payload of the kept rows only: 70 of 80 data pages not read"), "{analyzed}");
            assert!(!analyzed.contains("fell back"), "{analyzed}");
            let analyzed = explain(&device, marked, true).await;
            assert!(analyzed.contains("MarkJoinExec") && analyzed.contains("500 rows kept"), "{analyzed}");
            assert!(analyzed.contains("payload of the kept rows only: 35 of 40 data pages not read"), "{analyzed}");
            let analyzed = explain(&device, dense, true).await;
            assert!(
                !analyzed.contains("payload of the kept rows only") && !analyzed.contains("fell back"),
                "{analyzed}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    });
}
