//! Overlap counts by partitioned search (seed 004's IP-OBS): each pair's
//! merge cut into tiles by Merge Path diagonals, each tile's smaller piece
//! looked up in its larger, staged in shared memory; the diagonals in batches
//! of pairs that fit the budget. kernels/overlap_search.cu; the choice among
//! the methods is in [`super`].

use std::ops::Range;
use std::time::Instant;

use cudarc::driver::{LaunchConfig, PushKernelArg};
use datafusion::error::Result;

use super::shared::{rows_on_host_threads, traced_phases, upload_family};
use crate::algo::families::PairSpace;
use crate::gpu::{cuda_err, Gpu, TransferStats};

/// kernels/overlap_search.cu.
pub static KERNEL: crate::gpu::KernelSource = crate::gpu::KernelSource {
    family: "overlap_search",
    source: include_str!("../../../kernels/overlap_search.cu"),
    defines: crate::gpu::no_defines,
};

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

/// Threads of a block of both search kernels (`ovs_count`'s launch bound).
const THREADS: u32 = 256;

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

/// CPU twin of [`search_counts_gpu`]: the same matrix as [`super::counts_cpu`], by
/// the same tiles of `nv` merge steps a pair, counted the same way, the rows
/// spread over the host's threads.
pub fn search_counts_cpu(space: &PairSpace, rows: Range<usize>, nv: usize) -> Vec<u32> {
    let nv = nv.max(1);
    rows_on_host_threads(space, rows, &|i, row| {
        for (j, c) in row.iter_mut().enumerate().skip(space.first_right(i)) {
            *c = pair_search_count(space.left.set(i), space.right.set(j), nv);
        }
    })
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

/// [`super::counts_gpu`] by partitioned search (seed 004's IP-OBS): the pairs in
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
    let partitions = gpu.function(&KERNEL, "ovs_partitions")?;
    let count = gpu.function(&KERNEL, "ovs_count")?;
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

#[cfg(test)]
mod tests {
    use super::super::shared::brute;
    use super::*;
    use crate::algo::families;

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
