//! Overlap counts: |x ∩ y| for every pair of sets of two families, or of one
//! family with itself (seed 004's MISI, "multiple-input set intersection").
//! The `intersect_families(..., 'counts')` level of
//! [`crate::exec::families`] runs it.
//!
//! Three device methods, chosen by [`choose`] from their estimated time (work
//! times measured unit costs); each fits the seed's memory rules (its case
//! B6) by tiling, not by refusing:
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
//! * [`OverlapMethod::PartitionedSearch`] (the seed's IP-OBS, for few large
//!   sets over a vast universe): each pair's merge cut into tiles of
//!   [`SEARCH_TILE`] steps by Merge Path diagonals (IP), and in each tile the
//!   smaller piece looked up in the larger, staged in shared memory (OBS;
//!   kernels/overlap_search.cu); work Σ over pairs of |x| + |y|, independent
//!   of the universe. Its diagonals take 8 bytes a tile (the seed's
//!   O(k² · blocks)), so pairs run in batches whose diagonals fit the budget.
//!   Seed 004's plain IP (a merge per tile) is the sorted intersection of
//!   [`crate::algo::sorted_intersect`]; its OBS and HI without IP leave
//!   million-element sets to one block, which the seed finds slower.
//!
//! [`counts_cpu`] is the CPU twin (inverted lists on the host's threads);
//! [`search_counts_cpu`] runs the partitioned search's tiles on the host.

use std::ops::Range;
use std::sync::OnceLock;

use datafusion::error::Result;

use crate::algo::families::{self, InvertedLists, PairSpace};
use crate::gpu::{Gpu, TransferStats};

pub mod bitmap;
pub mod search;
mod shared;

pub use search::{merged_elements, search_counts_cpu, search_counts_gpu, SEARCH_TILE};

/// How [`counts_gpu`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverlapMethod {
    InvertedLists,
    Bitmaps,
    PartitionedSearch,
}

impl OverlapMethod {
    /// Every method, in the order [`MethodSeconds::cheapest`] prefers on ties.
    pub const ALL: [OverlapMethod; 3] =
        [OverlapMethod::InvertedLists, OverlapMethod::Bitmaps, OverlapMethod::PartitionedSearch];

    pub fn name(self) -> &'static str {
        match self {
            OverlapMethod::InvertedLists => "inverted lists",
            OverlapMethod::Bitmaps => "bitmaps",
            OverlapMethod::PartitionedSearch => "partitioned search (IP-OBS)",
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
/// increment on the device (2.2-2.6 s for 0.7-1.0 x 10^11); an element
/// indexed into inverted lists on the host's threads (2.7-7.3 s for 10^9);
/// a word pair of the popcount GEMM (0.57 s for 1.56 x 10^12); and an
/// element uploaded, with its set's bitmap allocated and written (~0.9 s for
/// 10^9 over 10^8 ids, at 1.4 s before).
const PS_PER_INCREMENT: f64 = 28.0;
const PS_PER_INDEXED_ELEMENT: f64 = 5_000.0;
const PS_PER_WORD_PAIR: f64 = 0.4;
const PS_PER_BITMAP_ELEMENT: f64 = 1_500.0;
/// The partitioned search's units, from the same run: a step of a pair's
/// merge (an element staged or looked up) and a tile (its diagonal's search
/// and its pair's loads), 3.63 s for 9.99 x 10^11 steps in 2.44 x 10^8
/// tiles; an element of the families uploaded (~90 ms for 10^9).
const PS_PER_MERGED_ELEMENT: f64 = 3.1;
const PS_PER_TILE: f64 = 2_000.0;
const PS_PER_UPLOADED_ELEMENT: f64 = 100.0;

/// The estimated seconds of each device method ([`estimate_seconds`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MethodSeconds {
    /// Indexing the right family on the host included, unless it is indexed.
    pub inverted_lists: f64,
    pub bitmaps: f64,
    pub partitioned_search: f64,
}

impl MethodSeconds {
    pub fn of(&self, method: OverlapMethod) -> f64 {
        match method {
            OverlapMethod::InvertedLists => self.inverted_lists,
            OverlapMethod::Bitmaps => self.bitmaps,
            OverlapMethod::PartitionedSearch => self.partitioned_search,
        }
    }

    /// The method of least estimated time (the first of [`OverlapMethod::ALL`] on ties).
    pub fn cheapest(&self) -> OverlapMethod {
        OverlapMethod::ALL
            .into_iter()
            .fold(OverlapMethod::InvertedLists, |m, c| if self.of(c) < self.of(m) { c } else { m })
    }
}

/// The estimated seconds of each method ([`MethodSeconds`]).
pub fn estimate_seconds(space: &PairSpace, rows: Range<usize>, indexed: bool) -> MethodSeconds {
    estimate_seconds_over(space, rows, indexed, space.domain())
}

/// [`estimate_seconds`] with the ids' domain already known.
fn estimate_seconds_over(space: &PairSpace, rows: Range<usize>, indexed: bool, domain: usize) -> MethodSeconds {
    let pairs = space.pair_count(rows.clone()) as f64;
    let word_pairs = pairs * domain.div_ceil(32) as f64;
    let elements = space.right.elements.len() as f64;
    let index = if indexed { 0.0 } else { elements * PS_PER_INDEXED_ELEMENT };
    let inverted = estimate_increments(space, rows.clone()) as f64 * PS_PER_INCREMENT + index;
    let bitmaps = word_pairs * PS_PER_WORD_PAIR + elements * PS_PER_BITMAP_ELEMENT;
    let merged = merged_elements(space, rows) as f64;
    let uploaded =
        space.left.elements.len() + if std::ptr::eq(space.left, space.right) { 0 } else { space.right.elements.len() };
    let search = merged * PS_PER_MERGED_ELEMENT
        + (merged / SEARCH_TILE as f64 + pairs) * PS_PER_TILE
        + uploaded as f64 * PS_PER_UPLOADED_ELEMENT;
    MethodSeconds { inverted_lists: inverted * 1e-12, bitmaps: bitmaps * 1e-12, partitioned_search: search * 1e-12 }
}

/// The method with the least estimated time ([`estimate_seconds`]).
pub fn choose(space: &PairSpace, rows: Range<usize>, indexed: bool) -> OverlapMethod {
    estimate_seconds(space, rows, indexed).cheapest()
}

/// CPU twin of [`counts_gpu`]: the counts of the pairs of left sets `rows`, a
/// row-major `rows.len() x k_right` matrix (0 outside the pair space), by the
/// right family's inverted lists, the rows spread over the host's threads.
pub fn counts_cpu(space: &PairSpace, inv: &InvertedLists, rows: Range<usize>) -> Vec<u32> {
    shared::rows_on_host_threads(space, rows, &|i, row| {
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
    })
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
    // The ids' domain (a look at every set) at most once, for the choice, the lists and the bitmaps.
    let domain = std::cell::OnceCell::new();
    let domain = || *domain.get_or_init(|| space.domain());
    let method =
        method.unwrap_or_else(|| estimate_seconds_over(space, rows.clone(), inv.get().is_some(), domain()).cheapest());
    let counts = match method {
        OverlapMethod::InvertedLists => {
            let inv = inv.get_or_init(|| InvertedLists::of(space.right, domain()));
            families::pair_counts_gpu(gpu, space, inv, rows, ts)?
        }
        OverlapMethod::Bitmaps => bitmap::counts_gpu(gpu, space, rows, domain(), ts)?,
        OverlapMethod::PartitionedSearch => search_counts_gpu(gpu, space, rows, SEARCH_TILE, ts)?,
    };
    Ok((counts, method))
}

/// Doctor self-check: every device method equals the CPU twin on random
/// families, two-family and self form; the partitioned search also with
/// tiles of 7 merge steps (a match split across tiles in every pair).
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
                let mut runs: Vec<(String, Vec<u32>)> = Vec::new();
                for method in OverlapMethod::ALL {
                    let (got, _) =
                        counts_gpu(gpu, &space, &inv, rows.clone(), Some(method), &mut TransferStats::default())?;
                    runs.push((method.name().to_string(), got));
                }
                let small_tiles = search_counts_gpu(gpu, &space, rows.clone(), 7, &mut TransferStats::default())?;
                runs.push(("partitioned search in tiles of 7".into(), small_tiles));
                for (name, got) in runs {
                    if got != want {
                        return Err(datafusion::error::DataFusionError::Internal(format!(
                            "overlap counts by {name} differ from the CPU twin (k {k}, rows {rows:?}, self {})",
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
    use super::shared::brute;
    use super::*;

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
        // Many large, overlapping sets over a small universe: bitmaps (a pair is 32 words, not 400 merge steps).
        let (f, g) = families::tests_data::random(1_500, 1_500, 400, 1_000, 5);
        let space = PairSpace { left: &f, right: &g, right_from: None };
        assert_eq!(choose(&space, 0..1_500, false), OverlapMethod::Bitmaps);
        // Many small sets over a large universe: inverted lists.
        let (f, g) = families::tests_data::random(2_000, 2_000, 8, 1_000_000, 6);
        let space = PairSpace { left: &f, right: &g, right_from: None };
        assert_eq!(choose(&space, 0..2_000, true), OverlapMethod::InvertedLists);
        // Two large sets over a vast universe (seed 004's SISI): the partitioned search.
        let (f, g) = families::tests_data::random(2, 2, 200_000, 1_000_000_000, 7);
        let space = PairSpace { left: &f, right: &g, right_from: None };
        let est = estimate_seconds(&space, 0..2, false);
        assert_eq!(est.cheapest(), OverlapMethod::PartitionedSearch, "{est:?}");
    }

    #[test]
    fn gpu_counts_equal_the_cpu_twin() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let lease = gpu.lease(0);
        println!("{}", self_check(&lease).unwrap());
    }
}
