//! The host decoder ([`crate::scan::scan_to_host`], the device scan's CPU
//! twin) against arrow-rs's reader on Parquet files written by other writers:
//! `tests/data/parquet/`, made once by pyarrow and DuckDB with
//! `scripts/make-parquet-fixtures.py` and committed (issue 27; the folder's
//! README lists what each file exercises).
//!
//! For every file and every top-level column whose Arrow type, as arrow-rs
//! reads it, the device scan takes ([`crate::scan::supported_type`]), the
//! decoder gives arrow-rs's row count, validity bits and values (keys compared
//! where valid); none falls back. In the files whose name says "delta" (pyarrow's
//! and DuckDB's DELTA_BINARY_PACKED integers), decoded columns hold DELTA
//! pages. Columns of other types
//! (VARCHAR, LIST) are not asked for, and the key column of a file with a
//! nested column beside it decodes (the nested column is skipped, not read).
//! Enough files and columns must decode that the test cannot pass by falling
//! back, and the decoded columns' pages must cover what the folder claims:
//! every codec, dictionary and PLAIN pages in v1 and v2 data pages,
//! DELTA_BINARY_PACKED v1 pages (DuckDB writes v1 page headers even with
//! PARQUET_VERSION v2), and a chunk whose dictionary fell back to PLAIN. Where a GPU is usable, every
//! decoded column is read again through the device scan
//! ([`crate::scan::scan_to_device`]) and must give the same keys.

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::PathBuf;

    use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Date32Type, Decimal128Type, Int32Type, Int64Type};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    use crate::scan::pages::{self, PageTable};
    use crate::scan::{scan_to_host, supported_type, Decoded, ScanFile};

    const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/parquet");
    /// At least this many files must decode some column, and this many columns in all
    /// (22 files and 110 columns, 4 of them DELTA_BINARY_PACKED, when written).
    const MIN_FILES_DECODED: usize = 22;
    const MIN_COLUMNS_DECODED: usize = 110;

    /// arrow-rs's values of one column (its arrays, batch by batch): the keys
    /// (the value sign-extended to 64 bits, 0 where NULL) and each row's validity.
    fn arrow_column(arrays: &[ArrayRef]) -> (Vec<u64>, Vec<bool>) {
        let (mut keys, mut valid) = (Vec::new(), Vec::new());
        for a in arrays {
            for i in 0..a.len() {
                let ok = a.is_valid(i);
                let key = if !ok {
                    0
                } else {
                    match a.data_type() {
                        DataType::Boolean => a.as_boolean().value(i) as u64,
                        DataType::Int64 => a.as_primitive::<Int64Type>().value(i) as u64,
                        DataType::Int32 => a.as_primitive::<Int32Type>().value(i) as i64 as u64,
                        DataType::Date32 => a.as_primitive::<Date32Type>().value(i) as i64 as u64,
                        DataType::Decimal128(..) => {
                            let v = a.as_primitive::<Decimal128Type>().value(i);
                            i64::try_from(v).expect("a decimal of at most 18 digits fits 64 bits") as u64
                        }
                        t => panic!("unexpected type {t}"),
                    }
                };
                keys.push(key);
                valid.push(ok);
            }
        }
        (keys, valid)
    }

    /// The decoder's output against arrow-rs's; Err: the first difference.
    fn compare(got: &Decoded, keys: &[u64], valid: &[bool]) -> Result<(), String> {
        let rows = keys.len();
        if got.keys.len() != rows {
            return Err(format!("{} rows decoded, arrow-rs reads {rows}", got.keys.len()));
        }
        match &got.valid {
            // A required column: no row may be NULL.
            None => {
                if let Some(r) = valid.iter().position(|v| !v) {
                    return Err(format!("no validity decoded, but arrow-rs reads row {r} as NULL"));
                }
            }
            Some(words) => {
                if words.len() != rows.div_ceil(32) {
                    return Err(format!("{} validity words for {rows} rows", words.len()));
                }
                for (r, &want) in valid.iter().enumerate() {
                    let bit = ((words[r / 32] >> (r % 32)) & 1) == 1;
                    if bit != want {
                        return Err(format!("row {r}: validity bit {bit}, arrow-rs {want}"));
                    }
                }
            }
        }
        for (r, ((&g, &w), &ok)) in got.keys.iter().zip(keys).zip(valid).enumerate() {
            if ok && g != w {
                return Err(format!("row {r}: key {} ({g:#x}), arrow-rs {} ({w:#x})", g as i64, w as i64));
            }
        }
        Ok(())
    }

    /// The scan's page table of one column (the column must not fall back).
    fn page_table_of(files: &[ScanFile], column: &str, arrow: &DataType) -> PageTable {
        let plan = pages::plan_scan(files, column, arrow).unwrap().unwrap();
        let raw = pages::read_chunks(&plan).unwrap();
        let table = pages::page_table(&plan, &raw).unwrap().unwrap();
        pages::give_back(raw);
        table
    }

    /// What the decoded columns' pages hold, over all files.
    #[derive(Default)]
    struct Coverage {
        /// (page kind, encoding, codec) of every page (encoding 0 for dictionary pages).
        kinds: BTreeSet<(u64, u64, u64)>,
        /// Chunks whose dictionary-encoded data pages are followed by PLAIN ones.
        dict_to_plain: usize,
        pages: usize,
    }

    impl Coverage {
        fn add(&mut self, t: &PageTable) {
            for p in &t.pages {
                let encoding = if p.kind == pages::KIND_DICT { 0 } else { p.encoding };
                self.kinds.insert((p.kind, encoding, p.codec));
            }
            self.pages += t.pages.len();
            // Pages of one chunk share its dictionary page (a chunk without one: NO_DICT, never a fallback).
            self.dict_to_plain += t
                .pages
                .windows(2)
                .filter(|w| {
                    w[0].kind != pages::KIND_DICT
                        && w[1].kind != pages::KIND_DICT
                        && w[0].encoding == pages::ENC_DICT
                        && w[1].encoding == pages::ENC_PLAIN
                        && w[0].dict == w[1].dict
                })
                .count();
        }
    }

    /// The host decoder equals arrow-rs's reader on every pyarrow and DuckDB
    /// fixture, DELTA_BINARY_PACKED columns included.
    #[test]
    fn host_decoder_matches_arrow_reader_on_foreign_files() {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(DIR)
            .unwrap_or_else(|e| panic!("{}: {e}", DIR))
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
            .collect();
        paths.sort();
        let (mut files_decoded, mut columns_decoded, mut rows_compared, mut beside_nested) = (0, 0, 0, 0);
        let mut delta_columns_decoded = 0;
        let mut coverage = Coverage::default();
        let gpu = crate::gpu::test_gpu();
        let _lease = gpu.as_ref().map(|g| g.lease(0));
        let mut device_columns = 0usize;
        for path in &paths {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let delta = name.contains("delta");
            let builder = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path).unwrap())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let schema = builder.schema().clone();
            let file_rows = builder.metadata().file_metadata().num_rows() as usize;
            let row_groups = builder.metadata().num_row_groups();
            let batches = builder
                .build()
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .collect::<Result<Vec<RecordBatch>, _>>()
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let scan = [ScanFile { path: path.clone(), ranges: vec![] }];
            let (mut decoded, mut skipped, mut delta_columns) = (Vec::new(), Vec::new(), Vec::new());
            for (ci, field) in schema.fields().iter().enumerate() {
                let column = field.name().as_str();
                let arrow_type = field.data_type();
                if !supported_type(arrow_type) {
                    skipped.push(format!("{column}: {arrow_type}"));
                    continue;
                }
                let arrays: Vec<ArrayRef> = batches.iter().map(|b| b.column(ci).clone()).collect();
                let (keys, valid) = arrow_column(&arrays);
                assert_eq!(keys.len(), file_rows, "{name} column {column}: arrow-rs's rows against the footer's");
                let result = scan_to_host(&scan, column, arrow_type);
                match result.unwrap_or_else(|e| panic!("{name} column {column}: {e}")) {
                    Ok(got) => {
                        if let Err(why) = compare(&got, &keys, &valid) {
                            panic!("{name} column {column} ({arrow_type}): {why}");
                        }
                        // The device decodes the same keys (read, inflated and decoded as a query would).
                        if let Some(gpu) = &gpu {
                            let mut stats = crate::gpu::TransferStats::default();
                            let d = crate::scan::scan_to_device(
                                gpu,
                                &scan,
                                column,
                                arrow_type,
                                &Default::default(),
                                0,
                                None,
                                &mut stats,
                            )
                            .unwrap_or_else(|e| panic!("{name} column {column} on the device: {e}"))
                            .unwrap_or_else(|f| panic!("{name} column {column} on the device: {}", f.0));
                            let dev = crate::scan::decode::download_decoded(gpu, &d.0, &mut stats).unwrap();
                            if let Err(why) = compare(&dev, &keys, &valid) {
                                panic!("{name} column {column} ({arrow_type}) on the device: {why}");
                            }
                            device_columns += 1;
                        }
                        let table = page_table_of(&scan, column, arrow_type);
                        if table.pages.iter().any(|p| p.kind != pages::KIND_DICT && p.encoding == pages::ENC_DELTA) {
                            delta_columns.push(column.to_string());
                        }
                        coverage.add(&table);
                        rows_compared += keys.len();
                        decoded.push(column.to_string());
                    }
                    Err(why) => panic!("{name} column {column} ({arrow_type}): unexpected fallback: {why}"),
                }
            }
            eprintln!(
                "{name}: {file_rows} rows, {row_groups} row groups; decoded {decoded:?} (DELTA pages: {delta_columns:?}); skipped {skipped:?}"
            );
            assert_eq!(delta, !delta_columns.is_empty(), "{name}: DELTA pages in {delta_columns:?}");
            delta_columns_decoded += delta_columns.len();
            // The key column reads past the nested (and string) columns beside it.
            let nested: Vec<&str> =
                schema.fields().iter().filter(|f| f.data_type().is_nested()).map(|f| f.name().as_str()).collect();
            if !nested.is_empty() && !delta {
                let k = schema.field_with_name("k").unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(k.data_type(), &DataType::Int64, "{name}");
                assert!(
                    decoded.iter().any(|c| c == "k"),
                    "{name}: k beside the nested column(s) {nested:?} did not decode"
                );
                beside_nested += 1;
            }
            files_decoded += (!decoded.is_empty()) as usize;
            columns_decoded += decoded.len();
        }
        eprintln!(
            "{} files: {files_decoded} decoded a column, {columns_decoded} columns and {rows_compared} rows compared, {} pages",
            paths.len(),
            coverage.pages
        );
        if gpu.is_some() {
            eprintln!("{device_columns} columns decoded on the device equal arrow-rs's");
            assert_eq!(device_columns, columns_decoded);
        }
        assert!(files_decoded >= MIN_FILES_DECODED, "only {files_decoded} files decoded (of {})", paths.len());
        assert!(columns_decoded >= MIN_COLUMNS_DECODED, "only {columns_decoded} columns decoded");
        assert!(beside_nested > 0, "no file has a nested column beside the key");
        // k and i of pyarrow's delta file, k and m of DuckDB's.
        assert!(delta_columns_decoded >= 4, "only {delta_columns_decoded} DELTA_BINARY_PACKED columns decoded");
        for (codec, what) in [
            (pages::CODEC_NONE, "UNCOMPRESSED"),
            (pages::CODEC_SNAPPY, "SNAPPY"),
            (pages::CODEC_ZSTD, "ZSTD"),
            (pages::CODEC_LZ4_RAW, "LZ4_RAW"),
            (pages::CODEC_GZIP, "GZIP"),
        ] {
            assert!(coverage.kinds.iter().any(|k| k.2 == codec), "no decoded {what} page");
        }
        for (kind, encoding, what) in [
            (pages::KIND_V1, pages::ENC_DICT, "v1 dictionary-encoded"),
            (pages::KIND_V1, pages::ENC_PLAIN, "v1 PLAIN"),
            (pages::KIND_V2, pages::ENC_DICT, "v2 dictionary-encoded"),
            (pages::KIND_V2, pages::ENC_PLAIN, "v2 PLAIN"),
            (pages::KIND_V1, pages::ENC_DELTA, "v1 DELTA_BINARY_PACKED"),
        ] {
            assert!(coverage.kinds.iter().any(|k| k.0 == kind && k.1 == encoding), "no decoded {what} page");
        }
        assert!(coverage.dict_to_plain > 0, "no decoded chunk fell back from dictionary to PLAIN");
    }
}
