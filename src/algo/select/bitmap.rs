//! The bitmap strategy's launcher (`kernels/bitmap_setops.cu`): presence
//! bits, claimable bits or counts over the keys' dense domain. CPU twin:
//! [`super::cpu::select_cpu`].

use cudarc::driver::{CudaView, PushKernelArg};
use datafusion::error::{DataFusionError, Result};

use super::SetOp;
use crate::gpu::{cuda_err, DeviceBuffer, Gpu, TransferStats};

/// kernels/bitmap_setops.cu, with its contract constants as `-D` options.
pub static KERNEL: crate::gpu::KernelSource = crate::gpu::KernelSource {
    family: "bitmap_setops",
    source: include_str!("../../../kernels/bitmap_setops.cu"),
    defines: super::op_defines,
};

/// Largest key domain (max - min + 1) the bitmap strategy accepts.
pub const BITMAP_MAX_RANGE: u64 = 1 << 32;

/// A build side on the device over its dense domain, ready to probe any run
/// of probe keys (which may lie outside the domain).
pub(super) enum BitmapTable {
    /// Semi / anti joins: one presence bit per value of [lo, lo + range).
    Bits { bits: DeviceBuffer<u32>, lo: u64, range: u64 },
    /// INTERSECT [ALL] / EXCEPT [ALL] with build multiplicities 0 or 1 (the
    /// DISTINCT forms need no more): one bit per value that the first probe
    /// row of its key claims (clears), which gives each row its rank 0 or
    /// >= 1. EXCEPT DISTINCT's bits are inverted once the build side is in
    /// ([`BitmapTable::seal`]): its rows claim the values the build side lacks.
    Claims { bits: DeviceBuffer<u32>, lo: u64, range: u64 },
    /// The ALL forms when a build key repeats: build counts and probe counters.
    Counts { count_b: DeviceBuffer<u32>, ctr_a: DeviceBuffer<u32>, lo: u64, range: u64 },
}

impl BitmapTable {
    /// Build the table over `range`, the build keys' domain (a domain wider
    /// than [`BITMAP_MAX_RANGE`] is an error: the dispatch never picks one);
    /// EXCEPT DISTINCT needs one holding every probe key too. The kernels are
    /// queued, not awaited, except that the ALL forms read whether a build key
    /// repeats.
    pub(super) fn build(
        gpu: &Gpu,
        op: SetOp,
        d_build: &DeviceBuffer<u64>,
        nb: usize,
        range: Option<(u64, u64)>,
    ) -> Result<Self> {
        let (lo, range) = match range {
            Some((lo, hi)) if hi - lo < BITMAP_MAX_RANGE => (lo, hi - lo + 1),
            Some((lo, hi)) => {
                return Err(DataFusionError::Plan(format!(
                    "bitmap strategy: key range {} too wide",
                    (hi - lo).saturating_add(1)
                )))
            }
            None => (0, 1),
        };
        let (stream, nb64, words) = (gpu.stream(), nb as u64, (range as usize).div_ceil(32));
        let bits = gpu.alloc_zeros::<u32>(words)?;
        if !op.needs_counts() {
            if nb > 0 {
                let f = gpu.function(&KERNEL, "build_bits")?;
                // SAFETY: signature matches kernels/bitmap_setops.cu; the bitmap covers [lo, lo + range), which holds every build key.
                unsafe {
                    stream
                        .launch_builder(&f)
                        .arg(&d_build.slice)
                        .arg(&nb64)
                        .arg(&lo)
                        .arg(&range)
                        .arg(&bits.slice)
                        .launch(gpu.grid_stride(nb, 32))
                }
                .map_err(|e| cuda_err("bitmap build", e))?;
            }
            return Ok(BitmapTable::Bits { bits, lo, range });
        }
        // Multiset rules first try two bitmaps; counts only when a build key repeats.
        let dup = gpu.alloc_zeros::<u32>(1)?;
        if nb > 0 {
            let f = gpu.function(&KERNEL, "build_bits_dup")?;
            // SAFETY: as above; `dup` holds one flag.
            unsafe {
                stream
                    .launch_builder(&f)
                    .arg(&d_build.slice)
                    .arg(&nb64)
                    .arg(&lo)
                    .arg(&range)
                    .arg(&bits.slice)
                    .arg(&dup.slice)
                    .launch(gpu.grid_stride(nb, 32))
            }
            .map_err(|e| cuda_err("bitmap build", e))?;
        }
        let all = matches!(op, SetOp::IntersectAll | SetOp::ExceptAll);
        if !all || gpu.read_one(&dup, 0, &mut TransferStats::default())? == 0 {
            let table = BitmapTable::Claims { bits, lo, range };
            table.seal(gpu, op)?;
            return Ok(table);
        }
        drop(bits);
        let count_b = gpu.alloc_zeros::<u32>(range as usize)?;
        let ctr_a = gpu.alloc_zeros::<u32>(range as usize)?;
        let f = gpu.function(&KERNEL, "build_counts")?;
        // SAFETY: as above; the count arrays cover [lo, lo + range).
        unsafe {
            stream
                .launch_builder(&f)
                .arg(&d_build.slice)
                .arg(&nb64)
                .arg(&lo)
                .arg(&count_b.slice)
                .launch(gpu.grid_stride(nb, 32))
        }
        .map_err(|e| cuda_err("bitmap build", e))?;
        Ok(BitmapTable::Counts { count_b, ctr_a, lo, range })
    }

    /// Device bytes of the one-bitmap tables over `range` values
    /// ([`BitmapTable::empty`]), whatever the rule.
    pub(super) fn streamed_bytes(range: u64) -> usize {
        (range as usize).div_ceil(32) * 4
    }

    /// An empty table over [lo, lo + range) whose build keys arrive in runs
    /// ([`BitmapTable::add_build`], then [`BitmapTable::seal`]): presence bits
    /// (semi / anti joins) or claimable bits (the multiset rules; the ALL
    /// forms are exact only when no build key repeats, which `dup` reports
    /// after the runs).
    pub(super) fn empty(gpu: &Gpu, op: SetOp, lo: u64, range: u64) -> Result<Self> {
        let bits = gpu.alloc_zeros::<u32>((range as usize).div_ceil(32))?;
        Ok(if op.needs_counts() {
            BitmapTable::Claims { bits, lo, range }
        } else {
            BitmapTable::Bits { bits, lo, range }
        })
    }

    /// Queue what follows the last build run before any probe: EXCEPT
    /// DISTINCT's claims are the values the build side lacks, so its bits are
    /// inverted. Nothing for the other rules.
    pub(super) fn seal(&self, gpu: &Gpu, op: SetOp) -> Result<()> {
        let BitmapTable::Claims { bits, .. } = self else { return Ok(()) };
        if op != SetOp::ExceptDistinct {
            return Ok(());
        }
        let (f, words) = (gpu.function(&KERNEL, "invert_bits")?, bits.len() as u64);
        // SAFETY: signature matches kernels/bitmap_setops.cu; `bits` holds `words` words.
        unsafe { gpu.stream().launch_builder(&f).arg(&bits.slice).arg(&words).launch(gpu.grid_stride(bits.len(), 32)) }
            .map(|_| ())
            .map_err(|e| cuda_err("bitmap invert", e))
    }

    /// The bits of a table from [`BitmapTable::empty`]: presence after the
    /// build runs; for the multiset rules, after probes, the values no probe
    /// row has claimed yet. What several devices, each holding a share of the
    /// rows, exchange. None for counts.
    pub(super) fn words(&self) -> Option<&DeviceBuffer<u32>> {
        match self {
            BitmapTable::Bits { bits, .. } | BitmapTable::Claims { bits, .. } => Some(bits),
            BitmapTable::Counts { .. } => None,
        }
    }

    /// Overwrite the bits with `words` from the host (one word per 32 domain
    /// values): presence, or the values still to be claimed.
    pub(super) fn load_words(&mut self, gpu: &Gpu, words: &[u32], stats: &mut TransferStats) -> Result<()> {
        let dst = match self {
            BitmapTable::Bits { bits, .. } | BitmapTable::Claims { bits, .. } => bits,
            BitmapTable::Counts { .. } => {
                return Err(DataFusionError::Internal("setfusion: a table of counts has no bits to load".into()))
            }
        };
        if words.len() > dst.len() {
            return Err(DataFusionError::Internal("setfusion: bitmap words exceed the table".into()));
        }
        gpu.upload_into(words, dst, 0, stats)
    }

    /// Queue the insertion of a run of build keys into a table made by
    /// [`BitmapTable::empty`] (keys outside its domain are skipped: a table may
    /// cover one slice of the keys' domain); `dup` is set when a key was
    /// present already.
    pub(super) fn add_build(&self, gpu: &Gpu, keys: &CudaView<'_, u64>, dup: &DeviceBuffer<u32>) -> Result<()> {
        let (n, n64) = (keys.len(), keys.len() as u64);
        let stream = gpu.stream();
        // SAFETY (each launch): signatures match kernels/bitmap_setops.cu; the bitmap covers
        // [lo, lo + range) and the kernels skip keys outside it; `dup` holds one flag.
        match self {
            BitmapTable::Bits { bits, lo, range } => {
                let f = gpu.function(&KERNEL, "build_bits")?;
                unsafe {
                    stream
                        .launch_builder(&f)
                        .arg(keys)
                        .arg(&n64)
                        .arg(lo)
                        .arg(range)
                        .arg(&bits.slice)
                        .launch(gpu.grid_stride(n, 32))
                }
            }
            BitmapTable::Claims { bits, lo, range } => {
                let f = gpu.function(&KERNEL, "build_bits_dup")?;
                unsafe {
                    stream
                        .launch_builder(&f)
                        .arg(keys)
                        .arg(&n64)
                        .arg(lo)
                        .arg(range)
                        .arg(&bits.slice)
                        .arg(&dup.slice)
                        .launch(gpu.grid_stride(n, 32))
                }
            }
            BitmapTable::Counts { .. } => {
                return Err(DataFusionError::Internal("setfusion: counts are built in one run".into()))
            }
        }
        .map(|_| ())
        .map_err(|e| cuda_err("bitmap build", e))
    }

    /// Queue the probe of `keys`: one bit per key into `out`, which starts at
    /// the word of the keys' first row. Probing runs in turn share the table's
    /// claims and counters, so together they make one selection.
    pub(super) fn probe(&self, gpu: &Gpu, op: SetOp, keys: &CudaView<'_, u64>, out: &CudaView<'_, u32>) -> Result<()> {
        let (stream, n64, opi) = (gpu.stream(), keys.len() as u64, op as i32);
        let cfg = gpu.grid_stride(keys.len(), 32);
        // SAFETY (each launch): signatures match kernels/bitmap_setops.cu; keys outside
        // [lo, lo + range) read nothing of the tables; `out` holds one bit per key.
        let launched = match self {
            BitmapTable::Bits { bits, lo, range } => {
                let anti = (op == SetOp::Anti) as i32;
                let f = gpu.function(&KERNEL, "probe_bits")?;
                unsafe {
                    stream
                        .launch_builder(&f)
                        .arg(keys)
                        .arg(&n64)
                        .arg(lo)
                        .arg(range)
                        .arg(&bits.slice)
                        .arg(&anti)
                        .arg(out)
                        .launch(cfg)
                }
            }
            BitmapTable::Claims { bits, lo, range } => {
                let f = gpu.function(&KERNEL, "probe_claims")?;
                unsafe {
                    stream
                        .launch_builder(&f)
                        .arg(keys)
                        .arg(&n64)
                        .arg(lo)
                        .arg(range)
                        .arg(&bits.slice)
                        .arg(&opi)
                        .arg(out)
                        .launch(cfg)
                }
            }
            BitmapTable::Counts { count_b, ctr_a, lo, range } => {
                let f = gpu.function(&KERNEL, "probe_counts")?;
                unsafe {
                    stream
                        .launch_builder(&f)
                        .arg(keys)
                        .arg(&n64)
                        .arg(lo)
                        .arg(range)
                        .arg(&count_b.slice)
                        .arg(&ctr_a.slice)
                        .arg(&opi)
                        .arg(out)
                        .launch(cfg)
                }
            }
        };
        launched.map(|_| ()).map_err(|e| cuda_err("bitmap probe", e))
    }
}
