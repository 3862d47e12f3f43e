//! Page decoding into 64-bit keys: the launcher of `kernels/parquet_decode.cu`
//! ([`decode_gpu`]) and its CPU twin ([`decode_cpu`]), one signature over the
//! raw chunk bytes and the [`PageTable`]. Data pages are PLAIN,
//! dictionary-encoded or DELTA_BINARY_PACKED ([`delta_values`]).
//!
//! BYTE_ARRAY (string / binary) keys are `keys::hash_bytes` of their bytes;
//! on the device each row's span (where its bytes lie in the decoder's page
//! bodies, kept with the keys: [`DeviceStrings`]) lets the selection prove
//! that equal hashes mean equal values before it trusts them.
//!
//! Keys are the host's exact encoding of the column's Arrow type (see
//! `keys::is_exact`): the value sign-extended to 64 bits (INT32, DATE32,
//! INT64, decimals of at most 18 digits stored as INT32 / INT64). NULL rows
//! hold key 0 and a cleared validity bit (LSB-first 32-bit words, Arrow's layout).

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use datafusion::error::{DataFusionError, Result};

use super::pages::{
    PageTable, PqPage, CODEC_GZIP, CODEC_LZ4_RAW, CODEC_NONE, CODEC_SNAPPY, CODEC_ZSTD, ENC_DELTA, ENC_DICT,
    ENC_RLE_BOOL, KIND_DICT, KIND_V2, NO_DICT, WIDTH_BYTES,
};
use crate::gpu::{cuda_err, DeviceBuffer, Gpu, TransferStats};

/// Hybrid-stream runs per batch in the decode kernel's shared memory.
const RUNS: usize = 512;
/// Threads per block of the per-page kernels.
const BLOCK: u32 = 256;
/// pq_snappy: warps per block, one page each (each warp holds an 8 KiB ring
/// of recent output in shared memory: four warps stay under the 48 KiB of
/// static shared memory a block may have, and six blocks, 24 warps, fit an SM).
const SNAPPY_WARPS: u32 = 4;

/// pq_snappy_pipe: pages per block, two warps each (a parsing and a filling
/// warp, an 8 KiB ring and a 3.6 KiB queue of four windows in shared memory).
/// On an H200 (`benches/cuda/page_decompress_bench.cu`, 160 KB integer pages)
/// one page a block decompressed a part of 528 pages alone 8-11% faster than
/// two, but from 2000 pages on two were 2-11% faster; in queries, where
/// several parts decode at once, two left the shorter decode after the reads
/// (`bench parquet` on one loan: 11.8-26.5 ms against 13.9-35.0; TPC-H's set
/// operations alike). `SETFUSION_SNAPPY_PAIRS` overrides it.
const SNAPPY_PAIRS: u32 = 2;

/// Warps a block of `pq_snappy`: `SETFUSION_SNAPPY_WARPS` (1 to 32), else [`SNAPPY_WARPS`].
fn snappy_warps() -> u32 {
    crate::env::snappy_warps().filter(|w| (1..=32).contains(w)).unwrap_or(SNAPPY_WARPS)
}

/// Pages a block of `pq_snappy_pipe`: `SETFUSION_SNAPPY_PAIRS` (1 to 4: each
/// page holds ~12 KiB of the block's 48 KiB of static shared memory), else
/// [`SNAPPY_PAIRS`].
fn snappy_pairs() -> u32 {
    crate::env::snappy_pairs().filter(|p| (1..=4).contains(p)).unwrap_or(SNAPPY_PAIRS)
}

fn defines() -> Vec<(String, u64)> {
    vec![
        ("PQ_RUNS".to_string(), RUNS as u64),
        ("PQ_SNAPPY_WARPS".to_string(), snappy_warps() as u64),
        ("PQ_SNAPPY_PAIRS".to_string(), snappy_pairs() as u64),
    ]
}

/// kernels/parquet_decode.cu, with its contract constants as `-D` options.
pub static KERNEL: crate::gpu::KernelSource = crate::gpu::KernelSource {
    family: "parquet_decode",
    source: include_str!("../../kernels/parquet_decode.cu"),
    defines,
};

/// kernels/zstd.cu: ZSTD pages decompressed on the device, one warp a page.
pub static ZSTD_KERNEL: crate::gpu::KernelSource =
    crate::gpu::KernelSource { family: "zstd", source: include_str!("../../kernels/zstd.cu"), defines: zstd_defines };

/// zs_pages's warps per block (`ZS_WARPS`: each keeps ~14 KB of tables and ring in shared memory).
const ZSTD_WARPS: u32 = 3;

fn zstd_defines() -> Vec<(String, u64)> {
    vec![("ZS_WARPS".to_string(), ZSTD_WARPS as u64)]
}

/// The kernels' error codes (`PQ_ERR_*`, `ZS_ERR_*`), as messages.
fn error_message(code: u32) -> String {
    let what = match code {
        1 => "corrupt snappy stream",
        2 => "snappy stream of the wrong decompressed size",
        3 => "corrupt definition levels",
        4 => "page values shorter than its non-NULL rows",
        5 => "dictionary index out of range",
        6 => "bad dictionary index bit width",
        7 => "dictionary page missing",
        8 => "corrupt ZSTD, LZ4_RAW or GZIP page",
        9 => "ZSTD, LZ4_RAW or GZIP page of the wrong decompressed size",
        ERR_DELTA => "corrupt DELTA_BINARY_PACKED values (header, block or miniblock sizes, bit width, or truncated)",
        ERR_DELTA_COUNT => "DELTA_BINARY_PACKED value count differs from the page's non-NULL rows",
        12 => "corrupt ZSTD page",
        13 => "ZSTD page of the wrong decompressed size",
        14 => "ZSTD page that needs a dictionary",
        _ => "unknown decode error",
    };
    format!("setfusion device scan: {what} (code {code})")
}

/// `PQ_ERR_DELTA`, `PQ_ERR_DELTA_COUNT`.
const ERR_DELTA: u32 = 10;
const ERR_DELTA_COUNT: u32 = 11;
/// `PQ_DELTA_MAX_BLOCK`: larger DELTA block sizes are refused.
const DELTA_MAX_BLOCK: u64 = 1 << 30;

pub(crate) fn decode_error(code: u32) -> DataFusionError {
    DataFusionError::External(error_message(code).into())
}

/// Decoded keys on the host: one per row, and validity words for optional columns.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    pub keys: Vec<u64>,
    pub valid: Option<Vec<u32>>,
}

/// Decoded keys on the device.
pub struct DeviceDecoded {
    pub keys: DeviceBuffer<u64>,
    pub valid: Option<DeviceBuffer<u32>>,
    pub rows: usize,
    /// A BYTE_ARRAY column: where each row's bytes lie (its key is their hash).
    pub strings: Option<DeviceStrings>,
}

/// A BYTE_ARRAY column's values on the device, as the decoder left them:
/// two words a row (the value's device address and its length; a NULL row,
/// or one the page index left out, is (0, 0)), pointing into the page bodies
/// held here (each padded so the word after a value's last byte may be
/// read: `verify_check_spans` in kernels/row_hash.cu reads whole words).
/// The bodies are never written after their decode, so a copy of the spans
/// may share them ([`Self::shared_copy`]: the device column cache's entries).
pub struct DeviceStrings {
    pub spans: DeviceBuffer<u64>,
    bodies: Vec<Arc<DeviceBuffer<u8>>>,
}

impl DeviceStrings {
    /// Spans of `rows` rows (zeroed), the bodies they will point into added later ([`Self::hold`]).
    pub fn zeroed(gpu: &Gpu, rows: usize) -> Result<Self> {
        Ok(Self { spans: gpu.alloc_zeros::<u64>(2 * rows.max(1))?, bodies: Vec::new() })
    }

    /// Keep a decode's page bodies, which the spans point into.
    pub fn hold(&mut self, scratch: DecodeScratch) {
        self.bodies.push(Arc::new(scratch.body));
    }

    /// A copy of the spans made on the device, pointing into these same
    /// bodies, which it keeps alive too.
    pub fn shared_copy(&self, gpu: &Gpu) -> Result<Self> {
        Ok(Self { spans: gpu.copy_on_device(&self.spans, self.spans.len())?, bodies: self.bodies.clone() })
    }

    /// Device bytes of the spans and the bodies.
    pub fn bytes(&self) -> usize {
        self.spans.len() * 8 + self.bodies.iter().map(|b| b.len()).sum::<usize>()
    }
}

/// Decode `t`'s pages of `raw` on the device (`raw`: the same bytes, uploaded).
pub fn decode_gpu(
    gpu: &Gpu,
    raw: &DeviceBuffer<u8>,
    t: &PageTable,
    stats: &mut TransferStats,
) -> Result<DeviceDecoded> {
    let rows = t.rows as usize;
    let keys = gpu.alloc::<u64>(rows)?;
    let valid = if t.def_max > 0 { Some(gpu.alloc_zeros::<u32>(rows.div_ceil(32))?) } else { None };
    let mut strings = if t.holds_bytes() { Some(DeviceStrings::zeroed(gpu, rows)?) } else { None };
    if t.pages.is_empty() || rows == 0 {
        return Ok(DeviceDecoded { keys, valid, rows, strings });
    }
    let err = gpu.alloc_zeros::<u32>(1)?;
    let dummy_valid = gpu.alloc_zeros::<u32>(1)?;
    let started = Instant::now();
    let into = DecodeTargets {
        keys: gpu.untracked_address(&keys),
        valid: gpu.untracked_address(valid.as_ref().unwrap_or(&dummy_valid)),
        err: gpu.untracked_address(&err),
        spans: strings.as_ref().map_or(0, |s| gpu.untracked_address(&s.spans)),
    };
    let pages = gpu.upload(&t.flat(), stats)?;
    // Every buffer is used on the main stream alone, in its order (so the untracked addresses are safe).
    let scratch =
        launch_decode(gpu, gpu.stream(), gpu.untracked_address(raw), gpu.untracked_address(&pages), t, &into)?;
    let code = gpu.read_one(&err, 0, stats)?;
    match (&mut strings, scratch) {
        (Some(s), Some(scratch)) => s.hold(scratch),
        (_, scratch) => drop(scratch),
    }
    stats.kernel += started.elapsed();
    if code != 0 {
        return Err(decode_error(code));
    }
    Ok(DeviceDecoded { keys, valid, rows, strings })
}

/// Where [`launch_decode`] writes, as device addresses: one key a row of the
/// table's rows, the validity words (zeroed; one unused word for a required
/// column), the error word (zeroed; the first failing page's code), and for
/// a BYTE_ARRAY column its rows' spans (zeroed, two words a row; 0 otherwise:
/// [`DeviceStrings`]).
pub struct DecodeTargets {
    pub keys: u64,
    pub valid: u64,
    pub err: u64,
    pub spans: u64,
}

/// Queue the decode of `t`'s pages on `stream`: their bytes at device address
/// `raw` (each page at its `src`), `pages` the device address of `t.flat()`,
/// into `into` (each page at its `first_row`). The scratch is allocated on
/// `stream` and returned (None for a table without pages): drop it once the decode is done (its memory is freed
/// in `stream`'s order anyway, but its budget charge ends with it). Nothing is
/// waited for (no copy from pageable memory either, which could wait on the
/// stream): the caller orders the uploads of the bytes and the table before
/// (an event), reads the error word after, and keeps every buffer alive until then.
pub fn launch_decode(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    raw: u64,
    pages: u64,
    t: &PageTable,
    into: &DecodeTargets,
) -> Result<Option<DecodeScratch>> {
    if t.pages.iter().any(|p| p.codec > CODEC_ZSTD) {
        return Err(DataFusionError::Internal(
            "setfusion device scan: an LZ4_RAW or GZIP page reached the device undecompressed".into(),
        ));
    }
    let npages = t.pages.len() as u64;
    if npages == 0 {
        return Ok(None);
    }
    if t.holds_bytes() && into.spans == 0 {
        return Err(DataFusionError::Internal("setfusion device scan: BYTE_ARRAY pages without spans to write".into()));
    }
    let mut scratch = DecodeScratch {
        // Two spare words: a string's hash reads whole words, up to the one after its last byte.
        body: gpu.alloc_on::<u8>(stream, t.body_len as usize + 16)?,
        levels: gpu.alloc_zeros_on::<u32>(stream, t.lvl_words as usize)?,
        idx: gpu.alloc_on::<u32>(stream, t.idx_len as usize)?,
    };
    let DecodeScratch { body, levels, idx } = &mut scratch;
    let per_page =
        LaunchConfig { grid_dim: (npages.min(1 << 20) as u32, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
    let copy = gpu.function(&KERNEL, "pq_copy_pages")?;
    // SAFETY: signature matches kernels/parquet_decode.cu; every page's src / dst range lies in `raw` / `body`
    // (page_table built them; the caller's `raw` holds the table's bytes).
    unsafe { stream.launch_builder(&copy).arg(&raw).arg(&mut body.slice).arg(&pages).arg(&npages).launch(per_page) }
        .map_err(|e| cuda_err("pq_copy_pages", e))?;
    if t.pages.iter().any(|p| p.codec == CODEC_SNAPPY) {
        // Two warps per page (one parses, one writes), 64 bytes a step;
        // one warp per page (SETFUSION_SNAPPY_ONE_WARP=1) adds the two halves'
        // times; one thread per page (SETFUSION_SNAPPY_SERIAL=1) waits on L2
        // for every copied byte.
        let (name, cfg) = if crate::env::snappy_serial() {
            let cfg = LaunchConfig {
                grid_dim: (npages.div_ceil(64) as u32, 1, 1),
                block_dim: (64, 1, 1),
                shared_mem_bytes: 0,
            };
            ("pq_snappy_serial", cfg)
        } else {
            let (name, pages_a_block, warps) = if crate::env::snappy_one_warp() {
                let warps = snappy_warps();
                ("pq_snappy", warps, warps)
            } else {
                let pairs = snappy_pairs();
                ("pq_snappy_pipe", pairs, 2 * pairs)
            };
            let blocks = npages.div_ceil(pages_a_block as u64).min(1 << 20) as u32;
            (name, LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (32 * warps, 1, 1), shared_mem_bytes: 0 })
        };
        let snappy = gpu.function(&KERNEL, name)?;
        // SAFETY: as above; `into.err` addresses one word.
        unsafe {
            stream
                .launch_builder(&snappy)
                .arg(&raw)
                .arg(&mut body.slice)
                .arg(&pages)
                .arg(&npages)
                .arg(&into.err)
                .launch(cfg)
        }
        .map_err(|e| cuda_err(name, e))?;
    }
    if t.pages.iter().any(|p| p.codec == CODEC_ZSTD) {
        launch_zstd(gpu, stream, raw, &mut body.slice, pages, npages, into.err)?;
    }
    if t.pages.iter().any(|p| p.kind == KIND_DICT && p.width == WIDTH_BYTES) {
        let dicts = gpu.function(&KERNEL, "pq_byte_dicts")?;
        // SAFETY: signature matches kernels/parquet_decode.cu; each BYTE_ARRAY dictionary page's 6 u32 entries
        // a value of `idx` from an even idx_off lie in the scratch page_table counted; `into.err` is one word.
        unsafe {
            stream
                .launch_builder(&dicts)
                .arg(&body.slice)
                .arg(&pages)
                .arg(&npages)
                .arg(&mut idx.slice)
                .arg(&into.err)
                .launch(per_page)
        }
        .map_err(|e| cuda_err("pq_byte_dicts", e))?;
    }
    let decode = gpu.function(&KERNEL, "pq_decode")?;
    // SAFETY: as above; `levels` / `idx` hold the scratch page_table counted (DELTA pages' u64 at even,
    // so 8-aligned, entries of the allocation), `into.keys` one key per row of the table, `into.valid`
    // one bit per row (or one unused word for required columns), `into.spans` two words per row of a
    // BYTE_ARRAY column (checked above; never written for other columns).
    unsafe {
        stream
            .launch_builder(&decode)
            .arg(&body.slice)
            .arg(&pages)
            .arg(&npages)
            .arg(&mut levels.slice)
            .arg(&mut idx.slice)
            .arg(&into.keys)
            .arg(&into.valid)
            .arg(&into.spans)
            .arg(&into.err)
            .launch(per_page)
    }
    .map_err(|e| cuda_err("pq_decode", e))?;
    Ok(Some(scratch))
}

/// Queue `zs_pages` on `stream`: every ZSTD page of the page table at device
/// address `pages` (`npages` entries) decompressed from `raw` into `body`,
/// one warp a page, after the page's never compressed levels (copied by
/// `pq_copy_pages`); the first failure's code into the word at `err`.
pub fn launch_zstd(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    raw: u64,
    body: &mut CudaSlice<u8>,
    pages: u64,
    npages: u64,
    err: u64,
) -> Result<()> {
    let f = gpu.function(&ZSTD_KERNEL, "zs_pages")?;
    let blocks = npages.div_ceil(ZSTD_WARPS as u64).min(1 << 20) as u32;
    let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (32 * ZSTD_WARPS, 1, 1), shared_mem_bytes: 0 };
    let (stride, codec) = (PqPage::WORDS as u64, CODEC_ZSTD);
    // SAFETY: signature matches kernels/zstd.cu's zs_pages; the table holds `npages` entries of `stride` words
    // whose first five are PqPage's src / src_len / dst / dst_len / levels_len and whose seventh is its codec, every
    // ZSTD page's ranges lie in `raw` / `body` (page_table built them), and `err` addresses one word.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&raw)
            .arg(body)
            .arg(&pages)
            .arg(&npages)
            .arg(&stride)
            .arg(&codec)
            .arg(&err)
            .launch(cfg)
    }
    .map_err(|e| cuda_err("zs_pages", e))?;
    Ok(())
}

/// `runs` (each one or more ZSTD frames and its decompressed length)
/// decompressed by `zs_pages` alone, as pages of one table (for its tests).
pub fn zstd_on_device(gpu: &Gpu, runs: &[(&[u8], usize)]) -> Result<Vec<Vec<u8>>> {
    let mut raw = Vec::new();
    let mut pages = Vec::new();
    let mut body_len = 0u64;
    for (z, n) in runs {
        let page = PqPage {
            src: raw.len() as u64,
            src_len: z.len() as u64,
            dst: body_len,
            dst_len: *n as u64,
            codec: CODEC_ZSTD,
            kind: KIND_DICT,
            ..Default::default()
        };
        raw.extend_from_slice(z);
        body_len += (*n as u64).div_ceil(8) * 8;
        pages.push(page);
    }
    let mut stats = TransferStats::default();
    let d_raw = gpu.upload(&raw, &mut stats)?;
    let table: Vec<u64> = pages.iter().flat_map(|p| p.fields()).collect();
    let d_table = gpu.upload(&table, &mut stats)?;
    let mut body = gpu.alloc_zeros::<u8>(body_len.max(1) as usize)?;
    let err = gpu.alloc_zeros::<u32>(1)?;
    // Every buffer is used on the main stream alone, in its order.
    launch_zstd(
        gpu,
        gpu.stream(),
        gpu.untracked_address(&d_raw),
        &mut body.slice,
        gpu.untracked_address(&d_table),
        pages.len() as u64,
        gpu.untracked_address(&err),
    )?;
    let code = gpu.read_one(&err, 0, &mut stats)?;
    if code != 0 {
        return Err(decode_error(code));
    }
    let bytes = gpu.download(&body, body_len.max(1) as usize, &mut stats)?;
    Ok(pages.iter().map(|p| bytes[p.dst as usize..(p.dst + p.dst_len) as usize].to_vec()).collect())
}

/// A decode's scratch on the device ([`launch_decode`]): the pages'
/// decompressed bodies, their validity levels and their index entries.
pub struct DecodeScratch {
    /// Kept by a BYTE_ARRAY column's [`DeviceStrings`] once the decode is done.
    body: DeviceBuffer<u8>,
    levels: DeviceBuffer<u32>,
    idx: DeviceBuffer<u32>,
}

/// A fixture case's chunk bytes and page table as the device takes them:
/// pages of codecs the device does not decompress inflated on the host and
/// appended to the bytes (large snappy pages stay).
pub fn device_table_of(case: &super::fixtures::Case) -> Result<(Vec<u8>, PageTable)> {
    let (mut raw, mut table) = super::fixtures::table_of(case)?;
    let extra = inflate_on_host(&mut table, &raw, raw.len() as u64, u64::MAX)?;
    raw.extend_from_slice(&extra);
    Ok((raw, table))
}

/// The hybrid RLE / bit-packed stream's runs, as the kernel reads them.
struct Hybrid<'a> {
    s: &'a [u8],
    pos: usize,
    bw: u32,
}

/// An unsigned varint at `s[*pos..]` (at most 10 bytes, as the kernel's `pq_uvarint`).
fn uvarint(s: &[u8], pos: &mut usize) -> Option<u64> {
    let mut x = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *s.get(*pos)?;
        *pos += 1;
        x |= ((b & 0x7f) as u64) << shift;
        if b & 0x80 == 0 {
            return Some(x);
        }
    }
    None
}

impl Hybrid<'_> {
    fn varint(&mut self) -> Option<u64> {
        uvarint(self.s, &mut self.pos)
    }
    /// Append up to `want` values to `out`; None when the stream is corrupt or ends early.
    fn read(&mut self, want: usize, out: &mut Vec<u32>) -> Option<()> {
        let bw = self.bw as usize;
        while out.len() < want {
            let h = self.varint()?;
            let left = want - out.len();
            if h & 1 == 1 {
                let n = ((h >> 1) * 8) as usize;
                let bytes = (h >> 1) as usize * bw;
                let take = n.min(left);
                if self.pos + (take * bw).div_ceil(8) > self.s.len() || take == 0 {
                    return None;
                }
                let start = self.pos * 8;
                for j in 0..take {
                    let bit = start + j * bw;
                    let mut word = 0u64;
                    for k in 0..5 {
                        word |= (*self.s.get(bit / 8 + k).unwrap_or(&0) as u64) << (8 * k);
                    }
                    let mask = if bw == 32 { u32::MAX as u64 } else { (1u64 << bw) - 1 };
                    out.push(((word >> (bit % 8)) & mask) as u32);
                }
                self.pos = (self.pos + bytes).min(self.s.len());
            } else {
                let vb = bw.div_ceil(8);
                if self.pos + vb > self.s.len() {
                    return None;
                }
                let mut v = 0u64;
                for k in 0..vb {
                    v |= (self.s[self.pos + k] as u64) << (8 * k);
                }
                self.pos += vb;
                let n = ((h >> 1) as usize).min(left);
                if n == 0 {
                    return None;
                }
                out.extend(std::iter::repeat_n(v as u32, n));
            }
        }
        Some(())
    }
}

/// A zigzag varint as its signed value's 64-bit two's complement.
fn zigzag(s: &[u8], pos: &mut usize) -> Option<u64> {
    let z = uvarint(s, pos)?;
    Some((z >> 1) ^ (z & 1).wrapping_neg())
}

/// `bw` (1 to 64) bits at bit `bit` of `s`, LSB first (bytes past the end read as 0).
fn unpack64(s: &[u8], bit: u64, bw: u32) -> u64 {
    let byte = (bit / 8) as usize;
    let shift = (bit % 8) as u32;
    let at = |k: usize| *s.get(byte + k).unwrap_or(&0) as u64;
    let mut v = (0..8).fold(0u64, |w, k| w | at(k) << (8 * k)) >> shift;
    if shift + bw > 64 {
        v |= at(8) << (64 - shift);
    }
    if bw == 64 {
        v
    } else {
        v & ((1u64 << bw) - 1)
    }
}

/// A 64-bit sum as the key of a `width`-byte column (INT32: its low 32 bits, sign-extended).
fn narrow(v: u64, width: u64) -> u64 {
    if width == 4 {
        v as u32 as i32 as i64 as u64
    } else {
        v
    }
}

/// A page's DELTA_BINARY_PACKED values (`s`: its bytes after the levels) as
/// `nonnull` keys, with the kernel's checks (`pq_delta_values`) in its order;
/// `Err`: its error code. Sums wrap in 64 bits; INT32 keeps the low 32 bits.
fn delta_values(s: &[u8], nonnull: usize, width: u64) -> std::result::Result<Vec<u64>, u32> {
    let mut values = Vec::with_capacity(nonnull);
    // A page of NULLs only may hold no values at all.
    if nonnull == 0 && s.is_empty() {
        return Ok(values);
    }
    let mut pos = 0usize;
    let header =
        (|| Some((uvarint(s, &mut pos)?, uvarint(s, &mut pos)?, uvarint(s, &mut pos)?, zigzag(s, &mut pos)?)))();
    let (block, mb, total, first) = header.ok_or(ERR_DELTA)?;
    if block == 0 || block % 128 != 0 || block > DELTA_MAX_BLOCK || mb == 0 || block % mb != 0 || (block / mb) % 32 != 0
    {
        return Err(ERR_DELTA);
    }
    if total != nonnull as u64 {
        return Err(ERR_DELTA_COUNT);
    }
    if nonnull == 0 {
        return Ok(values);
    }
    let per_mini = block / mb;
    let deltas = nonnull as u64 - 1;
    let mut last = first;
    values.push(narrow(first, width));
    // `mini == mb`: the next block's header comes first.
    let (mut got, mut mini, mut widths_at, mut min_delta) = (0u64, mb, 0usize, 0u64);
    while got < deltas {
        if mini == mb {
            min_delta = zigzag(s, &mut pos).ok_or(ERR_DELTA)?;
            if mb > (s.len() - pos) as u64 {
                return Err(ERR_DELTA);
            }
            widths_at = pos;
            pos += mb as usize;
            mini = 0;
        }
        let bw = s[widths_at + mini as usize] as u32;
        mini += 1;
        // Only the deltas wanted must be there: a writer may end the last miniblock early.
        let count = per_mini.min(deltas - got);
        if bw as u64 > 8 * width || (count * bw as u64).div_ceil(8) > (s.len() - pos) as u64 {
            return Err(ERR_DELTA);
        }
        let at = pos as u64 * 8;
        for j in 0..count {
            let packed = if bw == 0 { 0 } else { unpack64(s, at + j * bw as u64, bw) };
            last = last.wrapping_add(min_delta.wrapping_add(packed));
            values.push(narrow(last, width));
        }
        pos = (pos as u64 + per_mini / 8 * bw as u64).min(s.len() as u64) as usize;
        got += count;
    }
    Ok(values)
}

fn value(s: &[u8], width: u64) -> u64 {
    if width == 4 {
        i32::from_le_bytes([s[0], s[1], s[2], s[3]]) as i64 as u64
    } else {
        u64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]])
    }
}

/// One page's uncompressed body (levels and values) into `out` (its
/// `dst_len` bytes), as the first two kernels leave it (for SNAPPY and
/// UNCOMPRESSED pages) or the host decompression does (other codecs).
fn page_body_into(raw: &[u8], p: &PqPage, out: &mut [u8]) -> Result<()> {
    let src = &raw[p.src as usize..(p.src + p.src_len) as usize];
    if p.codec == CODEC_NONE {
        let n = p.src_len.min(p.dst_len) as usize;
        out[..n].copy_from_slice(&src[..n]);
        return Ok(());
    }
    let levels = p.levels_len as usize;
    let (corrupt, wrong_size) = if p.codec == CODEC_SNAPPY { (1, 2) } else { (8, 9) };
    if src.len() < levels || out.len() < levels {
        return Err(decode_error(corrupt));
    }
    out[..levels].copy_from_slice(&src[..levels]);
    let (stream, values) = (&src[levels..], &mut out[levels..]);
    let written = match p.codec {
        CODEC_SNAPPY => {
            match snap::raw::decompress_len(stream) {
                Ok(n) if n == values.len() => {}
                Ok(_) => return Err(decode_error(wrong_size)),
                Err(_) => return Err(decode_error(corrupt)),
            }
            snap::raw::Decoder::new().decompress(stream, values).map_err(|_| decode_error(corrupt))?
        }
        CODEC_ZSTD => {
            // One decompression context per host thread (making one per page cost more than small pages' data).
            thread_local! {
                static ZSTD: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { std::cell::RefCell::new(None) };
            }
            ZSTD.with(|cell| -> std::io::Result<usize> {
                let mut cell = cell.borrow_mut();
                if cell.is_none() {
                    *cell = Some(zstd::bulk::Decompressor::new()?);
                }
                cell.as_mut().expect("made above").decompress_to_buffer(stream, values)
            })
            .map_err(|_| decode_error(corrupt))?
        }
        CODEC_LZ4_RAW => lz4_flex::block::decompress_into(stream, values).map_err(|_| decode_error(corrupt))?,
        CODEC_GZIP => {
            use std::io::Read;
            let mut gz = flate2::read::MultiGzDecoder::new(stream);
            gz.read_exact(values).map_err(|_| decode_error(wrong_size))?;
            // Nothing may follow the page's values.
            let mut more = [0u8; 1];
            if gz.read(&mut more).map_err(|_| decode_error(corrupt))? != 0 {
                return Err(decode_error(wrong_size));
            }
            values.len()
        }
        _ => return Err(decode_error(corrupt)),
    };
    if written != values.len() {
        return Err(decode_error(wrong_size));
    }
    Ok(())
}

/// One page's uncompressed body (levels and values), as the first two kernels leave it.
fn page_body(raw: &[u8], p: &PqPage) -> Result<Vec<u8>> {
    let mut out = vec![0u8; if p.codec == CODEC_NONE { p.src_len.min(p.dst_len) } else { p.dst_len } as usize];
    page_body_into(raw, p, &mut out)?;
    Ok(out)
}

/// Snappy and zstd pages at least this large may be decompressed on the host ([`inflate_on_host`]).
pub const HOST_INFLATE_MIN: u64 = 256 << 10;

/// Snappy and zstd pages at least this large are decompressed on the host
/// whatever the other pages: one warp takes ~15 ms or more for one (~35
/// MB/s), a host core well under 1 ms. (TPC-H SF10's supplier, whose
/// `s_comment` pages are ~1 MB each, all alike: its device scan spent 25.8 ms
/// decompressing them after 1.2 ms of reads.)
pub const HOST_INFLATE_ALWAYS: u64 = 512 << 10;

/// Which pages are decompressed on host threads before the upload
/// ([`inflate_part_on_host`]): every page of a codec the device does not
/// decompress (LZ4_RAW, GZIP; ZSTD under `SETFUSION_DEVICE_ZSTD=0`), and the
/// large SNAPPY and ZSTD pages. A warp decompresses one snappy page at ~25-35
/// MB/s (a zstd page at ~20 MB/s) while the other pages keep the device busy,
/// so a launch lasts as long as its largest page, where a core does 1-2 GB/s.
/// (arrow-rs's defaults write a 1 MiB dictionary page before ~160 KB data
/// pages: those dictionary pages were most of the launch.) Large: at least
/// `floor` bytes, and over twice the median page the device decompresses
/// (so files whose pages are all alike stay on the device) or at least
/// [`HOST_INFLATE_ALWAYS`].
///
/// This one, for fixtures, tests and the self-check, returns the pages'
/// bodies (levels and values) back to back in bytes of their own; each such
/// page then reads as UNCOMPRESSED from `at` + its offset there (the caller
/// uploads them right after `raw`). Corrupt pages fail as the device would.
pub fn inflate_on_host(t: &mut PageTable, raw: &[u8], at: u64, floor: u64) -> Result<Vec<u8>> {
    let (chosen, total) = pages_to_inflate(t, floor);
    let mut out = vec![0u8; total as usize];
    inflate_into(t, raw, &chosen, &mut out)?;
    move_inflated(t, &chosen, at);
    Ok(out)
}

/// A part's pages decompressed on the host ([`inflate_part_on_host`]): in
/// the room its caller lent, or in bytes of their own.
pub enum Inflated<'a> {
    Lent(&'a [u8]),
    Owned(Vec<u8>),
}

/// The pages [`inflate_on_host`] chooses, decompressed for a part of the streamed scan, its pages reading
/// from offset 0 of the bytes returned: those `room(bytes)` lends (a share of
/// a kept buffer, so that no fresh memory is faulted in and the upload can
/// read it in place), else bytes of its own. Returns the bytes and the
/// indices of the pages that now read from them.
pub fn inflate_part_on_host<'a>(
    t: &mut PageTable,
    raw: &[u8],
    floor: u64,
    room: impl FnOnce(usize) -> Option<&'a mut [u8]>,
) -> Result<(Inflated<'a>, Vec<usize>)> {
    let (chosen, total) = pages_to_inflate(t, floor);
    let out = match (total > 0).then(|| room(total as usize)).flatten() {
        Some(lent) => {
            inflate_into(t, raw, &chosen, lent)?;
            Inflated::Lent(lent)
        }
        None => {
            let mut own = vec![0u8; total as usize];
            inflate_into(t, raw, &chosen, &mut own)?;
            Inflated::Owned(own)
        }
    };
    move_inflated(t, &chosen, 0);
    Ok((out, chosen))
}

/// The pages [`inflate_on_host`] takes, and their bodies' bytes.
fn pages_to_inflate(t: &PageTable, floor: u64) -> (Vec<usize>, u64) {
    // Pages the device decompresses, one warp a page: SNAPPY, and ZSTD unless the host inflates it.
    let on_device =
        |p: &PqPage| (p.codec == CODEC_SNAPPY || p.codec == CODEC_ZSTD) && !super::pages::inflated_on_host(p.codec);
    let mut sizes: Vec<u64> = t.pages.iter().filter(|p| on_device(p)).map(|p| p.dst_len).collect();
    let median = if sizes.is_empty() {
        0
    } else {
        let mid = sizes.len() / 2;
        *sizes.select_nth_unstable(mid).1
    };
    let on_host = |p: &PqPage| {
        super::pages::inflated_on_host(p.codec)
            || (on_device(p) && p.dst_len >= floor && (p.dst_len > 2 * median || p.dst_len >= HOST_INFLATE_ALWAYS))
    };
    let chosen: Vec<usize> = (0..t.pages.len()).filter(|&i| on_host(&t.pages[i])).collect();
    let total: u64 = chosen.iter().map(|&i| t.pages[i].dst_len).sum();
    (chosen, total)
}

/// The `chosen` pages' bodies, decompressed back to back into `out` on the host threads.
fn inflate_into(t: &PageTable, raw: &[u8], chosen: &[usize], out: &mut [u8]) -> Result<()> {
    // Each page's slice of `out`, filled in parallel.
    let mut jobs: Vec<(usize, &mut [u8])> = Vec::with_capacity(chosen.len());
    let mut rest: &mut [u8] = out;
    for &i in chosen {
        let (mine, tail) = std::mem::take(&mut rest).split_at_mut(t.pages[i].dst_len as usize);
        jobs.push((i, mine));
        rest = tail;
    }
    let failed = std::sync::Mutex::new(None);
    let pages = &t.pages;
    crate::host::for_each_mut(&mut jobs, &|_, (i, body)| {
        if let Err(e) = page_body_into(raw, &pages[*i], body) {
            failed.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
        }
    });
    drop(jobs);
    match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The `chosen` pages read as UNCOMPRESSED from `at` on, back to back.
fn move_inflated(t: &mut PageTable, chosen: &[usize], at: u64) {
    let mut offset = at;
    for &i in chosen {
        let p = &mut t.pages[i];
        p.src = offset;
        p.src_len = p.dst_len;
        p.codec = CODEC_NONE;
        offset += p.dst_len;
    }
}

/// The first `n` BYTE_ARRAY values of `s` (each a 4-byte little-endian
/// length, then its bytes); None when one runs past the end.
fn byte_values(s: &[u8], n: usize) -> Option<Vec<&[u8]>> {
    let mut out = Vec::with_capacity(n);
    let mut pos = 0usize;
    for _ in 0..n {
        let l = s.get(pos..pos + 4)?;
        let l = u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize;
        out.push(s.get(pos + 4..(pos + 4).checked_add(l)?)?);
        pos += 4 + l;
    }
    Some(out)
}

/// A dictionary-encoded page's `nonnull` indices (its values from `vals`: a
/// bit width byte, then the RLE / bit-packed hybrid).
fn dictionary_indices(b: &[u8], vals: usize, nonnull: usize) -> Result<Vec<u32>> {
    let bw = *b.get(vals).ok_or_else(|| decode_error(6))? as u32;
    if bw > 32 {
        return Err(decode_error(6));
    }
    let mut idx = Vec::with_capacity(nonnull);
    Hybrid { s: &b[vals + 1..], pos: 0, bw }.read(nonnull, &mut idx).ok_or_else(|| decode_error(4))?;
    Ok(idx)
}

/// CPU twin of [`decode_gpu`]: the same keys and validity, the same errors.
pub fn decode_cpu(raw: &[u8], t: &PageTable) -> Result<Decoded> {
    let rows = t.rows as usize;
    let mut keys = vec![0u64; rows];
    let mut valid = (t.def_max > 0).then(|| vec![0u32; rows.div_ceil(32)]);
    let bodies: Vec<Vec<u8>> = t.pages.iter().map(|p| page_body(raw, p)).collect::<Result<_>>()?;
    for (pi, p) in t.pages.iter().enumerate() {
        if p.kind == KIND_DICT {
            continue;
        }
        let b = &bodies[pi];
        let n = p.num_values as usize;
        let (def, vals) = if p.kind == KIND_V2 {
            ((p.levels_len - p.def_len) as usize..p.levels_len as usize, p.levels_len as usize)
        } else if p.def_max > 0 {
            if b.len() < 4 {
                return Err(decode_error(3));
            }
            let l = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
            (4..4 + l, 4 + l)
        } else {
            (0..0, 0)
        };
        if def.end > b.len() {
            return Err(decode_error(3));
        }
        let present: Vec<bool> = if p.def_max > 0 {
            let mut levels = Vec::with_capacity(n);
            Hybrid { s: &b[def.clone()], pos: 0, bw: 1 }.read(n, &mut levels).ok_or_else(|| decode_error(3))?;
            if levels.iter().any(|&l| l > 1) {
                return Err(decode_error(3));
            }
            levels.iter().map(|&l| l == 1).collect()
        } else {
            vec![true; n]
        };
        let nonnull = present.iter().filter(|&&x| x).count();
        let mut values: Vec<u64> = Vec::with_capacity(nonnull);
        if p.width == WIDTH_BYTES && p.encoding == ENC_DICT {
            if p.dict == NO_DICT || p.dict as usize >= t.pages.len() {
                return Err(decode_error(7));
            }
            let d = &t.pages[p.dict as usize];
            let dict = byte_values(&bodies[p.dict as usize], d.num_values as usize).ok_or_else(|| decode_error(4))?;
            if nonnull > 0 {
                for i in dictionary_indices(b, vals, nonnull)? {
                    let v = dict.get(i as usize).ok_or_else(|| decode_error(5))?;
                    values.push(crate::keys::hash_bytes(v));
                }
            }
        } else if p.width == WIDTH_BYTES && p.encoding == super::pages::ENC_PLAIN {
            let plain = byte_values(&b[vals.min(b.len())..], nonnull).ok_or_else(|| decode_error(4))?;
            values.extend(plain.into_iter().map(crate::keys::hash_bytes));
        } else if p.encoding == ENC_DICT {
            if p.dict == NO_DICT || p.dict as usize >= t.pages.len() {
                return Err(decode_error(7));
            }
            let d = &t.pages[p.dict as usize];
            let dict = &bodies[p.dict as usize];
            if (d.dst_len as usize) < d.num_values as usize * p.width as usize
                || dict.len() < d.num_values as usize * p.width as usize
            {
                return Err(decode_error(4));
            }
            if nonnull > 0 {
                for i in dictionary_indices(b, vals, nonnull)? {
                    if i as u64 >= d.num_values {
                        return Err(decode_error(5));
                    }
                    let at = i as usize * p.width as usize;
                    values.push(value(&dict[at..], p.width));
                }
            }
        } else if p.encoding == ENC_DELTA {
            values = delta_values(&b[vals..], nonnull, p.width).map_err(decode_error)?;
        } else if p.encoding == ENC_RLE_BOOL {
            if nonnull > 0 {
                let l = b.get(vals..vals + 4).ok_or_else(|| decode_error(4))?;
                let l = u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize;
                let runs = b.get(vals + 4..vals + 4 + l).ok_or_else(|| decode_error(4))?;
                let mut bits = Vec::with_capacity(nonnull);
                Hybrid { s: runs, pos: 0, bw: 1 }.read(nonnull, &mut bits).ok_or_else(|| decode_error(4))?;
                values.extend(bits.into_iter().map(|v| (v & 1) as u64));
            }
        } else if p.width == 0 {
            // PLAIN booleans: one bit a value, LSB first.
            if b.len() < vals || (b.len() - vals) * 8 < nonnull {
                return Err(decode_error(4));
            }
            values.extend((0..nonnull).map(|i| ((b[vals + i / 8] >> (i % 8)) & 1) as u64));
        } else {
            if b.len() < vals || (b.len() - vals) / (p.width as usize) < nonnull {
                return Err(decode_error(4));
            }
            values.extend((0..nonnull).map(|i| value(&b[vals + i * p.width as usize..], p.width)));
        }
        let mut next = values.into_iter();
        for (i, &ok) in present.iter().enumerate() {
            let row = p.first_row as usize + i;
            if ok {
                keys[row] = next.next().unwrap_or(0);
                if let Some(v) = valid.as_mut() {
                    v[row >> 5] |= 1 << (row & 31);
                }
            } else {
                keys[row] = 0;
            }
        }
    }
    Ok(Decoded { keys, valid })
}

/// Decoded keys and validity copied back to the host.
pub fn download_decoded(gpu: &Gpu, d: &DeviceDecoded, stats: &mut TransferStats) -> Result<Decoded> {
    let keys = gpu.download(&d.keys, d.rows, stats)?;
    let valid = match &d.valid {
        Some(v) => Some(gpu.download(v, d.rows.div_ceil(32), stats)?),
        None => None,
    };
    Ok(Decoded { keys, valid })
}

/// `doctor`'s check: pages written by arrow-rs (dictionary, PLAIN and
/// DELTA_BINARY_PACKED, v1 and v2, snappy and uncompressed, with NULLs)
/// decoded on the device equal the CPU twin.
pub fn self_check(gpu: &Gpu) -> Result<String> {
    let mut pages = 0;
    let mut rows = 0;
    let mut zstd = 0;
    for case in super::fixtures::cases() {
        let (raw, table) = device_table_of(&case)?;
        zstd += table.pages.iter().filter(|p| p.codec == CODEC_ZSTD).count();
        let want = decode_cpu(&raw, &table)?;
        let mut stats = TransferStats::default();
        let d_raw = gpu.upload(&raw, &mut stats)?;
        let got = decode_gpu(gpu, &d_raw, &table, &mut stats)?;
        if download_decoded(gpu, &got, &mut stats)? != want {
            return Err(DataFusionError::Internal(format!(
                "parquet_decode: device and CPU twin differ on {}",
                case.name
            )));
        }
        pages += table.pages.len();
        rows += table.rows;
    }
    // Every case with its larger pages decompressed on the host first.
    let mut inflated = 0;
    for case in super::fixtures::cases() {
        let (raw, mut table) = super::fixtures::table_of(&case)?;
        let want = decode_cpu(&raw, &table)?;
        let extra = inflate_on_host(&mut table, &raw, raw.len() as u64, 0)?;
        inflated += table.pages.iter().filter(|p| p.src >= raw.len() as u64).count();
        let mut stats = TransferStats::default();
        let d_raw = gpu.upload_chunks(&[&raw[..], &extra[..]], &mut stats)?;
        let got = decode_gpu(gpu, &d_raw, &table, &mut stats)?;
        if download_decoded(gpu, &got, &mut stats)? != want {
            return Err(DataFusionError::Internal(format!(
                "parquet_decode: {} with its larger pages decompressed on the host differs from the CPU twin",
                case.name
            )));
        }
    }
    // kernels/zstd.cu (the scan's unless SETFUSION_DEVICE_ZSTD=0) on frames of the zstd crate.
    let keys: Vec<u8> =
        (0..50_000u64).flat_map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 400_000_000).to_le_bytes()).collect();
    let frames = [1, 19]
        .iter()
        .map(|&level| zstd::bulk::compress(&keys, level))
        .collect::<std::io::Result<Vec<Vec<u8>>>>()
        .map_err(|e| DataFusionError::External(e.into()))?;
    let runs: Vec<(&[u8], usize)> = frames.iter().map(|f| (f.as_slice(), keys.len())).collect();
    if zstd_on_device(gpu, &runs)?.iter().any(|got| *got != keys) {
        return Err(DataFusionError::Internal("zstd.cu: frames of the zstd crate decompress differently".into()));
    }
    Ok(format!("{pages} pages ({zstd} of them ZSTD, decompressed by zstd.cu), {rows} rows decoded, equal to the CPU twin; the cases with {inflated} larger pages decompressed on the host, equal too; zstd frames of levels 1 and 19 decompressed by zstd.cu equal the zstd crate's"))
}
