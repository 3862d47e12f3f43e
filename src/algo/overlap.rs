//! Overlap counts: |x ∩ y| for every pair of sets of two families, or of one
//! family with itself (seed 004's MISI, "multiple-input set intersection").
//! The `intersect_families(..., 'counts')` level of
//! [`crate::exec::families`] runs it.
//!
//! Two device methods, chosen by [`choose`] from their estimated time (work
//! times measured unit costs) and the seed's memory rules (its case B6):
//! * [`OverlapMethod::InvertedLists`] (seed 004's sf-gSSJoin, threshold 0):
//!   for each element of a left set, +1 for every right set in its inverted
//!   list ([`families::pair_counts_gpu`]); work Σ df_left(e)·df_right(e).
//!   Its index grows with the input only, so it always fits; it suits small,
//!   sparse sets (the seed's real datasets).
//! * [`OverlapMethod::Bitmaps`] (the seed's BI, for large dense sets): every
//!   set a bitmap over the universe, counts by a tiled popcount GEMM
//!   (kernels/overlap_bitmap.cu); work pairs × universe / 32 words, at
//!   regular addresses. Bitmaps take universe / 8 bytes a set, so the
//!   universe is cut into chunks whose bitmaps fit the budget (the seed's
//!   BI-naive refuses at 10^9 elements; chunks make it tile instead).
//!
//! Seed 004's IP variants are not built: their diagonals take O(k² · blocks)
//! memory, and for sets of 10^6 their per-pair merges lose to the bitmaps.
//!
//! [`counts_cpu`] is the CPU twin (inverted lists on the host's threads).

use std::ops::Range;
use std::sync::OnceLock;
use std::time::Instant;

use cudarc::driver::{LaunchConfig, PushKernelArg};
use datafusion::error::Result;

use crate::algo::families::{self, InvertedLists, PairSpace};
use crate::gpu::{cuda_err, Gpu, TransferStats};

/// kernels/overlap_bitmap.cu.
pub static KERNEL: crate::gpu::KernelSource = crate::gpu::KernelSource {
    family: "overlap_bitmap",
    source: include_str!("../../kernels/overlap_bitmap.cu"),
    defines: crate::gpu::no_defines,
};

/// How [`counts_gpu`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverlapMethod {
    InvertedLists,
    Bitmaps,
}

impl OverlapMethod {
    pub fn name(self) -> &'static str {
        match self {
            OverlapMethod::InvertedLists => "inverted lists",
            OverlapMethod::Bitmaps => "bitmaps",
        }
    }
}

/// Pairs sampled by [`estimate_increments`], and elements of a pair's
/// smaller set looked up in the larger.
const SAMPLED_PAIRS: u64 = 64;
const SAMPLED_ELEMENTS: usize = 1024;

/// The inverted-list increments of the pairs of left sets `rows` (the sum of
/// their overlaps), estimated from [`SAMPLED_PAIRS`] pairs spread evenly over
/// the pair space, each from [`SAMPLED_ELEMENTS`] elements of its smaller set
/// searched in the larger (exact for up to that many pairs of sets that small).
/// Cheap where the inverted lists would not be: 10^9 elements take seconds
/// to index, and a merge of two sets of 10^6 takes ~20 ms.
pub fn estimate_increments(space: &PairSpace, rows: Range<usize>) -> u64 {
    let pairs = space.pair_count(rows.clone());
    if pairs == 0 {
        return 0;
    }
    let k = space.right.len();
    let step = pairs.div_ceil(SAMPLED_PAIRS).max(1);
    let (mut sum, mut sampled) = (0f64, 0u64);
    let (mut at, mut next) = (0u64, 0u64);
    for i in rows {
        let from = space.first_right(i).min(k);
        let n = (k - from) as u64;
        while next < at + n {
            let j = from + (next - at) as usize;
            let (a, b) = (space.left.set(i), space.right.set(j));
            let (small, large) = if a.len() <= b.len() { (a, b) } else { (b, a) };
            let stride = small.len().div_ceil(SAMPLED_ELEMENTS).max(1);
            let hits = small.iter().step_by(stride).filter(|x| large.binary_search(x).is_ok()).count();
            sum += hits as f64 * small.len() as f64 / small.len().div_ceil(stride).max(1) as f64;
            sampled += 1;
            next += step;
        }
        at += n;
    }
    (sum * pairs as f64 / sampled.max(1) as f64).round() as u64
}

/// Time per unit of work, measured on an H100 (`setfusion bench seeds`,
/// MISI over 1,000 zipf sets of 10^6, SETFUSION_TRACE): an inverted-list
/// increment on the device (2.4-2.5 s for 0.7-1.0 x 10^11); an element
/// indexed into inverted lists on the host's threads (3.7-7.3 s for 10^9);
/// a word pair of the popcount GEMM (0.57 s for 1.56 x 10^12); and an
/// element uploaded, with its set's bitmap allocated (~1.4 s for 10^9).
const PS_PER_INCREMENT: f64 = 28.0;
const PS_PER_INDEXED_ELEMENT: f64 = 5_000.0;
const PS_PER_WORD_PAIR: f64 = 0.4;
const PS_PER_BITMAP_ELEMENT: f64 = 1_500.0;

/// The estimated seconds of each method: (inverted lists, bitmaps). The
/// inverted lists' time includes indexing the right family on the host
/// unless `indexed`.
pub fn estimate_seconds(space: &PairSpace, rows: Range<usize>, indexed: bool) -> (f64, f64) {
    estimate_seconds_over(space, rows, indexed, space.domain())
}

/// [`estimate_seconds`] with the ids' domain already known.
fn estimate_seconds_over(space: &PairSpace, rows: Range<usize>, indexed: bool, domain: usize) -> (f64, f64) {
    let word_pairs = space.pair_count(rows.clone()) as f64 * domain.div_ceil(32) as f64;
    let elements = space.right.elements.len() as f64;
    let index = if indexed { 0.0 } else { elements * PS_PER_INDEXED_ELEMENT };
    let inverted = estimate_increments(space, rows) as f64 * PS_PER_INCREMENT + index;
    let bitmaps = word_pairs * PS_PER_WORD_PAIR + elements * PS_PER_BITMAP_ELEMENT;
    (inverted * 1e-12, bitmaps * 1e-12)
}

/// The method with the least estimated time ([`estimate_seconds`]).
pub fn choose(space: &PairSpace, rows: Range<usize>, indexed: bool) -> OverlapMethod {
    choose_over(space, rows, indexed, space.domain())
}

/// [`choose`] with the ids' domain already known.
fn choose_over(space: &PairSpace, rows: Range<usize>, indexed: bool, domain: usize) -> OverlapMethod {
    let (inverted, bitmaps) = estimate_seconds_over(space, rows, indexed, domain);
    if bitmaps < inverted {
        OverlapMethod::Bitmaps
    } else {
        OverlapMethod::InvertedLists
    }
}

/// CPU twin of [`counts_gpu`]: the counts of the pairs of left sets `rows`, a
/// row-major `rows.len() x k_right` matrix (0 outside the pair space), by the
/// right family's inverted lists, the rows spread over the host's threads.
pub fn counts_cpu(space: &PairSpace, inv: &InvertedLists, rows: Range<usize>) -> Vec<u32> {
    let k = space.right.len();
    let mut out = vec![0u32; rows.len() * k];
    if k == 0 || rows.is_empty() {
        return out;
    }
    let per = rows.len().div_ceil(crate::host::copy_threads().max(1) * 4).max(1);
    let mut parts: Vec<(usize, &mut [u32])> =
        out.chunks_mut(per * k).enumerate().map(|(c, part)| (rows.start + c * per, part)).collect();
    crate::host::for_each_mut(&mut parts, &|_, (first, part)| {
        for (r, row) in part.chunks_mut(k).enumerate() {
            let i = *first + r;
            let from = space.first_right(i) as u32;
            for &e in space.left.set(i) {
                let e = e as usize;
                if e + 1 >= inv.offsets.len() {
                    continue;
                }
                for &j in &inv.sets[inv.offsets[e] as usize..inv.offsets[e + 1] as usize] {
                    if j >= from {
                        row[j as usize] += 1;
                    }
                }
            }
        }
    });
    out
}

/// The counts of the pairs of left sets `rows` on the device (the same matrix
/// as [`counts_cpu`]), by `method` or the one [`choose`] picks; returns the
/// method that ran. `inv`: the right family's inverted lists, built here
/// when the method needs them and they are not yet.
pub fn counts_gpu(
    gpu: &Gpu,
    space: &PairSpace,
    inv: &OnceLock<InvertedLists>,
    rows: Range<usize>,
    method: Option<OverlapMethod>,
    ts: &mut TransferStats,
) -> Result<(Vec<u32>, OverlapMethod)> {
    // The ids' domain (a scan of every element) at most once, for the choice, the lists and the bitmaps.
    let domain = std::cell::OnceCell::new();
    let domain = || *domain.get_or_init(|| space.domain());
    let method = method.unwrap_or_else(|| choose_over(space, rows.clone(), inv.get().is_some(), domain()));
    let counts = match method {
        OverlapMethod::InvertedLists => {
            let inv = inv.get_or_init(|| InvertedLists::of(space.right, domain()));
            families::pair_counts_gpu(gpu, space, inv, rows, ts)?
        }
        OverlapMethod::Bitmaps => bitmap_counts_gpu(gpu, space, rows, domain(), ts)?,
    };
    Ok((counts, method))
}

/// Threads of a block of both bitmap kernels (the GEMM's 64 x 64 tile needs 256).
const THREADS: u32 = 256;
/// The GEMM's tile of counts, and the words it stages at a time (OVL_TILE, OVL_KWORDS).
const TILE: usize = 64;
const KWORDS: usize = 32;

/// [`counts_gpu`] by bitmaps: the universe in chunks of `words` 32-bit words
/// a set, as many as the budget holds for the left rows' and the right
/// sets' bitmaps (one set of bitmaps in the self form over every row).
/// `ids`: every element id lies below it ([`PairSpace::domain`]).
fn bitmap_counts_gpu(
    gpu: &Gpu,
    space: &PairSpace,
    rows: Range<usize>,
    ids: usize,
    ts: &mut TransferStats,
) -> Result<Vec<u32>> {
    let (nl, k) = (rows.len(), space.right.len());
    if nl == 0 || k == 0 {
        return Ok(vec![0u32; nl * k]);
    }
    // SETFUSION_TRACE: each phase's time (the device synchronised after it).
    let mut last = Instant::now();
    let mut phase = |what: &str| -> Result<()> {
        if crate::env::trace() {
            gpu.synchronize()?;
            eprintln!("overlap bitmaps: {what}: {:.1} ms", last.elapsed().as_secs_f64() * 1e3);
            last = Instant::now();
        }
        Ok(())
    };
    let self_form = space.right_from.is_some();
    // The self form over every row: the left bitmaps are the right ones.
    let shared = self_form && rows == (0..space.left.len());
    let upload = |f: &families::Family, ts: &mut TransferStats| -> Result<_> {
        let offs: Vec<u64> = f.offsets.iter().map(|&o| o as u64).collect();
        let elements: &[u32] = if f.elements.is_empty() { &[0] } else { &f.elements };
        Ok((gpu.upload(&offs, ts)?, gpu.upload(elements, ts)?))
    };
    let left = upload(space.left, ts)?;
    let right = if self_form { None } else { Some(upload(space.right, ts)?) };
    let counts = gpu.alloc_zeros::<u32>(nl * k)?;
    let rows_of_bitmaps = if shared { k } else { nl + k };
    let total_words = ids.div_ceil(32).max(1);
    let words = (gpu.budget().available() / 2 / (rows_of_bitmaps * 4)).min(total_words.next_multiple_of(KWORDS));
    if words < KWORDS {
        return Err(crate::gpu::GpuError::over_budget(
            format!("overlap bitmaps of {rows_of_bitmaps} sets"),
            rows_of_bitmaps * KWORDS * 4 * 2,
            gpu.budget().available(),
        )
        .into());
    }
    let words = words / KWORDS * KWORDS;
    // ovl_bits writes every word of every row of a chunk: no zeroing.
    let left_bits = gpu.alloc::<u32>(if shared { 0 } else { nl * words }.max(1))?;
    let right_bits = gpu.alloc::<u32>(k * words)?;
    let stream = gpu.stream();
    phase(&format!("uploaded and allocated ({words} words a set, {rows_of_bitmaps} bitmaps)"))?;
    let set_bits = gpu.function(&KERNEL, "ovl_bits")?;
    let popc = gpu.function(&KERNEL, "ovl_popc")?;
    let sms = gpu.info().multiprocessors.max(1) as usize;
    let started = Instant::now();
    let (words_u, nl_u, k_u, self_u) = (words as u64, nl as u64, k as u64, self_form as u32);
    let (left_offset, zero) = (rows.start as u64, 0u64);
    let mut lo = 0usize;
    while lo < ids {
        let lo_u = lo as u32;
        let bits_of = |(offs, elems): &(crate::gpu::DeviceBuffer<u64>, crate::gpu::DeviceBuffer<u32>),
                       first: u64,
                       n: u64,
                       bits: &crate::gpu::DeviceBuffer<u32>|
         -> Result<()> {
            let mut b = stream.launch_builder(&set_bits);
            b.arg(&offs.slice).arg(&elems.slice).arg(&first).arg(&n).arg(&lo_u).arg(&words_u).arg(&bits.slice);
            let grid = (n as usize).clamp(1, sms * 16) as u32;
            let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: matches ovl_bits in kernels/overlap_bitmap.cu; sets first..first + n are the uploaded
            // family's (offsets hold one more entry); bits holds n rows of `words` words, all written.
            unsafe { b.launch(cfg) }.map_err(|e| cuda_err("overlap ovl_bits", e))?;
            Ok(())
        };
        bits_of(right.as_ref().unwrap_or(&left), 0, k_u, &right_bits)?;
        if !shared {
            bits_of(&left, left_offset, nl_u, &left_bits)?;
        }
        phase(&format!("bits of the chunk from {lo}"))?;
        let l = if shared { &right_bits } else { &left_bits };
        // Split the words across blocks until about 8 blocks an SM (a thousand sets make ~130 tiles).
        let tiles = k.div_ceil(TILE) * nl.div_ceil(TILE);
        let splits = (sms * 8).div_ceil(tiles).clamp(1, (words / KWORDS).clamp(1, 65_535));
        let split_u = (words.div_ceil(splits).next_multiple_of(KWORDS)) as u64;
        let mut b = stream.launch_builder(&popc);
        b.arg(&l.slice).arg(&right_bits.slice).arg(&words_u).arg(&nl_u).arg(&k_u).arg(&self_u);
        b.arg(if shared { &zero } else { &left_offset }).arg(&zero).arg(&counts.slice).arg(&k_u).arg(&split_u);
        let cfg = LaunchConfig {
            grid_dim: (k.div_ceil(TILE) as u32, nl.div_ceil(TILE) as u32, words.div_ceil(split_u as usize) as u32),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches ovl_popc; both bitmaps hold their rows of `words` words, counts nl * k counters;
        // the z blocks cover the words in splits of `split_u`.
        unsafe { b.launch(cfg) }.map_err(|e| cuda_err("overlap ovl_popc", e))?;
        phase(&format!("popcount GEMM, {splits} split(s) of the words"))?;
        lo += words * 32;
    }
    gpu.synchronize()?;
    ts.kernel += started.elapsed();
    let mut out = gpu.download(&counts, nl * k, ts)?;
    if self_form {
        // The GEMM covers whole tiles: clear the pairs outside the space.
        for (r, row) in out.chunks_mut(k).enumerate() {
            let from = space.first_right(rows.start + r).min(k);
            row[..from].iter_mut().for_each(|c| *c = 0);
        }
    }
    Ok(out)
}

/// Doctor self-check: both device methods equal the CPU twin on random
/// families, two-family and self form, with a small budget forcing chunks.
pub fn self_check(gpu: &Gpu) -> Result<String> {
    let mut checked = 0;
    for (k, max_len, domain, seed) in [(7, 20, 50, 1u64), (150, 300, 5_000, 2), (70, 2_000, 100_000, 3)] {
        let (f, g) = families::tests_data::random(k, k + 3, max_len, domain, seed);
        let from: Vec<u32> = (1..=f.len() as u32).collect();
        for space in [
            PairSpace { left: &f, right: &g, right_from: None },
            PairSpace { left: &f, right: &f, right_from: Some(&from) },
        ] {
            let inv = OnceLock::new();
            let n = space.left.len();
            for rows in [0..n, n / 3..n] {
                let want = counts_cpu(&space, inv.get_or_init(|| InvertedLists::of_space(&space)), rows.clone());
                for method in [OverlapMethod::InvertedLists, OverlapMethod::Bitmaps] {
                    let (got, _) =
                        counts_gpu(gpu, &space, &inv, rows.clone(), Some(method), &mut TransferStats::default())?;
                    if got != want {
                        return Err(datafusion::error::DataFusionError::Internal(format!(
                            "overlap counts by {} differ from the CPU twin (k {k}, rows {rows:?}, self {})",
                            method.name(),
                            space.right_from.is_some()
                        )));
                    }
                    checked += 1;
                }
            }
        }
    }
    Ok(format!("overlap: {checked} count matrices equal to the CPU twin"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every pair's overlap by merging the two sets (sets are sorted and distinct).
    fn brute(space: &PairSpace, rows: Range<usize>) -> Vec<u32> {
        let k = space.right.len();
        let mut out = vec![0u32; rows.len() * k];
        for (r, i) in rows.enumerate() {
            for j in space.first_right(i)..k {
                let (a, b) = (space.left.set(i), space.right.set(j));
                out[r * k + j] = a.iter().filter(|x| b.binary_search(x).is_ok()).count() as u32;
            }
        }
        out
    }

    #[test]
    fn cpu_counts_are_every_pairs_overlap() {
        for (k, k2, max_len, domain, seed) in [
            (0, 3, 5, 10, 1u64),
            (5, 0, 5, 10, 2),
            (6, 9, 30, 40, 7),
            (11, 11, 30, 40, 8),
            (40, 33, 60, 90, 3),
            (90, 90, 200, 5_000, 4),
        ] {
            let (f, g) = families::tests_data::random(k, k2, max_len, domain, seed);
            let from: Vec<u32> = (1..=f.len() as u32).collect();
            for space in [
                PairSpace { left: &f, right: &g, right_from: None },
                PairSpace { left: &f, right: &f, right_from: Some(&from) },
            ] {
                let inv = InvertedLists::of_space(&space);
                let n = space.left.len();
                for rows in [0..n, n / 2..n, 0..0] {
                    assert_eq!(
                        counts_cpu(&space, &inv, rows.clone()),
                        brute(&space, rows.clone()),
                        "k {k} rows {rows:?}"
                    );
                }
                // Up to 64 pairs of sets of up to 1024 elements, every element of every pair is sampled:
                // the estimate is exact.
                if space.pair_count(0..n) <= SAMPLED_PAIRS {
                    let total: u64 = counts_cpu(&space, &inv, 0..n).iter().map(|&c| c as u64).sum();
                    assert_eq!(estimate_increments(&space, 0..n), total, "an increment per shared element of a pair");
                }
            }
        }
    }

    #[test]
    fn the_cheaper_method_is_chosen() {
        // Few, large, overlapping sets over a small universe: bitmaps.
        let (f, g) = families::tests_data::random(20, 20, 2_000, 3_000, 5);
        let space = PairSpace { left: &f, right: &g, right_from: None };
        assert_eq!(choose(&space, 0..20, false), OverlapMethod::Bitmaps);
        // Many small sets over a large universe: inverted lists.
        let (f, g) = families::tests_data::random(2_000, 2_000, 8, 1_000_000, 6);
        let space = PairSpace { left: &f, right: &g, right_from: None };
        assert_eq!(choose(&space, 0..2_000, true), OverlapMethod::InvertedLists);
    }

    #[test]
    fn gpu_counts_equal_the_cpu_twin() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let lease = gpu.lease(0);
        println!("{}", self_check(&lease).unwrap());
    }
}
