//! Multiset selection: which probe rows survive a semi/anti join or an
//! INTERSECT / EXCEPT [ALL] against a build side, on 64-bit keys.
//!
//! One signature, a CPU twin and three GPU strategies, one file each:
//! - [`cpu`]: [`select_cpu`] / [`select_cpu_chunks`], the CPU twin (radix-partitioned hash maps on all cores);
//! - [`hash`]: the open-addressing table of `kernels/hash_setops.cu`;
//! - [`bitmap`]: the direct-address bitmaps and counts of `kernels/bitmap_setops.cu`;
//! - [`sort`]: radix sort + Balanced Path, `kernels/sort_setops.cu`;
//! - [`auto`]: the dispatch the operators call (strategy choice, streaming, partitioning under the device budget);
//! - [`devices`]: the split across several devices (`setfusion.devices`).
//!
//! The result is one bit per probe row, LSB-first in 32-bit words, which is
//! exactly Arrow's boolean buffer layout.
//!
//! Rules per distinct key with `m` probe copies and `n` build copies (seed 002):
//! semi keeps all m if n > 0; anti keeps all m if n == 0; INTERSECT ALL keeps
//! min(m, n); EXCEPT ALL keeps max(m - n, 0); INTERSECT / EXCEPT keep one copy.

#[cfg(test)]
use std::collections::HashMap;

use datafusion::arrow::buffer::{BooleanBuffer, Buffer};

pub mod auto;
pub mod bitmap;
pub mod cpu;
pub mod devices;
pub mod hash;
pub mod sort;

pub use auto::{
    device_bytes, select_gpu, select_gpu_auto, select_gpu_chunks, select_gpu_partitioned, select_resident, self_check,
    ResidentSelect,
};
pub use bitmap::BITMAP_MAX_RANGE;
pub use cpu::{select_cpu, select_cpu_chunks, KeyHasher, SharedCounts};
pub use devices::select_gpus;

/// The selection rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SetOp {
    Semi = 0,
    Anti = 1,
    IntersectDistinct = 2,
    IntersectAll = 3,
    ExceptDistinct = 4,
    ExceptAll = 5,
}

/// The op codes as `-D` options for the kernels that take an op (`SEMI` .. `EXCEPT_ALL`).
pub(crate) fn op_defines() -> Vec<(String, u64)> {
    [
        ("SEMI", SetOp::Semi),
        ("ANTI", SetOp::Anti),
        ("INTERSECT_DISTINCT", SetOp::IntersectDistinct),
        ("INTERSECT_ALL", SetOp::IntersectAll),
        ("EXCEPT_DISTINCT", SetOp::ExceptDistinct),
        ("EXCEPT_ALL", SetOp::ExceptAll),
    ]
    .into_iter()
    .map(|(n, op)| (n.to_string(), op as u64))
    .collect()
}

impl SetOp {
    pub fn name(&self) -> &'static str {
        match self {
            SetOp::Semi => "semi",
            SetOp::Anti => "anti",
            SetOp::IntersectDistinct => "intersect",
            SetOp::IntersectAll => "intersect all",
            SetOp::ExceptDistinct => "except",
            SetOp::ExceptAll => "except all",
        }
    }

    /// Does the rule need per-key multiplicities (not just presence)?
    pub fn needs_counts(&self) -> bool {
        !matches!(self, SetOp::Semi | SetOp::Anti)
    }
}

/// GPU strategy for [`select_gpu`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuStrategy {
    Hash,
    Bitmap,
    /// Radix sort + Balanced Path (src/algo/select/sort.rs).
    Sort,
}

impl GpuStrategy {
    pub fn name(&self) -> &'static str {
        match self {
            GpuStrategy::Hash => "hash",
            GpuStrategy::Bitmap => "bitmap",
            GpuStrategy::Sort => "sort",
        }
    }
}

/// Convert bit words (LSB-first) to an Arrow boolean buffer of `len` bits.
pub fn words_to_bool(words: Vec<u32>, len: usize) -> BooleanBuffer {
    BooleanBuffer::new(Buffer::from_vec(words), 0, len)
}

/// A selection as 32-bit words, bit i of word i / 32 = row i (the device layout).
fn bool_to_words(sel: &BooleanBuffer) -> Vec<u32> {
    let mut words = vec![0u32; sel.len().div_ceil(32)];
    for i in sel.set_indices() {
        words[i >> 5] |= 1 << (i & 31);
    }
    words
}

/// The domain [min, max] of both inputs, if any.
pub fn key_range(build: &[u64], probe: &[u64]) -> Option<(u64, u64)> {
    key_range_chunks(&[build, probe])
}

/// The union of two key domains.
fn merge_ranges(a: Option<(u64, u64)>, b: Option<(u64, u64)>) -> Option<(u64, u64)> {
    match (a, b) {
        (Some((l1, h1)), Some((l2, h2))) => Some((l1.min(l2), h1.max(h2))),
        (x, None) | (None, x) => x,
    }
}

/// [`key_range`] over several slices, scanned in parallel.
pub fn key_range_chunks(chunks: &[&[u64]]) -> Option<(u64, u64)> {
    let scan = |c: &[u64]| (!c.is_empty()).then(|| c.iter().fold((u64::MAX, 0u64), |(l, h), &k| (l.min(k), h.max(k))));
    let total: usize = chunks.iter().map(|c| c.len()).sum();
    let threads = crate::host::copy_threads();
    if total < (1 << 22) || threads == 1 {
        return chunks.iter().fold(None, |acc, c| merge_ranges(acc, scan(c)));
    }
    // Split every chunk into pieces so that threads get similar work.
    let piece = total.div_ceil(threads * 4);
    let pieces: Vec<&[u64]> = chunks.iter().flat_map(|c| c.chunks(piece.max(1))).collect();
    let per = pieces.len().div_ceil(threads);
    crate::host::scope(|s| {
        let handles: Vec<_> = pieces
            .chunks(per.max(1))
            .map(|ps| s.spawn("key-range", move || ps.iter().fold(None, |acc, c| merge_ranges(acc, scan(c)))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).fold(None, merge_ranges)
    })
}

/// Two selections are equivalent if they keep the same multiset of keys (which
/// copy of equal keys is kept is immaterial: equal keys are equal rows).
pub fn same_multiset_selection(op: SetOp, probe: &[u64], a: &BooleanBuffer, b: &BooleanBuffer) -> bool {
    if !op.needs_counts() {
        return a == b;
    }
    let pick = |s: &BooleanBuffer| {
        let mut v: Vec<u64> = s.set_indices().map(|i| probe[i]).collect();
        v.sort_unstable();
        v
    };
    a.len() == b.len() && pick(a) == pick(b)
}

/// Test reference: the SQL multiset rules computed by counting (independent of
/// every backend's code path); the kept keys, sorted.
#[cfg(test)]
pub(crate) fn multiset_reference(op: SetOp, build: &[u64], probe: &[u64]) -> Vec<u64> {
    let mut nb: HashMap<u64, usize> = HashMap::new();
    for k in build {
        *nb.entry(*k).or_default() += 1;
    }
    let mut m: HashMap<u64, usize> = HashMap::new();
    for k in probe {
        *m.entry(*k).or_default() += 1;
    }
    let mut out = Vec::new();
    for (k, &mk) in &m {
        let n = nb.get(k).copied().unwrap_or(0);
        let copies = match op {
            SetOp::Semi => {
                if n > 0 {
                    mk
                } else {
                    0
                }
            }
            SetOp::Anti => {
                if n == 0 {
                    mk
                } else {
                    0
                }
            }
            SetOp::IntersectAll => mk.min(n),
            SetOp::ExceptAll => mk.saturating_sub(n),
            SetOp::IntersectDistinct => (n > 0) as usize,
            SetOp::ExceptDistinct => (n == 0) as usize,
        };
        out.extend(std::iter::repeat_n(*k, copies));
    }
    out.sort_unstable();
    out
}
