//! The device Parquet scan (issue 27) over TPC-H tables from tpchgen,
//! rewritten in every shape a scan of real files meets: NULL keys scattered,
//! filling whole data pages and a whole row group; an empty row group between
//! full ones and an empty file; a dictionary that falls back to PLAIN
//! mid-chunk; the page index written and not; v1 and v2 pages; snappy, zstd
//! and uncompressed; several files per table; and nested columns (a list, a
//! struct) beside the columns read.
//!
//! Every column of a type the device scan takes decodes on the host (the
//! device scan's CPU twin, which CI runs) to arrow-rs's values and validity,
//! file by file and over each table's files together. Semi / anti / mark joins
//! and set operations over the tables give DataFusion's answers (the ALL forms:
//! setfusion's host scan's exact multiset answers) with the device scan; where
//! a GPU is usable, EXPLAIN ANALYZE shows the device read the inputs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int32Array, Int64Array, ListArray, RecordBatch, StructArray};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::arrow_writer::compute_leaves;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use setfusion::scan::{scan_to_host, supported_type, ScanFile};

use crate::common::{block_on, explain, gpu_or_skip, rows};

/// tpchgen's scale factor: 15,000 orders, 1,500 customers, ~60,000 line items.
const SF: f64 = 0.01;

/// One table of tpchgen as one batch.
fn generated(table: &str) -> RecordBatch {
    use tpchgen::generators as g;
    use tpchgen_arrow as a;
    let batches: Result<Vec<RecordBatch>, _> = match table {
        "orders" => a::OrderArrow::new(g::OrderGenerator::new(SF, 1, 1)).collect(),
        "customer" => a::CustomerArrow::new(g::CustomerGenerator::new(SF, 1, 1)).collect(),
        _ => a::LineItemArrow::new(g::LineItemGenerator::new(SF, 1, 1)).collect(),
    };
    let batches = batches.unwrap();
    datafusion::arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap()
}

/// `batch` with column `name` made nullable and NULL where `null_at` says.
fn with_nulls(batch: &RecordBatch, name: &str, null_at: impl Fn(usize) -> bool) -> RecordBatch {
    let i = batch.schema().index_of(name).unwrap();
    let null: datafusion::arrow::array::BooleanArray = (0..batch.num_rows()).map(|r| Some(null_at(r))).collect();
    let nulls = datafusion::arrow::compute::nullif(batch.column(i), &null).unwrap();
    let mut fields: Vec<Field> = batch.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    fields[i] = fields[i].clone().with_nullable(true);
    let mut columns = batch.columns().to_vec();
    columns[i] = nulls;
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

/// `batch` with two nested columns appended: `tags`, a list of two of the
/// first column's values, and `info`, a struct of one INT.
fn with_nested(batch: &RecordBatch) -> RecordBatch {
    let n = batch.num_rows();
    let first = datafusion::arrow::compute::cast(batch.column(0), &DataType::Int64).unwrap();
    let first = first.as_primitive::<Int64Type>();
    let values = Int64Array::from_iter_values((0..n).flat_map(|r| [first.value(r) % 10, first.value(r) % 7]));
    let item = Arc::new(Field::new("item", DataType::Int64, true));
    let tags =
        ListArray::new(item.clone(), OffsetBuffer::from_lengths(std::iter::repeat_n(2, n)), Arc::new(values), None);
    let prio = Field::new("prio", DataType::Int32, true);
    let info = StructArray::new(
        vec![prio.clone()].into(),
        vec![Arc::new(Int32Array::from_iter_values((0..n as i32).map(|r| r % 5))) as ArrayRef],
        None,
    );
    let mut fields: Vec<Field> = batch.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new("tags", DataType::List(item), false));
    fields.push(Field::new("info", DataType::Struct(vec![prio].into()), false));
    let mut columns = batch.columns().to_vec();
    columns.push(Arc::new(tags));
    columns.push(Arc::new(info));
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

/// The writer options of a table's file `f`: they rotate so that each table
/// has dictionary, fallen-back and PLAIN chunks, v1 and v2 pages, three codecs,
/// and files with and without a page index.
fn props(f: usize, page_rows: usize, row_group_rows: usize) -> WriterProperties {
    let mut p = WriterProperties::builder()
        .set_dictionary_enabled(f % 3 != 2)
        // A dictionary page limit this small falls back to PLAIN within the first pages.
        .set_dictionary_page_size_limit(if f % 3 == 1 { 256 } else { 1 << 20 })
        .set_writer_version(if f % 2 == 1 { WriterVersion::PARQUET_2_0 } else { WriterVersion::PARQUET_1_0 })
        .set_compression(match f % 3 {
            0 => Compression::SNAPPY,
            1 => Compression::ZSTD(ZstdLevel::default()),
            _ => Compression::UNCOMPRESSED,
        })
        .set_data_page_row_count_limit(page_rows)
        .set_write_batch_size(page_rows.min(1024))
        .set_max_row_group_row_count(Some(row_group_rows));
    if f % 2 == 1 {
        p = p.set_statistics_enabled(EnabledStatistics::Chunk).set_offset_index_disabled(true);
    }
    p.build()
}

/// Write `batch` as `files` files under `dir` (rows split evenly, the options
/// of [`props`]), an empty row group in the middle of the second file, and an
/// empty file (no row group) after them.
fn write_table(dir: &Path, batch: &RecordBatch, files: usize, page_rows: usize, row_group_rows: usize) {
    std::fs::create_dir_all(dir).unwrap();
    let per = batch.num_rows().div_ceil(files);
    for f in 0..files {
        let rows = batch.slice(f * per, per.min(batch.num_rows() - f * per));
        let file = std::fs::File::create(dir.join(format!("part-{f}.parquet"))).unwrap();
        let mut w = ArrowWriter::try_new(file, batch.schema(), Some(props(f, page_rows, row_group_rows))).unwrap();
        if f != 1 {
            w.write(&rows).unwrap();
            w.close().unwrap();
            continue;
        }
        // Half the rows, an empty row group, then the other half as one more row group.
        let half = rows.num_rows() / 2;
        w.write(&rows.slice(0, half)).unwrap();
        let (mut file, factory) = w.into_serialized_writer().unwrap();
        for part in [rows.slice(half, 0), rows.slice(half, rows.num_rows() - half)] {
            let index = file.flushed_row_groups().len();
            let mut writers = factory.create_column_writers(index).unwrap();
            let mut next = writers.iter_mut();
            for (field, column) in part.schema().fields().iter().zip(part.columns()) {
                for leaf in compute_leaves(field, column).unwrap() {
                    next.next().unwrap().write(&leaf).unwrap();
                }
            }
            let mut group = file.next_row_group().unwrap();
            for w in writers {
                w.close().unwrap().append_to_row_group(&mut group).unwrap();
            }
            group.close().unwrap();
        }
        file.close().unwrap();
    }
    let empty = std::fs::File::create(dir.join(format!("part-{files}.parquet"))).unwrap();
    ArrowWriter::try_new(empty, batch.schema(), Some(props(0, page_rows, row_group_rows))).unwrap().close().unwrap();
}

/// The three tables under a folder of this process, written once.
fn data() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("setfusion-device-scan-tpch-{}", std::process::id()));
        // Orders: o_custkey NULL for one order in 13, for rows 2,400..3,600 (whole pages of
        // 300 rows), and for every row of the second row group of the first file (rows 2,000..4,000).
        let orders = with_nulls(&generated("orders"), "o_custkey", |r| {
            r % 13 == 0 || (2_400..3_600).contains(&r) || (2_000..4_000).contains(&r)
        });
        write_table(&dir.join("orders"), &with_nested(&orders), 3, 300, 2_000);
        let customer = with_nulls(&generated("customer"), "c_custkey", |r| r % 17 == 5);
        write_table(&dir.join("customer"), &with_nested(&customer), 2, 200, 500);
        let lineitem = with_nulls(&generated("lineitem"), "l_suppkey", |r| r % 19 == 3 || (7_000..8_000).contains(&r));
        write_table(&dir.join("lineitem"), &with_nested(&lineitem), 3, 1_000, 8_000);
        dir
    })
    .clone()
}

/// arrow-rs's values of a column of `files` as the scan keys them (the host's
/// exact key encoding, `keys::encode`) and each row's validity.
fn arrow_column(files: &[PathBuf], column: &str) -> (Vec<u64>, Vec<bool>) {
    let mut batches: Vec<Vec<ArrayRef>> = Vec::new();
    for path in files {
        let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path).unwrap()).unwrap().build();
        for batch in reader.unwrap() {
            batches.push(vec![batch.unwrap().column_by_name(column).unwrap().clone()]);
        }
    }
    let Some(t) = batches.first().map(|b| b[0].data_type().clone()) else { return Default::default() };
    let keys = setfusion::keys::encode(&batches, &[t], None, true).unwrap();
    let valid = (0..keys.len()).map(|i| !keys.is_null(i)).collect();
    (keys.iter().collect(), valid)
}

/// The table's files, in name order (the empty one last).
fn files_of(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files
}

/// The host decoder (the device scan's CPU twin) gives arrow-rs's values of
/// every column it takes, for each file alone and for each table's files
/// together; the nested columns beside them are not read, and nothing falls back.
#[test]
fn tpchgen_files_in_every_shape_decode_as_arrow_reads_them() {
    let dir = data();
    let mut decoded = 0;
    for table in ["orders", "customer", "lineitem"] {
        let files = files_of(&dir.join(table));
        assert_eq!(files.len(), if table == "customer" { 3 } else { 4 }, "{table}");
        let schema =
            ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&files[0]).unwrap()).unwrap().schema().clone();
        for field in schema.fields().iter().filter(|f| supported_type(f.data_type())) {
            let sets: Vec<Vec<PathBuf>> =
                files.iter().map(|f| vec![f.clone()]).chain(std::iter::once(files.clone())).collect();
            for set in sets {
                let scan: Vec<ScanFile> = set.iter().map(|p| ScanFile { path: p.clone(), ranges: vec![] }).collect();
                let what = format!("{table}.{} over {set:?}", field.name());
                let got = scan_to_host(&scan, field.name(), field.data_type())
                    .unwrap_or_else(|e| panic!("{what}: {e}"))
                    .unwrap_or_else(|f| panic!("{what} falls back: {f}"));
                let (keys, valid) = arrow_column(&set, field.name());
                assert_eq!(got.keys.len(), keys.len(), "{what}: rows");
                for (r, (&ok, &want)) in valid.iter().zip(&keys).enumerate() {
                    let bit = got.valid.as_ref().is_none_or(|w| w[r / 32] >> (r % 32) & 1 == 1);
                    assert_eq!(bit, ok, "{what}: row {r} validity");
                    assert!(!ok || got.keys[r] == want, "{what}: row {r}: {} against {}", got.keys[r], want);
                }
                decoded += 1;
            }
        }
    }
    // orders: 5 columns of types the scan takes, customer 3, lineitem 11 (each over its files alone and together).
    assert!(decoded >= 60, "only {decoded} column scans decoded");
}

async fn session(dir: &Path, setfusion: bool, settings: &[&str]) -> SessionContext {
    let config = SessionConfig::new().with_target_partitions(4);
    let ctx = if setfusion { setfusion::context_with_config(config) } else { SessionContext::new_with_config(config) };
    for s in settings {
        ctx.sql(s).await.unwrap().collect().await.unwrap();
    }
    for t in ["orders", "customer", "lineitem"] {
        ctx.register_parquet(t, dir.join(t).to_str().unwrap(), ParquetReadOptions::default()).await.unwrap();
    }
    ctx
}

/// Queries DataFusion answers rightly.
const QUERIES: &[&str] = &[
    "SELECT count(*) FROM orders WHERE o_custkey IN (SELECT c_custkey FROM customer)",
    "SELECT count(*) FROM orders WHERE o_custkey NOT IN (SELECT c_custkey FROM customer WHERE c_custkey IS NOT NULL)",
    "SELECT count(*) FROM orders WHERE o_custkey NOT IN (SELECT c_custkey FROM customer)",
    "SELECT o_orderkey, o_orderdate, o_shippriority FROM orders \
     WHERE o_orderkey IN (SELECT l_orderkey FROM lineitem WHERE l_suppkey < 20)",
    "SELECT count(*), sum(o_totalprice) FROM orders WHERE o_orderdate >= DATE '1995-01-01' \
     AND NOT EXISTS (SELECT 1 FROM lineitem WHERE l_orderkey = o_orderkey AND l_quantity > 45)",
    "SELECT count(*) FROM (SELECT o_custkey FROM orders INTERSECT SELECT c_custkey FROM customer)",
    "SELECT count(*) FROM (SELECT c_custkey FROM customer EXCEPT SELECT o_custkey FROM orders)",
    "SELECT count(*) FROM orders WHERE o_orderdate IN (SELECT l_shipdate FROM lineitem WHERE l_suppkey IS NULL)",
    "SELECT count(*) FROM (SELECT o_totalprice FROM orders INTERSECT SELECT o_totalprice FROM orders WHERE o_custkey IS NULL)",
    "SELECT count(*) FROM orders WHERE o_clerk IN (SELECT o_clerk FROM orders WHERE o_custkey IS NULL)",
    "SELECT l_suppkey, count(*) FROM lineitem WHERE l_suppkey NOT IN (SELECT c_custkey FROM customer WHERE c_custkey IS NOT NULL) \
     GROUP BY l_suppkey",
];

/// The ALL forms and marks, which DataFusion answers wrongly: compared with setfusion's host scan.
const EXACT_QUERIES: &[&str] = &[
    "SELECT o_custkey FROM orders INTERSECT ALL SELECT c_custkey FROM customer",
    "SELECT count(*) FROM (SELECT o_custkey FROM orders EXCEPT ALL SELECT c_custkey FROM customer)",
    "SELECT count(*) FROM (SELECT l_suppkey FROM lineitem EXCEPT ALL SELECT o_custkey FROM orders WHERE o_orderkey < 30000)",
    "SELECT count(*) FROM orders WHERE o_custkey NOT IN (SELECT c_custkey FROM customer) OR o_orderkey < 1000",
    "SELECT count(*), sum(o_totalprice) FROM orders WHERE o_custkey IN (SELECT c_custkey FROM customer WHERE c_acctbal > 0) \
     OR o_shippriority > 0",
];

/// Semi / anti / mark joins and set operations over the shaped files: the
/// device scan gives DataFusion's answers (the exact ones where DataFusion's
/// are wrong), and where a GPU is usable it read the inputs itself.
#[test]
fn tpchgen_files_in_every_shape_answer_through_the_device_scan() {
    let _device = crate::common::shared_device();
    let gpu = gpu_or_skip().is_ok();
    let dir = data();
    block_on(move || async move {
        let plain = session(&dir, false, &[]).await;
        let device = session(&dir, true, &["SET setfusion.min_rows = 0", "SET setfusion.cache_limit = 0"]).await;
        let host = session(&dir, true, &["SET setfusion.min_rows = 0", "SET setfusion.device_scan = false"]).await;
        for sql in QUERIES {
            let want = rows(&plain, sql).await;
            assert_eq!(rows(&host, sql).await, want, "host scan: {sql}");
            assert_eq!(rows(&device, sql).await, want, "device scan: {sql}");
        }
        for sql in EXACT_QUERIES {
            let want = rows(&host, sql).await;
            assert!(!want.is_empty(), "{sql}");
            assert_eq!(rows(&device, sql).await, want, "device scan: {sql}");
        }
        if gpu {
            // Integer, date and decimal keys over every shape: read by the device, nothing falls back.
            for sql in [QUERIES[0], QUERIES[5], QUERIES[7], QUERIES[8], EXACT_QUERIES[0]] {
                let analyzed = explain(&device, sql, true).await;
                assert!(analyzed.contains("DeviceScanExec") && analyzed.contains("device scan"), "{analyzed}");
                assert!(!analyzed.contains("fell back"), "{analyzed}");
            }
        }
    });
}
