//! The device Parquet scan (issue 27, first slice): one key column of
//! Parquet files read on the host as raw column chunks, uploaded, and
//! decompressed (SNAPPY) and decoded (PLAIN, dictionary and
//! DELTA_BINARY_PACKED pages, v1 and v2, NULLs; BOOLEAN pages PLAIN or RLE)
//! on the device straight into the selection's 64-bit keys (booleans as 0 / 1;
//! BYTE_ARRAY strings and binary as the hash of their bytes, each row's span
//! kept beside it for the exact proof: [`DeviceStrings`]).
//!
//! The chunks are read on host threads in parts of whole column chunks (64
//! MiB or more), each uploaded while the next parts are read and decoded on
//! the device's decode streams as soon as it is up ([`read_upload_decode`]),
//! so reads, uploads and decodes overlap; the read buffers are
//! kept for the next scan and page-locked in the background after their
//! second, so later scans upload by DMA straight from them, with no staging
//! copy. Both sides of a selection read from files are read side by side
//! into one device buffer ([`scan_pair_to_device`]); in a fresh process they
//! are read while the device starts ([`ReadAhead`]), and the parts read by
//! then are uploaded and decoded as soon as it is there. Pages of ZSTD,
//! LZ4_RAW and GZIP chunks, and SNAPPY pages much larger than the rest or of
//! 512 KiB or more, are decompressed on host threads first
//! ([`decode::inflate_part_on_host`]): one warp decompresses one snappy page,
//! so a launch lasts as long as its largest.
//!
//! - [`pages`]: footers, column chunks, parallel reads (into buffers kept
//!   for the next scan), the page table (host);
//! - [`thrift`]: page headers (thrift compact protocol);
//! - [`decode`]: `kernels/parquet_decode.cu`'s launcher and its CPU twin;
//! - [`fixtures`]: files written by arrow-rs with every writer option the scan meets.
//!
//! Layering: below `algo` and `exec` (which call it), above `gpu`.

pub mod cache;
pub mod decode;
pub mod fixtures;
#[cfg(test)]
mod foreign_fixtures;
pub mod pages;
mod thrift;

use std::time::{Duration, Instant};

use datafusion::arrow::datatypes::DataType;
use datafusion::error::Result;

pub use cache::{CacheKey, CacheUse, ColumnCache};
pub use decode::{decode_cpu, decode_gpu, Decoded, DeviceDecoded, DeviceStrings};
pub use pages::{
    file_rows, file_shape, inflated_bytes, is_byte_type, key_range, local_path, prune_row_groups, supported_key_type,
    supported_type, Fallback, FileStamp, InflatedBytes, Keep, RowSelections, ScanFile,
};

use crate::gpu::{Gpu, TransferStats};

/// What one device scan did, for EXPLAIN ANALYZE and the benchmark.
#[derive(Debug, Clone, Default)]
pub struct ScanReport {
    pub rows: u64,
    /// Column chunk bytes read from the files.
    pub bytes_read: u64,
    /// Decoded key bytes (8 a row).
    pub bytes_decoded: u64,
    pub pages: usize,
    pub read: Duration,
    /// With `streamed`: only what the upload took after the reads ended.
    pub upload: Duration,
    pub decode: Duration,
    /// Uploaded part by part while the reads went on ([`read_upload_decode`]).
    pub streamed: bool,
    /// Each part decoded while the next were read ([`read_upload_decode`]):
    /// `decode` is then only what the decode took after the last upload.
    pub decoded_while_read: bool,
    /// What the device column cache did ([`cache`]).
    pub cache: Option<CacheUse>,
    /// Row groups left out (the other side's key range, or the statistics against the input's filter), of all.
    pub row_groups_pruned: usize,
    pub row_groups: usize,
    /// Of `row_groups_pruned`: by bloom filters (the others by statistics or the key range).
    pub row_groups_pruned_by_bloom_filters: usize,
    /// Data pages not read: their rows the page index rules out (every column's).
    pub pages_pruned: usize,
    /// Rows of the row groups read that the page index rules out (the filter drops them).
    pub rows_pruned_by_page_index: u64,
    /// The input's filter, run on the device: the rows it kept, the time it took, the columns read for it.
    pub filtered: Option<(u64, Duration, usize)>,
    /// Columns the other input read alike (same files, rows and type), copied
    /// on the device from its read: their bytes and pages count there.
    pub shared_columns: usize,
}

impl ScanReport {
    /// Add another column's scan of the same rows (a filtered input reads several).
    pub fn add_column(&mut self, r: &ScanReport) {
        self.bytes_read += r.bytes_read;
        self.bytes_decoded += r.bytes_decoded;
        self.pages += r.pages;
        self.pages_pruned += r.pages_pruned;
        self.read += r.read;
        self.upload += r.upload;
        self.decode += r.decode;
        self.shared_columns += r.shared_columns;
    }
}

/// A scan's report from its plan and what it took.
fn report_of(plan: &pages::ScanPlan, pages: usize, read: Duration, upload: Duration, decode: Duration) -> ScanReport {
    ScanReport {
        rows: plan.rows,
        bytes_read: plan.bytes,
        bytes_decoded: plan.rows * 8,
        pages,
        read,
        upload,
        decode,
        row_groups_pruned: plan.row_groups_pruned,
        row_groups: plan.row_groups,
        pages_pruned: plan.pages_pruned,
        ..Default::default()
    }
}

/// One column a [`ReadAhead`] reads: owned, since its reads outlive the caller's borrows.
struct OwnedColumn {
    files: Vec<ScanFile>,
    column: String,
    arrow: DataType,
    keep: Keep,
}

/// Each column's reads, as the reader threads end: `Ok(Some(why))` for a
/// column whose files hold something the device does not decode; the time
/// its reads took.
type ReadOutcomes = Vec<(Result<Option<Fallback>>, Duration)>;

/// A part read ahead ([`ReadPart`] once the reads have ended): its bytes
/// stay in the column's read buffer (`at`, `len`), its inflated pages in the
/// column's [`InflateRoom`] or bytes of their own.
struct PartRead {
    plan: usize,
    at: usize,
    len: usize,
    table: pages::PageTable,
    inflated: InflatedRead,
    moved: Vec<usize>,
}

/// Where a part read ahead keeps its pages decompressed on the host.
enum InflatedRead {
    /// At `at` in its column's inflate room, `len` bytes.
    Lent { at: usize, len: usize },
    /// Bytes of their own (empty: none).
    Owned(Vec<u8>),
}

impl PartRead {
    /// The part, less its borrows of the column's buffers.
    fn of(p: ReadPart<'_>) -> Self {
        let inflated = match p.inflated {
            PartInflated::Lent { at, bytes, .. } => InflatedRead::Lent { at, len: bytes.len() },
            PartInflated::Owned(own) => InflatedRead::Owned(own),
        };
        PartRead { plan: p.plan, at: p.at, len: p.bytes.len(), table: p.table, inflated, moved: p.moved }
    }

    /// The part again, borrowing its column's read buffer and inflate room.
    fn lent<'a>(self, buf: &'a pages::ChunkBytes, room: &'a pages::ChunkBytes) -> ReadPart<'a> {
        ReadPart {
            plan: self.plan,
            at: self.at,
            bytes: &buf[self.at..self.at + self.len],
            locked: buf.is_page_locked(),
            table: self.table,
            inflated: match self.inflated {
                InflatedRead::Lent { at, len } => {
                    PartInflated::Lent { at, bytes: &room[at..at + len], locked: room.is_page_locked() }
                }
                InflatedRead::Owned(own) => PartInflated::Owned(own),
            },
            moved: self.moved,
        }
    }
}

/// What a [`ReadAhead`] read: the plans, each column's read buffer and
/// inflate room, the parts (of every column, as they came) and each column's outcome.
struct ReadAll {
    plans: Vec<pages::ScanPlan>,
    bufs: Vec<pages::ChunkBytes>,
    rooms: Vec<pages::ChunkBytes>,
    parts: Vec<PartRead>,
    reads: ReadOutcomes,
}

/// Columns read on a thread of their own before the device is there (a
/// fresh process reads both sides while the device starts; a warm one reads
/// a side while the other uploads and decodes): planned, then read into the
/// kept read buffers in parts whose pages are walked and whose large pages
/// are decompressed on the reader threads, as the streamed scan does.
/// [`ReadAhead::finish`] then uploads the parts (by DMA straight from a
/// page-locked buffer) and decodes each on the decode streams
/// ([`upload_decode_parts`]).
/// (The thread, or why it could not start.)
pub struct ReadAhead(std::io::Result<std::thread::JoinHandle<Result<std::result::Result<ReadAll, (usize, Fallback)>>>>);

impl ReadAhead {
    /// Start reading `columns` (the row groups each one's `keep` leaves).
    pub fn start(columns: &[PairSide<'_>]) -> Self {
        let columns: Vec<OwnedColumn> = columns
            .iter()
            .map(|c| OwnedColumn {
                files: c.files.to_vec(),
                column: c.column.to_string(),
                arrow: c.arrow.clone(),
                keep: c.keep.clone(),
            })
            .collect();
        ReadAhead(crate::host::spawn("scan-read-ahead", move || {
            let sides: Vec<PairSide<'_>> = columns
                .iter()
                .map(|c| PairSide { files: &c.files, column: &c.column, arrow: &c.arrow, keep: c.keep.clone() })
                .collect();
            let plans = match plan_columns(&sides)? {
                Ok(plans) => plans,
                Err(f) => return Ok(Err(f)),
            };
            let part_bytes = pages::scan_part_bytes(plans.iter().map(|p| p.bytes).sum());
            let (mut bufs, mut rooms) = read_buffers(&plans);
            let (reads, parts) = crate::host::scope(|s| {
                let (tx, rx) = std::sync::mpsc::channel();
                let readers = spawn_readers(s, &plans, &mut bufs, &mut rooms, part_bytes, tx);
                // Until every reader has ended (each holds a sender).
                let parts: Vec<PartRead> = rx.into_iter().map(PartRead::of).collect();
                (readers.into_iter().map(joined).collect(), parts)
            });
            Ok(Ok(ReadAll { plans, bufs, rooms, parts, reads }))
        }))
    }

    /// Upload and decode what was read onto `gpu`: each column's keys and
    /// report, or `Err((column, why))` when a column's files hold something
    /// the device does not decode.
    #[allow(clippy::type_complexity)]
    fn finish(
        self,
        gpu: &Gpu,
        stats: &mut TransferStats,
    ) -> Result<std::result::Result<Vec<(DeviceDecoded, ScanReport)>, (usize, Fallback)>> {
        let ReadAll { plans, bufs, rooms, parts, reads } = match self
            .0
            .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?
            .join()
            .map_err(|_| panicked("a read-ahead thread"))??
        {
            Ok(read) => read,
            Err(f) => return Ok(Err(f)),
        };
        let lent = parts.into_iter().map(|p| {
            let plan = p.plan;
            p.lent(&bufs[plan], &rooms[plan])
        });
        let scanned = upload_decode_parts(gpu, &plans, lent, || Ok(reads), stats);
        bufs.into_iter().chain(rooms).for_each(|b| pages::give_back_to_device(b, gpu));
        scanned
    }
}

/// A reader thread's outcome, a panic made an error.
fn joined(
    h: std::thread::ScopedJoinHandle<'_, (Result<Option<Fallback>>, Duration)>,
) -> (Result<Option<Fallback>>, Duration) {
    h.join().unwrap_or_else(|_| (Err(panicked("a read thread")), Duration::ZERO))
}

/// Each plan's scan (the row groups its side's `keep` leaves), or `Err((i,
/// why))` for the first side whose files hold something the device does not decode.
fn plan_columns(sides: &[PairSide<'_>]) -> Result<std::result::Result<Vec<pages::ScanPlan>, (usize, Fallback)>> {
    let mut plans = Vec::with_capacity(sides.len());
    for (i, c) in sides.iter().enumerate() {
        match pages::plan_scan_within(c.files, c.column, c.arrow, &c.keep)? {
            Ok(p) => plans.push(p),
            Err(f) => return Ok(Err((i, f))),
        }
    }
    Ok(Ok(plans))
}

/// Each plan's kept read buffer and inflate room ([`inflate_room`]).
fn read_buffers(plans: &[pages::ScanPlan]) -> (Vec<pages::ChunkBytes>, Vec<pages::ChunkBytes>) {
    plans.iter().map(|p| (pages::kept_buffer(p.bytes as usize), pages::kept_buffer(inflate_room(p)))).unzip()
}

/// A reader thread per plan, in `scope`: each reads its plan's chunks into
/// its read buffer in parts of about `part_bytes` ([`pages::read_chunks_in_waves`],
/// on [`reader_threads`] threads of its own), walks each part's pages,
/// decompresses its large ones into the plan's inflate room ([`read_column`])
/// and sends the part to `tx`. Each returns its plan's outcome and read time.
fn spawn_readers<'scope, 'env>(
    scope: &crate::host::Scoped<'scope, 'env>,
    plans: &'env [pages::ScanPlan],
    bufs: &'env mut [pages::ChunkBytes],
    rooms: &'env mut [pages::ChunkBytes],
    part_bytes: usize,
    tx: std::sync::mpsc::Sender<ReadPart<'env>>,
) -> Vec<std::thread::ScopedJoinHandle<'scope, (Result<Option<Fallback>>, Duration)>> {
    plans
        .iter()
        .enumerate()
        .zip(bufs.iter_mut().zip(rooms.iter_mut()))
        .map(|((i, plan), (buf, room))| {
            let tx = tx.clone();
            scope.spawn("scan-column", move || {
                let room = InflateRoom::new(room);
                read_column(plan, i, &room, &tx, |ready| {
                    pages::read_chunks_in_waves(plan, buf, part_bytes, reader_threads(), ready)
                })
            })
        })
        .collect()
}

fn missing(what: &str) -> datafusion::error::DataFusionError {
    datafusion::error::DataFusionError::Internal(format!("setfusion device scan: {what} went missing"))
}

fn panicked(what: &str) -> datafusion::error::DataFusionError {
    datafusion::error::DataFusionError::Internal(format!("setfusion device scan: {what} panicked"))
}

/// One column's reads on its reader thread: `read` reads the parts and
/// hands each to the closure it is given, which walks the part's page
/// headers, decompresses its large pages ([`decode::inflate_part_on_host`])
/// and sends it to the uploader.
fn read_column<'a>(
    plan: &pages::ScanPlan,
    i: usize,
    room: &InflateRoom<'a>,
    tx: &std::sync::mpsc::Sender<ReadPart<'a>>,
    read: impl FnOnce(&(dyn Fn(usize, &'a [u8], bool, std::ops::Range<usize>) -> Result<()> + Sync)) -> Result<()>,
) -> (Result<Option<Fallback>>, Duration) {
    let t = Instant::now();
    let fell_back = std::sync::Mutex::new(None);
    let read = read(&|at, bytes, locked, chunks| {
        let mut table = match pages::page_table_of(plan, chunks, bytes)? {
            Ok(t) => t,
            Err(f) => {
                *fell_back.lock().unwrap_or_else(|e| e.into_inner()) = Some(f);
                return Err(datafusion::error::DataFusionError::Internal("fell back".into()));
            }
        };
        let mut lent_at = 0;
        let (inflated, moved) = decode::inflate_part_on_host(&mut table, bytes, decode::HOST_INFLATE_MIN, |n| {
            room.take(n).map(|(at, b)| {
                lent_at = at;
                b
            })
        })?;
        let inflated = match inflated {
            decode::Inflated::Lent(b) => PartInflated::Lent { at: lent_at, bytes: b, locked: room.locked },
            decode::Inflated::Owned(v) => PartInflated::Owned(v),
        };
        // The uploader stops taking parts only on an error it reports itself.
        let _ = tx.send(ReadPart { plan: i, at, bytes, locked, table, inflated, moved });
        Ok(())
    });
    let fell_back = fell_back.into_inner().unwrap_or_else(|e| e.into_inner());
    let read = match (read, fell_back) {
        (_, Some(f)) => Ok(Some(f)),
        (Err(e), None) => Err(e),
        (Ok(()), None) => Ok(None),
    };
    crate::util::trace(&format!("device scan: column {i} of the scan read"));
    (read, t.elapsed())
}

/// Is `column` of `files`, as they are now, in `gpu`'s column cache?
pub fn is_cached(gpu: &Gpu, files: &[ScanFile], column: &str, arrow: &DataType) -> bool {
    is_cached_within(gpu, files, column, arrow, &Keep::default())
}

/// Is `column` of `files`, as they are now, read with `keep`, in `gpu`'s column cache?
pub fn is_cached_within(gpu: &Gpu, files: &[ScanFile], column: &str, arrow: &DataType, keep: &Keep) -> bool {
    CacheKey::of(files, column, arrow).is_some_and(|k| ColumnCache::of(gpu).holds(&k.within(keep.clone())))
}

/// Read `column` of `files` (read by DataFusion as `arrow`) onto `gpu` as
/// keys; `Err(Fallback)` when the files hold something the device does not
/// decode (the caller reads them on the host instead). With `cache_limit`
/// above 0, the device column cache ([`cache`]) answers a repeated scan of
/// unchanged files, and keeps what this one decodes. `keep`: the row groups
/// read (the caller drops the others' rows anyway). `ahead`: the host part,
/// already started ([`ReadAhead`], which reads every row group).
#[allow(clippy::too_many_arguments)]
pub fn scan_to_device(
    gpu: &Gpu,
    files: &[ScanFile],
    column: &str,
    arrow: &DataType,
    keep: &Keep,
    cache_limit: usize,
    ahead: Option<ReadAhead>,
    stats: &mut TransferStats,
) -> Result<std::result::Result<(DeviceDecoded, ScanReport), Fallback>> {
    // Read ahead: upload and decode what was read; else read and upload together.
    let onto_device = |ahead: Option<ReadAhead>, stats: &mut TransferStats| match ahead {
        Some(a) => Ok(match a.finish(gpu, stats)? {
            Ok(scanned) => Ok(scanned.into_iter().next().ok_or_else(|| missing("the side read ahead"))?),
            Err((_, f)) => Err(f),
        }),
        None => read_to_device(gpu, files, column, arrow, keep, stats),
    };
    let key = (cache_limit > 0).then(|| CacheKey::of(files, column, arrow)).flatten().map(|k| k.within(keep.clone()));
    let Some(key) = key else {
        return Ok(onto_device(ahead, stats)?.map(|(d, mut r)| {
            r.cache = Some(CacheUse::Off);
            (d, r)
        }));
    };
    let cache = ColumnCache::of(gpu);
    let t = Instant::now();
    if let Some(hit) = cache.get(gpu, &key)? {
        let rows = hit.rows as u64;
        let bytes = ColumnCache::bytes_of(&hit);
        let report = ScanReport {
            rows,
            bytes_decoded: rows * 8,
            upload: t.elapsed(),
            cache: Some(CacheUse::Hit { bytes }),
            ..Default::default()
        };
        return Ok(Ok((hit, report)));
    }
    Ok(onto_device(ahead, stats)?.map(|(d, mut r)| {
        r.cache = Some(cache.put(gpu, key, &d, cache_limit));
        (d, r)
    }))
}

/// One side of [`scan_pair_to_device`]: its files, the column, its type as
/// DataFusion reads it, and the row groups it reads.
#[derive(Clone)]
pub struct PairSide<'a> {
    pub files: &'a [ScanFile],
    pub column: &'a str,
    pub arrow: &'a DataType,
    pub keep: Keep,
}

/// Both sides of a selection read from their files onto the device, read
/// and uploaded together and decoded part by part while the reads go on
/// ([`read_upload_decode`]: one device buffer, both sides' parts on the same
/// decode streams). With
/// `cache_limit` above 0 the column cache keeps what was decoded (the caller
/// takes this path only when it holds neither side). `Err((side, why))` when
/// a side's files hold something the device does not decode.
///
/// `read`: both sides already being read on the host ([`ReadAhead`] of the
/// two, started while the device was still starting): then the parts read so
/// far are uploaded and decoded at once, the rest as they come.
pub fn scan_pair_to_device(
    gpu: &Gpu,
    sides: [PairSide<'_>; 2],
    cache_limit: usize,
    read: Option<ReadAhead>,
    stats: &mut TransferStats,
) -> Result<std::result::Result<[(DeviceDecoded, ScanReport); 2], (usize, Fallback)>> {
    let scanned = match read {
        Some(read) => finish_read_ahead(gpu, &sides, cache_limit, read, stats)?,
        None => scan_columns_to_device(gpu, &sides, cache_limit, stats)?,
    };
    let scanned = match scanned {
        Ok(x) => x,
        Err(f) => return Ok(Err(f)),
    };
    let mut scanned = scanned.into_iter();
    match (scanned.next(), scanned.next()) {
        (Some(a), Some(b)) => Ok(Ok([a, b])),
        _ => Err(missing("a side")),
    }
}

/// `columns`, being read on the host ([`ReadAhead::start`] of the same
/// columns, started while the device was still starting), onto the device:
/// the parts read so far are uploaded and decoded at once, the rest as they
/// come; each kept in the column cache (with `cache_limit` above 0).
/// `Err((i, why))` when column `i`'s files hold something the device does
/// not decode.
pub fn finish_read_ahead(
    gpu: &Gpu,
    columns: &[PairSide<'_>],
    cache_limit: usize,
    read: ReadAhead,
    stats: &mut TransferStats,
) -> Result<std::result::Result<Vec<(DeviceDecoded, ScanReport)>, (usize, Fallback)>> {
    Ok(read.finish(gpu, stats)?.map(|scanned| kept_in_cache(gpu, columns, scanned, cache_limit)))
}

/// Each column's decoded keys into the column cache ([`keep_in_cache`]), its report saying so.
fn kept_in_cache(
    gpu: &Gpu,
    columns: &[PairSide<'_>],
    scanned: Vec<(DeviceDecoded, ScanReport)>,
    cache_limit: usize,
) -> Vec<(DeviceDecoded, ScanReport)> {
    columns
        .iter()
        .zip(scanned)
        .map(|(c, (d, mut report))| {
            report.cache = Some(keep_in_cache(gpu, c, &d, cache_limit));
            (d, report)
        })
        .collect()
}

/// Columns (of the same files or others) read from their files onto the
/// device together: one pipeline of reads, uploads and decodes
/// ([`read_upload_decode`]), so a column's reads overlap the others'
/// uploads and decodes; each kept in the column cache (with `cache_limit`
/// above 0). `Err((i, why))` when column `i`'s files hold something the
/// device does not decode.
pub fn scan_columns_to_device(
    gpu: &Gpu,
    columns: &[PairSide<'_>],
    cache_limit: usize,
    stats: &mut TransferStats,
) -> Result<std::result::Result<Vec<(DeviceDecoded, ScanReport)>, (usize, Fallback)>> {
    let plans = match plan_columns(columns)? {
        Ok(plans) => plans,
        Err(f) => return Ok(Err(f)),
    };
    let part_bytes = pages::scan_part_bytes(plans.iter().map(|p| p.bytes).sum());
    let scanned = match read_upload_decode(gpu, plans, part_bytes, stats)? {
        Ok(x) => x,
        Err(f) => return Ok(Err(f)),
    };
    Ok(Ok(kept_in_cache(gpu, columns, scanned, cache_limit)))
}

/// A side's decoded keys into the column cache (with `cache_limit` above 0).
fn keep_in_cache(gpu: &Gpu, side: &PairSide<'_>, d: &DeviceDecoded, cache_limit: usize) -> CacheUse {
    match (cache_limit > 0).then(|| CacheKey::of(side.files, side.column, side.arrow)).flatten() {
        Some(key) => ColumnCache::of(gpu).put(gpu, key.within(side.keep.clone()), d, cache_limit),
        None => CacheUse::Off,
    }
}

/// Streams the decode of a scan's parts runs on: a launch lasts as long as
/// its largest page (one warp decompresses a snappy page: 7-8 ms for a part of
/// ~580 pages of 124 KB on the H200, whatever its size), so a part alone fills
/// a fraction of the device, and several parts' launches overlap. Each part
/// goes to a stream with nothing left to run ([`Decodes::launch`]): with four
/// in turn, the last parts of a 3-column scan waited for earlier launches on
/// theirs, 15-23 ms of decode after the reads.
const DECODE_STREAMS: usize = 8;

/// Reader threads a scan's parts are read by ([`pages::read_chunks_in_waves`];
/// `SETFUSION_SCAN_READERS` to measure others).
fn reader_threads() -> usize {
    crate::env::scan_readers().unwrap_or(2).clamp(1, 8)
}

/// One part of a scan's reads ([`pages::read_chunks_in_waves`]: whole column
/// chunks), its pages walked and its large pages decompressed on the reader
/// thread ([`decode::inflate_part_on_host`]).
struct ReadPart<'a> {
    plan: usize,
    /// Offset in the plan's chunk bytes.
    at: usize,
    bytes: &'a [u8],
    locked: bool,
    /// The part's pages: `src` from the part's start, but the `moved` ones,
    /// which read from the start of `inflated`.
    table: pages::PageTable,
    inflated: PartInflated<'a>,
    moved: Vec<usize>,
}

/// A part's pages decompressed on the host: in its plan's [`InflateRoom`]
/// (at `at` there), or in bytes of their own (empty: none).
enum PartInflated<'a> {
    Lent { at: usize, bytes: &'a [u8], locked: bool },
    Owned(Vec<u8>),
}

/// The bytes a plan's pages decompressed on the host may take, per part,
/// from a kept buffer (reused by the next scans, page-locked after its
/// second, so the upload reads it in place): its share of the device
/// buffer's room lies at the same offsets. A part that does not fit gets
/// bytes of its own.
struct InflateRoom<'a> {
    rest: std::sync::Mutex<(usize, &'a mut [u8])>,
    locked: bool,
}

impl<'a> InflateRoom<'a> {
    fn new(buf: &'a mut pages::ChunkBytes) -> Self {
        let locked = buf.is_page_locked();
        InflateRoom { rest: std::sync::Mutex::new((0, buf.as_mut_slice())), locked }
    }

    /// `n` bytes of the room and their offset in it, if they are left.
    fn take(&self, n: usize) -> Option<(usize, &'a mut [u8])> {
        let mut rest = self.rest.lock().unwrap_or_else(|e| e.into_inner());
        let (at, left) = std::mem::take(&mut *rest);
        if n > left.len() {
            *rest = (at, left);
            return None;
        }
        let (mine, tail) = left.split_at_mut(n);
        *rest = (at + n, tail);
        Some((at, mine))
    }
}

/// The bytes of a plan's [`InflateRoom`] (and of its share of the device
/// buffer): the ZSTD / LZ4_RAW / GZIP chunks' uncompressed sizes and room
/// for the other chunks' dictionary pages ([`pages::ScanPlan::host_inflated_bound`];
/// at most twice the chunks: a footer's sizes are not trusted further), and
/// an eighth of the chunks for large snappy pages.
fn inflate_room(p: &pages::ScanPlan) -> usize {
    let bytes = p.bytes as usize;
    (p.host_inflated_bound as usize).min(2 * bytes).saturating_add(bytes / 8 + (1 << 20))
}

/// Where each of `sizes` starts when they are laid end to end from `start`, and where they end.
fn end_to_end(start: usize, sizes: impl Iterator<Item = usize>) -> (Vec<usize>, usize) {
    let mut at = start;
    let starts = sizes
        .map(|n| {
            let mine = at;
            at = at.saturating_add(n);
            mine
        })
        .collect();
    (starts, at)
}

/// `table`'s pages as they lie in the device buffer: the part's bytes at
/// `part_at`, the `moved` pages' (inflated on the host) at `inflated_at`.
fn place(mut table: pages::PageTable, moved: &[usize], part_at: usize, inflated_at: usize) -> pages::PageTable {
    let mut moved = moved.iter().peekable();
    for (i, p) in table.pages.iter_mut().enumerate() {
        if moved.next_if_eq(&&i).is_some() {
            p.src += inflated_at as u64;
        } else {
            p.src += part_at as u64;
        }
    }
    table
}

/// A part whose inflated pages did not fit the device buffer's room.
struct Deferred {
    plan: usize,
    part_at: usize,
    table: pages::PageTable,
    moved: Vec<usize>,
    inflated: Vec<u8>,
}

/// The decodes a streamed scan launched, on the device's decode streams.
/// Dropped, it waits for them (on every path out, errors included, so that
/// no decode still reads or writes a buffer the scan frees), then frees their
/// page tables and scratch.
struct Decodes {
    streams: Vec<std::sync::Arc<cudarc::driver::CudaStream>>,
    /// Each launched part's page table and scratch on the device, kept until its
    /// decode is done (so the scratch's budget charge lasts as long as its memory is in use).
    flats: Vec<crate::gpu::DeviceBuffer<u64>>,
    /// Each launch's plan and scratch (a BYTE_ARRAY plan's keys then keep its bodies).
    scratch: Vec<(usize, decode::DecodeScratch)>,
    launched: usize,
    /// Per stream, the launch number of its last part and an event after it.
    last: Vec<Option<(usize, cudarc::driver::CudaEvent)>>,
    /// The page tables' host side, copied on the decode streams (declared
    /// last: dropped after the streams are waited for).
    tables: crate::gpu::PinnedArena,
    /// With SETFUSION_TRACE: an event on the main stream when the decodes
    /// began, and each launch's pages, start and end events on its stream.
    timing: Option<DecodeTimes>,
}

/// [`Decodes::timing`].
struct DecodeTimes {
    began: cudarc::driver::CudaEvent,
    launches: Vec<(usize, cudarc::driver::CudaEvent, cudarc::driver::CudaEvent)>,
}

impl DecodeTimes {
    fn start(gpu: &Gpu) -> Option<Self> {
        let timed = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let began = gpu.stream().record_event(timed).ok()?;
        Some(DecodeTimes { began, launches: Vec::new() })
    }

    /// Trace each launch's span on the device, in ms after the decodes began.
    fn report(&self) {
        let at = |e: &cudarc::driver::CudaEvent| self.began.elapsed_ms(e).unwrap_or(f32::NAN);
        for (i, (pages, start, end)) in self.launches.iter().enumerate() {
            crate::util::trace(&format!(
                "device scan: decode {i} ({pages} pages) ran on the device from +{:.2} to +{:.2} ms",
                at(start),
                at(end)
            ));
        }
    }
}

impl Decodes {
    /// Wait for every stream (all of them, whatever fails); the first error.
    fn wait(&self) -> Result<()> {
        let mut first = Ok(());
        for s in &self.streams {
            if let Err(e) = s.synchronize() {
                if first.is_ok() {
                    first = Err(crate::gpu::cuda_err("stream synchronize", e));
                }
            }
        }
        first
    }

    /// Decode `table`'s pages (their bytes at device address `raw`) into
    /// `into` (plan `plan`'s), on a decode stream with nothing left to run
    /// (else the one whose last part came first), after the main stream's
    /// work queued so far (the pages' upload among it).
    fn launch(
        &mut self,
        gpu: &Gpu,
        raw: u64,
        table: &pages::PageTable,
        (plan, into): (usize, &decode::DecodeTargets),
        stats: &mut TransferStats,
    ) -> Result<()> {
        // A stream whose parts are all decoded, else the one whose last part came first.
        let idle = self.last.iter().position(|l| l.as_ref().is_none_or(|(_, e)| e.is_complete()));
        let oldest = || (0..self.last.len()).min_by_key(|&i| self.last[i].as_ref().map_or(0, |(n, _)| *n));
        let on = idle.or_else(oldest).unwrap_or(0);
        let stream = &self.streams[on];
        // The page table is copied on the decode stream, before it waits for the
        // part's upload: the main stream's copies stay queued (an upload through
        // the staging buffers would wait for them, a whole part).
        // Kept before the launch: a launch that fails half way may have queued kernels that read it.
        let (flat, flat_addr) = gpu.upload_on(&mut self.tables, stream, &table.flat(), stats)?;
        self.flats.push(flat);
        let done = gpu.stream().record_event(None).map_err(|e| crate::gpu::cuda_err("event record", e))?;
        stream.wait(&done).map_err(|e| crate::gpu::cuda_err("stream wait", e))?;
        let timed = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.timing.as_ref().and_then(|_| stream.record_event(timed).ok());
        self.scratch.extend(decode::launch_decode(gpu, stream, raw, flat_addr, table, into)?.map(|s| (plan, s)));
        if let (Some(t), Some(start), Ok(end)) = (self.timing.as_mut(), start, stream.record_event(timed)) {
            t.launches.push((table.pages.len(), start, end));
        }
        let after = stream.record_event(None).map_err(|e| crate::gpu::cuda_err("event record", e))?;
        self.last[on] = Some((self.launched, after));
        self.launched += 1;
        Ok(())
    }
}

impl Drop for Decodes {
    fn drop(&mut self) {
        let _ = self.wait();
    }
}

/// Read the chunks of `plans` (one scan each) on the host threads, in parts of
/// whole column chunks ([`pages::read_chunks_in_waves`]; the plans side by
/// side, into read buffers kept for the next scan), each part uploaded and
/// decoded while the next parts are read ([`upload_decode_parts`]). Returns
/// each plan's keys and report, or `Err((plan, why))` when a plan's files
/// hold something the device does not decode.
#[allow(clippy::type_complexity)]
fn read_upload_decode(
    gpu: &Gpu,
    plans: Vec<pages::ScanPlan>,
    part_bytes: usize,
    stats: &mut TransferStats,
) -> Result<std::result::Result<Vec<(DeviceDecoded, ScanReport)>, (usize, Fallback)>> {
    let (mut bufs, mut rooms) = read_buffers(&plans);
    let scanned = crate::host::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        let readers = spawn_readers(s, &plans, &mut bufs, &mut rooms, part_bytes, tx);
        let join = || Ok(readers.into_iter().map(joined).collect());
        upload_decode_parts(gpu, &plans, rx.into_iter(), join, stats)
    });
    bufs.into_iter().chain(rooms).for_each(|b| pages::give_back_to_device(b, gpu));
    scanned
}

/// The device half of a streamed scan: each part of `plans`' reads (from
/// `parts`, in any order) uploaded on the main stream as it comes (straight
/// from page-locked memory when it lies there), then decoded at once on one
/// of the decode streams ([`decode::launch_decode`]) while the main stream
/// uploads the next parts. Each part's large pages, decompressed on the host
/// by its reader, land in the device buffer after every chunk. `join`: the
/// readers' outcomes, once `parts` has ended.
#[allow(clippy::type_complexity)]
fn upload_decode_parts<'a>(
    gpu: &Gpu,
    plans: &[pages::ScanPlan],
    parts: impl Iterator<Item = ReadPart<'a>>,
    join: impl FnOnce() -> Result<ReadOutcomes>,
    stats: &mut TransferStats,
) -> Result<std::result::Result<Vec<(DeviceDecoded, ScanReport)>, (usize, Fallback)>> {
    let (chunk_at, total) = end_to_end(0, plans.iter().map(|p| p.bytes as usize));
    // After the chunks, each plan's room for the pages inflated on the host
    // ([`inflate_room`]: a part's pages lent a share of the plan's host room
    // land at the same offset in its share here); pages in bytes of their
    // own go after, in the order they come (a part whose pages do not fit
    // waits for the reads to end, and the buffer grows).
    let (room_at, rooms_end) = end_to_end(total, plans.iter().map(inflate_room));
    let room = rooms_end - total;
    // (Traced: a large allocation that must grow the pool takes milliseconds.)
    let trace_pool = |what: &str| {
        if crate::util::tracing() {
            let (reserved, used) = gpu.pool_bytes().unwrap_or_default();
            let (reserved, used) = (reserved as f64 / 1e9, used as f64 / 1e9);
            crate::util::trace(&format!(
                "device scan: {what}; the pool holds {reserved:.2} GB, {used:.2} GB of it in use"
            ));
        }
    };
    trace_pool("allocating the page buffer");
    let mut dev = match gpu.alloc::<u8>(total.saturating_add(room)) {
        Ok(d) => d,
        // Near the budget: the chunks alone (the inflated pages then grow the buffer).
        Err(_) => gpu.alloc::<u8>(total)?,
    };
    trace_pool(&format!("page buffer allocated ({:.2} GB)", dev.len() as f64 / 1e9));
    // Each plan's keys and validity, and the decodes' error word.
    let mut outs = Vec::with_capacity(plans.len());
    for p in plans {
        // The rows of pages left out (the page index) are never written: 0, as in the CPU twin
        // (so a filter's checked arithmetic meets no stray value there; the filter drops those rows).
        let keys = if p.pages_pruned > 0 {
            gpu.alloc_zeros::<u64>(p.rows as usize)?
        } else {
            gpu.alloc::<u64>(p.rows as usize)?
        };
        let valid = if p.def_max > 0 { Some(gpu.alloc_zeros::<u32>((p.rows as usize).div_ceil(32))?) } else { None };
        let strings = if p.width == pages::WIDTH_BYTES {
            Some(decode::DeviceStrings::zeroed(gpu, p.rows as usize)?)
        } else {
            None
        };
        outs.push(DeviceDecoded { keys, valid, rows: p.rows as usize, strings });
    }
    crate::util::trace("device scan: output buffers allocated");
    let err = gpu.alloc_zeros::<u32>(1)?;
    let dummy_valid = gpu.alloc_zeros::<u32>(1)?;
    let targets: Vec<decode::DecodeTargets> = outs
        .iter()
        .map(|o| decode::DecodeTargets {
            keys: gpu.untracked_address(&o.keys),
            valid: gpu.untracked_address(o.valid.as_ref().unwrap_or(&dummy_valid)),
            err: gpu.untracked_address(&err),
            spans: o.strings.as_ref().map_or(0, |s| gpu.untracked_address(&s.spans)),
        })
        .collect();
    // The decode streams start after the buffers above exist (allocated and zeroed on the main stream).
    // (Declared after every buffer the decodes use: dropped first, it waits for them on every path.)
    let mut decodes = Decodes {
        streams: gpu.side_streams(DECODE_STREAMS)?,
        flats: Vec::new(),
        scratch: Vec::new(),
        launched: 0,
        last: (0..DECODE_STREAMS).map(|_| None).collect(),
        tables: gpu.pinned_arena(),
        timing: if crate::util::tracing() { DecodeTimes::start(gpu) } else { None },
    };
    let ready = gpu.stream().record_event(None).map_err(|e| crate::gpu::cuda_err("event record", e))?;
    for s in &decodes.streams {
        s.wait(&ready).map_err(|e| crate::gpu::cuda_err("stream wait", e))?;
    }
    crate::util::trace("device scan: device buffers allocated");
    let dev_addr = gpu.untracked_address(&dev);
    let dev_len = dev.len();
    let mut pages_of = vec![0usize; plans.len()];
    // (Near the budget the buffer holds the chunks alone: every inflated page waits for it to grow.)
    let rooms_fit = dev_len >= rooms_end;
    let mut inflated_at = if rooms_fit { rooms_end } else { total };
    // Parts whose inflated pages did not fit the room: decoded once the buffer has grown.
    let mut deferred: Vec<Deferred> = Vec::new();
    let scoped = (|| -> Result<(ReadOutcomes, Instant)> {
        let ((failed, reads, reads_done), _, _) = gpu.streamed_upload(&mut dev, stats, |up, stats| {
            let mut failed = None;
            for part in parts {
                if failed.is_some() {
                    continue;
                }
                let upload_and_decode = || -> Result<()> {
                    let (i, part_at) = (part.plan, chunk_at[part.plan] + part.at);
                    up.piece(part_at, part.bytes, part.locked, stats)?;
                    let ReadPart { table, inflated, moved, .. } = part;
                    let table = match inflated {
                        PartInflated::Owned(own) if own.is_empty() => place(table, &moved, part_at, 0),
                        PartInflated::Lent { at, bytes, locked } if rooms_fit => {
                            let at = room_at[i] + at;
                            up.piece(at, bytes, locked, stats)?;
                            place(table, &moved, part_at, at)
                        }
                        PartInflated::Owned(own) if inflated_at + own.len() <= dev_len => {
                            up.piece_copied(inflated_at, &own, stats)?;
                            let at = inflated_at;
                            inflated_at += own.len();
                            place(table, &moved, part_at, at)
                        }
                        PartInflated::Lent { bytes, .. } => {
                            deferred.push(Deferred { plan: i, part_at, table, moved, inflated: bytes.to_vec() });
                            return Ok(());
                        }
                        PartInflated::Owned(inflated) => {
                            deferred.push(Deferred { plan: i, part_at, table, moved, inflated });
                            return Ok(());
                        }
                    };
                    pages_of[i] += table.pages.len();
                    decodes.launch(gpu, dev_addr, &table, (i, &targets[i]), stats)?;
                    crate::util::trace(&format!("device scan: part at {part_at} uploaded, its decode queued"));
                    Ok(())
                };
                if let Err(e) = upload_and_decode() {
                    failed = Some(e);
                }
            }
            // Every reader has ended (the parts have).
            (failed, join(), Instant::now())
        })?;
        match (failed, reads) {
            (Some(e), _) | (None, Err(e)) => Err(e),
            (None, Ok(reads)) if reads.len() != plans.len() => Err(missing("a read")),
            (None, Ok(reads)) => Ok((reads, reads_done)),
        }
    })();
    let (reads, reads_done) = match scoped {
        Ok(x) => x,
        Err(e) => {
            drop(decodes);
            return Err(e);
        }
    };
    crate::util::trace("device scan: parts read and uploaded");
    if crate::util::tracing() {
        // Trace only: when the queued uploads ended on the device (the decodes may still run).
        let _ = gpu.stream().synchronize();
        crate::util::trace("device scan: uploads landed");
    }
    let mut upload = reads_done.elapsed();
    let mut times = Vec::with_capacity(reads.len());
    for (i, (r, t)) in reads.into_iter().enumerate() {
        match r {
            Ok(None) => times.push(t),
            Ok(Some(f)) => {
                drop(decodes);
                return Ok(Err((i, f)));
            }
            Err(e) => {
                drop(decodes);
                return Err(e);
            }
        }
    }
    // Parts whose inflated pages did not fit: the buffer grows (once the decodes
    // reading the old one are done), then they upload and decode.
    if !deferred.is_empty() {
        let t = Instant::now();
        let grown = (|| -> Result<()> {
            decodes.wait()?;
            let need = inflated_at + deferred.iter().map(|d| d.inflated.len()).sum::<usize>();
            let mut bigger = gpu.alloc::<u8>(need)?;
            gpu.stream()
                .memcpy_dtod(&dev.slice.slice(0..inflated_at), &mut bigger.slice.slice_mut(0..inflated_at))
                .map_err(|e| crate::gpu::cuda_err("cuMemcpyDtoD", e))?;
            dev = bigger;
            let dev_addr = gpu.untracked_address(&dev);
            for Deferred { plan: i, part_at, table, moved, inflated } in std::mem::take(&mut deferred) {
                gpu.upload_chunks_into(&[&inflated[..]], &mut dev, inflated_at, stats)?;
                let table = place(table, &moved, part_at, inflated_at);
                pages_of[i] += table.pages.len();
                inflated_at += inflated.len();
                decodes.launch(gpu, dev_addr, &table, (i, &targets[i]), stats)?;
            }
            Ok(())
        })();
        if let Err(e) = grown {
            drop(decodes);
            return Err(e);
        }
        upload += t.elapsed();
    }
    // What the decode took after the uploads, and whether a page failed.
    let t = Instant::now();
    let waited = decodes.wait().and_then(|_| gpu.read_one(&err, 0, stats));
    let decode = t.elapsed();
    crate::util::trace("device scan: parts decoded");
    if let Some(t) = &decodes.timing {
        t.report();
    }
    stats.kernel += decode;
    if waited.is_ok() {
        // Done: a BYTE_ARRAY column's spans point into its parts' page bodies, which its keys now keep.
        for (plan, scratch) in std::mem::take(&mut decodes.scratch) {
            if let Some(strings) = outs.get_mut(plan).and_then(|o| o.strings.as_mut()) {
                strings.hold(scratch);
            }
        }
    }
    drop(decodes);
    match waited {
        Err(e) => return Err(e),
        Ok(0) => {}
        Ok(code) => return Err(decode::decode_error(code)),
    }
    drop(dev);
    Ok(Ok(plans
        .iter()
        .zip(outs)
        .zip(times)
        .zip(pages_of)
        .map(|(((plan, d), read), pages)| {
            let report =
                ScanReport { streamed: true, decoded_while_read: true, ..report_of(plan, pages, read, upload, decode) };
            (d, report)
        })
        .collect()))
}

/// One scan read, uploaded and decoded together ([`read_upload_decode`]).
fn read_to_device(
    gpu: &Gpu,
    files: &[ScanFile],
    column: &str,
    arrow: &DataType,
    keep: &Keep,
    stats: &mut TransferStats,
) -> Result<std::result::Result<(DeviceDecoded, ScanReport), Fallback>> {
    let plan = match pages::plan_scan_within(files, column, arrow, keep)? {
        Ok(p) => p,
        Err(f) => return Ok(Err(f)),
    };
    let part_bytes = pages::scan_part_bytes(plan.bytes);
    match read_upload_decode(gpu, vec![plan], part_bytes, stats)? {
        Ok(scanned) => {
            scanned.into_iter().next().map(Ok).ok_or_else(|| {
                datafusion::error::DataFusionError::Internal("setfusion device scan: no scan read".into())
            })
        }
        Err((_, f)) => Ok(Err(f)),
    }
}

/// [`scan_to_device`]'s CPU twin: the same keys, decoded on the host.
pub fn scan_to_host(
    files: &[ScanFile],
    column: &str,
    arrow: &DataType,
) -> Result<std::result::Result<Decoded, Fallback>> {
    scan_to_host_within(files, column, arrow, &Keep::default())
}

/// [`scan_to_host`] of the row groups and rows `keep` leaves (the rows of
/// the data pages it leaves out are 0, and NULL in an optional column).
pub fn scan_to_host_within(
    files: &[ScanFile],
    column: &str,
    arrow: &DataType,
    keep: &Keep,
) -> Result<std::result::Result<Decoded, Fallback>> {
    let plan = match pages::plan_scan_within(files, column, arrow, keep)? {
        Ok(p) => p,
        Err(f) => return Ok(Err(f)),
    };
    let raw = pages::read_chunks(&plan)?;
    let decoded = match pages::page_table(&plan, &raw)? {
        Ok(t) => Ok(decode_cpu(&raw, &t)?),
        Err(f) => Err(f),
    };
    pages::give_back(raw);
    Ok(decoded)
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::{Date32Type, Decimal128Type, Int32Type, Int64Type};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    use super::fixtures::{cases, table_of, write};
    use super::*;

    /// What arrow-rs's reader gives for the case, as keys and validity.
    fn arrow_keys(bytes: Vec<u8>) -> Decoded {
        let path = std::env::temp_dir().join(format!(
            "setfusion-pq-arrow-{}-{:?}.parquet",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::write(&path, bytes).unwrap();
        let reader =
            ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path).unwrap()).unwrap().build().unwrap();
        let _ = std::fs::remove_file(&path);
        let (mut keys, mut valid) = (Vec::new(), Vec::new());
        for b in reader {
            let b = b.unwrap();
            let a = b.column(0);
            for i in 0..a.len() {
                let v = match a.data_type() {
                    DataType::Boolean => a.as_boolean().value(i) as u64,
                    DataType::Int64 => a.as_primitive::<Int64Type>().value(i) as u64,
                    DataType::Int32 => a.as_primitive::<Int32Type>().value(i) as i64 as u64,
                    DataType::Date32 => a.as_primitive::<Date32Type>().value(i) as i64 as u64,
                    DataType::Decimal128(..) => a.as_primitive::<Decimal128Type>().value(i) as i64 as u64,
                    DataType::Utf8 => crate::keys::hash_bytes(a.as_string::<i32>().value(i).as_bytes()),
                    DataType::Utf8View => crate::keys::hash_bytes(a.as_string_view().value(i).as_bytes()),
                    DataType::Binary => crate::keys::hash_bytes(a.as_binary::<i32>().value(i)),
                    DataType::BinaryView => crate::keys::hash_bytes(a.as_binary_view().value(i)),
                    t => panic!("{t}"),
                };
                keys.push(if a.is_valid(i) { v } else { 0 });
                valid.push(a.is_valid(i));
            }
        }
        let nullable = valid.iter().any(|v| !v);
        let words = (0..keys.len().div_ceil(32))
            .map(|w| {
                (0..32).filter(|j| valid.get(w * 32 + j).copied().unwrap_or(false)).fold(0u32, |acc, j| acc | 1 << j)
            })
            .collect();
        Decoded { keys, valid: nullable.then_some(words) }
    }

    /// The CPU twin equals arrow-rs's reader on every writer option, and the
    /// pages really cover what the cases claim (dictionary, PLAIN, v2, snappy,
    /// DELTA_BINARY_PACKED in v1 and v2 pages: every data page of a DELTA case).
    #[test]
    fn cpu_twin_matches_arrow_reader() {
        let (mut dict_pages, mut plain_pages, mut v2_pages, mut snappy_pages, mut mixed_chunks) = (0, 0, 0, 0, 0);
        let (mut delta_v1_pages, mut delta_v2_pages) = (0, 0);
        let (mut bool_plain_pages, mut bool_rle_v1_pages, mut bool_rle_v2_pages) = (0, 0, 0);
        let mut page_indexes = [0usize; 2];
        for case in cases() {
            let (raw, table) = table_of(&case).unwrap();
            // The writer's page index option took effect (a file without one is read all the same).
            let path = std::env::temp_dir().join(format!("setfusion-pq-index-{}.parquet", std::process::id()));
            std::fs::write(&path, write(&case).unwrap()).unwrap();
            let meta = parquet::file::metadata::ParquetMetaDataReader::new()
                .with_page_index_policy(parquet::file::metadata::PageIndexPolicy::Optional)
                .parse_and_finish(&std::fs::File::open(&path).unwrap())
                .unwrap();
            let _ = std::fs::remove_file(&path);
            assert_eq!(meta.offset_index().is_some(), case.page_index, "{}", case.name);
            page_indexes[case.page_index as usize] += 1;
            let mut got = decode_cpu(&raw, &table).unwrap();
            let want = arrow_keys(write(&case).unwrap());
            // A required column has no validity; an optional one without NULLs has all bits set.
            if case.nulls == 0 {
                assert!(got.valid.is_none(), "{}", case.name);
            } else if want.valid.is_none() {
                assert!(got.valid.as_ref().unwrap().iter().enumerate().all(|(w, &x)| {
                    let live = (case.rows - w * 32).min(32);
                    x == if live == 32 { u32::MAX } else { (1 << live) - 1 }
                }));
                got.valid = None;
            }
            assert_eq!(got, want, "{}", case.name);
            for p in &table.pages {
                dict_pages += (p.encoding == pages::ENC_DICT) as usize;
                plain_pages += (p.kind != pages::KIND_DICT && p.encoding == pages::ENC_PLAIN) as usize;
                v2_pages += (p.kind == pages::KIND_V2) as usize;
                snappy_pages += (p.codec == pages::CODEC_SNAPPY) as usize;
                let delta = p.kind != pages::KIND_DICT && p.encoding == pages::ENC_DELTA;
                delta_v1_pages += (delta && p.kind == pages::KIND_V1) as usize;
                delta_v2_pages += (delta && p.kind == pages::KIND_V2) as usize;
                if case.delta {
                    assert!(p.kind != pages::KIND_DICT && p.encoding == pages::ENC_DELTA, "{}: {p:?}", case.name);
                } else {
                    assert!(!delta, "{}: {p:?}", case.name);
                }
                if case.data_type == DataType::Boolean && p.kind != pages::KIND_DICT {
                    let want = if case.rle { pages::ENC_RLE_BOOL } else { pages::ENC_PLAIN };
                    assert_eq!(p.encoding, want, "{}: {p:?}", case.name);
                    bool_plain_pages += (p.encoding == pages::ENC_PLAIN) as usize;
                    bool_rle_v1_pages += (p.encoding == pages::ENC_RLE_BOOL && p.kind == pages::KIND_V1) as usize;
                    bool_rle_v2_pages += (p.encoding == pages::ENC_RLE_BOOL && p.kind == pages::KIND_V2) as usize;
                }
            }
            if case.dict_fallback {
                mixed_chunks += table.pages.windows(2).any(|w| {
                    w[0].encoding == pages::ENC_DICT
                        && w[1].encoding == pages::ENC_PLAIN
                        && w[1].kind != pages::KIND_DICT
                }) as usize;
            }
        }
        assert!(
            dict_pages > 0 && plain_pages > 0 && v2_pages > 0 && snappy_pages > 0,
            "{dict_pages} {plain_pages} {v2_pages} {snappy_pages}"
        );
        assert!(mixed_chunks > 0, "no chunk fell back from dictionary to PLAIN");
        assert!(page_indexes.iter().all(|&n| n >= 10), "files without / with a page index: {page_indexes:?}");
        assert!(delta_v1_pages > 0 && delta_v2_pages > 0, "DELTA pages: {delta_v1_pages} v1, {delta_v2_pages} v2");
        assert!(
            bool_plain_pages > 0 && bool_rle_v1_pages > 0 && bool_rle_v2_pages > 0,
            "BOOLEAN pages: {bool_plain_pages} PLAIN, {bool_rle_v1_pages} RLE v1, {bool_rle_v2_pages} RLE v2"
        );
    }

    /// Each fixture case as a file of its own (in a folder of this process).
    fn case_files(tag: &str) -> Vec<(super::fixtures::Case, Vec<ScanFile>)> {
        let dir = std::env::temp_dir().join(format!("setfusion-pq-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        cases()
            .into_iter()
            .map(|case| {
                let path = dir.join(format!("{}.parquet", case.name.replace(|c: char| !c.is_alphanumeric(), "_")));
                std::fs::write(&path, write(&case).unwrap()).unwrap();
                (case, vec![ScanFile { path, ranges: vec![] }])
            })
            .collect()
    }

    /// A scan read in parts of whole chunks ([`pages::read_chunks_in_waves`]),
    /// each part's pages walked and its large pages inflated on their own
    /// ([`pages::page_table_of`], [`decode::inflate_part_on_host`], no size
    /// floor) and placed as [`read_upload_decode`] places them, decodes on the
    /// CPU twin, part by part, to the whole scan's keys and validity.
    #[test]
    fn parts_decode_as_the_whole() {
        let mut several = 0;
        for (case, files) in case_files("waves") {
            let plan = pages::plan_scan(&files, "k", &case.data_type).unwrap().unwrap();
            let whole = pages::read_chunks(&plan).unwrap().into_vec();
            let want = decode_cpu(&whole, &pages::page_table(&plan, &whole).unwrap().unwrap()).unwrap();
            for part_bytes in [1usize, 4096, 1 << 30] {
                let mut buf = pages::kept_buffer(plan.bytes as usize);
                let got = std::sync::Mutex::new(Vec::new());
                pages::read_chunks_in_waves(&plan, &mut buf, part_bytes, 3, &|at, bytes, _, chunks| {
                    got.lock().unwrap().push((at, bytes.to_vec(), chunks));
                    Ok(())
                })
                .unwrap();
                pages::give_back(buf);
                // Three readers hand parts over in any order.
                let mut parts = got.into_inner().unwrap();
                parts.sort_by_key(|p| p.0);
                // The parts are the chunks, in order, each chunk in one part, back to back.
                let (mut next, mut end) = (0, 0);
                for (at, bytes, chunks) in &parts {
                    assert_eq!(*at, end, "{}", case.name);
                    end += bytes.len();
                    assert_eq!(chunks.start, next, "{}", case.name);
                    assert!(chunks.end > chunks.start, "{}", case.name);
                    assert_eq!(&whole[*at..*at + bytes.len()], &bytes[..], "{}", case.name);
                    next = chunks.end;
                }
                assert_eq!(next, plan.chunk_count(), "{}", case.name);
                assert_eq!(end, whole.len(), "{}", case.name);
                several += usize::from(part_bytes == 1 && parts.len() > 1);
                // The device buffer: the chunks, then each part's inflated pages.
                let mut device = whole.clone();
                let mut tables = Vec::new();
                for (at, bytes, chunks) in &parts {
                    let mut t = pages::page_table_of(&plan, chunks.clone(), bytes).unwrap().unwrap();
                    let (inflated, moved) = decode::inflate_part_on_host(&mut t, bytes, 0, |_| None).unwrap();
                    let decode::Inflated::Owned(inflated) = inflated else { panic!("no room was lent") };
                    tables.push(place(t, &moved, *at, device.len()));
                    device.extend_from_slice(&inflated);
                }
                let mut got =
                    Decoded { keys: vec![0; want.keys.len()], valid: want.valid.as_ref().map(|v| vec![0; v.len()]) };
                for t in &tables {
                    // Rows outside the part decode to key 0 and a clear bit.
                    let d = decode_cpu(&device, t).unwrap();
                    got.keys.iter_mut().zip(&d.keys).for_each(|(g, k)| *g |= *k);
                    if let (Some(g), Some(v)) = (got.valid.as_mut(), &d.valid) {
                        g.iter_mut().zip(v).for_each(|(g, w)| *g |= *w);
                    }
                }
                assert_eq!(got, want, "{} in parts of {part_bytes} bytes", case.name);
            }
        }
        assert!(several > 0, "no case has several column chunks");
    }

    /// The streamed scan ([`read_upload_decode`]: each part decoded on the
    /// decode streams while the next are read) gives the CPU twin's keys and
    /// validity, two scans side by side, with one chunk a part and all in one.
    #[test]
    fn streamed_scans_match_the_cpu_twin() {
        let Some(g) = crate::gpu::test_gpu() else { return };
        let all = case_files("streamed");
        let mut stats = TransferStats::default();
        for ((x, xf), (y, yf)) in all.iter().zip(all.iter().cycle().skip(1)) {
            for part_bytes in [1usize, 1 << 30] {
                let plans = vec![
                    pages::plan_scan(xf, "k", &x.data_type).unwrap().unwrap(),
                    pages::plan_scan(yf, "k", &y.data_type).unwrap().unwrap(),
                ];
                let got = read_upload_decode(&g, plans, part_bytes, &mut stats).unwrap().unwrap();
                for ((d, r), (case, files)) in got.iter().zip([(x, xf), (y, yf)]) {
                    let want = scan_to_host(files, "k", &case.data_type).unwrap().unwrap();
                    let name = format!("{} beside {}, parts of {part_bytes} bytes", x.name, y.name);
                    assert_eq!(decode::download_decoded(&g, d, &mut stats).unwrap(), want, "{name}");
                    assert!(r.decoded_while_read && r.rows as usize == want.keys.len(), "{name}");
                }
            }
            // Read ahead (a fresh process reads before the device is there).
            let sides = [(x, xf), (y, yf)].map(|(case, files)| PairSide {
                files,
                column: "k",
                arrow: &case.data_type,
                keep: Keep::default(),
            });
            let got = ReadAhead::start(&sides).finish(&g, &mut stats).unwrap().unwrap();
            for ((d, _), (case, files)) in got.iter().zip([(x, xf), (y, yf)]) {
                let want = scan_to_host(files, "k", &case.data_type).unwrap().unwrap();
                let name = format!("{} beside {}, read ahead", x.name, y.name);
                assert_eq!(decode::download_decoded(&g, d, &mut stats).unwrap(), want, "{name}");
            }
        }
    }

    /// Large pages decompressed on the host ([`decode::inflate_on_host`],
    /// no size floor) decode, from the chunks followed by the inflated bodies,
    /// as before; some case has such a page (a dictionary page beside small
    /// data pages), and a case whose pages are alike keeps them all.
    #[test]
    fn host_inflated_pages_decode_the_same() {
        let mut inflated = 0;
        for case in cases() {
            let (raw, table) = table_of(&case).unwrap();
            let want = decode_cpu(&raw, &table).unwrap();
            let mut t = table.clone();
            let extra = decode::inflate_on_host(&mut t, &raw, raw.len() as u64, 0).unwrap();
            let moved = t.pages.iter().filter(|p| p.src >= raw.len() as u64).count();
            assert!(
                t.pages.iter().zip(&table.pages).all(|(a, b)| (a.src >= raw.len() as u64) == (a.codec != b.codec)),
                "{}",
                case.name
            );
            assert!(t.pages.iter().all(|p| !pages::inflated_on_host(p.codec)), "{}", case.name);
            inflated += moved;
            let both = [raw.as_slice(), &extra[..]].concat();
            assert_eq!(decode_cpu(&both, &t).unwrap(), want, "{}", case.name);
        }
        assert!(inflated > 0, "no case has a page over twice its median");
    }

    /// With `SETFUSION_WRITE_PQ_FIXTURES=DIR`: every case's raw bytes, page
    /// table and arrow-rs's keys as files, for scripts/kernels-on-host/parquet.sh.
    #[test]
    fn write_kernel_fixtures() {
        let Some(dir) = std::env::var_os("SETFUSION_WRITE_PQ_FIXTURES") else { return };
        write_kernel_fixtures_to(std::path::Path::new(&dir));
    }

    /// Every fixture case's raw bytes, page table and arrow-rs's keys under `dir`.
    fn write_kernel_fixtures_to(dir: &std::path::Path) {
        let u64s = |v: &[u64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let all = cases();
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("cases.bin"), u64s(&[all.len() as u64])).unwrap();
        for (i, case) in all.iter().enumerate() {
            // The kernels see pages the host inflates decompressed already (ZSTD ones too under
            // SETFUSION_DEVICE_ZSTD=0; the scripts set it to 1, so that zstd.cu runs on them).
            let (raw, table) = decode::device_table_of(case).unwrap();
            let want = decode_cpu(&raw, &table).unwrap();
            assert_eq!(want.keys, arrow_keys(write(case).unwrap()).keys, "{}", case.name);
            let d = dir.join(format!("case{i}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(
                d.join("meta.bin"),
                u64s(&[table.rows, table.body_len, table.lvl_words, table.idx_len, table.def_max]),
            )
            .unwrap();
            std::fs::write(d.join("raw.bin"), &raw).unwrap();
            std::fs::write(d.join("pages.bin"), u64s(&table.flat())).unwrap();
            std::fs::write(d.join("keys.bin"), u64s(&want.keys)).unwrap();
            let valid: Vec<u8> = want.valid.unwrap_or_default().iter().flat_map(|w| w.to_le_bytes()).collect();
            std::fs::write(d.join("valid.bin"), valid).unwrap();
        }
    }

    /// The decode kernels' real CUDA source compiled as C++ and run on the
    /// host over the fixtures (scripts/kernels-on-host: `parquet.sh`, also under
    /// AddressSanitizer + UBSan; `parquet-warp.sh` as warps of 4 emulated lanes;
    /// `zstd.sh`), so that CI without a GPU runs them too. Skipped, with the
    /// reason, where g++ or the scripts are missing (`zstd.sh`: the zstd tool).
    #[test]
    fn decode_kernels_pass_on_the_host() {
        use std::process::Command;
        let scripts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kernels-on-host");
        let has = |tool: &str| Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success());
        if !scripts.is_dir() || !has("g++") {
            eprintln!("skipping the decode kernels on the host: no g++ or no {}", scripts.display());
            return;
        }
        let dir = std::env::temp_dir().join(format!("setfusion-pq-kernel-fixtures-{}", std::process::id()));
        write_kernel_fixtures_to(&dir);
        let mut runs = vec![("parquet.sh", vec![]), ("parquet-warp.sh", vec!["4"])];
        if has("zstd") && has("python3") {
            runs.push(("zstd.sh", vec![]));
        } else {
            eprintln!("skipping zstd.sh on the host: no zstd or python3 tool");
        }
        for (script, args) in runs {
            let out = Command::new("bash")
                .arg(scripts.join(script))
                .args(&args)
                .env("PQ_FIXTURES", &dir)
                .output()
                .unwrap_or_else(|e| panic!("{script}: {e}"));
            let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success(), "{script} {args:?} failed:\n{said}");
            eprintln!("kernels on the host, {script} {args:?}: {}", said.trim().replace('\n', "; "));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Inputs for the ZSTD kernel's tests: integer keys as `bench parquet`
    /// writes them, sorted and small integers, text, incompressible and
    /// constant bytes, and empty and tiny inputs.
    fn zstd_test_inputs() -> Vec<Vec<u8>> {
        let mut rng = crate::util::Xorshift64(0x9E3779B97F4A7C15);
        let mut next = move || rng.next_u64();
        let keys: Vec<u8> = (0..100_000).flat_map(|_| (next() % 400_000_000).to_le_bytes()).collect();
        let mut sorted: Vec<u64> = (0..60_000).map(|_| next() % 1_000_000_000_000).collect();
        sorted.sort_unstable();
        let sorted: Vec<u8> = sorted.iter().flat_map(|v| v.to_le_bytes()).collect();
        let small: Vec<u8> = (0..80_000).flat_map(|_| ((next() % 100) as i32 - 50).to_le_bytes()).collect();
        let words = ["set", "fusion", "parquet", "zstd", "warp", "literal", "match", "offset"];
        let text: Vec<u8> =
            (0..50_000).map(|_| words[(next() % 8) as usize]).collect::<Vec<_>>().join(" ").into_bytes();
        let noise: Vec<u8> = (0..300_000).map(|_| next() as u8).collect();
        vec![keys, sorted, small, text, noise, vec![0u8; 400_000], Vec::new(), b"x".to_vec(), b"hello".to_vec()]
    }

    /// Every input of [`zstd_test_inputs`] as frames of the zstd crate at
    /// levels 1, 3, 9 and 19, one with a checksum, and two frames in one run.
    fn zstd_test_frames() -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut frames: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        for data in zstd_test_inputs() {
            for level in [1, 3, 9, 19] {
                frames.push((zstd::bulk::compress(&data, level).unwrap(), data.clone()));
            }
        }
        let mut enc = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
        enc.include_checksum(true).unwrap();
        std::io::Write::write_all(&mut enc, &frames[0].1).unwrap();
        frames.push((enc.finish().unwrap(), frames[0].1.clone()));
        let two = [frames[1].0.clone(), frames[13].0.clone()].concat();
        frames.push((two, [frames[1].1.clone(), frames[13].1.clone()].concat()));
        frames
    }

    /// With `SETFUSION_WRITE_ZSTD_FIXTURES=DIR`: the GPU test's frames and
    /// their originals as files, and their list, for scripts/kernels-on-host/zstd.sh.
    #[test]
    fn write_zstd_fixtures() {
        let Some(dir) = std::env::var_os("SETFUSION_WRITE_ZSTD_FIXTURES") else { return };
        let dir = std::path::PathBuf::from(dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut list = String::new();
        for (i, (z, d)) in zstd_test_frames().iter().enumerate() {
            let (zp, dp) = (dir.join(format!("crate{i}.zst")), dir.join(format!("crate{i}")));
            std::fs::write(&zp, z).unwrap();
            std::fs::write(&dp, d).unwrap();
            list += &format!("{} {}\n", zp.display(), dp.display());
        }
        std::fs::write(dir.join("list"), list).unwrap();
    }

    /// kernels/zstd.cu against the zstd crate ([`zstd_test_frames`]); damaged
    /// frames fail or decode, never fault, and a run with room for one byte
    /// more than its frames fails.
    #[test]
    fn gpu_zstd_pages_match_the_zstd_crate() {
        let Some(g) = crate::gpu::test_gpu() else { return };
        let frames = zstd_test_frames();
        let runs: Vec<(&[u8], usize)> = frames.iter().map(|(z, d)| (z.as_slice(), d.len())).collect();
        let got = decode::zstd_on_device(&g, &runs).unwrap();
        for (i, ((_, want), got)) in frames.iter().zip(&got).enumerate() {
            assert!(got == want, "frame {i}: {} bytes decompressed differ", want.len());
        }
        assert!(decode::zstd_on_device(&g, &[(&frames[1].0, frames[1].1.len() + 1)]).is_err());
        let mut failed = 0;
        for (z, d) in &frames {
            for at in [z.len() / 3, z.len() / 2, z.len().saturating_sub(2)] {
                let mut bad = z.clone();
                if let Some(b) = bad.get_mut(at) {
                    *b ^= 0x5A;
                }
                failed += decode::zstd_on_device(&g, &[(&bad, d.len())]).is_err() as usize;
            }
        }
        println!("{} frames equal to the zstd crate's; {failed} damaged frames failed cleanly", frames.len());
    }

    /// The device decodes every case to the CPU twin's keys and validity.
    #[test]
    fn gpu_decode_matches_cpu_twin() {
        let Some(g) = crate::gpu::test_gpu() else { return };
        println!("{}", decode::self_check(&g).unwrap());
    }

    /// Corrupt bytes give an error, never a panic, on both backends (every
    /// fifth case, and every DELTA case).
    #[test]
    fn corrupt_pages_fail_cleanly() {
        let g = crate::gpu::test_gpu();
        for case in cases().into_iter().enumerate().filter(|(i, c)| i % 5 == 0 || c.delta).map(|(_, c)| c) {
            let (raw, table) = table_of(&case).unwrap();
            // And the first data page's first bytes: its levels, a DELTA page's header and first block.
            let first_data = table.pages.iter().find(|p| p.kind != pages::KIND_DICT).map_or(0, |p| p.src as usize);
            let flips = [0usize, 1, 7, raw.len() / 2, raw.len().saturating_sub(3)];
            for flip in flips.into_iter().chain((0..24).map(|k| first_data + k)) {
                let mut bad = raw.clone();
                if let Some(b) = bad.get_mut(flip) {
                    *b ^= 0xA5;
                }
                let cpu = decode_cpu(&bad, &table);
                if let Some(g) = &g {
                    // As the device scan does: LZ4_RAW / GZIP pages inflated on the host first.
                    let mut t = table.clone();
                    let mut stats = TransferStats::default();
                    let gpu = decode::inflate_on_host(&mut t, &bad, bad.len() as u64, u64::MAX).and_then(|extra| {
                        let d = g.upload_chunks(&[bad.as_slice(), &extra[..]], &mut stats)?;
                        let d = decode_gpu(g, &d, &t, &mut stats)?;
                        decode::download_decoded(g, &d, &mut stats)
                    });
                    // zstd.cu checks a frame's structure, sizes and offsets, not what libzstd
                    // checks beyond them (window limits, checksums): a flip only libzstd sees may
                    // decode on the device.
                    let zstd = table.pages.iter().any(|p| p.codec == pages::CODEC_ZSTD);
                    match (&cpu, &gpu) {
                        (Ok(a), Ok(b)) => assert_eq!(a, b, "{} flip {flip}", case.name),
                        (Err(_), Err(_)) => {}
                        (Err(_), Ok(_)) if zstd => {
                            println!("{} flip {flip}: only the host's libzstd refused it", case.name)
                        }
                        _ => panic!("{} flip {flip}: cpu {:?} gpu {:?}", case.name, cpu.is_ok(), gpu.is_ok()),
                    }
                }
            }
        }
    }

    /// Codecs, types, nested columns and encrypted files the device does not take fall back with a reason.
    #[test]
    fn unsupported_inputs_fall_back_with_reasons() {
        use parquet::basic::Compression;
        use parquet::file::properties::WriterProperties;
        use std::sync::Arc;
        let schema =
            Arc::new(datafusion::arrow::datatypes::Schema::new(vec![datafusion::arrow::datatypes::Field::new(
                "k",
                DataType::Int64,
                false,
            )]));
        let batch = datafusion::arrow::array::RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(datafusion::arrow::array::Int64Array::from(vec![1i64, 2, 3]))],
        )
        .unwrap();
        let path = std::env::temp_dir().join(format!("setfusion-pq-lz4-{}.parquet", std::process::id()));
        let mut buf = Vec::new();
        // LZ4 (Hadoop's framing, deprecated by Parquet; LZ4_RAW is read).
        let props = WriterProperties::builder().set_compression(Compression::LZ4).build();
        let mut w = parquet::arrow::ArrowWriter::try_new(&mut buf, schema, Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        std::fs::write(&path, buf).unwrap();
        let files = [ScanFile { path: path.clone(), ranges: vec![] }];
        let why = pages::plan_scan(&files, "k", &DataType::Int64).unwrap().unwrap_err();
        assert!(why.0.contains("codec LZ4"), "{why}");
        let why = pages::plan_scan(&files, "k", &DataType::Int32).unwrap().unwrap_err();
        assert!(why.0.contains("schema adaptation"), "{why}");
        let why = pages::plan_scan(&files, "k", &DataType::Utf8).unwrap().unwrap_err();
        assert!(why.0.contains("schema adaptation: Utf8 from Parquet INT64"), "{why}");
        let why = pages::plan_scan(&files, "k", &DataType::Float64).unwrap().unwrap_err();
        assert!(why.0.contains("type Float64"), "{why}");
        let why = pages::plan_scan(&files, "nope", &DataType::Int64).unwrap().unwrap_err();
        assert!(why.0.contains("nested or missing"), "{why}");
        // An encrypted footer (its magic `PARE`): left to DataFusion's scan, the reason named.
        let mut bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 4..].copy_from_slice(b"PARE");
        std::fs::write(&path, &bytes).unwrap();
        let why = pages::plan_scan(&files, "k", &DataType::Int64).unwrap().unwrap_err();
        assert!(why.0.contains("encrypted file"), "{why}");
        let _ = std::fs::remove_file(&path);
        // Strings in DELTA_BYTE_ARRAY pages (each value a suffix of the one
        // before: a sequential walk per page): planned, refused at the page.
        let schema =
            Arc::new(datafusion::arrow::datatypes::Schema::new(vec![datafusion::arrow::datatypes::Field::new(
                "s",
                DataType::Utf8,
                false,
            )]));
        let strings = datafusion::arrow::array::StringArray::from(vec!["apple", "apricot", "banana"]);
        let batch = datafusion::arrow::array::RecordBatch::try_new(schema.clone(), vec![Arc::new(strings)]).unwrap();
        let props = WriterProperties::builder()
            .set_dictionary_enabled(false)
            .set_encoding(parquet::basic::Encoding::DELTA_BYTE_ARRAY)
            .build();
        let mut buf = Vec::new();
        let mut w = parquet::arrow::ArrowWriter::try_new(&mut buf, schema, Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        std::fs::write(&path, buf).unwrap();
        let plan = pages::plan_scan(&files, "s", &DataType::Utf8).unwrap().unwrap();
        let raw = pages::read_chunks(&plan).unwrap();
        let why = pages::page_table(&plan, &raw).unwrap().unwrap_err();
        assert!(why.0.contains("encoding DELTA_BYTE_ARRAY"), "{why}");
        let _ = std::fs::remove_file(&path);
    }

    /// A selection's mask sets exactly the selected rows of the row groups
    /// read (ranges at and off word boundaries, whole row groups, row groups
    /// left out, empty ranges), as a bit-by-bit reference does.
    #[test]
    fn row_selection_masks_are_the_selected_rows() {
        let groups = vec![
            vec![(100, Some(vec![(0, 5), (31, 33), (40, 100)])), (70, None), (64, Some(vec![(32, 64)]))],
            vec![(1000, Some(vec![(3, 3), (7, 993)])), (33, Some(vec![]))],
        ];
        let rows = pages::RowSelections(groups.clone());
        for keep in [None, Some(vec![vec![true, false, true], vec![true, true]])] {
            let mut want: Vec<bool> = Vec::new();
            for (f, file) in groups.iter().enumerate() {
                for (g, (n, ranges)) in file.iter().enumerate() {
                    if keep.as_ref().is_some_and(|k: &Vec<Vec<bool>>| !k[f][g]) {
                        continue;
                    }
                    want.extend(
                        (0..*n).map(|r| ranges.as_ref().is_none_or(|rs| rs.iter().any(|&(a, b)| a <= r && r < b))),
                    );
                }
            }
            let got = rows.mask(keep.as_ref());
            assert_eq!(got.len(), want.len().div_ceil(32), "{keep:?}");
            for (r, w) in want.iter().enumerate() {
                assert_eq!(got[r / 32] >> (r % 32) & 1 == 1, *w, "row {r} {keep:?}");
            }
        }
    }

    /// Within a row group, the page index leaves out the pages whose
    /// statistics rule the filter out, as DataFusion's scan does: on a column
    /// sorted across 2 row groups of 5000 rows and pages of 100 rows (v1 and
    /// v2 pages, dictionary and PLAIN), `k BETWEEN 1234 AND 1456` reads row
    /// group 0 only, and in it rows 1200..1500 (3 pages of each column, the
    /// dictionary page too); every column's decoded rows there equal
    /// arrow-rs's, the rows left out read as 0 / NULL, the selection's mask
    /// is those rows, and fewer bytes are read. Without the page index
    /// (DataFusion's `enable_page_index = false`) only row groups are pruned.
    #[test]
    fn the_page_index_prunes_pages_within_row_groups() {
        use datafusion::arrow::array::{Int64Array, RecordBatch};
        use datafusion::arrow::datatypes::{Field, Int64Type, Schema};
        use datafusion::logical_expr::Operator;
        use datafusion::physical_expr::expressions::{lit, BinaryExpr, Column};
        use datafusion::physical_expr::PhysicalExprRef;
        use parquet::file::properties::{WriterProperties, WriterVersion};
        use std::sync::Arc;
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("p", DataType::Int64, true),
        ]));
        let dir = std::env::temp_dir().join(format!("setfusion-pq-pageindex-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut files = Vec::new();
        for f in 0..2 {
            let k: Vec<i64> = (0..10_000).collect();
            let p: Vec<Option<i64>> = (0..10_000).map(|i: i64| (i % 7 != 0).then_some(i % 50)).collect();
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(Int64Array::from(k)), Arc::new(Int64Array::from(p))],
            )
            .unwrap();
            let props = WriterProperties::builder()
                .set_max_row_group_row_count(Some(5000))
                .set_data_page_row_count_limit(100)
                .set_write_batch_size(100)
                .set_dictionary_enabled(f == 0)
                .set_writer_version(if f == 1 { WriterVersion::PARQUET_2_0 } else { WriterVersion::PARQUET_1_0 })
                .build();
            let path = dir.join(format!("part-{f}.parquet"));
            fixtures::write_file(&path, &batch, props).unwrap();
            files.push(ScanFile { path, ranges: vec![] });
        }
        let cmp = |op: Operator, v: i64| -> PhysicalExprRef {
            Arc::new(BinaryExpr::new(Arc::new(Column::new("k", 0)), op, lit(v)))
        };
        let between: PhysicalExprRef =
            Arc::new(BinaryExpr::new(cmp(Operator::GtEq, 1234), Operator::And, cmp(Operator::LtEq, 1456)));
        let pruned = pages::prune_row_groups(&files, &schema, &between, false, true).unwrap().unwrap();
        assert_eq!(*pruned.row_groups, vec![vec![true, false], vec![true, false]]);
        let rows = pruned.rows.clone().expect("pages pruned");
        for f in 0..2 {
            assert_eq!(rows.0[f][0], (5000, Some(vec![(1200, 1500)])), "file {f}");
        }
        assert_eq!(pruned.rows_pruned_by_page_index, 2 * 4700);
        let keep = Keep { key_range: None, row_groups: Some(pruned.row_groups.clone()), rows: Some(rows.clone()) };
        // The mask: rows 1200..1500 of each file's first row group (5000 rows a file).
        let mask = rows.mask(keep.row_groups.as_deref());
        assert_eq!(mask.len(), 10_000usize.div_ceil(32));
        for r in 0..10_000usize {
            let want = (1200..1500).contains(&(r % 5000));
            assert_eq!(mask[r / 32] >> (r % 32) & 1 == 1, want, "row {r}");
        }
        let whole = Keep { key_range: None, row_groups: Some(pruned.row_groups.clone()), rows: None };
        for column in ["k", "p"] {
            let plan = pages::plan_scan_within(&files, column, &DataType::Int64, &keep).unwrap().unwrap();
            let all = pages::plan_scan_within(&files, column, &DataType::Int64, &whole).unwrap().unwrap();
            assert_eq!((plan.rows, plan.pages_pruned, all.pages_pruned), (10_000, 2 * 47, 0), "{column}");
            assert!(plan.bytes < all.bytes, "{column}: {} bytes read of {}", plan.bytes, all.bytes);
            let got = scan_to_host_within(&files, column, &DataType::Int64, &keep).unwrap().unwrap();
            let full = scan_to_host_within(&files, column, &DataType::Int64, &whole).unwrap().unwrap();
            for r in 0..10_000usize {
                let valid = |d: &Decoded| d.valid.as_ref().is_none_or(|v| v[r / 32] >> (r % 32) & 1 == 1);
                if mask[r / 32] >> (r % 32) & 1 == 1 {
                    assert_eq!((got.keys[r], valid(&got)), (full.keys[r], valid(&full)), "{column} row {r}");
                } else {
                    assert_eq!(got.keys[r], 0, "{column} row {r}");
                    assert!(got.valid.is_none() || !valid(&got), "{column} row {r}");
                }
            }
            // The decoded rows are arrow-rs's (the row group read: the first 5000 of each file).
            let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
                std::fs::File::open(&files[0].path).unwrap(),
            )
            .unwrap()
            .build()
            .unwrap();
            let ci = if column == "k" { 0 } else { 1 };
            let first: Vec<Option<i64>> = reader
                .flat_map(|b| {
                    let b = b.unwrap();
                    let a = b.column(ci).as_primitive::<Int64Type>().clone();
                    (0..a.len()).map(move |i| a.is_valid(i).then(|| a.value(i))).collect::<Vec<_>>()
                })
                .take(5000)
                .collect();
            for r in 1200..1500 {
                let v = got.valid.as_ref().is_none_or(|v| v[r / 32] >> (r % 32) & 1 == 1);
                assert_eq!(v.then_some(got.keys[r] as i64), first[r], "{column} row {r}");
            }
        }
        // Late materialization: of the 10,000 rows `whole` leaves (5000 a
        // file), blocks of 4096 with block 1 kept (rows 4096..8192) read rows
        // 4096..5000 of file 0 and 0..3192 of file 1, so 40 + 18 pages are
        // not read and those rows decode as arrow-rs's; within the page
        // index's selection (`keep`) file 0 keeps no row (one page is read)
        // and file 1 rows 1200..1500. Every block kept: nothing narrowed.
        let blocks = [false, true, false];
        let late = whole.narrowed_to_blocks(&files, 4096, &blocks).unwrap().expect("narrowed");
        let late_rows = late.rows.clone().unwrap();
        assert_eq!(
            (&late_rows.0[0][0], &late_rows.0[1][0]),
            (&(5000, Some(vec![(4096, 5000)])), &(5000, Some(vec![(0, 3192)])))
        );
        assert_eq!(late.row_groups, whole.row_groups);
        let within = keep.narrowed_to_blocks(&files, 4096, &blocks).unwrap().expect("narrowed");
        let within_rows = within.rows.unwrap();
        assert_eq!(
            (&within_rows.0[0][0], &within_rows.0[1][0]),
            (&(5000, Some(vec![(0, 1)])), &(5000, Some(vec![(1200, 1500)])))
        );
        assert!(whole.narrowed_to_blocks(&files, 4096, &[true; 3]).unwrap().is_none());
        for column in ["k", "p"] {
            let plan = pages::plan_scan_within(&files, column, &DataType::Int64, &late).unwrap().unwrap();
            assert_eq!((plan.rows, plan.pages_pruned), (10_000, 40 + 18), "{column}");
            let got = scan_to_host_within(&files, column, &DataType::Int64, &late).unwrap().unwrap();
            let full = scan_to_host_within(&files, column, &DataType::Int64, &whole).unwrap().unwrap();
            for r in 4096..8192usize {
                let valid = |d: &Decoded| d.valid.as_ref().is_none_or(|v| v[r / 32] >> (r % 32) & 1 == 1);
                assert_eq!((got.keys[r], valid(&got)), (full.keys[r], valid(&full)), "{column} row {r}");
            }
        }
        // enable_page_index = false: the row groups alone.
        let no_pages = pages::prune_row_groups(&files, &schema, &between, false, false).unwrap().unwrap();
        assert!(no_pages.rows.is_none() && no_pages.rows_pruned_by_page_index == 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The pages the host inflates before a selection: a gzip file's columns
    /// count their decompressed sizes (the named ones only), snappy and
    /// uncompressed files nothing, a missing file nothing; a zstd file's
    /// count as the device's (by default).
    #[test]
    fn inflated_bytes_count_slow_codecs_only() {
        use datafusion::arrow::array::{Int64Array, RecordBatch};
        use datafusion::arrow::datatypes::{Field, Schema};
        use parquet::basic::Compression;
        use parquet::file::properties::WriterProperties;
        use std::sync::Arc;
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("p", DataType::Int64, false),
        ]));
        let dir = std::env::temp_dir().join(format!("setfusion-pq-inflated-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, codec: Compression| {
            let k: Vec<i64> = (0..50_000).map(|i| i * 7919 % 100_003).collect();
            let p: Vec<i64> = (0..50_000).collect();
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(Int64Array::from(k)), Arc::new(Int64Array::from(p))],
            )
            .unwrap();
            let props = WriterProperties::builder().set_compression(codec).set_dictionary_enabled(false).build();
            let path = dir.join(name);
            fixtures::write_file(&path, &batch, props).unwrap();
            ScanFile { path, ranges: vec![] }
        };
        let gzip = write("z.parquet", Compression::GZIP(Default::default()));
        let snappy = write("s.parquet", Compression::SNAPPY);
        let plain = write("u.parquet", Compression::UNCOMPRESSED);
        let one = pages::inflated_bytes(std::slice::from_ref(&gzip), &["k"]).host;
        let both = pages::inflated_bytes(std::slice::from_ref(&gzip), &["k", "p", "not_there"]).host;
        assert!(one >= 400_000 && both >= 2 * 400_000 && both > one, "{one} {both}");
        assert_eq!(pages::inflated_bytes(&[snappy.clone(), plain], &["k", "p"]), Default::default());
        // ZSTD pages: the device's unless SETFUSION_DEVICE_ZSTD=0.
        let zstd = write("d.parquet", Compression::ZSTD(Default::default()));
        let z = pages::inflated_bytes(&[zstd, snappy], &["k"]);
        let (device, host) = if crate::env::device_zstd() { (z.device_zstd, z.host) } else { (z.host, z.device_zstd) };
        assert!(device >= 400_000 && host == 0, "{z:?}");
        let missing = ScanFile { path: dir.join("missing.parquet"), ranges: vec![] };
        assert_eq!(pages::inflated_bytes(&[missing, gzip], &["k"]).host, one);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A filter's row groups are chosen by their statistics and bloom filters
    /// as DataFusion prunes them: on a column sorted across 10 row groups
    /// `k < 2500` reads 3 (in both files); a predicate no statistics decide, or
    /// one that keeps every row group, prunes nothing; `q = 1000`, within every
    /// row group's min / max but only in the even ones, is pruned by the bloom
    /// filters (when they are read); and the scan plan reads only the rows of
    /// the row groups left, for every column.
    #[test]
    fn filters_prune_row_groups_by_their_statistics_and_bloom_filters() {
        use datafusion::arrow::array::{Int64Array, RecordBatch};
        use datafusion::arrow::datatypes::{Field, Schema};
        use datafusion::logical_expr::Operator;
        use datafusion::physical_expr::expressions::{lit, BinaryExpr, Column};
        use datafusion::physical_expr::PhysicalExprRef;
        use parquet::file::properties::WriterProperties;
        use std::sync::Arc;
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("p", DataType::Int64, true),
            Field::new("q", DataType::Int64, false),
        ]));
        let dir = std::env::temp_dir().join(format!("setfusion-pq-prune-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut files = Vec::new();
        for f in 0..2 {
            let k: Vec<i64> = (0..10_000).collect();
            let p: Vec<Option<i64>> = (0..10_000).map(|i: i64| (i % 7 != 0).then_some((i * 7919) % 1000)).collect();
            // Even row groups hold even values of 0..1998, odd ones odd values of 1..1999.
            let q: Vec<i64> = (0..10_000).map(|i: i64| 2 * (i % 1000) + (i / 1000) % 2).collect();
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(Int64Array::from(k)), Arc::new(Int64Array::from(p)), Arc::new(Int64Array::from(q))],
            )
            .unwrap();
            let props = WriterProperties::builder()
                .set_max_row_group_row_count(Some(1000))
                .set_column_bloom_filter_enabled("q".into(), true)
                .build();
            let path = dir.join(format!("part-{f}.parquet"));
            fixtures::write_file(&path, &batch, props).unwrap();
            files.push(ScanFile { path, ranges: vec![] });
        }
        let cmp = |c: &str, i: usize, op: Operator, v: i64| -> PhysicalExprRef {
            Arc::new(BinaryExpr::new(Arc::new(Column::new(c, i)), op, lit(v)))
        };
        let kept =
            pages::prune_row_groups(&files, &schema, &cmp("k", 0, Operator::Lt, 2500), true, true).unwrap().unwrap();
        let three: Vec<bool> = (0..10).map(|g| g < 3).collect();
        assert_eq!(*kept.row_groups, vec![three.clone(), three]);
        assert_eq!((kept.by_statistics, kept.by_bloom_filters), (14, 0));
        // p's values are spread over every row group: nothing to prune.
        assert!(pages::prune_row_groups(&files, &schema, &cmp("p", 1, Operator::Gt, 500), true, true)
            .unwrap()
            .is_none());
        assert!(pages::prune_row_groups(&files, &schema, &cmp("k", 0, Operator::GtEq, 0), true, true)
            .unwrap()
            .is_none());
        // q = 1000: no statistics rule a row group out, the bloom filters rule out the odd ones.
        let q = cmp("q", 2, Operator::Eq, 1000);
        let by_bloom = pages::prune_row_groups(&files, &schema, &q, true, true).unwrap().unwrap();
        let even: Vec<bool> = (0..10).map(|g| g % 2 == 0).collect();
        assert_eq!(*by_bloom.row_groups, vec![even.clone(), even]);
        assert_eq!((by_bloom.by_statistics, by_bloom.by_bloom_filters), (0, 10));
        assert!(pages::prune_row_groups(&files, &schema, &q, false, true).unwrap().is_none());
        // One page a row group: the page index prunes nothing more.
        assert!(kept.rows.is_none() && by_bloom.rows.is_none());
        let keep = Keep { key_range: None, row_groups: Some(kept.row_groups), rows: None };
        for (column, def_max) in [("k", 0), ("p", 1)] {
            let plan = pages::plan_scan_within(&files, column, &DataType::Int64, &keep).unwrap().unwrap();
            assert_eq!((plan.rows, plan.row_groups, plan.row_groups_pruned, plan.def_max), (6000, 20, 14, def_max));
        }
        // A key range on k prunes every column by k's statistics (p's and q's
        // own would rule out nothing), so payload columns stay aligned with the keys.
        let by_key = Keep::key_range("k", Some((3500, 5200)));
        for column in ["k", "p", "q"] {
            let plan = pages::plan_scan_within(&files, column, &DataType::Int64, &by_key).unwrap().unwrap();
            assert_eq!((plan.rows, plan.row_groups_pruned), (6000, 14), "{column}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A float column's min / max leave its NaNs out: a conjunct the
    /// statistics cannot decide prunes nothing, alone or beside one that
    /// does (whose pruning stays); closed ranges and equalities still prune.
    #[test]
    fn float_conjuncts_prune_nothing() {
        use datafusion::arrow::array::{Float64Array, Int64Array, RecordBatch};
        use datafusion::arrow::datatypes::{Field, Schema};
        use datafusion::logical_expr::Operator;
        use datafusion::physical_expr::expressions::{lit, BinaryExpr, Column};
        use datafusion::physical_expr::PhysicalExprRef;
        use parquet::file::properties::WriterProperties;
        use std::sync::Arc;
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("f", DataType::Float64, false),
        ]));
        let dir = std::env::temp_dir().join(format!("setfusion-pq-nan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Row groups of 100 rows: f is 0.25 but for one NaN in each.
        let k: Vec<i64> = (0..1000).collect();
        let f: Vec<f64> = (0..1000).map(|i| if i % 100 == 7 { f64::NAN } else { 0.25 }).collect();
        let batch =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(k)), Arc::new(Float64Array::from(f))])
                .unwrap();
        let props = WriterProperties::builder().set_max_row_group_row_count(Some(100)).build();
        let path = dir.join("nan.parquet");
        fixtures::write_file(&path, &batch, props).unwrap();
        let files = vec![ScanFile { path, ranges: vec![] }];
        let cmp = |c: &str, i: usize, op: Operator, v: PhysicalExprRef| -> PhysicalExprRef {
            Arc::new(BinaryExpr::new(Arc::new(Column::new(c, i)), op, v))
        };
        let f_above = cmp("f", 1, Operator::Gt, lit(1.0f64));
        assert!(pages::reads_float_column(&f_above, &schema));
        assert!(pages::prune_row_groups(&files, &schema, &f_above, true, true).unwrap().is_none());
        let nan = cmp("f", 1, Operator::Eq, lit(f64::NAN));
        assert!(pages::prune_row_groups(&files, &schema, &nan, true, true).unwrap().is_none());
        let k_below = cmp("k", 0, Operator::Lt, lit(250i64));
        assert!(!pages::reads_float_column(&k_below, &schema));
        let both: PhysicalExprRef = Arc::new(BinaryExpr::new(f_above.clone(), Operator::And, k_below.clone()));
        let kept = pages::prune_row_groups(&files, &schema, &both, true, true).unwrap().unwrap();
        assert_eq!(*kept.row_groups, vec![(0..10).map(|g| g < 3).collect::<Vec<bool>>()]);
        // A range closed on both sides holds no NaN: it prunes every row group (their
        // numbers are 0.25), as does an equality with a number other than zero.
        let f_below = cmp("f", 1, Operator::LtEq, lit(2.0f64));
        let range: PhysicalExprRef = Arc::new(BinaryExpr::new(f_above.clone(), Operator::And, f_below.clone()));
        let none = pages::prune_row_groups(&files, &schema, &range, true, true).unwrap().unwrap();
        assert_eq!(*none.row_groups, vec![vec![false; 10]]);
        let half = cmp("f", 1, Operator::Eq, lit(0.5f64));
        assert_eq!(
            *pages::prune_row_groups(&files, &schema, &half, true, true).unwrap().unwrap().row_groups,
            vec![vec![false; 10]]
        );
        // Which conjuncts the statistics cannot decide.
        let zero = cmp("f", 1, Operator::Eq, lit(0.0f64));
        let up_to_nan = cmp("f", 1, Operator::Lt, lit(f64::NAN));
        let cases: [(Vec<PhysicalExprRef>, Vec<bool>); 5] = [
            (vec![f_above.clone(), k_below.clone()], vec![true, false]),
            (vec![f_above.clone(), f_below.clone()], vec![false, false]),
            (vec![half, zero, nan], vec![false, true, true]),
            (vec![f_above, up_to_nan], vec![true, true]),
            (vec![f_below], vec![true]),
        ];
        for (conjuncts, want) in cases {
            assert_eq!(pages::undecidable_by_statistics(&conjuncts, &schema), want, "{conjuncts:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
