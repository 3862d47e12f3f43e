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

/// kernels/overlap_search.cu.
pub static SEARCH_KERNEL: crate::gpu::KernelSource = crate::gpu::KernelSource {
    family: "overlap_search",
    source: include_str!("../../kernels/overlap_search.cu"),
    defines: crate::gpu::no_defines,
};

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

/// The steps of every pair's merge, Σ |x| + |y| over the pairs of left sets
/// `rows`: the partitioned search's work (one pass over the right sets' sizes).
pub fn merged_elements(space: &PairSpace, rows: Range<usize>) -> u64 {
    let k = space.right.len();
    let mut suffix = vec![0u64; k + 1];
    for j in (0..k).rev() {
        suffix[j] = suffix[j + 1] + space.right.set(j).len() as u64;
    }
    rows.map(|i| {
        let from = space.first_right(i).min(k);
        (k - from) as u64 * space.left.set(i).len() as u64 + suffix[from]
    })
    .sum()
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
        OverlapMethod::Bitmaps => bitmap_counts_gpu(gpu, space, rows, domain(), ts)?,
        OverlapMethod::PartitionedSearch => search_counts_gpu(gpu, space, rows, SEARCH_TILE, ts)?,
    };
    Ok((counts, method))
}

/// Threads of a block of both bitmap kernels (the GEMM's 64 x 64 tile needs 256).
const THREADS: u32 = 256;
/// The GEMM's tile of counts, and the words it stages at a time (OVL_TILE, OVL_KWORDS).
const TILE: usize = 64;
const KWORDS: usize = 32;

/// SETFUSION_TRACE: a phase's time, the device synchronised after it, as
/// "`what`: `phase`: N ms" (nothing when not tracing).
fn traced_phases<'g>(gpu: &'g Gpu, what: &'static str) -> impl FnMut(&str) -> Result<()> + 'g {
    let mut last = Instant::now();
    move |phase: &str| {
        if crate::env::trace() {
            gpu.synchronize()?;
            eprintln!("{what}: {phase}: {:.1} ms", last.elapsed().as_secs_f64() * 1e3);
            last = Instant::now();
        }
        Ok(())
    }
}

/// A family on the device: its offsets (as u64) and elements (one dummy
/// element when it has none: a buffer is never empty).
type DeviceFamily = (crate::gpu::DeviceBuffer<u64>, crate::gpu::DeviceBuffer<u32>);

fn upload_family(gpu: &Gpu, f: &families::Family, ts: &mut TransferStats) -> Result<DeviceFamily> {
    let offs: Vec<u64> = f.offsets.iter().map(|&o| o as u64).collect();
    let elements: &[u32] = if f.elements.is_empty() { &[0] } else { &f.elements };
    Ok((gpu.upload(&offs, ts)?, gpu.upload(elements, ts)?))
}

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
    let mut phase = traced_phases(gpu, "overlap bitmaps");
    let self_form = space.right_from.is_some();
    // The self form over every row: the left bitmaps are the right ones.
    let shared = self_form && rows == (0..space.left.len());
    let left = upload_family(gpu, space.left, ts)?;
    let right = if self_form { None } else { Some(upload_family(gpu, space.right, ts)?) };
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
        let bits_of =
            |(offs, elems): &DeviceFamily, first: u64, n: u64, bits: &crate::gpu::DeviceBuffer<u32>| -> Result<()> {
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

/// Merge steps of a pair a tile of the partitioned search holds (the kernel's
/// OVS_MAX_NV): its larger piece, at most one more element, is staged in 16 KB
/// of shared memory.
pub const SEARCH_TILE: usize = 4096;

/// Merge Path: the number of `a`'s elements among the first `diag` of the
/// merge of `a` and `b`, `a` first on ties (the kernels' `sf_merge_path`).
fn merge_path(a: &[u32], b: &[u32], diag: usize) -> usize {
    let (mut lo, mut hi) = (diag.saturating_sub(b.len()), diag.min(a.len()));
    while lo < hi {
        let mid = (lo + hi) / 2;
        if a[mid] <= b[diag - 1 - mid] {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// One tile of the partitioned search of `a` and `b` (distinct, ascending),
/// the merge steps from `d0` (`a0` of them `a`'s) to `d1` (`a1`): the matches
/// whose `b` element falls in it, |a[a0 - 1 (if any), a1) ∩ b[d0 - a0, d1 - a1)|,
/// the smaller piece looked up in the larger (`ovs_count`'s work).
fn tile_matches(a: &[u32], b: &[u32], (d0, a0): (usize, usize), (d1, a1): (usize, usize)) -> u32 {
    let pa = &a[a0.saturating_sub(1)..a1];
    let pb = &b[d0 - a0..d1 - a1];
    let (small, large) = if pa.len() <= pb.len() { (pa, pb) } else { (pb, pa) };
    small.iter().filter(|x| large.binary_search(x).is_ok()).count() as u32
}

/// |a ∩ b| by the partitioned search's tiles of `nv` merge steps.
fn pair_search_count(a: &[u32], b: &[u32], nv: usize) -> u32 {
    let total = a.len() + b.len();
    let mut start = (0, 0);
    let mut count = 0;
    while start.0 < total {
        let d1 = (start.0 + nv).min(total);
        let end = (d1, merge_path(a, b, d1));
        count += tile_matches(a, b, start, end);
        start = end;
    }
    count
}

/// CPU twin of [`search_counts_gpu`]: the same matrix as [`counts_cpu`], by
/// the same tiles of `nv` merge steps a pair, counted the same way, the rows
/// spread over the host's threads.
pub fn search_counts_cpu(space: &PairSpace, rows: Range<usize>, nv: usize) -> Vec<u32> {
    let k = space.right.len();
    let mut out = vec![0u32; rows.len() * k];
    if k == 0 || rows.is_empty() {
        return out;
    }
    let nv = nv.max(1);
    let per = rows.len().div_ceil(crate::host::copy_threads().max(1) * 4).max(1);
    let mut parts: Vec<(usize, &mut [u32])> =
        out.chunks_mut(per * k).enumerate().map(|(c, part)| (rows.start + c * per, part)).collect();
    crate::host::for_each_mut(&mut parts, &|_, (first, part)| {
        for (r, row) in part.chunks_mut(k).enumerate() {
            let i = *first + r;
            for (j, c) in row.iter_mut().enumerate().skip(space.first_right(i)) {
                *c = pair_search_count(space.left.set(i), space.right.set(j), nv);
            }
        }
    });
    out
}

/// One batch of the partitioned search: pairs `pairs[2p]` (a left set) and
/// `pairs[2p + 1]` (a right set), pair `p` owning tiles
/// `tile_start[p]..tile_start[p + 1]`.
#[derive(Debug, Default, PartialEq, Eq)]
struct SearchBatch {
    pairs: Vec<u32>,
    tile_start: Vec<u64>,
}

impl SearchBatch {
    fn tiles(&self) -> u64 {
        self.tile_start.last().copied().unwrap_or(0)
    }
}

/// Device bytes a tile of a batch takes at most: its diagonal (pair and A
/// position, 8 bytes), and its pair's entries (8 + 8) for a pair of one tile.
const SEARCH_BYTES_PER_TILE: usize = 24;

/// The pairs of left sets `rows` with any element, in row-major order, cut
/// into batches of at most `max_tiles` tiles of `nv` merge steps (a pair of
/// more tiles is a batch of its own).
struct SearchBatches<'a> {
    space: &'a PairSpace<'a>,
    rows_end: usize,
    nv: u64,
    max_tiles: u64,
    /// The next pair: a left set and a right one.
    at: (usize, usize),
}

impl<'a> SearchBatches<'a> {
    fn new(space: &'a PairSpace<'a>, rows: Range<usize>, nv: usize, max_tiles: u64) -> Self {
        let at = (rows.start, if rows.is_empty() { 0 } else { space.first_right(rows.start) });
        SearchBatches { space, rows_end: rows.end, nv: nv.max(1) as u64, max_tiles: max_tiles.max(1), at }
    }
}

impl Iterator for SearchBatches<'_> {
    type Item = SearchBatch;

    fn next(&mut self) -> Option<SearchBatch> {
        let k = self.space.right.len();
        let mut batch = SearchBatch { pairs: Vec::new(), tile_start: vec![0] };
        while self.at.0 < self.rows_end {
            let (i, j) = self.at;
            if j >= k {
                self.at = (i + 1, if i + 1 < self.rows_end { self.space.first_right(i + 1) } else { 0 });
                continue;
            }
            let merged = (self.space.left.set(i).len() + self.space.right.set(j).len()) as u64;
            let tiles = merged.div_ceil(self.nv);
            if tiles > 0 {
                if batch.tiles() > 0 && batch.tiles() + tiles > self.max_tiles {
                    break;
                }
                batch.pairs.extend([i as u32, j as u32]);
                batch.tile_start.push(batch.tiles() + tiles);
            }
            self.at.1 += 1;
        }
        (batch.tiles() > 0).then_some(batch)
    }
}

/// [`counts_gpu`] by partitioned search (seed 004's IP-OBS): the pairs in
/// batches whose diagonals take at most half the free budget, each cut into
/// tiles of `nv` (at most [`SEARCH_TILE`]) merge steps; kernels/overlap_search.cu.
pub fn search_counts_gpu(
    gpu: &Gpu,
    space: &PairSpace,
    rows: Range<usize>,
    nv: usize,
    ts: &mut TransferStats,
) -> Result<Vec<u32>> {
    let (nl, k) = (rows.len(), space.right.len());
    if nl == 0 || k == 0 {
        return Ok(vec![0u32; nl * k]);
    }
    if !(1..=SEARCH_TILE).contains(&nv) {
        return Err(datafusion::error::DataFusionError::Internal(format!(
            "partitioned search: tiles of {nv} merge steps (1..={SEARCH_TILE})"
        )));
    }
    let mut phase = traced_phases(gpu, "overlap search");
    let left = upload_family(gpu, space.left, ts)?;
    let right = if std::ptr::eq(space.left, space.right) { None } else { Some(upload_family(gpu, space.right, ts)?) };
    let right = right.as_ref().unwrap_or(&left);
    let counts = gpu.alloc_zeros::<u32>(nl * k)?;
    let max_tiles = (gpu.budget().available() / 2 / SEARCH_BYTES_PER_TILE).min(u32::MAX as usize) as u64;
    if max_tiles == 0 {
        return Err(crate::gpu::GpuError::over_budget(
            "partitioned search diagonals",
            2 * SEARCH_BYTES_PER_TILE,
            gpu.budget().available(),
        )
        .into());
    }
    phase("uploaded")?;
    let partitions = gpu.function(&SEARCH_KERNEL, "ovs_partitions")?;
    let count = gpu.function(&SEARCH_KERNEL, "ovs_count")?;
    let stream = gpu.stream();
    let sms = gpu.info().multiprocessors.max(1) as u64;
    let started = Instant::now();
    let (nv_u, row0, ldc) = (nv as u64, rows.start as u64, k as u64);
    for batch in SearchBatches::new(space, rows, nv, max_tiles) {
        let (npairs, ntiles) = ((batch.tile_start.len() - 1) as u64, batch.tiles());
        let pairs = gpu.upload(&batch.pairs, ts)?;
        let tile_start = gpu.upload(&batch.tile_start, ts)?;
        let tile_pair = gpu.alloc::<u32>(ntiles as usize)?;
        let tile_a0 = gpu.alloc::<u32>(ntiles as usize)?;
        let mut b = stream.launch_builder(&partitions);
        b.arg(&left.0.slice).arg(&left.1.slice).arg(&right.0.slice).arg(&right.1.slice);
        b.arg(&pairs.slice).arg(&tile_start.slice).arg(&npairs).arg(&ntiles).arg(&nv_u);
        b.arg(&tile_pair.slice).arg(&tile_a0.slice);
        let grid = ntiles.div_ceil(THREADS as u64).clamp(1, sms * 32) as u32;
        let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: matches ovs_partitions in kernels/overlap_search.cu; pairs name sets of the uploaded
        // families (offsets hold one more entry), tile_start holds npairs + 1 entries ending at ntiles,
        // tile_pair and tile_a0 ntiles each.
        unsafe { b.launch(cfg) }.map_err(|e| cuda_err("overlap ovs_partitions", e))?;
        let mut b = stream.launch_builder(&count);
        b.arg(&left.0.slice).arg(&left.1.slice).arg(&right.0.slice).arg(&right.1.slice);
        b.arg(&pairs.slice).arg(&tile_start.slice).arg(&ntiles).arg(&nv_u);
        b.arg(&tile_pair.slice).arg(&tile_a0.slice).arg(&row0).arg(&ldc).arg(&counts.slice);
        let grid = ntiles.clamp(1, sms * 16) as u32;
        let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: matches ovs_count; the batch's buffers as above, written by ovs_partitions before it on
        // this stream; every pair's left set lies in rows, so counts (nl x k) holds its cell; nv <= OVS_MAX_NV.
        unsafe { b.launch(cfg) }.map_err(|e| cuda_err("overlap ovs_count", e))?;
        phase(&format!("a batch of {npairs} pairs, {ntiles} tiles"))?;
    }
    gpu.synchronize()?;
    ts.kernel += started.elapsed();
    gpu.download(&counts, nl * k, ts)
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

    /// Pairs sharing every element, none, or some; tiles of 1 step up to
    /// larger than the pair; empty sets: the tiles count every match once.
    #[test]
    fn search_tiles_count_every_pairs_overlap() {
        for (k, k2, max_len, domain, seed) in
            [(0, 3, 5, 10, 1u64), (6, 9, 30, 40, 7), (11, 11, 30, 40, 8), (40, 33, 60, 90, 3), (30, 30, 300, 400, 9)]
        {
            let (f, g) = families::tests_data::random(k, k2, max_len, domain, seed);
            let from: Vec<u32> = (1..=f.len() as u32).collect();
            for space in [
                PairSpace { left: &f, right: &g, right_from: None },
                PairSpace { left: &f, right: &f, right_from: Some(&from) },
            ] {
                let n = space.left.len();
                for rows in [0..n, n / 2..n, 0..0] {
                    let want = brute(&space, rows.clone());
                    for nv in [1, 2, 3, 7, 64, SEARCH_TILE] {
                        assert_eq!(search_counts_cpu(&space, rows.clone(), nv), want, "k {k} rows {rows:?} nv {nv}");
                    }
                }
                let merged: u64 = (0..n)
                    .flat_map(|i| (space.first_right(i)..space.right.len()).map(move |j| (i, j)))
                    .map(|(i, j)| (space.left.set(i).len() + space.right.set(j).len()) as u64)
                    .sum();
                assert_eq!(merged_elements(&space, 0..n), merged);
            }
        }
        // Identical sets: every element is a match, whatever the tiles.
        let same: Vec<u32> = (0..1000).map(|x| x * 3).collect();
        for nv in [1, 2, 5, 1000, 4096] {
            assert_eq!(pair_search_count(&same, &same, nv), 1000);
            assert_eq!(pair_search_count(&same, &same[1..], nv), 999);
            assert_eq!(pair_search_count(&same, &[], nv), 0);
        }
    }

    /// Batches hold every pair with an element once, in row-major order,
    /// within their tile limit unless a pair alone exceeds it.
    #[test]
    fn search_batches_cover_every_pair_once() {
        let (f, g) = families::tests_data::random(25, 31, 50, 200, 11);
        let from: Vec<u32> = (1..=f.len() as u32).collect();
        for space in [
            PairSpace { left: &f, right: &g, right_from: None },
            PairSpace { left: &f, right: &f, right_from: Some(&from) },
        ] {
            let n = space.left.len();
            for rows in [0..n, 3..n - 2, 0..0] {
                let want: Vec<(u32, u32)> = rows
                    .clone()
                    .flat_map(|i| (space.first_right(i)..space.right.len()).map(move |j| (i, j)))
                    .filter(|&(i, j)| space.left.set(i).len() + space.right.set(j).len() > 0)
                    .map(|(i, j)| (i as u32, j as u32))
                    .collect();
                for (nv, max_tiles) in [(1, 1), (4, 3), (16, 40), (4096, 1 << 40)] {
                    let mut got = Vec::new();
                    for b in SearchBatches::new(&space, rows.clone(), nv, max_tiles) {
                        let pairs: Vec<(u32, u32)> = b.pairs.chunks(2).map(|p| (p[0], p[1])).collect();
                        assert_eq!(b.tile_start.len(), pairs.len() + 1);
                        for (p, &(i, j)) in pairs.iter().enumerate() {
                            let merged = space.left.set(i as usize).len() + space.right.set(j as usize).len();
                            assert_eq!(b.tile_start[p + 1] - b.tile_start[p], merged.div_ceil(nv) as u64);
                        }
                        assert!(b.tiles() <= max_tiles || pairs.len() == 1, "{} tiles", b.tiles());
                        got.extend(pairs);
                    }
                    assert_eq!(got, want, "nv {nv} max_tiles {max_tiles}");
                }
            }
        }
    }

    #[test]
    fn gpu_counts_equal_the_cpu_twin() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let lease = gpu.lease(0);
        println!("{}", self_check(&lease).unwrap());
    }

    /// A budget that holds the families and counts but few diagonals: the
    /// partitioned search runs in many batches (seed 004's case B6) and
    /// counts as in one.
    #[test]
    fn gpu_search_tiles_when_memory_is_short() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let (f, g) = families::tests_data::random(60, 50, 3_000, 20_000, 12);
        let space = PairSpace { left: &f, right: &g, right_from: None };
        let want = brute(&space, 10..60);
        let mut ts = TransferStats::default();
        let roomy = search_counts_gpu(&gpu.lease(0), &space, 10..60, SEARCH_TILE, &mut ts).unwrap();
        assert_eq!(roomy, want);
        // Families, counts and 2 x 24 bytes a tile for ~40 tiles: 3,000 pairs of 1-2 tiles in ~100 batches.
        let data = (f.elements.len() + g.elements.len()) * 4 + (f.offsets.len() + g.offsets.len()) * 8;
        let limit = gpu.budget().used() + data + 50 * 50 * 4 + 40 * 2 * SEARCH_BYTES_PER_TILE + 1024;
        let batches = SearchBatches::new(&space, 10..60, SEARCH_TILE, 40).count();
        assert!(batches > 50, "{batches} batches");
        let short = search_counts_gpu(&gpu.lease(limit), &space, 10..60, SEARCH_TILE, &mut ts).unwrap();
        assert_eq!(short, want);
        // Too little for the families at all: an error, not a wrong answer.
        assert!(search_counts_gpu(&gpu.lease(1024), &space, 10..60, SEARCH_TILE, &mut ts).is_err());
    }
}
