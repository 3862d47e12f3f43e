//! Device radix sort (issue 15 item 5): the launcher of `kernels/radix_sort.cu`,
//! an Onesweep LSD radix sort (Adinets & Merrill 2022) with decoupled
//! look-back, and its CPU twins.
//!
//! Every function sorts device-resident data in place, stably, by the key
//! bits `[begin_bit, end_bit)` (callers that know their key domain pass only
//! the bits that vary: one 8-bit pass per started byte of that range). The
//! sort ping-pongs between the caller's buffer and a scratch buffer of the
//! same length; when the number of passes is odd, the buffers are swapped
//! (`std::mem::swap`), so afterwards the caller's `DeviceBuffer` holds the
//! sorted `[0, n)` but may be a different allocation of length `n`.
//!
//! Temporary storage (the alternate buffers, the digit counts and the
//! look-back words) is allocated through [`Gpu::alloc`], so it is charged to
//! the operator's memory budget; [`device_bytes`] says how much.
//!
//! The segmented sort (many small segments) composes `segment << key_bits |
//! key` into u64 keys, sorts those over `key_bits + segment bits`, and splits
//! the low bits back: the simplest correct approach, O(n) per pass like the
//! flat sort.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use datafusion::error::{DataFusionError, Result};

use crate::gpu::{cuda_err, DeviceBuffer, Gpu, Pod};

/// kernels/radix_sort.cu, with its contract constants as `-D` options.
pub static KERNEL: crate::gpu::KernelSource = crate::gpu::KernelSource {
    family: "radix_sort",
    source: include_str!("../../kernels/radix_sort.cu"),
    defines: radix_defines,
};

fn radix_defines() -> Vec<(String, u64)> {
    let pairs = [
        ("BITS", RS_BITS as u64),
        ("RADIX", RS_RADIX as u64),
        ("WARPS", (RS_THREADS / 32) as u64),
        ("ITEMS_U32", RS_ITEMS_U32 as u64),
        ("ITEMS_U64", RS_ITEMS_U64 as u64),
        ("MIN_BLOCKS", RS_MIN_BLOCKS as u64),
        ("HIST_THREADS", RS_HIST_THREADS as u64),
    ];
    crate::gpu::prefixed("RS_", &pairs)
}

// The kernel's tuning constants: passed to NVRTC as -D options (radix_defines).
/// Digit width (RS_BITS) and digit count (RS_RADIX).
pub const RS_BITS: u32 = 8;
const RS_RADIX: usize = 256;
/// Onesweep block: RS_WARPS warps (RS_THREADS threads).
const RS_THREADS: u32 = 16 * 32;
/// Keys per thread for 4- and 8-byte keys (RS_ITEMS_U32, RS_ITEMS_U64).
const RS_ITEMS_U32: usize = 16;
const RS_ITEMS_U64: usize = 8;
/// Threads per block of the histogram kernel (RS_HIST_THREADS).
const RS_HIST_THREADS: u32 = 512;
/// Resident onesweep blocks per SM the kernel is compiled for (RS_MIN_BLOCKS):
/// register cap 65536 / (RS_THREADS * RS_MIN_BLOCKS).
const RS_MIN_BLOCKS: u32 = 2;
/// Digit counts of up to 8 passes, then one tile counter per pass (the launch
/// sequence in the kernel's header comment).
const HIST_WORDS: usize = 8 * RS_RADIX + 8;

/// A key type the device sort handles.
pub trait RadixKey: Pod + Ord {
    /// Width in bits (the largest `end_bit`).
    const BITS: u32;
    /// Keys per onesweep tile (RsCfg<K>::TILE in the kernel).
    const TILE: usize;
    /// Kernel name suffix.
    const NAME: &'static str;
    fn to_u64(self) -> u64;
}

impl RadixKey for u32 {
    const BITS: u32 = 32;
    const TILE: usize = RS_THREADS as usize * RS_ITEMS_U32;
    const NAME: &'static str = "u32";
    fn to_u64(self) -> u64 {
        self as u64
    }
}

impl RadixKey for u64 {
    const BITS: u32 = 64;
    const TILE: usize = RS_THREADS as usize * RS_ITEMS_U64;
    const NAME: &'static str = "u64";
    fn to_u64(self) -> u64 {
        self
    }
}

/// Number of 8-bit passes over `[begin_bit, end_bit)`.
pub fn passes(begin_bit: u32, end_bit: u32) -> u32 {
    end_bit.saturating_sub(begin_bit).div_ceil(RS_BITS)
}

/// Device bytes a sort of `n` keys of `key_bytes` bytes (4 or 8) needs beside
/// its own buffers: the alternate key (and value) buffer, digit counts and
/// look-back words.
pub fn device_bytes(n: usize, key_bytes: usize, pairs: bool) -> usize {
    let tile = if key_bytes <= 4 { u32::TILE } else { u64::TILE };
    n * (key_bytes + if pairs { 4 } else { 0 }) + HIST_WORDS * 4 + n.div_ceil(tile).max(1) * RS_RADIX * 8
}

fn check_args<K: RadixKey>(
    what: &str,
    len: usize,
    values: Option<usize>,
    n: usize,
    begin_bit: u32,
    end_bit: u32,
) -> Result<()> {
    if begin_bit > end_bit || end_bit > K::BITS {
        return Err(DataFusionError::Internal(format!(
            "radix_sort {what}: bits [{begin_bit}, {end_bit}) outside a {}-bit key",
            K::BITS
        )));
    }
    if n > len || values.is_some_and(|v| n > v) {
        return Err(DataFusionError::Internal(format!(
            "radix_sort {what}: {n} keys requested from buffers of {len} / {values:?}"
        )));
    }
    if n > u32::MAX as usize {
        return Err(DataFusionError::Plan(format!("radix_sort {what}: {n} keys exceed 2^32 - 1")));
    }
    Ok(())
}

/// The shared launcher: histogram of every pass, digit starts, one onesweep pass per digit.
fn run_sort<K: RadixKey>(
    gpu: &Gpu,
    keys: &mut DeviceBuffer<K>,
    mut values: Option<&mut DeviceBuffer<u32>>,
    n: usize,
    begin_bit: u32,
    end_bit: u32,
) -> Result<()> {
    let what = format!("{}{}", K::NAME, if values.is_some() { " pairs" } else { " keys" });
    check_args::<K>(&what, keys.len(), values.as_ref().map(|v| v.len()), n, begin_bit, end_bit)?;
    let passes = passes(begin_bit, end_bit);
    if n <= 1 || passes == 0 {
        return Ok(());
    }
    let stream = gpu.stream();
    let ntiles = n.div_ceil(K::TILE);
    let mut alt_keys = gpu.alloc::<K>(n)?;
    let mut alt_values = match values {
        Some(_) => Some(gpu.alloc::<u32>(n)?),
        None => None,
    };
    let mut hist = gpu.alloc::<u32>(HIST_WORDS)?;
    let mut status = gpu.alloc::<u64>(ntiles * RS_RADIX)?;
    stream.memset_zeros(&mut hist.slice).map_err(|e| cuda_err("memset", e))?;
    stream.memset_zeros(&mut status.slice).map_err(|e| cuda_err("memset", e))?;
    let n64 = n as u64;

    let sms = gpu.info().multiprocessors.max(1) as usize;
    let hist_blocks = n.div_ceil(RS_HIST_THREADS as usize).clamp(1, sms * 8);
    let f = gpu.function(&KERNEL, &format!("rs_histogram_{}", K::NAME))?;
    // SAFETY: signature matches kernels/radix_sort.cu; keys hold n elements, hist HIST_WORDS zeroed counts.
    unsafe {
        stream.launch_builder(&f).arg(&keys.slice).arg(&n64).arg(&begin_bit).arg(&end_bit).arg(&hist.slice).launch(
            LaunchConfig {
                grid_dim: (hist_blocks as u32, 1, 1),
                block_dim: (RS_HIST_THREADS, 1, 1),
                shared_mem_bytes: 0,
            },
        )
    }
    .map_err(|e| cuda_err("rs_histogram", e))?;
    let f = gpu.function(&KERNEL, "rs_scan_digits")?;
    // SAFETY: one block per pass scans that pass's RS_RADIX counts in place.
    unsafe {
        stream.launch_builder(&f).arg(&hist.slice).launch(LaunchConfig {
            grid_dim: (passes, 1, 1),
            block_dim: (RS_RADIX as u32, 1, 1),
            shared_mem_bytes: 0,
        })
    }
    .map_err(|e| cuda_err("rs_scan_digits", e))?;

    let name = format!("rs_onesweep_{}_{}", K::NAME, if values.is_some() { "pairs" } else { "keys" });
    let f = gpu.function(&KERNEL, &name)?;
    let cfg = LaunchConfig { grid_dim: (ntiles as u32, 1, 1), block_dim: (RS_THREADS, 1, 1), shared_mem_bytes: 0 };
    for p in 0..passes {
        let shift = begin_bit + p * RS_BITS;
        let nbits = (end_bit - shift).min(RS_BITS);
        let p_us = p as usize;
        let starts = hist.slice.slice(p_us * RS_RADIX..(p_us + 1) * RS_RADIX);
        let counter = hist.slice.slice(8 * RS_RADIX + p_us..8 * RS_RADIX + p_us + 1);
        // Even passes read the caller's buffers and write the alternates, odd passes the reverse.
        let (kin, kout): (&CudaSlice<K>, &CudaSlice<K>) =
            if p % 2 == 0 { (&keys.slice, &alt_keys.slice) } else { (&alt_keys.slice, &keys.slice) };
        // SAFETY: signature matches kernels/radix_sort.cu; kin/kout (and vin/vout) hold n elements
        // each and are distinct; status holds ntiles * RS_RADIX words zeroed before pass 0.
        unsafe {
            let mut l = stream.launch_builder(&f);
            l.arg(kin).arg(kout);
            if let (Some(v), Some(av)) = (values.as_deref(), alt_values.as_ref()) {
                if p % 2 == 0 {
                    l.arg(&v.slice).arg(&av.slice);
                } else {
                    l.arg(&av.slice).arg(&v.slice);
                }
            }
            l.arg(&n64).arg(&shift).arg(&nbits).arg(&p).arg(&starts).arg(&counter).arg(&status.slice).launch(cfg)
        }
        .map_err(|e| cuda_err(&name, e))?;
    }
    if passes % 2 == 1 {
        // The last pass wrote the alternates: they become the caller's buffers.
        std::mem::swap(keys, &mut alt_keys);
        if let (Some(v), Some(av)) = (values.as_deref_mut(), alt_values.as_mut()) {
            std::mem::swap(v, av);
        }
    }
    // The scratch buffers drop here; the stream orders their release after the passes.
    Ok(())
}

/// Stable sort of `keys[0, n)` on the device by bits `[begin_bit, end_bit)`.
pub fn sort_keys<K: RadixKey>(
    gpu: &Gpu,
    keys: &mut DeviceBuffer<K>,
    n: usize,
    begin_bit: u32,
    end_bit: u32,
) -> Result<()> {
    run_sort(gpu, keys, None, n, begin_bit, end_bit)
}

/// Stable sort of `keys[0, n)` with `values[0, n)` on the device by bits `[begin_bit, end_bit)`.
pub fn sort_pairs<K: RadixKey>(
    gpu: &Gpu,
    keys: &mut DeviceBuffer<K>,
    values: &mut DeviceBuffer<u32>,
    n: usize,
    begin_bit: u32,
    end_bit: u32,
) -> Result<()> {
    run_sort(gpu, keys, Some(values), n, begin_bit, end_bit)
}

/// [`sort_keys`] for u64 keys.
pub fn sort_keys_u64(gpu: &Gpu, keys: &mut DeviceBuffer<u64>, n: usize, begin_bit: u32, end_bit: u32) -> Result<()> {
    sort_keys(gpu, keys, n, begin_bit, end_bit)
}

/// [`sort_pairs`] for u32 keys.
pub fn sort_pairs_u32(
    gpu: &Gpu,
    keys: &mut DeviceBuffer<u32>,
    values: &mut DeviceBuffer<u32>,
    n: usize,
    begin_bit: u32,
    end_bit: u32,
) -> Result<()> {
    sort_pairs(gpu, keys, values, n, begin_bit, end_bit)
}

/// [`sort_pairs`] for u64 keys.
pub fn sort_pairs_u64(
    gpu: &Gpu,
    keys: &mut DeviceBuffer<u64>,
    values: &mut DeviceBuffer<u32>,
    n: usize,
    begin_bit: u32,
    end_bit: u32,
) -> Result<()> {
    sort_pairs(gpu, keys, values, n, begin_bit, end_bit)
}

/// `keys[0, n) - sub` into a new buffer, with the row indices 0..n beside
/// them when `with_rows`: how sort_setops prepares a side for
/// [`sort_pairs_u64`] / [`sort_keys_u64`] over only its domain's bits.
pub fn offset_keys_u64(
    gpu: &Gpu,
    keys: &DeviceBuffer<u64>,
    n: usize,
    sub: u64,
    with_rows: bool,
) -> Result<(DeviceBuffer<u64>, Option<DeviceBuffer<u32>>)> {
    if n > keys.len() || n > u32::MAX as usize {
        return Err(DataFusionError::Internal(format!(
            "radix_sort offset_keys: {n} keys of a buffer of {}",
            keys.len()
        )));
    }
    let out = gpu.alloc::<u64>(n)?;
    let rows = if with_rows { Some(gpu.alloc::<u32>(n)?) } else { None };
    if n == 0 {
        return Ok((out, rows));
    }
    let null: u64 = 0;
    let f = gpu.function(&KERNEL, "rs_offset_keys_u64")?;
    let n64 = n as u64;
    // SAFETY: signature matches kernels/radix_sort.cu; out (and rows) hold n elements; a 0 rows pointer means none.
    unsafe {
        let mut l = gpu.stream().launch_builder(&f);
        l.arg(&keys.slice).arg(&n64).arg(&sub).arg(&out.slice);
        match &rows {
            Some(r) => l.arg(&r.slice),
            None => l.arg(&null),
        };
        l.launch(gpu.grid_stride(n, 32))
    }
    .map_err(|e| cuda_err("rs_offset_keys_u64", e))?;
    Ok((out, rows))
}

/// Bits needed for segment ids 0..nseg.
fn segment_bits(nseg: usize) -> u32 {
    if nseg <= 1 {
        0
    } else {
        usize::BITS - (nseg - 1).leading_zeros()
    }
}

/// Sort each segment `keys[offsets[s], offsets[s + 1])` of u32 keys below
/// `2^key_bits` on the device (offsets: nseg + 1 non-decreasing entries,
/// offsets[0] = 0, offsets[nseg] = n). Composes u64 keys `segment << key_bits
/// | key`, sorts them by their `key_bits + segment bits` low bits, splits
/// the keys back.
pub fn sort_segments_u32(
    gpu: &Gpu,
    keys: &mut DeviceBuffer<u32>,
    offsets: &DeviceBuffer<u32>,
    nseg: usize,
    n: usize,
    key_bits: u32,
) -> Result<()> {
    let sbits = segment_bits(nseg);
    if key_bits > 32 || key_bits + sbits > 64 || n > keys.len() || nseg + 1 > offsets.len() || n > u32::MAX as usize {
        return Err(DataFusionError::Internal(format!(
            "radix_sort segments: {n} keys in {nseg} segments of {key_bits}-bit keys (buffers {} / {})",
            keys.len(),
            offsets.len()
        )));
    }
    if n <= 1 || nseg == 0 {
        return Ok(());
    }
    let stream = gpu.stream();
    let mut composite = gpu.alloc::<u64>(n)?;
    let (n64, nseg32) = (n as u64, nseg as u32);
    let f = gpu.function(&KERNEL, "rs_seg_compose_u32")?;
    // SAFETY: signature matches kernels/radix_sort.cu; keys and composite hold n elements, offsets nseg + 1.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&keys.slice)
            .arg(&n64)
            .arg(&offsets.slice)
            .arg(&nseg32)
            .arg(&key_bits)
            .arg(&composite.slice)
            .launch(gpu.grid_stride(n, 32))
    }
    .map_err(|e| cuda_err("rs_seg_compose_u32", e))?;
    sort_keys_u64(gpu, &mut composite, n, 0, key_bits + sbits)?;
    let f = gpu.function(&KERNEL, "rs_seg_split_u32")?;
    // SAFETY: as above; every key is rewritten from its sorted composite.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&composite.slice)
            .arg(&n64)
            .arg(&key_bits)
            .arg(&keys.slice)
            .launch(gpu.grid_stride(n, 32))
    }
    .map_err(|e| cuda_err("rs_seg_split_u32", e))?;
    Ok(())
}

// ---------------------------------------------------------------- CPU twins

/// The sort field of a key: its bits `[begin_bit, end_bit)`.
fn field<K: RadixKey>(k: K, begin_bit: u32, end_bit: u32) -> u64 {
    let width = end_bit.saturating_sub(begin_bit);
    let mask = if width >= 64 { u64::MAX } else { (1u64 << width) - 1 };
    if begin_bit >= 64 {
        0
    } else {
        (k.to_u64() >> begin_bit) & mask
    }
}

/// CPU twin of [`sort_keys`]: stable sort of `keys` by bits `[begin_bit, end_bit)`.
pub fn sort_keys_cpu<K: RadixKey>(keys: &mut [K], begin_bit: u32, end_bit: u32) {
    keys.sort_by_key(|&k| field(k, begin_bit, end_bit));
}

/// CPU twin of [`sort_pairs`]: stable sort of `(keys, values)` by the keys' bits `[begin_bit, end_bit)`.
pub fn sort_pairs_cpu<K: RadixKey>(keys: &mut [K], values: &mut [u32], begin_bit: u32, end_bit: u32) {
    let n = keys.len().min(values.len());
    let mut pairs: Vec<(K, u32)> = keys[..n].iter().copied().zip(values[..n].iter().copied()).collect();
    pairs.sort_by_key(|&(k, _)| field(k, begin_bit, end_bit));
    for (i, (k, v)) in pairs.into_iter().enumerate() {
        keys[i] = k;
        values[i] = v;
    }
}

/// CPU twin of [`sort_segments_u32`].
pub fn sort_segments_cpu(keys: &mut [u32], offsets: &[u32]) {
    for w in offsets.windows(2) {
        keys[w[0] as usize..w[1] as usize].sort_unstable();
    }
}

/// Doctor self-check: u32 and u64 pairs (values = row indices, so stability
/// shows) over a few sizes and bit ranges, against the CPU twin.
pub fn self_check(gpu: &Gpu) -> Result<String> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let stats = &mut crate::gpu::TransferStats::default();
    let mut checked = 0;
    for &(n, b, e, narrow) in
        &[(1usize, 0u32, 64u32, false), (u64::TILE + 1, 0, 64, false), (100_000, 3, 40, false), (250_000, 0, 64, true)]
    {
        let keys: Vec<u64> = (0..n).map(|_| if narrow { rng.random_range(0..100u64) } else { rng.random() }).collect();
        let rows: Vec<u32> = (0..n as u32).collect();
        let (mut want_k, mut want_v) = (keys.clone(), rows.clone());
        sort_pairs_cpu(&mut want_k, &mut want_v, b, e);
        let (mut dk, mut dv) = (gpu.upload(&keys, stats)?, gpu.upload(&rows, stats)?);
        sort_pairs_u64(gpu, &mut dk, &mut dv, n, b, e)?;
        let ok64 = gpu.download(&dk, n, stats)? == want_k && gpu.download(&dv, n, stats)? == want_v;
        let keys32: Vec<u32> = keys.iter().map(|&k| k as u32).collect();
        let (mut want_k, mut want_v) = (keys32.clone(), rows.clone());
        let e32 = e.min(32);
        sort_pairs_cpu(&mut want_k, &mut want_v, b, e32);
        let (mut dk, mut dv) = (gpu.upload(&keys32, stats)?, gpu.upload(&rows, stats)?);
        sort_pairs_u32(gpu, &mut dk, &mut dv, n, b, e32)?;
        let ok32 = gpu.download(&dk, n, stats)? == want_k && gpu.download(&dv, n, stats)? == want_v;
        if !(ok64 && ok32) {
            return Err(DataFusionError::Execution(format!(
                "radix_sort self-check failed: {n} pairs, bits [{b}, {e})"
            )));
        }
        checked += 2;
    }
    Ok(format!("{checked} sorts match the CPU twin (stable, pairs)"))
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::gpu::TransferStats;

    /// Key distributions: random, few distinct, all equal, ascending, descending, narrow.
    fn keys_of<K: RadixKey>(n: usize, dist: usize, rng: &mut impl Rng, from_u64: fn(u64) -> K) -> Vec<K> {
        (0..n)
            .map(|i| {
                let r: u64 = rng.random();
                from_u64(match dist {
                    0 => r,
                    1 => r % 5 * 0x9E37_79B9_7F4A_7C15,
                    2 => 0x1234_5678_9abc_def0,
                    3 => i as u64 * 3,
                    4 => u64::MAX - i as u64 * 7,
                    _ => r & 0xfff,
                })
            })
            .collect()
    }

    #[test]
    fn cpu_twins_are_stable_by_the_bit_range() {
        let mut keys = vec![0x13u32, 0x02, 0x21, 0x12, 0x01];
        let mut vals = vec![0, 1, 2, 3, 4];
        // Bits [0, 4): 3, 2, 1, 2, 1 -> 0x21, 0x01, 0x02, 0x12, 0x13 (ties keep input order).
        sort_pairs_cpu(&mut keys, &mut vals, 0, 4);
        assert_eq!(keys, vec![0x21, 0x01, 0x02, 0x12, 0x13]);
        assert_eq!(vals, vec![2, 4, 1, 3, 0]);
        let mut k64 = vec![u64::MAX, 0, 1 << 63];
        sort_keys_cpu(&mut k64, 0, 64);
        assert_eq!(k64, vec![0, 1 << 63, u64::MAX]);
        sort_keys_cpu(&mut k64, 63, 64); // one bit: stable
        assert_eq!(k64, vec![0, 1 << 63, u64::MAX]);
        let mut seg = vec![3u32, 1, 2, 9, 8, 7, 5];
        sort_segments_cpu(&mut seg, &[0, 3, 3, 6, 7]);
        assert_eq!(field(0xabcdu32, 4, 12), 0xbc);
        assert_eq!(seg, vec![1, 2, 3, 7, 8, 9, 5]);
        assert_eq!(passes(0, 64), 8);
        assert_eq!(passes(4, 20), 2);
        assert_eq!(passes(0, 13), 2);
        assert_eq!(passes(5, 5), 0);
        assert_eq!(segment_bits(1), 0);
        assert_eq!(segment_bits(2), 1);
        assert_eq!(segment_bits(1000), 10);
        assert!(device_bytes(1000, 8, true) >= 12_000);
    }

    /// GPU vs CPU twin for one key type, keys only and pairs (values = row
    /// indices, so stability is checked exactly), over sizes around the tile,
    /// distributions and bit ranges.
    fn gpu_matches_cpu<K: RadixKey>(from_u64: fn(u64) -> K) {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        let mut rng = rand::rngs::StdRng::seed_from_u64(K::BITS as u64);
        let t = K::TILE;
        let stats = &mut TransferStats::default();
        let sizes = [0, 1, 2, 33, t - 1, t, t + 1, 3 * t + 5, 100_003, (1 << 20) + 7];
        let ranges = [(0, K::BITS), (0, 13), (4, 20), (K::BITS - 4, K::BITS), (7, 8)];
        for (si, &n) in sizes.iter().enumerate() {
            for dist in 0..6 {
                for (ri, &(b, e)) in ranges.iter().enumerate() {
                    // Every size with the full range; the other ranges on a few sizes.
                    if ri > 0 && !(si == 5 || si == 7 || si == 9) {
                        continue;
                    }
                    let keys = keys_of(n, dist, &mut rng, from_u64);
                    let rows: Vec<u32> = (0..n as u32).collect();
                    let (mut want_k, mut want_v) = (keys.clone(), rows.clone());
                    sort_pairs_cpu(&mut want_k, &mut want_v, b, e);
                    let mut dk = gpu.upload(&keys, stats).unwrap();
                    let mut dv = gpu.upload(&rows, stats).unwrap();
                    sort_pairs(&gpu, &mut dk, &mut dv, n, b, e).unwrap();
                    let got_k = gpu.download(&dk, n, stats).unwrap();
                    let got_v = gpu.download(&dv, n, stats).unwrap();
                    assert!(got_k == want_k && got_v == want_v, "{} pairs n={n} dist={dist} bits [{b}, {e})", K::NAME);
                    let mut dk = gpu.upload(&keys, stats).unwrap();
                    sort_keys(&gpu, &mut dk, n, b, e).unwrap();
                    let mut want = keys.clone();
                    sort_keys_cpu(&mut want, b, e);
                    assert!(
                        gpu.download(&dk, n, stats).unwrap() == want,
                        "{} keys n={n} dist={dist} bits [{b}, {e})",
                        K::NAME
                    );
                }
            }
        }
        // Bad arguments are errors, not panics.
        let mut dk = gpu.upload(&[1u64, 2], stats).unwrap();
        assert!(sort_keys_u64(&gpu, &mut dk, 3, 0, 64).is_err());
        assert!(sort_keys_u64(&gpu, &mut dk, 2, 8, 4).is_err());
        assert!(sort_keys_u64(&gpu, &mut dk, 2, 0, 65).is_err());
    }

    #[test]
    fn gpu_sort_u32_matches_cpu() {
        gpu_matches_cpu::<u32>(|x| x as u32);
    }

    #[test]
    fn gpu_sort_u64_matches_cpu() {
        gpu_matches_cpu::<u64>(|x| x);
    }

    #[test]
    fn gpu_segmented_matches_cpu() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let stats = &mut TransferStats::default();
        for (nseg, max_len, key_bits) in [(1usize, 5000usize, 32u32), (5000, 200, 20), (70_000, 40, 32), (3, 0, 8)] {
            let mut offsets = vec![0u32];
            for s in 0..nseg {
                let len = if s % 13 == 0 || max_len == 0 { 0 } else { rng.random_range(0..=max_len) };
                offsets.push(offsets[s] + len as u32);
            }
            let n = offsets[nseg] as usize;
            let mask = if key_bits == 32 { u32::MAX } else { (1 << key_bits) - 1 };
            let keys: Vec<u32> = (0..n).map(|_| rng.random::<u32>() & mask).collect();
            let mut want = keys.clone();
            sort_segments_cpu(&mut want, &offsets);
            let mut dk = gpu.upload(&keys, stats).unwrap();
            let doff = gpu.upload(&offsets, stats).unwrap();
            sort_segments_u32(&gpu, &mut dk, &doff, nseg, n, key_bits).unwrap();
            assert!(gpu.download(&dk, n, stats).unwrap() == want, "{nseg} segments of up to {max_len}");
        }
        let msg = self_check(&gpu).unwrap();
        assert!(msg.contains("match"), "{msg}");
    }
}
