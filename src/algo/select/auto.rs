//! The selection the operators call: upload once, choose the strategy from
//! the keys' domain and the device budget, stream the probe side through it
//! where the rule allows, and partition by key hash when the inputs do not
//! fit the budget.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use datafusion::arrow::buffer::BooleanBuffer;
use datafusion::error::{DataFusionError, Result};

use cudarc::driver::CudaView;

use super::bitmap::{BitmapTable, BITMAP_MAX_RANGE};
use super::cpu::{bucket_keys, pieces, Buckets, CPU_PIECE};
use super::hash::{hash_capacity, HashTable};
use super::{
    bool_to_words, key_range, key_range_chunks, merge_ranges, same_multiset_selection, select_cpu, words_to_bool,
    GpuStrategy, SetOp,
};
use crate::gpu::{
    compact_kept_keys, compact_kept_keys_cpu, reduce_kept, reduce_kept_cpu, DeviceBuffer, Gpu, PendingBuffer,
    TransferStats,
};
use crate::util::trace;

/// Device bytes a strategy needs for these inputs (used to plan partitions).
pub fn device_bytes(strategy: GpuStrategy, op: SetOp, nb: usize, np: usize, range: u64) -> usize {
    let keys = (nb + np) * 8 + np.div_ceil(32) * 4;
    match strategy {
        GpuStrategy::Hash => keys + hash_capacity(op, nb, np) * 16,
        // ALL forms may need counts (a repeated build key); the others one bitmap.
        GpuStrategy::Bitmap if matches!(op, SetOp::IntersectAll | SetOp::ExceptAll) => keys + range as usize * 8,
        GpuStrategy::Bitmap => keys + (range as usize).div_ceil(32) * 4,
        GpuStrategy::Sort => keys + super::sort::device_bytes_sorted(nb, np),
    }
}

/// GPU implementation: upload keys, build, probe, download one bit per probe row.
/// The caller holds the device lock. Errors (including the memory budget) are
/// returned, never panicked, so the caller can partition or fall back.
pub fn select_gpu(
    gpu: &Gpu,
    strategy: GpuStrategy,
    op: SetOp,
    build: &[u64],
    probe: &[u64],
    stats: &mut TransferStats,
) -> Result<BooleanBuffer> {
    select_gpu_chunks(gpu, strategy, op, &[build], &[probe], stats)
}

/// [`select_gpu`] over keys held in several slices (one per batch): they are
/// gathered straight into the pinned staging buffers, never concatenated.
pub fn select_gpu_chunks(
    gpu: &Gpu,
    strategy: GpuStrategy,
    op: SetOp,
    build: &[&[u64]],
    probe: &[&[u64]],
    stats: &mut TransferStats,
) -> Result<BooleanBuffer> {
    let np: usize = probe.iter().map(|c| c.len()).sum();
    if np == 0 {
        return Ok(BooleanBuffer::new_unset(0));
    }
    let resident = ResidentSelect::upload_chunks(gpu, build, probe, stats)?;
    let out = resident.run(gpu, strategy, op, stats)?;
    let words = gpu.download(&out, np.div_ceil(32), stats)?;
    Ok(words_to_bool(words, np))
}

/// Build and probe keys already on the device (benchmarks time `run` alone).
pub struct ResidentSelect {
    build: DeviceBuffer<u64>,
    probe: DeviceBuffer<u64>,
    nb: usize,
    np: usize,
    /// The key domain [lo, hi] of both inputs, if any keys.
    range: Option<(u64, u64)>,
}

impl ResidentSelect {
    pub fn upload(gpu: &Gpu, build: &[u64], probe: &[u64], stats: &mut TransferStats) -> Result<Self> {
        Self::upload_chunks(gpu, &[build], &[probe], stats)
    }

    /// Upload both sides, frame-of-reference packed in transit ([`Gpu::upload_keys`]);
    /// the key domain falls out of the packing.
    pub fn upload_chunks(gpu: &Gpu, build: &[&[u64]], probe: &[&[u64]], stats: &mut TransferStats) -> Result<Self> {
        let (d_build, rb) = gpu.upload_keys(build, stats)?;
        trace("gpu: build keys uploaded");
        let (d_probe, rp) = gpu.upload_keys(probe, stats)?;
        let (nb, np): (usize, usize) = (build.iter().map(|c| c.len()).sum(), probe.iter().map(|c| c.len()).sum());
        Ok(Self { build: d_build, probe: d_probe, nb, np, range: merge_ranges(rb, rp) })
    }

    /// Keys that are already on the device (e.g. row hashes computed there).
    /// `range` is their domain when known; hashed keys pass None (hash strategy only).
    pub fn from_device(
        build: DeviceBuffer<u64>,
        nb: usize,
        probe: DeviceBuffer<u64>,
        np: usize,
        range: Option<(u64, u64)>,
    ) -> Self {
        Self { build, probe, nb, np, range }
    }

    /// The key domain [lo, hi] of both inputs (None when both are empty).
    pub fn range(&self) -> Option<(u64, u64)> {
        self.range
    }

    /// Run the kernels; returns one bit per probe row on the device.
    pub fn run(
        &self,
        gpu: &Gpu,
        strategy: GpuStrategy,
        op: SetOp,
        stats: &mut TransferStats,
    ) -> Result<DeviceBuffer<u32>> {
        let (nb, np) = (self.nb, self.np);
        let (d_build, d_probe) = (&self.build, &self.probe);
        if strategy == GpuStrategy::Sort {
            // Allocates its own output, synchronises and adds its kernel time.
            return super::sort::run_sorted(gpu, op, d_build, nb, d_probe, np, self.range, stats);
        }
        let out = gpu.alloc_zeros::<u32>(np.div_ceil(32))?;
        let started = Instant::now();
        let table = ProbeTable::build(gpu, strategy, op, d_build, nb, np, self.range)?;
        table.probe(gpu, op, &d_probe.slice.slice(..), &out.slice.slice(..))?;
        gpu.synchronize()?;
        stats.kernel += started.elapsed();
        Ok(out)
    }
}

/// A build side on the device, ready to probe any run of probe keys (which
/// may lie outside its domain): bitmaps over a dense domain, or the hash table.
enum ProbeTable {
    Bitmap(BitmapTable),
    Hash(HashTable),
}

impl ProbeTable {
    /// Build the table for `strategy` (Bitmap or Hash; see [`BitmapTable::build`]).
    fn build(
        gpu: &Gpu,
        strategy: GpuStrategy,
        op: SetOp,
        d_build: &DeviceBuffer<u64>,
        nb: usize,
        np: usize,
        range: Option<(u64, u64)>,
    ) -> Result<Self> {
        Ok(match strategy {
            GpuStrategy::Bitmap => ProbeTable::Bitmap(BitmapTable::build(gpu, op, d_build, nb, range)?),
            _ => ProbeTable::Hash(HashTable::build(gpu, op, d_build, nb, np, range)?),
        })
    }

    /// Queue the probe of `keys`: one bit per key into `out`, which starts at
    /// the word of the keys' first row. Probing runs in turn share the table's
    /// ranks and counters, so together they make one selection.
    fn probe(&self, gpu: &Gpu, op: SetOp, keys: &CudaView<'_, u64>, out: &CudaView<'_, u32>) -> Result<()> {
        match self {
            ProbeTable::Bitmap(t) => t.probe(gpu, op, keys, out),
            ProbeTable::Hash(t) => t.probe(gpu, op, keys, out),
        }
    }

    /// Queue the probe of one upload fill, rows `first..` (see
    /// [`Gpu::upload_keys_each`]), into the selection words `out` of all rows.
    fn probe_fill(
        &self,
        gpu: &Gpu,
        op: SetOp,
        keys: &CudaView<'_, u64>,
        first: usize,
        out: &DeviceBuffer<u32>,
    ) -> Result<()> {
        // Each fill's bits start a word of their own (fills are whole 65,536-key segments).
        if first % 32 != 0 {
            return Err(DataFusionError::Internal(format!(
                "setfusion: upload fill starts at row {first}, not a word boundary"
            )));
        }
        self.probe(gpu, op, keys, &out.slice.slice(first / 32..))
    }
}

/// Every rule but EXCEPT DISTINCT with the probe side streamed: the build
/// keys upload first, and their table (chosen from the build side alone: a
/// probe key outside its domain has no match) is built while the first probe
/// fill is packed; each probe fill is probed as soon as its decode is queued,
/// so the kernels run behind the host's packing of the next fill instead of
/// after the last one. (EXCEPT DISTINCT elects one copy of every probe key
/// outside the build side, which needs the probe side's domain first.)
/// Returns the probe keys, the selection words on the device (synchronised)
/// and the strategy.
pub(super) fn select_streamed(
    gpu: &Gpu,
    forced: Option<GpuStrategy>,
    op: SetOp,
    build: &[&[u64]],
    probe: &[&[u64]],
    stats: &mut TransferStats,
) -> Result<(DeviceBuffer<u64>, DeviceBuffer<u32>, GpuStrategy)> {
    let (nb, np) = (build.iter().map(|c| c.len()).sum::<usize>(), probe.iter().map(|c| c.len()).sum::<usize>());
    let (d_build, range) = gpu.upload_keys(build, stats)?;
    trace("gpu: build keys uploaded");
    let strategy = pick_strategy(gpu, forced, op, nb, np, range);
    let t = Instant::now();
    let table = ProbeTable::build(gpu, strategy, op, &d_build, nb, np, range)?;
    let out = gpu.alloc_zeros::<u32>(np.div_ceil(32))?;
    stats.kernel += t.elapsed();
    let (d_probe, _) =
        gpu.upload_keys_each(probe, stats, false, &mut |keys, first| table.probe_fill(gpu, op, keys, first, &out))?;
    // Kernel time shown: what the last fill's probe adds after the uploads.
    let t = Instant::now();
    gpu.synchronize()?;
    stats.kernel += t.elapsed();
    drop((table, d_build));
    Ok((d_probe, out, strategy))
}

/// Both sides streamed through bitmap tables over `range` (the build keys'
/// domain; EXCEPT DISTINCT's covers the probe keys too, and `covers_probe`
/// says whether every probe key lies within it: see [`over_budget_domain`]),
/// when their keys do not fit the device budget: no key stays on the
/// device, and nothing is partitioned on the host. Each fill's selection words
/// go back to pinned host memory as soon as the fill is probed, so the device
/// holds the tables and the fills alone. When the table of the whole domain
/// does not fit either, the domain is cut into `slices` (see
/// [`bitmap_slices`]) and each pass streams both sides again over one slice
/// (the build kernels skip keys outside it): a row's key lies in exactly one
/// slice, and in every other pass it counts as absent from the build side, so
/// the rules that keep absent keys (anti join, EXCEPT ALL) AND the passes'
/// selections and the others OR them. None when an ALL rule meets a repeated
/// build key (those need counts per value: the caller partitions instead).
#[allow(clippy::too_many_arguments)]
fn select_streamed_bitmap(
    gpu: &Gpu,
    op: SetOp,
    build: &[&[u64]],
    probe: &[&[u64]],
    (lo, hi): (u64, u64),
    covers_probe: bool,
    slices: u64,
    stats: &mut TransferStats,
) -> Result<Option<BooleanBuffer>> {
    let np: usize = probe.iter().map(|c| c.len()).sum();
    let words = np.div_ceil(32);
    let width = hi - lo + 1;
    let per = width.div_ceil(slices);
    let keeps_absent = matches!(op, SetOp::Anti | SetOp::ExceptAll);
    // Every build key lies in [lo, hi]: its fills travel as low words alone.
    let narrow = width <= 1 << 31;
    let mut acc: Option<crate::gpu::HostOut> = None;
    for s in 0..slices {
        let (s_lo, s_width) = (lo + s * per, per.min(width - s * per));
        let t = Instant::now();
        let bitmap = BitmapTable::empty(gpu, op, s_lo, s_width)?;
        let dup = gpu.alloc_zeros::<u32>(1)?;
        stats.kernel += t.elapsed();
        gpu.stream_keys(build, narrow, stats, &mut |keys, _| bitmap.add_build(gpu, keys, &dup))?;
        bitmap.seal(gpu, op)?;
        trace("gpu: build keys streamed into the bitmap");
        if matches!(op, SetOp::IntersectAll | SetOp::ExceptAll) && gpu.read_one(&dup, 0, stats)? != 0 {
            return Ok(None);
        }
        let mut host = gpu.host_output(words * 4)?;
        {
            let dst = host.as_mut_slice()?;
            // Two fills' selection words on the device, in turn: the probe of a fill
            // is queued after the download of the fill two before (one stream).
            let mut ring: Vec<DeviceBuffer<u32>> = Vec::new();
            let mut fill = 0usize;
            gpu.stream_keys(probe, narrow && covers_probe, stats, &mut |keys, first| {
                if first % 32 != 0 {
                    return Err(DataFusionError::Internal(format!(
                        "setfusion: upload fill starts at row {first}, not a word boundary"
                    )));
                }
                let n = keys.len().div_ceil(32);
                if ring.len() < 2 {
                    ring.push(gpu.alloc::<u32>(n)?);
                }
                let out = &ring[fill % 2];
                fill += 1;
                if out.len() < n {
                    return Err(DataFusionError::Internal("setfusion: a fill larger than the first".into()));
                }
                bitmap.probe(gpu, op, keys, &out.slice.slice(..n))?;
                let at = first / 32 * 4;
                // SAFETY: `dst` is pinned (host_output) and read only after the synchronisation below.
                unsafe { gpu.download_async_into(out, n, &mut dst[at..at + n * 4]) }
            })?;
            let t = Instant::now();
            gpu.synchronize()?;
            stats.kernel += t.elapsed();
            stats.bytes_to_host += words * 4;
        }
        trace("gpu: probe keys streamed through the bitmap");
        drop(bitmap);
        acc = Some(match acc {
            None => host,
            Some(mut a) => {
                combine_words(a.as_mut_slice()?, host.as_mut_slice()?, keeps_absent);
                a
            }
        });
    }
    let Some(acc) = acc else { return Ok(Some(BooleanBuffer::new_unset(np))) };
    Ok(Some(BooleanBuffer::new(acc.into_buffer(words * 4)?, 0, np)))
}

/// `acc` AND `next` (`and`) or `acc` OR `next`, word by word on the copy
/// threads, in pieces of at least 1 MiB.
pub(super) fn combine_words<T>(acc: &mut [T], next: &[T], and: bool)
where
    T: Copy + Send + Sync + std::ops::BitAnd<Output = T> + std::ops::BitOr<Output = T>,
{
    let per = acc.len().div_ceil(crate::host::copy_threads()).max((1 << 20) / std::mem::size_of::<T>().max(1));
    let mut pieces: Vec<&mut [T]> = acc.chunks_mut(per).collect();
    crate::host::for_each_mut(&mut pieces, &|i, piece| {
        let from = &next[i * per..i * per + piece.len()];
        for (a, b) in piece.iter_mut().zip(from) {
            *a = if and { *a & *b } else { *a | *b };
        }
    });
}

/// Most passes [`select_streamed_bitmap`] makes over the inputs: each streams
/// both sides again, so beyond this the hash partitions cost less.
const MAX_BITMAP_SLICES: u64 = 8;

/// The fewest slices of a domain of `width` values whose streamed tables fit
/// `avail` bytes with two fills of the smallest size beside them; None beyond
/// [`MAX_BITMAP_SLICES`].
fn bitmap_slices(width: u64, avail: usize) -> Option<u64> {
    let mut slices = 1u64;
    while BitmapTable::streamed_bytes(width.div_ceil(slices)) + (8 << 20) > avail {
        slices *= 2;
        if slices > MAX_BITMAP_SLICES {
            return None;
        }
    }
    Some(slices)
}

/// The domain a streamed bitmap needs (see [`select_streamed_bitmap`]), found
/// on the host, and whether the probe keys lie within it. The build keys'
/// alone: probe keys outside it are absent from the build side, which the
/// kernels see by their range checks, and this pass over the keys is the
/// largest host cost over the budget (23 ms of a 72 ms NOT IN of 100M x 100M
/// over both sides). An empty build side gets a one-value domain. EXCEPT
/// DISTINCT ranks the probe keys the build side lacks, so its domain is both
/// sides'.
fn over_budget_domain(op: SetOp, build: &[&[u64]], probe: &[&[u64]]) -> (Option<(u64, u64)>, bool) {
    if op == SetOp::ExceptDistinct {
        let all: Vec<&[u64]> = build.iter().chain(probe.iter()).copied().collect();
        return (key_range_chunks(&all), true);
    }
    (key_range_chunks(build).or(Some((0, 0))), false)
}

/// One bit per probe row back from the device. A large selection stays in the
/// pinned memory its DMA lands in (little-endian u32 words are Arrow's bitmap
/// bytes): no host copy, no fresh pages to fault in.
fn download_selection(
    gpu: &Gpu,
    out: &DeviceBuffer<u32>,
    np: usize,
    stats: &mut TransferStats,
) -> Result<BooleanBuffer> {
    let words = np.div_ceil(32);
    Ok(if words >= (1 << 18) {
        BooleanBuffer::new(gpu.download_to_arrow(out, words, stats)?.wait()?, 0, np)
    } else {
        words_to_bool(gpu.download(out, words, stats)?, np)
    })
}

/// `auto` for `nb` build and `np` probe keys over the domain `range`: a bitmap
/// / direct-address table when the domain is dense enough that it is no
/// larger than a hash table and fits the budget.
pub(super) fn choose_table(gpu: &Gpu, op: SetOp, nb: usize, np: usize, range: Option<(u64, u64)>) -> GpuStrategy {
    let Some((lo, hi)) = range else { return GpuStrategy::Hash };
    let range = hi.wrapping_sub(lo).saturating_add(1);
    if range > BITMAP_MAX_RANGE {
        return GpuStrategy::Hash;
    }
    let bitmap = device_bytes(GpuStrategy::Bitmap, op, nb, np, range);
    let hash = device_bytes(GpuStrategy::Hash, op, nb, np, range);
    let keys = (nb + np) * 8;
    if bitmap <= hash && bitmap - keys <= gpu.budget().available() {
        GpuStrategy::Bitmap
    } else {
        GpuStrategy::Hash
    }
}

/// The strategy `forced`, or chosen by [`choose_table`]; a forced bitmap on a
/// domain too wide for one falls back to the hash table.
pub(super) fn pick_strategy(
    gpu: &Gpu,
    forced: Option<GpuStrategy>,
    op: SetOp,
    nb: usize,
    np: usize,
    range: Option<(u64, u64)>,
) -> GpuStrategy {
    match forced {
        Some(GpuStrategy::Bitmap) if range.is_none_or(|(lo, hi)| hi - lo >= BITMAP_MAX_RANGE) => GpuStrategy::Hash,
        Some(s) => s,
        None => choose_table(gpu, op, nb, np, range),
    }
}

/// The GPU path used by the operators: upload once, pick the strategy
/// ([`pick_strategy`]), run (probing each upload fill as it lands where the
/// rule allows: [`select_streamed`]), download one bit per probe row. Inputs that do not fit the memory budget are hash-partitioned.
/// Returns the selection and a description of what ran (for EXPLAIN ANALYZE).
///
/// With `kept_keys`, the probe keys of the selected rows also come back (in
/// row order, in pinned memory an Arrow buffer owns: see [`compact_kept_keys`])
/// when the keys stayed on the device in one piece; None otherwise.
pub fn select_gpu_auto(
    gpu: &Gpu,
    forced: Option<GpuStrategy>,
    op: SetOp,
    build: &[&[u64]],
    probe: &[&[u64]],
    kept_keys: bool,
    stats: &mut TransferStats,
) -> Result<(BooleanBuffer, String, Option<PendingBuffer>)> {
    let (nb, np) = (build.iter().map(|c| c.len()).sum::<usize>(), probe.iter().map(|c| c.len()).sum::<usize>());
    if np == 0 {
        return Ok((BooleanBuffer::new_unset(0), "gpu (empty input)".into(), None));
    }
    let avail = gpu.budget().available();
    if device_bytes(GpuStrategy::Hash, op, nb, np, 0) > avail {
        // Over the budget: a dense domain streams both sides through one bitmap
        // (the keys never stay on the device); otherwise hash partitions.
        let (range, covers_probe) = over_budget_domain(op, build, probe);
        trace("gpu: over the budget, the build keys' domain found on the host");
        let bitmap_ok = matches!(forced, None | Some(GpuStrategy::Bitmap));
        if let Some((lo, hi)) = range.filter(|(lo, hi)| bitmap_ok && hi - lo < BITMAP_MAX_RANGE) {
            if let Some(slices) = bitmap_slices(hi - lo + 1, avail) {
                if let Some(sel) = select_streamed_bitmap(gpu, op, build, probe, (lo, hi), covers_probe, slices, stats)?
                {
                    let passes = if slices > 1 {
                        format!(", in {slices} passes over slices of the domain")
                    } else {
                        String::new()
                    };
                    return Ok((
                        sel,
                        format!("gpu/bitmap, both sides streamed (keys over the device budget){passes}"),
                        None,
                    ));
                }
            }
        }
        let (sel, parts) = select_gpu_partitioned(gpu, GpuStrategy::Hash, op, build, probe, stats)?;
        return Ok((sel, format!("gpu/hash in {parts} partitions"), None));
    }
    // Probe each fill as it lands, except where every probe key must be on the
    // device first (EXCEPT DISTINCT, the sort strategy).
    let streamed = op != SetOp::ExceptDistinct && nb > 0 && forced != Some(GpuStrategy::Sort);
    let (probe_keys, out, strategy) = if streamed {
        select_streamed(gpu, forced, op, build, probe, stats)?
    } else {
        let resident = ResidentSelect::upload_chunks(gpu, build, probe, stats)?;
        trace("gpu: keys uploaded");
        let strategy = pick_strategy(gpu, forced, op, nb, np, resident.range);
        let out = resident.run(gpu, strategy, op, stats)?;
        (resident.probe, out, strategy)
    };
    trace("gpu: kernels done");
    let sel = download_selection(gpu, &out, np, stats)?;
    trace("gpu: selection downloaded");
    // Kept keys only while the device can hold them a moment longer; else the host filters.
    let keys = if kept_keys { compact_kept_keys(gpu, &probe_keys, &out, np, stats).ok() } else { None };
    trace("gpu: kept keys downloaded");
    drop((out, probe_keys));
    let how = if streamed { ", probed per upload fill" } else { "" };
    Ok((sel, format!("gpu/{}{how}", strategy.name()), keys.map(|(b, _)| b)))
}

/// The selection over keys already on the device (the device Parquet scan's
/// decoded keys, or uploaded ones): their domain reduced on the device, the
/// strategy picked as [`select_gpu_auto`] picks it, one bit per probe row
/// downloaded; the same bits stay on the device too (None for no probe row),
/// for work on the kept rows there. Keys over the device budget are an error
/// (out of memory): the caller takes the host path, which partitions.
pub fn select_resident(
    gpu: &Gpu,
    forced: Option<GpuStrategy>,
    op: SetOp,
    build: DeviceBuffer<u64>,
    nb: usize,
    probe: DeviceBuffer<u64>,
    np: usize,
    stats: &mut TransferStats,
) -> Result<(BooleanBuffer, Option<DeviceBuffer<u32>>, String)> {
    if np == 0 {
        return Ok((BooleanBuffer::new_unset(0), None, "gpu (empty input)".into()));
    }
    let range = |keys: &DeviceBuffer<u64>, n: usize, stats: &mut TransferStats| -> Result<Option<(u64, u64)>> {
        if n == 0 {
            return Ok(None);
        }
        crate::gpu::gpu_min_max(gpu, keys, n, stats).map(Some)
    };
    let range = merge_ranges(range(&build, nb, stats)?, range(&probe, np, stats)?);
    let strategy = pick_strategy(gpu, forced, op, nb, np, range);
    let needed = device_bytes(strategy, op, nb, np, range.map_or(0, |(lo, hi)| hi.wrapping_sub(lo).saturating_add(1)));
    // The keys are already charged to the budget; the rest must fit.
    let available = gpu.budget().available() + (nb + np) * 8;
    if needed > available {
        return Err(crate::gpu::GpuError::OverBudget {
            what: format!("device-resident keys, gpu/{}", strategy.name()),
            need: needed,
            available,
        }
        .into());
    }
    let resident = ResidentSelect::from_device(build, nb, probe, np, range);
    let out = resident.run(gpu, strategy, op, stats)?;
    let sel = download_selection(gpu, &out, np, stats)?;
    Ok((sel, Some(out), format!("gpu/{}", strategy.name())))
}

/// Run [`select_gpu`] in key-hash partitions small enough for the budget.
/// Equal keys always land in the same partition, so every rule stays exact.
pub fn select_gpu_partitioned(
    gpu: &Gpu,
    strategy: GpuStrategy,
    op: SetOp,
    build: &[&[u64]],
    probe: &[&[u64]],
    stats: &mut TransferStats,
) -> Result<(BooleanBuffer, usize)> {
    partitioned_by(gpu, strategy, op, build, probe, 0, stats)
}

/// [`select_gpu_partitioned`] at recursion `level`: each level partitions on
/// other bits of the key's hash, so a partition that skew left over the
/// budget splits again instead of landing whole in one sub-partition.
fn partitioned_by(
    gpu: &Gpu,
    strategy: GpuStrategy,
    op: SetOp,
    build: &[&[u64]],
    probe: &[&[u64]],
    level: u32,
    stats: &mut TransferStats,
) -> Result<(BooleanBuffer, usize)> {
    let all: Vec<&[u64]> = build.iter().chain(probe.iter()).copied().collect();
    let range = key_range_chunks(&all).map(|(lo, hi)| hi - lo + 1).unwrap_or(1);
    let (nb, np) = (build.iter().map(|c| c.len()).sum::<usize>(), probe.iter().map(|c| c.len()).sum::<usize>());
    let need = device_bytes(strategy, op, nb, np, range);
    let avail = gpu.budget().available().max(1);
    if need <= avail {
        return Ok((select_gpu_chunks(gpu, strategy, op, build, probe, stats)?, 1));
    }
    // Partitions use the hash strategy (a bitmap's size is set by the range,
    // not the rows). The fewest partitions (a power of two) whose share, with
    // 1/8 more for skew, fits: computed rather than divided, since each
    // partition's table rounds its slots up to a power of two. Every partition
    // has a fixed cost (its uploads, launches and the mapping back): 100M x
    // 100M sparse keys under a 160 MB budget took ~9 ms a partition in 128
    // partitions when the count was twice the bytes' quotient.
    let share = |n: usize, parts: usize| n.div_ceil(parts) + n.div_ceil(parts) / 8;
    let mut parts = 2usize;
    while parts < (1 << 16) && device_bytes(GpuStrategy::Hash, op, share(nb, parts), share(np, parts), 0) > avail {
        parts *= 2;
    }
    let shift = 40 - 16 * level.min(2);
    let part_of = |k: u64| (k.wrapping_mul(0x9E3779B97F4A7C15) >> shift) as usize & (parts - 1);
    let split = KeySplit::new(build, probe, parts, part_of);
    trace("gpu: keys partitioned on the host");
    let words: Vec<AtomicU32> = (0..np.div_ceil(32)).map(|_| AtomicU32::new(0)).collect();
    let mut total = 0;
    for p in 0..parts {
        let (b_chunks, p_chunks) = split.part(p);
        let (sel, n) = match select_gpu_chunks(gpu, GpuStrategy::Hash, op, &b_chunks, &p_chunks, stats) {
            // Skew: this partition alone is over the budget; split it on other hash bits.
            Err(e) if level < 2 && crate::gpu::is_out_of_memory(&e) => {
                partitioned_by(gpu, GpuStrategy::Hash, op, &b_chunks, &p_chunks, level + 1, stats)?
            }
            other => (other?, 1),
        };
        total += n;
        split.mark_selected(p, &sel, &words);
    }
    crate::host::drop_later(split.into_buckets());
    Ok((words_to_bool(words.into_iter().map(AtomicU32::into_inner).collect(), np), total))
}

/// Both sides' keys split into partitions by a function of the key, in one
/// pass over each side on the host threads: every piece of keys splits into
/// its partitions (probe rows as 32-bit offsets into their piece). A
/// partition's keys are then its buckets of every piece, in order, uploaded
/// as they are (never concatenated). Equal keys share a partition, so every
/// rule, the ALL rules' ranks included, stays exact within it.
struct KeySplit<'a> {
    build_buckets: Vec<Buckets<u64>>,
    probe_pieces: Vec<(usize, &'a [u64])>,
    /// Per probe piece: each partition's keys and their offsets in the piece.
    probe_buckets: Vec<(Buckets<u64>, Buckets<u32>)>,
}

impl<'a> KeySplit<'a> {
    fn new(build: &[&[u64]], probe: &[&'a [u64]], parts: usize, part_of: impl Fn(u64) -> usize + Sync) -> Self {
        let build_buckets = bucket_keys(&pieces(build, CPU_PIECE), parts, &part_of);
        let probe_pieces = pieces(probe, CPU_PIECE);
        let Ok(probe_buckets): Result<Vec<(Buckets<u64>, Buckets<u32>)>, Infallible> =
            crate::host::par_map(&probe_pieces, 1, |(_, keys)| Ok(Buckets::with_offsets(keys, parts, &part_of)));
        Self { build_buckets, probe_pieces, probe_buckets }
    }

    /// Partition `p`'s build and probe keys, as chunks.
    fn part(&self, p: usize) -> (Vec<&[u64]>, Vec<&[u64]>) {
        let b = self.build_buckets.iter().map(|b| &b[p]).collect();
        let k = self.probe_buckets.iter().map(|(k, _)| &k[p]).collect();
        (b, k)
    }

    /// Set in `words` the probe rows that partition `p`'s selection `sel`
    /// keeps, piece by piece on the host threads.
    fn mark_selected(&self, p: usize, sel: &BooleanBuffer, words: &[AtomicU32]) {
        let starts: Vec<usize> = self
            .probe_buckets
            .iter()
            .scan(0, |at, (k, _)| {
                let s = *at;
                *at += k[p].len();
                Some(s)
            })
            .collect();
        let ids: Vec<usize> = (0..self.probe_pieces.len()).collect();
        let Ok(_): Result<Vec<()>, Infallible> = crate::host::par_map(&ids, 1, |&i| {
            let first_row = self.probe_pieces[i].0;
            for (j, &off) in self.probe_buckets[i].1[p].iter().enumerate() {
                if sel.value(starts[i] + j) {
                    let row = first_row + off as usize;
                    words[row >> 5].fetch_or(1 << (row & 31), Ordering::Relaxed);
                }
            }
            Ok(())
        });
    }

    /// The buckets, for dropping off the query's path.
    fn into_buckets(self) -> (Vec<Buckets<u64>>, Vec<(Buckets<u64>, Buckets<u32>)>) {
        (self.build_buckets, self.probe_buckets)
    }
}

/// Several devices, the general way (see [`super::devices`] for the others):
/// the keys split by hash into one
/// partition per entry of `gpus`, and each device selects its partitions
/// with [`select_gpu_auto`] (which streams or partitions again within its own
/// budget) on its own thread, all devices at once; the rows map back through
/// the same split. Equal keys meet on one device, so every rule stays exact.
/// An entry repeated in `gpus` (the same device twice) runs its partitions
/// one after the other. The caller holds every device. Returns the selection
/// and what ran on each partition.
pub(super) fn select_gpus_by_key(
    gpus: &[&Gpu],
    forced: Option<GpuStrategy>,
    op: SetOp,
    build: &[&[u64]],
    probe: &[&[u64]],
    stats: &mut TransferStats,
) -> Result<(BooleanBuffer, String)> {
    let np = probe.iter().map(|c| c.len()).sum::<usize>();
    let parts = gpus.len().max(1);
    // The high 32 bits of a multiplicative hash, scaled to the partition count.
    let part_of = |k: u64| (((k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) * parts as u64) >> 32) as usize;
    let split = KeySplit::new(build, probe, parts, part_of);
    trace("gpu: keys split across the devices");
    let words: Vec<AtomicU32> = (0..np.div_ceil(32)).map(|_| AtomicU32::new(0)).collect();
    // One thread per distinct device, running that device's partitions in turn.
    let mut devices: Vec<usize> = gpus.iter().map(|g| g.info().ordinal).collect();
    devices.sort_unstable();
    devices.dedup();
    let results: Vec<Result<(Vec<String>, TransferStats)>> = crate::host::scope(|s| {
        let handles: Vec<_> = devices
            .iter()
            .map(|&d| {
                let (split, words) = (&split, &words);
                s.spawn(&format!("device-{d}"), move || {
                    let mut st = TransferStats::default();
                    let mut ran = Vec::new();
                    for (p, g) in gpus.iter().enumerate().filter(|(_, g)| g.info().ordinal == d) {
                        let (b_chunks, p_chunks) = split.part(p);
                        let (sel, how, _) = select_gpu_auto(g, forced, op, &b_chunks, &p_chunks, false, &mut st)?;
                        trace(&format!("gpu {d}: partition {p} selected"));
                        split.mark_selected(p, &sel, words);
                        trace(&format!("gpu {d}: partition {p} rows marked"));
                        let n = p_chunks.iter().map(|c| c.len()).sum::<usize>()
                            + b_chunks.iter().map(|c| c.len()).sum::<usize>();
                        ran.push(format!("device {d} partition {p} ({n} keys): {how}"));
                    }
                    Ok((ran, st))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
    });
    let mut ran = Vec::new();
    for r in results {
        let (r, st) = r?;
        ran.extend(r);
        stats.add(&st);
    }
    crate::host::drop_later(split.into_buckets());
    ran.sort();
    Ok((
        words_to_bool(words.into_iter().map(AtomicU32::into_inner).collect(), np),
        format!("gpu on {} device(s), {parts} key partitions [{}]", devices.len(), ran.join("; ")),
    ))
}

/// Doctor self-check: every op and strategy against the CPU twin on random keys with duplicates.
pub fn self_check(gpu: &Gpu) -> Result<String> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut checked = 0;
    // (build rows, probe rows, key domain, with the all-ones key): narrow domains
    // use the u32 table, wide ones (or the all-ones key) the u64 table.
    let cases = [
        (0usize, 100usize, 10u64, true),
        (1000, 0, 10, true),
        (5000, 7000, 3000, true),
        (5000, 7000, 3000, false),
        (4000, 7000, 9000, false),
        (60_000, 90_000, u32::MAX as u64, false),
        (100_000, 150_000, 1 << 40, true),
        (50_000, 50_000, 2, false),
        // Heavily repeated keys (30,000 copies of one) in a u64 table; and a u32 table of
        // 64 MiB, which the hash build fills in two passes.
        (600_000, 200_000, 1 << 40, true),
        (6_000_000, 1_000_000, 1 << 30, false),
    ];
    for &(nb, np, domain, marker) in &cases {
        let mut build: Vec<u64> = (0..nb).map(|_| 1000 + rng.random_range(0..domain)).collect();
        if nb == 4000 {
            // Distinct build keys: the bitmap ALL forms run on two bitmaps instead of counts.
            build.sort_unstable();
            build.dedup();
        }
        if nb == 600_000 {
            build[..30_000].fill(1234);
        }
        let mut probe: Vec<u64> = (0..np).map(|_| 1000 + rng.random_range(0..domain)).collect();
        if np > 3 && marker {
            probe[0] = u64::MAX; // the hash table's empty marker must still work as a key
            if nb > 3 {
                build[1] = u64::MAX;
            }
        }
        for op in [
            SetOp::Semi,
            SetOp::Anti,
            SetOp::IntersectDistinct,
            SetOp::IntersectAll,
            SetOp::ExceptDistinct,
            SetOp::ExceptAll,
        ] {
            let want = select_cpu(op, &build, &probe);
            let range = key_range(&build, &probe).map_or(0, |(lo, hi)| hi - lo);
            let strategies: &[GpuStrategy] = if range < (1 << 24) {
                &[GpuStrategy::Hash, GpuStrategy::Bitmap, GpuStrategy::Sort]
            } else {
                &[GpuStrategy::Hash, GpuStrategy::Sort]
            };
            for &s in strategies {
                let got = select_gpu(gpu, s, op, &build, &probe, &mut TransferStats::default())?;
                if !same_multiset_selection(op, &probe, &want, &got) {
                    return Err(DataFusionError::Execution(format!(
                        "setops self-check failed: {} / {} on {nb} x {np} keys",
                        op.name(),
                        s.name()
                    )));
                }
                checked += 1;
            }
        }
    }
    // The kept keys' return trip: row counts around word and block edges, densities 0 to 1.
    let mut compacted = 0;
    for n in [1usize, 31, 32, 33, 8191, 8192, 8193, 100_003, 3_000_001] {
        for density in [0.0, 0.01, 0.5, 1.0] {
            let keys: Vec<u64> = (0..n).map(|_| rng.random()).collect();
            let sel = BooleanBuffer::from_iter((0..n).map(|_| rng.random_bool(density)));
            let words = bool_to_words(&sel);
            let mut stats = TransferStats::default();
            let (d_keys, d_sel) = (gpu.upload(&keys, &mut stats)?, gpu.upload(&words, &mut stats)?);
            let (got, count) = compact_kept_keys(gpu, &d_keys, &d_sel, n, &mut stats)?;
            let got = got.wait()?;
            let want = compact_kept_keys_cpu(&keys, &sel);
            if count != want.len() || got.typed_data::<u64>()[..count] != want[..] {
                return Err(DataFusionError::Execution(format!(
                    "kept keys self-check failed: {n} rows, density {density}"
                )));
            }
            compacted += 1;
        }
    }
    // The kept rows' aggregates: with and without a validity, extreme values (the sum wraps).
    let mut reduced = 0;
    for n in [0usize, 1, 33, 8193, 1_000_003] {
        for (density, with_valid) in [(0.0, false), (0.3, true), (1.0, false), (1.0, true)] {
            let values: Vec<i64> = (0..n)
                .map(|i| match i % 97 {
                    0 => i64::MAX,
                    1 => i64::MIN,
                    _ => rng.random_range(-1_000_000_000_000i64..1_000_000_000_000),
                })
                .collect();
            let sel = BooleanBuffer::from_iter((0..n).map(|_| rng.random_bool(density)));
            let valid = with_valid.then(|| BooleanBuffer::from_iter((0..n).map(|_| rng.random_bool(0.8))));
            let mut stats = TransferStats::default();
            let lanes: Vec<u64> = values.iter().map(|&v| v as u64).collect();
            let d_values = gpu.upload(if n == 0 { &[0u64][..] } else { &lanes }, &mut stats)?;
            // (A device buffer holds one word at least.)
            let words = |b: &BooleanBuffer| if n == 0 { vec![0u32] } else { bool_to_words(b) };
            let d_sel = gpu.upload(&words(&sel), &mut stats)?;
            let d_valid = match &valid {
                Some(v) => Some(gpu.upload(&words(v), &mut stats)?),
                None => None,
            };
            let got = reduce_kept(gpu, &d_values, d_valid.as_ref(), &d_sel, n, &mut stats)?;
            let want = reduce_kept_cpu(&values, valid.as_ref(), &sel);
            if got != want {
                return Err(DataFusionError::Execution(format!(
                    "kept rows' aggregates self-check failed: {n} rows, density {density}: {got:?}, want {want:?}"
                )));
            }
            reduced += 1;
        }
    }
    Ok(format!(
        "{checked} op/strategy/input combinations, {compacted} kept-key compactions and {reduced} kept-row \
         reductions match the CPU twin"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::select::{multiset_reference, select_cpu_chunks};
    use rand::{Rng, SeedableRng};

    fn reference(op: SetOp, build: &[u64], probe: &[u64]) -> Vec<u64> {
        multiset_reference(op, build, probe)
    }

    const OPS: [SetOp; 6] = [
        SetOp::Semi,
        SetOp::Anti,
        SetOp::IntersectDistinct,
        SetOp::IntersectAll,
        SetOp::ExceptDistinct,
        SetOp::ExceptAll,
    ];

    fn kept(probe: &[u64], sel: &BooleanBuffer) -> Vec<u64> {
        let mut v: Vec<u64> = sel.set_indices().map(|i| probe[i]).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn cpu_twin_matches_multiset_reference() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for case in 0..300 {
            let (nb, np) = (rng.random_range(0..200), rng.random_range(0..200));
            let domain = rng.random_range(1..50u64);
            let build: Vec<u64> = (0..nb).map(|_| rng.random_range(0..domain)).collect();
            let probe: Vec<u64> = (0..np).map(|_| rng.random_range(0..domain)).collect();
            for op in OPS {
                assert_eq!(
                    kept(&probe, &select_cpu(op, &build, &probe)),
                    reference(op, &build, &probe),
                    "case {case} {op:?}"
                );
            }
        }
    }

    #[test]
    fn cpu_twin_partitioned_path_matches_reference() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let build: Vec<u64> = (0..70_000).map(|_| rng.random_range(0..30_000u64)).collect();
        let probe: Vec<u64> = (0..90_000).map(|_| rng.random_range(0..30_000u64)).collect();
        for op in OPS {
            // Several chunks, as the operators pass them (one per batch).
            let sel = select_cpu_chunks(op, &[&build[..5000], &build[5000..]], &[&probe[..123], &probe[123..]]);
            assert_eq!(kept(&probe, &sel), reference(op, &build, &probe), "{op:?}");
        }
    }

    #[test]
    fn gpu_matches_cpu_twin() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        for case in 0..60 {
            let (nb, np) = (rng.random_range(0..3000), rng.random_range(0..3000));
            let domain = if case % 3 == 0 { u64::MAX } else { rng.random_range(1..500u64) };
            let mut build: Vec<u64> = (0..nb).map(|_| rng.random_range(0..domain)).collect();
            let probe: Vec<u64> = (0..np).map(|_| rng.random_range(0..domain)).collect();
            if case % 5 == 0 && np > 0 {
                build.push(u64::MAX);
                build.push(probe[0]);
            }
            let mut probe = probe;
            if case % 7 == 0 {
                probe.push(u64::MAX); // the table's empty marker as a probe key, present in build or not
            }
            for op in OPS {
                let want = reference(op, &build, &probe);
                for s in [GpuStrategy::Hash, GpuStrategy::Bitmap, GpuStrategy::Sort] {
                    let range = key_range(&build, &probe).map_or(0, |(lo, hi)| hi - lo);
                    if s == GpuStrategy::Bitmap && range >= BITMAP_MAX_RANGE {
                        continue;
                    }
                    let got = select_gpu(&gpu, s, op, &build, &probe, &mut TransferStats::default()).unwrap();
                    assert_eq!(kept(&probe, &got), want, "case {case} {op:?} {s:?}");
                }
            }
        }
    }

    #[test]
    fn gpu_u32_table_domain_edges() {
        // Domains of exactly 2^32 - 1 values (widest u32 table: offset 0xfffffffe)
        // and 2^32 values (first u64 one), with keys at both ends.
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        for span in [u32::MAX as u64 - 1, u32::MAX as u64] {
            let lo = 1u64 << 40;
            let build = vec![lo, lo + span, lo + 5, lo + span, lo + 77];
            let probe = vec![lo + span, lo, lo + 6, lo + span, lo + span, lo + 77, lo + span - 1];
            for op in OPS {
                let want = reference(op, &build, &probe);
                let got =
                    select_gpu(&gpu, GpuStrategy::Hash, op, &build, &probe, &mut TransferStats::default()).unwrap();
                assert_eq!(kept(&probe, &got), want, "span {span} {op:?}");
            }
        }
    }

    #[test]
    fn gpu_streamed_probe_matches_cpu_twin() {
        // Every rule but EXCEPT DISTINCT probes each upload fill as it lands, on
        // a table built from the build side's domain alone: probe keys below it,
        // far above it, and exactly 2^32 above its minimum (the same u32 offset
        // as the minimum in a narrow table) lie outside it. A small budget makes
        // fills of 65,536 keys, so the probe side spans several (and the ranks
        // and counters of the multiset rules carry from fill to fill).
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let gpu = gpu.lease(8 << 20);
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let lo = 1u64 << 40;
        for case in 0..6 {
            // Domains for a bitmap, a u32 hash table, a u64 hash table; build keys
            // repeated (bitmap counts) or distinct (bitmap ranks).
            let width = [50_000, 3_000_000_000u64, 6_000_000_000][case % 3];
            let nb = rng.random_range(1..20_000);
            let build: Vec<u64> = if case < 3 {
                (0..nb).map(|_| lo + rng.random_range(0..width)).collect()
            } else {
                (0..nb as u64).map(|i| lo + i * (width / nb as u64)).collect()
            };
            let np = 400_000 + rng.random_range(0..1000);
            let probe: Vec<u64> = (0..np)
                .map(|i| match i % 9 {
                    0 => lo + (1 << 32) + rng.random_range(0..width),
                    1 => lo - 1 - rng.random_range(0..width),
                    2 | 5 => build[rng.random_range(0..nb)],
                    3 => u64::MAX - rng.random_range(0..3),
                    _ => lo + rng.random_range(0..width),
                })
                .collect();
            // Several slices, as the operators pass them (one per batch).
            let chunks: Vec<&[u64]> = probe.chunks(70_001).collect();
            for op in OPS {
                let want = reference(op, &build, &probe);
                // (A forced bitmap of the wider domains would not fit the budget.)
                let forced_bitmap = (case % 3 == 0).then_some(Some(GpuStrategy::Bitmap));
                for forced in [None, Some(GpuStrategy::Hash)].into_iter().chain(forced_bitmap) {
                    let mut stats = TransferStats::default();
                    let (got, ran, keys) =
                        select_gpu_auto(&gpu, forced, op, &[&build], &chunks, true, &mut stats).unwrap();
                    let streamed = ran.ends_with("probed per upload fill");
                    assert_eq!(streamed, op != SetOp::ExceptDistinct, "case {case} {op:?} {forced:?}: {ran}");
                    assert_eq!(kept(&probe, &got), want, "case {case} {op:?} {forced:?} ({ran})");
                    // (EXCEPT DISTINCT may take the partitioned path here, which sends no keys back.)
                    assert!(keys.is_some() || !streamed, "case {case} {op:?} {forced:?}: no kept keys");
                    if let Some(keys) = keys {
                        let keys = keys.wait().unwrap();
                        let keys: &[u64] = keys.typed_data();
                        assert_eq!(
                            keys,
                            compact_kept_keys_cpu(&probe, &got).as_slice(),
                            "case {case} {op:?} {forced:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn gpu_partitions_when_over_budget() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let gpu = gpu.lease(4 << 20); // 4 MiB: forces several partitions
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let build: Vec<u64> = (0..200_000).map(|_| rng.random_range(0..100_000u64)).collect();
        let probe: Vec<u64> = (0..300_000).map(|_| rng.random_range(0..100_000u64)).collect();
        for op in OPS {
            let (got, parts) = select_gpu_partitioned(
                &gpu,
                GpuStrategy::Hash,
                op,
                &[&build],
                &[&probe],
                &mut TransferStats::default(),
            )
            .unwrap();
            assert!(parts > 1, "expected partitioning");
            assert_eq!(kept(&probe, &got), reference(op, &build, &probe), "{op:?}");
        }
    }

    /// Keys that all hash to the first partition at the first level: that
    /// partition is over the budget, splits again on other hash bits, and
    /// every rule stays exact.
    #[test]
    fn gpu_skewed_partition_splits_again() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let gpu = gpu.lease(4 << 20);
        // The inverse of the partitioning multiplier mod 2^64 (Newton's iteration).
        const C: u64 = 0x9E3779B97F4A7C15;
        let mut inv: u64 = C;
        for _ in 0..6 {
            inv = inv.wrapping_mul(2u64.wrapping_sub(C.wrapping_mul(inv)));
        }
        assert_eq!(C.wrapping_mul(inv), 1);
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        // Hashes with bits 40..56 clear: partition 0 at level 0 for any count up to 2^16.
        let pool: Vec<u64> =
            (0..150_000).map(|_| (rng.random::<u64>() & !(0xFFFFu64 << 40)).wrapping_mul(inv)).collect();
        let build: Vec<u64> = (0..200_000).map(|_| pool[rng.random_range(0..pool.len())]).collect();
        let probe: Vec<u64> = (0..300_000).map(|_| pool[rng.random_range(0..pool.len())]).collect();
        for op in OPS {
            let (got, parts) = select_gpu_partitioned(
                &gpu,
                GpuStrategy::Hash,
                op,
                &[&build],
                &[&probe],
                &mut TransferStats::default(),
            )
            .unwrap();
            assert!(parts > 2, "{op:?}: the skewed partition was not split again ({parts} partitions)");
            assert_eq!(kept(&probe, &got), reference(op, &build, &probe), "{op:?}");
        }
    }

    #[test]
    fn key_split_across_devices_keeps_every_rule() {
        // setfusion.devices = '0,0' / '0,0,0': the split runs on one GPU, each
        // partition in turn (the stand-in where only one GPU is present).
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let g = gpu.lease(0);
        let mut rng = rand::rngs::StdRng::seed_from_u64(17);
        let n = 300_000usize;
        let build: Vec<u64> = (0..n).map(|_| 7 + rng.random_range(0..n as u64)).collect();
        let probe: Vec<u64> = (0..n + 999).map(|_| 7 + rng.random_range(0..n as u64 * 2)).collect();
        let sparse: (Vec<u64>, Vec<u64>) = (
            build.iter().map(|k| k.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect(),
            probe.iter().map(|k| k.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect(),
        );
        let empty: Vec<u64> = Vec::new();
        let cases: [(&str, &[u64], &[u64]); 4] = [
            ("dense", &build, &probe),
            ("sparse", &sparse.0, &sparse.1),
            ("empty build", &empty, &probe),
            ("empty probe", &build, &empty),
        ];
        for (what, build, probe) in cases {
            let (b1, b2) = build.split_at(build.len() / 3);
            let (p1, p2) = probe.split_at(probe.len() / 2);
            for devices in [2, 3] {
                let gpus: Vec<&Gpu> = (0..devices).map(|_| &*g).collect();
                for op in OPS {
                    let (got, ran) =
                        select_gpus_by_key(&gpus, None, op, &[b1, b2], &[p1, p2], &mut TransferStats::default())
                            .unwrap();
                    assert_eq!(got.len(), probe.len(), "{what} {op:?}");
                    assert!(ran.contains(&format!("{devices} key partitions")), "{what} {op:?}: ran {ran}");
                    assert_eq!(
                        kept(probe, &got),
                        reference(op, build, probe),
                        "{what} {op:?} on {devices} partitions: ran {ran}"
                    );
                }
            }
        }
    }

    /// Over the budget with a table of the whole domain too large as well:
    /// both sides stream once per slice of the domain, the selections of the
    /// passes combined (AND for the rules that keep absent keys, else OR);
    /// probe keys repeat and fall outside the build side's domain.
    #[test]
    fn gpu_streamed_bitmap_slices_the_domain() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let gpu = gpu.lease(10 << 20);
        let mut rng = rand::rngs::StdRng::seed_from_u64(31);
        let lo = 5_000u64;
        let build: Vec<u64> = (0..200_000u64).map(|i| lo + i * 300).collect();
        let probe: Vec<u64> = (0..300_000)
            .map(|i| match i % 4 {
                0 => build[rng.random_range(0..build.len())],
                1 => lo - rng.random_range(0..lo),
                _ => lo + rng.random_range(0..60_000_000),
            })
            .collect();
        let (p1, p2) = probe.split_at(123_457);
        for op in OPS {
            let (got, ran, _) =
                select_gpu_auto(&gpu, None, op, &[&build], &[p1, p2], false, &mut TransferStats::default()).unwrap();
            assert!(ran.contains("passes over slices"), "{op:?}: ran {ran}");
            assert_eq!(kept(&probe, &got), reference(op, &build, &probe), "{op:?}: ran {ran}");
        }
    }

    /// The multiset rules stream through one bitmap, as the semi / anti
    /// joins do: a budget that holds one bitmap of the domain (not two) makes
    /// one pass over both sides; duplicates on the probe side keep their rank
    /// rules, and probe keys outside the build keys' domain (the table's
    /// domain but for EXCEPT DISTINCT) are absent. An empty build side too.
    #[test]
    fn gpu_streamed_multiset_rules_take_one_bitmap() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let gpu = gpu.lease(16 << 20);
        let mut rng = rand::rngs::StdRng::seed_from_u64(47);
        let lo = 1_000u64;
        let build: Vec<u64> = (0..1_000_000u64).map(|i| lo + i * 50).collect();
        let probe: Vec<u64> = (0..1_500_000)
            .map(|i| match i % 3 {
                0 => build[rng.random_range(0..build.len())],
                1 => build[rng.random_range(0..1_000)],
                _ => rng.random_range(0..lo + 52_000_000),
            })
            .collect();
        let (p1, p2) = probe.split_at(700_001);
        for op in OPS {
            let (got, ran, _) =
                select_gpu_auto(&gpu, None, op, &[&build], &[p1, p2], false, &mut TransferStats::default()).unwrap();
            assert!(ran.contains("streamed") && !ran.contains("passes"), "{op:?}: ran {ran}");
            assert_eq!(kept(&probe, &got), reference(op, &build, &probe), "{op:?}: ran {ran}");
        }
        // An empty build side over the budget: a one-value table, every rule exact.
        let many: Vec<u64> = (0..2_500_000u64).map(|i| i % 1_000_003).collect();
        for op in OPS {
            let (got, ran, _) =
                select_gpu_auto(&gpu, None, op, &[], &[&many], false, &mut TransferStats::default()).unwrap();
            assert_eq!(kept(&many, &got), reference(op, &[], &many), "{op:?} (empty build): ran {ran}");
        }
    }

    /// Over the budget on a dense domain, `auto` streams both sides through a
    /// bitmap (no key stays on the device) and is exact; an ALL rule with a
    /// repeated build key, a sparse domain or a forced hash table partition
    /// instead. Sides come in several chunks; fills are small (16 MiB budget).
    #[test]
    fn gpu_over_budget_streams_or_partitions() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let gpu = gpu.lease(16 << 20);
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let n = 1_500_000usize;
        let distinct_build: Vec<u64> = (0..(n - 1000) as u64).map(|i| 7 + i * 3).collect();
        let repeated_build: Vec<u64> = (0..n).map(|_| 7 + rng.random_range(0..3 * n as u64)).collect();
        let probe: Vec<u64> = (0..n + 12_345).map(|_| 7 + rng.random_range(0..3 * n as u64)).collect();
        let sparse_probe: Vec<u64> = probe.iter().map(|k| k.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
        let sparse_build: Vec<u64> = distinct_build.iter().map(|k| k.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
        let cases: [(&str, &[u64], &[u64], Option<GpuStrategy>); 4] = [
            ("dense, distinct build", &distinct_build, &probe, None),
            ("dense, repeated build", &repeated_build, &probe, None),
            ("sparse", &sparse_build, &sparse_probe, None),
            ("forced hash", &distinct_build, &probe, Some(GpuStrategy::Hash)),
        ];
        for (what, build, probe, forced) in cases {
            let (b1, b2) = build.split_at(build.len() / 3);
            let (p1, p2) = probe.split_at(probe.len() / 2 + 5);
            for op in OPS {
                let (got, ran, _) =
                    select_gpu_auto(&gpu, forced, op, &[b1, b2], &[p1, p2], false, &mut TransferStats::default())
                        .unwrap();
                let repeated_all = what.contains("repeated") && matches!(op, SetOp::IntersectAll | SetOp::ExceptAll);
                let want_streamed = forced.is_none() && what.starts_with("dense") && !repeated_all;
                assert_eq!(ran.contains("streamed"), want_streamed, "{what} {op:?}: ran {ran}");
                assert_eq!(kept(probe, &got), reference(op, build, probe), "{what} {op:?}: ran {ran}");
            }
        }
    }
}
