//! What the overlap methods share, below all of them: the CPU twins' row
//! loop, the device methods' trace and family upload.

use std::ops::Range;
use std::time::Instant;

use datafusion::error::Result;

use crate::algo::families::{self, PairSpace};
use crate::gpu::{Gpu, TransferStats};

/// The row-major `rows.len() x k_right` count matrix of the CPU twins, zeroed,
/// with `fill(i, row)` called for every left set `i` of `rows`, the rows
/// spread over the host's threads.
pub(super) fn rows_on_host_threads(
    space: &PairSpace,
    rows: Range<usize>,
    fill: &(dyn Fn(usize, &mut [u32]) + Sync),
) -> Vec<u32> {
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
            fill(*first + r, row);
        }
    });
    out
}

/// SETFUSION_TRACE: a phase's time, the device synchronised after it, as
/// "`what`: `phase`: N ms" (nothing when not tracing).
pub(super) fn traced_phases<'g>(gpu: &'g Gpu, what: &'static str) -> impl FnMut(&str) -> Result<()> + 'g {
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
pub(super) type DeviceFamily = (crate::gpu::DeviceBuffer<u64>, crate::gpu::DeviceBuffer<u32>);

pub(super) fn upload_family(gpu: &Gpu, f: &families::Family, ts: &mut TransferStats) -> Result<DeviceFamily> {
    let offs: Vec<u64> = f.offsets.iter().map(|&o| o as u64).collect();
    let elements: &[u32] = if f.elements.is_empty() { &[0] } else { &f.elements };
    Ok((gpu.upload(&offs, ts)?, gpu.upload(elements, ts)?))
}

/// Every pair's overlap by merging the two sets (the tests' reference).
#[cfg(test)]
pub(super) fn brute(space: &PairSpace, rows: Range<usize>) -> Vec<u32> {
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
