//! Sort-based multiset selection (seed 002, moderngpu "Multisets"): the third
//! GPU strategy for semi/anti joins and INTERSECT / EXCEPT [ALL], beside the
//! hash table and the bitmap of [`crate::algo::select`].
//!
//! Both sides are radix-sorted by [`crate::algo::radix_sort`] (the Onesweep
//! sort of kernels/radix_sort.cu; the probe side carries its original row
//! index), then kernels/sort_setops.cu partitions the merge of the two sorted
//! sides with Balanced Path and runs a serial std::set_* style merge per thread that
//! decides every probe row. [`select_sorted_cpu`] is the CPU twin: the same
//! merge, serially. Both give exactly the same bits as
//! [`crate::algo::select::select_cpu`]: among equal probe keys, rank is the
//! occurrence number in row order (the radix sort is stable).

use std::time::Instant;

use cudarc::driver::{LaunchConfig, PushKernelArg};
use datafusion::arrow::buffer::BooleanBuffer;
use datafusion::error::{DataFusionError, Result};

use super::{key_range, words_to_bool, SetOp};
use crate::algo::radix_sort;
use crate::gpu::{cuda_err, DeviceBuffer, Gpu, TransferStats};

/// kernels/sort_setops.cu, with its contract constants as `-D` options.
pub static KERNEL: crate::gpu::KernelSource = crate::gpu::KernelSource {
    family: "sort_setops",
    source: include_str!("../../../kernels/sort_setops.cu"),
    defines: sort_defines,
};

fn sort_defines() -> Vec<(String, u64)> {
    let mut d = super::op_defines();
    d.extend(crate::gpu::prefixed("BP_", &[("NT", BP_NT as u64), ("VT", BP_VT as u64)]));
    d
}

/// Balanced Path tile: BP_NT threads, BP_NV = BP_NT * BP_VT merge inputs.
const BP_NT: u32 = 128;
const BP_VT: u32 = 16;
const BP_NV: usize = (BP_NT * BP_VT) as usize;

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

/// Subtrahend and number of significant bits for a key domain: keys are
/// sorted as `key - lo` over bits [0, bits), so only the domain's width costs
/// passes (one 8-bit pass per started byte; none for a single key).
fn radix_plan(range: Option<(u64, u64)>) -> (u64, u32) {
    match range {
        Some((lo, hi)) if lo <= hi => (lo, u64::BITS - (hi - lo).leading_zeros()),
        _ => (0, u64::BITS),
    }
}

/// Device bytes needed (for the planner / partitioning), excluding the input keys themselves.
///
/// The probe side is sorted first (its offset keys and rows, plus the sort's
/// alternate buffers and look-back words), then the build side (two key
/// buffers and look-back words) while the sorted probe side is held; the
/// merge holds both sorted sides, the tile partitions and the output bits.
pub fn device_bytes_sorted(nb: usize, np: usize) -> usize {
    let sort_a = np * (8 + 4) + radix_sort::device_bytes(np, 8, true);
    let sort_b = np * (8 + 4) + nb * 8 + radix_sort::device_bytes(nb, 8, false);
    let merge = np * (8 + 4) + nb * 8 + ((np + nb).div_ceil(BP_NV) + 1) * 8;
    sort_a.max(sort_b).max(merge) + np.div_ceil(32) * 4
}

fn blocks(n: usize, threads: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (n.max(1) as u32, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
}

/// A sorted side: keys (as key - lo) and, for the probe side, original rows.
struct Sorted {
    keys: DeviceBuffer<u64>,
    rows: Option<DeviceBuffer<u32>>,
}

/// Stable sort of `input[0, n)` by `key - lo` over bits [0, bits), with the
/// row indices when `with_rows` (among equal keys they stay in row order).
fn sort_side(gpu: &Gpu, input: &DeviceBuffer<u64>, n: usize, lo: u64, bits: u32, with_rows: bool) -> Result<Sorted> {
    let (mut keys, mut rows) = radix_sort::offset_keys_u64(gpu, input, n, lo, with_rows)?;
    match rows.as_mut() {
        Some(r) => radix_sort::sort_pairs_u64(gpu, &mut keys, r, n, 0, bits)?,
        None => radix_sort::sort_keys_u64(gpu, &mut keys, n, 0, bits)?,
    }
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
        return Err(DataFusionError::Plan(format!(
            "sort strategy: {nb} build / {np} probe rows exceed 2^32 - 1 per side"
        )));
    }
    let out = gpu.alloc_zeros::<u32>(np.div_ceil(32))?;
    if np == 0 {
        return Ok(out);
    }
    let stream = gpu.stream();
    let started = Instant::now();
    let (lo, bits) = radix_plan(range);
    let a = sort_side(gpu, probe, np, lo, bits, true)?;
    let b = if nb > 0 { Some(sort_side(gpu, build, nb, lo, bits, false)?) } else { None };
    let a_rows = a.rows.as_ref().ok_or_else(|| DataFusionError::Internal("sort_setops: probe rows missing".into()))?;
    // With no build keys the kernels never read B; any valid pointer will do.
    let b_keys = b.as_ref().map_or(&build.slice, |s| &s.keys.slice);
    let (np64, nb64) = (np as u64, nb as u64);
    let ntiles = (np + nb).div_ceil(BP_NV);
    let ntiles64 = ntiles as u64;
    let parts = gpu.alloc::<u64>(ntiles + 1)?;
    let f = gpu.function(&KERNEL, "bp_partition")?;
    // SAFETY: signature matches kernels/sort_setops.cu; parts holds ntiles + 1 entries, a np keys, b nb keys.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&a.keys.slice)
            .arg(&np64)
            .arg(b_keys)
            .arg(&nb64)
            .arg(&ntiles64)
            .arg(&parts.slice)
            .launch(gpu.grid_stride(ntiles + 1, 32))
    }
    .map_err(|e| cuda_err("bp_partition", e))?;
    let opi = op as i32;
    let f = gpu.function(&KERNEL, "bp_select")?;
    // SAFETY: as above; one block per tile reads parts[t] and parts[t + 1], and out holds a bit per probe row.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&a.keys.slice)
            .arg(&a_rows.slice)
            .arg(&np64)
            .arg(b_keys)
            .arg(&nb64)
            .arg(&parts.slice)
            .arg(&opi)
            .arg(&out.slice)
            .launch(blocks(ntiles, BP_NT))
    }
    .map_err(|e| cuda_err("bp_select", e))?;
    gpu.synchronize()?;
    stats.kernel += started.elapsed();
    Ok(out)
}

const OPS: [SetOp; 6] =
    [SetOp::Semi, SetOp::Anti, SetOp::IntersectDistinct, SetOp::IntersectAll, SetOp::ExceptDistinct, SetOp::ExceptAll];

/// Upload, run [`run_sorted`], download: for the self-check and tests.
fn select_sorted_gpu(
    gpu: &Gpu,
    op: SetOp,
    build: &[u64],
    probe: &[u64],
    range: Option<(u64, u64)>,
) -> Result<BooleanBuffer> {
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
        (20_000, 20_000, 42, 1, true), // one key: no sort pass, every diagonal inside the run
        (3000, 50_000, 0, 20, true),   // long duplicate runs over many tiles
        (40_000, 40_001, 0, 9, true),  // equal multiplicities: every split pair must be starred
        (40_000, 30_000, 1 << 62, 400_000_000, true), // offset domain: 29 bits, 4 passes
        (100_000, 150_000, 0, 1 << 40, true), // plus u64::MAX below: the full 64 bits
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
    use crate::algo::select::select_cpu;

    /// The SQL multiset rules computed by counting (independent of the merge).
    fn reference(op: SetOp, build: &[u64], probe: &[u64]) -> Vec<u64> {
        crate::algo::select::multiset_reference(op, build, probe)
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
    fn radix_bits_follow_the_domain() {
        assert_eq!(radix_plan(None), (0, 64));
        assert_eq!(radix_plan(Some((7, 7))), (7, 0)); // one key: no pass at all
        assert_eq!(radix_plan(Some((0, 255))), (0, 8));
        assert_eq!(radix_plan(Some((0, 256))), (0, 9));
        assert_eq!(radix_plan(Some((1 << 62, (1 << 62) + 400_000_000))), (1 << 62, 29)); // 4 passes
        assert_eq!(radix_plan(Some((0, u64::MAX))), (0, 64));
        assert_eq!(radix_plan(Some((5, 3))), (0, 64)); // an inverted range is ignored
        assert_eq!(radix_sort::passes(0, 29), 4);
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

    /// Issue 15's measurement of the sort strategy: a 10M x 10M semi join,
    /// device-resident keys, median of 5 after a warm-up. Prints; run with
    /// `cargo test --release --lib sort_strategy_timing -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn sort_strategy_timing() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        let mut rng = rand::rngs::StdRng::seed_from_u64(15);
        let n = 10_000_000;
        for (name, domain) in
            [("keys in [0, 2^24)", 1u64 << 24), ("keys in [0, 2^34)", 1 << 34), ("full 64-bit keys", u64::MAX)]
        {
            let build: Vec<u64> = (0..n).map(|_| rng.random_range(0..domain)).collect();
            let probe: Vec<u64> = (0..n).map(|_| rng.random_range(0..domain)).collect();
            let range = key_range(&build, &probe);
            let stats = &mut TransferStats::default();
            let (db, dp) = (gpu.upload(&build, stats).unwrap(), gpu.upload(&probe, stats).unwrap());
            let mut times = Vec::new();
            for _ in 0..6 {
                let t = Instant::now();
                let out = run_sorted(&gpu, SetOp::Semi, &db, n, &dp, n, range, stats).unwrap();
                times.push(t.elapsed().as_secs_f64() * 1e3);
                drop(out);
            }
            times.remove(0);
            times.sort_by(f64::total_cmp);
            println!("sort strategy, semi join 10M x 10M, {name}: {:.3} ms (median of 5)", times[2]);
        }
    }
}
