//! Row hashing and exact verification of hashed keys on the device
//! (kernels/row_hash.cu).
//!
//! Keys that are not one fixed-width column (strings, binary, composite keys,
//! wide decimals) are byte strings ([`KeyBytes`]). On the GPU backend their
//! bytes go to the device, each row is hashed there to the same 64-bit
//! value as [`keys::hash_bytes`] (the CPU twin), and the hashes stay on the
//! device for the hash-table selection ([`select::ResidentSelect`]).
//!
//! The bytes travel as Arrow holds them where it can: a string / binary
//! column's value buffers go as whole pieces (offset arrays with their
//! offsets rebased; view arrays as their views plus their distinct buffers,
//! read by the kernels through a batch table), so the host copies large
//! pieces into pinned staging and touches no row. Row-format keys, and
//! subsets of offset arrays, are gathered row by row. Before
//! the selection runs, the device proves that equal hashes mean equal bytes
//! over both sides: every row is compared with its hash's representative row
//! (the smallest row index with that hash). A collision is reported as
//! `Ok(None)` and the caller recomputes exactly on the host, so no collision
//! can change a result.
//!
//! Composite keys of exact and string / binary columns ([`KeyBytes::Columns`])
//! travel column by column: exact columns as their 64-bit images (a fixed
//! layout, no offsets), string columns in the layouts above, plus the rows'
//! NULL masks where a row has a NULL column. The device folds each column's
//! hashes into one hash per row (`keys::hash_columns`), and verification
//! compares every column and the masks with the hash's representative row.
//!
//! CPU twins: [`hash_rows_cpu`], [`verify_cpu`], [`hash_columns_cpu`], [`verify_columns_cpu`],
//! [`match_literals_cpu`] and [`match_like_cpu`].

use std::collections::HashMap;
use std::time::Instant;

use cudarc::driver::{LaunchConfig, PushKernelArg};
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BinaryViewArray};
use datafusion::arrow::buffer::{BooleanBuffer, ScalarBuffer};
use datafusion::arrow::datatypes::DataType;
use datafusion::error::{DataFusionError, Result};

use crate::algo::select::{self, GpuStrategy, ResidentSelect, SetOp};
use crate::gpu::{cuda_err, DeviceBuffer, Gpu, TransferStats};
use crate::keys::{self, ByteColumn, ByteParts, ColumnKeys, KeyBytes, KeyPart, RowSubset};

/// kernels/row_hash.cu, with its contract constants as `-D` options.
pub static KERNEL: crate::gpu::KernelSource = crate::gpu::KernelSource {
    family: "row_hash",
    source: include_str!("../../kernels/row_hash.cu"),
    defines: row_hash_defines,
};

fn row_hash_defines() -> Vec<(String, u64)> {
    vec![("RH_EMPTY".into(), EMPTY_KEY), ("RH_NO_ROW".into(), NO_ROW as u64)]
}

/// The verification table's empty key and "no representative yet" markers (as in the kernel).
const EMPTY_KEY: u64 = u64::MAX;
const NO_ROW: u32 = u32::MAX;

/// CPU twin of the device hashing: one [`keys::hash_bytes`] per row, row `i`
/// being `data[offsets[i]..offsets[i + 1]]`. Offsets must be non-decreasing
/// and within `data` (slice indexing panics otherwise; test and check input only).
pub fn hash_rows_cpu(offsets: &[usize], data: &[u8]) -> Vec<u64> {
    offsets.windows(2).map(|w| keys::hash_bytes(&data[w[0]..w[1]])).collect()
}

/// CPU twin of the device verification over rows given as one offsets/data
/// pair (both sides concatenated) and their hashes: `true` when equal hashes
/// always mean equal bytes (collision-free), `false` on a collision.
pub fn verify_cpu(hashes: &[u64], offsets: &[usize], data: &[u8]) -> bool {
    let row = |i: usize| &data[offsets[i]..offsets[i + 1]];
    // The representative of a hash is its smallest row index, as on the device.
    let mut rep: HashMap<u64, usize> = HashMap::with_capacity(hashes.len());
    hashes.iter().enumerate().all(|(i, &h)| row(*rep.entry(h).or_insert(i)) == row(i))
}

/// Row offsets on the device: 32-bit while a side's bytes allow (half the
/// transfer), 64-bit beyond 4 GiB. Both sides use the same width.
enum DeviceOffsets {
    U32(DeviceBuffer<u32>),
    U64(DeviceBuffer<u64>),
}

/// One side's rows on the device, in a layout of kernels/row_hash.cu. Byte
/// buffers are padded to a multiple of 8 plus one zeroed word (the kernels
/// read aligned 64-bit words, including the word after the last byte).
enum DeviceRows {
    /// `n + 1` offsets and the bytes.
    Offsets { n: usize, offsets: DeviceOffsets, data: DeviceBuffer<u8> },
    /// One 64-bit word per row (an exact column's images, or the NULL masks), then a zeroed word.
    Fixed { n: usize, vals: DeviceBuffer<u64> },
    /// Arrow views (two words per row, then two zeroed words), the batch table and the value buffers.
    Views {
        n: usize,
        views: DeviceBuffer<u64>,
        batch_rows: DeviceBuffer<u32>,
        nbatches: u32,
        batch_bufs: DeviceBuffer<u32>,
        buf_pos: DeviceBuffer<u64>,
        data: DeviceBuffer<u8>,
    },
}

impl DeviceRows {
    fn len(&self) -> usize {
        match self {
            DeviceRows::Offsets { n, .. } | DeviceRows::Fixed { n, .. } | DeviceRows::Views { n, .. } => *n,
        }
    }
}

/// One side's rows on the host, as they will travel.
enum HostRows<'a> {
    /// Row by row (row-format keys, subsets of offset arrays).
    Slices(Vec<&'a [u8]>),
    /// Whole Utf8 / Binary (or large) arrays: each array's value bytes as one piece.
    Arrays(Vec<ByteParts<'a>>),
    /// Utf8View / BinaryView arrays.
    Views(HostViews<'a>),
    /// One 64-bit word per row, in pieces (an exact key column's images per
    /// batch, or gathered for a subset); no pieces: `n` zero words.
    Fixed { n: usize, pieces: Vec<std::borrow::Cow<'a, [u64]>> },
}

/// View arrays ready to upload: the views (whole arrays' views as pieces, or
/// those of a subset gathered), batch by batch, and the distinct buffers.
struct HostViews<'a> {
    n: usize,
    views: Vec<std::borrow::Cow<'a, [u64]>>,
    /// First row of each batch (in the side's row numbering), then `n`.
    batch_rows: Vec<u32>,
    /// Each batch's first entry in `buf_pos`.
    batch_bufs: Vec<u32>,
    /// Byte position of each batch's buffer k in the concatenated data.
    buf_pos: Vec<u64>,
    /// The distinct buffers, in data order.
    buffers: Vec<&'a [u8]>,
    data_len: usize,
}

impl HostRows<'_> {
    fn len(&self) -> usize {
        match self {
            HostRows::Slices(r) => r.len(),
            HostRows::Arrays(a) => a.iter().map(|p| p.len()).sum(),
            HostRows::Views(v) => v.n,
            HostRows::Fixed { n, .. } => *n,
        }
    }
    /// Bytes of row data on the device (before padding).
    fn data_len(&self) -> usize {
        match self {
            HostRows::Slices(r) => r.iter().map(|r| r.len()).sum(),
            HostRows::Arrays(a) => a.iter().map(array_data).map(|d| d.len()).sum(),
            HostRows::Views(v) => v.data_len,
            HostRows::Fixed { n, .. } => 8 * n,
        }
    }
    /// Device bytes of these rows and their hashes.
    fn device_bytes(&self, wide: bool) -> usize {
        let n = self.len();
        match self {
            HostRows::Views(v) => {
                (2 * n + 2) * 8 + v.batch_rows.len() * 8 + v.buf_pos.len() * 8 + padded_len(v.data_len) + n * 8
            }
            HostRows::Fixed { .. } => (n + 1) * 8 + n * 8,
            _ => (n + 1) * if wide { 8 } else { 4 } + padded_len(self.data_len()) + n * 8,
        }
    }
}

/// The value bytes an offset array's rows span.
fn array_data<'a>(p: &ByteParts<'a>) -> &'a [u8] {
    match *p {
        ByteParts::Offsets32(o, d) => &d[o[0] as usize..o[o.len() - 1] as usize],
        ByteParts::Offsets64(o, d) => &d[o[0] as usize..o[o.len() - 1] as usize],
        ByteParts::Views(..) => &[],
    }
}

/// A view array's views as 64-bit words (two per row).
fn view_words(a: &ArrayRef) -> Option<&[u64]> {
    match a.data_type() {
        DataType::Utf8View => Some(a.as_string_view().views().inner().typed_data::<u64>()),
        DataType::BinaryView => Some(a.as_binary_view().views().inner().typed_data::<u64>()),
        _ => None,
    }
}

/// A string column's rows (all, or the ascending subset `idx`) as views with
/// their distinct buffers, uploaded whole (key encoding compacted bloated
/// ones: [`ByteColumn::compact_bloated_views`]).
fn host_views<'a>(col: &'a ByteColumn, idx: Option<&'a [u32]>) -> Option<HostViews<'a>> {
    let arrays = col.arrays();
    let mut words: Vec<&'a [u64]> = Vec::with_capacity(arrays.len());
    for a in arrays {
        words.push(view_words(a)?);
    }
    if idx.is_some_and(|ix| ix.windows(2).any(|w| w[0] >= w[1])) {
        return None; // the batch table needs each batch's rows together
    }
    let n = idx.map_or(col.len(), |ix| ix.len());
    if n >= u32::MAX as usize {
        return None;
    }
    // Rows per batch in the side's numbering, and the views.
    let (views, per_batch): (Vec<std::borrow::Cow<'a, [u64]>>, Vec<usize>) = match idx {
        None => {
            (words.iter().map(|w| std::borrow::Cow::Borrowed(*w)).collect(), arrays.iter().map(|a| a.len()).collect())
        }
        Some(ix) => {
            let starts = col.starts();
            let mut per = vec![0usize; arrays.len()];
            let mut gathered = Vec::with_capacity(2 * ix.len());
            for &i in ix {
                let b = starts.partition_point(|&s| s <= i as usize) - 1;
                let j = i as usize - starts[b];
                gathered.extend_from_slice(&words[b][2 * j..2 * j + 2]);
                per[b] += 1;
            }
            (vec![std::borrow::Cow::Owned(gathered)], per)
        }
    };
    let mut batch_rows = vec![0u32];
    let mut batch_bufs = Vec::new();
    let mut buf_pos = Vec::new();
    let mut buffers: Vec<&'a [u8]> = Vec::new();
    let mut seen: HashMap<(usize, usize), u64> = HashMap::new();
    let mut data_len = 0usize;
    for (a, rows) in arrays.iter().zip(per_batch) {
        if rows == 0 {
            continue; // empty batches would break the kernels' batch search
        }
        batch_rows.push(batch_rows[batch_rows.len() - 1] + rows as u32);
        batch_bufs.push(buf_pos.len() as u32);
        let ByteParts::Views(_, bufs) = ByteParts::of(a.as_ref()).ok()? else { return None };
        for buf in bufs {
            let bytes = buf.as_slice();
            let pos = *seen.entry((bytes.as_ptr() as usize, bytes.len())).or_insert_with(|| {
                buffers.push(bytes);
                data_len += bytes.len();
                (data_len - bytes.len()) as u64
            });
            buf_pos.push(pos);
        }
    }
    Some(HostViews { n, views, batch_rows, batch_bufs, buf_pos, buffers, data_len })
}

/// How both sides travel: views when both are view arrays worth it, whole
/// offset arrays when both are offset arrays read in full, else row by row.
/// Both sides take one layout (one verification kernel reads them).
fn host_rows<'a>(build: RowSubset<'a>, probe: RowSubset<'a>) -> (HostRows<'a>, HostRows<'a>) {
    if let (KeyBytes::Values(bc), KeyBytes::Values(pc)) = (build.bytes(), probe.bytes()) {
        if let (Some(b), Some(p)) = (host_views(bc, build.idx()), host_views(pc, probe.idx())) {
            return (HostRows::Views(b), HostRows::Views(p));
        }
        let whole = |c: &'a ByteColumn, idx: Option<&[u32]>| -> Option<Vec<ByteParts<'a>>> {
            if idx.is_some() {
                return None;
            }
            c.arrays()
                .iter()
                .map(|a| ByteParts::of(a.as_ref()).ok().filter(|p| !matches!(p, ByteParts::Views(..))))
                .collect()
        };
        if let (Some(b), Some(p)) = (whole(bc, build.idx()), whole(pc, probe.idx())) {
            return (HostRows::Arrays(b), HostRows::Arrays(p));
        }
    }
    (HostRows::Slices(build.iter().collect()), HostRows::Slices(probe.iter().collect()))
}

fn padded_len(bytes: usize) -> usize {
    bytes.div_ceil(8) * 8 + 8
}

/// Power-of-two capacity of the verification table: at least twice the rows,
/// so linear probing always finds an empty slot.
fn verify_capacity(rows: usize) -> usize {
    (rows * 2).next_power_of_two().max(1024)
}

fn launch_cfg(gpu: &Gpu, n: usize) -> LaunchConfig {
    gpu.grid_stride(n, 32)
}

/// Device bytes that hashing, verifying and selecting these rows need at the
/// peak (rows + hashes + verification table, then hashes + the select's table).
fn device_bytes(op: SetOp, build: &HostRows<'_>, probe: &HostRows<'_>, wide: bool) -> usize {
    let (nb, np) = (build.len(), probe.len());
    let verify = build.device_bytes(wide) + probe.device_bytes(wide) + (verify_capacity(nb + np) + 1) * 12 + 4;
    verify.max(select::device_bytes(GpuStrategy::Hash, op, nb, np, 0))
}

/// Upload one side in its layout.
fn upload_side(gpu: &Gpu, rows: &HostRows<'_>, wide: bool, stats: &mut TransferStats) -> Result<DeviceRows> {
    match rows {
        HostRows::Slices(r) => upload_rows(gpu, r, wide, stats),
        HostRows::Arrays(arrays) => upload_arrays(gpu, arrays, wide, stats),
        HostRows::Views(v) => upload_views(gpu, v, stats),
        HostRows::Fixed { n, pieces } => {
            // One zeroed word past the rows, as the other layouts' padding.
            let mut vals = gpu.alloc_zeros::<u64>(n + 1)?;
            if !pieces.is_empty() {
                gpu.upload_chunks_into(&pieces.iter().map(|p| p.as_ref()).collect::<Vec<_>>(), &mut vals, 0, stats)?;
            }
            Ok(DeviceRows::Fixed { n: *n, vals })
        }
    }
}

/// Whole offset arrays: their value bytes as pieces, their offsets rebased
/// onto the concatenation (array by array on the copy threads).
fn upload_arrays(gpu: &Gpu, arrays: &[ByteParts<'_>], wide: bool, stats: &mut TransferStats) -> Result<DeviceRows> {
    let pieces: Vec<&[u8]> = arrays.iter().map(array_data).collect();
    let mut bases = Vec::with_capacity(arrays.len());
    let mut total = 0u64;
    for p in &pieces {
        bases.push(total);
        total += p.len() as u64;
    }
    let n = arrays.iter().map(|p| p.len()).sum();
    // Each array's offsets but its last, shifted to where its bytes land.
    fn rebased<T: TryFrom<u64>>(p: &ByteParts<'_>, base: u64) -> Vec<T> {
        let conv = |o: u64| T::try_from(o).ok().expect("offsets checked to fit");
        match *p {
            ByteParts::Offsets32(o, _) => o[..o.len() - 1].iter().map(|&x| conv(base + (x - o[0]) as u64)).collect(),
            ByteParts::Offsets64(o, _) => o[..o.len() - 1].iter().map(|&x| conv(base + (x - o[0]) as u64)).collect(),
            ByteParts::Views(..) => Vec::new(),
        }
    }
    let items: Vec<(&ByteParts<'_>, u64)> = arrays.iter().zip(bases).collect();
    let offsets = if wide {
        let mut parts = crate::host::par_map(&items, 16, |(p, b)| Ok::<_, DataFusionError>(rebased::<u64>(p, *b)))?;
        parts.push(vec![total]);
        DeviceOffsets::U64(gpu.upload_chunks(&parts.iter().map(|v| v.as_slice()).collect::<Vec<_>>(), stats)?)
    } else {
        if total > u32::MAX as u64 {
            return Err(DataFusionError::Internal("row_hash: 32-bit offsets for more than 4 GiB of rows".into()));
        }
        let mut parts = crate::host::par_map(&items, 16, |(p, b)| Ok::<_, DataFusionError>(rebased::<u32>(p, *b)))?;
        parts.push(vec![total as u32]);
        DeviceOffsets::U32(gpu.upload_chunks(&parts.iter().map(|v| v.as_slice()).collect::<Vec<_>>(), stats)?)
    };
    let mut data = gpu.alloc_zeros::<u8>(padded_len(total as usize))?;
    gpu.upload_chunks_into(&pieces, &mut data, 0, stats)?;
    Ok(DeviceRows::Offsets { n, offsets, data })
}

/// View arrays: the views, the batch table and the distinct buffers, all as whole pieces.
fn upload_views(gpu: &Gpu, v: &HostViews<'_>, stats: &mut TransferStats) -> Result<DeviceRows> {
    let mut views = gpu.alloc_zeros::<u64>(2 * v.n + 2)?;
    gpu.upload_chunks_into(&v.views.iter().map(|w| w.as_ref()).collect::<Vec<_>>(), &mut views, 0, stats)?;
    let mut data = gpu.alloc_zeros::<u8>(padded_len(v.data_len))?;
    gpu.upload_chunks_into(&v.buffers, &mut data, 0, stats)?;
    Ok(DeviceRows::Views {
        n: v.n,
        views,
        batch_rows: gpu.upload(&v.batch_rows, stats)?,
        nbatches: (v.batch_rows.len() - 1) as u32,
        batch_bufs: gpu.upload(&v.batch_bufs, stats)?,
        buf_pos: gpu.upload(&v.buf_pos, stats)?,
        data,
    })
}

/// Upload one side's rows: offsets computed from the row lengths, and the
/// bytes copied straight from the rows into the pinned staging (no host concatenation).
fn upload_rows(gpu: &Gpu, rows: &[&[u8]], wide: bool, stats: &mut TransferStats) -> Result<DeviceRows> {
    let n = rows.len();
    let total: usize = rows.iter().map(|r| r.len()).sum();
    let offsets = if wide {
        let mut o = Vec::with_capacity(n + 1);
        let mut at = 0u64;
        o.push(0);
        for r in rows {
            at += r.len() as u64;
            o.push(at);
        }
        DeviceOffsets::U64(gpu.upload(&o, stats)?)
    } else {
        if total > u32::MAX as usize {
            return Err(DataFusionError::Internal("row_hash: 32-bit offsets for more than 4 GiB of rows".into()));
        }
        let mut o = Vec::with_capacity(n + 1);
        let mut at = 0u32;
        o.push(0);
        for r in rows {
            at += r.len() as u32; // total fits u32 (checked above), so no prefix overflows
            o.push(at);
        }
        DeviceOffsets::U32(gpu.upload(&o, stats)?)
    };
    // Zeroed so the padding the kernels read past the last row is defined.
    let mut data = gpu.alloc_zeros::<u8>(padded_len(total))?;
    gpu.upload_chunks_into(rows, &mut data, 0, stats)?;
    Ok(DeviceRows::Offsets { n, offsets, data })
}

/// Kernels of one per-row operation, by layout: 32- and 64-bit offsets, views, fixed.
struct PerRow {
    offsets_u32: &'static str,
    offsets_u64: &'static str,
    views: &'static str,
    fixed: &'static str,
}

/// Each row's hash written to `out`.
const HASH: PerRow =
    PerRow { offsets_u32: "hash_rows_u32", offsets_u64: "hash_rows_u64", views: "hash_views", fixed: "hash_fixed" };
/// Each row's hash folded into `out` (a composite key's running hash, keys::hash_columns_step).
const COMBINE: PerRow = PerRow {
    offsets_u32: "combine_rows_u32",
    offsets_u64: "combine_rows_u64",
    views: "combine_views",
    fixed: "combine_fixed",
};

/// Run one per-row kernel over `rows`, writing or folding into `out` (at least `rows.len()` words).
fn launch_per_row(gpu: &Gpu, kernels: &PerRow, rows: &DeviceRows, out: &DeviceBuffer<u64>) -> Result<()> {
    if rows.len() == 0 {
        return Ok(());
    }
    let n = rows.len() as u64;
    let stream = gpu.stream();
    let cfg = launch_cfg(gpu, rows.len());
    match rows {
        DeviceRows::Offsets { offsets: DeviceOffsets::U32(o), data, .. } => {
            let f = gpu.function(&KERNEL, kernels.offsets_u32)?;
            // SAFETY: signature matches kernels/row_hash.cu; offsets hold n + 1 entries within the padded data; out holds n.
            unsafe { stream.launch_builder(&f).arg(&o.slice).arg(&data.slice).arg(&n).arg(&out.slice).launch(cfg) }
        }
        DeviceRows::Offsets { offsets: DeviceOffsets::U64(o), data, .. } => {
            let f = gpu.function(&KERNEL, kernels.offsets_u64)?;
            // SAFETY: as above.
            unsafe { stream.launch_builder(&f).arg(&o.slice).arg(&data.slice).arg(&n).arg(&out.slice).launch(cfg) }
        }
        DeviceRows::Views { views, batch_rows, nbatches, batch_bufs, buf_pos, data, .. } => {
            let f = gpu.function(&KERNEL, kernels.views)?;
            // SAFETY: signature matches kernels/row_hash.cu; views hold 2n + 2 words whose buffer
            // references (valid Arrow views) lie within the batch table and the padded data; out holds n.
            unsafe {
                stream
                    .launch_builder(&f)
                    .arg(&views.slice)
                    .arg(&batch_rows.slice)
                    .arg(nbatches)
                    .arg(&batch_bufs.slice)
                    .arg(&buf_pos.slice)
                    .arg(&data.slice)
                    .arg(&n)
                    .arg(&out.slice)
                    .launch(cfg)
            }
        }
        DeviceRows::Fixed { vals, .. } => {
            let f = gpu.function(&KERNEL, kernels.fixed)?;
            // SAFETY: signature matches kernels/row_hash.cu; vals holds n + 1 words; out holds n.
            unsafe { stream.launch_builder(&f).arg(&vals.slice).arg(&n).arg(&out.slice).launch(cfg) }
        }
    }
    .map_err(|e| cuda_err("row hash", e))?;
    Ok(())
}

/// Hash every row on the device; the hashes stay there.
fn hash_on_device(gpu: &Gpu, rows: &DeviceRows) -> Result<DeviceBuffer<u64>> {
    let out = gpu.alloc::<u64>(rows.len())?;
    launch_per_row(gpu, &HASH, rows, &out)?;
    Ok(out)
}

/// Device verification: `true` when equal hashes always mean equal bytes over
/// both sides. Waits for the device (it reads the collision flag back).
fn verify_on_device(
    gpu: &Gpu,
    build: &DeviceRows,
    build_hashes: &DeviceBuffer<u64>,
    probe: &DeviceRows,
    probe_hashes: &DeviceBuffer<u64>,
    stats: &mut TransferStats,
) -> Result<bool> {
    verify_parts_on_device(gpu, &[(build, probe)], build_hashes, probe_hashes, stats)
}

/// Device verification of keys held in parts (a composite key's columns and
/// NULL masks, each as one build and one probe [`DeviceRows`] of the same
/// layout): `true` when, in every part, every row equals its hash's
/// representative row, so equal hashes mean equal keys over both sides.
/// One table of representatives serves every part. Waits for the device.
fn verify_parts_on_device(
    gpu: &Gpu,
    parts: &[(&DeviceRows, &DeviceRows)],
    build_hashes: &DeviceBuffer<u64>,
    probe_hashes: &DeviceBuffer<u64>,
    stats: &mut TransferStats,
) -> Result<bool> {
    let Some((build, probe)) = parts.first() else {
        return Err(DataFusionError::Internal("row_hash: nothing to verify".into()));
    };
    let (nb, np) = (build.len(), probe.len());
    if parts.iter().any(|(b, p)| b.len() != nb || p.len() != np) {
        return Err(DataFusionError::Internal("row_hash: key parts of different lengths".into()));
    }
    let Some(table) = VerifyTable::build(gpu, build_hashes, nb, probe_hashes, np)? else { return Ok(true) };
    let VerifyTable { keys, reps, flag, mask, .. } = &table;
    let (nb64, np64) = (nb as u64, np as u64);
    let stream = gpu.stream();
    let (b, p) = (&build_hashes.slice, &probe_hashes.slice);
    let cfg = launch_cfg(gpu, nb + np);
    for &(build, probe) in parts {
        match (build, probe) {
            (
                DeviceRows::Offsets { offsets: DeviceOffsets::U32(bo), data: bd, .. },
                DeviceRows::Offsets { offsets: DeviceOffsets::U32(po), data: pd, .. },
            ) => {
                let f = gpu.function(&KERNEL, "verify_check_u32")?;
                // SAFETY: signature matches kernels/row_hash.cu; hashes hold nb and np entries, the table
                // cap + 1 slots (mask = cap - 1); each side's offsets hold n + 1 entries within its padded data.
                unsafe {
                    stream
                        .launch_builder(&f)
                        .arg(b)
                        .arg(&nb64)
                        .arg(p)
                        .arg(&np64)
                        .arg(&keys.slice)
                        .arg(&reps.slice)
                        .arg(mask)
                        .arg(&bo.slice)
                        .arg(&bd.slice)
                        .arg(&po.slice)
                        .arg(&pd.slice)
                        .arg(&flag.slice)
                        .launch(cfg)
                }
            }
            (
                DeviceRows::Offsets { offsets: DeviceOffsets::U64(bo), data: bd, .. },
                DeviceRows::Offsets { offsets: DeviceOffsets::U64(po), data: pd, .. },
            ) => {
                let f = gpu.function(&KERNEL, "verify_check_u64")?;
                // SAFETY: as above.
                unsafe {
                    stream
                        .launch_builder(&f)
                        .arg(b)
                        .arg(&nb64)
                        .arg(p)
                        .arg(&np64)
                        .arg(&keys.slice)
                        .arg(&reps.slice)
                        .arg(mask)
                        .arg(&bo.slice)
                        .arg(&bd.slice)
                        .arg(&po.slice)
                        .arg(&pd.slice)
                        .arg(&flag.slice)
                        .launch(cfg)
                }
            }
            (
                DeviceRows::Views {
                    views: bv,
                    batch_rows: br,
                    nbatches: bn,
                    batch_bufs: bb,
                    buf_pos: bp,
                    data: bd,
                    ..
                },
                DeviceRows::Views {
                    views: pv,
                    batch_rows: pr,
                    nbatches: pn,
                    batch_bufs: pb,
                    buf_pos: pp,
                    data: pd,
                    ..
                },
            ) => {
                let f = gpu.function(&KERNEL, "verify_check_views")?;
                // SAFETY: as above; each side's views, batch table and padded data as in hash_on_device.
                unsafe {
                    stream
                        .launch_builder(&f)
                        .arg(b)
                        .arg(&nb64)
                        .arg(p)
                        .arg(&np64)
                        .arg(&keys.slice)
                        .arg(&reps.slice)
                        .arg(mask)
                        .arg(&bv.slice)
                        .arg(&br.slice)
                        .arg(bn)
                        .arg(&bb.slice)
                        .arg(&bp.slice)
                        .arg(&bd.slice)
                        .arg(&pv.slice)
                        .arg(&pr.slice)
                        .arg(pn)
                        .arg(&pb.slice)
                        .arg(&pp.slice)
                        .arg(&pd.slice)
                        .arg(&flag.slice)
                        .launch(cfg)
                }
            }
            (DeviceRows::Fixed { vals: bv, .. }, DeviceRows::Fixed { vals: pv, .. }) => {
                let f = gpu.function(&KERNEL, "verify_check_fixed")?;
                // SAFETY: as above; each side's vals hold its rows' words (plus one zeroed word).
                unsafe {
                    stream
                        .launch_builder(&f)
                        .arg(b)
                        .arg(&nb64)
                        .arg(p)
                        .arg(&np64)
                        .arg(&keys.slice)
                        .arg(&reps.slice)
                        .arg(mask)
                        .arg(&bv.slice)
                        .arg(&pv.slice)
                        .arg(&flag.slice)
                        .launch(cfg)
                }
            }
            _ => return Err(DataFusionError::Internal("row_hash: both sides need the same layout".into())),
        }
        .map_err(|e| cuda_err("row_hash verify check", e))?;
    }
    table.collision_free(gpu, stats)
}

/// Device verification of a BYTE_ARRAY key that the Parquet decoder left on
/// the device ([`crate::scan::DeviceStrings`]: each row's span, its key the
/// hash of its bytes): `true` when equal hashes mean equal bytes over both
/// sides (NULL rows are empty spans with key 0). Waits for the device.
pub fn spans_collision_free(
    gpu: &Gpu,
    (build_hashes, build_spans, nb): (&DeviceBuffer<u64>, &DeviceBuffer<u64>, usize),
    (probe_hashes, probe_spans, np): (&DeviceBuffer<u64>, &DeviceBuffer<u64>, usize),
    stats: &mut TransferStats,
) -> Result<bool> {
    if build_spans.len() < 2 * nb || probe_spans.len() < 2 * np {
        return Err(DataFusionError::Internal("row_hash: fewer spans than rows".into()));
    }
    let Some(table) = VerifyTable::build(gpu, build_hashes, nb, probe_hashes, np)? else { return Ok(true) };
    let (nb64, np64) = (nb as u64, np as u64);
    let f = gpu.function(&KERNEL, "verify_check_spans")?;
    // SAFETY: signature matches kernels/row_hash.cu; hashes hold nb and np entries, the table cap + 1 slots
    // (mask = cap - 1); spans two words a row, each a decoded value's address and length in page bodies
    // the caller keeps alive and padded (DeviceStrings), or (0, 0).
    unsafe {
        gpu.stream()
            .launch_builder(&f)
            .arg(&build_hashes.slice)
            .arg(&nb64)
            .arg(&probe_hashes.slice)
            .arg(&np64)
            .arg(&table.keys.slice)
            .arg(&table.reps.slice)
            .arg(&table.mask)
            .arg(&build_spans.slice)
            .arg(&probe_spans.slice)
            .arg(&table.flag.slice)
            .launch(launch_cfg(gpu, nb + np))
    }
    .map_err(|e| cuda_err("row_hash verify check", e))?;
    table.collision_free(gpu, stats)
}

/// The literal each row of a BYTE_ARRAY column that the Parquet decoder left
/// on the device equals ([`crate::scan::DeviceStrings`]' spans): 1 + the
/// index of the first equal one in `literals`, 0 for none and for a NULL
/// row. A device scan's filter reads a string column compared with literals
/// as this number (`crate::exec::device_scan`). CPU twin: [`match_literals_cpu`].
pub fn match_literals_gpu(
    gpu: &Gpu,
    spans: &DeviceBuffer<u64>,
    rows: usize,
    literals: &[Vec<u8>],
    stats: &mut TransferStats,
) -> Result<DeviceBuffer<u64>> {
    let (out, pieces) = spans_kernel_inputs(gpu, spans, rows, literals, stats)?;
    let Some((words, at)) = pieces else { return Ok(out) };
    let (n, nlits) = (rows as u64, literals.len() as u32);
    let f = gpu.function(&KERNEL, "match_literals_spans")?;
    // SAFETY: signature matches kernels/row_hash.cu; spans hold two words a row (a decoded value's address and
    // length in page bodies the caller keeps alive and padded, or (0, 0)), at nlits + 1 offsets into words
    // (padded by one zeroed word), out `rows` entries.
    unsafe {
        gpu.stream()
            .launch_builder(&f)
            .arg(&spans.slice)
            .arg(&n)
            .arg(&words.slice)
            .arg(&at.slice)
            .arg(&nlits)
            .arg(&out.slice)
            .launch(launch_cfg(gpu, rows))
    }
    .map_err(|e| cuda_err("row_hash match literals", e))?;
    Ok(out)
}

/// CPU twin of [`match_literals_gpu`] over the rows' values (None: NULL).
pub fn match_literals_cpu<'a>(values: impl IntoIterator<Item = Option<&'a [u8]>>, literals: &[Vec<u8>]) -> Vec<u64> {
    values
        .into_iter()
        .map(|v| v.and_then(|v| literals.iter().position(|l| l == v)).map_or(0, |j| j as u64 + 1))
        .collect()
}

/// A LIKE pattern whose only wildcard is `%`, split for matching bytes:
/// its non-empty pieces in order, and whether the first is anchored at a
/// value's start (the pattern does not begin with `%`) and the last at its
/// end. None: a pattern with `_` or an escape (`\`), which match characters
/// or change the meaning of the next byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LikePattern {
    pub parts: Vec<Vec<u8>>,
    pub starts: bool,
    pub ends: bool,
}

impl LikePattern {
    pub fn new(pattern: &[u8]) -> Option<Self> {
        if pattern.iter().any(|&b| b == b'_' || b == b'\\') {
            return None;
        }
        Some(LikePattern {
            parts: pattern.split(|&b| b == b'%').filter(|p| !p.is_empty()).map(<[u8]>::to_vec).collect(),
            starts: pattern.first() != Some(&b'%'),
            ends: pattern.last() != Some(&b'%'),
        })
    }

    /// Does `v` match (the CPU twin of `match_like_spans`, step for step)?
    pub fn matches(&self, v: &[u8]) -> bool {
        let n = self.parts.len();
        if n == 0 {
            return !(self.starts && self.ends) || v.is_empty();
        }
        let (mut pos, mut limit, mut first, mut last) = (0, v.len(), 0, n);
        if self.starts {
            if !v.starts_with(&self.parts[0]) {
                return false;
            }
            pos = self.parts[0].len();
            first = 1;
        }
        if self.ends {
            if first == n {
                return v.len() == pos;
            }
            let p = &self.parts[n - 1];
            if v.len() < pos + p.len() || !v.ends_with(p) {
                return false;
            }
            limit = v.len() - p.len();
            last = n - 1;
        }
        for p in &self.parts[first..last] {
            match v[pos..limit].windows(p.len()).position(|w| w == p.as_slice()) {
                Some(at) => pos += at + p.len(),
                None => return false,
            }
        }
        true
    }
}

/// Whether each row of a BYTE_ARRAY column that the Parquet decoder left on
/// the device ([`crate::scan::DeviceStrings`]' spans) matches `pattern`: 1 or
/// 0, and 0 for a NULL row. CPU twin: [`match_like_cpu`].
pub fn match_like_gpu(
    gpu: &Gpu,
    spans: &DeviceBuffer<u64>,
    rows: usize,
    pattern: &LikePattern,
    stats: &mut TransferStats,
) -> Result<DeviceBuffer<u64>> {
    let (out, pieces) = spans_kernel_inputs(gpu, spans, rows, &pattern.parts, stats)?;
    let Some((words, at)) = pieces else { return Ok(out) };
    let (n, nparts) = (rows as u64, pattern.parts.len() as u32);
    let (starts, ends) = (pattern.starts as u32, pattern.ends as u32);
    let f = gpu.function(&KERNEL, "match_like_spans")?;
    // SAFETY: signature matches kernels/row_hash.cu; spans hold two words a row (a decoded value's address and
    // length in page bodies the caller keeps alive and padded, or (0, 0)), at nparts + 1 offsets into words
    // (padded by one zeroed word), out `rows` entries.
    unsafe {
        gpu.stream()
            .launch_builder(&f)
            .arg(&spans.slice)
            .arg(&n)
            .arg(&words.slice)
            .arg(&at.slice)
            .arg(&nparts)
            .arg(&starts)
            .arg(&ends)
            .arg(&out.slice)
            .launch(launch_cfg(gpu, rows))
    }
    .map_err(|e| cuda_err("row_hash match like", e))?;
    Ok(out)
}

/// CPU twin of [`match_like_gpu`] over the rows' values (None: NULL).
pub fn match_like_cpu<'a>(values: impl IntoIterator<Item = Option<&'a [u8]>>, pattern: &LikePattern) -> Vec<u64> {
    values.into_iter().map(|v| v.is_some_and(|v| pattern.matches(v)) as u64).collect()
}

/// What a per-row kernel over a spans column needs beside the spans: its
/// output (one word a row, at least one), and `pieces` on the device as one
/// padded little-endian word array (a zeroed word after the last byte, so a
/// kernel may read whole words) with their byte offsets. None for the
/// pieces: no rows, nothing to launch.
#[allow(clippy::type_complexity)]
fn spans_kernel_inputs(
    gpu: &Gpu,
    spans: &DeviceBuffer<u64>,
    rows: usize,
    pieces: &[Vec<u8>],
    stats: &mut TransferStats,
) -> Result<(DeviceBuffer<u64>, Option<(DeviceBuffer<u64>, DeviceBuffer<u64>)>)> {
    if spans.len() < 2 * rows {
        return Err(DataFusionError::Internal("row_hash: fewer spans than rows".into()));
    }
    let out = gpu.alloc::<u64>(rows.max(1))?;
    if rows == 0 {
        return Ok((out, None));
    }
    let mut at = vec![0u64];
    let mut words = vec![0u64; padded_len(pieces.iter().map(Vec::len).sum()) / 8];
    let mut pos = 0usize;
    for l in pieces {
        for &b in l {
            words[pos / 8] |= (b as u64) << (8 * (pos % 8));
            pos += 1;
        }
        at.push(pos as u64);
    }
    let uploaded = (gpu.upload(&words, stats)?, gpu.upload(&at, stats)?);
    Ok((out, Some(uploaded)))
}

/// The verification's table of representatives over both sides' hashes
/// (`verify_insert` done: each hash's slot holds its smallest row), and the
/// collision flag the checks raise.
struct VerifyTable {
    keys: DeviceBuffer<u64>,
    reps: DeviceBuffer<u32>,
    flag: DeviceBuffer<u32>,
    mask: u64,
    started: Instant,
}

impl VerifyTable {
    /// The table over `nb` build and `np` probe hashes; None when there are none.
    fn build(
        gpu: &Gpu,
        build_hashes: &DeviceBuffer<u64>,
        nb: usize,
        probe_hashes: &DeviceBuffer<u64>,
        np: usize,
    ) -> Result<Option<Self>> {
        let n = nb + np;
        if n == 0 {
            return Ok(None);
        }
        if n >= NO_ROW as usize {
            return Err(DataFusionError::NotImplemented("row_hash: verification of 2^32 rows or more".into()));
        }
        let cap = verify_capacity(n);
        let (mask, slots) = ((cap - 1) as u64, (cap + 1) as u64);
        let keys = gpu.alloc::<u64>(cap + 1)?;
        let reps = gpu.alloc::<u32>(cap + 1)?;
        let flag = gpu.alloc_zeros::<u32>(1)?;
        let (nb64, np64) = (nb as u64, np as u64);
        let stream = gpu.stream();
        let started = Instant::now();
        let f = gpu.function(&KERNEL, "fill_u64")?;
        // SAFETY: signature matches kernels/row_hash.cu; keys holds cap + 1 entries.
        unsafe {
            stream.launch_builder(&f).arg(&keys.slice).arg(&slots).arg(&EMPTY_KEY).launch(launch_cfg(gpu, cap + 1))
        }
        .map_err(|e| cuda_err("row_hash fill", e))?;
        let f = gpu.function(&KERNEL, "fill_u32")?;
        // SAFETY: as above, for reps.
        unsafe { stream.launch_builder(&f).arg(&reps.slice).arg(&slots).arg(&NO_ROW).launch(launch_cfg(gpu, cap + 1)) }
            .map_err(|e| cuda_err("row_hash fill", e))?;
        let f = gpu.function(&KERNEL, "verify_insert")?;
        // SAFETY: hashes hold nb and np entries; the table holds cap + 1 slots with mask = cap - 1.
        unsafe {
            stream
                .launch_builder(&f)
                .arg(&build_hashes.slice)
                .arg(&nb64)
                .arg(&probe_hashes.slice)
                .arg(&np64)
                .arg(&keys.slice)
                .arg(&reps.slice)
                .arg(&mask)
                .launch(launch_cfg(gpu, n))
        }
        .map_err(|e| cuda_err("row_hash verify insert", e))?;
        Ok(Some(Self { keys, reps, flag, mask, started }))
    }

    /// Wait for the checks; `true` when none raised the flag.
    fn collision_free(&self, gpu: &Gpu, stats: &mut TransferStats) -> Result<bool> {
        gpu.synchronize()?;
        stats.kernel += self.started.elapsed();
        Ok(gpu.read_one(&self.flag, 0, stats)? == 0)
    }
}

/// The GPU path for hash-encoded keys: hash both sides on the device, verify
/// every hash match there, then select on the device-resident hashes with the
/// hash-table strategy. `Ok(None)`: a hash collision was found (the caller
/// recomputes exactly). An `Err` that [`crate::gpu::is_out_of_memory`]
/// recognises means the rows do not fit the memory budget in one pass.
/// The caller holds the device lock.
pub fn select_subsets_gpu(
    gpu: &Gpu,
    op: SetOp,
    build: RowSubset<'_>,
    probe: RowSubset<'_>,
    stats: &mut TransferStats,
) -> Result<Option<BooleanBuffer>> {
    if let KeyBytes::Columns(_) = build.bytes() {
        return select_columns_gpu(gpu, op, build, probe, None, stats);
    }
    let (b, p) = host_rows(build, probe);
    select_host_rows_gpu(gpu, op, &b, &p, None, stats)
}

/// The GPU path over rows given as byte slices. `hashes` (test hook) replaces
/// the device hashing with given hashes, so tests can force collisions.
pub(crate) fn select_slices_gpu(
    gpu: &Gpu,
    op: SetOp,
    build: &[&[u8]],
    probe: &[&[u8]],
    hashes: Option<(&[u64], &[u64])>,
    stats: &mut TransferStats,
) -> Result<Option<BooleanBuffer>> {
    let (b, p) = (HostRows::Slices(build.to_vec()), HostRows::Slices(probe.to_vec()));
    select_host_rows_gpu(gpu, op, &b, &p, hashes, stats)
}

fn select_host_rows_gpu(
    gpu: &Gpu,
    op: SetOp,
    build: &HostRows<'_>,
    probe: &HostRows<'_>,
    hashes: Option<(&[u64], &[u64])>,
    stats: &mut TransferStats,
) -> Result<Option<BooleanBuffer>> {
    let (nb, np) = (build.len(), probe.len());
    if np == 0 {
        return Ok(Some(BooleanBuffer::new_unset(0)));
    }
    let wide = build.data_len().max(probe.data_len()) > u32::MAX as usize;
    let need = device_bytes(op, build, probe, wide);
    let avail = gpu.budget().available();
    if need > avail {
        // The caller then partitions on host hashes.
        return Err(crate::gpu::GpuError::over_budget("device row hashing", need, avail).into());
    }
    let rows_b = upload_side(gpu, build, wide, stats)?;
    let rows_p = upload_side(gpu, probe, wide, stats)?;
    let (bh, ph) = match hashes {
        None => (hash_on_device(gpu, &rows_b)?, hash_on_device(gpu, &rows_p)?),
        Some((hb, hp)) => {
            if hb.len() != nb || hp.len() != np {
                return Err(DataFusionError::Internal("row_hash: one hash per row expected".into()));
            }
            (gpu.upload(hb, stats)?, gpu.upload(hp, stats)?)
        }
    };
    let collision_free = verify_on_device(gpu, &rows_b, &bh, &rows_p, &ph, stats)?;
    // The bytes are no longer needed: free them before the select allocates its table.
    drop((rows_b, rows_p));
    if !collision_free {
        return Ok(None);
    }
    let out = ResidentSelect::from_device(bh, nb, ph, np, None).run(gpu, GpuStrategy::Hash, op, stats)?;
    let words = gpu.download(&out, np.div_ceil(32), stats)?;
    Ok(Some(select::words_to_bool(words, np)))
}

/// One part of a column-hashed composite key (a key column, or the NULL
/// masks) on both sides, as it travels; `wide`: 64-bit offsets.
struct HostPart<'a> {
    build: HostRows<'a>,
    probe: HostRows<'a>,
    wide: bool,
}

/// An exact column's images (per batch) for the rows of a subset: the
/// batches' buffers themselves, or the subset's words gathered.
fn fixed_rows<'a>(images: &'a [ScalarBuffer<u64>], keys: &ColumnKeys, idx: Option<&[u32]>) -> HostRows<'a> {
    match idx {
        None => HostRows::Fixed {
            n: keys.len(),
            pieces: images.iter().map(|b| std::borrow::Cow::Borrowed(b.as_ref())).collect(),
        },
        Some(ix) => {
            let words = ix
                .iter()
                .map(|&i| {
                    let (b, j) = keys.locate(i as usize);
                    images[b][j]
                })
                .collect();
            HostRows::Fixed { n: ix.len(), pieces: vec![std::borrow::Cow::Owned(words)] }
        }
    }
}

/// How column-hashed keys travel: every key column in its layout (exact
/// columns fixed, string columns as [`host_rows`] lays out a one-column key),
/// and the NULL masks where a row of either subset has a NULL column (a side
/// without one gets zero words: its masks are all 0).
fn host_parts<'a>(build: RowSubset<'a>, probe: RowSubset<'a>) -> Result<(Vec<HostPart<'a>>, Option<HostPart<'a>>)> {
    let (KeyBytes::Columns(bc), KeyBytes::Columns(pc)) = (build.bytes(), probe.bytes()) else {
        return Err(DataFusionError::Internal("row_hash: column-hashed keys expected on both sides".into()));
    };
    if bc.parts().len() != pc.parts().len() {
        return Err(DataFusionError::Internal("row_hash: composite keys of different widths".into()));
    }
    let mut parts = Vec::with_capacity(bc.parts().len());
    for (x, y) in bc.parts().iter().zip(pc.parts()) {
        let (b, p) = match (x, y) {
            (KeyPart::Exact(xb), KeyPart::Exact(yb)) => {
                (fixed_rows(xb, bc, build.idx()), fixed_rows(yb, pc, probe.idx()))
            }
            (KeyPart::Bytes(xb), KeyPart::Bytes(yb)) => {
                host_rows(RowSubset::new(xb, build.idx())?, RowSubset::new(yb, probe.idx())?)
            }
            _ => return Err(DataFusionError::Internal("row_hash: composite key columns of different kinds".into())),
        };
        let wide = b.data_len().max(p.data_len()) > u32::MAX as usize;
        parts.push(HostPart { build: b, probe: p, wide });
    }
    // A subset's masks, if any is not 0 (the SQL-NULL modes leave rows with NULLs out).
    let masks = |k: &'a ColumnKeys, rows: RowSubset<'a>| -> Option<HostRows<'a>> {
        let m = k.null_masks()?;
        let words: Vec<u64> = match rows.idx() {
            None => m.iter().flat_map(|b| b.iter().copied()).collect(),
            Some(ix) => ix.iter().map(|&i| k.null_mask(i as usize)).collect(),
        };
        words
            .iter()
            .any(|&w| w != 0)
            .then(|| HostRows::Fixed { n: words.len(), pieces: vec![std::borrow::Cow::Owned(words)] })
    };
    let zeros = |n: usize| HostRows::Fixed { n, pieces: Vec::new() };
    let masks = match (masks(bc, build), masks(pc, probe)) {
        (None, None) => None,
        (b, p) => Some(HostPart {
            build: b.unwrap_or_else(|| zeros(build.len())),
            probe: p.unwrap_or_else(|| zeros(probe.len())),
            wide: false,
        }),
    };
    Ok((parts, masks))
}

/// Upload every part of column-hashed keys and hash both sides on the device,
/// column by column (`keys::hash_columns`). Returns the hashes and the parts
/// on the device (key columns, then the masks if any), for verification.
#[allow(clippy::type_complexity)]
fn hash_parts_on_device(
    gpu: &Gpu,
    parts: &[HostPart<'_>],
    masks: Option<&HostPart<'_>>,
    nb: usize,
    np: usize,
    stats: &mut TransferStats,
) -> Result<(DeviceBuffer<u64>, DeviceBuffer<u64>, Vec<(DeviceRows, DeviceRows)>)> {
    let seeded = |n: usize| -> Result<DeviceBuffer<u64>> {
        let h = gpu.alloc::<u64>(n)?;
        if n > 0 {
            let f = gpu.function(&KERNEL, "fill_u64")?;
            // SAFETY: signature matches kernels/row_hash.cu; h holds n words.
            unsafe {
                gpu.stream()
                    .launch_builder(&f)
                    .arg(&h.slice)
                    .arg(&(n as u64))
                    .arg(&keys::COLUMNS_SEED)
                    .launch(launch_cfg(gpu, n))
            }
            .map_err(|e| cuda_err("row_hash fill", e))?;
        }
        Ok(h)
    };
    let (bh, ph) = (seeded(nb)?, seeded(np)?);
    let mut on_device = Vec::with_capacity(parts.len() + 1);
    for part in parts {
        let (b, p) =
            (upload_side(gpu, &part.build, part.wide, stats)?, upload_side(gpu, &part.probe, part.wide, stats)?);
        if b.len() != nb || p.len() != np {
            return Err(DataFusionError::Internal("row_hash: key columns of different lengths".into()));
        }
        launch_per_row(gpu, &COMBINE, &b, &bh)?;
        launch_per_row(gpu, &COMBINE, &p, &ph)?;
        on_device.push((b, p));
    }
    let masks = masks
        .map(|m| {
            Ok::<_, DataFusionError>((
                upload_side(gpu, &m.build, false, stats)?,
                upload_side(gpu, &m.probe, false, stats)?,
            ))
        })
        .transpose()?;
    let f = gpu.function(&KERNEL, "combine_finish")?;
    for (h, n, m) in [(&bh, nb, masks.as_ref().map(|m| &m.0)), (&ph, np, masks.as_ref().map(|m| &m.1))] {
        if n == 0 {
            continue;
        }
        // Without masks the kernel reads none: the hashes stand in for the unused pointer.
        let (mask_words, has_masks) = match m {
            Some(DeviceRows::Fixed { vals, .. }) => (&vals.slice, 1u32),
            _ => (&h.slice, 0u32),
        };
        // SAFETY: signature matches kernels/row_hash.cu; h holds n words, the masks (when read) n + 1.
        unsafe {
            gpu.stream()
                .launch_builder(&f)
                .arg(&h.slice)
                .arg(&(n as u64))
                .arg(mask_words)
                .arg(&has_masks)
                .launch(launch_cfg(gpu, n))
        }
        .map_err(|e| cuda_err("row_hash combine finish", e))?;
    }
    on_device.extend(masks);
    Ok((bh, ph, on_device))
}

/// The GPU path for column-hashed composite keys ([`KeyBytes::Columns`]):
/// each key column travels in its own layout (no row encoding), both sides
/// are hashed column by column on the device, every hash match is verified
/// column by column and on the NULL masks, then the selection runs on the
/// device-resident hashes. `hashes` (test hook) replaces the device hashes,
/// so tests can force collisions. `Ok(None)`: a collision (the caller
/// recomputes exactly); out-of-budget errors as [`select_subsets_gpu`].
fn select_columns_gpu(
    gpu: &Gpu,
    op: SetOp,
    build: RowSubset<'_>,
    probe: RowSubset<'_>,
    hashes: Option<(&[u64], &[u64])>,
    stats: &mut TransferStats,
) -> Result<Option<BooleanBuffer>> {
    let (nb, np) = (build.len(), probe.len());
    if np == 0 {
        return Ok(Some(BooleanBuffer::new_unset(0)));
    }
    let (parts, masks) = host_parts(build, probe)?;
    let held: usize =
        parts.iter().chain(&masks).map(|p| p.build.device_bytes(p.wide) + p.probe.device_bytes(p.wide)).sum();
    let need =
        (held + (verify_capacity(nb + np) + 1) * 12 + 4).max(select::device_bytes(GpuStrategy::Hash, op, nb, np, 0));
    let avail = gpu.budget().available();
    if need > avail {
        // The caller then partitions on host hashes.
        return Err(crate::gpu::GpuError::over_budget("device composite key hashing", need, avail).into());
    }
    let (mut bh, mut ph, on_device) = hash_parts_on_device(gpu, &parts, masks.as_ref(), nb, np, stats)?;
    if let Some((hb, hp)) = hashes {
        if hb.len() != nb || hp.len() != np {
            return Err(DataFusionError::Internal("row_hash: one hash per row expected".into()));
        }
        (bh, ph) = (gpu.upload(hb, stats)?, gpu.upload(hp, stats)?);
    }
    let pairs: Vec<(&DeviceRows, &DeviceRows)> = on_device.iter().map(|(b, p)| (b, p)).collect();
    let collision_free = verify_parts_on_device(gpu, &pairs, &bh, &ph, stats)?;
    // The columns are no longer needed: free them before the select allocates its table.
    drop(pairs);
    drop(on_device);
    if !collision_free {
        return Ok(None);
    }
    let out = ResidentSelect::from_device(bh, nb, ph, np, None).run(gpu, GpuStrategy::Hash, op, stats)?;
    let words = gpu.download(&out, np.div_ceil(32), stats)?;
    Ok(Some(select::words_to_bool(words, np)))
}

/// Column-hashed keys hashed on the device, column by column, and read back
/// (checks and tests). CPU twin: [`hash_columns_cpu`].
pub fn hash_columns_gpu(gpu: &Gpu, rows: RowSubset<'_>, stats: &mut TransferStats) -> Result<Vec<u64>> {
    let (parts, masks) = host_parts(rows, rows)?;
    let (h, _, _) = hash_parts_on_device(gpu, &parts, masks.as_ref(), rows.len(), rows.len(), stats)?;
    gpu.download(&h, rows.len(), stats)
}

/// CPU twin of [`hash_columns_gpu`]: `keys::hash_columns` of every row, column by column on all cores.
pub fn hash_columns_cpu(rows: RowSubset<'_>) -> Vec<u64> {
    keys::hash_rows(rows)
}

/// Device verification of column-hashed keys with given hashes (checks and
/// tests: equal hashes on different tuples force a collision). `true` =
/// collision-free. CPU twin: [`verify_columns_cpu`].
pub fn verify_columns_gpu(
    gpu: &Gpu,
    build: RowSubset<'_>,
    build_hashes: &[u64],
    probe: RowSubset<'_>,
    probe_hashes: &[u64],
    stats: &mut TransferStats,
) -> Result<bool> {
    if build_hashes.len() != build.len() || probe_hashes.len() != probe.len() {
        return Err(DataFusionError::Internal("row_hash: one hash per row expected".into()));
    }
    if build.is_empty() && probe.is_empty() {
        return Ok(true);
    }
    let (parts, masks) = host_parts(build, probe)?;
    let mut on_device = Vec::with_capacity(parts.len() + 1);
    for part in parts.iter().chain(&masks) {
        on_device
            .push((upload_side(gpu, &part.build, part.wide, stats)?, upload_side(gpu, &part.probe, part.wide, stats)?));
    }
    let (bh, ph) = (gpu.upload(build_hashes, stats)?, gpu.upload(probe_hashes, stats)?);
    let pairs: Vec<(&DeviceRows, &DeviceRows)> = on_device.iter().map(|(b, p)| (b, p)).collect();
    verify_parts_on_device(gpu, &pairs, &bh, &ph, stats)
}

/// CPU twin of [`verify_columns_gpu`]: `keys::verify_columns`.
pub fn verify_columns_cpu(
    build: RowSubset<'_>,
    build_hashes: &[u64],
    probe: RowSubset<'_>,
    probe_hashes: &[u64],
) -> bool {
    keys::verify_columns(build, build_hashes, probe, probe_hashes)
}

/// Hash rows given as offsets/data on the device and read the hashes back (checks and tests).
pub fn hash_rows_gpu(gpu: &Gpu, offsets: &[usize], data: &[u8], stats: &mut TransferStats) -> Result<Vec<u64>> {
    let rows = slices_of(offsets, data)?;
    let wide = data.len() > u32::MAX as usize;
    let d = upload_rows(gpu, &rows, wide, stats)?;
    let h = hash_on_device(gpu, &d)?;
    gpu.download(&h, rows.len(), stats)
}

/// Hash rows on the device in the layout they travel in and read the hashes back (checks and tests).
fn hash_subset_gpu(gpu: &Gpu, rows: RowSubset<'_>, wide: bool, stats: &mut TransferStats) -> Result<Vec<u64>> {
    let (host, _) = host_rows(rows, rows);
    let d = upload_side(gpu, &host, wide, stats)?;
    let h = hash_on_device(gpu, &d)?;
    gpu.download(&h, host.len(), stats)
}

/// Device verification of both sides with given hashes (checks and tests:
/// equal hashes on different rows force a collision). `true` = collision-free.
pub(crate) fn verify_slices_gpu(
    gpu: &Gpu,
    build: &[&[u8]],
    build_hashes: &[u64],
    probe: &[&[u8]],
    probe_hashes: &[u64],
    stats: &mut TransferStats,
) -> Result<bool> {
    if build_hashes.len() != build.len() || probe_hashes.len() != probe.len() {
        return Err(DataFusionError::Internal("row_hash: one hash per row expected".into()));
    }
    let wide = build.iter().chain(probe).map(|r| r.len()).sum::<usize>() > u32::MAX as usize;
    let (b, p) = (upload_rows(gpu, build, wide, stats)?, upload_rows(gpu, probe, wide, stats)?);
    let (bh, ph) = (gpu.upload(build_hashes, stats)?, gpu.upload(probe_hashes, stats)?);
    verify_on_device(gpu, &b, &bh, &p, &ph, stats)
}

/// Rows of an offsets/data pair as slices; an error (not a panic) on bad offsets.
fn slices_of<'a>(offsets: &[usize], data: &'a [u8]) -> Result<Vec<&'a [u8]>> {
    offsets
        .windows(2)
        .map(|w| {
            data.get(w[0]..w[1]).ok_or_else(|| DataFusionError::Internal("row_hash: offsets outside the data".into()))
        })
        .collect()
}

/// Random rows for the checks: empty, short, 8-byte multiples and long ones,
/// with repeats (so verification compares real rows), as offsets + data.
fn random_rows(seed: u64, n: usize) -> (Vec<usize>, Vec<u8>) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut offsets = vec![0usize];
    let mut data: Vec<u8> = Vec::new();
    for i in 0..n {
        if i > 4 && rng.random_range(0..4) == 0 {
            // Repeat an earlier row.
            let j = rng.random_range(0..i);
            let (s, e) = (offsets[j], offsets[j + 1]);
            data.extend_from_within(s..e);
        } else {
            let len = match rng.random_range(0..20) {
                0 => 0,
                1 => 8 * rng.random_range(1..6),
                2 => rng.random_range(300..3000),
                _ => rng.random_range(1..100),
            };
            data.extend((0..len).map(|_| rng.random::<u8>()));
        }
        offsets.push(data.len());
    }
    (offsets, data)
}

/// Doctor self-check: device hashes equal the CPU twin's, the verifier finds
/// forced collisions (including on the table's empty-marker hash) and passes
/// collision-free input, and the selection matches the CPU on exact row ids;
/// the same for composite keys hashed column by column ([`self_check_composite`]).
pub fn self_check(gpu: &Gpu) -> Result<String> {
    let fail = |what: String| Err(DataFusionError::Execution(format!("row_hash self-check failed: {what}")));
    let mut stats = TransferStats::default();
    let (offsets, data) = random_rows(11, 20_000);
    let want = hash_rows_cpu(&offsets, &data);
    let got = hash_rows_gpu(gpu, &offsets, &data, &mut stats)?;
    if got != want {
        let bad = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
        return fail(format!("device hash of row {bad} differs from keys::hash_bytes ({} rows)", want.len()));
    }
    let rows = slices_of(&offsets, &data)?;
    // The same rows as two Arrow view arrays sharing their buffers (inline and buffered values).
    let views: ArrayRef = Arc::new(BinaryViewArray::from_iter_values(rows.iter()));
    let half = views.len() / 2;
    let column = KeyBytes::Values(ByteColumn::new(vec![views.slice(0, half), views.slice(half, views.len() - half)])?);
    if hash_subset_gpu(gpu, RowSubset::all(&column), false, &mut stats)? != want {
        return fail("device hashes of Arrow views differ from keys::hash_bytes".into());
    }
    let (build, probe) = rows.split_at(rows.len() / 2);
    let (bh, ph) = want.split_at(build.len());
    if !verify_slices_gpu(gpu, build, bh, probe, ph, &mut stats)? {
        return fail("collision reported on true hashes".into());
    }
    // Two different rows given one hash must be caught, also on the all-ones hash.
    let (i, j) = distinct_pair(build, probe).ok_or_else(|| DataFusionError::Internal("no distinct rows".into()))?;
    for forced in [bh[i], EMPTY_KEY] {
        let (mut fb, mut fp) = (bh.to_vec(), ph.to_vec());
        fb[i] = forced;
        fp[j] = forced;
        if verify_slices_gpu(gpu, build, &fb, probe, &fp, &mut stats)? {
            return fail(format!("forced collision on hash {forced:#x} not detected"));
        }
    }
    // Selection on device hashes against the CPU on exact row ids.
    let mut checked = 0;
    let (b_ids, p_ids) = exact_ids(build, probe);
    for op in [
        SetOp::Semi,
        SetOp::Anti,
        SetOp::IntersectDistinct,
        SetOp::IntersectAll,
        SetOp::ExceptDistinct,
        SetOp::ExceptAll,
    ] {
        let got = select_slices_gpu(gpu, op, build, probe, None, &mut stats)?;
        let want = select::select_cpu(op, &b_ids, &p_ids);
        match got {
            Some(got) if select::same_multiset_selection(op, &p_ids, &want, &got) => checked += 1,
            Some(_) => return fail(format!("{} selection differs from the CPU", op.name())),
            None => return fail(format!("{}: collision reported on true hashes", op.name())),
        }
    }
    let (mut fb, mut fp) = (bh.to_vec(), ph.to_vec());
    fb[i] = 7;
    fp[j] = 7;
    if select_slices_gpu(gpu, SetOp::Semi, build, probe, Some((&fb, &fp)), &mut stats)?.is_some() {
        return fail("forced collision not reported by the selection".into());
    }
    let (vb, vp) =
        (ByteColumn::new(vec![views.slice(0, half)])?, ByteColumn::new(vec![views.slice(half, views.len() - half)])?);
    let (vb, vp) = (KeyBytes::Values(vb), KeyBytes::Values(vp));
    for op in [SetOp::Semi, SetOp::ExceptAll] {
        let got = select_subsets_gpu(gpu, op, RowSubset::all(&vb), RowSubset::all(&vp), &mut stats)?;
        let want = select::select_cpu(op, &b_ids, &p_ids);
        match got {
            Some(got) if select::same_multiset_selection(op, &p_ids, &want, &got) => checked += 1,
            _ => return fail(format!("{} selection over Arrow views differs from the CPU", op.name())),
        }
    }
    let composite = self_check_composite(gpu, &mut stats)?;
    Ok(format!(
        "{} row hashes (bytes and Arrow views) match keys::hash_bytes; forced collisions caught; {checked} ops match the CPU on exact rows; \
         composite keys hashed column by column: hashes match keys::hash_columns, forced collisions caught, {composite} ops match the CPU",
        want.len()
    ))
}

/// Random composite key batches for the checks: batches of `sizes` rows
/// (each sliced out of a larger array), one column per type: strings (of any
/// string type, dictionaries too) of lengths around the views' inline limit,
/// small integers or dates, floats with -0.0 and NaNs; every column has
/// NULLs (about 1 in 8) and the tuples repeat.
fn composite_batches(rng: &mut rand::rngs::StdRng, types: &[DataType], sizes: &[usize]) -> Result<Vec<Vec<ArrayRef>>> {
    use datafusion::arrow::array::{Float64Array, Int64Array, StringArray};
    use rand::Rng;
    let words = ["", "a", "b", "exactly12byt", "thirteen byte", "a much longer string key that spans several words"];
    let floats = [0.0, -0.0, f64::NAN, -f64::NAN, 2.5, -7.0];
    let mut column = |t: &DataType, n: usize| -> Result<ArrayRef> {
        let nulls: Vec<bool> = (0..n + 3).map(|_| rng.random_range(0..8) > 0).collect();
        let a: ArrayRef = if keys::is_byte_column(&[keys::key_type(t)]) {
            let v: StringArray = nulls.iter().map(|&ok| ok.then(|| words[rng.random_range(0..words.len())])).collect();
            datafusion::arrow::compute::cast(&v, t)?
        } else if *t == DataType::Float64 {
            Arc::new(
                nulls.iter().map(|&ok| ok.then(|| floats[rng.random_range(0..floats.len())])).collect::<Float64Array>(),
            )
        } else {
            let v: Int64Array = nulls.iter().map(|&ok| ok.then(|| rng.random_range(-2..4i64))).collect();
            datafusion::arrow::compute::cast(&v, t)?
        };
        Ok(a.slice(2, n))
    };
    sizes.iter().map(|&n| types.iter().map(|t| column(t, n)).collect()).collect()
}

/// Doctor self-check of column-hashed composite keys ((string, int, date)
/// and (view, float), NULLs in every column): device hashes equal the CPU
/// twin's, verification passes true hashes and catches forced collisions,
/// and every operation selects as the CPU does on exact tuples (all rows, as
/// INTERSECT / EXCEPT compare them with NULLs, and the rows without NULLs).
/// Returns the number of checked selections.
fn self_check_composite(gpu: &Gpu, stats: &mut TransferStats) -> Result<usize> {
    use rand::SeedableRng;
    let fail =
        |what: String| Err(DataFusionError::Execution(format!("row_hash self-check failed: composite keys: {what}")));
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let mut checked = 0;
    for types in [vec![DataType::Utf8, DataType::Int64, DataType::Date32], vec![DataType::Utf8View, DataType::Float64]]
    {
        let build = keys::encode(&composite_batches(&mut rng, &types, &[3000, 0, 1500])?, &types, None, true)?;
        let probe = keys::encode(&composite_batches(&mut rng, &types, &[2500, 700])?, &types, None, true)?;
        let (Some(bb), Some(pb)) = (&build.bytes, &probe.bytes) else {
            return fail(format!("{types:?} not hash-encoded"));
        };
        let (bs, ps) = (RowSubset::all(bb), RowSubset::all(pb));
        let (bh, ph) = (hash_columns_cpu(bs), hash_columns_cpu(ps));
        if hash_columns_gpu(gpu, bs, stats)? != bh || hash_columns_gpu(gpu, ps, stats)? != ph {
            return fail(format!("{types:?}: device hashes differ from keys::hash_columns"));
        }
        if !verify_columns_gpu(gpu, bs, &bh, ps, &ph, stats)? {
            return fail(format!("{types:?}: collision reported on true hashes"));
        }
        let (b_ids, p_ids) = keys::exact_ids(bs, ps);
        let Some(j) = p_ids.iter().position(|&p| p != b_ids[0]) else { return fail("no distinct tuples".into()) };
        for forced in [bh[0], EMPTY_KEY] {
            let (mut fb, mut fp) = (bh.clone(), ph.clone());
            fb[0] = forced;
            fp[j] = forced;
            if verify_columns_gpu(gpu, bs, &fb, ps, &fp, stats)? || verify_columns_cpu(bs, &fb, ps, &fp) {
                return fail(format!("{types:?}: forced collision on hash {forced:#x} not detected"));
            }
            if select_columns_gpu(gpu, SetOp::Semi, bs, ps, Some((&fb, &fp)), stats)?.is_some() {
                return fail(format!("{types:?}: forced collision not reported by the selection"));
            }
        }
        let valid =
            |k: &keys::KeyColumns| -> Vec<u32> { (0..k.len() as u32).filter(|&i| !k.is_null(i as usize)).collect() };
        let (bv, pv) = (valid(&build), valid(&probe));
        for (bsub, psub) in [(bs, ps), (RowSubset::new(bb, Some(&bv))?, RowSubset::new(pb, Some(&pv))?)] {
            let (b_ids, p_ids) = keys::exact_ids(bsub, psub);
            for op in [
                SetOp::Semi,
                SetOp::Anti,
                SetOp::IntersectDistinct,
                SetOp::IntersectAll,
                SetOp::ExceptDistinct,
                SetOp::ExceptAll,
            ] {
                let want = select::select_cpu(op, &b_ids, &p_ids);
                match select_subsets_gpu(gpu, op, bsub, psub, stats)? {
                    Some(got) if select::same_multiset_selection(op, &p_ids, &want, &got) => checked += 1,
                    Some(_) => return fail(format!("{types:?}: {} selection differs from the CPU", op.name())),
                    None => return fail(format!("{types:?}: {}: collision reported on true hashes", op.name())),
                }
            }
        }
    }
    Ok(checked)
}

/// A build row and a probe row with different bytes.
fn distinct_pair(build: &[&[u8]], probe: &[&[u8]]) -> Option<(usize, usize)> {
    let first = build.first()?;
    let j = probe.iter().position(|p| p != first)?;
    Some((0, j))
}

/// Exact dense ids of byte rows (equal ids iff equal bytes), for checks.
fn exact_ids<'a>(build: &[&'a [u8]], probe: &[&'a [u8]]) -> (Vec<u64>, Vec<u64>) {
    let mut ids: HashMap<&'a [u8], u64> = HashMap::new();
    let mut id = |r: &'a [u8]| -> u64 {
        let n = ids.len() as u64;
        *ids.entry(r).or_insert(n)
    };
    let b = build.iter().map(|r| id(r)).collect();
    let p = probe.iter().map(|r| id(r)).collect();
    (b, p)
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Int32Array, LargeBinaryArray, StringArray};
    use datafusion::arrow::compute::cast;
    use datafusion::arrow::datatypes::DataType;
    use datafusion::arrow::row::{RowConverter, SortField};
    use rand::{Rng, SeedableRng};

    use super::*;

    const OPS: [SetOp; 6] = [
        SetOp::Semi,
        SetOp::Anti,
        SetOp::IntersectDistinct,
        SetOp::IntersectAll,
        SetOp::ExceptDistinct,
        SetOp::ExceptAll,
    ];

    /// Pins the hash function the device reproduces (values from an
    /// independent port: `scripts/golden-hashes.py` prints them).
    #[test]
    fn cpu_hash_golden_values() {
        let rows: [&[u8]; 5] = [b"", b"a", b"abcdefgh", b"abcdefghi", b"setfusion row hash!"];
        let want =
            [0xd34402edf2a39352u64, 0xadfb03f623bf3c3b, 0xcaf184724a8ab462, 0x703002d184daf332, 0x197abfe9135dde9d];
        let mut offsets = vec![0];
        let mut data = Vec::new();
        for r in rows {
            data.extend_from_slice(r);
            offsets.push(data.len());
        }
        assert_eq!(hash_rows_cpu(&offsets, &data), want);
        let bytes: Vec<u8> = (0..32).collect();
        assert_eq!(keys::hash_bytes(&bytes), 0xfb41947106c77b94);
    }

    #[test]
    fn cpu_verify_finds_forced_collisions_only() {
        let (offsets, data) = random_rows(3, 2000);
        let hashes = hash_rows_cpu(&offsets, &data);
        assert!(verify_cpu(&hashes, &offsets, &data));
        let rows = slices_of(&offsets, &data).unwrap();
        let j = rows.iter().position(|r| *r != rows[0]).unwrap();
        let mut forced = hashes.clone();
        forced[j] = forced[0];
        assert!(!verify_cpu(&forced, &offsets, &data));
        // Equal rows under one hash are fine, whatever the hash.
        let k = (1..rows.len()).find(|&k| rows[k] == rows[0]).unwrap_or(0);
        let mut same = hashes.clone();
        same[0] = u64::MAX;
        same[k] = u64::MAX;
        assert!(verify_cpu(&same, &offsets, &data));
    }

    /// Rows of a spans column (values at unaligned addresses of their own, NULLs,
    /// empty strings, duplicates) numbered by the literal they equal, on the
    /// device as by the CPU twin; literals empty, short, 8 bytes and longer.
    #[test]
    fn literal_numbers_match_cpu_twin() {
        let mut rng = crate::util::Xorshift64(0x5EED_0F_11);
        let pool: Vec<Vec<u8>> =
            ["", "F", "O", "P", "1-URGENT", "1-URGEN", "1-URGENT ", "MAIL", "a long string of bytes", "\0"]
                .iter()
                .map(|s| s.as_bytes().to_vec())
                .collect();
        let values: Vec<Option<Vec<u8>>> = (0..5000)
            .map(|_| match rng.below(12) {
                0 => None,
                1 => Some((0..rng.below(20)).map(|_| rng.below(256) as u8).collect()),
                k => Some(pool[(k as usize) % pool.len()].clone()),
            })
            .collect();
        let literal_sets: [&[usize]; 5] = [&[1], &[0], &[4, 5, 6], &[8, 1, 0], &[]];
        for set in literal_sets {
            let literals: Vec<Vec<u8>> = set.iter().map(|&i| pool[i].clone()).collect();
            let want = match_literals_cpu(values.iter().map(|v| v.as_deref()), &literals);
            let empty = literals.iter().position(|l| l.is_empty()).map_or(0, |j| j as u64 + 1);
            for (v, &w) in values.iter().zip(&want) {
                let expect = v.as_deref().and_then(|v| literals.iter().position(|l| l == v));
                assert_eq!(w, expect.map_or(0, |j| j as u64 + 1));
                if v.as_deref() == Some(&b""[..]) {
                    assert_eq!(w, empty);
                }
            }
            let Some(g) = crate::gpu::test_gpu() else { continue };
            let mut stats = TransferStats::default();
            // Each value at an odd offset of one padded body, as decoded page bodies leave them.
            let mut body = Vec::new();
            let mut at = Vec::new();
            for v in &values {
                body.push(0xAB);
                at.push(body.len());
                body.extend_from_slice(v.as_deref().unwrap_or_default());
            }
            body.resize(padded_len(body.len()), 0);
            let body = g.upload(&body, &mut stats).unwrap();
            let base = g.untracked_address(&body);
            let spans: Vec<u64> = values
                .iter()
                .zip(&at)
                .flat_map(|(v, &a)| match v {
                    Some(v) => [base + a as u64, v.len() as u64],
                    None => [0, 0],
                })
                .collect();
            let spans = g.upload(&spans, &mut stats).unwrap();
            let got = match_literals_gpu(&g, &spans, values.len(), &literals, &mut stats).unwrap();
            assert_eq!(g.download(&got, values.len(), &mut stats).unwrap(), want, "literals {set:?}");
            let none = match_literals_gpu(&g, &spans, 0, &literals, &mut stats).unwrap();
            assert!(none.len() >= 1);
        }
    }

    /// LIKE patterns with `%` only: the CPU twin equals Arrow's `like` kernel on
    /// random strings (UTF-8 of several widths, NULLs, empty), and the device
    /// equals the twin on the same rows as spans at odd addresses.
    #[test]
    fn like_matches_arrow_and_cpu_twin() {
        use datafusion::arrow::array::{BooleanArray, Scalar};
        use datafusion::arrow::compute::kernels::comparison::like;
        let mut rng = crate::util::Xorshift64(0x11CE);
        let alphabet = ["a", "b", "ab", "é", "中", "%", "x"];
        let values: Vec<Option<String>> = (0..4000)
            .map(|_| {
                (rng.below(15) != 0)
                    .then(|| (0..rng.below(9)).map(|_| alphabet[rng.below(alphabet.len() as u64) as usize]).collect())
            })
            .collect();
        let patterns = [
            "", "%", "%%", "a", "ab%", "%b", "%ab%", "a%b", "a%b%", "%a%a%", "é%", "%中", "ab%ab", "a%%b", "%é%b%",
            "aba", "%x%x%x%",
        ];
        let g = crate::gpu::test_gpu();
        let array = StringArray::from(values.clone());
        for pattern in patterns {
            let p = LikePattern::new(pattern.as_bytes()).unwrap();
            let twin = match_like_cpu(values.iter().map(|v| v.as_deref().map(str::as_bytes)), &p);
            let arrow: BooleanArray = like(&array, &Scalar::new(StringArray::from(vec![pattern]))).unwrap();
            for (i, &t) in twin.iter().enumerate() {
                let want = arrow.is_valid(i) && arrow.value(i);
                assert_eq!(t == 1, want, "{pattern:?} on {:?}", values[i]);
            }
            let Some(g) = &g else { continue };
            let mut stats = TransferStats::default();
            let mut body = Vec::new();
            let mut at = Vec::new();
            for v in &values {
                body.extend_from_slice(b"zzz");
                at.push(body.len());
                body.extend_from_slice(v.as_deref().unwrap_or_default().as_bytes());
            }
            body.resize(padded_len(body.len()), 0);
            let body = g.upload(&body, &mut stats).unwrap();
            let base = g.untracked_address(&body);
            let spans: Vec<u64> = values
                .iter()
                .zip(&at)
                .flat_map(|(v, &a)| match v {
                    Some(v) => [base + a as u64, v.len() as u64],
                    None => [0, 0],
                })
                .collect();
            let spans = g.upload(&spans, &mut stats).unwrap();
            let got = match_like_gpu(g, &spans, values.len(), &p, &mut stats).unwrap();
            assert_eq!(g.download(&got, values.len(), &mut stats).unwrap(), twin, "{pattern:?}");
        }
        assert!(LikePattern::new(b"a_b").is_none() && LikePattern::new(b"a\\%").is_none());
    }

    fn string_rows(conv: &RowConverter, vals: &[Option<&str>], ints: &[i32]) -> KeyBytes {
        let cols: Vec<ArrayRef> =
            vec![Arc::new(StringArray::from(vals.to_vec())), Arc::new(Int32Array::from(ints.to_vec()))];
        KeyBytes::Rows(conv.convert_columns(&cols).unwrap())
    }

    fn row_format(k: &KeyBytes) -> &datafusion::arrow::row::Rows {
        match k {
            KeyBytes::Rows(r) => r,
            _ => panic!("row-format keys expected"),
        }
    }

    #[test]
    fn row_subsets_verify_and_exact_ids() {
        let conv = RowConverter::new(vec![SortField::new(DataType::Utf8), SortField::new(DataType::Int32)]).unwrap();
        let b = string_rows(&conv, &[Some("a"), None, Some("bb"), Some("a")], &[1, 2, 3, 1]);
        let p = string_rows(&conv, &[Some("bb"), Some("a"), Some("c")], &[3, 2, 1]);
        let bi = [0u32, 2, 3];
        let bs = RowSubset::new(&b, Some(&bi)).unwrap();
        let ps = RowSubset::all(&p);
        assert!(RowSubset::new(&b, Some(&[4])).is_err());
        assert_eq!(bs.len(), 3);
        assert_eq!(bs.data_len(), bi.iter().map(|&i| row_format(&b).row(i as usize).data().len()).sum::<usize>());
        let (bh, ph) = (keys::hash_rows(bs), keys::hash_rows(ps));
        assert_eq!(bh[1], keys::hash_bytes(row_format(&b).row(2).data()));
        assert!(keys::verify_rows_or_exact(bs, &bh, ps, &ph).is_none());
        let (b_ids, p_ids) = keys::exact_ids(bs, ps);
        assert_eq!(b_ids, vec![0, 1, 0]);
        assert_eq!(p_ids, vec![1, 2, 3]);
        // ("a", 1) and ("a", 2) forced to one hash: exact ids come back.
        let mut ph2 = ph.clone();
        ph2[1] = bh[0];
        assert_eq!(keys::verify_rows_or_exact(bs, &bh, ps, &ph2), Some((b_ids, p_ids)));
    }

    #[test]
    fn gpu_hashes_match_cpu_twin() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        for (seed, n) in [(1u64, 0usize), (2, 1), (3, 7), (4, 5000), (5, 100_000)] {
            let (offsets, data) = random_rows(seed, n);
            let got = hash_rows_gpu(&gpu, &offsets, &data, &mut TransferStats::default()).unwrap();
            assert_eq!(got, hash_rows_cpu(&offsets, &data), "seed {seed}");
        }
        // Every length 0..80 at every start alignment: a spacer row of 0..7 bytes before each.
        let mut offsets = vec![0];
        for len in 0..80 {
            for spacer in 0..8 {
                offsets.push(offsets[offsets.len() - 1] + spacer);
                offsets.push(offsets[offsets.len() - 1] + len);
            }
        }
        let bytes: Vec<u8> = (0..offsets[offsets.len() - 1] as u32).map(|i| (i * 37 % 251) as u8).collect();
        let got = hash_rows_gpu(&gpu, &offsets, &bytes, &mut TransferStats::default()).unwrap();
        assert_eq!(got, hash_rows_cpu(&offsets, &bytes));
        self_check(&gpu).unwrap();
    }

    #[test]
    fn gpu_verify_matches_cpu_twin() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for case in 0..40 {
            let (offsets, data) = random_rows(100 + case, rng.random_range(2..3000));
            let mut hashes = hash_rows_cpu(&offsets, &data);
            if case % 2 == 1 {
                // Squeeze the hashes into a tiny domain: many forced collisions (or, by luck, none).
                let m = rng.random_range(1..50u64);
                for h in &mut hashes {
                    *h = if *h % 3 == 0 { u64::MAX } else { *h % m };
                }
            }
            let rows = slices_of(&offsets, &data).unwrap();
            let cut = rng.random_range(0..=rows.len());
            let (b, p) = rows.split_at(cut);
            let (bh, ph) = hashes.split_at(cut);
            let got = verify_slices_gpu(&gpu, b, bh, p, ph, &mut TransferStats::default()).unwrap();
            assert_eq!(got, verify_cpu(&hashes, &offsets, &data), "case {case}");
        }
    }

    /// Spans (the Parquet decoder's layout: each row's own device address and
    /// length) verify as the CPU twin does, forced collisions included.
    #[test]
    fn gpu_span_verify_matches_cpu_twin() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        let mut rng = rand::rngs::StdRng::seed_from_u64(6);
        let mut stats = TransferStats::default();
        for case in 0..30 {
            let (offsets, mut data) = random_rows(200 + case, rng.random_range(2..3000));
            let mut hashes = hash_rows_cpu(&offsets, &data);
            if case % 2 == 1 {
                let m = rng.random_range(1..50u64);
                for h in &mut hashes {
                    *h = *h % m;
                }
            }
            let n = offsets.len() - 1;
            // Padded as the decoder's bodies are: the word after the last byte may be read.
            data.extend_from_slice(&[0u8; 16]);
            let bytes = gpu.upload(&data, &mut stats).unwrap();
            let base = gpu.untracked_address(&bytes);
            let spans: Vec<u64> =
                (0..n).flat_map(|i| [base + offsets[i] as u64, (offsets[i + 1] - offsets[i]) as u64]).collect();
            let cut = rng.random_range(0..=n);
            let up = |v: &[u64]| gpu.upload(if v.is_empty() { &[0u64][..] } else { v }, &mut TransferStats::default());
            let (bh, ph) = (up(&hashes[..cut]).unwrap(), up(&hashes[cut..]).unwrap());
            let (bs, ps) = (up(&spans[..2 * cut]).unwrap(), up(&spans[2 * cut..]).unwrap());
            let got = spans_collision_free(&gpu, (&bh, &bs, cut), (&ph, &ps, n - cut), &mut stats).unwrap();
            let want = verify_cpu(&hashes, &offsets, &data[..offsets[n]]);
            assert_eq!(got, want, "case {case}");
        }
    }

    #[test]
    fn gpu_select_rows_matches_exact_cpu() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        let conv = RowConverter::new(vec![SortField::new(DataType::Utf8), SortField::new(DataType::Int32)]).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(8);
        let words = ["", "a", "setfusion", "gpu", "a much longer string key that spans several words", "ß∂ƒ"];
        let mut side = |n: usize| {
            let vals: Vec<Option<String>> = (0..n)
                .map(|_| (rng.random_range(0..10) > 0).then(|| words[rng.random_range(0..words.len())].to_string()))
                .collect();
            let ints: Vec<i32> = (0..n).map(|_| rng.random_range(0..4)).collect();
            let refs: Vec<Option<&str>> = vals.iter().map(|v| v.as_deref()).collect();
            string_rows(&conv, &refs, &ints)
        };
        for (nb, np) in [(0, 10), (10, 0), (300, 500), (5000, 4000)] {
            let (b, p) = (side(nb), side(np));
            let (bs, ps) = (RowSubset::all(&b), RowSubset::all(&p));
            let (b_ids, p_ids) = keys::exact_ids(bs, ps);
            for op in OPS {
                let got =
                    select_subsets_gpu(&gpu, op, bs, ps, &mut TransferStats::default()).unwrap().expect("no collision");
                let want = select::select_cpu(op, &b_ids, &p_ids);
                assert!(select::same_multiset_selection(op, &p_ids, &want, &got), "{nb}x{np} {op:?}");
            }
            // Subsets (every other row) go through the same path without copying rows.
            let (bi, pi): (Vec<u32>, Vec<u32>) =
                ((0..nb as u32).step_by(2).collect(), (1..np as u32).step_by(2).collect());
            let (bs, ps) = (RowSubset::new(&b, Some(&bi)).unwrap(), RowSubset::new(&p, Some(&pi)).unwrap());
            let (b_ids, p_ids) = keys::exact_ids(bs, ps);
            for op in OPS {
                let got =
                    select_subsets_gpu(&gpu, op, bs, ps, &mut TransferStats::default()).unwrap().expect("no collision");
                let want = select::select_cpu(op, &b_ids, &p_ids);
                assert!(select::same_multiset_selection(op, &p_ids, &want, &got), "subset {nb}x{np} {op:?}");
            }
        }
    }

    #[test]
    fn gpu_select_reports_forced_collision_and_budget() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let gpu = gpu.lease(0);
        let rows: Vec<&[u8]> = vec![b"alpha", b"beta", b"gamma", b"alpha"];
        let (b, p) = rows.split_at(2);
        let mut st = TransferStats::default();
        // Different rows "beta" and "gamma" share a hash: a collision, whatever the op.
        let got = select_slices_gpu(&gpu, SetOp::Semi, b, p, Some((&[1, 2], &[2, 1])), &mut st).unwrap();
        assert!(got.is_none());
        // Equal rows sharing a hash are fine: probe "gamma" (hash 3) and "alpha" (hash 1).
        let got = select_slices_gpu(&gpu, SetOp::Semi, b, p, Some((&[1, 2], &[3, 1])), &mut st).unwrap().unwrap();
        assert_eq!(got.iter().collect::<Vec<_>>(), vec![false, true]);
        gpu.budget().set_limit(1 << 10);
        let r = select_slices_gpu(&gpu, SetOp::Semi, b, p, None, &mut st);
        assert!(r.as_ref().is_err_and(crate::gpu::is_out_of_memory), "{r:?}");
    }

    const STRING_TYPES: [DataType; 6] = [
        DataType::Utf8,
        DataType::LargeUtf8,
        DataType::Binary,
        DataType::LargeBinary,
        DataType::Utf8View,
        DataType::BinaryView,
    ];

    /// A string / binary column of type `t` in batches of `sizes` rows: NULLs,
    /// lengths around the views' 12-byte inline limit, many repeats. Batches
    /// are slices (offsets not from 0); odd ones are cut from one shared array
    /// (view batches then share buffers).
    fn string_batches(rng: &mut rand::rngs::StdRng, t: &DataType, sizes: &[usize]) -> Vec<ArrayRef> {
        let pool: Vec<String> = (0..40)
            .map(|i| {
                let len = [0, 1, 7, 8, 11, 12, 13, 16, 25, 60][i % 10];
                (0..len).map(|k| (b'a' + ((i * 7 + k) % 26) as u8) as char).collect()
            })
            .collect();
        let mut column = |n: usize| -> ArrayRef {
            let vals: Vec<Option<String>> =
                (0..n).map(|_| rng.random_bool(0.9).then(|| pool[rng.random_range(0..pool.len())].clone())).collect();
            cast(&(Arc::new(StringArray::from(vals)) as ArrayRef), t).unwrap()
        };
        let shared = column(sizes.iter().sum::<usize>() + 3);
        let mut at = 1;
        sizes
            .iter()
            .enumerate()
            .map(|(b, &n)| {
                at += n;
                if b % 2 == 1 {
                    shared.slice(at - n, n)
                } else {
                    column(n + 3).slice(2, n)
                }
            })
            .collect()
    }

    /// Every value's bytes (None for NULL), read through arrow's cast.
    fn expected_bytes(arrays: &[ArrayRef]) -> Vec<Option<Vec<u8>>> {
        arrays
            .iter()
            .flat_map(|a| {
                let b = cast(a, &DataType::LargeBinary).unwrap();
                let b: &LargeBinaryArray = b.as_binary();
                b.iter().map(|v| v.map(|v| v.to_vec())).collect::<Vec<_>>()
            })
            .collect()
    }

    /// String columns are read in place, in every type, whole and as subsets,
    /// and travel as views, whole arrays or gathered rows as intended.
    #[test]
    fn byte_columns_read_values_of_every_type() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(21);
        for t in STRING_TYPES {
            let arrays = string_batches(&mut rng, &t, &[0, 5, 100, 37, 64]);
            let want = expected_bytes(&arrays);
            let bytes = KeyBytes::Values(ByteColumn::new(arrays).unwrap());
            let all = RowSubset::all(&bytes);
            let got: Vec<&[u8]> = all.iter().collect();
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                if let Some(w) = w {
                    assert_eq!(g, w, "{t}");
                }
            }
            assert_eq!(keys::hash_rows(all), got.iter().map(|r| keys::hash_bytes(r)).collect::<Vec<_>>(), "{t}");
            let idx: Vec<u32> = (0..want.len() as u32).filter(|&i| want[i as usize].is_some()).collect();
            let valid = RowSubset::new(&bytes, Some(&idx)).unwrap();
            let got_valid: Vec<&[u8]> = valid.iter().collect();
            assert_eq!(got_valid, idx.iter().map(|&i| want[i as usize].as_deref().unwrap()).collect::<Vec<_>>(), "{t}");
            assert_eq!(keys::hash_rows(valid), got_valid.iter().map(|r| keys::hash_bytes(r)).collect::<Vec<_>>());
            let views = matches!(t, DataType::Utf8View | DataType::BinaryView);
            match (host_rows(all, all).0, views) {
                (HostRows::Views(v), true) => {
                    assert_eq!(v.n, want.len());
                    assert_eq!(*v.batch_rows.last().unwrap() as usize, want.len());
                    // The shared array's buffers are uploaded once.
                    assert!(v.buffers.len() < v.buf_pos.len() || v.buf_pos.is_empty(), "{t}");
                }
                (HostRows::Arrays(a), false) => assert_eq!(a.len(), 5),
                _ => panic!("{t}: unexpected layout"),
            }
            match (host_rows(valid, valid).0, views) {
                (HostRows::Views(v), true) => assert_eq!(v.n, idx.len()),
                (HostRows::Slices(s), false) => assert_eq!(s.len(), idx.len()),
                _ => panic!("{t}: unexpected subset layout"),
            }
        }
    }

    /// String columns on the device (views, whole arrays with 32- and 64-bit
    /// offsets, gathered subsets) hash like the CPU twin and select like the
    /// CPU on exact values.
    #[test]
    fn gpu_string_columns_match_cpu_in_every_layout() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        let mut rng = rand::rngs::StdRng::seed_from_u64(22);
        let mut st = TransferStats::default();
        for t in STRING_TYPES {
            for (bs, ps) in [
                (vec![], vec![10]),
                (vec![7], vec![]),
                (vec![300, 0, 41], vec![500, 7]),
                (vec![5000, 3000, 1], vec![4000, 3]),
            ] {
                let b = KeyBytes::Values(ByteColumn::new(string_batches(&mut rng, &t, &bs)).unwrap());
                let p = KeyBytes::Values(ByteColumn::new(string_batches(&mut rng, &t, &ps)).unwrap());
                for wide in [false, true] {
                    let got = hash_subset_gpu(&gpu, RowSubset::all(&b), wide, &mut st).unwrap();
                    assert_eq!(got, keys::hash_rows(RowSubset::all(&b)), "{t} {bs:?} wide={wide}");
                }
                let every_other = |k: &KeyBytes, from: u32| -> Vec<u32> { (from..k.len() as u32).step_by(2).collect() };
                let (bi, pi) = (every_other(&b, 0), every_other(&p, 1));
                for (bsub, psub) in [
                    (RowSubset::all(&b), RowSubset::all(&p)),
                    (RowSubset::new(&b, Some(&bi)).unwrap(), RowSubset::new(&p, Some(&pi)).unwrap()),
                ] {
                    let (b_ids, p_ids) = keys::exact_ids(bsub, psub);
                    for op in OPS {
                        let got = select_subsets_gpu(&gpu, op, bsub, psub, &mut st).unwrap().expect("no collision");
                        let want = select::select_cpu(op, &b_ids, &p_ids);
                        assert!(select::same_multiset_selection(op, &p_ids, &want, &got), "{t} {bs:?}x{ps:?} {op:?}");
                    }
                }
            }
        }
    }
    /// The composite key types the device tests cover.
    fn composites() -> [Vec<DataType>; 4] {
        [
            vec![DataType::Utf8, DataType::Int32],
            vec![DataType::Int64, DataType::Utf8, DataType::Date32],
            vec![DataType::Utf8View, DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))],
            vec![DataType::LargeUtf8, DataType::Float64],
        ]
    }

    fn composite_keys(rng: &mut rand::rngs::StdRng, types: &[DataType], sizes: &[usize]) -> keys::KeyColumns {
        let key_types: Vec<DataType> = types.iter().map(keys::key_type).collect();
        keys::encode(&composite_batches(rng, types, sizes).unwrap(), &key_types, None, true).unwrap()
    }

    /// The rows of a side without a NULL key column.
    fn non_null_rows(k: &keys::KeyColumns) -> Vec<u32> {
        (0..k.len() as u32).filter(|&i| !k.is_null(i as usize)).collect()
    }

    /// How composite keys travel (checked without a GPU): exact columns as
    /// fixed words (whole batches borrowed, subsets gathered), strings in
    /// their one-column layouts, NULL masks only where a row of the subsets
    /// has a NULL column, zero words for a side without.
    #[test]
    fn composite_keys_travel_column_by_column() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(30);
        let b = composite_keys(&mut rng, &composites()[1], &[50, 0, 20]);
        let p = composite_keys(&mut rng, &composites()[1], &[30]);
        let (bb, pb) = (b.bytes.as_ref().unwrap(), p.bytes.as_ref().unwrap());
        let (parts, masks) = host_parts(RowSubset::all(bb), RowSubset::all(pb)).unwrap();
        assert_eq!(parts.len(), 3);
        assert!(matches!(&parts[0].build, HostRows::Fixed { n: 70, pieces } if pieces.len() == 3));
        assert!(matches!(&parts[1].build, HostRows::Arrays(a) if a.len() == 3));
        assert!(matches!(&parts[2].probe, HostRows::Fixed { n: 30, .. }));
        let masks = masks.expect("NULLs in the keys");
        assert!(matches!(&masks.build, HostRows::Fixed { n: 70, pieces } if pieces.len() == 1));
        // The rows without NULLs: gathered, and no masks at all.
        let (bv, pv) = (non_null_rows(&b), non_null_rows(&p));
        let (parts, masks) =
            host_parts(RowSubset::new(bb, Some(&bv)).unwrap(), RowSubset::new(pb, Some(&pv)).unwrap()).unwrap();
        assert!(masks.is_none());
        assert!(matches!(&parts[0].build, HostRows::Fixed { n, pieces } if *n == bv.len() && pieces.len() == 1));
        assert!(matches!(&parts[1].build, HostRows::Slices(r) if r.len() == bv.len()));
        // One side with NULLs, the other without: zero masks for the latter.
        let plain = keys::encode(
            &[vec![
                Arc::new(datafusion::arrow::array::Int64Array::from(vec![1])) as ArrayRef,
                Arc::new(StringArray::from(vec!["a"])),
                Arc::new(datafusion::arrow::array::Date32Array::from(vec![3])),
            ]],
            &composites()[1],
            None,
            true,
        )
        .unwrap();
        let (_, masks) = host_parts(RowSubset::all(bb), RowSubset::all(plain.bytes.as_ref().unwrap())).unwrap();
        assert!(matches!(masks.unwrap().probe, HostRows::Fixed { n: 1, pieces } if pieces.is_empty()));
        // Views stay views.
        let v = composite_keys(&mut rng, &composites()[2], &[40, 9]);
        let vb = v.bytes.as_ref().unwrap();
        let (parts, _) = host_parts(RowSubset::all(vb), RowSubset::all(vb)).unwrap();
        assert!(parts.iter().all(|p| matches!(p.build, HostRows::Views(_))));
        // Keys of another form are refused.
        let conv = RowConverter::new(vec![SortField::new(DataType::Utf8), SortField::new(DataType::Int32)]).unwrap();
        let rows = string_rows(&conv, &[Some("a")], &[1]);
        assert!(host_parts(RowSubset::all(&rows), RowSubset::all(&rows)).is_err());
    }

    /// Composite keys on the device: (string, int), (int, string, date),
    /// (Utf8View, dictionary of strings), (LargeUtf8, float with -0.0 and
    /// NaN), NULLs in every column, sliced batches, empty sides. Hashes,
    /// verification (true and squeezed hashes) and every operation's
    /// selection (all rows as INTERSECT / EXCEPT compare them, and the rows
    /// without NULLs) equal the CPU twins; forced collisions are reported.
    #[test]
    fn gpu_composite_keys_match_cpu_twin() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        let mut rng = rand::rngs::StdRng::seed_from_u64(31);
        let mut st = TransferStats::default();
        for types in composites() {
            let types = types.as_slice();
            for (bs, ps) in [
                (vec![], vec![10]),
                (vec![7], vec![]),
                (vec![300, 0, 41], vec![500, 7]),
                (vec![5000, 3000, 1], vec![4000, 3]),
            ] {
                let (b, p) = (composite_keys(&mut rng, types, &bs), composite_keys(&mut rng, types, &ps));
                let (bb, pb) = (b.bytes.as_ref().unwrap(), p.bytes.as_ref().unwrap());
                let (bv, pv) = (non_null_rows(&b), non_null_rows(&p));
                for (bsub, psub) in [
                    (RowSubset::all(bb), RowSubset::all(pb)),
                    (RowSubset::new(bb, Some(&bv)).unwrap(), RowSubset::new(pb, Some(&pv)).unwrap()),
                ] {
                    let what = format!("{types:?} {bs:?}x{ps:?} subset={}", bsub.idx().is_some());
                    let (bh, ph) = (hash_columns_cpu(bsub), hash_columns_cpu(psub));
                    assert_eq!(hash_columns_gpu(&gpu, bsub, &mut st).unwrap(), bh, "{what}");
                    assert_eq!(hash_columns_gpu(&gpu, psub, &mut st).unwrap(), ph, "{what}");
                    assert!(verify_columns_gpu(&gpu, bsub, &bh, psub, &ph, &mut st).unwrap(), "{what}");
                    for m in [1u64, 3, 40] {
                        let squeeze = |h: &[u64]| -> Vec<u64> {
                            h.iter().map(|&x| if x % 5 == 0 { u64::MAX } else { x % m }).collect()
                        };
                        let (sb, sp) = (squeeze(&bh), squeeze(&ph));
                        assert_eq!(
                            verify_columns_gpu(&gpu, bsub, &sb, psub, &sp, &mut st).unwrap(),
                            verify_columns_cpu(bsub, &sb, psub, &sp),
                            "{what} squeezed to {m}"
                        );
                    }
                    let (b_ids, p_ids) = keys::exact_ids(bsub, psub);
                    for op in OPS {
                        let got = select_subsets_gpu(&gpu, op, bsub, psub, &mut st).unwrap().expect("no collision");
                        let want = select::select_cpu(op, &b_ids, &p_ids);
                        assert!(select::same_multiset_selection(op, &p_ids, &want, &got), "{what} {op:?}");
                    }
                    // A build tuple and a different probe tuple forced onto one hash.
                    if let Some(j) = (!b_ids.is_empty()).then(|| p_ids.iter().position(|&x| x != b_ids[0])).flatten() {
                        let (mut fb, mut fp) = (bh.clone(), ph.clone());
                        fp[j] = fb[0];
                        assert!(!verify_columns_gpu(&gpu, bsub, &fb, psub, &fp, &mut st).unwrap(), "{what}");
                        assert!(
                            select_columns_gpu(&gpu, SetOp::Semi, bsub, psub, Some((&fb, &fp)), &mut st)
                                .unwrap()
                                .is_none(),
                            "{what}"
                        );
                        fb[0] = EMPTY_KEY;
                        fp[j] = EMPTY_KEY;
                        assert!(
                            !verify_columns_gpu(&gpu, bsub, &fb, psub, &fp, &mut st).unwrap(),
                            "{what} on the empty marker"
                        );
                    }
                }
            }
        }
    }

    /// NULL-equal distinctions on the device: (NULL, 'a') matches (NULL, 'a')
    /// only, never ('', 'a'), (0, 'a') or (NULL, NULL).
    #[test]
    fn gpu_composite_null_masks() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        use datafusion::arrow::array::Int64Array;
        let types = [DataType::Utf8, DataType::Int64, DataType::Utf8];
        let side = |s: Vec<Option<&str>>, i: Vec<Option<i64>>, t: Vec<Option<&str>>| {
            let cols: Vec<ArrayRef> =
                vec![Arc::new(StringArray::from(s)), Arc::new(Int64Array::from(i)), Arc::new(StringArray::from(t))];
            keys::encode(&[cols], &types, None, true).unwrap()
        };
        let b = side(
            vec![None, Some(""), Some("x"), None],
            vec![Some(1), Some(1), None, Some(0)],
            vec![Some("a"), Some("a"), Some("a"), None],
        );
        let p = side(
            vec![None, Some(""), Some("x"), Some("x"), None, None],
            vec![Some(1), Some(1), Some(0), None, Some(0), Some(0)],
            vec![Some("a"), Some("a"), Some("a"), Some("a"), Some("a"), None],
        );
        let (bs, ps) = (RowSubset::all(b.bytes.as_ref().unwrap()), RowSubset::all(p.bytes.as_ref().unwrap()));
        let mut st = TransferStats::default();
        assert_eq!(hash_columns_gpu(&gpu, ps, &mut st).unwrap(), hash_columns_cpu(ps));
        let got = select_subsets_gpu(&gpu, SetOp::Semi, bs, ps, &mut st).unwrap().unwrap();
        assert_eq!(got.iter().collect::<Vec<_>>(), vec![true, true, false, true, false, true]);
    }
}
