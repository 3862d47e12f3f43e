//! The host side of the device scan: from Parquet files and one key column
//! to the raw bytes of its column chunks and one page table entry per page
//! ([`PqPage`], the contract of `kernels/parquet_decode.cu`).
//!
//! Footers are read with the parquet crate, and kept parsed while a file
//! stays as it is (`footer_cache`); every row group of the files is
//! read except those a [`Keep`] rules out: the other side's key range (for
//! the operators whose unmatched rows are dropped), and the row groups
//! DataFusion's pruning predicate for the input's filter rules out
//! ([`prune_row_groups`]: the row groups' statistics and bloom filters, as DataFusion's own
//! Parquet scan prunes them). Data pages may be PLAIN, dictionary-encoded or
//! DELTA_BINARY_PACKED (v1 and v2); BOOLEAN pages PLAIN or RLE. What the device cannot decode is reported
//! as a [`Fallback`] reason, never decoded wrongly (an encrypted file too:
//! its footer's magic says so, and DataFusion's scan is left to read it or
//! to say why it cannot).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_expr::PhysicalExprRef;
use parquet::basic::{Compression, LogicalType, Type as PhysicalType};
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};

use super::thrift::{self, read_page_header};
use crate::gpu::HostBytes;

/// A reason the device cannot scan this input; the host scan takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fallback(pub String);

impl std::fmt::Display for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn fallback<T>(why: impl Into<String>) -> Result<std::result::Result<T, Fallback>> {
    Ok(Err(Fallback(why.into())))
}

/// One page for the device: 16 u64 fields, in the order of the kernel's `PqPage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PqPage {
    pub src: u64,
    pub src_len: u64,
    pub dst: u64,
    pub dst_len: u64,
    pub levels_len: u64,
    pub def_len: u64,
    pub codec: u64,
    pub kind: u64,
    pub encoding: u64,
    pub num_values: u64,
    pub first_row: u64,
    pub dict: u64,
    pub def_max: u64,
    pub width: u64,
    pub lvl_word: u64,
    pub idx_off: u64,
}

/// `PqPage::kind` values.
pub const KIND_DICT: u64 = 0;
pub const KIND_V1: u64 = 1;
pub const KIND_V2: u64 = 2;
/// `PqPage::codec` values.
pub const CODEC_NONE: u64 = 0;
pub const CODEC_SNAPPY: u64 = 1;
/// Decompressed on the device (`kernels/zstd.cu`), or on host threads under
/// `SETFUSION_DEVICE_ZSTD=0` ([`inflated_on_host`]).
pub const CODEC_ZSTD: u64 = 2;
/// Codecs the device does not decompress: their pages are decompressed on
/// host threads before the upload ([`super::decode::inflate_part_on_host`]).
pub const CODEC_LZ4_RAW: u64 = 3;
pub const CODEC_GZIP: u64 = 4;

/// Are a codec's pages decompressed on host threads before the upload? The
/// device decompresses SNAPPY and ZSTD (the latter unless
/// `SETFUSION_DEVICE_ZSTD=0`); LZ4_RAW and GZIP go through the host.
pub fn inflated_on_host(codec: u64) -> bool {
    match codec {
        CODEC_NONE | CODEC_SNAPPY => false,
        CODEC_ZSTD => !crate::env::device_zstd(),
        _ => true,
    }
}

/// A footer's codec as the page table says it (None: one the scan does not read).
fn codec_of(c: Compression) -> Option<u64> {
    match c {
        Compression::UNCOMPRESSED => Some(CODEC_NONE),
        Compression::SNAPPY => Some(CODEC_SNAPPY),
        Compression::ZSTD(_) => Some(CODEC_ZSTD),
        Compression::LZ4_RAW => Some(CODEC_LZ4_RAW),
        Compression::GZIP(_) => Some(CODEC_GZIP),
        _ => None,
    }
}
/// `PqPage::encoding` values.
pub const ENC_PLAIN: u64 = 0;
pub const ENC_DICT: u64 = 1;
/// DELTA_BINARY_PACKED: the page's values are decoded into its index scratch
/// first, as u64 (two u32 entries a page value, from an even `idx_off`).
pub const ENC_DELTA: u64 = 2;
/// RLE booleans: a 4-byte length, then the RLE / bit-packed hybrid of bit
/// width 1, expanded into the page's index scratch (one u32 entry a value).
pub const ENC_RLE_BOOL: u64 = 3;
/// No dictionary page.
pub const NO_DICT: u64 = u64::MAX;
/// `PqPage::width` of BYTE_ARRAY columns (the kernel's `PQ_BYTES`): each
/// value's key is `keys::hash_bytes` of its bytes, and its span (where the
/// decoder left it on the device) is kept for the exact comparison.
pub const WIDTH_BYTES: u64 = 16;

impl PqPage {
    /// Words of an entry of the kernels' page table ([`PageTable::flat`]).
    pub const WORDS: usize = 16;

    pub fn fields(&self) -> [u64; Self::WORDS] {
        [
            self.src,
            self.src_len,
            self.dst,
            self.dst_len,
            self.levels_len,
            self.def_len,
            self.codec,
            self.kind,
            self.encoding,
            self.num_values,
            self.first_row,
            self.dict,
            self.def_max,
            self.width,
            self.lvl_word,
            self.idx_off,
        ]
    }
    pub fn from_fields(f: &[u64]) -> Self {
        PqPage {
            src: f[0],
            src_len: f[1],
            dst: f[2],
            dst_len: f[3],
            levels_len: f[4],
            def_len: f[5],
            codec: f[6],
            kind: f[7],
            encoding: f[8],
            num_values: f[9],
            first_row: f[10],
            dict: f[11],
            def_max: f[12],
            width: f[13],
            lvl_word: f[14],
            idx_off: f[15],
        }
    }
}

/// One file of the scan: its path and the byte ranges DataFusion assigned
/// (empty: the whole file). The ranges of one file must cover it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanFile {
    pub path: PathBuf,
    pub ranges: Vec<(u64, u64)>,
}

/// Which row groups of a scan's files are read (the default: all of them).
/// Every column of one input is read with the same `Keep`, so their rows
/// stay aligned.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Keep {
    /// Only the row groups whose statistics of the key column show a NULL
    /// or a value in its range; every column read with this `Keep` is
    /// pruned by the key's statistics, so payload columns stay aligned.
    pub key_range: Option<KeyRange>,
    /// Per file (in the scan's order), whether each row group may hold a row
    /// the input's filter keeps ([`prune_row_groups`]); None: every one may.
    pub row_groups: Option<Arc<Vec<Vec<bool>>>>,
    /// Within the row groups read, the rows the page index leaves
    /// ([`prune_row_groups`]); None: every row. Each column reads only the
    /// data pages that hold one of them, and the rows outside them are
    /// dropped by the filter (their values in the decoded columns are
    /// undefined: [`RowSelections::mask`]).
    pub rows: Option<Arc<RowSelections>>,
}

/// A key column and the range of keys a row group must be able to hold
/// (signed 64-bit key values, both ends included) to be read.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeyRange {
    pub column: String,
    pub lo: i64,
    pub hi: i64,
}

impl KeyRange {
    /// May row group `rg` hold a key in the range, or a NULL? `ci`: the key
    /// column's index in its file (None: not there, so it may). Without
    /// statistics, or with a NULL count that is not 0, it may.
    fn may_hold_key(&self, rg: &parquet::file::metadata::RowGroupMetaData, ci: Option<usize>) -> bool {
        match ci.and_then(|ci| int_stats(rg, ci)) {
            Some((min, max, Some(0))) => !(max < self.lo || min > self.hi),
            _ => true,
        }
    }
}

/// The rows of each row group the page index leaves, per file (in the
/// scan's order): the row group's row count, and its selected row ranges
/// `[start, end)` (None: all its rows).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct RowSelections(pub Vec<Vec<(u64, Option<Vec<(u64, u64)>>)>>);

impl RowSelections {
    /// The ranges of row group `rg` of file `file` (None: every row).
    fn of(&self, file: usize, rg: usize) -> Option<&[(u64, u64)]> {
        self.0.get(file)?.get(rg)?.1.as_deref()
    }

    /// The selected rows as bits (LSB first, 32-bit words) over the rows of
    /// the row groups `row_groups` leaves (all: None), in the scan's order:
    /// the rows a device-decoded column of that `Keep` holds.
    pub fn mask(&self, row_groups: Option<&Vec<Vec<bool>>>) -> Vec<u32> {
        let mut bits: Vec<u32> = Vec::new();
        let mut at = 0u64;
        // Rows [from, to): bit by bit up to a word boundary, then whole words (a
        // selection of most of 100M rows would otherwise cost 100M bit sets).
        let set = |bits: &mut Vec<u32>, from: u64, to: u64| {
            let need = to.div_ceil(32) as usize;
            if bits.len() < need {
                bits.resize(need, 0);
            }
            let mut r = from;
            while r < to && r % 32 != 0 {
                bits[(r / 32) as usize] |= 1 << (r % 32);
                r += 1;
            }
            while r + 32 <= to {
                bits[(r / 32) as usize] = u32::MAX;
                r += 32;
            }
            while r < to {
                bits[(r / 32) as usize] |= 1 << (r % 32);
                r += 1;
            }
        };
        for (f, groups) in self.0.iter().enumerate() {
            for (g, (rows, ranges)) in groups.iter().enumerate() {
                if row_groups.is_some_and(|k| k.get(f).and_then(|l| l.get(g)) == Some(&false)) {
                    continue;
                }
                match ranges {
                    None => set(&mut bits, at, at + rows),
                    Some(ranges) => ranges.iter().for_each(|&(a, b)| set(&mut bits, at + a, at + b.min(*rows))),
                }
                at += rows;
            }
        }
        bits.resize(at.div_ceil(32) as usize, 0);
        bits
    }
}

impl Keep {
    /// Only the row groups whose statistics of the key `column` show it may
    /// hold a key in `range` (None: all).
    pub fn key_range(column: &str, range: Option<(i64, i64)>) -> Self {
        let key_range = range.map(|(lo, hi)| KeyRange { column: column.to_string(), lo, hi });
        Keep { key_range, row_groups: None, rows: None }
    }

    /// Late materialization: this `Keep` narrowed to the blocks of rows
    /// `kept` marks (`block` rows each, over the rows this `Keep` leaves, in
    /// the scan's order), so a column read with it reads only the data pages
    /// that hold a row of such a block. The rows stay where they were (a
    /// column read with either `Keep` has the same rows), but the values of
    /// rows outside the marked blocks are undefined. None when nothing would
    /// be left out, or when a footer no longer matches this `Keep`.
    pub fn narrowed_to_blocks(&self, files: &[ScanFile], block: u64, kept: &[bool]) -> Result<Option<Keep>> {
        let footers = crate::host::par_map(files, 1, |f| read_footer(&f.path))?;
        let mut at = 0u64;
        let mut narrowed = false;
        let mut selections = Vec::with_capacity(files.len());
        for (fi, meta) in footers.iter().enumerate() {
            let schema = meta.file_metadata().schema_descr();
            let key_ci = self.key_range.as_ref().and_then(|k| column_index(schema, &k.column));
            let listed = self.row_groups.as_ref().map(|k| k.get(fi).map(Vec::as_slice).unwrap_or_default());
            if listed.is_some_and(|l| l.len() != meta.row_groups().len()) {
                return Ok(None);
            }
            let mut groups = Vec::with_capacity(meta.row_groups().len());
            for (rgi, rg) in meta.row_groups().iter().enumerate() {
                let n = rg.num_rows().max(0) as u64;
                let read = !listed.is_some_and(|l| !l[rgi])
                    && !self.key_range.as_ref().is_some_and(|k| !k.may_hold_key(rg, key_ci));
                if !read || n == 0 {
                    groups.push((n, None));
                    continue;
                }
                // The marked blocks over this row group's rows [at, at + n), as its own row ranges.
                let mut ranges: Vec<(u64, u64)> = Vec::new();
                for b in at / block..(at + n).div_ceil(block) {
                    if !kept.get(b as usize).copied().unwrap_or(true) {
                        continue;
                    }
                    let (lo, hi) = ((b * block).max(at) - at, ((b + 1) * block).min(at + n) - at);
                    match ranges.last_mut() {
                        Some(last) if last.1 == lo => last.1 = hi,
                        _ => ranges.push((lo, hi)),
                    }
                }
                // Within the page index's selection, where there is one (the rows outside it are never kept).
                if let Some(before) = self.rows.as_ref().and_then(|r| r.of(fi, rgi)) {
                    ranges = intersect_ranges(&ranges, before);
                }
                // A row group without a kept row still reads one page (every
                // chunk the decode walks holds a page).
                if ranges.is_empty() {
                    ranges.push((0, 1));
                }
                let all = ranges == [(0, n)];
                narrowed |= !all;
                groups.push((n, (!all).then_some(ranges)));
                at += n;
            }
            selections.push(groups);
        }
        Ok(narrowed.then(|| Keep {
            key_range: self.key_range.clone(),
            row_groups: self.row_groups.clone(),
            rows: Some(Arc::new(RowSelections(selections))),
        }))
    }
}

/// Decompressed page bytes of a scan's columns that are slow to inflate
/// ([`inflated_bytes`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InflatedBytes {
    /// Inflated on host threads before the selection can start
    /// ([`inflated_on_host`]: GZIP, LZ4_RAW and the like).
    pub host: u64,
    /// ZSTD pages the device decompresses (`kernels/zstd.cu`: one warp a
    /// page, slower than the snappy decoder).
    pub device_zstd: u64,
}

impl std::iter::Sum for InflatedBytes {
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        iter.fold(Self::default(), |a, b| Self { host: a.host + b.host, device_zstd: a.device_zstd + b.device_zstd })
    }
}

/// The decompressed bytes of `columns`' pages in `files` that the device
/// scan inflates on host threads, and those of the ZSTD pages the device
/// decompresses itself, by the footers' column chunk sizes. A file whose
/// footer cannot be read counts nothing (the scan reports it when it runs).
pub fn inflated_bytes(files: &[ScanFile], columns: &[&str]) -> InflatedBytes {
    let footers = crate::host::par_map(files, 1, |f| Ok::<_, DataFusionError>(read_footer(&f.path).ok()));
    let Ok(footers) = footers else { return InflatedBytes::default() };
    let mut bytes = InflatedBytes::default();
    for meta in footers.iter().flatten() {
        let schema = meta.file_metadata().schema_descr();
        let indexes: Vec<usize> = columns.iter().filter_map(|c| column_index(schema, c)).collect();
        for rg in meta.row_groups() {
            for &ci in &indexes {
                let cc = rg.column(ci);
                let size = cc.uncompressed_size().max(0) as u64;
                match codec_of(cc.compression()) {
                    Some(c) if inflated_on_host(c) => bytes.host += size,
                    Some(CODEC_ZSTD) => bytes.device_zstd += size,
                    _ => {}
                }
            }
        }
    }
    bytes
}

/// The rows in both of two sorted lists of disjoint ranges `[start, end)`.
fn intersect_ranges(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        let (lo, hi) = (a[i].0.max(b[j].0), a[i].1.min(b[j].1));
        if lo < hi {
            out.push((lo, hi));
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// The row groups of `files` that may hold a row `predicate` (over
/// `file_schema`, the files' columns by their index) keeps, per file, decided
/// as DataFusion's own Parquet scan decides them: by the row groups'
/// statistics (`PruningPredicate`, `RowGroupAccessPlanFilter::prune_by_statistics`)
/// and, with `bloom_filters` (DataFusion's `bloom_filter_on_read`), by the
/// bloom filters of the columns the predicate compares with literals
/// (`prune_by_bloom_filters`, read for the row groups the statistics left)
/// and, with `page_index` (DataFusion's `enable_page_index`), by the page
/// index of the columns single-column conjuncts read
/// (`PagePruningAccessPlanFilter`, where the files have one): within a row
/// group, the rows of pages whose statistics rule a conjunct out.
/// Conjuncts that statistics cannot decide over a float column prune nothing
/// ([`undecidable_by_statistics`]).
/// None when nothing is pruned (or the predicate cannot prune).
pub fn prune_row_groups(
    files: &[ScanFile],
    file_schema: &SchemaRef,
    predicate: &PhysicalExprRef,
    bloom_filters: bool,
    page_index: bool,
) -> Result<Option<Pruned>> {
    use datafusion::datasource::physical_plan::parquet::{
        BloomFilterStatistics, PagePruningAccessPlanFilter, ParquetAccessPlan, ParquetFileMetrics, RowGroupAccess,
        RowGroupAccessPlanFilter,
    };
    use datafusion::physical_optimizer::pruning::PruningPredicateBuilder;
    use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
    let conjuncts: Vec<PhysicalExprRef> =
        datafusion::physical_expr::split_conjunction(predicate).into_iter().cloned().collect();
    let undecidable = undecidable_by_statistics(&conjuncts, file_schema);
    let decidable = conjuncts.into_iter().zip(undecidable).filter(|(_, u)| !u).map(|(c, _)| c);
    let Some(predicate) = &datafusion::physical_expr::utils::conjunction_opt(decidable) else {
        return Ok(None);
    };
    // A predicate the statistics cannot decide prunes nothing (DataFusion's scan reads every row group then too).
    let Ok(pruning) = PruningPredicateBuilder::new().with_file_schema(file_schema.clone()).try_build(predicate.clone())
    else {
        return Ok(None);
    };
    if pruning.always_true() {
        return Ok(None);
    }
    let literal_columns = if bloom_filters { pruning.literal_columns() } else { Vec::new() };
    let pages = page_index
        .then(|| PagePruningAccessPlanFilter::new(predicate, file_schema.clone()))
        .filter(|p| p.filter_number() > 0);
    let footers = crate::host::par_map(files, 1, |f| read_footer(&f.path))?;
    let metrics = ExecutionPlanMetricsSet::new();
    let (mut by_statistics, mut by_bloom_filters, mut by_page_index) = (0usize, 0usize, 0u64);
    let mut keep = Vec::with_capacity(files.len());
    let mut selections = Vec::with_capacity(files.len());
    for (file, meta) in files.iter().zip(&footers) {
        let groups = meta.row_groups();
        let mut access = RowGroupAccessPlanFilter::new(ParquetAccessPlan::new_all(groups.len()));
        let file_metrics = ParquetFileMetrics::new(0, &file.path.to_string_lossy(), &metrics);
        let schema = meta.file_metadata().schema_descr();
        access.prune_by_statistics(file_schema, schema, groups, &pruning, &file_metrics);
        let after_statistics = access.remaining_row_group_count();
        by_statistics += groups.len() - after_statistics;
        // The literal columns' bloom filters, for the row groups left (a column
        // without one, or one that fails to read, prunes nothing, as in DataFusion).
        let columns: Vec<(String, usize)> =
            literal_columns.iter().filter_map(|name| column_index(schema, name).map(|i| (name.clone(), i))).collect();
        if !columns.is_empty() && after_statistics > 0 {
            let f = File::open(&file.path).map_err(|e| {
                DataFusionError::External(format!("setfusion device scan: {}: {e}", file.path.display()).into())
            })?;
            let mut filters = vec![BloomFilterStatistics::new(); groups.len()];
            let left: Vec<usize> = access.row_group_indexes().collect();
            for g in left {
                let rg = &groups[g];
                for (name, ci) in &columns {
                    if let Ok(Some(sbbf)) = parquet::bloom_filter::Sbbf::read_from_column_chunk(rg.column(*ci), &f) {
                        let d = schema.column(*ci);
                        filters[g].insert(name.clone(), sbbf, d.physical_type(), d.type_length());
                    }
                }
            }
            access.prune_by_bloom_filters(&pruning, &file_metrics, &filters);
            by_bloom_filters += after_statistics - access.remaining_row_group_count();
        }
        let mut plan = access.build();
        // The page index, read only where a row group is left to prune within
        // (a file without one, or one that fails to read, prunes nothing, as in DataFusion).
        if let Some(pages) = pages.as_ref().filter(|_| plan.row_group_index_iter().next().is_some()) {
            if let Ok(indexed) = read_footer_with(&file.path, parquet::file::metadata::PageIndexPolicy::Optional) {
                if indexed.offset_index().is_some() && indexed.column_index().is_some() {
                    plan = pages.prune_plan_with_page_index(plan, file_schema, schema, &indexed, &file_metrics);
                }
            }
        }
        let mut rows = Vec::with_capacity(groups.len());
        for (g, access) in plan.inner().iter().enumerate() {
            let n = groups[g].num_rows().max(0) as u64;
            let ranges = match access {
                RowGroupAccess::Selection(sel) => {
                    let mut ranges = Vec::new();
                    let mut at = 0u64;
                    for s in sel.iter() {
                        let end = at + s.row_count as u64;
                        if !s.skip && end > at {
                            ranges.push((at, end.min(n)));
                        }
                        at = end;
                    }
                    let selected: u64 = ranges.iter().map(|(a, b)| b - a).sum();
                    by_page_index += n.saturating_sub(selected);
                    (selected < n).then_some(ranges)
                }
                _ => None,
            };
            rows.push((n, ranges));
        }
        keep.push((0..groups.len()).map(|i| plan.should_scan(i)).collect::<Vec<bool>>());
        selections.push(rows);
    }
    let any_selection = selections.iter().flatten().any(|(_, r)| r.is_some());
    Ok((by_statistics + by_bloom_filters > 0 || any_selection).then(|| Pruned {
        row_groups: Arc::new(keep),
        by_statistics,
        by_bloom_filters,
        rows: any_selection.then(|| Arc::new(RowSelections(selections))),
        rows_pruned_by_page_index: by_page_index,
    }))
}

/// Does `expr` read a column of `schema` that holds a float (or one it
/// cannot find there)? Parquet leaves NaN out of a float column's min / max
/// and its bloom filters hash -0.0 apart from 0.0, while DataFusion orders NaN
/// above every number and equates -0.0 with 0.0: such a conjunct cannot be
/// decided by the statistics, the page index or the bloom filters
/// (apache/datafusion#15812).
pub fn reads_float_column(expr: &PhysicalExprRef, schema: &Schema) -> bool {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    use datafusion::physical_expr::expressions::Column;
    let mut float = false;
    let _ = expr.apply(|e| {
        if let Some(c) = e.downcast_ref::<Column>() {
            float |= column_type(c, schema).is_none_or(crate::util::holds_float);
        }
        Ok(if float { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
    });
    float
}

/// The type of column `c` in `schema`: at its index where the name matches
/// there, else by its name.
fn column_type<'s>(c: &datafusion::physical_expr::expressions::Column, schema: &'s Schema) -> Option<&'s DataType> {
    match schema.fields().get(c.index()) {
        Some(f) if f.name() == c.name() => Some(f.data_type()),
        _ => schema.index_of(c.name()).ok().map(|i| schema.field(i).data_type()),
    }
}

/// Which of `conjuncts` (a predicate's, over `schema`) statistics cannot
/// decide because of what Parquet leaves out of a float column's: its min /
/// max leave NaN out (DataFusion orders NaN above every number and the NaN
/// with the sign bit below), and its bloom filters hash -0.0 apart from 0.0
/// (which DataFusion's `=` equates). A conjunct that reads a float column is
/// undecidable ([`reads_float_column`]) unless it is
/// * `column = literal` with a literal neither NaN nor zero (no NaN equals
///   it, and no other zero), or
/// * one end of a range the conjuncts close on both sides with literals
///   other than NaN (`c >= a AND c < b`): a NaN passes only the lower end,
///   the NaN with the sign bit only the upper one, so neither is in the range.
///
/// One-sided ranges (`c > 1`, a TopK's dynamic filter) and everything else
/// over a float column are undecidable (apache/datafusion#15812).
pub fn undecidable_by_statistics(conjuncts: &[PhysicalExprRef], schema: &Schema) -> Vec<bool> {
    use datafusion::common::ScalarValue;
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::{BinaryExpr, CastExpr, Column, Literal, TryCastExpr};
    // A float column (below a cast, which keeps NaN and order) and a literal, by their sides.
    let column = |e: &PhysicalExprRef| -> Option<String> {
        let e = e
            .downcast_ref::<CastExpr>()
            .map(|c| c.expr())
            .or_else(|| e.downcast_ref::<TryCastExpr>().map(|c| c.expr()))
            .unwrap_or(e);
        let c = e.downcast_ref::<Column>()?;
        column_type(c, schema)?.is_floating().then(|| c.name().to_string())
    };
    let literal = |e: &PhysicalExprRef| -> Option<f64> {
        match e.downcast_ref::<Literal>()?.value() {
            ScalarValue::Float64(Some(v)) => Some(*v),
            ScalarValue::Float32(Some(v)) => Some(*v as f64),
            ScalarValue::Float16(Some(v)) => Some(f64::from(*v)),
            v if v.data_type().is_integer() => {
                v.cast_to(&datafusion::arrow::datatypes::DataType::Float64).ok().and_then(|v| match v {
                    ScalarValue::Float64(Some(v)) => Some(v),
                    _ => None,
                })
            }
            _ => None,
        }
    };
    // (column, operator as if the column were on the left, literal)
    let comparison = |e: &PhysicalExprRef| -> Option<(String, Operator, f64)> {
        let b = e.downcast_ref::<BinaryExpr>()?;
        match (column(b.left()), literal(b.right()), column(b.right()), literal(b.left())) {
            (Some(c), Some(v), _, _) => Some((c, *b.op(), v)),
            (_, _, Some(c), Some(v)) => Some((c, b.op().swap()?, v)),
            _ => None,
        }
    };
    let bounds: Vec<Option<(String, Operator, f64)>> =
        conjuncts.iter().map(|c| comparison(c).filter(|(_, _, v)| !v.is_nan())).collect();
    let closes = |name: &str, ops: &[Operator]| bounds.iter().flatten().any(|(c, op, _)| c == name && ops.contains(op));
    conjuncts
        .iter()
        .zip(&bounds)
        .map(|(c, bound)| {
            let decidable = match bound {
                Some((_, Operator::Eq, v)) => *v != 0.0,
                Some((name, Operator::Gt | Operator::GtEq, _)) => closes(name, &[Operator::Lt, Operator::LtEq]),
                Some((name, Operator::Lt | Operator::LtEq, _)) => closes(name, &[Operator::Gt, Operator::GtEq]),
                _ => false,
            };
            !decidable && reads_float_column(c, schema)
        })
        .collect()
}

/// What [`prune_row_groups`] left: per file, whether each row group is
/// read, and the rows of each the page index leaves; and how many were
/// pruned by their statistics, by bloom filters and by the page index.
#[derive(Debug, Clone)]
pub struct Pruned {
    pub row_groups: Arc<Vec<Vec<bool>>>,
    pub by_statistics: usize,
    pub by_bloom_filters: usize,
    /// The rows the page index leaves in the row groups read (None: it pruned none).
    pub rows: Option<Arc<RowSelections>>,
    /// Rows of the row groups read that the page index rules out.
    pub rows_pruned_by_page_index: u64,
}

/// One column chunk to read: its pieces back to back (`len` bytes).
#[derive(Debug, Clone)]
struct Chunk {
    file: usize,
    pieces: Vec<Piece>,
    len: u64,
    codec: u64,
    first_row: u64,
    rows: u64,
}

/// A byte range of a column chunk to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    /// Where it starts in the file.
    offset: u64,
    len: u64,
    /// None: the whole chunk (its pages walked from its first row). Some(r):
    /// whole pages, the first of which starts at row r of the chunk (the
    /// dictionary page alone: Some(0)); the page index left the rest out.
    first_row: Option<u64>,
}

/// The pieces of a column chunk at `offset` (`len` bytes) that hold the rows
/// `ranges` select, by its page locations (the offset index): the dictionary
/// page ahead of the first data page, and each run of adjacent data pages
/// that holds a selected row; and how many data pages are left out. None:
/// the offset index does not describe the chunk (the whole chunk is read).
fn selected_pieces(
    offset: u64,
    len: u64,
    rows: u64,
    locations: &[parquet::file::page_index::offset_index::PageLocation],
    ranges: &[(u64, u64)],
) -> Option<(Vec<Piece>, usize)> {
    let first = locations.first()?;
    let start = u64::try_from(first.offset).ok()?;
    if start < offset || start > offset + len {
        return None;
    }
    let mut pieces = Vec::new();
    if start > offset {
        pieces.push(Piece { offset, len: start - offset, first_row: Some(0) });
    }
    let mut skipped = 0;
    for (i, loc) in locations.iter().enumerate() {
        let (at, size, row) = (
            u64::try_from(loc.offset).ok()?,
            u64::try_from(loc.compressed_page_size).ok()?,
            u64::try_from(loc.first_row_index).ok()?,
        );
        let row_end = match locations.get(i + 1) {
            Some(next) => u64::try_from(next.first_row_index).ok()?,
            None => rows,
        };
        if at < offset || at + size > offset + len || row_end < row {
            return None;
        }
        if !ranges.iter().any(|&(a, b)| a < row_end && row < b) {
            skipped += 1;
            continue;
        }
        match pieces.last_mut() {
            // Right after the last piece (so the page after its last one): one piece, walked in order.
            Some(last) if last.offset + last.len == at => last.len += size,
            _ => pieces.push(Piece { offset: at, len: size, first_row: Some(row) }),
        }
    }
    Some((pieces, skipped))
}

/// The scan of one key column over files: what to read and how to decode it.
#[derive(Debug, Clone)]
pub struct ScanPlan {
    pub files: Vec<PathBuf>,
    chunks: Vec<Chunk>,
    pub rows: u64,
    /// Physical value bytes (4 or 8; 0: BOOLEAN, one bit a value; [`WIDTH_BYTES`]: BYTE_ARRAY).
    pub width: u64,
    /// 1 when the column is optional (may hold NULLs).
    pub def_max: u64,
    /// Compressed bytes to read.
    pub bytes: u64,
    /// Room for what [`super::decode::inflate_part_on_host`] makes: the
    /// uncompressed sizes of the chunks [`inflated_on_host`] (a bound), and
    /// an estimate of the other chunks' dictionary pages (the footer gives
    /// their compressed span, not their size).
    pub host_inflated_bound: u64,
    /// Row groups left out by the [`Keep`] (key range or statistics), of all.
    pub row_groups_pruned: usize,
    pub row_groups: usize,
    /// Data pages left out by the [`Keep`]'s row selections (the page index).
    pub pages_pruned: usize,
}

/// The index of the top-level (not nested) leaf column `name` in a file's schema.
fn column_index(schema: &parquet::schema::types::SchemaDescriptor, name: &str) -> Option<usize> {
    (0..schema.num_columns()).find(|&i| schema.column(i).path().parts() == [name])
}

/// Row group `rg`'s (min, max, null count) of its column `ci`, as the keys' signed 64-bit values.

fn int_stats(rg: &parquet::file::metadata::RowGroupMetaData, ci: usize) -> Option<(i64, i64, Option<u64>)> {
    use parquet::file::statistics::Statistics;
    match rg.column(ci).statistics()? {
        Statistics::Int32(s) => Some((*s.min_opt()? as i64, *s.max_opt()? as i64, s.null_count_opt())),
        Statistics::Int64(s) => Some((*s.min_opt()?, *s.max_opt()?, s.null_count_opt())),
        _ => None,
    }
}

/// The range of `column`'s non-NULL values over `files`, from the row
/// groups' statistics alone; None when a row group with values has none (or
/// no file has a value).
pub fn key_range(files: &[ScanFile], column: &str) -> Result<Option<(i64, i64)>> {
    let footers = crate::host::par_map(files, 1, |f| read_footer(&f.path))?;
    let mut range: Option<(i64, i64)> = None;
    for meta in &footers {
        let schema = meta.file_metadata().schema_descr();
        let Some(ci) = column_index(schema, column) else {
            return Ok(None);
        };
        for rg in meta.row_groups() {
            match int_stats(rg, ci) {
                Some((lo, hi, _)) => range = Some(range.map_or((lo, hi), |(a, b)| (a.min(lo), b.max(hi)))),
                // All NULL: no value to bound.
                None if rg.column(ci).statistics().and_then(|s| s.null_count_opt()) == Some(rg.num_rows() as u64) => {}
                None => return Ok(None),
            }
        }
    }
    Ok(range)
}

/// The page table over the raw chunk bytes, and the device scratch it needs.
#[derive(Debug, Clone, Default)]
pub struct PageTable {
    pub pages: Vec<PqPage>,
    /// Bytes of all uncompressed page bodies (each 8-aligned).
    pub body_len: u64,
    /// Validity scratch words (pages of optional columns).
    pub lvl_words: u64,
    /// u32 index scratch entries: one a value of dictionary-encoded and RLE
    /// boolean data pages, two a value of DELTA_BINARY_PACKED pages (from an even entry).
    pub idx_len: u64,
    pub rows: u64,
    pub def_max: u64,
}

impl PageTable {
    /// Are these a BYTE_ARRAY column's pages (keys hashed, spans written)?
    pub fn holds_bytes(&self) -> bool {
        self.pages.iter().any(|p| p.width == WIDTH_BYTES)
    }

    /// The table as the kernels read it.
    pub fn flat(&self) -> Vec<u64> {
        self.pages.iter().flat_map(|p| p.fields()).collect()
    }
}

/// Is the Parquet column (physical type, logical type) read by DataFusion as
/// `arrow` with the same 64-bit key the host would encode? None: yes; else why not.
/// Files without logical types (DuckDB's, older writers') say it with the
/// converted type alone: DATE, INT_32 / INT_64, DECIMAL (`precision`, `scale`).
fn type_mismatch(descr: &parquet::schema::types::ColumnDescriptor, arrow: &DataType) -> Option<String> {
    use parquet::basic::ConvertedType;
    let (physical, logical) = (descr.physical_type(), descr.logical_type_ref());
    let ok = match (arrow, physical, logical) {
        // (BOOLEAN has no logical or converted type to check.)
        (DataType::Boolean, PhysicalType::BOOLEAN, _) => true,
        // Strings: UTF8 (or JSON / ENUM, whose bytes are the strings); binary: no annotation.
        (DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View, PhysicalType::BYTE_ARRAY, l) => match l {
            Some(LogicalType::String | LogicalType::Json | LogicalType::Enum) => true,
            Some(_) => false,
            None => matches!(descr.converted_type(), ConvertedType::UTF8 | ConvertedType::JSON | ConvertedType::ENUM),
        },
        (DataType::Binary | DataType::LargeBinary | DataType::BinaryView, PhysicalType::BYTE_ARRAY, None) => {
            descr.converted_type() == ConvertedType::NONE
        }
        (_, _, None) => match (arrow, physical, descr.converted_type()) {
            (DataType::Int64, PhysicalType::INT64, ConvertedType::NONE | ConvertedType::INT_64) => true,
            (DataType::Int32, PhysicalType::INT32, ConvertedType::NONE | ConvertedType::INT_32) => true,
            (DataType::Date32, PhysicalType::INT32, ConvertedType::DATE) => true,
            (DataType::Decimal128(p, s), PhysicalType::INT32 | PhysicalType::INT64, ConvertedType::DECIMAL) => {
                *p <= 18 && descr.type_precision() == *p as i32 && descr.type_scale() == *s as i32
            }
            _ => false,
        },
        (DataType::Int64, PhysicalType::INT64, Some(LogicalType::Integer(t))) => t.bit_width == 64 && t.is_signed,
        (DataType::Int32, PhysicalType::INT32, Some(LogicalType::Integer(t))) => t.bit_width == 32 && t.is_signed,
        (DataType::Date32, PhysicalType::INT32, Some(LogicalType::Date)) => true,
        (DataType::Decimal128(p, s), PhysicalType::INT32 | PhysicalType::INT64, Some(LogicalType::Decimal(d))) => {
            *p <= 18 && d.precision == *p as i32 && d.scale == *s as i32
        }
        _ => false,
    };
    (!ok).then(|| {
        format!(
            "schema adaptation: {arrow} from Parquet {physical}{}",
            match (logical, descr.converted_type()) {
                (Some(l), _) => format!(" ({l:?})"),
                (None, ConvertedType::NONE) => String::new(),
                (None, c) => format!(" ({c})"),
            }
        )
    })
}

/// Can the device scan take a column of this Arrow type at all (as a key,
/// a filter's column or an output column)?
pub fn supported_type(t: &DataType) -> bool {
    matches!(t, DataType::Boolean | DataType::Int32 | DataType::Int64 | DataType::Date32)
        || matches!(t, DataType::Decimal128(p, _) if *p <= 18)
}

/// Is this a string / binary type, which the device scan takes as a key
/// (hashed, compared exactly on the device) and as a filter's column compared
/// with literals (`exec::device_scan::StringLiterals`), not yet as an output column?
pub fn is_byte_type(t: &DataType) -> bool {
    use DataType::*;
    matches!(t, Utf8 | LargeUtf8 | Utf8View | Binary | LargeBinary | BinaryView)
}

/// The rows of `files` by their footers (None when one cannot be read).
pub fn file_rows(files: &[ScanFile]) -> Option<u64> {
    files.iter().map(|f| file_shape(&f.path).map(|(rows, _)| rows)).sum()
}

/// A file's rows and row groups by its footer (None when it cannot be read).
pub fn file_shape(path: &PathBuf) -> Option<(u64, usize)> {
    read_footer(path).ok().map(|m| (m.file_metadata().num_rows().max(0) as u64, m.num_row_groups()))
}

/// Where a listed file lies on the local disk (DataFusion's local object
/// store lists paths without their leading `/`).
pub fn local_path(file: &datafusion::datasource::listing::PartitionedFile) -> PathBuf {
    PathBuf::from(format!("/{}", file.object_meta.location.as_ref()))
}

/// Can the device scan take a key column of this Arrow type?
pub fn supported_key_type(t: &DataType) -> bool {
    supported_type(t) || is_byte_type(t)
}

fn read_footer(path: &PathBuf) -> Result<Arc<ParquetMetaData>> {
    read_footer_with(path, parquet::file::metadata::PageIndexPolicy::Skip)
}

/// The footer, and the page index as `policy` says (`Skip`: none; otherwise
/// the one the file has), from the [`footer_cache`] when the file is as it was.
fn read_footer_with(path: &PathBuf, policy: parquet::file::metadata::PageIndexPolicy) -> Result<Arc<ParquetMetaData>> {
    let err = |e: &dyn std::fmt::Display| {
        DataFusionError::External(format!("setfusion device scan: {}: {e}", path.display()).into())
    };
    let f = File::open(path).map_err(|e| err(&e))?;
    let with_index = policy != parquet::file::metadata::PageIndexPolicy::Skip;
    let stamp = FileStamp::of(&f);
    if let Some(meta) = stamp.and_then(|s| footer_cache::get(path, s, with_index)) {
        return Ok(meta);
    }
    let meta =
        Arc::new(ParquetMetaDataReader::new().with_page_index_policy(policy).parse_and_finish(&f).map_err(|e| {
            if encrypted_footer(&f) {
                err(&format!("an encrypted Parquet file (its footer is encrypted), which this build cannot read: {e}"))
            } else {
                err(&e)
            }
        })?);
    if let Some(s) = stamp {
        footer_cache::put(path, s, with_index, meta.clone());
    }
    Ok(meta)
}

/// Whether the file ends with the magic of an encrypted footer (`PARE`, not `PAR1`).
fn encrypted_footer(f: &File) -> bool {
    let mut magic = [0u8; 4];
    let len = f.metadata().map_or(0, |m| m.len());
    len >= 4 && f.read_exact_at(&mut magic, len - 4).is_ok() && &magic == b"PARE"
}

/// A file as it is on disk now: its size and modification time (what the
/// device column cache keys a file by, too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileStamp {
    len: u64,
    modified_ns: u128,
}

impl FileStamp {
    /// None when the file's time cannot be read (it is then never cached).
    pub fn of(f: &File) -> Option<Self> {
        Self::from_metadata(&f.metadata().ok()?)
    }

    /// [`FileStamp::of`] the file at `path`.
    pub(super) fn of_path(path: &std::path::Path) -> Option<Self> {
        Self::from_metadata(&std::fs::metadata(path).ok()?)
    }

    fn from_metadata(meta: &std::fs::Metadata) -> Option<Self> {
        let modified_ns = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos();
        Some(Self { len: meta.len(), modified_ns })
    }
}

/// Parsed footers, kept between the reads of one query (its planning and its
/// scans read a file's footer several times) and between queries: a file's
/// footer is parsed again only when its size or modification time changed.
/// A footer with its page index serves a read without one. Bounded by the
/// footers' own memory ([`ParquetMetaData::memory_size`]), least recently
/// used first out.
mod footer_cache {
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Mutex, OnceLock};

    use parquet::file::metadata::ParquetMetaData;

    use super::FileStamp;

    /// The parsed footers' memory kept at most.
    pub(super) const LIMIT_BYTES: usize = 256 << 20;

    struct Entry {
        stamp: FileStamp,
        with_index: bool,
        meta: Arc<ParquetMetaData>,
        bytes: usize,
        used: u64,
    }

    #[derive(Default)]
    struct Cache {
        entries: HashMap<PathBuf, Entry>,
        bytes: usize,
        clock: u64,
    }

    fn cache() -> &'static Mutex<Cache> {
        static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
        CACHE.get_or_init(Default::default)
    }

    /// The footer of `path` as it is now (`stamp`), with its page index if `with_index`.
    pub(super) fn get(path: &Path, stamp: FileStamp, with_index: bool) -> Option<Arc<ParquetMetaData>> {
        let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
        c.clock += 1;
        let clock = c.clock;
        let e = c.entries.get_mut(path)?;
        if e.stamp != stamp || (with_index && !e.with_index) {
            return None;
        }
        e.used = clock;
        Some(e.meta.clone())
    }

    /// Keep `meta`, the footer of `path` as it is at `stamp`.
    pub(super) fn put(path: &Path, stamp: FileStamp, with_index: bool, meta: Arc<ParquetMetaData>) {
        let bytes = meta.memory_size();
        if bytes > LIMIT_BYTES / 4 {
            return;
        }
        let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
        c.clock += 1;
        let used = c.clock;
        if let Some(old) = c.entries.get(path) {
            // A footer with its page index is not replaced by one without (of the same file as it is).
            if old.stamp == stamp && old.with_index && !with_index {
                return;
            }
        }
        if let Some(old) = c.entries.insert(path.to_path_buf(), Entry { stamp, with_index, meta, bytes, used }) {
            c.bytes -= old.bytes;
        }
        c.bytes += bytes;
        while c.bytes > LIMIT_BYTES {
            let Some(oldest) = c.entries.iter().min_by_key(|(_, e)| e.used).map(|(p, _)| p.clone()) else { break };
            if let Some(e) = c.entries.remove(&oldest) {
                c.bytes -= e.bytes;
            }
        }
    }

    /// How many footers are kept (tests).
    #[cfg(test)]
    pub(super) fn len() -> usize {
        cache().lock().unwrap_or_else(|e| e.into_inner()).entries.len()
    }
}

/// Plan the scan of `column` (a top-level column read as `arrow`) over `files`.
pub fn plan_scan(
    files: &[ScanFile],
    column: &str,
    arrow: &DataType,
) -> Result<std::result::Result<ScanPlan, Fallback>> {
    plan_scan_within(files, column, arrow, &Keep::default())
}

/// [`plan_scan`] of the row groups `keep` leaves.
pub fn plan_scan_within(
    files: &[ScanFile],
    column: &str,
    arrow: &DataType,
    keep: &Keep,
) -> Result<std::result::Result<ScanPlan, Fallback>> {
    if !supported_key_type(arrow) {
        return fallback(format!("type {arrow}"));
    }
    // Files whose rows the page index selects: their offset index too (where the pages lie).
    let selects =
        |fi: usize| keep.rows.as_ref().is_some_and(|r| r.0.get(fi).is_some_and(|g| g.iter().any(|x| x.1.is_some())));
    let indexed: Vec<usize> = (0..files.len()).collect();
    let footers = crate::host::par_map(&indexed, 1, |&fi| {
        Ok::<_, DataFusionError>(if selects(fi) {
            read_footer_with(&files[fi].path, parquet::file::metadata::PageIndexPolicy::Optional)
        } else {
            read_footer(&files[fi].path)
        })
    })?;
    // An encrypted file is left to DataFusion's scan (which says what it can read of it).
    let mut read = Vec::with_capacity(footers.len());
    for (file, footer) in files.iter().zip(footers) {
        match footer {
            Ok(meta) => read.push(meta),
            Err(_) if File::open(&file.path).is_ok_and(|f| encrypted_footer(&f)) => {
                return fallback(format!("encrypted file {}", file.path.display()));
            }
            Err(e) => return Err(e),
        }
    }
    let footers = read;
    let mut chunks = Vec::new();
    let (mut rows, mut width, mut def_max, mut bytes, mut host_inflated_bound) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let (mut row_groups, mut row_groups_pruned, mut pages_pruned) = (0usize, 0usize, 0usize);
    for (fi, (file, meta)) in files.iter().zip(&footers).enumerate() {
        if !file.ranges.is_empty() {
            let size = std::fs::metadata(&file.path).map(|m| m.len()).unwrap_or(0);
            let mut r = file.ranges.clone();
            r.sort_unstable();
            let covered = r.first().is_some_and(|f| f.0 == 0)
                && r.windows(2).all(|w| w[0].1 == w[1].0)
                && r.last().is_some_and(|l| l.1 >= size);
            if !covered {
                return fallback("file ranges that do not cover the file");
            }
        }
        let schema = meta.file_metadata().schema_descr();
        let Some(ci) = column_index(schema, column) else {
            return fallback(format!("column {column} is nested or missing in {}", file.path.display()));
        };
        let key_ci = keep.key_range.as_ref().and_then(|k| column_index(schema, &k.column));
        let descr = schema.column(ci);
        if descr.max_rep_level() > 0 || descr.max_def_level() > 1 {
            return fallback(format!("nested column {column}"));
        }
        if let Some(why) = type_mismatch(&descr, arrow) {
            return fallback(why);
        }
        width = match descr.physical_type() {
            PhysicalType::BOOLEAN => 0,
            PhysicalType::INT32 => 4,
            PhysicalType::BYTE_ARRAY => WIDTH_BYTES,
            _ => 8,
        };
        def_max = def_max.max(descr.max_def_level() as u64);
        let listed = keep.row_groups.as_ref().map(|k| k.get(fi).map(Vec::as_slice).unwrap_or_default());
        if listed.is_some_and(|l| l.len() != meta.row_groups().len()) {
            // The footer changed since the row groups were chosen.
            return fallback(format!("{} changed while it was scanned", file.path.display()));
        }
        for (rgi, rg) in meta.row_groups().iter().enumerate() {
            row_groups += 1;
            if listed.is_some_and(|l| !l[rgi]) {
                row_groups_pruned += 1;
                continue;
            }
            if keep.key_range.as_ref().is_some_and(|k| !k.may_hold_key(rg, key_ci)) {
                row_groups_pruned += 1;
                continue;
            }
            let cc = rg.column(ci);
            let Some(codec) = codec_of(cc.compression()) else {
                return fallback(format!("codec {}", cc.compression()));
            };
            let (offset, mut len) = cc.byte_range();
            let n = rg.num_rows() as u64;
            let mut pieces = vec![Piece { offset, len, first_row: None }];
            if let Some(ranges) = keep.rows.as_ref().and_then(|r| r.of(fi, rgi)) {
                // Only the pages that hold a selected row (the whole chunk without an offset index).
                let locations = meta.offset_index().and_then(|o| o.get(rgi)).and_then(|c| c.get(ci));
                if let Some((p, skipped)) =
                    locations.and_then(|l| selected_pieces(offset, len, n, l.page_locations(), ranges))
                {
                    len = p.iter().map(|p| p.len).sum();
                    pieces = p;
                    pages_pruned += skipped;
                }
            }
            chunks.push(Chunk { file: fi, pieces, len, codec, first_row: rows, rows: n });
            rows += n;
            bytes += len;
            if inflated_on_host(codec) {
                host_inflated_bound += cc.uncompressed_size().max(0) as u64;
            } else if let Some(dict) = cc.dictionary_page_offset() {
                // A device-decompressed chunk's dictionary page is often the one page of
                // it the host inflates (over twice the median page: arrow-rs writes
                // 1 MiB dictionaries before falling back to PLAIN). Room for it at twice
                // the chunk's own ratio: a part whose inflated pages find no room waits
                // for every earlier decode (on the H200, 5 of 13 parts of a 100M-key IN
                // did, 15-20 ms after the reads).
                let span = (cc.data_page_offset() - dict).clamp(0, cc.compressed_size().max(0)) as f64;
                let ratio = (cc.uncompressed_size().max(1) as f64 / cc.compressed_size().max(1) as f64).max(1.0);
                host_inflated_bound += (2.0 * ratio * span) as u64;
            }
        }
    }
    Ok(Ok(ScanPlan {
        files: files.iter().map(|f| f.path.clone()).collect(),
        chunks,
        rows,
        width,
        def_max,
        bytes,
        host_inflated_bound,
        row_groups_pruned,
        row_groups,
        pages_pruned,
    }))
}

/// Chunk buffers kept for the next scan ([`kept_buffer`], [`give_back`]).
/// A read into fresh memory faults in every page, and freeing hundreds of MB
/// holds the address-space lock those faults wait on: most of a warm scan's
/// read time (100M keys a side) went there. At most [`KEEP_BUFFERS`]
/// buffers, [`KEEP_BYTES`] in all, wait here, each with the scans that used
/// it. A buffer that served two device scans is page-locked
/// ([`give_back_to_device`]), so later scans upload by DMA straight from it.
static FREE_BUFFERS: std::sync::Mutex<Vec<(HostBytes, u32)>> = std::sync::Mutex::new(Vec::new());
const KEEP_BUFFERS: usize = 8;
const KEEP_BYTES: usize = 4 << 30;

/// A scan's chunk bytes, back to back, at the start of a buffer that may be
/// longer (one kept from an earlier scan).
pub struct ChunkBytes {
    buf: HostBytes,
    len: usize,
    /// Scans that used the buffer before this one.
    uses: u32,
}

impl std::ops::Deref for ChunkBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl ChunkBytes {
    /// The bytes, to be written.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }

    /// A copy of the bytes (the buffer goes back to the pool).
    pub fn into_vec(self) -> Vec<u8> {
        let v = self.to_vec();
        give_back(self);
        v
    }

    /// Does the device read these bytes in place (page-locked memory)?
    pub fn is_page_locked(&self) -> bool {
        self.buf.is_page_locked()
    }
}

/// A buffer for `len` bytes: the smallest kept one that holds them (its
/// bytes are stale: the caller overwrites the first `len`), else a new one.
pub(crate) fn kept_buffer(len: usize) -> ChunkBytes {
    // Nothing to hold (no page inflated on the host): the kept buffers stay for the reads.
    if len == 0 {
        return ChunkBytes { buf: HostBytes::zeroed(0), len: 0, uses: 0 };
    }
    // While a lock pass holds kept buffers, wait for them (a few tens of ms,
    // once) rather than fault in a new one: that one would be locked a query
    // later in turn, and each of the next scans would find another missing.
    let waits_until = std::time::Instant::now() + LOCK_PASS_WAIT;
    let kept = loop {
        let kept = {
            let mut free = FREE_BUFFERS.lock().unwrap_or_else(|e| e.into_inner());
            let best = free
                .iter()
                .enumerate()
                .filter(|(_, b)| b.0.len() >= len)
                .min_by_key(|(_, b)| b.0.len())
                .map(|(i, _)| i);
            best.map(|i| free.swap_remove(i))
        };
        if kept.is_some()
            || !LOCK_PASS_HOLDS.load(std::sync::atomic::Ordering::Acquire)
            || std::time::Instant::now() > waits_until
        {
            break kept;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    };
    let (buf, uses) = kept.unwrap_or_else(|| {
        crate::util::trace(&format!("device scan: a new read buffer of {:.1} MB (none kept fits)", len as f64 / 1e6));
        (HostBytes::zeroed(len), 0)
    });
    ChunkBytes { buf, len, uses }
}

/// Set while a lock pass ([`lock_kept_buffers`]) holds kept buffers out of
/// the pool; [`kept_buffer`] waits for them up to [`LOCK_PASS_WAIT`].
static LOCK_PASS_HOLDS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
const LOCK_PASS_WAIT: std::time::Duration = std::time::Duration::from_millis(400);

/// Keep a scan's buffer for the next one (or free it on a background thread
/// when enough wait already).
pub fn give_back(bytes: ChunkBytes) {
    keep(bytes.buf, bytes.uses.saturating_add(1))
}

/// Would the pool keep a buffer of `len` bytes now?
fn would_keep(free: &[(HostBytes, u32)], len: usize) -> bool {
    free.len() < KEEP_BUFFERS && free.iter().map(|b| b.0.len()).sum::<usize>() + len <= KEEP_BYTES
}

fn keep(buf: HostBytes, uses: u32) {
    if buf.is_empty() {
        return;
    }
    let mut free = FREE_BUFFERS.lock().unwrap_or_else(|e| e.into_inner());
    if would_keep(&free, buf.len()) {
        free.push((buf, uses));
    } else {
        drop(free);
        crate::util::trace(&format!("device scan: a read buffer of {:.1} MB not kept", buf.len() as f64 / 1e6));
        crate::host::drop_later(buf);
    }
}

/// [`give_back`] after a device scan. A kept buffer that served two scans
/// or more (so not in a one-query process, nor one that only passes
/// through) is page-locked for `gpu` by a lock pass ([`lock_kept_buffers`])
/// on the background thread once the operator's device lease ends
/// ([`crate::gpu::Gpu::after_lease`]: a lock held up the operator's own
/// device calls by ~100 ms on the H100). A lock costs about one copy through
/// the staging buffers, once per buffer.
pub fn give_back_to_device(bytes: ChunkBytes, gpu: &crate::gpu::Gpu) {
    let uses = bytes.uses.saturating_add(1);
    let to_lock = uses >= 2 && !bytes.buf.is_page_locked() && !bytes.buf.is_empty();
    keep(bytes.buf, uses);
    static PASS_WAITING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if to_lock && !PASS_WAITING.swap(true, std::sync::atomic::Ordering::AcqRel) {
        let ctx = gpu.context().clone();
        gpu.after_lease(Box::new(move || {
            PASS_WAITING.store(false, std::sync::atomic::Ordering::Release);
            lock_kept_buffers(&ctx);
        }));
    }
}

/// Page-lock the kept buffers that served two scans or more, all of them
/// out of the pool for the pass ([`LOCK_PASS_HOLDS`]).
fn lock_kept_buffers(ctx: &Arc<cudarc::driver::CudaContext>) {
    // Every buffer due is taken at once and given back at once: a query that
    // starts meanwhile waits for the pass in [`kept_buffer`]. (One buffer at a
    // time, a 3-column scan on the H200 found one of its six buffers missing in
    // each of its next six queries: each faulted in a new one, staged it, and
    // the lock ran beside the query.)
    // Cleared however the pass ends (a panic too), so no scan waits for it in vain.
    struct Holds;
    impl Drop for Holds {
        fn drop(&mut self) {
            LOCK_PASS_HOLDS.store(false, std::sync::atomic::Ordering::Release);
        }
    }
    let _holds = Holds;
    let due: Vec<(HostBytes, u32)> = {
        let mut free = FREE_BUFFERS.lock().unwrap_or_else(|e| e.into_inner());
        let (due, rest) = std::mem::take(&mut *free)
            .into_iter()
            .partition(|(b, uses)| *uses >= 2 && !b.is_page_locked() && !b.is_empty());
        *free = rest;
        LOCK_PASS_HOLDS.store(true, std::sync::atomic::Ordering::Release);
        due
    };
    for (mut buf, uses) in due {
        let t = std::time::Instant::now();
        // A buffer that fails to lock goes back as it was, still a good buffer to read into.
        let _ = buf.page_lock(ctx);
        crate::util::trace(&format!(
            "device scan: a kept read buffer of {:.1} MB page-locked in {:.1} ms",
            buf.len() as f64 / 1e6,
            t.elapsed().as_secs_f64() * 1e3
        ));
        keep(buf, uses);
    }
}

/// The plan's files, open.
fn open_files(plan: &ScanPlan) -> Result<Vec<File>> {
    plan.files
        .iter()
        .map(|p| {
            File::open(p)
                .map_err(|e| DataFusionError::External(format!("setfusion device scan: {}: {e}", p.display()).into()))
        })
        .collect()
}

/// Positioned reads of pieces of `out` (the plan's chunks back to back from
/// byte `from` of them) on the host threads: `out[i]` is chunk byte `from + i`.
fn read_range(plan: &ScanPlan, files: &[File], from: u64, out: &mut [u8]) -> Result<()> {
    // Pieces of at most 4 MiB, so that few large chunks still spread over the threads.
    const PIECE: usize = 4 << 20;
    let mut jobs: Vec<(usize, u64, &mut [u8])> = Vec::new();
    let mut rest: &mut [u8] = out;
    let (mut piece_at, mut pos) = (0u64, from);
    for (file, p) in plan.chunks.iter().flat_map(|c| c.pieces.iter().map(move |p| (c.file, p))) {
        let piece_end = piece_at + p.len;
        while pos < piece_end && !rest.is_empty() {
            let n = ((piece_end - pos) as usize).min(PIECE).min(rest.len());
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(n);
            jobs.push((file, p.offset + (pos - piece_at), piece));
            pos += n as u64;
            rest = tail;
        }
        piece_at = piece_end;
    }
    let failed = std::sync::Mutex::new(None);
    crate::host::for_each_mut(&mut jobs, &|_, (f, at, piece)| {
        if let Err(e) = files[*f].read_exact_at(piece, *at) {
            *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("{}: {e}", plan.files[*f].display()));
        }
    });
    match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(DataFusionError::External(format!("setfusion device scan: {e}").into())),
        None => Ok(()),
    }
}

/// Read every chunk's bytes, back to back, with parallel positioned reads
/// (into a kept buffer when one is large enough: give it back with [`give_back`]).
pub fn read_chunks(plan: &ScanPlan) -> Result<ChunkBytes> {
    let files = open_files(plan)?;
    let mut chunks = kept_buffer(plan.bytes as usize);
    if let Err(e) = read_range(plan, &files, 0, chunks.as_mut_slice()) {
        give_back(chunks);
        return Err(e);
    }
    Ok(chunks)
}

/// Bytes of each part of [`read_chunks_in_waves`] (the most [`scan_part_bytes`] chooses).
pub const READ_PART: usize = 64 << 20;

/// Bytes of each part of the streamed device scan ([`read_chunks_in_waves`])
/// of `total` bytes: [`READ_PART`], but an eighth of a smaller scan (at least
/// [`MIN_SCAN_PART`]), so that a small scan's decodes too overlap its reads
/// and only a small last part is decoded after them (a whole column of 50 MB
/// in one part: 4-7 ms of decode after the reads on the H200); or
/// `SETFUSION_SCAN_PART_MB` (0: one part a scan).
pub fn scan_part_bytes(total: u64) -> usize {
    match crate::env::scan_part_mb() {
        Some(0) => usize::MAX,
        Some(mb) => mb.saturating_mul(1 << 20),
        None => (total as usize / 8).clamp(MIN_SCAN_PART, READ_PART),
    }
}

/// The smallest part [`scan_part_bytes`] chooses.
pub const MIN_SCAN_PART: usize = 4 << 20;

/// [`read_chunks`] into `chunks` (a [`kept_buffer`] of the plan's bytes) in
/// parts cut at column chunk boundaries (at least `part_bytes` each, but the
/// last; a larger chunk is a part of its own), each lent to `ready` as long
/// as `chunks` (to be uploaded while the next parts are read), so that each part's pages can be walked and decoded on their own
/// ([`page_table_of`]): `ready(offset, bytes, page_locked, chunks)`, with the
/// part's chunk indices, as soon as the part is read. `readers` threads take
/// the parts in turn (each part's read is one parallel loop on the host
/// threads: with one reader, the threads would idle at the end of each part
/// and while `ready` runs), so parts may be handed over out of order.
pub fn read_chunks_in_waves<'a>(
    plan: &ScanPlan,
    chunks: &'a mut ChunkBytes,
    part_bytes: usize,
    readers: usize,
    ready: &(dyn Fn(usize, &'a [u8], bool, std::ops::Range<usize>) -> Result<()> + Sync),
) -> Result<()> {
    let files = open_files(plan)?;
    let locked = chunks.is_page_locked();
    let mut rest: &'a mut [u8] = chunks.as_mut_slice();
    let mut parts = Vec::new();
    for (at, bytes, range) in part_ranges(plan, part_bytes) {
        if bytes > rest.len() {
            return Err(DataFusionError::Internal("setfusion device scan: the read buffer is short".into()));
        }
        let (part, tail) = std::mem::take(&mut rest).split_at_mut(bytes);
        parts.push((at, part, range));
        rest = tail;
    }
    in_turn(parts, readers, &|(at, part, range)| {
        read_range(plan, &files, at as u64, part)?;
        ready(at, part, locked, range)
    })
}

/// The plan's chunks cut into parts at chunk boundaries, at least
/// `part_bytes` each but the last (a larger chunk is a part of its own):
/// (offset in the plan's bytes, bytes, chunk indices).
fn part_ranges(plan: &ScanPlan, part_bytes: usize) -> Vec<(usize, usize, std::ops::Range<usize>)> {
    let mut parts = Vec::new();
    let (mut at, mut first) = (0usize, 0usize);
    while first < plan.chunks.len() {
        let (mut end, mut bytes) = (first, 0usize);
        while end < plan.chunks.len() && (bytes < part_bytes.max(1) || end == first) {
            bytes += plan.chunks[end].len as usize;
            end += 1;
        }
        parts.push((at, bytes, first..end));
        at += bytes;
        first = end;
    }
    parts
}

/// `work` on each of `items`, taken in turn by `threads` threads (the
/// caller's among them); the first error stops the others' next items.
fn in_turn<P: Send>(items: Vec<P>, threads: usize, work: &(dyn Fn(P) -> Result<()> + Sync)) -> Result<()> {
    let queue = std::sync::Mutex::new(items.into_iter());
    let failed = std::sync::Mutex::new(None);
    let take = || loop {
        if failed.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
            return;
        }
        let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
        let Some(item) = next else { return };
        if let Err(e) = work(item) {
            failed.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
            return;
        }
    };
    crate::host::scope(|s| {
        for _ in 1..threads.max(1) {
            s.spawn("scan-read", take);
        }
        take();
    });
    match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

impl ScanPlan {
    /// The number of column chunks the plan reads.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }
}

fn corrupt(what: String) -> DataFusionError {
    DataFusionError::External(format!("setfusion device scan: {what}").into())
}

/// Walk one chunk's page headers (`raw`: the chunk's pieces back to back,
/// at `base` in the buffer the device gets), piece by piece. Dictionary
/// references are chunk-local here.
fn walk_chunk(
    raw: &[u8],
    base: u64,
    c: &Chunk,
    width: u64,
    def_max: u64,
) -> Result<std::result::Result<Vec<PqPage>, Fallback>> {
    let mut pages = Vec::new();
    let mut dict = NO_DICT;
    let mut piece_at = 0usize;
    for piece in &c.pieces {
        let end = piece_at + piece.len as usize;
        if end > raw.len() {
            return Err(corrupt("a column chunk's pieces run past its bytes".into()));
        }
        match walk_piece(&raw[..end], piece_at, base, c, piece, width, def_max, &mut dict, &mut pages)? {
            Ok(()) => {}
            Err(f) => return Ok(Err(f)),
        }
        piece_at = end;
    }
    Ok(Ok(pages))
}

/// [`walk_chunk`]'s walk of one piece: `raw[at..]` (to its end).
#[allow(clippy::too_many_arguments)]
fn walk_piece(
    raw: &[u8],
    at: usize,
    base: u64,
    c: &Chunk,
    piece: &Piece,
    width: u64,
    def_max: u64,
    dict: &mut u64,
    pages: &mut Vec<PqPage>,
) -> Result<std::result::Result<(), Fallback>> {
    let (mut pos, mut values) = (at, piece.first_row.unwrap_or(0));
    // A whole chunk ends with its last row (anything after is not a page of it).
    while pos < raw.len() && (piece.first_row.is_some() || values < c.rows) {
        let (h, hlen) = read_page_header(&raw[pos..])?;
        let body = pos + hlen;
        let size = h.compressed_size as usize;
        if body + size > raw.len() {
            return Err(corrupt(format!(
                "page at byte {} of a column chunk runs past it",
                piece.offset as usize + (pos - at)
            )));
        }
        let mut p = PqPage {
            src: base + body as u64,
            src_len: size as u64,
            dst_len: h.uncompressed_size as u64,
            codec: c.codec,
            num_values: h.num_values as u64,
            dict: *dict,
            def_max,
            width,
            ..Default::default()
        };
        match h.page_type {
            thrift::DICTIONARY_PAGE => {
                if width == 0 {
                    return fallback("a dictionary of BOOLEAN values");
                }
                if h.encoding != thrift::PLAIN && h.encoding != thrift::PLAIN_DICTIONARY {
                    return fallback(format!("dictionary page encoding {}", h.encoding));
                }
                if !pages.is_empty() {
                    return fallback("dictionary page after data pages");
                }
                p.kind = KIND_DICT;
                p.dict = NO_DICT;
                *dict = pages.len() as u64;
            }
            thrift::DATA_PAGE | thrift::DATA_PAGE_V2 => {
                p.encoding = match h.encoding {
                    thrift::PLAIN => ENC_PLAIN,
                    thrift::PLAIN_DICTIONARY | thrift::RLE_DICTIONARY if *dict != NO_DICT => ENC_DICT,
                    thrift::PLAIN_DICTIONARY | thrift::RLE_DICTIONARY => {
                        return Err(corrupt("dictionary-encoded page without a dictionary".into()))
                    }
                    // Every other column the scan takes is INT32 or INT64 (type_mismatch), the types DELTA_BINARY_PACKED encodes.
                    thrift::DELTA_BINARY_PACKED if width == 4 || width == 8 => ENC_DELTA,
                    thrift::RLE if width == 0 => ENC_RLE_BOOL,
                    e => return fallback(format!("encoding {}", encoding_name(e))),
                };
                if h.page_type == thrift::DATA_PAGE {
                    p.kind = KIND_V1;
                    if def_max > 0 && h.def_encoding != thrift::RLE {
                        return fallback(format!("definition level encoding {}", encoding_name(h.def_encoding)));
                    }
                } else {
                    p.kind = KIND_V2;
                    if h.rep_len != 0 {
                        return fallback("repetition levels");
                    }
                    if (h.num_rows as u64) != p.num_values {
                        return Err(corrupt("v2 page rows and values differ in a flat column".into()));
                    }
                    p.levels_len = (h.rep_len + h.def_len) as u64;
                    p.def_len = h.def_len as u64;
                    if p.levels_len > p.src_len || p.levels_len > p.dst_len {
                        return Err(corrupt("v2 page levels longer than the page".into()));
                    }
                    if !h.is_compressed {
                        p.codec = CODEC_NONE;
                    }
                }
                p.first_row = c.first_row + values;
                values += p.num_values;
                if values > c.rows {
                    return Err(corrupt(format!("column chunk holds more values than its {} rows", c.rows)));
                }
            }
            thrift::INDEX_PAGE => {
                pos = body + size;
                continue;
            }
            other => return Err(corrupt(format!("page type {other}"))),
        }
        if p.codec == CODEC_NONE && p.src_len != p.dst_len {
            return Err(corrupt("uncompressed page whose sizes differ".into()));
        }
        pages.push(p);
        pos = body + size;
    }
    if piece.first_row.is_none() && values != c.rows {
        return Err(corrupt(format!("column chunk holds {values} values for {} rows", c.rows)));
    }
    if piece.first_row.is_some() && pos != raw.len() {
        return Err(corrupt("a page runs past the pages the offset index locates".into()));
    }
    Ok(Ok(()))
}

fn encoding_name(e: i32) -> &'static str {
    match e {
        0 => "PLAIN",
        2 => "PLAIN_DICTIONARY",
        3 => "RLE",
        4 => "BIT_PACKED",
        5 => "DELTA_BINARY_PACKED",
        6 => "DELTA_LENGTH_BYTE_ARRAY",
        7 => "DELTA_BYTE_ARRAY",
        8 => "RLE_DICTIONARY",
        9 => "BYTE_STREAM_SPLIT",
        _ => "unknown",
    }
}

/// The page table of `plan` over `raw` (its chunks back to back, from [`read_chunks`]).
pub fn page_table(plan: &ScanPlan, raw: &[u8]) -> Result<std::result::Result<PageTable, Fallback>> {
    page_table_of(plan, 0..plan.chunks.len(), raw)
}

/// The page table of the chunks `chunks` of `plan` alone (`raw`: their bytes
/// back to back; the pages' `src` count from its start): a part of
/// [`read_chunks_in_waves`], decoded on its own. Rows are the plan's (each
/// page's `first_row` as in the whole table); the scratch offsets and
/// dictionary indices count from the part's first page.
pub fn page_table_of(
    plan: &ScanPlan,
    chunks: std::ops::Range<usize>,
    raw: &[u8],
) -> Result<std::result::Result<PageTable, Fallback>> {
    let mut bases = Vec::with_capacity(chunks.len());
    let mut at = 0u64;
    for c in &plan.chunks[chunks.clone()] {
        bases.push(at);
        at += c.len;
    }
    if at as usize != raw.len() {
        return Err(DataFusionError::Internal("setfusion device scan: a part's bytes are not its chunks".into()));
    }
    let idx: Vec<usize> = (0..chunks.len()).collect();
    let walked = crate::host::par_map(&idx, 4, |&i| {
        let (c, b) = (&plan.chunks[chunks.start + i], bases[i]);
        walk_chunk(&raw[b as usize..(b + c.len) as usize], b, c, plan.width, plan.def_max)
    })?;
    let mut t = PageTable { rows: plan.rows, def_max: plan.def_max, ..Default::default() };
    for chunk in walked {
        let chunk = match chunk {
            Ok(c) => c,
            Err(f) => return Ok(Err(f)),
        };
        let first = t.pages.len() as u64;
        for mut p in chunk {
            if p.dict != NO_DICT {
                p.dict += first;
            }
            p.dst = t.body_len;
            t.body_len += p.dst_len.div_ceil(8) * 8;
            if p.kind != KIND_DICT {
                if p.def_max > 0 {
                    p.lvl_word = t.lvl_words;
                    t.lvl_words += p.num_values.div_ceil(32);
                }
                // (BYTE_ARRAY PLAIN pages: each value's start in the body.)
                if p.encoding == ENC_DICT
                    || p.encoding == ENC_RLE_BOOL
                    || (p.width == WIDTH_BYTES && p.encoding == ENC_PLAIN)
                {
                    p.idx_off = t.idx_len;
                    t.idx_len += p.num_values;
                }
                if p.encoding == ENC_DELTA {
                    p.idx_off = t.idx_len.next_multiple_of(2);
                    t.idx_len = p.idx_off + 2 * p.num_values;
                }
            }
            if p.kind == KIND_DICT && p.width == WIDTH_BYTES {
                // Each value's span (address, length) and hash, as u64 from an even entry.
                p.idx_off = t.idx_len.next_multiple_of(2);
                t.idx_len = p.idx_off + 6 * p.num_values;
            }
            t.pages.push(p);
        }
    }
    Ok(Ok(t))
}

#[cfg(test)]
mod footer_cache_tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use parquet::file::metadata::PageIndexPolicy;

    use super::{read_footer, read_footer_with};

    fn write(path: &std::path::Path, rows: i64) {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from_iter_values(0..rows))]).unwrap();
        // (Not `fixtures::write_file`: fixtures reads through this file, and files do not import each other.)
        let mut w =
            parquet::arrow::ArrowWriter::try_new(std::fs::File::create(path).unwrap(), batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }

    /// A file's footer is parsed once while the file stays as it is; a footer
    /// with its page index serves reads without one, not the other way round;
    /// a rewritten file is read again.
    #[test]
    fn footers_are_parsed_once_per_version_of_a_file() {
        let dir = std::env::temp_dir().join(format!("setfusion-footer-cache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.parquet");
        write(&path, 1000);
        let first = read_footer(&path).unwrap();
        assert!(Arc::ptr_eq(&first, &read_footer(&path).unwrap()), "the second read parsed again");
        assert!(super::footer_cache::len() >= 1);
        let indexed = read_footer_with(&path, PageIndexPolicy::Optional).unwrap();
        assert!(!Arc::ptr_eq(&first, &indexed), "a footer without its page index served a read asking for it");
        assert!(indexed.column_index().is_some() && indexed.offset_index().is_some());
        assert!(Arc::ptr_eq(&indexed, &read_footer(&path).unwrap()), "the indexed footer did not serve a plain read");
        assert!(Arc::ptr_eq(&indexed, &read_footer_with(&path, PageIndexPolicy::Optional).unwrap()));

        write(&path, 2500);
        let rewritten = read_footer(&path).unwrap();
        assert_eq!(rewritten.file_metadata().num_rows(), 2500, "a rewritten file's old footer was served");
        assert!(Arc::ptr_eq(&rewritten, &read_footer(&path).unwrap()));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
