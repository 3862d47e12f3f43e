//! Intersection of two sorted sets (strictly increasing keys), seed 003 /
//! seed 002 Merge Path without duplicates.
//!
//! [`intersect_count_cpu`] is the CPU twin (galloping two-pointer merge);
//! [`intersect_count_gpu`] runs kernels/sorted_intersect.cu on device-resident
//! inputs, so it can be benchmarked without PCIe in the way.

use std::time::Instant;

use cudarc::driver::{LaunchConfig, PushKernelArg};
use datafusion::error::Result;

use crate::gpu::{cuda_err, DeviceBuffer, Gpu, TransferStats};

/// kernels/sorted_intersect.cu, with its contract constants as `-D` options.
pub static KERNEL: crate::gpu::KernelSource = crate::gpu::KernelSource { family: "sorted_intersect", source: include_str!("../../kernels/sorted_intersect.cu"), defines: crate::gpu::no_defines };


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
        let cfg = LaunchConfig { grid_dim: ((tiles + 1).div_ceil(256) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: signature matches kernels/sorted_intersect.cu; parts holds tiles + 1 entries.
        unsafe { stream.launch_builder(&part).arg(&self.a.slice).arg(&na).arg(&self.b.slice).arg(&nb).arg(&self.parts.slice).arg(&nparts).arg(&nv).launch(cfg) }
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
pub fn intersect_count_gpu<T: SortedKey>(gpu: &Gpu, a: &[T], b: &[T], stats: &mut TransferStats) -> Result<(u64, Vec<bool>)> {
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
    for &(na, nb, domain) in &[(0usize, 10usize, 100u64), (10, 0, 100), (1, 1, 1), (5000, 3000, 20000), (300_000, 500_000, 2_000_000)] {
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
