//! The set selection where one or both inputs are [`DeviceScanExec`]s: those
//! sides' keys are decoded on the device from their Parquet files
//! ([`crate::scan`]) and never exist as Arrow batches; a host side's keys are
//! encoded and uploaded as usual. Both end as device keys, NULLs are handled
//! by SQL's rules exactly as the host path handles them ([`Selector`]: the
//! non-NULL keys compacted on the device form the keyed core, NULL rows are
//! decided around it), and the keyed core runs on the resident keys
//! ([`crate::algo::select::select_resident`]).
//!
//! String keys are hashes: the device reads both sides or neither, and
//! [`prove_string_keys`] proves over both sides' decoded bytes that equal
//! hashes mean equal strings before the selection trusts them. Composite
//! keys (exact fixed-width columns) are packed once both sides' filters have
//! run ([`pack_composite_keys`]): each column's range over both sides' kept
//! rows is reduced on the device, and the columns become one mixed-radix
//! 64-bit key, exact like the host's `keys::encode_packed` (a kept row with
//! a NULL key column, or ranges past 2^64, leave both sides to the host). A mark join
//! uses the same selection (`MarkJoinExec`'s subquery side read by the
//! device, its probe side too where the device decodes its columns: then
//! every probe row's columns come back, [`ProbeOutput::every_row`]).

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::buffer::{BooleanBuffer, Buffer, NullBuffer};
use datafusion::arrow::datatypes::DataType;
use datafusion::error::Result;
use datafusion::physical_expr::PhysicalExprRef;

use super::device_scan::{DeviceScanExec, ScanFilter};
use super::memory::hold_device;
use super::selection::{coerce_like, forced_strategy, key_columns, Selector};
use crate::algo::join_filter::{op, Instr};
use crate::algo::select::SetOp;
use crate::config::SetfusionConfig;
use crate::gpu::{self, DeviceBuffer, Gpu, KeptAggregates, TransferStats};
use crate::keys;
use crate::scan::ScanReport;

/// One input of the selection.
pub(crate) enum Side<'a> {
    /// Keys read by the device from the scan's files.
    Device(&'a DeviceScanExec),
    /// Collected batches and the key expression over them.
    Host(Vec<&'a RecordBatch>, PhysicalExprRef),
}

/// One side's keys on the device.
struct SideKeys {
    keys: DeviceBuffer<u64>,
    n: usize,
    /// Validity (None: no NULL key), on the host and on the device (None
    /// there: the NULL rows are the last ones, and `keys` starts with the others).
    nulls: Option<(NullBuffer, Option<DeviceBuffer<u32>>)>,
    report: Option<ScanReport>,
    /// A filtered side: the file rows its filter kept, in its keys' order.
    kept: Option<FilteredRows>,
    /// A string key: its rows' hashes and bytes as decoded, for the proof
    /// that equal hashes mean equal strings ([`prove_string_keys`]).
    strings: Option<StringKeys>,
    /// A filtered side's output columns its filter decoded (over its file
    /// rows), kept for the payload so they are not read again.
    outputs: Vec<(String, crate::scan::DeviceDecoded)>,
    /// A composite key's columns, not yet packed into `keys` ([`pack_composite_keys`]).
    composite: Option<CompositeColumns>,
}

/// A composite key's columns as one side decoded them (over its file rows),
/// and the range of each over the rows its filter kept: the key is packed
/// once both sides' ranges are known ([`pack_composite_keys`]).
struct CompositeColumns {
    columns: Vec<DeviceBuffer<u64>>,
    /// Each column's kept rows' aggregates (their min and max).
    ranges: Vec<KeptAggregates>,
    file_rows: usize,
}

/// A BYTE_ARRAY key's rows as the device decoded them (all of them, before a
/// filter compacted the keys): each row's hash and where its bytes lie.
struct StringKeys {
    /// None: the side's `keys` themselves (no filter compacted them).
    hashes: Option<DeviceBuffer<u64>>,
    strings: crate::scan::DeviceStrings,
    rows: usize,
}

/// For string keys: prove on the device that equal hashes mean equal bytes
/// over both sides' values, so the selection may run on the hashes. Then the
/// bytes are freed. `Ok(Some(why))`: the host must compare them (a side
/// without its bytes on the device, or two strings that share a hash).
fn prove_string_keys(
    g: &Gpu,
    probe: &mut SideKeys,
    build: &mut SideKeys,
    stats: &mut TransferStats,
) -> Result<Option<String>> {
    let (Some(p), Some(b)) = (probe.strings.take(), build.strings.take()) else {
        return Ok(Some("string keys: a side's bytes are not on the device".into()));
    };
    fn rows<'a>(k: &'a StringKeys, s: &'a SideKeys) -> (&'a DeviceBuffer<u64>, &'a DeviceBuffer<u64>, usize) {
        (k.hashes.as_ref().unwrap_or(&s.keys), &k.strings.spans, k.rows)
    }
    let proved = crate::algo::row_hash::spans_collision_free(g, rows(&b, build), rows(&p, probe), stats)?;
    Ok((!proved).then(|| "string keys: two different strings share a 64-bit hash; the host compares them".into()))
}

impl SideKeys {
    fn null_count(&self) -> usize {
        self.nulls.as_ref().map_or(0, |(n, _)| n.null_count())
    }
    /// The non-NULL keys (all of them when none is NULL), on the device.
    fn core(self, g: &Gpu, stats: &mut TransferStats) -> Result<(DeviceBuffer<u64>, usize)> {
        match &self.nulls {
            None => Ok((self.keys, self.n)),
            Some((_, Some(valid))) => gpu::compact_kept_keys_on_device(g, &self.keys, valid, self.n, stats),
            Some((nulls, None)) => Ok((self.keys, self.n - nulls.null_count())),
        }
    }
}

/// The columns a device-scanned side reads (each once; a filtered side's
/// key is among its filter's columns) and the row groups and rows it reads
/// them in: a filtered side's own (its filter's statistics, bloom filters and
/// page index), else `keep`.
struct SideReads<'a> {
    scan: &'a DeviceScanExec,
    keep: crate::scan::Keep,
    pruned: Option<crate::scan::pages::Pruned>,
    columns: Vec<(&'a str, &'a DataType)>,
}

impl<'a> SideReads<'a> {
    fn of(scan: &'a DeviceScanExec, keep: &crate::scan::Keep) -> Result<Self> {
        let Some(filter) = scan.filter() else {
            return Ok(SideReads {
                scan,
                keep: keep.clone(),
                pruned: None,
                columns: vec![(scan.column(), scan.data_type())],
            });
        };
        let (keep, pruned) = scan.row_groups_to_read()?;
        let mut columns: Vec<(&str, &DataType)> = Vec::new();
        for (name, t) in &filter.columns {
            if !columns.iter().any(|(n, _)| n == name) {
                columns.push((name.as_str(), t));
            }
        }
        Ok(SideReads { scan, keep, pruned, columns })
    }

    /// Does `other` read column `i` of the same files as this side, in the same rows?
    fn same_column(&self, i: usize, other: &SideReads<'_>, j: usize) -> bool {
        self.columns[i] == other.columns[j] && self.keep == other.keep && self.scan.files() == other.scan.files()
    }
}

/// One column a side read: its name, its keys and report, and whether it was
/// read in one pipeline with others (their times overlap).
type ColumnRead<'a> = (&'a str, (crate::scan::DeviceDecoded, ScanReport), bool);

/// How the columns of several sides are decoded: `own` each on its own
/// (through the column cache, which holds it, or apart under
/// `SETFUSION_SCAN_COLUMNS_APART`), `reads` together in one pipeline, and
/// `alike` (a column one of the `reads` already reads the same way: the
/// index of that read) copied on the device from it. Each entry: (side, column).
struct SidesPlan {
    own: Vec<(usize, usize)>,
    reads: Vec<(usize, usize)>,
    alike: Vec<(usize, usize, usize)>,
}

impl SidesPlan {
    /// `cached`: does the column cache hold this column of this side?
    fn of(sides: &[&SideReads<'_>], cached: impl Fn(&SideReads<'_>, &str, &DataType) -> bool) -> Self {
        let apart = crate::env::scan_columns_apart();
        let mut plan = SidesPlan { own: Vec::new(), reads: Vec::new(), alike: Vec::new() };
        for (si, s) in sides.iter().enumerate() {
            for (ci, &(name, t)) in s.columns.iter().enumerate() {
                if apart || cached(s, name, t) {
                    plan.own.push((si, ci));
                    continue;
                }
                // Strings stay apart: their decoded spans point into their own page bodies.
                let shared = (!crate::scan::is_byte_type(t))
                    .then(|| plan.reads.iter().position(|&(sj, cj)| sides[sj].same_column(cj, s, ci)))
                    .flatten();
                match shared {
                    Some(r) => plan.alike.push((si, ci, r)),
                    None => plan.reads.push((si, ci)),
                }
            }
        }
        plan
    }

    /// The columns read together, in `reads`' order.
    fn columns<'s>(&self, sides: &[&SideReads<'s>]) -> Vec<crate::scan::PairSide<'s>> {
        self.reads
            .iter()
            .map(|&(si, ci)| {
                let s = sides[si];
                let (name, t) = s.columns[ci];
                crate::scan::PairSide { files: s.scan.files(), column: name, arrow: t, keep: s.keep.clone() }
            })
            .collect()
    }
}

/// The columns of `sides` decoded on the device as `plan` says: those in the
/// column cache from it, the others read together in one pipeline of reads,
/// uploads and decodes (`scan_columns_to_device`, or, with `early`, what host
/// threads read of them while the device started), a column that two sides
/// read alike (two filters over one table) read once and copied on the device
/// for the second. Per side, its columns in its order. (Read one after
/// another, with the whole of each column read before its upload, on the
/// H100: 100M rows, two columns, 166 ms warm; the next column's files read
/// while one uploaded and decoded, into fresh buffers while the kept ones were
/// still held: 212 ms.) `Ok(Err(why))`: files the device does not decode.
fn read_sides<'a>(
    g: &Gpu,
    sides: &[&SideReads<'a>],
    plan: &SidesPlan,
    early: Option<crate::scan::ReadAhead>,
    cache_limit: usize,
    stats: &mut TransferStats,
) -> Result<std::result::Result<Vec<Vec<ColumnRead<'a>>>, String>> {
    let mut got: Vec<Vec<Option<ColumnRead<'a>>>> =
        sides.iter().map(|s| s.columns.iter().map(|_| None).collect()).collect();
    for &(si, ci) in &plan.own {
        let s = sides[si];
        let (name, t) = s.columns[ci];
        match crate::scan::scan_to_device(g, s.scan.files(), name, t, &s.keep, cache_limit, None, stats)? {
            Ok(d) => got[si][ci] = Some((name, d, false)),
            Err(why) => return Ok(Err(format!("column {name}: {}", why.0))),
        }
    }
    if !plan.reads.is_empty() {
        let columns = plan.columns(sides);
        let scanned = match early {
            Some(read) => crate::scan::finish_read_ahead(g, &columns, cache_limit, read, stats)?,
            None => crate::scan::scan_columns_to_device(g, &columns, cache_limit, stats)?,
        };
        let scanned = match scanned {
            Ok(scanned) => scanned,
            Err((i, why)) => return Ok(Err(format!("column {}: {}", columns[i].column, why.0))),
        };
        let mut scanned: Vec<Option<(crate::scan::DeviceDecoded, ScanReport)>> =
            scanned.into_iter().map(Some).collect();
        for &(si, ci, r) in &plan.alike {
            let Some((d, report)) = &scanned[r] else { continue };
            let copy = crate::scan::DeviceDecoded {
                keys: g.copy_on_device(&d.keys, d.rows)?,
                valid: d.valid.as_ref().map(|v| g.copy_on_device(v, d.rows.div_ceil(32))).transpose()?,
                rows: d.rows,
                // A string column's spans, sharing its page bodies.
                strings: d.strings.as_ref().map(|s| s.shared_copy(g)).transpose()?,
            };
            // Its bytes and pages count with the side that read them.
            let report = ScanReport { bytes_read: 0, bytes_decoded: 0, pages: 0, shared_columns: 1, ..report.clone() };
            got[si][ci] = Some((sides[si].columns[ci].0, (copy, report), true));
        }
        for (r, &(si, ci)) in plan.reads.iter().enumerate() {
            let Some(d) = scanned[r].take() else { continue };
            got[si][ci] = Some((sides[si].columns[ci].0, d, true));
        }
    }
    Ok(Ok(got.into_iter().map(|side| side.into_iter().flatten().collect()).collect()))
}

/// [`SidesPlan::of`]'s `cached` on `g`: with the cache on, does it hold the column?
fn cached_on(g: &Gpu, cache_limit: usize) -> impl Fn(&SideReads<'_>, &str, &DataType) -> bool + '_ {
    move |s, name, t| cache_limit > 0 && crate::scan::is_cached_within(g, s.scan.files(), name, t, &s.keep)
}

/// A device-scanned side whose input filters its rows: the key and filter
/// columns decoded (each through the column cache), the filter run on the
/// device ([`crate::algo::join_filter::pass_rows_gpu`]), and the kept rows'
/// keys compacted there, the NULL keys' rows last. `Ok(Err(why))`: the host
/// reads the input (files the device does not decode, or arithmetic that
/// overflows, which DataFusion's FilterExec raises or wraps as it does).
/// The filter's columns named in `outputs` are kept for the payload.
fn filtered_side(
    g: &Gpu,
    scan: &DeviceScanExec,
    filter: &ScanFilter,
    outputs: &[String],
    cache_limit: usize,
    stats: &mut TransferStats,
) -> Result<std::result::Result<SideKeys, String>> {
    let reads = SideReads::of(scan, &Default::default())?;
    let plan = SidesPlan::of(&[&reads], cached_on(g, cache_limit));
    let got = match read_sides(g, &[&reads], &plan, None, cache_limit, stats)? {
        Ok(mut got) => got.pop().unwrap_or_default(),
        Err(why) => return Ok(Err(why)),
    };
    filtered_keys(g, reads, filter, got, outputs, stats)
}

/// [`filtered_side`] once its columns are decoded (`got`, read as `reads` says).
fn filtered_keys(
    g: &Gpu,
    reads: SideReads<'_>,
    filter: &ScanFilter,
    got: Vec<ColumnRead<'_>>,
    outputs: &[String],
    stats: &mut TransferStats,
) -> Result<std::result::Result<SideKeys, String>> {
    let SideReads { scan, keep, pruned, .. } = reads;
    let by_bloom_filters = pruned.as_ref().map_or(0, |p| p.by_bloom_filters);
    let mut decoded: Vec<(&str, crate::scan::DeviceDecoded)> = Vec::new();
    let mut report = ScanReport::default();
    let mut together = ScanReport::default();
    for (name, (d, r), with_others) in got {
        if name == scan.column() {
            report = ScanReport {
                rows: r.rows,
                cache: r.cache.clone(),
                row_groups: r.row_groups,
                row_groups_pruned: r.row_groups_pruned,
                row_groups_pruned_by_bloom_filters: by_bloom_filters,
                rows_pruned_by_page_index: pruned.as_ref().map_or(0, |p| p.rows_pruned_by_page_index),
                streamed: r.streamed,
                decoded_while_read: r.decoded_while_read,
                ..report
            };
        }
        if with_others {
            // Read side by side: their times overlap.
            together.read = together.read.max(r.read);
            together.upload = together.upload.max(r.upload);
            together.decode = together.decode.max(r.decode);
            let (read, upload, decode) = Default::default();
            together.add_column(&ScanReport { read, upload, decode, ..r.clone() });
        } else {
            report.add_column(&r);
        }
        decoded.push((name, d));
    }
    report.add_column(&together);
    let n = decoded.last().map_or(0, |(_, d)| d.rows);
    if decoded.iter().any(|(_, d)| d.rows != n) {
        return Ok(Err("the filter's columns have different row counts".into()));
    }
    let t = std::time::Instant::now();
    let decoded_column = |name: &str| decoded.iter().find(|(c, _)| *c == name).map(|(_, d)| d);
    // A string column compared with literals: read by the programs as the
    // number of the literal each row equals; under LIKE, as whether each row
    // matches; worked out from its bytes.
    let mut numbered: Vec<(usize, crate::gpu::DeviceBuffer<u64>)> = Vec::new();
    let spans_of = |c: usize| {
        let name = filter.columns[c].0.as_str();
        decoded_column(name)
            .and_then(|d| d.strings.as_ref().map(|s| (&s.spans, d.rows)))
            .ok_or_else(|| format!("the filter's string column {name} was decoded without its bytes"))
    };
    for l in &filter.literals {
        let (spans, rows) = match spans_of(l.column) {
            Ok(s) => s,
            Err(why) => return Ok(Err(why)),
        };
        numbered.push((l.column, crate::algo::row_hash::match_literals_gpu(g, spans, rows, &l.literals, stats)?));
    }
    for p in &filter.patterns {
        let (spans, rows) = match spans_of(p.column) {
            Ok(s) => s,
            Err(why) => return Ok(Err(why)),
        };
        numbered.push((p.column, crate::algo::row_hash::match_like_gpu(g, spans, rows, &p.pattern, stats)?));
    }
    let column = |name: &str| decoded_column(name).map(|d| (&d.keys, d.valid.as_ref()));
    let mut cols: Vec<_> = filter
        .columns
        .iter()
        .enumerate()
        .filter_map(|(i, (name, _))| {
            let (keys, valid) = column(name)?;
            Some((numbered.iter().find(|(c, _)| *c == i).map_or(keys, |(_, numbers)| numbers), valid))
        })
        .collect();
    let Some((key, key_valid)) = column(scan.column()) else {
        return Err(datafusion::error::DataFusionError::Internal("setfusion device scan: the key column".into()));
    };
    // Rows the page index ruled out (their pages were not read) are dropped
    // too, as DataFusion's scan never returns them: the programs AND "the
    // row is selected", a column whose validity is the selection (its values,
    // the key's, are not looked at).
    let mask = match &keep.rows {
        Some(rows) => {
            let bits = rows.mask(keep.row_groups.as_deref());
            if bits.len() != n.div_ceil(32) {
                return Ok(Err(format!("the page index selects {} words of rows for {n} rows", bits.len())));
            }
            Some(g.upload(if bits.is_empty() { &[0u32][..] } else { &bits }, stats)?)
        }
        None => None,
    };
    let (keep_valid, keep_null) = match &mask {
        Some(m) => {
            cols.push((key, Some(m)));
            (selected_only(&filter.keep_valid, cols.len() - 1), selected_only(&filter.keep_null, cols.len() - 1))
        }
        None => (filter.keep_valid.clone(), filter.keep_null.clone()),
    };
    let overflow = "the filter's arithmetic overflows on the device; DataFusion's FilterExec evaluates it";
    let Some(pass) = crate::algo::join_filter::pass_rows_gpu(g, &cols, &[], n, &keep_valid, stats)? else {
        return Ok(Err(overflow.into()));
    };
    // A composite key: its rows' keys are packed once both sides are known
    // (`keys` stays empty until then), from its columns' ranges over the kept rows.
    let key_names: Vec<&str> = scan.more_keys().iter().map(|(name, _)| name.as_str()).collect();
    let mut composite = None;
    let (keys, m) = if key_names.is_empty() {
        gpu::compact_kept_keys_on_device(g, key, &pass, n, stats)?
    } else {
        let mut columns = Vec::with_capacity(1 + key_names.len());
        let mut ranges = Vec::with_capacity(1 + key_names.len());
        for name in std::iter::once(scan.column()).chain(key_names.iter().copied()) {
            let Some((values, _)) = column(name) else {
                return Ok(Err(format!("the composite key's column {name} was not decoded")));
            };
            ranges.push(gpu::reduce_kept(g, values, None, &pass, n, stats)?);
            columns.push(g.copy_on_device(values, n)?);
        }
        let m = ranges.first().map_or(0, |r| r.values as usize);
        composite = Some(CompositeColumns { columns, ranges, file_rows: n });
        (g.alloc::<u64>(1)?, m)
    };
    let any_key_nulls = key_valid.is_some()
        || scan.more_keys().iter().any(|(name, _)| column(name).is_some_and(|(_, valid)| valid.is_some()));
    let (z, null_pass) = match any_key_nulls {
        false => (0, None),
        true => match crate::algo::join_filter::pass_rows_gpu(g, &cols, &[], n, &keep_null, stats)? {
            Some(pass) => {
                let z = gpu::count_kept_on_device(g, &pass, n, stats)?;
                (z, (z > 0).then_some(pass))
            }
            None => return Ok(Err(overflow.into())),
        },
    };
    if composite.is_some() && z > 0 {
        // (NULL, 1) is not (NULL, 2) in a set operation, and never matches in
        // a join: the host's exact encoding tells them apart.
        return Ok(Err(format!("{z} kept rows with a NULL in a composite key column")));
    }
    report.filtered = Some(((m + z) as u64, t.elapsed(), decoded.len()));
    let nulls = (z > 0).then(|| {
        let mut bits = datafusion::arrow::array::BooleanBufferBuilder::new(m + z);
        bits.append_n(m, true);
        bits.append_n(z, false);
        (NullBuffer::new(bits.finish()), None)
    });
    // The rows kept, for output columns read afterwards.
    let kept = Some(FilteredRows { valid: pass, null: null_pass, file_rows: n, keep });
    // A string key's hashes and bytes of every row read, for the proof; the
    // output columns the filter read, for the payload (read once, not twice).
    let (mut strings, mut ready) = (None, Vec::new());
    for (name, d) in decoded {
        if name == scan.column() && d.strings.is_some() {
            let crate::scan::DeviceDecoded { keys, strings: bytes, rows, .. } = d;
            strings = bytes.map(|bytes| StringKeys { hashes: Some(keys), strings: bytes, rows });
        } else if outputs.iter().any(|o| o == name) {
            ready.push((name.to_string(), d));
        }
    }
    Ok(Ok(SideKeys { keys, n: m + z, nulls, report: Some(report), kept, strings, outputs: ready, composite }))
}

/// Both sides' composite keys packed into one exact 64-bit key a row
/// ([`gpu::pack_key_columns`]) by ranges that cover both sides' kept rows,
/// and compacted to the kept rows (sides without a composite key are
/// returned as they are). `Ok(Err(why))`: the ranges multiply past 2^64.
fn pack_composite_keys(
    g: &Gpu,
    mut probe: SideKeys,
    mut build: SideKeys,
    stats: &mut TransferStats,
) -> Result<std::result::Result<(SideKeys, SideKeys), String>> {
    let (p, b) = match (probe.composite.take(), build.composite.take()) {
        (None, None) => return Ok(Ok((probe, build))),
        (Some(p), Some(b)) if p.columns.len() == b.columns.len() => (p, b),
        _ => return Ok(Err("composite keys: one side's key columns were not decoded".into())),
    };
    let mut bounds = Vec::with_capacity(p.ranges.len());
    for (a, c) in p.ranges.iter().zip(&b.ranges) {
        let r = a.merge(*c);
        if r.values == 0 {
            bounds.push((0i64, 1u64));
            continue;
        }
        match u64::try_from(r.max as i128 - r.min as i128 + 1) {
            Ok(range) => bounds.push((r.min, range)),
            Err(_) => return Ok(Err("a composite key column's values span more than 64 bits".into())),
        }
    }
    for (side, columns) in [(&mut probe, p), (&mut build, b)] {
        let Some(kept) = side.kept.as_ref() else {
            return Ok(Err("composite keys of a side without its filter's rows".into()));
        };
        let cols: Vec<&DeviceBuffer<u64>> = columns.columns.iter().collect();
        let Some(packed) = gpu::pack_key_columns(g, &cols, &bounds, &kept.valid, columns.file_rows, stats)? else {
            return Ok(Err("the composite key's column ranges multiply past 64 bits".into()));
        };
        let (keys, m) = gpu::compact_kept_keys_on_device(g, &packed, &kept.valid, columns.file_rows, stats)?;
        if m != side.n {
            return Ok(Err(format!("composite keys: {m} packed, {} kept rows", side.n)));
        }
        side.keys = keys;
    }
    crate::util::trace("device scan: composite keys packed");
    Ok(Ok((probe, build)))
}

/// `prog` AND "column `selection` is not NULL" (a row the page index
/// selects), tested last, so the program's stack grows by no more than the
/// key test at its end already takes.
fn selected_only(prog: &[Instr], selection: usize) -> Vec<Instr> {
    let mut p = prog.to_vec();
    p.extend([Instr::new(op::COL, selection as u32, 0), Instr::new(op::IS_NOT_NULL, 0, 0), Instr::new(op::AND, 0, 0)]);
    p
}

/// Validity words (LSB first) as a NULL buffer of `n` rows; None without NULLs.
fn null_buffer(words: Vec<u32>, n: usize) -> Option<NullBuffer> {
    Some(NullBuffer::new(BooleanBuffer::new(Buffer::from_vec(words), 0, n))).filter(|b| b.null_count() > 0)
}

fn side_keys(
    g: &Gpu,
    side: Side<'_>,
    key_type: &DataType,
    keep: &crate::scan::Keep,
    outputs: &[String],
    cache_limit: usize,
    ahead: Option<crate::scan::ReadAhead>,
    stats: &mut TransferStats,
) -> Result<std::result::Result<SideKeys, String>> {
    match side {
        Side::Device(scan) if scan.filter().is_some() => {
            filtered_side(g, scan, scan.filter().expect("checked"), outputs, cache_limit, stats)
        }
        Side::Device(scan) => match crate::scan::scan_to_device(
            g,
            scan.files(),
            scan.column(),
            scan.data_type(),
            keep,
            cache_limit,
            ahead,
            stats,
        )? {
            Ok(d) => Ok(Ok(device_side(g, d, stats)?)),
            Err(why) => Ok(Err(why.0)),
        },
        Side::Host(batches, expr) => {
            let cols = key_columns(&batches, std::slice::from_ref(&expr))?;
            let types = [key_type.clone()];
            let cols = cols.into_iter().map(|c| coerce_like(c, &types)).collect::<Result<Vec<_>>>()?;
            let encoded = keys::encode(&cols, &types, None, true)?;
            let n = encoded.len();
            let (keys, _) = g.upload_keys(&encoded.slices(), stats)?;
            let nulls = match encoded.nulls {
                Some(nb) => {
                    let d = upload_bits(g, nb.inner(), stats)?;
                    Some((nb, Some(d)))
                }
                None => None,
            };
            Ok(Ok(SideKeys {
                keys,
                n,
                nulls,
                report: None,
                kept: None,
                strings: None,
                outputs: Vec::new(),
                composite: None,
            }))
        }
    }
}

/// `s`'s key column read in the row groups `keep` leaves.
fn key_column(s: &DeviceScanExec, keep: crate::scan::Keep) -> crate::scan::PairSide<'_> {
    crate::scan::PairSide { files: s.files(), column: s.column(), arrow: s.data_type(), keep }
}

/// Key columns the caller started reading on host threads ([`read_ahead`])
/// while it collected the other side's batches.
#[derive(Default)]
pub(crate) struct ReadAheads {
    pub probe: Option<crate::scan::ReadAhead>,
    pub build: Option<crate::scan::ReadAhead>,
}

/// Start reading `scan`'s key column on host threads, for a caller that
/// collects the other input's batches on the host before the selection, so
/// the two overlap (else the device's reads wait for the collection): an
/// unfiltered side (a filtered one reads its filter's columns too) whose
/// keys the column cache does not hold. Its rows are all row groups (no key
/// range: the other side is not read by the device).
pub(crate) fn read_ahead(scan: &DeviceScanExec, cfg: &SetfusionConfig) -> Option<crate::scan::ReadAhead> {
    // (String keys beside a host side are read on the host: `select_device_scanned`.)
    if scan.filter().is_some() || crate::scan::is_byte_type(scan.data_type()) {
        return None;
    }
    // (A device still starting holds nothing in its cache.)
    if cfg.cache_limit.0 > 0 && matches!(gpu::readiness_if_started(cfg.device), Some(gpu::Readiness::Ready)) {
        let device = gpu::gpu(cfg.device).ok()?;
        if crate::scan::is_cached(&device, scan.files(), scan.column(), scan.data_type()) {
            return None;
        }
    }
    Some(crate::scan::ReadAhead::start(&[key_column(scan, Default::default())]))
}

/// A device-scanned side's keys from its decoded columns (`got`, read as
/// `reads` says): filtered on the device, or its key column as read.
fn side_from_reads(
    g: &Gpu,
    reads: SideReads<'_>,
    got: Vec<ColumnRead<'_>>,
    outputs: &[String],
    stats: &mut TransferStats,
) -> Result<std::result::Result<SideKeys, String>> {
    match reads.scan.filter() {
        Some(filter) => filtered_keys(g, reads, filter, got, outputs, stats),
        None => match got.into_iter().next() {
            Some((_, decoded, _)) => Ok(Ok(device_side(g, decoded, stats)?)),
            None => Err(datafusion::error::DataFusionError::Internal("setfusion device scan: a side's key".into())),
        },
    }
}

/// A device-scanned side's keys, with its NULLs as a host buffer too.
fn device_side(
    g: &Gpu,
    (decoded, report): (crate::scan::DeviceDecoded, ScanReport),
    stats: &mut TransferStats,
) -> Result<SideKeys> {
    let n = decoded.rows;
    let nulls = match decoded.valid {
        Some(valid) => null_buffer(g.download(&valid, n.div_ceil(32), stats)?, n).map(|b| (b, Some(valid))),
        None => None,
    };
    let strings = decoded.strings.map(|strings| StringKeys { hashes: None, strings, rows: n });
    Ok(SideKeys {
        keys: decoded.keys,
        n,
        nulls,
        report: Some(report),
        kept: None,
        strings,
        outputs: Vec::new(),
        composite: None,
    })
}

fn describe(which: &str, r: &ScanReport) -> String {
    let filtered = match r.filtered {
        Some((kept, took, columns)) => format!(
            ", filtered on the device in {:.1} ms ({columns} columns): {kept} rows kept",
            took.as_secs_f64() * 1e3
        ),
        None => String::new(),
    };
    if let Some(hit @ crate::scan::CacheUse::Hit { .. }) = r.cache {
        return format!("{which}: {} rows, {hit} (copied in {:.1} ms)", r.rows, r.upload.as_secs_f64() * 1e3)
            + &filtered;
    }
    let cache = r.cache.map(|c| format!(", {c}")).unwrap_or_default()
        + &if r.row_groups_pruned > 0 {
            let by = match (r.filtered.is_some(), r.row_groups_pruned_by_bloom_filters) {
                (false, _) => "the build side's key range".to_string(),
                (true, 0) => "their statistics against the filter".to_string(),
                (true, b) => format!("their statistics and bloom filters against the filter ({b} by bloom filters)"),
            };
            format!(", {} of {} row groups pruned by {by}", r.row_groups_pruned, r.row_groups)
        } else {
            String::new()
        }
        + &if r.pages_pruned > 0 {
            format!(
                ", {} data pages not read ({} rows ruled out by the page index)",
                r.pages_pruned, r.rows_pruned_by_page_index
            )
        } else {
            String::new()
        };
    let shared = match r.shared_columns {
        0 => String::new(),
        n => format!(", {n} of its columns read once with the other side's"),
    };
    if r.pages == 0 && r.shared_columns > 0 {
        // Nothing read of its own: its bytes and times are the other side's.
        return format!("{which}: {} rows", r.rows) + &shared + &cache + &filtered;
    }
    // Streamed, the upload's time (but its tail) lies within the reads'.
    let secs = (r.read + r.upload + r.decode).as_secs_f64().max(1e-9);
    format!(
        "{which}: {} rows, {} pages, {:.1} MB read in {:.1} ms, {} {:.1} ms, {} {:.1} ms ({:.1} GB/s of keys end to end)",
        r.rows,
        r.pages,
        r.bytes_read as f64 / 1e6,
        r.read.as_secs_f64() * 1e3,
        if r.streamed { "uploaded while read, then" } else { "uploaded in" },
        r.upload.as_secs_f64() * 1e3,
        if r.decoded_while_read { "decoded while read, then" } else { "decoded in" },
        r.decode.as_secs_f64() * 1e3,
        r.bytes_decoded as f64 / secs / 1e9,
    ) + &cache
        + &shared
        + &filtered
}

/// The probe side's columns the device decodes for the output (indices into
/// [`DeviceScanExec::payload`]), and whose rows: the kept ones (a semi join,
/// a set operation), or every row (a mark join, which outputs each probe row
/// with its mark).
#[derive(Clone, Copy)]
pub(crate) struct ProbeOutput<'a> {
    pub columns: &'a [usize],
    pub every_row: bool,
    /// With `every_row`: the filter and projection over the marked rows the
    /// device runs, so only the rows it keeps come back.
    pub filter: Option<&'a MarkedRowsFilter<'a>>,
    /// The columns' kept rows reduced on the device ([`gpu::reduce_kept`]:
    /// an aggregate above), not brought back.
    pub reduce: bool,
}

/// The selection of every probe row, what ran, each device scan's report,
/// and the probe side's output columns (of the rows [`ProbeOutput`] says),
/// decoded by the device (when asked for).
pub(crate) struct DeviceSelected {
    pub selection: BooleanBuffer,
    pub ran: String,
    pub reports: Vec<(String, ScanReport)>,
    /// The output columns of the probe rows asked for (the device decoded them),
    /// in the selection's order.
    pub payload: Option<Vec<ArrayRef>>,
    /// With [`ProbeOutput::filter`], where the device ran it: the rows it
    /// kept (`payload` is then their projected columns).
    pub filtered_rows: Option<usize>,
    /// With [`ProbeOutput::reduce`], where the device ran it: each output
    /// column's kept rows' aggregates (`payload` is then empty).
    pub reduced: Option<Vec<KeptAggregates>>,
    /// The build side's rows (after its filter), and of them those with a NULL key.
    pub build_rows: usize,
    pub build_nulls: usize,
}

/// A selection's bits as the device's 32-bit words, uploaded.
fn upload_bits(g: &Gpu, bits: &BooleanBuffer, stats: &mut TransferStats) -> Result<DeviceBuffer<u32>> {
    let bytes = bits.sliced();
    let bytes = bytes.as_slice();
    let whole = bytes.len() / 4 * 4;
    let mut words: Vec<u32> = Vec::with_capacity(bytes.len().div_ceil(4).max(1));
    words.extend(bytes[..whole].chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])));
    if whole < bytes.len() || words.is_empty() {
        let mut w = [0u8; 4];
        w[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
        words.push(u32::from_le_bytes(w));
    }
    g.upload(&words, stats)
}

/// The selection's words already on the device (`on_device`: the bits the
/// selection computed there) where a column's one segment is the whole
/// selection (an unfiltered probe side), so they need no upload.
fn whole_selection<'a>(
    segments: &[(crate::scan::DeviceDecoded, BooleanBuffer)],
    on_device: Option<&'a DeviceBuffer<u32>>,
) -> Option<&'a DeviceBuffer<u32>> {
    match (segments, on_device) {
        ([(_, sel)], Some(words)) if words.len() >= sel.len().div_ceil(32) => Some(words),
        _ => None,
    }
}

/// Each output column's kept rows' aggregates, reduced on the device
/// ([`gpu::reduce_kept`]): four numbers a column come back, not its rows.
/// Every column has the same segments of the selection ([`payload_on_device`]),
/// so each segment's words are uploaded once, from the first column's.
/// `Ok(Err(why))`: a column whose segments are not those.
fn reduce_payload(
    g: &Gpu,
    columns: &[PayloadColumn],
    on_device: Option<&DeviceBuffer<u32>>,
    stats: &mut TransferStats,
) -> Result<std::result::Result<Vec<KeptAggregates>, String>> {
    let Some(first) = columns.first() else { return Ok(Ok(Vec::new())) };
    let uploaded: Vec<(usize, DeviceBuffer<u32>)>;
    let words: Vec<(usize, &DeviceBuffer<u32>)> = match whole_selection(&first.segments, on_device) {
        Some(w) => vec![(first.segments[0].1.len(), w)],
        None => {
            uploaded = first
                .segments
                .iter()
                .map(|(_, sel)| Ok((sel.len(), upload_bits(g, sel, stats)?)))
                .collect::<Result<_>>()?;
            uploaded.iter().map(|(n, w)| (*n, w)).collect()
        }
    };
    crate::util::trace("device select: selection words on the device");
    let mut out = Vec::with_capacity(columns.len());
    for column in columns {
        if column.segments.len() != words.len() {
            return Ok(Err(format!(
                "column {}: {} segments, the first column {}",
                column.name,
                column.segments.len(),
                words.len()
            )));
        }
        let mut agg = KeptAggregates::EMPTY;
        for ((d, _), (bits, sel_words)) in column.segments.iter().zip(&words) {
            if *bits != d.rows {
                return Ok(Err(format!("column {}: {} rows, a selection of {bits}", column.name, d.rows)));
            }
            agg = agg.merge(gpu::reduce_kept(g, &d.keys, d.valid.as_ref(), *sel_words, d.rows, stats)?);
        }
        out.push(agg);
    }
    Ok(Ok(out))
}

/// A filtered side's rows in the order its keys have: the file rows its
/// filter kept with a non-NULL key, then those with a NULL key (bits over
/// `file_rows`, the rows of the row groups `keep` leaves; the second None
/// when there are none).
pub(crate) struct FilteredRows {
    valid: DeviceBuffer<u32>,
    null: Option<DeviceBuffer<u32>>,
    file_rows: usize,
    keep: crate::scan::Keep,
}

/// Late materialization's grain: the selection marks rows kept in blocks of
/// this many (whole 32-bit words of a row mask); a data page holds a block or more.
const LATE_BLOCK: u64 = 4096;

/// Does `selection` keep a row of its rows `from .. from + len`?
fn keeps_any(selection: &BooleanBuffer, from: usize, len: usize) -> bool {
    len > 0 && selection.slice(from, len).count_set_bits() > 0
}

/// Do the kept rows of `selection` lie in more than half of its blocks of
/// [`LATE_BLOCK`] rows (in its own order)? Then late materialization would
/// leave little unread, and it is not tried: this look stops as soon as it
/// knows, so a dense selection costs a fraction of a scan of its bits.
fn kept_in_most_blocks(selection: &BooleanBuffer) -> bool {
    let (n, block) = (selection.len(), LATE_BLOCK as usize);
    let blocks = n.div_ceil(block);
    let (mut hit, mut missed) = (0usize, 0usize);
    for b in 0..blocks {
        if keeps_any(selection, b * block, block.min(n - b * block)) {
            hit += 1;
        } else {
            missed += 1;
        }
        if hit * 2 > blocks {
            return true;
        }
        if missed * 2 >= blocks {
            return false;
        }
    }
    false
}

/// Per block of [`LATE_BLOCK`] rows of the probe side's file rows (those its
/// `Keep` leaves, as its columns are decoded), whether the selection keeps a
/// row of it. `selection` is over the side's keys: for a filtered side, the
/// rows its filter kept with a non-NULL key, then those with a NULL key
/// (`filtered`), mapped back to file rows here. None: the rows do not add up.
fn kept_blocks(
    g: &Gpu,
    selection: &BooleanBuffer,
    filtered: Option<&FilteredRows>,
    stats: &mut TransferStats,
) -> Result<Option<Vec<bool>>> {
    let block = LATE_BLOCK as usize;
    let any = |from: usize, len: usize| keeps_any(selection, from, len);
    let Some(f) = filtered else {
        let n = selection.len();
        return Ok(Some((0..n.div_ceil(block)).map(|b| any(b * block, block.min(n - b * block))).collect()));
    };
    let words = f.file_rows.div_ceil(32);
    let valid = g.download(&f.valid, words, stats)?;
    let null = match &f.null {
        Some(d) => Some(g.download(d, words, stats)?),
        None => None,
    };
    let count = |w: &[u32]| w.iter().map(|w| w.count_ones() as usize).sum::<usize>();
    let valid_rows = count(&valid);
    if valid_rows + null.as_deref().map_or(0, count) != selection.len() {
        return Ok(None);
    }
    // The ranks of a block's kept rows among the valid ones, then among the NULL-keyed ones.
    let per = block / 32;
    let (mut rank_valid, mut rank_null) = (0usize, valid_rows);
    let mut out = Vec::with_capacity(words.div_ceil(per));
    for b in 0..words.div_ceil(per) {
        let span = b * per..((b + 1) * per).min(words);
        let in_valid = count(&valid[span.clone()]);
        let in_null = null.as_deref().map_or(0, |n| count(&n[span]));
        out.push(any(rank_valid, in_valid) || any(rank_null, in_null));
        rank_valid += in_valid;
        rank_null += in_null;
    }
    Ok(Some(out))
}

/// One output column of the probe side on the device: its rows in the
/// selection's order, as segments of decoded values (a filtered side's
/// NULL-keyed rows form a second one), each with its part of the selection.
struct PayloadColumn {
    name: String,
    data_type: DataType,
    segments: Vec<(crate::scan::DeviceDecoded, BooleanBuffer)>,
}

/// The probe side's output columns decoded on the device
/// ([`payload_on_device`]), each of the rows its selection keeps, brought back
/// as Arrow arrays. A column without NULLs is compacted on the device and
/// downloaded into pinned memory that its array owns; one with NULLs comes
/// back whole and is filtered on the host. `Ok(Err(why))`: the host reads the input.
fn download_payload(
    g: &Gpu,
    columns: Vec<PayloadColumn>,
    on_device: Option<&DeviceBuffer<u32>>,
    stats: &mut TransferStats,
) -> Result<std::result::Result<Vec<ArrayRef>, String>> {
    let mut out = Vec::with_capacity(columns.len());
    for column in columns {
        let mut pieces = Vec::with_capacity(column.segments.len());
        let words = whole_selection(&column.segments, on_device);
        for (d, sel) in &column.segments {
            pieces.push(kept_values(g, d, sel, words, stats)?);
        }
        let (values, kept_nulls) = if pieces.len() == 1 {
            pieces.pop().expect("one piece")
        } else {
            // A filtered side's NULL-keyed rows after the others (no NULL in the column here).
            let mut all: Vec<u8> = Vec::with_capacity(pieces.iter().map(|(b, _)| b.len()).sum());
            for (b, _) in &pieces {
                all.extend_from_slice(b.as_slice());
            }
            (Buffer::from_vec(all), None)
        };
        match lanes_to_array(&column.name, &column.data_type, values, kept_nulls)? {
            Ok(array) => out.push(array),
            Err(why) => return Ok(Err(why)),
        }
    }
    Ok(Ok(out))
}

/// The values of the rows `sel` keeps of one decoded column, as the device's
/// 64-bit lanes in a host buffer, with their validity. Every row kept: every
/// value, as it is. Without NULLs: the kept values only, compacted on the
/// device (by `d_sel`, the selection's words there, uploaded when None).
/// With them: every value, filtered on the host with the validity.
fn kept_values(
    g: &Gpu,
    d: &crate::scan::DeviceDecoded,
    sel: &BooleanBuffer,
    d_sel: Option<&DeviceBuffer<u32>>,
    stats: &mut TransferStats,
) -> Result<(Buffer, Option<NullBuffer>)> {
    use datafusion::arrow::array::{BooleanArray, Int64Array};
    let nulls = match &d.valid {
        Some(v) => null_buffer(g.download(v, d.rows.div_ceil(32), stats)?, d.rows),
        None => None,
    };
    let every_row = sel.len() == d.rows && sel.count_set_bits() == d.rows;
    Ok(match nulls {
        _ if every_row => (g.download_to_arrow(&d.keys, d.rows, stats)?.wait()?, nulls),
        None => {
            let uploaded = match d_sel {
                Some(_) => None,
                None => Some(upload_bits(g, sel, stats)?),
            };
            let words = d_sel.or(uploaded.as_ref()).expect("one of the two");
            let (pending, _) = gpu::compact_kept_keys(g, &d.keys, words, d.rows, stats)?;
            (pending.wait()?, None)
        }
        Some(nulls) => {
            let all = g.download_to_arrow(&d.keys, d.rows, stats)?.wait()?;
            let all = Int64Array::new(all.into(), Some(nulls));
            let kept = datafusion::arrow::compute::filter(&all, &BooleanArray::new(sel.clone(), None))?;
            let Some(kept) = kept.as_any().downcast_ref::<Int64Array>().cloned() else {
                return Err(datafusion::error::DataFusionError::Internal(
                    "setfusion device scan: filtering an Int64 array gave another type".into(),
                ));
            };
            let (_, values, nulls) = kept.into_parts();
            (values.into_inner(), nulls)
        }
    })
}

/// The device's 64-bit lanes (`values`), narrowed or widened to the column's
/// Arrow type. `Ok(Err(why))`: a type the device scan does not output.
fn lanes_to_array(
    name: &str,
    t: &DataType,
    values: Buffer,
    nulls: Option<NullBuffer>,
) -> Result<std::result::Result<ArrayRef, String>> {
    use datafusion::arrow::array::{BooleanArray, Date32Array, Decimal128Array, Int32Array, Int64Array};
    let lanes: datafusion::arrow::buffer::ScalarBuffer<i64> = values.into();
    Ok(Ok(match t {
        DataType::Boolean => Arc::new(BooleanArray::new(lanes.iter().map(|&v| v != 0).collect(), nulls)),
        DataType::Int64 => Arc::new(Int64Array::new(lanes, nulls)),
        DataType::Int32 => Arc::new(Int32Array::new(lanes.iter().map(|&v| v as i32).collect(), nulls)),
        DataType::Date32 => Arc::new(Date32Array::new(lanes.iter().map(|&v| v as i32).collect(), nulls)),
        DataType::Decimal128(p, sc) => Arc::new(
            Decimal128Array::new(lanes.iter().map(|&v| v as i128).collect(), nulls)
                .with_precision_and_scale(*p, *sc)?,
        ),
        other => return Ok(Err(format!("column {name} of type {other}"))),
    }))
}

/// A probe side read with no filter and nothing in the column cache has its
/// output columns read after the selection (late materialization) where the
/// build side has at most this share of its rows (one in 16); otherwise with
/// its keys, in one pipeline.
const SPARSE_BUILD_SHARE: u64 = 16;

/// The probe side's columns `needed` decoded on the device, in the
/// selection's order ([`PayloadColumn`]). A filtered side's column is put in
/// its keys' order (the rows its filter kept, NULL keys last: `filtered`),
/// which needs it without NULLs. Otherwise the columns are read from the row
/// groups the keys were (`keep`). `ready`: columns already decoded (read
/// with the keys, of every row the keys' scan read).
///
/// Late materialization: a column read from the files now (not in the
/// column cache) reads only the data pages that hold a kept row, where the
/// kept rows lie in at most half of the blocks of [`LATE_BLOCK`] rows; it
/// is not cached then. The note says how many pages that left unread.
#[allow(clippy::too_many_arguments)]
fn payload_on_device(
    g: &Gpu,
    scan: &DeviceScanExec,
    needed: &[usize],
    selection: &BooleanBuffer,
    filtered: Option<&FilteredRows>,
    keep: &crate::scan::Keep,
    mut ready: Vec<(String, crate::scan::DeviceDecoded)>,
    cache_limit: usize,
    stats: &mut TransferStats,
) -> Result<std::result::Result<(Vec<PayloadColumn>, Option<String>), String>> {
    let Some(columns) = scan.payload() else { return Ok(Err("no payload columns".into())) };
    if scan.filter().is_some() && filtered.is_none() {
        return Ok(Err("a filtered input without its filter's rows".into()));
    }
    let rows = selection.len();
    // The columns are read from the row groups (and rows) the keys were.
    let keep = filtered.map_or_else(|| keep.clone(), |f| f.keep.clone());
    // The `Keep` of the kept rows' pages: decided at the first column read from the files.
    let mut narrowed: Option<Option<crate::scan::Keep>> = None;
    let (mut late_pages, mut late_unread) = (0usize, 0usize);
    let mut out = Vec::with_capacity(needed.len());
    for &i in needed {
        let Some((name, t)) = columns.get(i) else { return Ok(Err(format!("no output column {i}"))) };
        let d = match ready.iter().position(|(n, _)| n == name) {
            Some(at) => ready.swap_remove(at).1,
            None => {
                let whole = cache_limit > 0 && crate::scan::is_cached_within(g, scan.files(), name, t, &keep);
                if !whole && narrowed.is_none() {
                    // A selection with kept rows in most of its own blocks is not tried (a filtered
                    // side's are blocks of the rows its filter kept, whose pages the filter's pruning
                    // chose), so a dense selection costs no download and a short look.
                    let blocks =
                        if kept_in_most_blocks(selection) { None } else { kept_blocks(g, selection, filtered, stats)? };
                    narrowed = Some(match blocks {
                        Some(blocks) if blocks.iter().filter(|&&b| b).count() * 2 <= blocks.len() => {
                            keep.narrowed_to_blocks(scan.files(), LATE_BLOCK, &blocks)?
                        }
                        _ => None,
                    });
                }
                let late = narrowed.as_ref().and_then(Option::as_ref).filter(|_| !whole);
                let (read, limit) = late.map_or((&keep, cache_limit), |k| (k, 0));
                match crate::scan::scan_to_device(g, scan.files(), name, t, read, limit, None, stats)? {
                    Ok((d, r)) => {
                        if late.is_some() {
                            late_pages += r.pages + r.pages_pruned;
                            late_unread += r.pages_pruned;
                        }
                        d
                    }
                    Err(why) => return Ok(Err(format!("column {name}: {}", why.0))),
                }
            }
        };
        let segments: Vec<(crate::scan::DeviceDecoded, BooleanBuffer)> = match filtered {
            None => vec![(d, selection.clone())],
            Some(f) => {
                if d.rows != f.file_rows {
                    return Ok(Err(format!("column {name}: {} rows, the key {}", d.rows, f.file_rows)));
                }
                if d.valid.is_some() {
                    return Ok(Err(format!("output column {name} may hold NULLs, and the input is filtered")));
                }
                let mut parts = Vec::new();
                let mut at = 0;
                for pass in std::iter::once(&f.valid).chain(f.null.as_ref()) {
                    let (keys, m) = gpu::compact_kept_keys_on_device(g, &d.keys, pass, f.file_rows, stats)?;
                    if at + m > rows {
                        return Ok(Err(format!("column {name}: more kept rows than keys")));
                    }
                    parts.push((
                        crate::scan::DeviceDecoded { keys, valid: None, rows: m, strings: None },
                        selection.slice(at, m),
                    ));
                    at += m;
                }
                if at != rows {
                    return Ok(Err(format!("column {name}: {at} kept rows, {rows} keys")));
                }
                parts
            }
        };
        out.push(PayloadColumn { name: name.clone(), data_type: t.clone(), segments });
    }
    let note = (late_pages > 0)
        .then(|| format!("payload of the kept rows only: {late_unread} of {late_pages} data pages not read"));
    Ok(Ok((out, note)))
}

/// The filter and projection over a mark join's marked probe rows that the
/// device runs where it decodes every probe row ([`ProbeOutput::every_row`]):
/// only the rows the filter keeps come back, and of them only the projected
/// columns (none, for a `count(*)` above).
pub(crate) struct MarkedRowsFilter<'a> {
    /// The row program (`join_filter`'s) over the output columns, in
    /// [`ProbeOutput::columns`]' order, then the mark (column `columns.len()`).
    pub program: &'a [Instr],
    /// The columns output, by the program's column numbers (the mark's included).
    pub projection: &'a [usize],
    /// Every probe row's mark from the selection of its key (in the keys'
    /// order), the probe keys' NULLs, the build side's rows and NULL keys.
    #[allow(clippy::type_complexity)]
    pub mark: &'a (dyn Fn(&BooleanBuffer, Option<&NullBuffer>, usize, usize) -> datafusion::arrow::array::BooleanArray
             + Sync),
    /// An aggregate above the filter: the kept rows' projected columns are
    /// reduced on the device ([`gpu::reduce_kept`]), not brought back.
    pub reduce: bool,
}

/// The rows a filter above kept: their projected columns (brought back), or
/// with [`MarkedRowsFilter::reduce`] those columns' aggregates (reduced on
/// the device), and how many rows it kept.
type FilteredOutput = (Vec<ArrayRef>, Option<Vec<KeptAggregates>>, usize);

/// The marked rows `filter` keeps, decoded by the device (`columns`, every
/// probe row, one segment each) with their `mark`: the program run over the
/// columns and the mark there, the kept rows' projected columns brought back
/// (or reduced), and how many rows it kept. `Ok(Err(why))`: the host
/// evaluates the filter (checked arithmetic overflowed: DataFusion's
/// expression raises or wraps; the mark itself aggregated).
fn filter_marked_rows(
    g: &Gpu,
    columns: &[PayloadColumn],
    mark: &datafusion::arrow::array::BooleanArray,
    filter: &MarkedRowsFilter<'_>,
    stats: &mut TransferStats,
) -> Result<std::result::Result<FilteredOutput, String>> {
    let n = mark.len();
    let (pass, kept) = match marked_pass(g, columns, mark, filter.program, stats)? {
        Ok(x) => x,
        Err(why) => return Ok(Err(why)),
    };
    if filter.reduce {
        let mut aggregates = Vec::with_capacity(filter.projection.len());
        for &j in filter.projection {
            let Some(column) = columns.get(j) else { return Ok(Err("the mark is aggregated".into())) };
            let d = &column.segments[0].0;
            aggregates.push(gpu::reduce_kept(g, &d.keys, d.valid.as_ref(), &pass, n, stats)?);
        }
        return Ok(Ok((Vec::new(), Some(aggregates), kept)));
    }
    let sources: Vec<Option<&PayloadColumn>> = filter.projection.iter().map(|&j| columns.get(j)).collect();
    Ok(kept_columns(g, &sources, mark, &pass, None, kept, stats)?.map(|out| (out, None, kept)))
}

/// The pass bits of `program` over `columns` (every probe row, one segment
/// each) and the mark after them, left on the device, and how many rows pass.
/// `Ok(Err(why))`: the host evaluates the filter.
fn marked_pass(
    g: &Gpu,
    columns: &[PayloadColumn],
    mark: &datafusion::arrow::array::BooleanArray,
    program: &[Instr],
    stats: &mut TransferStats,
) -> Result<std::result::Result<(DeviceBuffer<u32>, usize), String>> {
    use datafusion::arrow::array::Array;
    let n = mark.len();
    let mut program_columns: Vec<(&DeviceBuffer<u64>, Option<&DeviceBuffer<u32>>)> = Vec::new();
    for c in columns {
        match c.segments.as_slice() {
            [(d, _)] if d.rows == n => program_columns.push((&d.keys, d.valid.as_ref())),
            _ => return Ok(Err(format!("column {} is not one run of {n} rows", c.name))),
        }
    }
    // The marks as a bit column (the program reads its bits), after the others.
    let mark_bits = upload_bits(g, mark.values(), stats)?;
    let mark_valid = match mark.nulls() {
        Some(nulls) => Some(upload_bits(g, nulls.inner(), stats)?),
        None => None,
    };
    let marks = [(&mark_bits, mark_valid.as_ref())];
    crate::util::trace("filter above: marks on the device");
    let Some(pass) = crate::algo::join_filter::pass_rows_gpu(g, &program_columns, &marks, n, program, stats)? else {
        return Ok(Err("the filter's arithmetic overflows on the device".into()));
    };
    let kept = gpu::count_kept_on_device(g, &pass, n, stats)?;
    crate::util::trace("filter above: rows passed and counted");
    Ok(Ok((pass, kept)))
}

/// The `kept` rows (`pass` on the device; `pass_bits` on the host, where the
/// caller holds them already) of each source column, brought back as Arrow
/// arrays; a `None` source is the mark itself.
fn kept_columns(
    g: &Gpu,
    sources: &[Option<&PayloadColumn>],
    mark: &datafusion::arrow::array::BooleanArray,
    pass: &DeviceBuffer<u32>,
    mut pass_bits: Option<BooleanBuffer>,
    kept: usize,
    stats: &mut TransferStats,
) -> Result<std::result::Result<Vec<ArrayRef>, String>> {
    let n = mark.len();
    // The pass bits on the host, once, where a column is filtered there.
    let mut host_pass = |stats: &mut TransferStats| -> Result<BooleanBuffer> {
        if pass_bits.is_none() {
            let words = g.download(pass, n.div_ceil(32), stats)?;
            pass_bits = Some(BooleanBuffer::new(Buffer::from_vec(words), 0, n));
        }
        Ok(pass_bits.clone().expect("set above"))
    };
    let mut out = Vec::with_capacity(sources.len());
    for source in sources {
        let Some(column) = source else {
            // The mark itself.
            let bits = host_pass(stats)?;
            let selected = datafusion::arrow::array::BooleanArray::new(bits, None);
            out.push(datafusion::arrow::compute::filter(mark, &selected)?);
            continue;
        };
        let d = &column.segments[0].0;
        let (values, nulls) = match &d.valid {
            None if kept < n => {
                let (pending, _) = gpu::compact_kept_keys(g, &d.keys, pass, n, stats)?;
                (pending.wait()?, None)
            }
            None => (g.download_to_arrow(&d.keys, n, stats)?.wait()?, None),
            Some(_) => {
                let sel = host_pass(stats)?;
                kept_values(g, d, &sel, Some(pass), stats)?
            }
        };
        match lanes_to_array(&column.name, &column.data_type, values, nulls)? {
            Ok(array) => out.push(array),
            Err(why) => return Ok(Err(why)),
        }
    }
    Ok(Ok(out))
}

/// A filter above whose projection holds probe columns it does not read
/// (`late`: their payload column numbers), over a probe side read from its
/// files: its own columns (`needed` less `late`) are decoded for every row and
/// the filter run over them and the mark; the late columns are then read for
/// the rows it kept only ([`payload_on_device`]: the pages that hold one,
/// where they lie in at most half of the blocks), and every projected
/// column's kept rows come back, with the notes of the two reads.
#[allow(clippy::too_many_arguments)]
fn filter_then_read_late(
    g: &Gpu,
    scan: &DeviceScanExec,
    needed: &[usize],
    late: &[usize],
    filter: &MarkedRowsFilter<'_>,
    mark: &datafusion::arrow::array::BooleanArray,
    keep: &crate::scan::Keep,
    ready: Vec<(String, crate::scan::DeviceDecoded)>,
    cache_limit: usize,
    stats: &mut TransferStats,
) -> Result<std::result::Result<(FilteredOutput, Option<String>), String>> {
    let n = mark.len();
    // The program's columns that are not late, by their number in `needed` (the mark: `needed.len()`).
    let early: Vec<usize> = (0..needed.len()).filter(|&j| !late.contains(&needed[j])).collect();
    let early_needed: Vec<usize> = early.iter().map(|&j| needed[j]).collect();
    let every = BooleanBuffer::new_set(n);
    let (early_columns, note) =
        match payload_on_device(g, scan, &early_needed, &every, None, keep, ready, cache_limit, stats)? {
            Ok(x) => x,
            Err(why) => return Ok(Err(why)),
        };
    // The program renumbered over the early columns, the mark after them.
    let mut program = Vec::with_capacity(filter.program.len());
    for i in filter.program {
        if i.op != op::COL {
            program.push(*i);
            continue;
        }
        let j = i.arg as usize;
        let to = match early.iter().position(|&e| e == j) {
            Some(p) => p,
            None if j == needed.len() => early.len(),
            None => return Ok(Err(format!("the filter reads column {j}, which was left for after it"))),
        };
        program.push(Instr::new(i.op, to as u32, i.imm));
    }
    let (pass, kept) = match marked_pass(g, &early_columns, mark, &program, stats)? {
        Ok(x) => x,
        Err(why) => return Ok(Err(why)),
    };
    let words = g.download(&pass, n.div_ceil(32), stats)?;
    let kept_rows = BooleanBuffer::new(Buffer::from_vec(words), 0, n);
    crate::util::trace("filter above: the columns it does not read, for the rows it kept");
    let (late_columns, late_note) =
        match payload_on_device(g, scan, late, &kept_rows, None, keep, Vec::new(), cache_limit, stats)? {
            Ok(x) => x,
            Err(why) => return Ok(Err(why)),
        };
    let mut sources: Vec<Option<&PayloadColumn>> = Vec::with_capacity(filter.projection.len());
    for &j in filter.projection {
        if j >= needed.len() {
            sources.push(None);
            continue;
        }
        let source = match early.iter().position(|&e| e == j) {
            Some(p) => early_columns.get(p),
            None => late.iter().position(|&l| l == needed[j]).and_then(|p| late_columns.get(p)),
        };
        match source {
            Some(c) => sources.push(Some(c)),
            None => return Ok(Err(format!("projected column {j} was not decoded"))),
        }
    }
    let arrays = match kept_columns(g, &sources, mark, &pass, Some(kept_rows), kept, stats)? {
        Ok(a) => a,
        Err(why) => return Ok(Err(why)),
    };
    let note = match (note, late_note) {
        (Some(a), Some(b)) => Some(format!("{a}; {b}")),
        (a, b) => a.or(b),
    };
    Ok(Ok(((arrays, None, kept), note)))
}

/// The selection of every probe row, with what ran; `Ok(Err(reason))` when a
/// device-scanned side must be read on the host after all (its files hold
/// something the device does not decode).
pub(crate) fn select_device_scanned(
    selector: &Selector,
    cfg: &SetfusionConfig,
    probe: Side<'_>,
    build: Side<'_>,
    key_type: &DataType,
    output: Option<ProbeOutput<'_>>,
    ahead: ReadAheads,
) -> Result<std::result::Result<DeviceSelected, String>> {
    let payload = output.map(|o| o.columns);
    let every_row = output.is_some_and(|o| o.every_row);
    let reduce = output.is_some_and(|o| o.reduce);
    // Under a filter above (a mark join's), the projected probe columns the
    // filter does not read are read after it, for the rows it kept
    // ([`filter_then_read_late`]); not the key (its decoded keys give it) nor
    // a filtered side's.
    let late_payload: Vec<usize> = match (output.and_then(|o| o.filter).filter(|_| every_row), payload, &probe) {
        (Some(f), Some(needed), Side::Device(p)) if !f.reduce && p.filter().is_none() => {
            let read: Vec<usize> = f.program.iter().filter(|i| i.op == op::COL).map(|i| i.arg as usize).collect();
            let columns = p.payload().unwrap_or_default();
            let mut late: Vec<usize> = f
                .projection
                .iter()
                .copied()
                .filter(|&j| j < needed.len() && !read.contains(&j))
                .map(|j| needed[j])
                .filter(|&i| columns.get(i).is_some_and(|(name, _)| name != p.column()))
                .collect();
            late.sort_unstable();
            late.dedup();
            late
        }
        _ => Vec::new(),
    };
    if crate::scan::is_byte_type(key_type) && (matches!(probe, Side::Host(..)) || matches!(build, Side::Host(..))) {
        return Ok(Err("string keys: the device reads both sides or neither (their hashes are proved against \
                       the bytes there)"
            .into()));
    }
    let composite = |s: &Side<'_>| matches!(s, Side::Device(scan) if !scan.more_keys().is_empty());
    if (composite(&probe) || composite(&build)) && !(composite(&probe) && composite(&build)) {
        return Ok(Err("composite keys: the device reads both sides or neither (they are packed by ranges both \
                       sides share)"
            .into()));
    }
    // Where unmatched probe rows are dropped (IN / EXISTS, INTERSECT [ALL];
    // not a mark join's, which outputs every row), probe row groups outside
    // the build side's key range (from its files' statistics) are not read,
    // as DataFusion's dynamic filter would prune them; row groups with NULL
    // keys are always read (INTERSECT keeps NULLs). The probe side's output
    // columns are read with the same `Keep`, pruned by the key's statistics,
    // so the payload of row groups no row of which can be kept is never read.
    let probe_keep = match (&probe, &build) {
        (Side::Device(p), Side::Device(b))
            if !every_row && matches!(selector.op, SetOp::Semi | SetOp::IntersectDistinct | SetOp::IntersectAll) =>
        {
            crate::scan::Keep::key_range(p.column(), crate::scan::key_range(b.files(), b.column()).unwrap_or(None))
        }
        _ => crate::scan::Keep::default(),
    };
    // The probe side's output columns but its key (which its decoded keys
    // give), as they are read: `cached` says which the column cache holds.
    let output_sides = |cached: &dyn Fn(&str, &DataType) -> bool| -> Vec<crate::scan::PairSide<'_>> {
        let (Side::Device(p), Some(needed)) = (&probe, payload) else { return Vec::new() };
        let columns = p.payload().unwrap_or_default();
        needed
            .iter()
            .filter(|&i| !late_payload.contains(i))
            .filter_map(|&i| columns.get(i))
            .filter(|(name, t)| name != p.column() && !cached(name, t))
            .map(|(name, t)| crate::scan::PairSide {
                files: p.files(),
                column: name,
                arrow: t,
                keep: probe_keep.clone(),
            })
            .collect()
    };
    // The device still starting (a query in a fresh process): both sides'
    // files are read on the host meanwhile, not after (the device's column
    // cache is empty then, so they go the paired way below); so are the
    // output columns of a probe side whose every row is output (a mark
    // join's), all of whose pages are read anyway.
    let early_outputs = if every_row { output_sides(&|_, _| false) } else { Vec::new() };
    let early = match (&probe, &build) {
        (Side::Device(p), Side::Device(b))
            if p.filter().is_none()
                && b.filter().is_none()
                && matches!(gpu::readiness_if_started(cfg.device), Some(gpu::Readiness::Starting(_))) =>
        {
            let sides = [key_column(p, probe_keep.clone()), key_column(b, Default::default())];
            let columns: Vec<crate::scan::PairSide<'_>> = sides.into_iter().chain(early_outputs.clone()).collect();
            Some(crate::scan::ReadAhead::start(&columns))
        }
        _ => None,
    };
    // Both sides read by the device, either filtered: what each reads (its
    // filter's row groups and rows), for one pipeline below.
    let mut pair_reads = match (&probe, &build) {
        (Side::Device(p), Side::Device(b)) if p.filter().is_some() || b.filter().is_some() => {
            Some([SideReads::of(p, &probe_keep)?, SideReads::of(b, &Default::default())?])
        }
        _ => None,
    };
    // Their columns (each read once, as `read_sides` would read them; nothing
    // is in a starting device's column cache) are read then too.
    let early_pair = pair_reads
        .as_ref()
        .filter(|_| {
            !crate::env::scan_columns_apart()
                && matches!(gpu::readiness_if_started(cfg.device), Some(gpu::Readiness::Starting(_)))
        })
        .map(|reads| {
            let plan = SidesPlan::of(&[&reads[0], &reads[1]], |_, _, _| false);
            let read = crate::scan::ReadAhead::start(&plan.columns(&[&reads[0], &reads[1]]));
            (plan, read)
        });
    if early.is_some() || early_pair.is_some() {
        crate::util::trace("device scan: both sides read while the device starts");
    }
    let device = gpu::gpu(cfg.device).map_err(gpu::GpuError::from)?;
    let g = hold_device(&device, cfg, selector.reservation.as_deref())?;
    crate::util::trace("device scan: device held");
    let probe_side = match &probe {
        Side::Device(scan) => Some(*scan),
        Side::Host(..) => None,
    };
    let mut stats = TransferStats::default();
    // The output columns a filtered probe side's filter reads too are kept from it.
    let filter_outputs: Vec<String> = match (payload, probe_side.and_then(|s| s.payload())) {
        (Some(needed), Some(columns)) => {
            needed.iter().filter_map(|&i| columns.get(i)).map(|(name, _)| name.clone()).collect()
        }
        _ => Vec::new(),
    };
    // Both sides read from their files (neither in the column cache): one
    // upload buffer and one decode launch for the two, so the launches'
    // tails (their largest pages) overlap. Otherwise side by side.
    let cached_column = |s: &DeviceScanExec, column: &str, t: &DataType| {
        cfg.cache_limit.0 > 0 && crate::scan::is_cached(&g, s.files(), column, t)
    };
    let cached = |s: &DeviceScanExec| cached_column(s, s.column(), s.data_type());
    // Output columns read with the keys (name, decoded), for `payload_on_device`.
    let mut prefetched: Vec<(String, crate::scan::DeviceDecoded)> = Vec::new();
    let (probe, build) = match (&probe, &build) {
        (Side::Device(p), Side::Device(b))
            if early.is_some() || (!cached(p) && !cached(b) && p.filter().is_none() && b.filter().is_none()) =>
        {
            let sides = [key_column(p, probe_keep.clone()), key_column(b, Default::default())];
            // The probe side's output columns (not in the column cache, not the key) are read with the
            // keys, in the same pipeline, rather than after the selection: a second pipeline after it
            // would read the same pages where most blocks hold a kept row. But where the build side
            // has at most a sixteenth of the probe side's rows (IN / EXISTS / INTERSECT), few probe
            // rows are likely kept: they are read after the selection, only the pages that hold a
            // kept row (`payload_on_device`).
            let likely_sparse = !every_row
                && matches!(selector.op, SetOp::Semi | SetOp::IntersectDistinct | SetOp::IntersectAll)
                && crate::scan::file_rows(b.files())
                    .zip(crate::scan::file_rows(p.files()))
                    .is_some_and(|(nb, np)| nb.saturating_mul(SPARSE_BUILD_SHARE) <= np);
            let outputs = match &early {
                Some(_) => early_outputs,
                None if likely_sparse => Vec::new(),
                None => output_sides(&|name, t| cached_column(p, name, t)),
            };
            if outputs.is_empty() {
                match crate::scan::scan_pair_to_device(&g, sides, cfg.cache_limit.0, early, &mut stats)? {
                    Ok([dp, db]) => (device_side(&g, dp, &mut stats)?, device_side(&g, db, &mut stats)?),
                    Err((i, why)) => return Ok(Err(format!("{} side: {}", ["probe", "build"][i], why.0))),
                }
            } else {
                let names: Vec<String> = outputs.iter().map(|c| c.column.to_string()).collect();
                let columns: Vec<_> = sides.into_iter().chain(outputs).collect();
                let scanned = match early {
                    Some(read) => crate::scan::finish_read_ahead(&g, &columns, cfg.cache_limit.0, read, &mut stats)?,
                    None => crate::scan::scan_columns_to_device(&g, &columns, cfg.cache_limit.0, &mut stats)?,
                };
                match scanned {
                    Ok(scanned) => {
                        let mut scanned = scanned.into_iter();
                        let (Some(dp), Some(db)) = (scanned.next(), scanned.next()) else {
                            return Err(datafusion::error::DataFusionError::Internal(
                                "setfusion device scan: a side went missing".into(),
                            ));
                        };
                        prefetched = names.into_iter().zip(scanned.map(|(d, _)| d)).collect();
                        (device_side(&g, dp, &mut stats)?, device_side(&g, db, &mut stats)?)
                    }
                    Err((i, why)) => {
                        let which = if i == 1 { "build side" } else { "probe side" };
                        return Ok(Err(format!("{which}: column {}: {}", columns[i].column, why.0)));
                    }
                }
            }
        }
        _ if pair_reads.is_some() => {
            // Both sides' columns in one pipeline, so one side's reads overlap the
            // other's decodes and their launches' tails overlap; a column both
            // read alike (two filters over one table) is read once.
            let reads = pair_reads.take().expect("checked by the guard");
            let sides = [&reads[0], &reads[1]];
            let (plan, read) = match early_pair {
                Some((plan, read)) => (plan, Some(read)),
                None => (SidesPlan::of(&sides, cached_on(&g, cfg.cache_limit.0)), None),
            };
            let mut got = match read_sides(&g, &sides, &plan, read, cfg.cache_limit.0, &mut stats)? {
                Ok(got) => got.into_iter(),
                Err(why) => return Ok(Err(why)),
            };
            let [probe_reads, build_reads] = reads;
            let (probe_got, build_got) = (got.next().unwrap_or_default(), got.next().unwrap_or_default());
            let mut probe = match side_from_reads(&g, probe_reads, probe_got, &filter_outputs, &mut stats)? {
                Ok(k) => k,
                Err(why) => return Ok(Err(format!("probe side: {why}"))),
            };
            prefetched = std::mem::take(&mut probe.outputs);
            let build = match side_from_reads(&g, build_reads, build_got, &[], &mut stats)? {
                Ok(k) => k,
                Err(why) => return Ok(Err(format!("build side: {why}"))),
            };
            (probe, build)
        }
        _ => {
            // The build side's files are read on the host while the probe
            // side's are uploaded and decoded (unless the device holds its keys already).
            // A side read ahead by the caller was read in all its row groups:
            // the probe side only where its `probe_keep` is that (the build
            // side collected on the host).
            let probe_ahead = ahead.probe.filter(|_| matches!(build, Side::Host(..)));
            let build_ahead = match (&build, ahead.build) {
                (_, Some(read)) => Some(read),
                (Side::Device(scan), None) if scan.filter().is_none() && !cached(scan) => {
                    Some(crate::scan::ReadAhead::start(&[key_column(scan, Default::default())]))
                }
                _ => None,
            };
            let mut probe = match side_keys(
                &g,
                probe,
                key_type,
                &probe_keep,
                &filter_outputs,
                cfg.cache_limit.0,
                probe_ahead,
                &mut stats,
            )? {
                Ok(k) => k,
                Err(why) => return Ok(Err(format!("probe side: {why}"))),
            };
            prefetched = std::mem::take(&mut probe.outputs);
            let all = crate::scan::Keep::default();
            let build = match side_keys(&g, build, key_type, &all, &[], cfg.cache_limit.0, build_ahead, &mut stats)? {
                Ok(k) => k,
                Err(why) => return Ok(Err(format!("build side: {why}"))),
            };
            (probe, build)
        }
    };
    let (probe, build) = match pack_composite_keys(&g, probe, build, &mut stats)? {
        Ok(sides) => sides,
        Err(why) => return Ok(Err(why)),
    };
    let reports: Vec<(String, ScanReport)> = [("probe", &probe.report), ("build", &build.report)]
        .into_iter()
        .filter_map(|(w, r)| r.clone().map(|r| (w.to_string(), r)))
        .collect();
    let notes: Vec<String> = reports.iter().map(|(w, r)| describe(w, r)).collect();
    selector.metrics.device.input_rows.add(probe.n + build.n);
    let n = probe.n;
    let (m, nb) = (probe.null_count(), build.null_count());
    let build_rows = build.n;
    // The probe side's output columns, decoded once the selection is known.
    let mut probe = probe;
    let probe_kept = probe.kept.take();
    // An output column that is the key of an unfiltered probe side is taken
    // from its decoded keys (copied on the device: the selection consumes
    // them), not read and decoded a second time. Both were decoded from the
    // same rows (`probe_keep`) into the same 64-bit lanes.
    if let (Some(scan), Some(needed), None) = (probe_side, payload, &probe_kept) {
        let outputs_key = scan.payload().is_some_and(|columns| {
            needed.iter().filter_map(|&i| columns.get(i)).any(|(name, _)| name == scan.column())
        });
        let ready = prefetched.iter().any(|(name, _)| name == scan.column());
        if outputs_key && !ready && probe.strings.is_none() && !crate::scan::is_byte_type(key_type) {
            // (Validity on the host alone means a filtered side's order: not these rows.)
            let valid = match &probe.nulls {
                None => Some(None),
                Some((_, Some(v))) => Some(Some(g.copy_on_device(v, probe.n.div_ceil(32))?)),
                Some((_, None)) => None,
            };
            if let Some(valid) = valid {
                let keys = g.copy_on_device(&probe.keys, probe.n)?;
                let decoded = crate::scan::DeviceDecoded { keys, valid, rows: probe.n, strings: None };
                prefetched.push((scan.column().to_string(), decoded));
            }
        }
    }
    let probe_scan = match &probe_side {
        Some(s) if payload.is_some() => Some(*s),
        _ => None,
    };
    let row_filter = output.and_then(|o| o.filter).filter(|_| every_row);
    let probe_key_nulls = probe.nulls.as_ref().map(|(b, _)| b.clone());
    // `on_device`: the selection's words where the device holds them (none
    // where the host made the selection or added the NULL-keyed rows to it).
    let mut with_payload =
        |selection: BooleanBuffer, on_device: Option<DeviceBuffer<u32>>, mut ran: String, stats: &mut TransferStats| {
            let mut filtered_rows = None;
            let mut reduced = None;
            let payload = match (probe_scan, payload) {
                (Some(scan), Some(needed)) => {
                    let ready = std::mem::take(&mut prefetched);
                    let rows = if every_row { BooleanBuffer::new_set(selection.len()) } else { selection.clone() };
                    let (kept, keep, limit) = (probe_kept.as_ref(), &probe_keep, cfg.cache_limit.0);
                    let arrays = match row_filter {
                        // The marked rows filtered on the device: only those kept come back.
                        Some(filter) => {
                            let mark = (filter.mark)(&selection, probe_key_nulls.as_ref(), build_rows, nb);
                            let filtered = if late_payload.is_empty() {
                                match payload_on_device(&g, scan, needed, &rows, kept, keep, ready, limit, stats)? {
                                    Ok((columns, note)) => {
                                        crate::util::trace("filter above: its columns decoded");
                                        filter_marked_rows(&g, &columns, &mark, filter, stats)?.map(|f| (f, note))
                                    }
                                    Err(why) => Err(why),
                                }
                            } else {
                                let late = &late_payload;
                                filter_then_read_late(&g, scan, needed, late, filter, &mark, keep, ready, limit, stats)?
                            };
                            filtered.map(|((arrays, aggregates, kept_rows), note)| {
                                ran = format!("{ran}; the filter above run on the device: {kept_rows} rows kept");
                                if aggregates.is_some() {
                                    ran = format!("{ran}; the aggregate above reduced on the device");
                                }
                                filtered_rows = Some(kept_rows);
                                reduced = aggregates;
                                (arrays, note)
                            })
                        }
                        None => match payload_on_device(&g, scan, needed, &rows, kept, keep, ready, limit, stats)? {
                            Err(why) => Err(why),
                            // An aggregate above: the kept rows reduced on the device.
                            Ok((columns, note)) if reduce => reduce_payload(&g, &columns, on_device.as_ref(), stats)?
                                .map(|aggregates| {
                                    ran = format!("{ran}; the aggregate above reduced on the device");
                                    reduced = Some(aggregates);
                                    (Vec::new(), note)
                                }),
                            Ok((columns, note)) => {
                                download_payload(&g, columns, on_device.as_ref(), stats)?.map(|arrays| (arrays, note))
                            }
                        },
                    };
                    match arrays {
                        Ok((arrays, note)) => {
                            if let Some(note) = note {
                                ran = format!("{ran}; {note}");
                            }
                            Some(arrays)
                        }
                        Err(why) => return Ok(Err(format!("probe side: {why}"))),
                    }
                }
                _ => None,
            };
            crate::util::trace("device select: output done");
            selector.metrics.device.record(stats);
            Ok(Ok(DeviceSelected {
                selection,
                ran,
                reports: reports.clone(),
                payload,
                filtered_rows,
                reduced,
                build_rows,
                build_nulls: nb,
            }))
        };
    if let Some((sel, ran)) = selector.decided_by_nulls(n, build.n, nb) {
        return with_payload(sel, None, format!("{ran}; device scan {}", notes.join("; ")), &mut stats);
    }
    let mut build = build;
    if crate::scan::is_byte_type(key_type) {
        if let Some(why) = prove_string_keys(&g, &mut probe, &mut build, &mut stats)? {
            return Ok(Err(why));
        }
    }
    let probe_nulls = probe.nulls.as_ref().map(|(b, _)| b.clone());
    let (probe_core, npc) = probe.core(&g, &mut stats)?;
    let (build_core, nbc) = build.core(&g, &mut stats)?;
    let (core, core_words, ran) = crate::algo::select::select_resident(
        &g,
        forced_strategy(cfg, false),
        selector.op,
        build_core,
        nbc,
        probe_core,
        npc,
        &mut stats,
    )?;
    crate::util::trace("device scan: selected");
    let (sel, on_device) = match probe_nulls {
        None => (core, core_words),
        Some(nulls) => {
            let idx: Vec<u32> = nulls.valid_indices().map(|i| i as u32).collect();
            (selector.with_null_rows(&core, n, &idx, &|i| nulls.is_null(i), (m, nb)), None)
        }
    };
    with_payload(sel, on_device, format!("{ran}; device scan {}", notes.join("; ")), &mut stats)
}
