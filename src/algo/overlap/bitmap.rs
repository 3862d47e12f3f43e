//! Overlap counts by bitmaps (seed 004's BI): every set a bitmap over the
//! universe, counts by a tiled popcount GEMM; the universe in chunks whose
//! bitmaps fit the budget. kernels/overlap_bitmap.cu; the choice among the
//! methods and the CPU twin are in [`super`].

use std::ops::Range;
use std::time::Instant;

use cudarc::driver::{LaunchConfig, PushKernelArg};
use datafusion::error::Result;

use super::shared::{traced_phases, upload_family, DeviceFamily};
use crate::algo::families::PairSpace;
use crate::gpu::{cuda_err, Gpu, TransferStats};

/// kernels/overlap_bitmap.cu.
pub static KERNEL: crate::gpu::KernelSource = crate::gpu::KernelSource {
    family: "overlap_bitmap",
    source: include_str!("../../../kernels/overlap_bitmap.cu"),
    defines: crate::gpu::no_defines,
};

/// Threads of a block of both bitmap kernels (the GEMM's 64 x 64 tile needs 256).
const THREADS: u32 = 256;
/// The GEMM's tile of counts, and the words it stages at a time (OVL_TILE, OVL_KWORDS).
const TILE: usize = 64;
const KWORDS: usize = 32;

/// [`super::counts_gpu`] by bitmaps: the universe in chunks of `words` 32-bit words
/// a set, as many as the budget holds for the left rows' and the right
/// sets' bitmaps (one set of bitmaps in the self form over every row).
/// `ids`: every element id lies below it ([`PairSpace::domain`]).
pub(super) fn counts_gpu(
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
