//! Row hashing and exact verification of hashed keys on the device
//! (kernels/row_hash.cu).
//!
//! Keys that are not one fixed-width column (strings, binary, composite keys,
//! wide decimals) are Arrow row-format bytes ([`Rows`]). On the GPU backend
//! their bytes go to the device, each row is hashed there to the same 64-bit
//! value as [`keys::hash_bytes`] (the CPU twin), and the hashes stay on the
//! device for the hash-table selection ([`setops::ResidentSelect`]). Before
//! the selection runs, the device proves that equal hashes mean equal bytes
//! over both sides: every row is compared with its hash's representative row
//! (the smallest row index with that hash). A collision is reported as
//! `Ok(None)` and the caller recomputes exactly on the host, so no collision
//! can change a result.
//!
//! CPU twins: [`hash_rows_cpu`] and [`verify_cpu`].

use std::collections::HashMap;
use std::time::Instant;

use cudarc::driver::{LaunchConfig, PushKernelArg};
use datafusion::arrow::buffer::BooleanBuffer;
use datafusion::arrow::row::Rows;
use datafusion::error::{DataFusionError, Result};

use crate::algo::setops::{self, GpuStrategy, ResidentSelect, SetOp};
use crate::gpu::{cuda_err, DeviceBuffer, Gpu, TransferStats};
use crate::keys::{self, RowSubset};

const FAMILY: &str = "row_hash";
/// The verification table's empty key and "no representative yet" markers (as in the kernel).
const EMPTY_KEY: u64 = u64::MAX;
const NO_ROW: u32 = u32::MAX;

/// CPU twin of the device hashing: one [`keys::hash_bytes`] per row, row `i`
/// being `data[offsets[i]..offsets[i + 1]]`. Offsets must be non-decreasing
/// and within `data` (slice indexing panics otherwise; test and check input only).
pub fn hash_rows_cpu(offsets: &[usize], data: &[u8]) -> Vec<u64> {
    offsets.windows(2).map(|w| keys::hash_bytes(&data[w[0]..w[1]])).collect()
}

/// CPU twin of the device verification over rows given as one offsets/data
/// pair (both sides concatenated) and their hashes: `true` when equal hashes
/// always mean equal bytes (collision-free), `false` on a collision.
pub fn verify_cpu(hashes: &[u64], offsets: &[usize], data: &[u8]) -> bool {
    let row = |i: usize| &data[offsets[i]..offsets[i + 1]];
    // The representative of a hash is its smallest row index, as on the device.
    let mut rep: HashMap<u64, usize> = HashMap::with_capacity(hashes.len());
    hashes.iter().enumerate().all(|(i, &h)| row(*rep.entry(h).or_insert(i)) == row(i))
}

/// Row offsets on the device: 32-bit while a side's bytes allow (half the
/// transfer), 64-bit beyond 4 GiB. Both sides use the same width.
enum DeviceOffsets {
    U32(DeviceBuffer<u32>),
    U64(DeviceBuffer<u64>),
}

/// One side's rows on the device: `n + 1` offsets and the bytes, padded to a
/// multiple of 8 plus one zeroed word (the kernels read aligned 64-bit words,
/// including the word after the last byte).
struct DeviceRows {
    n: usize,
    offsets: DeviceOffsets,
    data: DeviceBuffer<u8>,
}

fn padded_len(bytes: usize) -> usize {
    bytes.div_ceil(8) * 8 + 8
}

/// Power-of-two capacity of the verification table: at least twice the rows,
/// so linear probing always finds an empty slot.
fn verify_capacity(rows: usize) -> usize {
    (rows * 2).next_power_of_two().max(1024)
}

fn launch_cfg(gpu: &Gpu, n: usize) -> LaunchConfig {
    let threads = 256u32;
    let max_blocks = (gpu.info().multiprocessors.max(1) as usize) * 32;
    let blocks = n.div_ceil(threads as usize).clamp(1, max_blocks) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
}

/// Device bytes that hashing, verifying and selecting these rows need at the
/// peak (rows + hashes + verification table, then hashes + the select's table).
pub fn device_bytes(op: SetOp, nb: usize, np: usize, build_bytes: usize, probe_bytes: usize) -> usize {
    let wide = build_bytes.max(probe_bytes) > u32::MAX as usize;
    let ow = if wide { 8 } else { 4 };
    let side = |n: usize, bytes: usize| (n + 1) * ow + padded_len(bytes) + n * 8;
    let verify = side(nb, build_bytes) + side(np, probe_bytes) + (verify_capacity(nb + np) + 1) * 12 + 4;
    verify.max(setops::device_bytes(GpuStrategy::Hash, op, nb, np, 0))
}

/// Upload one side's rows: offsets computed from the row lengths, and the
/// bytes copied straight from the rows into the pinned staging (no host concatenation).
fn upload_rows(gpu: &Gpu, rows: &[&[u8]], wide: bool, stats: &mut TransferStats) -> Result<DeviceRows> {
    let n = rows.len();
    let total: usize = rows.iter().map(|r| r.len()).sum();
    let offsets = if wide {
        let mut o = Vec::with_capacity(n + 1);
        let mut at = 0u64;
        o.push(0);
        for r in rows {
            at += r.len() as u64;
            o.push(at);
        }
        DeviceOffsets::U64(gpu.upload(&o, stats)?)
    } else {
        if total > u32::MAX as usize {
            return Err(DataFusionError::Internal("row_hash: 32-bit offsets for more than 4 GiB of rows".into()));
        }
        let mut o = Vec::with_capacity(n + 1);
        let mut at = 0u32;
        o.push(0);
        for r in rows {
            at += r.len() as u32; // total fits u32 (checked above), so no prefix overflows
            o.push(at);
        }
        DeviceOffsets::U32(gpu.upload(&o, stats)?)
    };
    // Zeroed so the padding the kernels read past the last row is defined.
    let mut data = gpu.alloc_zeros::<u8>(padded_len(total))?;
    gpu.upload_chunks_into(rows, &mut data, 0, stats)?;
    Ok(DeviceRows { n, offsets, data })
}

/// Hash every row on the device; the hashes stay there.
fn hash_on_device(gpu: &Gpu, rows: &DeviceRows) -> Result<DeviceBuffer<u64>> {
    let out = gpu.alloc::<u64>(rows.n)?;
    if rows.n == 0 {
        return Ok(out);
    }
    let n = rows.n as u64;
    let stream = gpu.stream();
    let cfg = launch_cfg(gpu, rows.n);
    match &rows.offsets {
        DeviceOffsets::U32(o) => {
            let f = gpu.function(FAMILY, "hash_rows_u32")?;
            // SAFETY: signature matches kernels/row_hash.cu; offsets hold n + 1 entries within the padded data; out holds n.
            unsafe { stream.launch_builder(&f).arg(&o.slice).arg(&rows.data.slice).arg(&n).arg(&out.slice).launch(cfg) }
        }
        DeviceOffsets::U64(o) => {
            let f = gpu.function(FAMILY, "hash_rows_u64")?;
            // SAFETY: as above.
            unsafe { stream.launch_builder(&f).arg(&o.slice).arg(&rows.data.slice).arg(&n).arg(&out.slice).launch(cfg) }
        }
    }
    .map_err(|e| cuda_err("row hash", e))?;
    Ok(out)
}

/// Device verification: `true` when equal hashes always mean equal bytes over
/// both sides. Waits for the device (it reads the collision flag back).
fn verify_on_device(
    gpu: &Gpu,
    build: &DeviceRows,
    build_hashes: &DeviceBuffer<u64>,
    probe: &DeviceRows,
    probe_hashes: &DeviceBuffer<u64>,
    stats: &mut TransferStats,
) -> Result<bool> {
    let (nb, np) = (build.n, probe.n);
    let n = nb + np;
    if n == 0 {
        return Ok(true);
    }
    if n >= NO_ROW as usize {
        return Err(DataFusionError::NotImplemented("row_hash: verification of 2^32 rows or more".into()));
    }
    let cap = verify_capacity(n);
    let (mask, slots) = ((cap - 1) as u64, (cap + 1) as u64);
    let keys = gpu.alloc::<u64>(cap + 1)?;
    let reps = gpu.alloc::<u32>(cap + 1)?;
    let flag = gpu.alloc_zeros::<u32>(1)?;
    let (nb64, np64) = (nb as u64, np as u64);
    let stream = gpu.stream();
    let started = Instant::now();
    let f = gpu.function(FAMILY, "fill_u64")?;
    // SAFETY: signature matches kernels/row_hash.cu; keys holds cap + 1 entries.
    unsafe { stream.launch_builder(&f).arg(&keys.slice).arg(&slots).arg(&EMPTY_KEY).launch(launch_cfg(gpu, cap + 1)) }
        .map_err(|e| cuda_err("row_hash fill", e))?;
    let f = gpu.function(FAMILY, "fill_u32")?;
    // SAFETY: as above, for reps.
    unsafe { stream.launch_builder(&f).arg(&reps.slice).arg(&slots).arg(&NO_ROW).launch(launch_cfg(gpu, cap + 1)) }
        .map_err(|e| cuda_err("row_hash fill", e))?;
    let f = gpu.function(FAMILY, "verify_insert")?;
    // SAFETY: hashes hold nb and np entries; the table holds cap + 1 slots with mask = cap - 1.
    unsafe {
        stream.launch_builder(&f).arg(&build_hashes.slice).arg(&nb64).arg(&probe_hashes.slice).arg(&np64)
            .arg(&keys.slice).arg(&reps.slice).arg(&mask).launch(launch_cfg(gpu, n))
    }
    .map_err(|e| cuda_err("row_hash verify insert", e))?;
    match (&build.offsets, &probe.offsets) {
        (DeviceOffsets::U32(bo), DeviceOffsets::U32(po)) => {
            let f = gpu.function(FAMILY, "verify_check_u32")?;
            // SAFETY: as above; each side's offsets hold n + 1 entries within its padded data.
            unsafe {
                stream.launch_builder(&f).arg(&build_hashes.slice).arg(&nb64).arg(&probe_hashes.slice).arg(&np64)
                    .arg(&keys.slice).arg(&reps.slice).arg(&mask).arg(&bo.slice).arg(&build.data.slice)
                    .arg(&po.slice).arg(&probe.data.slice).arg(&flag.slice).launch(launch_cfg(gpu, n))
            }
        }
        (DeviceOffsets::U64(bo), DeviceOffsets::U64(po)) => {
            let f = gpu.function(FAMILY, "verify_check_u64")?;
            // SAFETY: as above.
            unsafe {
                stream.launch_builder(&f).arg(&build_hashes.slice).arg(&nb64).arg(&probe_hashes.slice).arg(&np64)
                    .arg(&keys.slice).arg(&reps.slice).arg(&mask).arg(&bo.slice).arg(&build.data.slice)
                    .arg(&po.slice).arg(&probe.data.slice).arg(&flag.slice).launch(launch_cfg(gpu, n))
            }
        }
        _ => return Err(DataFusionError::Internal("row_hash: both sides need the same offset width".into())),
    }
    .map_err(|e| cuda_err("row_hash verify check", e))?;
    gpu.synchronize()?;
    stats.kernel += started.elapsed();
    Ok(gpu.read_one(&flag, 0, stats)? == 0)
}

/// Rows' bytes as slices (the upload gathers them straight into pinned staging).
fn row_slices(rows: RowSubset<'_>) -> Vec<&[u8]> {
    rows.iter().collect()
}

/// The GPU path for hash-encoded keys: hash both sides on the device, verify
/// every hash match there, then select on the device-resident hashes with the
/// hash-table strategy. `Ok(None)`: a hash collision was found (the caller
/// recomputes exactly). An `Err` that [`crate::gpu::is_out_of_memory`]
/// recognises means the rows do not fit the memory budget in one pass.
/// The caller holds the device lock.
pub fn select_rows_gpu(gpu: &Gpu, op: SetOp, build: &Rows, probe: &Rows, stats: &mut TransferStats) -> Result<Option<BooleanBuffer>> {
    select_subsets_gpu(gpu, op, RowSubset::all(build), RowSubset::all(probe), stats)
}

/// [`select_rows_gpu`] over row subsets (e.g. the non-NULL keys), without copying them into new `Rows`.
pub fn select_subsets_gpu(
    gpu: &Gpu,
    op: SetOp,
    build: RowSubset<'_>,
    probe: RowSubset<'_>,
    stats: &mut TransferStats,
) -> Result<Option<BooleanBuffer>> {
    select_slices_gpu(gpu, op, &row_slices(build), &row_slices(probe), None, stats)
}

/// The GPU path over rows given as byte slices. `hashes` (test hook) replaces
/// the device hashing with given hashes, so tests can force collisions.
pub(crate) fn select_slices_gpu(
    gpu: &Gpu,
    op: SetOp,
    build: &[&[u8]],
    probe: &[&[u8]],
    hashes: Option<(&[u64], &[u64])>,
    stats: &mut TransferStats,
) -> Result<Option<BooleanBuffer>> {
    let (nb, np) = (build.len(), probe.len());
    if np == 0 {
        return Ok(Some(BooleanBuffer::new_unset(0)));
    }
    let (bb, pb): (usize, usize) = (build.iter().map(|r| r.len()).sum(), probe.iter().map(|r| r.len()).sum());
    let need = device_bytes(op, nb, np, bb, pb);
    let avail = gpu.budget().available();
    if need > avail {
        // Worded so that gpu::is_out_of_memory recognises it: the caller then partitions on host hashes.
        return Err(DataFusionError::ResourcesExhausted(format!(
            "setfusion GPU: device memory budget exceeded: device row hashing needs {need} bytes, {avail} available"
        )));
    }
    let wide = bb.max(pb) > u32::MAX as usize;
    let rows_b = upload_rows(gpu, build, wide, stats)?;
    let rows_p = upload_rows(gpu, probe, wide, stats)?;
    let (bh, ph) = match hashes {
        None => (hash_on_device(gpu, &rows_b)?, hash_on_device(gpu, &rows_p)?),
        Some((hb, hp)) => {
            if hb.len() != nb || hp.len() != np {
                return Err(DataFusionError::Internal("row_hash: one hash per row expected".into()));
            }
            (gpu.upload(hb, stats)?, gpu.upload(hp, stats)?)
        }
    };
    let collision_free = verify_on_device(gpu, &rows_b, &bh, &rows_p, &ph, stats)?;
    // The bytes are no longer needed: free them before the select allocates its table.
    drop((rows_b, rows_p));
    if !collision_free {
        return Ok(None);
    }
    let out = ResidentSelect::from_device(bh, nb, ph, np, None).run(gpu, GpuStrategy::Hash, op, stats)?;
    let words = gpu.download(&out, np.div_ceil(32), stats)?;
    Ok(Some(setops::words_to_bool(words, np)))
}

/// Hash rows given as offsets/data on the device and read the hashes back (checks and tests).
pub fn hash_rows_gpu(gpu: &Gpu, offsets: &[usize], data: &[u8], stats: &mut TransferStats) -> Result<Vec<u64>> {
    let rows = slices_of(offsets, data)?;
    let wide = data.len() > u32::MAX as usize;
    let d = upload_rows(gpu, &rows, wide, stats)?;
    let h = hash_on_device(gpu, &d)?;
    gpu.download(&h, rows.len(), stats)
}

/// Device verification of both sides with given hashes (checks and tests:
/// equal hashes on different rows force a collision). `true` = collision-free.
pub(crate) fn verify_slices_gpu(
    gpu: &Gpu,
    build: &[&[u8]],
    build_hashes: &[u64],
    probe: &[&[u8]],
    probe_hashes: &[u64],
    stats: &mut TransferStats,
) -> Result<bool> {
    if build_hashes.len() != build.len() || probe_hashes.len() != probe.len() {
        return Err(DataFusionError::Internal("row_hash: one hash per row expected".into()));
    }
    let wide = build.iter().chain(probe).map(|r| r.len()).sum::<usize>() > u32::MAX as usize;
    let (b, p) = (upload_rows(gpu, build, wide, stats)?, upload_rows(gpu, probe, wide, stats)?);
    let (bh, ph) = (gpu.upload(build_hashes, stats)?, gpu.upload(probe_hashes, stats)?);
    verify_on_device(gpu, &b, &bh, &p, &ph, stats)
}

/// Rows of an offsets/data pair as slices; an error (not a panic) on bad offsets.
fn slices_of<'a>(offsets: &[usize], data: &'a [u8]) -> Result<Vec<&'a [u8]>> {
    offsets
        .windows(2)
        .map(|w| data.get(w[0]..w[1]).ok_or_else(|| DataFusionError::Internal("row_hash: offsets outside the data".into())))
        .collect()
}

/// Random rows for the checks: empty, short, 8-byte multiples and long ones,
/// with repeats (so verification compares real rows), as offsets + data.
fn random_rows(seed: u64, n: usize) -> (Vec<usize>, Vec<u8>) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut offsets = vec![0usize];
    let mut data: Vec<u8> = Vec::new();
    for i in 0..n {
        if i > 4 && rng.random_range(0..4) == 0 {
            // Repeat an earlier row.
            let j = rng.random_range(0..i);
            let (s, e) = (offsets[j], offsets[j + 1]);
            data.extend_from_within(s..e);
        } else {
            let len = match rng.random_range(0..20) {
                0 => 0,
                1 => 8 * rng.random_range(1..6),
                2 => rng.random_range(300..3000),
                _ => rng.random_range(1..100),
            };
            data.extend((0..len).map(|_| rng.random::<u8>()));
        }
        offsets.push(data.len());
    }
    (offsets, data)
}

/// Doctor self-check: device hashes equal the CPU twin's, the verifier finds
/// forced collisions (including on the table's empty-marker hash) and passes
/// collision-free input, and the selection matches the CPU on exact row ids.
pub fn self_check(gpu: &Gpu) -> Result<String> {
    let fail = |what: String| Err(DataFusionError::Execution(format!("row_hash self-check failed: {what}")));
    let mut stats = TransferStats::default();
    let (offsets, data) = random_rows(11, 20_000);
    let want = hash_rows_cpu(&offsets, &data);
    let got = hash_rows_gpu(gpu, &offsets, &data, &mut stats)?;
    if got != want {
        let bad = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
        return fail(format!("device hash of row {bad} differs from keys::hash_bytes ({} rows)", want.len()));
    }
    let rows = slices_of(&offsets, &data)?;
    let (build, probe) = rows.split_at(rows.len() / 2);
    let (bh, ph) = want.split_at(build.len());
    if !verify_slices_gpu(gpu, build, bh, probe, ph, &mut stats)? {
        return fail("collision reported on true hashes".into());
    }
    // Two different rows given one hash must be caught, also on the all-ones hash.
    let (i, j) = distinct_pair(build, probe).ok_or_else(|| DataFusionError::Internal("no distinct rows".into()))?;
    for forced in [bh[i], EMPTY_KEY] {
        let (mut fb, mut fp) = (bh.to_vec(), ph.to_vec());
        fb[i] = forced;
        fp[j] = forced;
        if verify_slices_gpu(gpu, build, &fb, probe, &fp, &mut stats)? {
            return fail(format!("forced collision on hash {forced:#x} not detected"));
        }
    }
    // Selection on device hashes against the CPU on exact row ids.
    let mut checked = 0;
    let (b_ids, p_ids) = exact_ids(build, probe);
    for op in [SetOp::Semi, SetOp::Anti, SetOp::IntersectDistinct, SetOp::IntersectAll, SetOp::ExceptDistinct, SetOp::ExceptAll] {
        let got = select_slices_gpu(gpu, op, build, probe, None, &mut stats)?;
        let want = setops::select_cpu(op, &b_ids, &p_ids);
        match got {
            Some(got) if setops::same_multiset_selection(op, &p_ids, &want, &got) => checked += 1,
            Some(_) => return fail(format!("{} selection differs from the CPU", op.name())),
            None => return fail(format!("{}: collision reported on true hashes", op.name())),
        }
    }
    let (mut fb, mut fp) = (bh.to_vec(), ph.to_vec());
    fb[i] = 7;
    fp[j] = 7;
    if select_slices_gpu(gpu, SetOp::Semi, build, probe, Some((&fb, &fp)), &mut stats)?.is_some() {
        return fail("forced collision not reported by the selection".into());
    }
    Ok(format!(
        "{} row hashes match keys::hash_bytes; forced collisions caught; {checked} ops match the CPU on exact rows",
        want.len()
    ))
}

/// A build row and a probe row with different bytes.
fn distinct_pair(build: &[&[u8]], probe: &[&[u8]]) -> Option<(usize, usize)> {
    let first = build.first()?;
    let j = probe.iter().position(|p| p != first)?;
    Some((0, j))
}

/// Exact dense ids of byte rows (equal ids iff equal bytes), for checks.
fn exact_ids<'a>(build: &[&'a [u8]], probe: &[&'a [u8]]) -> (Vec<u64>, Vec<u64>) {
    let mut ids: HashMap<&'a [u8], u64> = HashMap::new();
    let mut id = |r: &'a [u8]| -> u64 {
        let n = ids.len() as u64;
        *ids.entry(r).or_insert(n)
    };
    let b = build.iter().map(|r| id(r)).collect();
    let p = probe.iter().map(|r| id(r)).collect();
    (b, p)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{ArrayRef, Int32Array, StringArray};
    use datafusion::arrow::datatypes::DataType;
    use datafusion::arrow::row::{RowConverter, SortField};
    use rand::{Rng, SeedableRng};

    use super::*;

    const OPS: [SetOp; 6] =
        [SetOp::Semi, SetOp::Anti, SetOp::IntersectDistinct, SetOp::IntersectAll, SetOp::ExceptDistinct, SetOp::ExceptAll];

    /// Pins the hash function the device reproduces (values from an independent port).
    #[test]
    fn cpu_hash_golden_values() {
        let rows: [&[u8]; 5] = [b"", b"a", b"abcdefgh", b"abcdefghi", b"setfusion row hash!"];
        let want = [0xd34402edf2a39352u64, 0xadfb03f623bf3c3b, 0xcaf184724a8ab462, 0x703002d184daf332, 0x197abfe9135dde9d];
        let mut offsets = vec![0];
        let mut data = Vec::new();
        for r in rows {
            data.extend_from_slice(r);
            offsets.push(data.len());
        }
        assert_eq!(hash_rows_cpu(&offsets, &data), want);
        let bytes: Vec<u8> = (0..32).collect();
        assert_eq!(keys::hash_bytes(&bytes), 0xfb41947106c77b94);
    }

    #[test]
    fn cpu_verify_finds_forced_collisions_only() {
        let (offsets, data) = random_rows(3, 2000);
        let hashes = hash_rows_cpu(&offsets, &data);
        assert!(verify_cpu(&hashes, &offsets, &data));
        let rows = slices_of(&offsets, &data).unwrap();
        let j = rows.iter().position(|r| *r != rows[0]).unwrap();
        let mut forced = hashes.clone();
        forced[j] = forced[0];
        assert!(!verify_cpu(&forced, &offsets, &data));
        // Equal rows under one hash are fine, whatever the hash.
        let k = (1..rows.len()).find(|&k| rows[k] == rows[0]).unwrap_or(0);
        let mut same = hashes.clone();
        same[0] = u64::MAX;
        same[k] = u64::MAX;
        assert!(verify_cpu(&same, &offsets, &data));
    }

    fn string_rows(conv: &RowConverter, vals: &[Option<&str>], ints: &[i32]) -> Rows {
        let cols: Vec<ArrayRef> = vec![Arc::new(StringArray::from(vals.to_vec())), Arc::new(Int32Array::from(ints.to_vec()))];
        conv.convert_columns(&cols).unwrap()
    }

    #[test]
    fn row_subsets_verify_and_exact_ids() {
        let conv = RowConverter::new(vec![SortField::new(DataType::Utf8), SortField::new(DataType::Int32)]).unwrap();
        let b = string_rows(&conv, &[Some("a"), None, Some("bb"), Some("a")], &[1, 2, 3, 1]);
        let p = string_rows(&conv, &[Some("bb"), Some("a"), Some("c")], &[3, 2, 1]);
        let bi = [0u32, 2, 3];
        let bs = RowSubset::new(&b, Some(&bi)).unwrap();
        let ps = RowSubset::all(&p);
        assert!(RowSubset::new(&b, Some(&[4])).is_err());
        assert_eq!(bs.len(), 3);
        assert_eq!(bs.data_len(), bi.iter().map(|&i| b.row(i as usize).data().len()).sum::<usize>());
        let (bh, ph) = (keys::hash_rows(bs), keys::hash_rows(ps));
        assert_eq!(bh[1], keys::hash_bytes(b.row(2).data()));
        assert!(keys::verify_rows_or_exact(bs, &bh, ps, &ph).is_none());
        let (b_ids, p_ids) = keys::exact_ids(bs, ps);
        assert_eq!(b_ids, vec![0, 1, 0]);
        assert_eq!(p_ids, vec![1, 2, 3]);
        // ("a", 1) and ("a", 2) forced to one hash: exact ids come back.
        let mut ph2 = ph.clone();
        ph2[1] = bh[0];
        assert_eq!(keys::verify_rows_or_exact(bs, &bh, ps, &ph2), Some((b_ids, p_ids)));
    }

    #[test]
    fn gpu_hashes_match_cpu_twin() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        for (seed, n) in [(1u64, 0usize), (2, 1), (3, 7), (4, 5000), (5, 100_000)] {
            let (offsets, data) = random_rows(seed, n);
            let got = hash_rows_gpu(&gpu, &offsets, &data, &mut TransferStats::default()).unwrap();
            assert_eq!(got, hash_rows_cpu(&offsets, &data), "seed {seed}");
        }
        // Every length 0..80 at every start alignment: a spacer row of 0..7 bytes before each.
        let mut offsets = vec![0];
        for len in 0..80 {
            for spacer in 0..8 {
                offsets.push(offsets[offsets.len() - 1] + spacer);
                offsets.push(offsets[offsets.len() - 1] + len);
            }
        }
        let bytes: Vec<u8> = (0..offsets[offsets.len() - 1] as u32).map(|i| (i * 37 % 251) as u8).collect();
        let got = hash_rows_gpu(&gpu, &offsets, &bytes, &mut TransferStats::default()).unwrap();
        assert_eq!(got, hash_rows_cpu(&offsets, &bytes));
        self_check(&gpu).unwrap();
    }

    #[test]
    fn gpu_verify_matches_cpu_twin() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for case in 0..40 {
            let (offsets, data) = random_rows(100 + case, rng.random_range(2..3000));
            let mut hashes = hash_rows_cpu(&offsets, &data);
            if case % 2 == 1 {
                // Squeeze the hashes into a tiny domain: many forced collisions (or, by luck, none).
                let m = rng.random_range(1..50u64);
                for h in &mut hashes {
                    *h = if *h % 3 == 0 { u64::MAX } else { *h % m };
                }
            }
            let rows = slices_of(&offsets, &data).unwrap();
            let cut = rng.random_range(0..=rows.len());
            let (b, p) = rows.split_at(cut);
            let (bh, ph) = hashes.split_at(cut);
            let got = verify_slices_gpu(&gpu, b, bh, p, ph, &mut TransferStats::default()).unwrap();
            assert_eq!(got, verify_cpu(&hashes, &offsets, &data), "case {case}");
        }
    }

    #[test]
    fn gpu_select_rows_matches_exact_cpu() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        let conv = RowConverter::new(vec![SortField::new(DataType::Utf8), SortField::new(DataType::Int32)]).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(8);
        let words = ["", "a", "setfusion", "gpu", "a much longer string key that spans several words", "ß∂ƒ"];
        let mut side = |n: usize| {
            let vals: Vec<Option<String>> =
                (0..n).map(|_| (rng.random_range(0..10) > 0).then(|| words[rng.random_range(0..words.len())].to_string())).collect();
            let ints: Vec<i32> = (0..n).map(|_| rng.random_range(0..4)).collect();
            let refs: Vec<Option<&str>> = vals.iter().map(|v| v.as_deref()).collect();
            string_rows(&conv, &refs, &ints)
        };
        for (nb, np) in [(0, 10), (10, 0), (300, 500), (5000, 4000)] {
            let (b, p) = (side(nb), side(np));
            let (bs, ps) = (RowSubset::all(&b), RowSubset::all(&p));
            let (b_ids, p_ids) = keys::exact_ids(bs, ps);
            for op in OPS {
                let got = select_rows_gpu(&gpu, op, &b, &p, &mut TransferStats::default()).unwrap().expect("no collision");
                let want = setops::select_cpu(op, &b_ids, &p_ids);
                assert!(setops::same_multiset_selection(op, &p_ids, &want, &got), "{nb}x{np} {op:?}");
            }
            // Subsets (every other row) go through the same path without copying rows.
            let (bi, pi): (Vec<u32>, Vec<u32>) = ((0..nb as u32).step_by(2).collect(), (1..np as u32).step_by(2).collect());
            let (bs, ps) = (RowSubset::new(&b, Some(&bi)).unwrap(), RowSubset::new(&p, Some(&pi)).unwrap());
            let (b_ids, p_ids) = keys::exact_ids(bs, ps);
            for op in OPS {
                let got = select_subsets_gpu(&gpu, op, bs, ps, &mut TransferStats::default()).unwrap().expect("no collision");
                let want = setops::select_cpu(op, &b_ids, &p_ids);
                assert!(setops::same_multiset_selection(op, &p_ids, &want, &got), "subset {nb}x{np} {op:?}");
            }
        }
    }

    #[test]
    fn gpu_select_reports_forced_collision_and_budget() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        let rows: Vec<&[u8]> = vec![b"alpha", b"beta", b"gamma", b"alpha"];
        let (b, p) = rows.split_at(2);
        let mut st = TransferStats::default();
        // Different rows "beta" and "gamma" share a hash: a collision, whatever the op.
        let got = select_slices_gpu(&gpu, SetOp::Semi, b, p, Some((&[1, 2], &[2, 1])), &mut st).unwrap();
        assert!(got.is_none());
        // Equal rows sharing a hash are fine: probe "gamma" (hash 3) and "alpha" (hash 1).
        let got = select_slices_gpu(&gpu, SetOp::Semi, b, p, Some((&[1, 2], &[3, 1])), &mut st).unwrap().unwrap();
        assert_eq!(got.iter().collect::<Vec<_>>(), vec![false, true]);
        gpu.budget().set_limit(1 << 10);
        let r = select_slices_gpu(&gpu, SetOp::Semi, b, p, None, &mut st);
        gpu.budget().set_limit(0); // before asserting, so a failure does not starve other tests
        assert!(r.as_ref().is_err_and(crate::gpu::is_out_of_memory), "{r:?}");
    }
}
