//! Multiset selection: which probe rows survive a semi/anti join or an
//! INTERSECT / EXCEPT [ALL] against a build side, on 64-bit keys.
//!
//! One signature, three implementations: [`select_cpu`] (the CPU twin),
//! and the GPU strategies in [`select_gpu`] (`hash`: kernels/hash_setops.cu,
//! `bitmap`: kernels/bitmap_setops.cu). The result is one bit per probe row,
//! LSB-first in 32-bit words, which is exactly Arrow's boolean buffer layout.
//!
//! Rules per distinct key with `m` probe copies and `n` build copies (seed 002):
//! semi keeps all m if n > 0; anti keeps all m if n == 0; INTERSECT ALL keeps
//! min(m, n); EXCEPT ALL keeps max(m - n, 0); INTERSECT / EXCEPT keep one copy.

use std::collections::HashMap;
use std::time::Instant;

use cudarc::driver::{CudaView, LaunchConfig, PushKernelArg};
use datafusion::arrow::buffer::{BooleanBuffer, Buffer};
use datafusion::error::{DataFusionError, Result};

use crate::gpu::{cuda_err, DeviceBuffer, Gpu, PendingBuffer, TransferStats};

/// The selection rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SetOp {
    Semi = 0,
    Anti = 1,
    IntersectDistinct = 2,
    IntersectAll = 3,
    ExceptDistinct = 4,
    ExceptAll = 5,
}

impl SetOp {
    pub fn name(&self) -> &'static str {
        match self {
            SetOp::Semi => "semi",
            SetOp::Anti => "anti",
            SetOp::IntersectDistinct => "intersect",
            SetOp::IntersectAll => "intersect all",
            SetOp::ExceptDistinct => "except",
            SetOp::ExceptAll => "except all",
        }
    }

    /// Does the rule need per-key multiplicities (not just presence)?
    pub fn needs_counts(&self) -> bool {
        !matches!(self, SetOp::Semi | SetOp::Anti)
    }
}

/// GPU strategy for [`select_gpu`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuStrategy {
    Hash,
    Bitmap,
    /// Radix sort + Balanced Path (src/algo/sort_setops.rs).
    Sort,
}

impl GpuStrategy {
    pub fn name(&self) -> &'static str {
        match self {
            GpuStrategy::Hash => "hash",
            GpuStrategy::Bitmap => "bitmap",
            GpuStrategy::Sort => "sort",
        }
    }
}

/// Convert bit words (LSB-first) to an Arrow boolean buffer of `len` bits.
pub fn words_to_bool(words: Vec<u32>, len: usize) -> BooleanBuffer {
    BooleanBuffer::new(Buffer::from_vec(words), 0, len)
}

/// CPU twin: same rules, a hash map of (build count, probe rank) per key.
pub fn select_cpu(op: SetOp, build: &[u64], probe: &[u64]) -> BooleanBuffer {
    select_cpu_chunks(op, &[build], &[probe])
}

/// Multiply-xorshift hasher for 64-bit keys: SipHash (std's default) costs
/// more than the whole probe on these tables.
#[derive(Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }
}

type KeyMap<V> = HashMap<u64, V, std::hash::BuildHasherDefault<KeyHasher>>;

/// The rules over one partition: `probe` yields (row, key) in row order;
/// `build_len` sizes the table up front.
fn select_serial(
    op: SetOp,
    build: impl Iterator<Item = u64>,
    build_len: usize,
    probe: impl Iterator<Item = (usize, u64)>,
    mut set: impl FnMut(usize),
) {
    match op {
        SetOp::Semi | SetOp::Anti => {
            let mut keys: std::collections::HashSet<u64, std::hash::BuildHasherDefault<KeyHasher>> =
                std::collections::HashSet::with_capacity_and_hasher(build_len, Default::default());
            keys.extend(build);
            let want = op == SetOp::Semi;
            for (i, k) in probe {
                if keys.contains(&k) == want {
                    set(i);
                }
            }
        }
        _ => {
            let mut counts: KeyMap<(u32, u32)> = KeyMap::with_capacity_and_hasher(build_len, Default::default());
            for k in build {
                counts.entry(k).or_default().0 += 1;
            }
            for (i, k) in probe {
                let e = counts.entry(k).or_default();
                let (n, r) = (e.0, e.1);
                e.1 += 1;
                let keep = match op {
                    SetOp::IntersectAll => r < n,
                    SetOp::IntersectDistinct => n > 0 && r == 0,
                    SetOp::ExceptAll => r >= n,
                    SetOp::ExceptDistinct => n == 0 && r == 0,
                    SetOp::Semi | SetOp::Anti => unreachable!(),
                };
                if keep {
                    set(i);
                }
            }
        }
    }
}

/// Radix partitions of the parallel CPU selection: many more than threads, so
/// each partition's table stays near the cache and the pool balances them.
const CPU_PART_BITS: u32 = 8;
/// Keys per partitioning task.
const CPU_PIECE: usize = 1 << 20;

/// Split chunks into pieces of at most [`CPU_PIECE`] keys, each with its first row.
fn pieces<'a>(chunks: &[&'a [u64]]) -> Vec<(usize, &'a [u64])> {
    let mut out = Vec::new();
    let mut at = 0;
    for c in chunks {
        for piece in c.chunks(CPU_PIECE) {
            out.push((at, piece));
            at += piece.len();
        }
    }
    out
}

/// [`select_cpu`] over keys given in chunks (read back to back), on the host
/// copy threads: every piece of keys is radix-partitioned by hash in parallel,
/// then each partition applies the rule on its own, reading its probe keys in
/// row order (piece by piece), which the ranks of the ALL rules need.
pub fn select_cpu_chunks(op: SetOp, build_chunks: &[&[u64]], probe_chunks: &[&[u64]]) -> BooleanBuffer {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicU32, Ordering};
    let probe_len: usize = probe_chunks.iter().map(|c| c.len()).sum();
    let build_len: usize = build_chunks.iter().map(|c| c.len()).sum();
    if crate::gpu::copy_threads() == 1 || probe_len + build_len < (1 << 16) {
        let mut words = vec![0u32; probe_len.div_ceil(32)];
        let build = build_chunks.iter().flat_map(|c| c.iter().copied());
        let probe = probe_chunks.iter().flat_map(|c| c.iter().copied()).enumerate();
        select_serial(op, build, build_len, probe, |i| words[i >> 5] |= 1 << (i & 31));
        return words_to_bool(words, probe_len);
    }
    let parts = 1usize << CPU_PART_BITS;
    let part = |k: u64| (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - CPU_PART_BITS)) as usize;
    let Ok(build_buckets): Result<Vec<Vec<Vec<u64>>>, Infallible> = crate::gpu::par_map(&pieces(build_chunks), 1, |(_, keys)| {
        let mut b: Vec<Vec<u64>> = (0..parts).map(|_| Vec::with_capacity(keys.len() / parts * 2)).collect();
        for &k in *keys {
            b[part(k)].push(k);
        }
        Ok(b)
    });
    // Probe rows are bucketed as 32-bit offsets into their piece (a piece holds
    // at most CPU_PIECE keys), not (row, key) pairs: 4 bytes a row instead of 16.
    // In a fresh process every scratch byte is a page fault first: on TPC-H SF10
    // (52M probe rows) the pairs cost ~600 MB of faults, ~0.15 s.
    let probe_pieces = pieces(probe_chunks);
    let Ok(probe_buckets): Result<Vec<Vec<Vec<u32>>>, Infallible> = crate::gpu::par_map(&probe_pieces, 1, |(_, keys)| {
        let mut b: Vec<Vec<u32>> = (0..parts).map(|_| Vec::with_capacity(keys.len() / parts * 2)).collect();
        for (j, &k) in keys.iter().enumerate() {
            b[part(k)].push(j as u32);
        }
        Ok(b)
    });
    let words: Vec<AtomicU32> = (0..probe_len.div_ceil(32)).map(|_| AtomicU32::new(0)).collect();
    let ids: Vec<usize> = (0..parts).collect();
    let Ok(_): Result<Vec<()>, Infallible> = crate::gpu::par_map(&ids, 1, |&p| {
        let n = build_buckets.iter().map(|b| b[p].len()).sum();
        let build = build_buckets.iter().flat_map(|b| b[p].iter().copied());
        let probe = probe_buckets
            .iter()
            .zip(&probe_pieces)
            .flat_map(|(b, (at, keys))| b[p].iter().map(move |&j| (at + j as usize, keys[j as usize])));
        select_serial(op, build, n, probe, |i| {
            words[i >> 5].fetch_or(1 << (i & 31), Ordering::Relaxed);
        });
        Ok(())
    });
    crate::gpu::drop_later((build_buckets, probe_buckets));
    words_to_bool(words.into_iter().map(AtomicU32::into_inner).collect(), probe_len)
}

/// Largest key domain (max - min + 1) the bitmap strategy accepts.
pub const BITMAP_MAX_RANGE: u64 = 1 << 32;

/// Device bytes a strategy needs for these inputs (used to plan partitions).
pub fn device_bytes(strategy: GpuStrategy, op: SetOp, nb: usize, np: usize, range: u64) -> usize {
    let keys = (nb + np) * 8 + np.div_ceil(32) * 4;
    match strategy {
        GpuStrategy::Hash => keys + hash_capacity(op, nb, np) * 16,
        // ALL forms may need counts (a repeated build key); DISTINCT forms two bitmaps.
        GpuStrategy::Bitmap if matches!(op, SetOp::IntersectAll | SetOp::ExceptAll) => keys + range as usize * 8,
        GpuStrategy::Bitmap if op.needs_counts() => keys + (range as usize).div_ceil(32) * 8,
        GpuStrategy::Bitmap => keys + (range as usize).div_ceil(32) * 4,
        GpuStrategy::Sort => keys + crate::algo::sort_setops::device_bytes_sorted(nb, np),
    }
}

fn hash_capacity(op: SetOp, nb: usize, np: usize) -> usize {
    hash_slots(distinct_bound(op, nb, np), false)
}

/// Rows that may insert a distinct key into the table (build rows; for
/// EXCEPT DISTINCT also probe rows, which insert to elect one copy).
fn distinct_bound(op: SetOp, nb: usize, np: usize) -> usize {
    if op == SetOp::ExceptDistinct { nb + np } else { nb }
}

/// Slots for at most `bound` distinct keys: u64 tables at load <= 1/2; u32
/// tables (`narrow`) at load <= 2/3 (their slots are half the size, so a
/// fuller table still touches fewer bytes than the u64 one).
fn hash_slots(bound: usize, narrow: bool) -> usize {
    let slots = if narrow { bound + bound / 2 } else { bound * 2 };
    slots.next_power_of_two().max(1024)
}

/// Passes of the hash build over a table of `bytes` (kernels/hash_setops.cu,
/// "Build in passes"): two for a table just past L2 (64 MiB at 10M keys; the
/// H100 has 50 MB), where each half's dirty working set fits; one otherwise,
/// since every pass re-reads the build keys (larger tables were not measured
/// with passes beyond the earlier whole-join experiment, which lost at 1 GiB).
fn build_passes(bytes: usize) -> u32 {
    if bytes > (32 << 20) && bytes <= (64 << 20) { 2 } else { 1 }
}

/// The domain [min, max] of both inputs, if any.
pub fn key_range(build: &[u64], probe: &[u64]) -> Option<(u64, u64)> {
    key_range_chunks(&[build, probe])
}

/// The union of two key domains.
fn merge_ranges(a: Option<(u64, u64)>, b: Option<(u64, u64)>) -> Option<(u64, u64)> {
    match (a, b) {
        (Some((l1, h1)), Some((l2, h2))) => Some((l1.min(l2), h1.max(h2))),
        (x, None) | (None, x) => x,
    }
}

/// [`key_range`] over several slices, scanned in parallel.
pub fn key_range_chunks(chunks: &[&[u64]]) -> Option<(u64, u64)> {
    let scan = |c: &[u64]| (!c.is_empty()).then(|| c.iter().fold((u64::MAX, 0u64), |(l, h), &k| (l.min(k), h.max(k))));
    let total: usize = chunks.iter().map(|c| c.len()).sum();
    let threads = crate::gpu::copy_threads();
    if total < (1 << 22) || threads == 1 {
        return chunks.iter().fold(None, |acc, c| merge_ranges(acc, scan(c)));
    }
    // Split every chunk into pieces so that threads get similar work.
    let piece = total.div_ceil(threads * 4);
    let pieces: Vec<&[u64]> = chunks.iter().flat_map(|c| c.chunks(piece.max(1))).collect();
    let per = pieces.len().div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = pieces.chunks(per.max(1)).map(|ps| s.spawn(move || ps.iter().fold(None, |acc, c| merge_ranges(acc, scan(c))))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).fold(None, merge_ranges)
    })
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
        crate::exec::trace("gpu: build keys uploaded");
        let (d_probe, rp) = gpu.upload_keys(probe, stats)?;
        let (nb, np): (usize, usize) = (build.iter().map(|c| c.len()).sum(), probe.iter().map(|c| c.len()).sum());
        Ok(Self { build: d_build, probe: d_probe, nb, np, range: merge_ranges(rb, rp) })
    }

    /// Keys that are already on the device (e.g. row hashes computed there).
    /// `range` is their domain when known; hashed keys pass None (hash strategy only).
    pub fn from_device(build: DeviceBuffer<u64>, nb: usize, probe: DeviceBuffer<u64>, np: usize, range: Option<(u64, u64)>) -> Self {
        Self { build, probe, nb, np, range }
    }

    /// The key domain [lo, hi] of both inputs (None when both are empty).
    pub fn range(&self) -> Option<(u64, u64)> {
        self.range
    }

    /// Run the kernels; returns one bit per probe row on the device.
    pub fn run(&self, gpu: &Gpu, strategy: GpuStrategy, op: SetOp, stats: &mut TransferStats) -> Result<DeviceBuffer<u32>> {
        let (nb, np) = (self.nb, self.np);
        let (d_build, d_probe) = (&self.build, &self.probe);
        if strategy == GpuStrategy::Sort {
            // Allocates its own output, synchronises and adds its kernel time.
            return crate::algo::sort_setops::run_sorted(gpu, op, d_build, nb, d_probe, np, self.range, stats);
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

/// Launch config of the hash kernels: one thread per row (their grid-stride
/// loops then run once): 0.808 ms against 0.845 ms with at most 32 blocks per
/// SM looping, for the 10M x 10M semi join on the H100.
fn rows_cfg(n: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (n.div_ceil(256).max(1) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

/// The build keys in an open-addressing table on the device
/// (kernels/hash_setops.cu), with per-slot build counts and probe counters
/// for the multiset rules. Built once, probed by any run of probe keys.
struct HashTable {
    table: DeviceBuffer<u8>,
    count_b: DeviceBuffer<u32>,
    ctr_a: DeviceBuffer<u32>,
    mask: u64,
    /// A u32 table of offsets from `lo` for keys in [lo, lo + span] (span
    /// below 2^32 - 1): half the bytes, more of it in L2. Probe keys outside
    /// it have no match.
    narrow: Option<(u64, u64)>,
}

impl HashTable {
    /// Queue the table's fill and build on the stream (no synchronisation).
    /// `range`: the build keys' domain, which must also hold every probe key
    /// for EXCEPT DISTINCT (its probe inserts keys).
    fn build(gpu: &Gpu, op: SetOp, d_build: &DeviceBuffer<u64>, nb: usize, np: usize, range: Option<(u64, u64)>) -> Result<Self> {
        let stream = gpu.stream();
        let nb64 = nb as u64;
        let narrow = range.filter(|(lo, hi)| hi - lo < u32::MAX as u64).map(|(lo, hi)| (lo, hi - lo));
        let width = if narrow.is_some() { 4 } else { 8 };
        let counted = op.needs_counts();
        let suffix = if narrow.is_some() { "_32" } else { "" };
        let cap = hash_slots(distinct_bound(op, nb, np), narrow.is_some());
        let mask = (cap - 1) as u64;
        let counted_len = if counted { cap + 1 } else { 1 };
        let count_b = gpu.alloc_zeros::<u32>(counted_len)?;
        let ctr_a = gpu.alloc_zeros::<u32>(counted_len)?;
        let null_counts: u64 = 0;
        // The table as raw bytes, in whole 16-byte words: the kernels see u32 or
        // u64 slots (cuMemAlloc aligns to 256).
        let words = ((cap + 1) * width).div_ceil(16);
        let table = gpu.alloc::<u8>(words * 16)?;
        let fill = gpu.function("hash_setops", "fill_empty")?;
        let build = gpu.function("hash_setops", &format!("build{suffix}"))?;
        let words64 = words as u64;
        // SAFETY: kernel signatures match kernels/hash_setops.cu; all buffers are sized as the kernels index them.
        unsafe { stream.launch_builder(&fill).arg(&table.slice).arg(&words64).launch(gpu.grid_stride(words, 32)) }
            .map_err(|e| cuda_err("fill_empty", e))?;
        let passes = build_passes(cap * width);
        for pass in 0..if nb > 0 { passes } else { 0 } {
            let mut l = stream.launch_builder(&build);
            l.arg(&d_build.slice).arg(&nb64);
            if let Some((lo, _)) = &narrow {
                l.arg(lo);
            }
            l.arg(&table.slice);
            if counted {
                l.arg(&count_b.slice);
            } else {
                l.arg(&null_counts); // presence is enough for semi/anti joins
            }
            l.arg(&mask).arg(&pass).arg(&passes);
            // SAFETY: as above.
            unsafe { l.launch(rows_cfg(nb)) }.map_err(|e| cuda_err("hash build", e))?;
        }
        Ok(Self { table, count_b, ctr_a, mask, narrow })
    }

    /// Queue the probe of `keys`: one bit per key into `out`, which starts at
    /// the word of the keys' first row (no synchronisation).
    fn probe(&self, gpu: &Gpu, op: SetOp, keys: &CudaView<'_, u64>, out: &CudaView<'_, u32>) -> Result<()> {
        let (n, n64, opi) = (keys.len(), keys.len() as u64, op as i32);
        let probe = gpu.function("hash_setops", if self.narrow.is_some() { "probe_32" } else { "probe" })?;
        let mut l = gpu.stream().launch_builder(&probe);
        l.arg(keys).arg(&n64);
        if let Some((lo, span)) = &self.narrow {
            l.arg(lo).arg(span);
        }
        l.arg(&self.table.slice);
        l.arg(&self.count_b.slice).arg(&self.ctr_a.slice).arg(&self.mask).arg(&opi).arg(out);
        // SAFETY: signature matches kernels/hash_setops.cu; `out` holds one bit per key of `keys`.
        unsafe { l.launch(rows_cfg(n)) }.map_err(|e| cuda_err("hash probe", e))?;
        Ok(())
    }
}

/// A build side on the device, ready to probe any run of probe keys (which
/// may lie outside its domain): bitmaps over a dense domain, or the hash table.
enum ProbeTable {
    /// Semi / anti joins: one presence bit per value of [lo, lo + range).
    Bits { bits: DeviceBuffer<u32>, lo: u64, range: u64 },
    /// INTERSECT [ALL] / EXCEPT [ALL] with build multiplicities 0 or 1 (the
    /// DISTINCT forms need no more): presence bits and, per value, a "seen"
    /// bit that gives each probe row its rank 0 or >= 1.
    Ranks { bits: DeviceBuffer<u32>, seen: DeviceBuffer<u32>, lo: u64, range: u64 },
    /// The ALL forms when a build key repeats: build counts and probe counters.
    Counts { count_b: DeviceBuffer<u32>, ctr_a: DeviceBuffer<u32>, lo: u64, range: u64 },
    Hash(HashTable),
}

impl ProbeTable {
    /// Build the table for `strategy` (Bitmap or Hash; a bitmap domain wider
    /// than [`BITMAP_MAX_RANGE`] is an error: [`pick_strategy`] never picks
    /// one). `range`: the build keys' domain; EXCEPT DISTINCT needs one holding
    /// every probe key too. The kernels are queued, not awaited, except that
    /// the ALL forms read whether a build key repeats.
    fn build(gpu: &Gpu, strategy: GpuStrategy, op: SetOp, d_build: &DeviceBuffer<u64>, nb: usize, np: usize, range: Option<(u64, u64)>) -> Result<Self> {
        let (lo, range) = match (strategy, range) {
            (GpuStrategy::Bitmap, Some((lo, hi))) if hi - lo < BITMAP_MAX_RANGE => (lo, hi - lo + 1),
            (GpuStrategy::Bitmap, Some((lo, hi))) => {
                return Err(DataFusionError::Plan(format!("bitmap strategy: key range {} too wide", (hi - lo).saturating_add(1))))
            }
            (GpuStrategy::Bitmap, None) => (0, 1),
            _ => return Ok(ProbeTable::Hash(HashTable::build(gpu, op, d_build, nb, np, range)?)),
        };
        let (stream, nb64, words) = (gpu.stream(), nb as u64, (range as usize).div_ceil(32));
        let bits = gpu.alloc_zeros::<u32>(words)?;
        if !op.needs_counts() {
            if nb > 0 {
                let f = gpu.function("bitmap_setops", "build_bits")?;
                // SAFETY: signature matches kernels/bitmap_setops.cu; the bitmap covers [lo, lo + range), which holds every build key.
                unsafe { stream.launch_builder(&f).arg(&d_build.slice).arg(&nb64).arg(&lo).arg(&bits.slice).launch(gpu.grid_stride(nb, 32)) }
                    .map_err(|e| cuda_err("bitmap build", e))?;
            }
            return Ok(ProbeTable::Bits { bits, lo, range });
        }
        // Multiset rules first try two bitmaps; counts only when a build key repeats.
        let dup = gpu.alloc_zeros::<u32>(1)?;
        if nb > 0 {
            let f = gpu.function("bitmap_setops", "build_bits_dup")?;
            // SAFETY: as above; `dup` holds one flag.
            unsafe { stream.launch_builder(&f).arg(&d_build.slice).arg(&nb64).arg(&lo).arg(&bits.slice).arg(&dup.slice).launch(gpu.grid_stride(nb, 32)) }
                .map_err(|e| cuda_err("bitmap build", e))?;
        }
        let all = matches!(op, SetOp::IntersectAll | SetOp::ExceptAll);
        if !all || gpu.read_one(&dup, 0, &mut TransferStats::default())? == 0 {
            return Ok(ProbeTable::Ranks { bits, seen: gpu.alloc_zeros::<u32>(words)?, lo, range });
        }
        drop(bits);
        let count_b = gpu.alloc_zeros::<u32>(range as usize)?;
        let ctr_a = gpu.alloc_zeros::<u32>(range as usize)?;
        let f = gpu.function("bitmap_setops", "build_counts")?;
        // SAFETY: as above; the count arrays cover [lo, lo + range).
        unsafe { stream.launch_builder(&f).arg(&d_build.slice).arg(&nb64).arg(&lo).arg(&count_b.slice).launch(gpu.grid_stride(nb, 32)) }
            .map_err(|e| cuda_err("bitmap build", e))?;
        Ok(ProbeTable::Counts { count_b, ctr_a, lo, range })
    }

    /// Queue the probe of `keys`: one bit per key into `out`, which starts at
    /// the word of the keys' first row. Probing runs in turn share the table's
    /// ranks and counters, so together they make one selection.
    fn probe(&self, gpu: &Gpu, op: SetOp, keys: &CudaView<'_, u64>, out: &CudaView<'_, u32>) -> Result<()> {
        let (stream, n64, opi) = (gpu.stream(), keys.len() as u64, op as i32);
        let cfg = gpu.grid_stride(keys.len(), 32);
        // SAFETY (each launch): signatures match kernels/bitmap_setops.cu; keys outside
        // [lo, lo + range) read nothing of the tables; `out` holds one bit per key.
        let launched = match self {
            ProbeTable::Hash(table) => return table.probe(gpu, op, keys, out),
            ProbeTable::Bits { bits, lo, range } => {
                let anti = (op == SetOp::Anti) as i32;
                let f = gpu.function("bitmap_setops", "probe_bits")?;
                unsafe { stream.launch_builder(&f).arg(keys).arg(&n64).arg(lo).arg(range).arg(&bits.slice).arg(&anti).arg(out).launch(cfg) }
            }
            ProbeTable::Ranks { bits, seen, lo, range } => {
                let f = gpu.function("bitmap_setops", "probe_ranks")?;
                unsafe {
                    stream.launch_builder(&f).arg(keys).arg(&n64).arg(lo).arg(range).arg(&bits.slice).arg(&seen.slice).arg(&opi).arg(out).launch(cfg)
                }
            }
            ProbeTable::Counts { count_b, ctr_a, lo, range } => {
                let f = gpu.function("bitmap_setops", "probe_counts")?;
                unsafe {
                    stream.launch_builder(&f).arg(keys).arg(&n64).arg(lo).arg(range).arg(&count_b.slice).arg(&ctr_a.slice).arg(&opi).arg(out).launch(cfg)
                }
            }
        };
        launched.map(|_| ()).map_err(|e| cuda_err("bitmap probe", e))
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
fn select_streamed(
    gpu: &Gpu,
    forced: Option<GpuStrategy>,
    op: SetOp,
    build: &[&[u64]],
    probe: &[&[u64]],
    stats: &mut TransferStats,
) -> Result<(DeviceBuffer<u64>, DeviceBuffer<u32>, GpuStrategy)> {
    let (nb, np) = (build.iter().map(|c| c.len()).sum::<usize>(), probe.iter().map(|c| c.len()).sum::<usize>());
    let (d_build, range) = gpu.upload_keys(build, stats)?;
    crate::exec::trace("gpu: build keys uploaded");
    let strategy = pick_strategy(gpu, forced, op, nb, np, range);
    let t = Instant::now();
    let table = ProbeTable::build(gpu, strategy, op, &d_build, nb, np, range)?;
    let out = gpu.alloc_zeros::<u32>(np.div_ceil(32))?;
    stats.kernel += t.elapsed();
    let (d_probe, _) = gpu.upload_keys_each(probe, stats, false, &mut |keys, first| {
        // Each fill's bits start a word of their own (fills are whole 65,536-key segments).
        if first % 32 != 0 {
            return Err(DataFusionError::Internal(format!("setfusion: upload fill starts at row {first}, not a word boundary")));
        }
        table.probe(gpu, op, keys, &out.slice.slice(first / 32..))
    })?;
    // Kernel time shown: what the last fill's probe adds after the uploads.
    let t = Instant::now();
    gpu.synchronize()?;
    stats.kernel += t.elapsed();
    drop((table, d_build));
    Ok((d_probe, out, strategy))
}

/// `auto` for `nb` build and `np` probe keys over the domain `range`: a bitmap
/// / direct-address table when the domain is dense enough that it is no
/// larger than a hash table and fits the budget.
fn choose_table(gpu: &Gpu, op: SetOp, nb: usize, np: usize, range: Option<(u64, u64)>) -> GpuStrategy {
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
fn pick_strategy(gpu: &Gpu, forced: Option<GpuStrategy>, op: SetOp, nb: usize, np: usize, range: Option<(u64, u64)>) -> GpuStrategy {
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
    if device_bytes(GpuStrategy::Hash, op, nb, np, 0) > gpu.budget().available() {
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
        crate::exec::trace("gpu: keys uploaded");
        let strategy = pick_strategy(gpu, forced, op, nb, np, resident.range);
        let out = resident.run(gpu, strategy, op, stats)?;
        (resident.probe, out, strategy)
    };
    crate::exec::trace("gpu: kernels done");
    // A large selection stays in the pinned memory its DMA lands in (little-endian
    // u32 words are Arrow's bitmap bytes): no host copy, no fresh pages to fault in.
    let words = np.div_ceil(32);
    let sel = if words >= (1 << 18) {
        BooleanBuffer::new(gpu.download_to_arrow(&out, words, stats)?.wait()?, 0, np)
    } else {
        words_to_bool(gpu.download(&out, words, stats)?, np)
    };
    crate::exec::trace("gpu: selection downloaded");
    // Kept keys only while the device can hold them a moment longer; else the host filters.
    let keys = if kept_keys { compact_kept_keys(gpu, &probe_keys, &out, np, stats).ok() } else { None };
    crate::exec::trace("gpu: kept keys downloaded");
    drop((out, probe_keys));
    let how = if streamed { ", probed per upload fill" } else { "" };
    Ok((sel, format!("gpu/{}{how}", strategy.name()), keys.map(|(b, _)| b)))
}

/// The keys of the selected rows, in row order, compacted on the device
/// (`kernels/transfer.cu`: count_kept, compact_kept) and on their way into
/// pinned memory that an Arrow buffer owns, with their number. `sel` holds
/// one bit per key of `keys` (n keys). CPU twin: [`compact_kept_keys_cpu`].
pub fn compact_kept_keys(
    gpu: &Gpu,
    keys: &DeviceBuffer<u64>,
    sel: &DeviceBuffer<u32>,
    n: usize,
    stats: &mut TransferStats,
) -> Result<(PendingBuffer, usize)> {
    const WORDS_PER_BLOCK: usize = 256; // SF_KEPT_WORDS
    let blocks = n.div_ceil(32).div_ceil(WORDS_PER_BLOCK).max(1);
    let n64 = n as u64;
    let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (WORDS_PER_BLOCK as u32, 1, 1), shared_mem_bytes: 0 };
    let t = Instant::now();
    let mut counts = gpu.alloc::<u32>(blocks)?;
    let count = gpu.function("transfer", "count_kept")?;
    // SAFETY: signature matches kernels/transfer.cu; `sel` holds ceil(n / 32) words, `counts` one per block.
    unsafe { gpu.stream().launch_builder(&count).arg(&sel.slice).arg(&n64).arg(&mut counts.slice).launch(cfg) }
        .map_err(|e| cuda_err("count_kept", e))?;
    let counts = gpu.download(&counts, blocks, stats)?;
    let mut offsets = Vec::with_capacity(blocks);
    let mut total = 0u64;
    for c in counts {
        offsets.push(total);
        total += c as u64;
    }
    let offsets = gpu.upload(&offsets, stats)?;
    let mut out = gpu.alloc::<u64>((total as usize).max(1))?;
    let compact = gpu.function("transfer", "compact_kept")?;
    // SAFETY: signature matches kernels/transfer.cu; `keys` holds n keys, `offsets` one per
    // block, and `out` the `total` kept keys the counts add up to.
    unsafe {
        gpu.stream().launch_builder(&compact).arg(&sel.slice).arg(&n64).arg(&keys.slice).arg(&offsets.slice).arg(&mut out.slice).launch(cfg)
    }
    .map_err(|e| cuda_err("compact_kept", e))?;
    stats.kernel += t.elapsed();
    Ok((gpu.download_to_arrow(&out, total as usize, stats)?, total as usize))
}

/// CPU twin of [`compact_kept_keys`]: the keys whose selection bit is set, in order.
pub fn compact_kept_keys_cpu(keys: &[u64], sel: &BooleanBuffer) -> Vec<u64> {
    sel.set_indices().map(|i| keys[i]).collect()
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
    let all: Vec<&[u64]> = build.iter().chain(probe.iter()).copied().collect();
    let range = key_range_chunks(&all).map(|(lo, hi)| hi - lo + 1).unwrap_or(1);
    let (nb, np) = (build.iter().map(|c| c.len()).sum::<usize>(), probe.iter().map(|c| c.len()).sum::<usize>());
    let need = device_bytes(strategy, op, nb, np, range);
    let avail = gpu.budget().available().max(1);
    if need <= avail {
        return Ok((select_gpu_chunks(gpu, strategy, op, build, probe, stats)?, 1));
    }
    let build = build.iter().flat_map(|c| c.iter());
    let probe = probe.iter().flat_map(|c| c.iter());
    // Partitions use the hash strategy (a bitmap's size is set by the range, not
    // the rows); twice the naive count leaves room for skew between partitions.
    let hash_need = device_bytes(GpuStrategy::Hash, op, nb, np, 0);
    let parts = (hash_need.div_ceil(avail) * 2).next_power_of_two().max(2);
    let part_of = |k: u64| (k.wrapping_mul(0x9E3779B97F4A7C15) >> 40) as usize & (parts - 1);
    let mut b_parts: Vec<Vec<u64>> = vec![Vec::new(); parts];
    for &k in build {
        b_parts[part_of(k)].push(k);
    }
    let mut p_parts: Vec<Vec<u64>> = vec![Vec::new(); parts];
    let mut p_rows: Vec<Vec<u32>> = vec![Vec::new(); parts];
    for (i, &k) in probe.enumerate() {
        let p = part_of(k);
        p_parts[p].push(k);
        p_rows[p].push(i as u32);
    }
    let mut words = vec![0u32; np.div_ceil(32)];
    for p in 0..parts {
        let sel = select_gpu(gpu, GpuStrategy::Hash, op, &b_parts[p], &p_parts[p], stats)?;
        for j in sel.set_indices() {
            let i = p_rows[p][j] as usize;
            words[i >> 5] |= 1 << (i & 31);
        }
    }
    Ok((words_to_bool(words, np), parts))
}

/// Doctor self-check: every op and strategy against the CPU twin on random keys with duplicates.
pub fn self_check(gpu: &Gpu) -> Result<String> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut checked = 0;
    // (build rows, probe rows, key domain, with the all-ones key): narrow domains
    // use the u32 table, wide ones (or the all-ones key) the u64 table.
    let cases = [(0usize, 100usize, 10u64, true), (1000, 0, 10, true), (5000, 7000, 3000, true), (5000, 7000, 3000, false), (4000, 7000, 9000, false),
        (60_000, 90_000, u32::MAX as u64, false), (100_000, 150_000, 1 << 40, true), (50_000, 50_000, 2, false),
        // Heavily repeated keys (30,000 copies of one) in a u64 table; and a u32 table of
        // 64 MiB, which the hash build fills in two passes.
        (600_000, 200_000, 1 << 40, true), (6_000_000, 1_000_000, 1 << 30, false)];
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
        for op in [SetOp::Semi, SetOp::Anti, SetOp::IntersectDistinct, SetOp::IntersectAll, SetOp::ExceptDistinct, SetOp::ExceptAll] {
            let want = select_cpu(op, &build, &probe);
            let range = key_range(&build, &probe).map_or(0, |(lo, hi)| hi - lo);
            let strategies: &[GpuStrategy] =
                if range < (1 << 24) { &[GpuStrategy::Hash, GpuStrategy::Bitmap, GpuStrategy::Sort] } else { &[GpuStrategy::Hash, GpuStrategy::Sort] };
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
                return Err(DataFusionError::Execution(format!("kept keys self-check failed: {n} rows, density {density}")));
            }
            compacted += 1;
        }
    }
    Ok(format!("{checked} op/strategy/input combinations and {compacted} kept-key compactions match the CPU twin"))
}

/// A selection as 32-bit words, bit i of word i / 32 = row i (the device layout).
fn bool_to_words(sel: &BooleanBuffer) -> Vec<u32> {
    let mut words = vec![0u32; sel.len().div_ceil(32)];
    for i in sel.set_indices() {
        words[i >> 5] |= 1 << (i & 31);
    }
    words
}

/// Two selections are equivalent if they keep the same multiset of keys (which
/// copy of equal keys is kept is immaterial: equal keys are equal rows).
pub fn same_multiset_selection(op: SetOp, probe: &[u64], a: &BooleanBuffer, b: &BooleanBuffer) -> bool {
    if !op.needs_counts() {
        return a == b;
    }
    let pick = |s: &BooleanBuffer| {
        let mut v: Vec<u64> = s.set_indices().map(|i| probe[i]).collect();
        v.sort_unstable();
        v
    };
    a.len() == b.len() && pick(a) == pick(b)
}

/// Test reference: the SQL multiset rules computed by counting (independent of
/// every backend's code path); the kept keys, sorted.
#[cfg(test)]
pub(crate) fn multiset_reference(op: SetOp, build: &[u64], probe: &[u64]) -> Vec<u64> {
    let mut nb: HashMap<u64, usize> = HashMap::new();
    for k in build {
        *nb.entry(*k).or_default() += 1;
    }
    let mut m: HashMap<u64, usize> = HashMap::new();
    for k in probe {
        *m.entry(*k).or_default() += 1;
    }
    let mut out = Vec::new();
    for (k, &mk) in &m {
        let n = nb.get(k).copied().unwrap_or(0);
        let copies = match op {
            SetOp::Semi => if n > 0 { mk } else { 0 },
            SetOp::Anti => if n == 0 { mk } else { 0 },
            SetOp::IntersectAll => mk.min(n),
            SetOp::ExceptAll => mk.saturating_sub(n),
            SetOp::IntersectDistinct => (n > 0) as usize,
            SetOp::ExceptDistinct => (n == 0) as usize,
        };
        out.extend(std::iter::repeat_n(*k, copies));
    }
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn reference(op: SetOp, build: &[u64], probe: &[u64]) -> Vec<u64> {
        multiset_reference(op, build, probe)
    }

    const OPS: [SetOp; 6] =
        [SetOp::Semi, SetOp::Anti, SetOp::IntersectDistinct, SetOp::IntersectAll, SetOp::ExceptDistinct, SetOp::ExceptAll];

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
                assert_eq!(kept(&probe, &select_cpu(op, &build, &probe)), reference(op, &build, &probe), "case {case} {op:?}");
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
                let got = select_gpu(&gpu, GpuStrategy::Hash, op, &build, &probe, &mut TransferStats::default()).unwrap();
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
                    let (got, ran, keys) = select_gpu_auto(&gpu, forced, op, &[&build], &chunks, true, &mut stats).unwrap();
                    let streamed = ran.ends_with("probed per upload fill");
                    assert_eq!(streamed, op != SetOp::ExceptDistinct, "case {case} {op:?} {forced:?}: {ran}");
                    assert_eq!(kept(&probe, &got), want, "case {case} {op:?} {forced:?} ({ran})");
                    // (EXCEPT DISTINCT may take the partitioned path here, which sends no keys back.)
                    assert!(keys.is_some() || !streamed, "case {case} {op:?} {forced:?}: no kept keys");
                    if let Some(keys) = keys {
                        let keys = keys.wait().unwrap();
                        let keys: &[u64] = keys.typed_data();
                        assert_eq!(keys, compact_kept_keys_cpu(&probe, &got).as_slice(), "case {case} {op:?} {forced:?}");
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
            let (got, parts) = select_gpu_partitioned(&gpu, GpuStrategy::Hash, op, &[&build], &[&probe], &mut TransferStats::default()).unwrap();
            assert!(parts > 1, "expected partitioning");
            assert_eq!(kept(&probe, &got), reference(op, &build, &probe), "{op:?}");
        }
    }
}
