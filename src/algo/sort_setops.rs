//! Sort-based multiset selection (seed 002, moderngpu "Multisets"): the third
//! GPU strategy for semi/anti joins and INTERSECT / EXCEPT [ALL], beside the
//! hash table and the bitmap of [`crate::algo::setops`].
//!
//! kernels/sort_setops.cu radix-sorts both sides (the probe side carrying its
//! original row index), partitions the merge of the two sorted sides with
//! Balanced Path, and runs a serial std::set_* style merge per thread that
//! decides every probe row. [`select_sorted_cpu`] is the CPU twin: the same
//! merge, serially. Both give exactly the same bits as
//! [`crate::algo::setops::select_cpu`]: among equal probe keys, rank is the
//! occurrence number in row order (the radix sort is stable).

use std::time::Instant;

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use datafusion::arrow::buffer::BooleanBuffer;
use datafusion::error::{DataFusionError, Result};

use crate::algo::setops::{key_range, words_to_bool, SetOp};
use crate::gpu::{cuda_err, DeviceBuffer, Gpu, TransferStats};

const FAMILY: &str = "sort_setops";
/// Digit width and count of the radix sort (RS_RADIX in the kernel).
const RADIX_BITS: u32 = 8;
const RS_RADIX: usize = 256;
/// Keys per radix-sort tile (RS_TILE) and threads per block (RS_THREADS).
const RS_TILE: usize = 8 * 512;
const RS_THREADS: u32 = 256;
/// Elements per block of the exclusive scan (SCAN_TILE) and its threads.
const SCAN_TILE: usize = 256 * 8;
const SCAN_THREADS: u32 = 256;
/// Balanced Path tile: BP_NT threads, BP_NV = BP_NT * BP_VT merge inputs.
const BP_NT: u32 = 128;
const BP_NV: usize = 128 * 16;

/// The keep rule for one sorted probe element: `matched` = paired with a build
/// copy of the same rank (rank < n_b), `first` = rank == 0, `present` = n_b > 0.
fn keep(op: SetOp, matched: bool, first: bool, present: bool) -> bool {
    match op {
        SetOp::Semi => present,
        SetOp::Anti => !present,
        SetOp::IntersectDistinct => first && present,
        SetOp::IntersectAll => matched,
        SetOp::ExceptDistinct => first && !present,
        SetOp::ExceptAll => !matched,
    }
}

/// CPU twin: sort both sides, then a merge with std::set_* multiset semantics; one bit per probe row.
///
/// The merge is the kernel's per-thread loop run over everything: equal keys
/// advance both cursors (the r-th probe copy pairs with the r-th build copy,
/// i.e. rank < n_b), smaller build keys are skipped. An unmatched probe
/// element has n_b > 0 exactly when the build key just behind the cursor is
/// equal (all of the key's build copies were consumed by lower ranks).
pub fn select_sorted_cpu(op: SetOp, build: &[u64], probe: &[u64]) -> BooleanBuffer {
    let np = probe.len();
    let mut words = vec![0u32; np.div_ceil(32)];
    // (key, row) pairs: equal keys end up in row order, as after the GPU's stable sort.
    let mut a: Vec<(u64, usize)> = probe.iter().copied().zip(0..).collect();
    a.sort_unstable();
    let mut b = build.to_vec();
    b.sort_unstable();
    let (mut i, mut j) = (0, 0);
    while i < a.len() {
        let (ak, row) = a[i];
        if j < b.len() && b[j] < ak {
            j += 1;
            continue;
        }
        let matched = j < b.len() && b[j] == ak;
        let first = i == 0 || a[i - 1].0 != ak;
        let present = matched || (j > 0 && b[j - 1] == ak);
        if keep(op, matched, first, present) {
            words[row >> 5] |= 1 << (row & 31);
        }
        i += 1;
        if matched {
            j += 1;
        }
    }
    words_to_bool(words, np)
}

/// Subtrahend and number of 8-bit digit passes for a key domain: keys are
/// sorted as `key - lo`, so only the domain's width costs passes (at least
/// one: the first pass also applies the offset and records the row indices).
fn radix_plan(range: Option<(u64, u64)>) -> (u64, u32) {
    match range {
        Some((lo, hi)) if lo <= hi => {
            let bits = u64::BITS - (hi - lo).leading_zeros();
            (lo, bits.div_ceil(RADIX_BITS).max(1))
        }
        _ => (0, u64::BITS / RADIX_BITS),
    }
}

/// Lengths of the scan's per-level block-sum buffers for `n` elements.
fn scan_levels(mut n: usize) -> Vec<usize> {
    let mut levels = Vec::new();
    loop {
        let blocks = n.div_ceil(SCAN_TILE).max(1);
        levels.push(blocks);
        if blocks == 1 {
            return levels;
        }
        n = blocks;
    }
}

/// Device bytes needed (for the planner / partitioning), excluding the input keys themselves.
///
/// The probe side is sorted first (two key and two row buffers while it
/// runs), then the build side (two key buffers) while the sorted probe side
/// is held; the merge holds both sorted sides, the tile partitions and the
/// output bits. Digit counts and scan sums are counted throughout.
pub fn device_bytes_sorted(nb: usize, np: usize) -> usize {
    let counts_len = RS_RADIX * np.max(nb).div_ceil(RS_TILE).max(1);
    let counts = (counts_len + scan_levels(counts_len).iter().sum::<usize>()) * 4;
    let sort_a = np * (8 + 4) * 2;
    let sort_b = np * (8 + 4) + nb * 8 * 2;
    let merge = np * (8 + 4) + nb * 8 + ((np + nb).div_ceil(BP_NV) + 1) * 8;
    counts + sort_a.max(sort_b).max(merge) + np.div_ceil(32) * 4
}

fn blocks(n: usize, threads: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (n.max(1) as u32, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
}

fn grid_stride(n: usize) -> LaunchConfig {
    blocks(n.div_ceil(256).clamp(1, 132 * 32), 256)
}

/// Block sums of every level of the recursive exclusive scan, allocated once
/// for the largest digit-count array and reused by every pass.
struct ScanScratch {
    levels: Vec<DeviceBuffer<u32>>,
}

impl ScanScratch {
    fn new(gpu: &Gpu, n: usize) -> Result<Self> {
        let levels = scan_levels(n).into_iter().map(|len| gpu.alloc::<u32>(len)).collect::<Result<Vec<_>>>()?;
        Ok(Self { levels })
    }

    /// In-place exclusive scan of `data[0, n)`; `level` indexes the scratch.
    fn scan(&self, gpu: &Gpu, data: &CudaSlice<u32>, n: usize, level: usize) -> Result<()> {
        let nblocks = n.div_ceil(SCAN_TILE).max(1);
        let sums = self
            .levels
            .get(level)
            .ok_or_else(|| DataFusionError::Internal(format!("sort_setops: scan scratch has no level {level} for {n} elements")))?;
        let stream = gpu.stream();
        let n64 = n as u64;
        let f = gpu.function(FAMILY, "scan_tiles")?;
        // SAFETY: signature matches kernels/sort_setops.cu; data holds n elements and sums one per block.
        unsafe { stream.launch_builder(&f).arg(data).arg(&n64).arg(&sums.slice).launch(blocks(nblocks, SCAN_THREADS)) }
            .map_err(|e| cuda_err("scan_tiles", e))?;
        if nblocks > 1 {
            self.scan(gpu, &sums.slice, nblocks, level + 1)?;
            let f = gpu.function(FAMILY, "scan_add")?;
            // SAFETY: as above; sums holds one (now exclusive) offset per SCAN_TILE slice of data.
            unsafe { stream.launch_builder(&f).arg(data).arg(&n64).arg(&sums.slice).launch(grid_stride(n)) }
                .map_err(|e| cuda_err("scan_add", e))?;
        }
        Ok(())
    }
}

/// A sorted side: keys (as key - lo) and, for the probe side, original rows.
struct Sorted {
    keys: DeviceBuffer<u64>,
    rows: Option<DeviceBuffer<u32>>,
}

/// Stable LSD radix sort of `input[0, n)` (n > 0) by `key - lo`, `passes`
/// 8-bit digits from the least significant. `counts` holds at least
/// RS_RADIX * ceil(n / RS_TILE) elements.
fn radix_sort(
    gpu: &Gpu,
    input: &DeviceBuffer<u64>,
    n: usize,
    lo: u64,
    passes: u32,
    with_rows: bool,
    counts: &DeviceBuffer<u32>,
    scratch: &ScanScratch,
) -> Result<Sorted> {
    let ntiles = n.div_ceil(RS_TILE);
    let counts_len = RS_RADIX * ntiles;
    if counts.len() < counts_len {
        return Err(DataFusionError::Internal("sort_setops: digit-count buffer too small".into()));
    }
    // Ping-pong buffers; the second is only needed with more than one pass.
    let bufs = if passes > 1 { 2 } else { 1 };
    let keys: Vec<DeviceBuffer<u64>> = (0..bufs).map(|_| gpu.alloc::<u64>(n)).collect::<Result<_>>()?;
    let mut rows: Vec<DeviceBuffer<u32>> = Vec::new();
    if with_rows {
        rows = (0..bufs).map(|_| gpu.alloc::<u32>(n)).collect::<Result<_>>()?;
    }
    let stream = gpu.stream();
    let hist = gpu.function(FAMILY, "rs_histogram")?;
    let scatter = gpu.function(FAMILY, "rs_scatter")?;
    let (n64, ntiles64) = (n as u64, ntiles as u64);
    // Passed for a null pointer: no input rows (first pass) or no rows at all (build side).
    let null: u64 = 0;
    for p in 0..passes as usize {
        let (src, dst) = ((p + 1) % bufs, p % bufs);
        let kin = if p == 0 { &input.slice } else { &keys[src].slice };
        let sub = if p == 0 { lo } else { 0 };
        let shift = p as u32 * RADIX_BITS;
        // SAFETY: signature matches kernels/sort_setops.cu; kin holds n keys and counts RS_RADIX per tile.
        unsafe {
            stream.launch_builder(&hist).arg(kin).arg(&n64).arg(&sub).arg(&shift).arg(&counts.slice).arg(&ntiles64)
                .launch(blocks(ntiles, RS_THREADS))
        }
        .map_err(|e| cuda_err("rs_histogram", e))?;
        scratch.scan(gpu, &counts.slice, counts_len, 0)?;
        // SAFETY: as above; the key and row buffers hold n elements, and the
        // scanned counts place every key at a distinct position below n.
        unsafe {
            let mut l = stream.launch_builder(&scatter);
            l.arg(kin);
            match (p, rows.get(src)) {
                (0, _) | (_, None) => l.arg(&null),
                (_, Some(r)) => l.arg(&r.slice),
            };
            l.arg(&keys[dst].slice);
            match rows.get(dst) {
                Some(r) => l.arg(&r.slice),
                None => l.arg(&null),
            };
            l.arg(&n64).arg(&sub).arg(&shift).arg(&counts.slice).arg(&ntiles64).launch(blocks(ntiles, RS_THREADS))
        }
        .map_err(|e| cuda_err("rs_scatter", e))?;
    }
    // The last pass wrote buffer (passes - 1) % bufs; the other one is freed here.
    let last = (passes as usize + bufs - 1) % bufs;
    let pick = |v: Vec<DeviceBuffer<u32>>| v.into_iter().nth(last);
    let rows = pick(rows);
    let keys = keys
        .into_iter()
        .nth(last)
        .ok_or_else(|| DataFusionError::Internal("sort_setops: no sorted key buffer".into()))?;
    Ok(Sorted { keys, rows })
}

/// GPU: keys already on the device. `range` = Some((lo, hi)) domain of both sides when known (None: full 64 bits).
/// Returns one bit per probe row (words, LSB first) on the device. Caller holds the device lock.
///
/// `range` must cover every key of both sides (keys are sorted as key - lo
/// over only the domain's bits). Errors (the memory budget included) are
/// returned, never panicked, so the caller can partition or fall back.
#[allow(clippy::too_many_arguments)]
pub fn run_sorted(
    gpu: &Gpu,
    op: SetOp,
    build: &DeviceBuffer<u64>,
    nb: usize,
    probe: &DeviceBuffer<u64>,
    np: usize,
    range: Option<(u64, u64)>,
    stats: &mut TransferStats,
) -> Result<DeviceBuffer<u32>> {
    if nb > build.len() || np > probe.len() {
        return Err(DataFusionError::Internal(format!(
            "sort_setops: {nb} build / {np} probe keys requested from buffers of {} / {}",
            build.len(),
            probe.len()
        )));
    }
    // Rows are carried as u32, and digit counts are u32 sums over one side.
    if np > u32::MAX as usize || nb > u32::MAX as usize {
        return Err(DataFusionError::Plan(format!("sort strategy: {nb} build / {np} probe rows exceed 2^32 - 1 per side")));
    }
    let out = gpu.alloc_zeros::<u32>(np.div_ceil(32))?;
    if np == 0 {
        return Ok(out);
    }
    let stream = gpu.stream();
    let started = Instant::now();
    let (lo, passes) = radix_plan(range);
    let (a, b) = {
        let counts_len = RS_RADIX * np.max(nb).div_ceil(RS_TILE);
        let counts = gpu.alloc::<u32>(counts_len)?;
        let scratch = ScanScratch::new(gpu, counts_len)?;
        let a = radix_sort(gpu, probe, np, lo, passes, true, &counts, &scratch)?;
        let b = if nb > 0 { Some(radix_sort(gpu, build, nb, lo, passes, false, &counts, &scratch)?) } else { None };
        (a, b)
    };
    let a_rows = a.rows.as_ref().ok_or_else(|| DataFusionError::Internal("sort_setops: probe rows missing".into()))?;
    // With no build keys the kernels never read B; any valid pointer will do.
    let b_keys = b.as_ref().map_or(&build.slice, |s| &s.keys.slice);
    let (np64, nb64) = (np as u64, nb as u64);
    let ntiles = (np + nb).div_ceil(BP_NV);
    let ntiles64 = ntiles as u64;
    let parts = gpu.alloc::<u64>(ntiles + 1)?;
    let f = gpu.function(FAMILY, "bp_partition")?;
    // SAFETY: signature matches kernels/sort_setops.cu; parts holds ntiles + 1 entries, a np keys, b nb keys.
    unsafe {
        stream.launch_builder(&f).arg(&a.keys.slice).arg(&np64).arg(b_keys).arg(&nb64).arg(&ntiles64).arg(&parts.slice)
            .launch(grid_stride(ntiles + 1))
    }
    .map_err(|e| cuda_err("bp_partition", e))?;
    let opi = op as i32;
    let f = gpu.function(FAMILY, "bp_select")?;
    // SAFETY: as above; one block per tile reads parts[t] and parts[t + 1], and out holds a bit per probe row.
    unsafe {
        stream.launch_builder(&f).arg(&a.keys.slice).arg(&a_rows.slice).arg(&np64).arg(b_keys).arg(&nb64).arg(&parts.slice)
            .arg(&opi).arg(&out.slice).launch(blocks(ntiles, BP_NT))
    }
    .map_err(|e| cuda_err("bp_select", e))?;
    gpu.synchronize()?;
    stats.kernel += started.elapsed();
    Ok(out)
}

const OPS: [SetOp; 6] =
    [SetOp::Semi, SetOp::Anti, SetOp::IntersectDistinct, SetOp::IntersectAll, SetOp::ExceptDistinct, SetOp::ExceptAll];

/// Upload, run [`run_sorted`], download: for the self-check and tests.
fn select_sorted_gpu(gpu: &Gpu, op: SetOp, build: &[u64], probe: &[u64], range: Option<(u64, u64)>) -> Result<BooleanBuffer> {
    let stats = &mut TransferStats::default();
    let d_build = gpu.upload(build, stats)?;
    let d_probe = gpu.upload(probe, stats)?;
    let out = run_sorted(gpu, op, &d_build, build.len(), &d_probe, probe.len(), range, stats)?;
    if probe.is_empty() {
        return Ok(BooleanBuffer::new_unset(0));
    }
    let words = gpu.download(&out, probe.len().div_ceil(32), stats)?;
    Ok(words_to_bool(words, probe.len()))
}

/// Doctor self-check vs the CPU twin on random inputs with duplicates, empty sides, the u64::MAX key, wide and narrow domains, every op.
///
/// The bits must match exactly (not just as multisets): the sort is stable, so
/// the kept copies of equal keys are the first ones in row order on both sides.
pub fn self_check(gpu: &Gpu) -> Result<String> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    // (build rows, probe rows, key base, domain width, pass the known range?)
    let cases: &[(usize, usize, u64, u64, bool)] = &[
        (0, 100, 0, 10, true),
        (1000, 0, 0, 10, true),
        (5000, 7000, 0, 3000, true),
        (5000, 7000, 0, 3000, false),
        (20_000, 20_000, 42, 1, true),                 // one key: a single pass, every diagonal inside the run
        (3000, 50_000, 0, 20, true),                   // long duplicate runs over many tiles
        (40_000, 40_001, 0, 9, true),                  // equal multiplicities: every split pair must be starred
        (40_000, 30_000, 1 << 62, 400_000_000, true),  // offset domain: 29 bits, 4 passes
        (100_000, 150_000, 0, 1 << 40, true),          // plus u64::MAX below: the full 64 bits
    ];
    let mut checked = 0;
    for &(nb, np, base, domain, ranged) in cases {
        let mut build: Vec<u64> = (0..nb).map(|_| base + rng.random_range(0..domain)).collect();
        let mut probe: Vec<u64> = (0..np).map(|_| base + rng.random_range(0..domain)).collect();
        if domain == 1 << 40 {
            probe[0] = u64::MAX;
            probe[1] = u64::MAX;
            build.push(u64::MAX);
        }
        let range = if ranged { key_range(&build, &probe) } else { None };
        for op in OPS {
            let want = select_sorted_cpu(op, &build, &probe);
            let got = select_sorted_gpu(gpu, op, &build, &probe, range)?;
            if got != want {
                return Err(DataFusionError::Execution(format!(
                    "sort_setops self-check failed: {} on {} x {} keys (range {range:?})",
                    op.name(),
                    build.len(),
                    probe.len()
                )));
            }
            checked += 1;
        }
    }
    Ok(format!("{checked} op/input combinations match the CPU twin bit for bit"))
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::algo::setops::select_cpu;

    /// The SQL multiset rules computed by counting (independent of the merge).
    fn reference(op: SetOp, build: &[u64], probe: &[u64]) -> Vec<u64> {
        crate::algo::setops::multiset_reference(op, build, probe)
    }

    fn kept(probe: &[u64], sel: &BooleanBuffer) -> Vec<u64> {
        let mut v: Vec<u64> = sel.set_indices().map(|i| probe[i]).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn cpu_twin_matches_multiset_reference() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for case in 0..400 {
            let (nb, np) = match case % 10 {
                0 => (0, rng.random_range(0..100)),
                1 => (rng.random_range(0..100), 0),
                2 => (0, 0),
                _ => (rng.random_range(0..300), rng.random_range(0..300)),
            };
            let domain = if case % 7 == 0 { u64::MAX } else { rng.random_range(1..60u64) };
            let mut build: Vec<u64> = (0..nb).map(|_| rng.random_range(0..domain)).collect();
            let mut probe: Vec<u64> = (0..np).map(|_| rng.random_range(0..domain)).collect();
            if case % 4 == 0 {
                probe.push(u64::MAX);
                probe.push(u64::MAX);
                if case % 8 == 0 {
                    build.push(u64::MAX);
                }
            }
            for op in OPS {
                let got = select_sorted_cpu(op, &build, &probe);
                assert_eq!(got.len(), probe.len());
                assert_eq!(kept(&probe, &got), reference(op, &build, &probe), "case {case} {op:?}");
                // Both twins rank equal probe keys in row order, so the bits agree exactly.
                assert_eq!(got, select_cpu(op, &build, &probe), "case {case} {op:?} vs select_cpu");
            }
        }
    }

    #[test]
    fn radix_passes_follow_the_domain() {
        assert_eq!(radix_plan(None), (0, 8));
        assert_eq!(radix_plan(Some((7, 7))), (7, 1));
        assert_eq!(radix_plan(Some((0, 255))), (0, 1));
        assert_eq!(radix_plan(Some((0, 256))), (0, 2));
        assert_eq!(radix_plan(Some((1 << 62, (1 << 62) + 400_000_000))), (1 << 62, 4)); // 29 bits
        assert_eq!(radix_plan(Some((0, u64::MAX))), (0, 8));
        assert_eq!(radix_plan(Some((5, 3))), (0, 8)); // an inverted range is ignored
        assert_eq!(scan_levels(100), vec![1]);
        assert_eq!(scan_levels(SCAN_TILE * SCAN_TILE + 1), vec![SCAN_TILE + 1, 2, 1]);
        assert!(device_bytes_sorted(0, 0) > 0);
        assert!(device_bytes_sorted(1000, 1000) >= 1000 * 24);
    }

    #[test]
    fn gpu_matches_cpu_twin() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        let mut rng = rand::rngs::StdRng::seed_from_u64(6);
        for case in 0..60 {
            let (nb, np) = match case % 10 {
                0 => (0, rng.random_range(1..5000)),
                1 => (rng.random_range(1..5000), 0),
                2 => (rng.random_range(10_000..40_000), rng.random_range(10_000..40_000)),
                // Near-equal sides over few keys: copies pair up across tile and thread splits.
                3 | 6 => {
                    let n = rng.random_range(2000..30_000);
                    (n, n + rng.random_range(0..3))
                }
                _ => (rng.random_range(0..5000), rng.random_range(0..5000)),
            };
            let base = if case % 4 == 1 { 1u64 << 63 } else { 0 };
            let domain = match case % 3 {
                _ if case % 10 == 3 || case % 10 == 6 => rng.random_range(1..40u64),
                0 => u64::MAX - base,
                1 => rng.random_range(1..300u64),
                _ => rng.random_range(1..1_000_000_000u64),
            };
            let mut build: Vec<u64> = (0..nb).map(|_| base + rng.random_range(0..domain)).collect();
            let mut probe: Vec<u64> = (0..np).map(|_| base + rng.random_range(0..domain)).collect();
            if case % 5 == 0 && np > 0 {
                build.push(u64::MAX);
                build.push(probe[0]);
            }
            if case % 7 == 0 {
                probe.push(u64::MAX);
            }
            for op in OPS {
                let want = select_sorted_cpu(op, &build, &probe);
                for range in [key_range(&build, &probe), None] {
                    let got = select_sorted_gpu(&gpu, op, &build, &probe, range).unwrap();
                    assert_eq!(got, want, "case {case} {op:?} range {range:?}");
                }
            }
        }
        let msg = self_check(&gpu).unwrap();
        assert!(msg.contains("match"), "{msg}");
    }
}
