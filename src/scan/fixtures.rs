//! Parquet files written by arrow-rs with the writer options the device scan
//! meets (dictionary on, off and falling back to PLAIN mid-chunk;
//! DELTA_BINARY_PACKED; data pages v1 and v2; snappy and uncompressed; small
//! and large pages; no, some and only NULLs; several row groups; the page
//! index written or not; INT32 /
//! INT64 / DATE32 / DECIMAL(12, 2) and DECIMAL(9, 2); BOOLEAN, PLAIN and RLE; strings and binary
//! (BYTE_ARRAY: empty, short and long values, PLAIN and dictionary); random values, values
//! whose deltas wrap, constant columns and arithmetic sequences), for the
//! decoder's tests and `doctor`'s self-check.

use std::path::PathBuf;
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BinaryArray, BooleanArray, Date32Array, Decimal128Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::error::{DataFusionError, Result};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding};
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::schema::types::ColumnPath;

use super::pages::{page_table, plan_scan, read_chunks, PageTable, ScanFile};

/// One file's recipe.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: String,
    pub data_type: DataType,
    pub rows: usize,
    /// Percent of NULL rows (100: all NULL); 0 writes a required column.
    pub nulls: u32,
    /// Distinct values (small: dictionary-friendly).
    pub distinct: u64,
    pub dictionary: bool,
    /// A dictionary page limit small enough to fall back to PLAIN mid-chunk.
    pub dict_fallback: bool,
    pub v2: bool,
    /// SNAPPY and UNCOMPRESSED are decoded on the device; ZSTD, LZ4_RAW and
    /// GZIP pages are decompressed on the host first.
    pub codec: Compression,
    /// Rows per data page (the writer's row count limit).
    pub page_rows: usize,
    pub row_group_rows: usize,
    /// Values repeat with this period of rows (0: never), so a snappy page
    /// holds copies from that far back.
    pub period: usize,
    /// Data pages DELTA_BINARY_PACKED (`dictionary` off), not PLAIN.
    pub delta: bool,
    /// BOOLEAN data pages RLE, not PLAIN.
    pub rle: bool,
    pub pattern: Pattern,
    /// The writer's page index (column and offset indexes, page statistics);
    /// false writes chunk statistics alone and no offset index.
    pub page_index: bool,
}

/// How a case's values are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Random in a range of `distinct` values around 0.
    Random,
    /// The type's extremes (i64::MIN / MAX, i32::MIN / MAX, 0, -1) among
    /// small random values, so DELTA's deltas wrap.
    Extremes,
    /// -12345 + i * step, wrapping (step 0: a constant column); DELTA writes
    /// such pages with bit width 0.
    Sequence(i64),
}

/// The cases: every writer option against each other on rotating types.
pub fn cases() -> Vec<Case> {
    let types = [DataType::Int64, DataType::Int32, DataType::Date32, DataType::Decimal128(12, 2)];
    let mut out = Vec::new();
    let mut i = 0;
    for (dictionary, dict_fallback) in [(true, false), (false, false), (true, true)] {
        for v2 in [false, true] {
            for codec in [Compression::SNAPPY, Compression::UNCOMPRESSED] {
                for nulls in [0u32, 30, 100] {
                    let data_type = types[i % types.len()].clone();
                    let page_rows = [64, 1000, 20_000][i % 3];
                    let distinct = if dict_fallback { 1 << 40 } else { [7, 1000, 1 << 40][i % 3] };
                    out.push(Case {
                        name: format!("{data_type} dict={dictionary} fallback={dict_fallback} v2={v2} codec={codec} nulls={nulls}% page_rows={page_rows} page_index={}", i % 2 == 0),
                        data_type,
                        rows: 3000 + 917 * (i % 5),
                        nulls,
                        distinct,
                        dictionary,
                        dict_fallback,
                        v2,
                        codec,
                        page_rows,
                        row_group_rows: [1 << 20, 1500, 4096][i % 3],
                        period: 0,
                        delta: false,
                        rle: false,
                        pattern: Pattern::Random,
                        page_index: i % 2 == 0,
                    });
                    i += 1;
                }
            }
        }
    }
    // Snappy pages of one large page each: copies from further back than the
    // device decompressor's 16 KiB shared-memory ring (values repeating every
    // 3000 INT64 rows = 24,000 bytes), copies inside it (INT32 every 1500 rows),
    // and long self-overlapping copies (one value throughout).
    for (data_type, nulls, distinct, v2, period) in [
        (DataType::Int64, 0, 1 << 40, false, 3000),
        (DataType::Int32, 30, 1 << 40, true, 1500),
        (DataType::Int64, 30, 1, false, 0),
    ] {
        out.push(Case {
            name: format!("{data_type} snappy one page nulls={nulls}% distinct={distinct} period={period}"),
            data_type,
            rows: 40_000,
            nulls,
            distinct,
            dictionary: false,
            dict_fallback: false,
            v2,
            codec: Compression::SNAPPY,
            page_rows: 40_000,
            row_group_rows: 1 << 20,
            period,
            delta: false,
            rle: false,
            pattern: Pattern::Random,
            page_index: true,
        });
    }
    // The codecs decompressed on the host, on dictionary / PLAIN, v1 / v2 pages with NULLs.
    for (j, codec) in
        [Compression::ZSTD(Default::default()), Compression::LZ4_RAW, Compression::GZIP(Default::default())]
            .into_iter()
            .enumerate()
    {
        for (dictionary, v2) in [(true, false), (false, true)] {
            let data_type = types[(j + v2 as usize) % types.len()].clone();
            out.push(Case {
                name: format!("{data_type} dict={dictionary} v2={v2} codec={codec} nulls=30%"),
                data_type,
                rows: 5000,
                nulls: 30,
                distinct: if dictionary { 1000 } else { 1 << 40 },
                dictionary,
                dict_fallback: false,
                v2,
                codec,
                page_rows: 1000,
                row_group_rows: 4096,
                period: 0,
                delta: false,
                rle: false,
                pattern: Pattern::Random,
                page_index: !v2,
            });
        }
    }
    // DELTA_BINARY_PACKED: every type (DECIMAL(9, 2) is INT32, DECIMAL(12, 2)
    // INT64), v1 and v2, small pages (fewer values than a 128-value block) and
    // large ones (more miniblocks than the kernel parses in one batch),
    // wrapping deltas, bit width 0, NULLs, several row groups.
    let dec32 = DataType::Decimal128(9, 2);
    let dec64 = DataType::Decimal128(12, 2);
    for (data_type, nulls, v2, codec, page_rows, row_group_rows, pattern, distinct) in [
        (DataType::Int64, 0, false, Compression::SNAPPY, 20_000, 1 << 20, Pattern::Random, 1u64 << 40),
        (DataType::Int64, 30, true, Compression::UNCOMPRESSED, 1000, 4096, Pattern::Extremes, 1000),
        (DataType::Int64, 0, false, Compression::UNCOMPRESSED, 64, 1500, Pattern::Extremes, 1 << 20),
        (DataType::Int32, 0, true, Compression::SNAPPY, 64, 1500, Pattern::Extremes, 1000),
        (DataType::Int32, 30, false, Compression::UNCOMPRESSED, 20_000, 1 << 20, Pattern::Extremes, 1 << 40),
        (DataType::Int32, 30, true, Compression::SNAPPY, 1000, 4096, Pattern::Random, 1000),
        (DataType::Date32, 30, false, Compression::SNAPPY, 1000, 4096, Pattern::Random, 1 << 40),
        (DataType::Date32, 0, true, Compression::UNCOMPRESSED, 20_000, 1 << 20, Pattern::Sequence(1), 0),
        (dec32.clone(), 0, false, Compression::SNAPPY, 1000, 1500, Pattern::Random, 1 << 40),
        (dec32, 30, true, Compression::UNCOMPRESSED, 64, 4096, Pattern::Extremes, 1 << 40),
        (dec64.clone(), 30, false, Compression::UNCOMPRESSED, 20_000, 1 << 20, Pattern::Random, 1 << 40),
        (dec64, 0, true, Compression::SNAPPY, 1000, 1500, Pattern::Extremes, 1000),
        (DataType::Int64, 0, false, Compression::SNAPPY, 1000, 4096, Pattern::Sequence(0), 0),
        (DataType::Int32, 30, true, Compression::UNCOMPRESSED, 1000, 1500, Pattern::Sequence(0), 0),
        (DataType::Int64, 30, true, Compression::SNAPPY, 20_000, 1 << 20, Pattern::Sequence(i64::MAX / 3), 0),
        (DataType::Int32, 0, false, Compression::UNCOMPRESSED, 1000, 4096, Pattern::Sequence(-7), 0),
        (DataType::Int64, 100, false, Compression::SNAPPY, 1000, 1500, Pattern::Random, 1000),
        (DataType::Int32, 100, true, Compression::UNCOMPRESSED, 64, 4096, Pattern::Random, 1000),
    ] {
        let i = out.len();
        out.push(Case {
            name: format!("{data_type} delta v2={v2} codec={codec} nulls={nulls}% page_rows={page_rows} row_group_rows={row_group_rows} {pattern:?}"),
            data_type,
            rows: 3000 + 10_007 * (i % 5),
            nulls,
            distinct: distinct.max(1),
            dictionary: false,
            dict_fallback: false,
            v2,
            codec,
            page_rows,
            row_group_rows,
            period: 0,
            delta: true,
            rle: false,
            pattern,
            page_index: i % 2 == 0,
        });
    }
    // BOOLEAN (filter columns): PLAIN (bit-packed) and RLE pages, v1 and v2,
    // every codec family, small pages (not a whole byte of values) and large,
    // no, some and only NULLs, several row groups. (arrow-rs writes no
    // dictionary for booleans.)
    for (nulls, v2, rle, codec, page_rows, row_group_rows, distinct) in [
        (0, false, false, Compression::SNAPPY, 1000, 4096, 2u64),
        (30, false, false, Compression::UNCOMPRESSED, 61, 1500, 2),
        (30, true, false, Compression::SNAPPY, 20_000, 1 << 20, 2),
        (0, true, true, Compression::UNCOMPRESSED, 1000, 1500, 2),
        (30, true, true, Compression::SNAPPY, 61, 4096, 2),
        (30, false, true, Compression::ZSTD(Default::default()), 1000, 4096, 2),
        // Long runs of one value (RLE runs, not bit-packed groups).
        (0, false, true, Compression::SNAPPY, 20_000, 1 << 20, 1),
        (100, true, true, Compression::UNCOMPRESSED, 1000, 1500, 2),
        (100, false, false, Compression::SNAPPY, 1000, 4096, 2),
    ] {
        let i = out.len();
        out.push(Case {
            name: format!("Boolean rle={rle} v2={v2} codec={codec} nulls={nulls}% page_rows={page_rows} row_group_rows={row_group_rows} distinct={distinct}"),
            data_type: DataType::Boolean,
            rows: 3000 + 10_007 * (i % 3),
            nulls,
            distinct,
            dictionary: false,
            dict_fallback: false,
            v2,
            codec,
            page_rows,
            row_group_rows,
            period: 0,
            delta: false,
            rle,
            pattern: Pattern::Random,
            page_index: i % 2 == 1,
        });
    }
    // BYTE_ARRAY keys (strings, binary): dictionary (falling back to PLAIN
    // mid-chunk too) and PLAIN, v1 and v2, every codec family, small and large
    // pages, no, some and only NULLs; values from empty to 60 bytes (see [`column`]).
    for (j, (dictionary, dict_fallback, v2, codec, nulls, page_rows, distinct)) in [
        (true, false, false, Compression::SNAPPY, 0, 1000, 300u64),
        (true, false, true, Compression::UNCOMPRESSED, 30, 64, 1000),
        (false, false, false, Compression::UNCOMPRESSED, 30, 1000, 1 << 40),
        (false, false, true, Compression::SNAPPY, 0, 20_000, 1 << 40),
        (true, true, false, Compression::SNAPPY, 30, 1000, 1 << 40),
        (true, true, true, Compression::UNCOMPRESSED, 0, 1000, 1 << 40),
        (true, false, false, Compression::ZSTD(Default::default()), 30, 1000, 1000),
        (false, false, true, Compression::LZ4_RAW, 30, 1000, 1 << 40),
        (true, false, true, Compression::SNAPPY, 100, 1000, 1000),
        (false, false, false, Compression::SNAPPY, 100, 64, 1000),
    ]
    .into_iter()
    .enumerate()
    {
        let data_type = if j % 3 == 2 { DataType::Binary } else { DataType::Utf8 };
        out.push(Case {
            name: format!("{data_type} dict={dictionary} fallback={dict_fallback} v2={v2} codec={codec} nulls={nulls}% page_rows={page_rows}"),
            data_type,
            rows: 3000 + 4001 * (j % 3),
            nulls,
            distinct,
            dictionary,
            dict_fallback,
            v2,
            codec,
            page_rows,
            row_group_rows: [1 << 20, 1500, 4096][j % 3],
            period: 0,
            delta: false,
            rle: false,
            pattern: Pattern::Random,
            page_index: j % 2 == 0,
        });
    }
    out
}

/// A string fixture value: empty for one value in eleven, else 1 to 60
/// bytes (past the 8-byte words the hash reads, and past 12, Arrow's inline
/// view length), distinct for distinct `v`.
fn text(v: i64) -> String {
    let len = v.unsigned_abs() % 11;
    if len == 0 {
        return String::new();
    }
    format!("{v}{}", "abcdefghij".repeat(1 + (v.unsigned_abs() as usize / 11) % 5)).chars().take(60).collect()
}

/// The case's column (named `k`), deterministic.
pub fn column(c: &Case) -> ArrayRef {
    let mut x = crate::util::Xorshift64(0x9E37_79B9_7F4A_7C15 ^ c.rows as u64);
    let mut next = || x.next_u64();
    let mut vals: Vec<Option<i64>> = (0..c.rows)
        .map(|i| {
            let r = next();
            let random = (r % c.distinct) as i64 - (c.distinct / 2) as i64;
            let v = match c.pattern {
                Pattern::Random => random,
                // (INT32 takes the low 32 bits: i64::MIN and MAX are 0 and -1 there.)
                Pattern::Extremes => {
                    [i64::MIN, i64::MAX, i32::MIN as i64, i32::MAX as i64, random, random][(r >> 20) as usize % 6]
                }
                Pattern::Sequence(step) => (-12345i64).wrapping_add((i as i64).wrapping_mul(step)),
            };
            ((r >> 40) % 100 >= c.nulls as u64).then_some(v)
        })
        .collect();
    if c.period > 0 {
        for i in c.period..vals.len() {
            vals[i] = vals[i - c.period];
        }
    }
    match &c.data_type {
        DataType::Boolean => {
            Arc::new(BooleanArray::from(vals.iter().map(|v| v.map(|v| v & 1 == 1)).collect::<Vec<_>>()))
        }
        DataType::Int64 => Arc::new(Int64Array::from(vals)),
        DataType::Int32 => Arc::new(Int32Array::from(vals.iter().map(|v| v.map(|v| v as i32)).collect::<Vec<_>>())),
        DataType::Date32 => {
            Arc::new(Date32Array::from(vals.iter().map(|v| v.map(|v| (v % 100_000) as i32)).collect::<Vec<_>>()))
        }
        DataType::Decimal128(p, s) => Arc::new(
            Decimal128Array::from(
                vals.iter().map(|v| v.map(|v| (v % 10i64.pow(*p as u32 - 1)) as i128)).collect::<Vec<_>>(),
            )
            .with_precision_and_scale(*p, *s)
            .expect("valid decimal"),
        ),
        DataType::Utf8 => Arc::new(StringArray::from(vals.iter().map(|v| v.map(text)).collect::<Vec<_>>())),
        // Binary: the string's bytes with a byte no UTF-8 string holds.
        DataType::Binary => {
            let bytes: Vec<Option<Vec<u8>>> =
                vals.iter().map(|v| v.map(|v| [text(v).as_bytes(), &[0xff]].concat())).collect();
            Arc::new(BinaryArray::from(bytes.iter().map(|v| v.as_deref()).collect::<Vec<_>>()))
        }
        other => unreachable!("fixture type {other}"),
    }
}

/// The case written by arrow-rs, as file bytes.
pub fn write(c: &Case) -> Result<Vec<u8>> {
    let col = column(c);
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", c.data_type.clone(), c.nulls > 0),
        Field::new("other", DataType::Int32, true),
    ]));
    let other: ArrayRef =
        Arc::new(Int32Array::from((0..c.rows as i32).map(|i| (i % 3 > 0).then_some(i)).collect::<Vec<_>>()));
    let batch = RecordBatch::try_new(schema.clone(), vec![col, other])?;
    let mut props = WriterProperties::builder()
        .set_dictionary_enabled(c.dictionary)
        .set_writer_version(if c.v2 { WriterVersion::PARQUET_2_0 } else { WriterVersion::PARQUET_1_0 })
        .set_compression(c.codec)
        .set_data_page_row_count_limit(c.page_rows)
        .set_write_batch_size(c.page_rows.min(1024))
        .set_max_row_group_row_count(Some(c.row_group_rows))
        // v2 files otherwise take DELTA_BINARY_PACKED for integers without a dictionary: a case asks for it.
        .set_encoding(if c.delta { Encoding::DELTA_BINARY_PACKED } else { Encoding::PLAIN });
    if c.rle {
        props = props.set_column_encoding(ColumnPath::from("k"), Encoding::RLE);
    }
    if c.dict_fallback {
        props = props.set_dictionary_page_size_limit(512);
    }
    if !c.page_index {
        props = props.set_statistics_enabled(EnabledStatistics::Chunk).set_offset_index_disabled(true);
    }
    let mut buf = Vec::new();
    let mut w = ArrowWriter::try_new(&mut buf, schema, Some(props.build()))?;
    w.write(&batch)?;
    w.close()?;
    Ok(buf)
}

/// Write `batch` as one Parquet file at `path` with arrow-rs's writer under
/// `props` (the tests' files with writer options of their own).
pub fn write_file(path: &std::path::Path, batch: &RecordBatch, props: WriterProperties) -> Result<()> {
    let mut w = ArrowWriter::try_new(std::fs::File::create(path)?, batch.schema(), Some(props))?;
    w.write(batch)?;
    w.close()?;
    Ok(())
}

/// A file path for this process's fixture of `name`.
fn temp_path(tag: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("setfusion-pq-{tag}-{}-{n}.parquet", std::process::id()))
}

/// The case's raw chunk bytes and page table (the file is written to a temporary path and removed).
pub fn table_of(c: &Case) -> Result<(Vec<u8>, PageTable)> {
    let path = temp_path("fixture");
    std::fs::write(&path, write(c)?)?;
    let r = (|| {
        let plan = plan_scan(&[ScanFile { path: path.clone(), ranges: vec![] }], "k", &c.data_type)?
            .map_err(|f| DataFusionError::Internal(format!("fixture {} falls back: {f}", c.name)))?;
        let raw = read_chunks(&plan)?.into_vec();
        let table = page_table(&plan, &raw)?
            .map_err(|f| DataFusionError::Internal(format!("fixture {} falls back: {f}", c.name)))?;
        Ok((raw, table))
    })();
    let _ = std::fs::remove_file(&path);
    r
}
