//! The hash strategy's launcher (`kernels/hash_setops.cu`): the build keys in
//! an open-addressing table on the device, probed by any run of probe keys.
//! CPU twin: [`super::cpu::select_cpu`].

use cudarc::driver::{CudaView, LaunchConfig, PushKernelArg};
use datafusion::error::Result;

use super::SetOp;
use crate::gpu::{cuda_err, DeviceBuffer, Gpu};

/// kernels/hash_setops.cu, with its contract constants as `-D` options.
pub static KERNEL: crate::gpu::KernelSource = crate::gpu::KernelSource {
    family: "hash_setops",
    source: include_str!("../../../kernels/hash_setops.cu"),
    defines: super::op_defines,
};

pub(super) fn hash_capacity(op: SetOp, nb: usize, np: usize) -> usize {
    hash_slots(distinct_bound(op, nb, np), false)
}

/// Rows that may insert a distinct key into the table (build rows; for
/// EXCEPT DISTINCT also probe rows, which insert to elect one copy).
pub(super) fn distinct_bound(op: SetOp, nb: usize, np: usize) -> usize {
    if op == SetOp::ExceptDistinct {
        nb + np
    } else {
        nb
    }
}

/// Slots for at most `bound` distinct keys: u64 tables at load <= 1/2; u32
/// tables (`narrow`) at load <= 2/3 (their slots are half the size, so a
/// fuller table still touches fewer bytes than the u64 one).
pub(super) fn hash_slots(bound: usize, narrow: bool) -> usize {
    let slots = if narrow { bound + bound / 2 } else { bound * 2 };
    slots.next_power_of_two().max(1024)
}

/// Passes of the hash build over a table of `bytes` (kernels/hash_setops.cu,
/// "Build in passes"): two for a table just past L2 (64 MiB at 10M keys; the
/// H100 has 50 MB), where each half's dirty working set fits; one otherwise,
/// since every pass re-reads the build keys (larger tables were not measured
/// with passes beyond the earlier whole-join experiment, which lost at 1 GiB).
pub(super) fn build_passes(bytes: usize) -> u32 {
    if bytes > (32 << 20) && bytes <= (64 << 20) {
        2
    } else {
        1
    }
}

/// Launch config of the hash kernels: one thread per row (their grid-stride
/// loops then run once): 0.808 ms against 0.845 ms with at most 32 blocks per
/// SM looping, for the 10M x 10M semi join on the H100.
pub(super) fn rows_cfg(n: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (n.div_ceil(256).max(1) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

/// The build keys in an open-addressing table on the device
/// (kernels/hash_setops.cu), with per-slot build counts and probe counters
/// for the multiset rules. Built once, probed by any run of probe keys.
pub(super) struct HashTable {
    table: DeviceBuffer<u8>,
    count_b: DeviceBuffer<u32>,
    ctr_a: DeviceBuffer<u32>,
    mask: u64,
    /// A u32 table of offsets from `lo` for keys in [lo, lo + span] (span
    /// below 2^32 - 1): half the bytes, more of it in L2. Probe keys outside
    /// it have no match.
    narrow: Option<(u64, u64)>,
}

impl HashTable {
    /// Queue the table's fill and build on the stream (no synchronisation).
    /// `range`: the build keys' domain, which must also hold every probe key
    /// for EXCEPT DISTINCT (its probe inserts keys).
    pub(super) fn build(
        gpu: &Gpu,
        op: SetOp,
        d_build: &DeviceBuffer<u64>,
        nb: usize,
        np: usize,
        range: Option<(u64, u64)>,
    ) -> Result<Self> {
        let stream = gpu.stream();
        let nb64 = nb as u64;
        let narrow = range.filter(|(lo, hi)| hi - lo < u32::MAX as u64).map(|(lo, hi)| (lo, hi - lo));
        let width = if narrow.is_some() { 4 } else { 8 };
        let counted = op.needs_counts();
        let suffix = if narrow.is_some() { "_32" } else { "" };
        let cap = hash_slots(distinct_bound(op, nb, np), narrow.is_some());
        let mask = (cap - 1) as u64;
        let counted_len = if counted { cap + 1 } else { 1 };
        let count_b = gpu.alloc_zeros::<u32>(counted_len)?;
        let ctr_a = gpu.alloc_zeros::<u32>(counted_len)?;
        let null_counts: u64 = 0;
        // The table as raw bytes, in whole 16-byte words: the kernels see u32 or
        // u64 slots (cuMemAlloc aligns to 256).
        let words = ((cap + 1) * width).div_ceil(16);
        let table = gpu.alloc::<u8>(words * 16)?;
        let fill = gpu.function(&KERNEL, "fill_empty")?;
        let build = gpu.function(&KERNEL, &format!("build{suffix}"))?;
        let words64 = words as u64;
        // SAFETY: kernel signatures match kernels/hash_setops.cu; all buffers are sized as the kernels index them.
        unsafe { stream.launch_builder(&fill).arg(&table.slice).arg(&words64).launch(gpu.grid_stride(words, 32)) }
            .map_err(|e| cuda_err("fill_empty", e))?;
        let passes = build_passes(cap * width);
        for pass in 0..if nb > 0 { passes } else { 0 } {
            let mut l = stream.launch_builder(&build);
            l.arg(&d_build.slice).arg(&nb64);
            if let Some((lo, _)) = &narrow {
                l.arg(lo);
            }
            l.arg(&table.slice);
            if counted {
                l.arg(&count_b.slice);
            } else {
                l.arg(&null_counts); // presence is enough for semi/anti joins
            }
            l.arg(&mask).arg(&pass).arg(&passes);
            // SAFETY: as above.
            unsafe { l.launch(rows_cfg(nb)) }.map_err(|e| cuda_err("hash build", e))?;
        }
        Ok(Self { table, count_b, ctr_a, mask, narrow })
    }

    /// Queue the probe of `keys`: one bit per key into `out`, which starts at
    /// the word of the keys' first row (no synchronisation).
    pub(super) fn probe(&self, gpu: &Gpu, op: SetOp, keys: &CudaView<'_, u64>, out: &CudaView<'_, u32>) -> Result<()> {
        let (n, n64, opi) = (keys.len(), keys.len() as u64, op as i32);
        let probe = gpu.function(&KERNEL, if self.narrow.is_some() { "probe_32" } else { "probe" })?;
        let mut l = gpu.stream().launch_builder(&probe);
        l.arg(keys).arg(&n64);
        if let Some((lo, span)) = &self.narrow {
            l.arg(lo).arg(span);
        }
        l.arg(&self.table.slice);
        l.arg(&self.count_b.slice).arg(&self.ctr_a.slice).arg(&self.mask).arg(&opi).arg(out);
        // SAFETY: signature matches kernels/hash_setops.cu; `out` holds one bit per key of `keys`.
        unsafe { l.launch(rows_cfg(n)) }.map_err(|e| cuda_err("hash probe", e))?;
        Ok(())
    }
}
