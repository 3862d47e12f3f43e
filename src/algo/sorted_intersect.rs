//! Sorted-list intersection on the device (kernels/sorted_intersect.cu).
//!
//! * Two sorted sets (strictly increasing keys), seed 003 / seed 002 Merge
//!   Path without duplicates: [`intersect_count_cpu`] is the CPU twin
//!   (two-pointer merge); [`intersect_count_gpu`] runs the kernels on
//!   device-resident inputs, so it can be benchmarked without PCIe in the way.
//! * The rows of `sorted_intersect(a, b)` (ascending lists with duplicates,
//!   min(m, n) copies): [`gtwj_segmented`], seed 003's GTWJ sequence
//!   skipping per row, called by [`crate::algo::multiset::list_op_gpu`]; its
//!   CPU twin is [`sorted_intersect`] row by row
//!   ([`crate::algo::multiset::list_op_cpu`]).
//! * [`sorted_intersect`] itself, the CPU twin (merge or galloping, and
//!   [`sorted_intersect_sequences`], GTWJ on the host), used by the list
//!   functions and `intersect_k` in [`crate::algo::multiset`], which imports
//!   this module. GTWJ runs on [`crate::algo::segmented`]'s plumbing, so
//!   this module does not import multiset (issue 29: no import cycles).

use std::cmp::Ordering;
use std::time::Instant;

use cudarc::driver::{LaunchConfig, PushKernelArg};
use datafusion::error::Result;

use crate::algo::segmented::{count_then_fill, exclusive_scan, DeviceListPair, ListKey, RowItems, SegmentedResult};
use crate::gpu::{cuda_err, DeviceBuffer, Gpu, TransferStats};

/// How [`sorted_intersect_with`] walks the two lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntersectMethod {
    /// Galloping when one list is [`GALLOP_RATIO`] times longer, else a merge.
    Auto,
    /// Two-pointer merge: O(|a| + |b|).
    Merge,
    /// Exponential search in the longer list for each run of the shorter:
    /// O(|small| log(|large| / |small|)).
    Gallop,
}

/// Size ratio from which galloping beats the linear merge: a galloping step
/// costs about 2 log2(gap) comparisons against the merge's gap, so it wins
/// once the average gap is well above ~8 (the usual threshold in SvS codes).
pub const GALLOP_RATIO: usize = 16;

/// Intersection of two ascending lists (duplicates allowed; a value with m
/// and n copies appears min(m, n) times). Inputs are NOT sorted here: an
/// unsorted input gives an unspecified (but panic-free) result; the SQL
/// function checks the order first.
pub fn sorted_intersect<T: Ord + Clone>(a: &[T], b: &[T]) -> Vec<T> {
    sorted_intersect_with(IntersectMethod::Auto, a, b)
}

/// [`sorted_intersect`] with a chosen method (all give the same result).
pub fn sorted_intersect_with<T: Ord + Clone>(method: IntersectMethod, a: &[T], b: &[T]) -> Vec<T> {
    let (small, large) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    let gallop = match method {
        IntersectMethod::Auto => small.len().saturating_mul(GALLOP_RATIO) < large.len(),
        IntersectMethod::Merge => false,
        IntersectMethod::Gallop => true,
    };
    let mut out = Vec::new();
    if gallop {
        gallop_intersect_into(small, large, &mut out);
    } else {
        merge_intersect_into(a, b, &mut out);
    }
    out
}

/// Two-pointer merge intersection (min(m, n) rule), appended to `out`.
fn merge_intersect_into<T: Ord + Clone>(a: &[T], b: &[T], out: &mut Vec<T>) {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            Ordering::Less => i += 1,
            Ordering::Greater => j += 1,
            Ordering::Equal => {
                out.push(a[i].clone());
                i += 1;
                j += 1;
            }
        }
    }
}

/// The first index in `v[from..]` whose element is not `pred`-true, found by
/// exponential then binary search (`pred` must be true on a prefix of `v`).
/// Costs O(log d) for an answer d places after `from`.
fn gallop<T>(v: &[T], from: usize, pred: impl Fn(&T) -> bool) -> usize {
    let mut lo = from;
    let mut step = 1;
    // Invariant: pred holds on v[from..lo].
    while lo + step <= v.len() && pred(&v[lo + step - 1]) {
        lo += step;
        step *= 2;
    }
    let hi = (lo + step).min(v.len());
    lo + v[lo..hi].partition_point(pred)
}

/// Galloping intersection: for each run of equal values in `small`, gallop in
/// `large` to the run's lower and upper bound (the run in `large` starts at or
/// after the previous one, so searches start from the cursor).
fn gallop_intersect_into<T: Ord + Clone>(small: &[T], large: &[T], out: &mut Vec<T>) {
    let (mut i, mut j) = (0, 0);
    while i < small.len() && j < large.len() {
        let x = &small[i];
        let run_end = i + small[i..].partition_point(|y| y == x);
        j = gallop(large, j, |y| y < x);
        let other_end = gallop(large, j, |y| y == x);
        let copies = (run_end - i).min(other_end - j);
        out.extend(std::iter::repeat_n(x, copies).cloned());
        i = run_end;
        j = other_end;
    }
}

/// Integer keys that can be grouped into GTWJ sequences (seed 003).
pub trait SequenceKey: Ord + Copy {
    /// floor(self / val): monotone in `self`, so a sorted list's sequence ids
    /// are non-decreasing and every sequence is one contiguous run.
    fn sequence_id(self, val: u64) -> i128;
}

impl SequenceKey for i64 {
    fn sequence_id(self, val: u64) -> i128 {
        (self as i128).div_euclid(val as i128)
    }
}

impl SequenceKey for u64 {
    fn sequence_id(self, val: u64) -> i128 {
        (self / val) as i128
    }
}

impl SequenceKey for u32 {
    fn sequence_id(self, val: u64) -> i128 {
        (self as u64 / val) as i128
    }
}

/// GTWJ sequence index of an ascending list: (sequence id, start, end) of each
/// non-empty sequence [id·val, (id+1)·val), in order.
pub fn sequence_index<T: SequenceKey>(v: &[T], val: u64) -> Vec<(i128, usize, usize)> {
    let val = val.max(1);
    let mut index: Vec<(i128, usize, usize)> = Vec::new();
    for (k, x) in v.iter().enumerate() {
        let id = x.sequence_id(val);
        match index.last_mut() {
            Some(last) if last.0 == id => last.2 = k + 1,
            _ => index.push((id, k, k + 1)),
        }
    }
    index
}

/// [`sorted_intersect`] by GTWJ sequence skipping (seed 003): both lists are
/// cut into sequences of width `val` (SeqID = x / val); only sequences with the
/// same id in both lists are merged, the others are skipped by comparing ids
/// alone. All copies of a value lie in one sequence, so the min(m, n) rule per
/// sequence is the rule for the lists. `val` 0 is treated as 1.
pub fn sorted_intersect_sequences<T: SequenceKey>(a: &[T], b: &[T], val: u64) -> Vec<T> {
    let (sa, sb) = (sequence_index(a, val), sequence_index(b, val));
    let mut out = Vec::new();
    let (mut p, mut q) = (0, 0);
    while p < sa.len() && q < sb.len() {
        match sa[p].0.cmp(&sb[q].0) {
            Ordering::Less => p += 1,
            Ordering::Greater => q += 1,
            Ordering::Equal => {
                merge_intersect_into(&a[sa[p].1..sa[p].2], &b[sb[q].1..sb[q].2], &mut out);
                p += 1;
                q += 1;
            }
        }
    }
    out
}

/// kernels/sorted_intersect.cu, with its contract constants as `-D` options.
pub static KERNEL: crate::gpu::KernelSource = crate::gpu::KernelSource {
    family: "sorted_intersect",
    source: include_str!("../../kernels/sorted_intersect.cu"),
    defines: sorted_intersect_defines,
};

fn sorted_intersect_defines() -> Vec<(String, u64)> {
    vec![("SI_GTWJ_SEQ_LOG2".into(), GTWJ_SEQ_LOG2 as u64)]
}

/// GTWJ's sequencing value, as log2 of the mean number of elements per
/// sequence of a row's longer list (`SI_GTWJ_SEQ_LOG2`): 3, sequences of
/// about 8 (4 to 16) elements.
///
/// Why: seed 003 fixes Val in key units (Val = 100, "GTWJ100") for uniform
/// lists over a universe it does not state, so its number cannot be carried
/// over; its lesson can. Its sweeps (E1, E2) find time and comparisons
/// growing with Val from the smallest tested value up, and skipped cells
/// falling: short sequences skip more. E5 finds Val = 50 faster than 100
/// below 5,000 elements per list and slower above, i.e. the per-sequence
/// overhead sets a floor. Here a sequence's overhead is one thread and two
/// binary searches into the other list (about log2 n probes: 4 to 10 for the
/// issue's rows of 10 to 1,000), so sequences of about 8 elements amortise
/// it while staying short enough to skip. Val is a power of two per row
/// (SeqID = key >> s), sized from the longer list's span and length so that
/// the density, not the key domain, sets it; the shorter list drives.
pub const GTWJ_SEQ_LOG2: u32 = 3;

/// Tile shapes (threads per block, merge steps per thread) instantiated in
/// kernels/sorted_intersect.cu; `setfusion bench setops` measures each.
pub const TILE_SHAPES: &[(usize, usize)] = &[(128, 11), (128, 15), (256, 7), (256, 11), (256, 15), (256, 19), (512, 9)];

/// Larger shapes instantiated for u32 keys only (a u64 tile would pass the
/// 48 KiB static shared-memory limit).
pub const TILE_SHAPES_U32: &[(usize, usize)] = &[(256, 23), (256, 27)];

/// Key types the kernel family is instantiated for.
pub trait SortedKey: crate::gpu::Pod + Ord {
    const SUFFIX: &'static str;
    /// The tile shape used unless one is chosen with [`SortedIntersect::with_shape`].
    const DEFAULT_SHAPE: (usize, usize);
}
impl SortedKey for u32 {
    const SUFFIX: &'static str = "u32";
    /// Fastest measured on the H100 (2^28 x 2^28 keys: 1.17 ms, 459 G keys/s).
    const DEFAULT_SHAPE: (usize, usize) = (256, 27);
}
impl SortedKey for u64 {
    const SUFFIX: &'static str = "u64";
    /// The largest u64 tile within 48 KiB of static shared memory.
    const DEFAULT_SHAPE: (usize, usize) = (256, 19);
}

/// CPU twin: |a ∩ b| for strictly increasing inputs, with optional per-`a` match flags.
pub fn intersect_count_cpu<T: Ord + Copy>(a: &[T], b: &[T], mut flags: Option<&mut [bool]>) -> u64 {
    let (mut i, mut j, mut n) = (0, 0, 0u64);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                if let Some(f) = flags.as_deref_mut() {
                    f[i] = true;
                }
                n += 1;
                i += 1;
                j += 1;
            }
        }
    }
    n
}

/// Device-resident inputs and scratch for repeated runs (benchmarks).
pub struct SortedIntersect<T> {
    pub a: DeviceBuffer<T>,
    pub b: DeviceBuffer<T>,
    parts: DeviceBuffer<i64>,
    count: DeviceBuffer<u64>,
    na: usize,
    nb: usize,
    shape: (usize, usize),
}

impl<T: SortedKey> SortedIntersect<T> {
    /// Upload both inputs once.
    pub fn upload(gpu: &Gpu, a: &[T], b: &[T], stats: &mut TransferStats) -> Result<Self> {
        // Partition scratch for the smallest tile of any shape.
        let min_tile = TILE_SHAPES.iter().map(|(nt, vt)| nt * vt).min().unwrap_or(1);
        let tiles = (a.len() + b.len()).div_ceil(min_tile).max(1);
        Ok(Self {
            a: gpu.upload(a, stats)?,
            b: gpu.upload(b, stats)?,
            parts: gpu.alloc::<i64>(tiles + 1)?,
            count: gpu.alloc_zeros::<u64>(1)?,
            na: a.len(),
            nb: b.len(),
            shape: T::DEFAULT_SHAPE,
        })
    }

    /// Use another instantiated tile shape (one of [`TILE_SHAPES`], or of
    /// [`TILE_SHAPES_U32`] for u32 keys).
    pub fn with_shape(mut self, shape: (usize, usize)) -> Self {
        if TILE_SHAPES.contains(&shape) || (T::SUFFIX == "u32" && TILE_SHAPES_U32.contains(&shape)) {
            self.shape = shape;
        }
        self
    }

    /// Launch partition + intersect; returns the count. `flags`, if given,
    /// must hold ceil(|a| / 32) zeroed words and receives one bit per match in `a`.
    pub fn run(&mut self, gpu: &Gpu, flags: Option<&DeviceBuffer<u32>>, stats: &mut TransferStats) -> Result<u64> {
        let total = self.na + self.nb;
        if total == 0 {
            return Ok(0);
        }
        let stream = gpu.stream();
        let (nt, vt) = self.shape;
        let tile = nt * vt;
        let tiles = total.div_ceil(tile);
        let (nparts, nv) = ((tiles + 1) as i64, tile as i64);
        let (na, nb) = (self.na as i64, self.nb as i64);
        let started = Instant::now();
        stream.memset_zeros(&mut self.count.slice).map_err(|e| cuda_err("memset", e))?;
        let part = gpu.function(&KERNEL, &format!("partitions_{}", T::SUFFIX))?;
        let cfg = LaunchConfig {
            grid_dim: ((tiles + 1).div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: signature matches kernels/sorted_intersect.cu; parts holds tiles + 1 entries.
        unsafe {
            stream
                .launch_builder(&part)
                .arg(&self.a.slice)
                .arg(&na)
                .arg(&self.b.slice)
                .arg(&nb)
                .arg(&self.parts.slice)
                .arg(&nparts)
                .arg(&nv)
                .launch(cfg)
        }
        .map_err(|e| cuda_err("partitions", e))?;
        let kern = gpu.function(&KERNEL, &format!("intersect_{}_{nt}x{vt}", T::SUFFIX))?;
        let cfg = LaunchConfig { grid_dim: (tiles as u32, 1, 1), block_dim: (nt as u32, 1, 1), shared_mem_bytes: 0 };
        let null_flags: u64 = 0;
        let mut launch = stream.launch_builder(&kern);
        launch.arg(&self.a.slice).arg(&na).arg(&self.b.slice).arg(&nb).arg(&self.parts.slice).arg(&self.count.slice);
        match flags {
            Some(f) => launch.arg(&f.slice),
            None => launch.arg(&null_flags),
        };
        // SAFETY: as above; a null flags pointer is checked in the kernel.
        unsafe { launch.launch(cfg) }.map_err(|e| cuda_err("intersect", e))?;
        gpu.synchronize()?;
        stats.kernel += started.elapsed();
        gpu.read_one(&self.count, 0, stats)
    }
}

/// Host-to-host convenience: upload, intersect, return the count and match flags for `a`.
pub fn intersect_count_gpu<T: SortedKey>(
    gpu: &Gpu,
    a: &[T],
    b: &[T],
    stats: &mut TransferStats,
) -> Result<(u64, Vec<bool>)> {
    intersect_count_gpu_shaped(gpu, a, b, T::DEFAULT_SHAPE, stats)
}

/// [`intersect_count_gpu`] with a given tile shape.
pub fn intersect_count_gpu_shaped<T: SortedKey>(
    gpu: &Gpu,
    a: &[T],
    b: &[T],
    shape: (usize, usize),
    stats: &mut TransferStats,
) -> Result<(u64, Vec<bool>)> {
    let mut si = SortedIntersect::upload(gpu, a, b, stats)?.with_shape(shape);
    let flags = gpu.alloc_zeros::<u32>(a.len().div_ceil(32).max(1))?;
    let n = si.run(gpu, Some(&flags), stats)?;
    let words = gpu.download(&flags, a.len().div_ceil(32), stats)?;
    let bits = (0..a.len()).map(|i| words[i >> 5] >> (i & 31) & 1 == 1).collect();
    Ok((n, bits))
}

/// `sorted_intersect` (min(m, n) copies) on every valid row of two device
/// sides whose rows are ascending (checked by the caller), by seed 003's
/// GTWJ (kernels/sorted_intersect.cu): per row a plan (the driving list,
/// the shorter, and the sequence width 2^s); a sequence starts at each
/// element of the driving list whose SeqID (key >> s) differs from its
/// predecessor's; sequences are numbered row after row (scans of the heads,
/// then of the rows' sequence counts); one thread per sequence merges it
/// with the other list's sequence of the same SeqID, found by binary search,
/// first to count, then (after a scan) to write. Values come back as `T`
/// (the keys' u64 image XOR `T::FLIP`).
pub(crate) fn gtwj_segmented<T: ListKey>(
    gpu: &Gpu,
    pair: &DeviceListPair,
    bound: usize,
    stats: &mut TransferStats,
) -> Result<SegmentedResult<T>> {
    let (stream, rows) = (gpu.stream(), pair.rows);
    let rows32 = rows as u32;
    let plan = gpu.alloc::<u32>(rows)?;
    let f = gpu.function(&KERNEL, "si_gtwj_plan")?;
    let mut l = stream.launch_builder(&f);
    pair.push_sides(&mut l);
    l.arg(&pair.valid.slice).arg(&rows32).arg(&plan.slice);
    // SAFETY: signature matches kernels/sorted_intersect.cu; keys hold their side's n entries, offsets rows + 1, valid and plan rows.
    unsafe { l.launch(gpu.grid_stride(rows, 32)) }.map_err(|e| cuda_err("si_gtwj_plan", e))?;
    // Sequence heads of each side (only in the rows it drives), and their scans.
    let mut heads = Vec::with_capacity(2);
    for (side, x) in [&pair.a, &pair.b].into_iter().enumerate() {
        let head = gpu.alloc::<u32>(x.n)?;
        let (n64, side32) = (x.n as u64, side as u32);
        let f = gpu.function(&KERNEL, "si_gtwj_heads")?;
        // SAFETY: keys, seg and head hold the side's n entries, offsets rows + 1, plan rows.
        unsafe {
            stream
                .launch_builder(&f)
                .arg(&x.keys.slice)
                .arg(&x.offsets.slice)
                .arg(&x.seg.slice)
                .arg(&n64)
                .arg(&plan.slice)
                .arg(&side32)
                .arg(&head.slice)
                .launch(gpu.grid_stride(x.n, 32))
        }
        .map_err(|e| cuda_err("si_gtwj_heads", e))?;
        let scanned = exclusive_scan(gpu, &head, x.n)?;
        heads.push((head, scanned));
    }
    let seqs = RowItems::from_counts(gpu, &pair.row_counts(gpu, &heads[0].1, &heads[1].1)?, rows, stats)?;
    let seq_starts = gpu.alloc::<u32>(seqs.n)?;
    for (x, (head, scanned)) in [&pair.a, &pair.b].into_iter().zip(&heads) {
        let n64 = x.n as u64;
        let f = gpu.function(&KERNEL, "si_gtwj_seq_starts")?;
        // SAFETY: seg and head hold the side's n entries, scanned n + 1; seqs.offsets rows + 1 and seq_starts seqs.n.
        unsafe {
            stream
                .launch_builder(&f)
                .arg(&x.offsets.slice)
                .arg(&x.seg.slice)
                .arg(&n64)
                .arg(&head.slice)
                .arg(&scanned.slice)
                .arg(&seqs.offsets.slice)
                .arg(&seq_starts.slice)
                .launch(gpu.grid_stride(x.n, 32))
        }
        .map_err(|e| cuda_err("si_gtwj_seq_starts", e))?;
    }
    let nseq32 = seqs.n as u32;
    let f = gpu.function(&KERNEL, "si_gtwj_walk")?;
    count_then_fill(gpu, &seqs, rows, bound, |pass| {
        let (null, flip) = (0u64, T::FLIP);
        let mut l = stream.launch_builder(&f);
        pair.push_sides(&mut l);
        l.arg(&plan.slice).arg(&seqs.offsets.slice).arg(&seqs.rows_of.slice).arg(&seq_starts.slice).arg(&nseq32);
        pass.push(&mut l, &null, &flip);
        // SAFETY: plan holds rows entries, seqs.offsets rows + 1, seqs.rows_of and seq_starts seqs.n; counts seqs.n,
        // starts seqs.n + 1 and values (T, 8 bytes) every sequence's outputs.
        unsafe { l.launch(gpu.grid_stride(seqs.n, 32)) }.map_err(|e| cuda_err("si_gtwj_walk", e))?;
        Ok(())
    })
}

/// Doctor self-check: u32 and u64 sorted sets against the CPU twin.
pub fn self_check(gpu: &Gpu) -> Result<String> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    fn sorted_set<T: Ord + Copy>(mut v: Vec<T>) -> Vec<T> {
        v.sort_unstable();
        v.dedup();
        v
    }
    let mut checked = 0;
    for &(na, nb, domain) in
        &[(0usize, 10usize, 100u64), (10, 0, 100), (1, 1, 1), (5000, 3000, 20000), (300_000, 500_000, 2_000_000)]
    {
        let a32 = sorted_set((0..na).map(|_| rng.random_range(0..domain) as u32).collect());
        let b32 = sorted_set((0..nb).map(|_| rng.random_range(0..domain) as u32).collect());
        let mut want_flags = vec![false; a32.len()];
        let want = intersect_count_cpu(&a32, &b32, Some(&mut want_flags));
        let a64: Vec<u64> = a32.iter().map(|v| (*v as u64) << 20 | 5).collect();
        let b64: Vec<u64> = b32.iter().map(|v| (*v as u64) << 20 | 5).collect();
        for &shape in TILE_SHAPES {
            let (got, flags) = intersect_count_gpu_shaped(gpu, &a32, &b32, shape, &mut TransferStats::default())?;
            let (got64, flags64) = intersect_count_gpu_shaped(gpu, &a64, &b64, shape, &mut TransferStats::default())?;
            if got != want || flags != want_flags || got64 != want || flags64 != want_flags {
                return Err(datafusion::error::DataFusionError::Execution(format!(
                    "sorted_intersect self-check failed on {na} x {nb}, tiles {shape:?}: cpu {want}, gpu u32 {got}, gpu u64 {got64}"
                )));
            }
            checked += 2;
        }
        for &shape in TILE_SHAPES_U32 {
            let (got, flags) = intersect_count_gpu_shaped(gpu, &a32, &b32, shape, &mut TransferStats::default())?;
            if got != want || flags != want_flags {
                return Err(datafusion::error::DataFusionError::Execution(format!(
                    "sorted_intersect self-check failed on {na} x {nb}, u32 tiles {shape:?}: cpu {want}, gpu {got}"
                )));
            }
            checked += 1;
        }
    }
    Ok(format!("{checked} input/tile-shape combinations match the CPU twin"))
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::{sorted_intersect, GTWJ_SEQ_LOG2};

    /// Host mirror of `si_gtwj_plan` (kernels/sorted_intersect.cu) for a row
    /// with both lists non-empty: (B drives, sequence shift s).
    fn gtwj_plan(a: &[u64], b: &[u64]) -> (bool, u32) {
        let drive_b = b.len() < a.len();
        let longer = if drive_b { a } else { b };
        let bit_length = |x: u64| 64 - x.leading_zeros() as i32;
        let s =
            bit_length(longer[longer.len() - 1] - longer[0]) - bit_length(longer.len() as u64) + GTWJ_SEQ_LOG2 as i32;
        (drive_b, s.clamp(0, 63) as u32)
    }

    /// Host mirror of `si_gtwj_heads` + `si_gtwj_seq_starts`: the sequence
    /// starts of a driving list (a new SeqID, x >> s, begins a sequence).
    fn gtwj_sequence_starts(x: &[u64], s: u32) -> Vec<usize> {
        (0..x.len()).filter(|&i| i == 0 || x[i] >> s != x[i - 1] >> s).collect()
    }

    /// Host mirror of `si_gtwj_sequence`: sequence x[i..i_end) merged with
    /// y's elements of the same SeqID (found by binary search), min(m, n) rule.
    fn gtwj_sequence(x: &[u64], mut i: usize, i_end: usize, y: &[u64], s: u32, out: &mut Vec<u64>) {
        let lo = (x[i] >> s) << s;
        let hi = lo | ((1u64 << s) - 1);
        let mut j = y.partition_point(|v| *v < lo);
        let j_end = j + y[j..].partition_point(|v| *v <= hi);
        while i < i_end && j < j_end {
            match x[i].cmp(&y[j]) {
                std::cmp::Ordering::Less => i += 1,
                std::cmp::Ordering::Greater => j += 1,
                std::cmp::Ordering::Equal => {
                    out.push(x[i]);
                    i += 1;
                    j += 1;
                }
            }
        }
    }

    /// One row as the device runs it: plan, sequence starts, one
    /// `gtwj_sequence` per sequence of the driving list, concatenated.
    fn gtwj_row(a: &[u64], b: &[u64]) -> Vec<u64> {
        let mut out = Vec::new();
        if a.is_empty() || b.is_empty() {
            return out;
        }
        let (drive_b, s) = gtwj_plan(a, b);
        let (x, y) = if drive_b { (b, a) } else { (a, b) };
        let starts = gtwj_sequence_starts(x, s);
        for (k, &i) in starts.iter().enumerate() {
            let i_end = starts.get(k + 1).copied().unwrap_or(x.len());
            gtwj_sequence(x, i, i_end, y, s, &mut out);
        }
        out
    }

    fn random_sorted(rng: &mut rand::rngs::StdRng, len: usize, lo: u64, hi: u64) -> Vec<u64> {
        let mut v: Vec<u64> = (0..len).map(|_| rng.random_range(lo..=hi)).collect();
        v.sort_unstable();
        v
    }

    /// The device's GTWJ, mirrored on the host, against `sorted_intersect`
    /// (the CPU twin, min(m, n) copies): dense domains (long duplicate runs,
    /// s = 0), sparse ones up to the whole u64 range (s near 63, keys at
    /// both ends), lists of very different lengths (either side driving),
    /// empty lists, and the moderngpu worked example.
    #[test]
    fn gtwj_rows_match_sorted_intersect() {
        let a: Vec<u64> = [1, 1, 2, 3, 3, 3, 5, 6, 6, 6, 6, 7, 7, 8, 8, 9].into();
        let b: Vec<u64> = [1, 2, 2, 3, 3, 3, 3, 6, 6, 6, 6, 8].into();
        assert_eq!(gtwj_row(&a, &b), vec![1, 2, 3, 3, 3, 6, 6, 6, 6, 8]);
        assert_eq!(gtwj_row(&b, &a), vec![1, 2, 3, 3, 3, 6, 6, 6, 6, 8]);
        let mut rng = rand::rngs::StdRng::seed_from_u64(2003);
        let ranges = [
            (0u64, 0u64),
            (0, 3),
            (100, 140),
            (0, 5000),
            (1 << 40, (1 << 40) + 1_000_000),
            (0, u64::MAX),
            (u64::MAX - 50, u64::MAX),
        ];
        for case in 0..4000 {
            let (lo, hi) = ranges[case % ranges.len()];
            let long = [0, 1, 5, 40, 300, 3000][rng.random_range(0..6)];
            let short = [0, 1, 3, 20, 300][rng.random_range(0..5)];
            let (na, nb) = if case % 2 == 0 { (long, short) } else { (short, long) };
            let (a, b) = (random_sorted(&mut rng, na, lo, hi), random_sorted(&mut rng, nb, lo, hi));
            assert_eq!(gtwj_row(&a, &b), sorted_intersect(&a, &b), "{na} x {nb} in [{lo}, {hi}]");
        }
    }

    /// The plan keeps the longer list's sequences near 2^GTWJ_SEQ_LOG2
    /// elements when its keys are spread out (dense lists get s = 0).
    #[test]
    fn gtwj_sequences_hold_about_the_target() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for &(n, hi) in &[(100usize, 1u64 << 20), (1000, 1 << 40), (5000, u64::MAX), (64, 1 << 12)] {
            let long = random_sorted(&mut rng, n, 0, hi);
            let short = random_sorted(&mut rng, n / 10, 0, hi);
            let (drive_b, s) = gtwj_plan(&short, &long);
            assert!(!drive_b, "the shorter list drives");
            let sequences = gtwj_sequence_starts(&long, s).len();
            let mean = n as f64 / sequences as f64;
            let target = (1u32 << GTWJ_SEQ_LOG2) as f64;
            // Uniform keys: within the shift's factor 2 each way, plus sampling slack.
            assert!(mean > target / 3.0 && mean < target * 3.0, "{n} keys to {hi}: s {s}, {mean:.1} per sequence");
        }
        let dense = vec![5u64; 100];
        assert_eq!(gtwj_plan(&dense, &dense), (false, 0));
    }

    #[test]
    fn gpu_matches_cpu_twin() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        println!("{}", super::self_check(&gpu).unwrap());
    }

    #[test]
    fn cpu_twin_counts() {
        let a = [1u32, 3, 5, 7, 9];
        let b = [0u32, 3, 4, 9, 10];
        let mut f = vec![false; 5];
        assert_eq!(super::intersect_count_cpu(&a, &b, Some(&mut f)), 2);
        assert_eq!(f, vec![false, true, false, false, true]);
        assert_eq!(super::intersect_count_cpu::<u32>(&[], &b, None), 0);
    }
}
