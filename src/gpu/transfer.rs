//! Host <-> device transfers, and the one Rust home of `kernels/transfer.cu`:
//! uploads through pinned staging (keys frame-of-reference packed, decoded on
//! the device), downloads into pinned memory Arrow owns, the keys' min / max,
//! and the compaction of kept keys.

use std::time::{Duration, Instant};

use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use datafusion::arrow::buffer::BooleanBuffer;
use datafusion::arrow::datatypes::ArrowNativeType;
use datafusion::error::{DataFusionError, Result};

#[cfg(test)]
use super::packing::{decode_fill_cpu, pack_low};
use super::packing::{pack_fill, Cursor, PACK_DESC, PACK_FILL, PACK_SEG, PACK_SEGS};
use super::staging::{Staging, STAGING_BYTES};
use super::{cuda_err, DeviceBuffer, Gpu, HostOut, PendingBuffer, Pod};
use crate::host::copy_threads;
use crate::host::parallel_gather;

/// kernels/transfer.cu, with its contract constants as `-D` options.
pub static KERNEL: super::KernelSource = super::KernelSource {
    family: "transfer",
    source: include_str!("../../kernels/transfer.cu"),
    defines: transfer_defines,
};

/// Selection words per block of `count_kept` / `compact_kept` (SF_KEPT_WORDS).
const KEPT_WORDS: usize = 256;

fn transfer_defines() -> Vec<(String, u64)> {
    super::prefixed(
        "SF_",
        &[
            ("SEG_LOG2", PACK_SEG.trailing_zeros() as u64),
            ("SEGS", PACK_SEGS as u64),
            ("DESC", PACK_DESC as u64),
            ("KEPT_WORDS", KEPT_WORDS as u64),
        ],
    )
}

/// Bytes moved and time spent, for EXPLAIN ANALYZE.
#[derive(Debug, Default, Clone)]
pub struct TransferStats {
    pub bytes_to_device: usize,
    pub bytes_to_host: usize,
    pub to_device: Duration,
    pub to_host: Duration,
    pub kernel: Duration,
    /// Of `to_device`: host copies into pinned staging, and waits for DMA.
    pub staging_copy: Duration,
    pub dma_wait: Duration,
}

impl TransferStats {
    pub fn add(&mut self, o: &TransferStats) {
        self.bytes_to_device += o.bytes_to_device;
        self.bytes_to_host += o.bytes_to_host;
        self.to_device += o.to_device;
        self.to_host += o.to_host;
        self.kernel += o.kernel;
        self.staging_copy += o.staging_copy;
        self.dma_wait += o.dma_wait;
    }
}

impl Gpu {
    /// Copy host data to a new device buffer through the pinned staging buffers.
    pub fn upload<T: Pod>(&self, host: &[T], stats: &mut TransferStats) -> Result<DeviceBuffer<T>> {
        let mut dst = self.alloc::<T>(host.len())?;
        self.upload_into(host, &mut dst, 0, stats)?;
        Ok(dst)
    }

    /// Copy `host` into `dst[offset..offset + host.len()]`.
    pub fn upload_into<T: Pod>(
        &self,
        host: &[T],
        dst: &mut DeviceBuffer<T>,
        offset: usize,
        stats: &mut TransferStats,
    ) -> Result<()> {
        self.upload_chunks_into(&[host], dst, offset, stats)
    }

    /// The first `len` elements of `src` in a new device buffer (a copy on
    /// the device, ordered on this device's stream like everything else).
    pub fn copy_on_device<T: Pod>(&self, src: &DeviceBuffer<T>, len: usize) -> Result<DeviceBuffer<T>> {
        self.copy_range_on_device(src, 0, len)
    }

    /// 64-bit words into `dst`'s bytes from `byte_offset` (a multiple of 8):
    /// frame-of-reference packed as keys are ([`Gpu::upload_keys`]: usually
    /// 4 bytes a word cross PCIe, packed on the copy threads, instead of a
    /// single copy of 8), decoded on the device and copied into place there.
    pub fn upload_words_into_bytes(
        &self,
        chunks: &[&[u64]],
        dst: &mut DeviceBuffer<u8>,
        byte_offset: usize,
        stats: &mut TransferStats,
    ) -> Result<()> {
        let n: usize = chunks.iter().map(|c| c.len()).sum();
        if n == 0 {
            return Ok(());
        }
        if byte_offset % 8 != 0 || byte_offset + n * 8 > dst.len() {
            return Err(DataFusionError::Internal(format!(
                "{n} words at byte {byte_offset} of a {}-byte buffer",
                dst.len()
            )));
        }
        let (words, _) = self.upload_keys_each(chunks, stats, false, &mut |_, _| Ok(()))?;
        // SAFETY: the words' device memory read as bytes (every bit pattern is a u8), n * 8 bytes of it.
        let bytes = unsafe { words.slice.transmute::<u8>(n * 8) }
            .ok_or_else(|| DataFusionError::Internal("a word buffer shorter than its words".into()))?;
        let mut to = dst.slice.slice_mut(byte_offset..byte_offset + n * 8);
        self.stream.memcpy_dtod(&bytes, &mut to).map_err(|e| super::cuda_err("cuMemcpyDtoD", e))?;
        Ok(())
    }

    /// Elements `from..from + len` of `src` in a new device buffer.
    pub fn copy_range_on_device<T: Pod>(
        &self,
        src: &DeviceBuffer<T>,
        from: usize,
        len: usize,
    ) -> Result<DeviceBuffer<T>> {
        let mut dst = self.alloc::<T>(len)?;
        if len > 0 {
            self.stream
                .memcpy_dtod(&src.slice.slice(from..from + len), &mut dst.slice)
                .map_err(|e| super::cuda_err("cuMemcpyDtoD", e))?;
        }
        Ok(dst)
    }

    /// Copy several host slices, back to back, to a new device buffer.
    pub fn upload_chunks<T: Pod>(&self, chunks: &[&[T]], stats: &mut TransferStats) -> Result<DeviceBuffer<T>> {
        self.upload_chunks_observed(chunks, stats, &|_| {})
    }

    /// [`Gpu::upload_chunks`], calling `observe` on every piece of the input
    /// from the copying threads while it is hot in cache (e.g. for min / max).
    pub fn upload_chunks_observed<T: Pod>(
        &self,
        chunks: &[&[T]],
        stats: &mut TransferStats,
        observe: &(dyn Fn(&[T]) + Sync),
    ) -> Result<DeviceBuffer<T>> {
        let total = chunks.iter().map(|c| c.len()).sum();
        let mut dst = self.alloc::<T>(total)?;
        self.upload_chunks_into_observed(chunks, &mut dst, 0, stats, observe)?;
        Ok(dst)
    }

    /// Copy several host slices, back to back, into `dst` from `offset`.
    ///
    /// Each 64 MiB of staging is filled by several threads at once (one core's
    /// memcpy is slower than PCIe) while the other staging buffer is in flight.
    pub fn upload_chunks_into<T: Pod>(
        &self,
        chunks: &[&[T]],
        dst: &mut DeviceBuffer<T>,
        offset: usize,
        stats: &mut TransferStats,
    ) -> Result<()> {
        self.upload_chunks_into_observed(chunks, dst, offset, stats, &|_| {})
    }

    pub(super) fn upload_chunks_into_observed<T: Pod>(
        &self,
        chunks: &[&[T]],
        dst: &mut DeviceBuffer<T>,
        offset: usize,
        stats: &mut TransferStats,
        observe: &(dyn Fn(&[T]) + Sync),
    ) -> Result<()> {
        let total: usize = chunks.iter().map(|c| c.len()).sum();
        if total == 0 {
            return Ok(());
        }
        let start = Instant::now();
        let mut guard = self.staging()?;
        let Some(staging) = guard.as_mut() else {
            return Err(DataFusionError::Internal("staging buffers missing".into()));
        };
        let elem = std::mem::size_of::<T>();
        let per_fill = STAGING_BYTES / elem;
        let threads = copy_threads();
        let mut cursor = Cursor::new(chunks);
        let mut done = 0usize;
        let mut fill = 0usize;
        while done < total {
            let b = fill % 2;
            fill += 1;
            staging.wait(b, stats)?;
            let n = per_fill.min(total - done);
            let pieces = cursor.take(n);
            let pinned = staging.bufs[b].as_mut_slice().map_err(|e| cuda_err("pinned buffer", e))?;
            // SAFETY: the pinned buffer is at least 8-aligned (cuMemHostAlloc) and large enough for n elements of T.
            let typed: &mut [T] = unsafe { std::slice::from_raw_parts_mut(pinned.as_mut_ptr() as *mut T, n) };
            let c = Instant::now();
            parallel_gather(&pieces, typed, threads, observe);
            stats.staging_copy += c.elapsed();
            let off = offset + done;
            let mut view = dst.slice.slice_mut(off..off + n);
            let (dptr, _record) = view.device_ptr_mut(&self.stream);
            // SAFETY: `typed` is pinned host memory that stays untouched until this
            // copy's event (recorded below) completes; `dptr` addresses n elements of
            // `dst`. (cudarc's safe memcpy_htod synchronises on plain slices, which
            // would serialise the copy with the next fill.)
            unsafe { cudarc::driver::result::memcpy_htod_async(dptr, &*typed, self.stream.cu_stream()) }
                .map_err(|e| cuda_err("cuMemcpyHtoDAsync", e))?;
            staging.pending[b] = Some(self.stream.record_event(None).map_err(|e| cuda_err("event record", e))?);
            done += n;
        }
        staging.wait(0, stats)?;
        staging.wait(1, stats)?;
        stats.bytes_to_device += total * elem;
        stats.to_device += start.elapsed();
        Ok(())
    }

    /// Uploads into `dst` of host pieces that become ready one after another
    /// (the device scan's chunk reads, uploaded while the next are read):
    /// `feed` hands them to the [`StreamedUpload`]; every copy is done when
    /// this returns (or unwinds), so no DMA outlives the bytes it reads.
    /// Returns `feed`'s result, the bytes uploaded and, of them, those copied
    /// straight from page-locked memory.
    pub fn streamed_upload<'a, R>(
        &'a self,
        dst: &'a mut DeviceBuffer<u8>,
        stats: &mut TransferStats,
        feed: impl FnOnce(&mut StreamedUpload<'a>, &mut TransferStats) -> R,
    ) -> Result<(R, usize, usize)> {
        let mut up = StreamedUpload { gpu: self, dst, bytes: 0, direct: 0, time: Duration::ZERO };
        let r = feed(&mut up, stats);
        let (bytes, direct) = up.finish(stats)?;
        Ok((r, bytes, direct))
    }

    /// The pinned staging buffers, allocated on first use (held while uploading).
    pub(super) fn staging(&self) -> Result<std::sync::MutexGuard<'_, Option<Staging>>> {
        let mut guard = self.staging.lock().map_err(|_| DataFusionError::Internal("staging lock poisoned".into()))?;
        if guard.is_none() {
            // SAFETY: the pinned memory is written by the host before any DMA reads it.
            let mk =
                || unsafe { self.ctx.alloc_pinned::<u8>(STAGING_BYTES) }.map_err(|e| cuda_err("cuMemHostAlloc", e));
            *guard = Some(Staging { bufs: [mk()?, mk()?], pending: [None, None] });
            crate::util::trace("device: staging buffers pinned");
        }
        Ok(guard)
    }

    /// Upload 64-bit keys frame-of-reference coded: every segment of 65,536 keys
    /// travels as 32-bit offsets when its keys lie within 2^31 of its first key
    /// (half the PCIe bytes and half the pinned-memory writes of the raw keys),
    /// else as low and high words. `kernels/transfer.cu` decodes each fill on
    /// the device right behind its DMA. Returns the decoded keys and their
    /// domain [min, max] (None when there are none; reduced on the device), which
    /// the strategies need to choose a table.
    pub fn upload_keys(
        &self,
        chunks: &[&[u64]],
        stats: &mut TransferStats,
    ) -> Result<(DeviceBuffer<u64>, Option<(u64, u64)>)> {
        self.upload_keys_each(chunks, stats, true, &mut |_, _| Ok(()))
    }

    /// [`Gpu::upload_keys`], calling `on_fill(keys, first)` as soon as each
    /// fill's decode is queued on the stream: `keys` are the fill's decoded
    /// keys, rows `first..first + keys.len()` (`first` a multiple of 65,536),
    /// and work `on_fill` queues on the stream runs on them while the host
    /// packs the next fill. Without `want_range` the domain is not reduced
    /// (None is returned).
    pub fn upload_keys_each(
        &self,
        chunks: &[&[u64]],
        stats: &mut TransferStats,
        want_range: bool,
        on_fill: &mut dyn FnMut(&cudarc::driver::CudaView<'_, u64>, usize) -> Result<()>,
    ) -> Result<(DeviceBuffer<u64>, Option<(u64, u64)>)> {
        let total: usize = chunks.iter().map(|c| c.len()).sum();
        let dst = self.alloc::<u64>(total)?;
        let dst = self
            .upload_keys_into(chunks, stats, Some(dst), false, on_fill)?
            .expect("a resident upload returns its keys");
        if !want_range || total == 0 {
            return Ok((dst, None));
        }
        // The domain, reduced on the device (3 TB/s) rather than on the host
        // threads, whose packing pass is kept to one compare-free sweep.
        let t = Instant::now();
        let range = gpu_min_max(self, &dst, total, stats)?;
        stats.kernel += t.elapsed();
        Ok((dst, Some(range)))
    }

    /// Stream keys through the device without keeping them: each fill is
    /// decoded into a fill-sized device buffer and handed to `on_fill(keys,
    /// first)` as in [`Gpu::upload_keys_each`]; work it queues on the stream
    /// finishes before that buffer is reused (one stream, in order). With
    /// `narrow`, the caller knows the keys' domain (max - min) is under 2^31,
    /// so no fill needs high words and the device holds 12 bytes a key in
    /// flight rather than 16: larger fills under a small budget. Device
    /// memory: one fill, whatever the number of keys.
    pub fn stream_keys(
        &self,
        chunks: &[&[u64]],
        narrow: bool,
        stats: &mut TransferStats,
        on_fill: &mut dyn FnMut(&cudarc::driver::CudaView<'_, u64>, usize) -> Result<()>,
    ) -> Result<()> {
        self.upload_keys_into(chunks, stats, None, narrow, on_fill).map(|_| ())
    }

    /// The upload behind [`Gpu::upload_keys_each`] (into `resident`, which holds
    /// every key) and [`Gpu::stream_keys`] (into one fill buffer, when None).
    fn upload_keys_into(
        &self,
        chunks: &[&[u64]],
        stats: &mut TransferStats,
        mut resident: Option<DeviceBuffer<u64>>,
        narrow: bool,
        on_fill: &mut dyn FnMut(&cudarc::driver::CudaView<'_, u64>, usize) -> Result<()>,
    ) -> Result<Option<DeviceBuffer<u64>>> {
        let total: usize = chunks.iter().map(|c| c.len()).sum();
        if total == 0 {
            return Ok(resident);
        }
        let decode = self.function(&KERNEL, "decode_for")?;
        // Keys per fill: a whole staging buffer, or less for small uploads and
        // small budgets. The device holds one packed fill (and, streaming, one
        // decoded fill): everything runs on one stream, so the next fill's copy
        // queues behind this fill's decode and the work `on_fill` queued, while
        // the host packs the next fill into the other pinned buffer.
        // Streaming takes 7/8 of what is left, so fills are as large as the
        // budget allows: each fill costs the host a fixed part (its events,
        // launches and the pool's wake-up). Fills of under 16 segments used to
        // be packed by one thread (~0.5 ms for 327K keys); [`pack_fill`] shares
        // them from four. A fill of at least one segment a copy thread holds a
        // whole number of segments a thread: the pool's threads each pack one
        // segment at a time, so 18 segments on 16 threads take as long as 32.
        let threads = copy_threads();
        let packed_per_key = if narrow { 4 } else { 8 };
        let affordable = match resident {
            Some(_) => (self.budget.available() / 8).saturating_sub(PACK_DESC) / packed_per_key,
            None => (self.budget.available() / 8 * 7).saturating_sub(PACK_DESC) / (packed_per_key + 8),
        };
        let round = if affordable >= threads * PACK_SEG { threads * PACK_SEG } else { PACK_SEG };
        let affordable = affordable / round * round;
        let cap = if total <= PACK_FILL.min(affordable.max(PACK_SEG)) {
            total
        } else {
            PACK_FILL.min(affordable).max(PACK_SEG)
        };
        let high_off = PACK_DESC + cap * 4;
        let mut scratch = self.alloc::<u8>(high_off + if narrow { 0 } else { cap * 4 })?;
        let mut decoded = match resident {
            Some(_) => None,
            None => Some(self.alloc::<u64>(cap)?),
        };
        let start = Instant::now();
        let mut guard = self.staging()?;
        let Some(staging) = guard.as_mut() else {
            return Err(DataFusionError::Internal("staging buffers missing".into()));
        };
        let mut cursor = Cursor::new(chunks);
        let (mut done, mut fill) = (0usize, 0usize);
        while done < total {
            let b = fill % 2;
            fill += 1;
            staging.wait(b, stats)?;
            let n = cap.min(total - done);
            let pieces = cursor.take(n);
            let pinned = staging.bufs[b].as_mut_slice().map_err(|e| cuda_err("pinned buffer", e))?;
            let c = Instant::now();
            let wide = pack_fill(&pieces, n, &mut pinned[..high_off + cap * 4], cap, threads);
            stats.staging_copy += c.elapsed();
            if wide && narrow {
                return Err(DataFusionError::Internal(
                    "setfusion: keys streamed as narrow need high words (their domain is 2^31 or wider)".into(),
                ));
            }
            let stream = self.stream.cu_stream();
            let mut copy = |from: usize, len: usize| -> Result<()> {
                let mut view = scratch.slice.slice_mut(from..from + len);
                let (dptr, _record) = view.device_ptr_mut(&self.stream);
                // SAFETY: pinned host bytes [from, from + len) stay untouched until this
                // fill's event (recorded below) completes; the device view has len bytes.
                unsafe { cudarc::driver::result::memcpy_htod_async(dptr, &pinned[from..from + len], stream) }
                    .map_err(|e| cuda_err("cuMemcpyHtoDAsync", e))
            };
            copy(0, PACK_DESC + n * 4)?;
            stats.bytes_to_device += PACK_DESC + n * 4;
            if wide {
                copy(high_off, n * 4)?;
                stats.bytes_to_device += n * 4;
            }
            let (n64, high64) = (n as u64, high_off as u64);
            let mut out = match (resident.as_mut(), decoded.as_mut()) {
                (Some(dst), _) => dst.slice.slice_mut(done..done + n),
                (None, Some(fill)) => fill.slice.slice_mut(0..n),
                (None, None) => return Err(DataFusionError::Internal("setfusion: no buffer for a fill".into())),
            };
            let cfg = self.grid_stride(n, 16);
            // SAFETY: signature matches kernels/transfer.cu; the scratch holds this fill's
            // descriptors, low and (if read) high words for n keys; `out` has n elements.
            unsafe {
                self.stream.launch_builder(&decode).arg(&scratch.slice).arg(&n64).arg(&high64).arg(&mut out).launch(cfg)
            }
            .map_err(|e| cuda_err("decode_for", e))?;
            staging.pending[b] = Some(self.stream.record_event(None).map_err(|e| cuda_err("event record", e))?);
            // After the staging event: the next fill's packing waits for this
            // fill's copy only, not for the work queued here.
            drop(out);
            match (resident.as_ref(), decoded.as_ref()) {
                (Some(dst), _) => on_fill(&dst.slice.slice(done..done + n), done)?,
                (_, Some(fill)) => on_fill(&fill.slice.slice(0..n), done)?,
                (None, None) => return Err(DataFusionError::Internal("setfusion: no buffer for a fill".into())),
            }
            done += n;
        }
        staging.wait(0, stats)?;
        staging.wait(1, stats)?;
        stats.to_device += start.elapsed();
        Ok(resident)
    }

    /// Copy the first `len` elements of a device buffer back to the host.
    /// From 1 MiB the copy lands in the pinned staging buffers and is copied
    /// out on the copy threads, in pieces of a staging buffer each, the DMA of
    /// the next piece running while the last one is copied out: a DMA into
    /// pageable memory goes through the driver's own bounce buffers, measured
    /// at 4.3 GB/s on the GPU machine (2.9 ms for a 100M-row selection bitmap,
    /// 0.5 ms this way), and ~1 GB/s for the 1 GB of a large families result.
    pub fn download<T: Pod>(&self, src: &DeviceBuffer<T>, len: usize, stats: &mut TransferStats) -> Result<Vec<T>> {
        let mut out = vec![T::default(); len];
        self.download_into(src, &mut out, stats)?;
        Ok(out)
    }

    /// [`Gpu::download`] of the first `out.len()` elements of `src` into `out`
    /// (e.g. one device's share of a selection several devices fill).
    pub fn download_into<T: Pod>(&self, src: &DeviceBuffer<T>, out: &mut [T], stats: &mut TransferStats) -> Result<()> {
        let start = Instant::now();
        let len = out.len();
        let size = std::mem::size_of::<T>();
        if len > src.len() {
            return Err(DataFusionError::Internal("setfusion: download larger than its source".into()));
        }
        if len * size >= (1 << 20) {
            let mut guard = self.staging()?;
            let Some(staging) = guard.as_mut() else {
                return Err(DataFusionError::Internal("staging buffers missing".into()));
            };
            staging.wait(0, stats)?;
            staging.wait(1, stats)?;
            // Elements of one piece: a staging buffer's worth.
            let piece = STAGING_BYTES / size;
            let pieces = len.div_ceil(piece);
            let span = |p: usize| (p * piece, ((p + 1) * piece).min(len));
            let mut done: [Option<cudarc::driver::CudaEvent>; 2] = [None, None];
            // Queue piece p's DMA into staging buffer p % 2 and record its event.
            let queue = |staging: &mut Staging, p: usize| -> Result<cudarc::driver::CudaEvent> {
                let (lo, hi) = span(p);
                let pinned = staging.bufs[p % 2].as_mut_slice().map_err(|e| cuda_err("pinned buffer", e))?;
                let view = src.slice.slice(lo..hi);
                let (sptr, _record) = view.device_ptr(&self.stream);
                // SAFETY: the pinned buffer holds STAGING_BYTES (at least hi - lo elements), and the
                // host reads it only after the event recorded below completes; `sptr` addresses
                // hi - lo elements of `src`.
                unsafe {
                    cudarc::driver::result::memcpy_dtoh_async(
                        &mut pinned[..(hi - lo) * size],
                        sptr,
                        self.stream.cu_stream(),
                    )
                }
                .map_err(|e| cuda_err("cuMemcpyDtoHAsync", e))?;
                self.stream.record_event(None).map_err(|e| cuda_err("event record", e))
            };
            done[0] = Some(queue(staging, 0)?);
            for p in 0..pieces {
                if p + 1 < pieces {
                    // Buffer (p + 1) % 2 was copied out in the last round.
                    done[(p + 1) % 2] = Some(queue(staging, p + 1)?);
                }
                if let Some(ev) = done[p % 2].take() {
                    let w = Instant::now();
                    ev.synchronize().map_err(|e| cuda_err("download event", e))?;
                    stats.dma_wait += w.elapsed();
                }
                let (lo, hi) = span(p);
                let pinned = staging.bufs[p % 2].as_mut_slice().map_err(|e| cuda_err("pinned buffer", e))?;
                // SAFETY: the buffer is page aligned and its first (hi - lo) * size bytes were just
                // written by the DMA waited for above.
                let typed: &[T] = unsafe { std::slice::from_raw_parts(pinned.as_ptr() as *const T, hi - lo) };
                parallel_gather(&[typed], &mut out[lo..hi], copy_threads(), &|_| {});
            }
        } else if len > 0 {
            self.stream.memcpy_dtoh(&src.slice.slice(0..len), out).map_err(|e| cuda_err("cuMemcpyDtoH", e))?;
            self.synchronize()?;
        }
        stats.bytes_to_host += len * size;
        stats.to_host += start.elapsed();
        Ok(())
    }

    /// Start copying the first `len` elements of a device buffer into pinned
    /// host memory that an Arrow [`Buffer`] owns: the DMA runs at full PCIe
    /// speed while the host goes on, and no host thread touches the data. The
    /// memory goes back to a small pool when the last array using it is
    /// dropped, so warm queries pin none. The device buffer may be dropped at
    /// once (frees are ordered on the stream after the copy).
    ///
    /// A large download that no pooled buffer holds (the first of its size in
    /// a process) comes through the staging buffers into ordinary memory
    /// instead, and a pinned buffer of its size is made for the next one once
    /// the operator's lease ends: pinning costs more than the copy (two
    /// downloads of 800 MB in a fresh process, a mark join's columns: ~930 ms
    /// for the query against 160 ms warm, on an H200 host).
    pub fn download_to_arrow<T: Pod + ArrowNativeType>(
        &self,
        src: &DeviceBuffer<T>,
        len: usize,
        stats: &mut TransferStats,
    ) -> Result<PendingBuffer> {
        let start = Instant::now();
        let bytes = len * std::mem::size_of::<T>();
        let mut buf = match self.pinned_reused(bytes) {
            Some(buf) => buf,
            None if bytes >= STAGING_BYTES => {
                let mut out = vec![T::default(); len];
                self.download_into(src, &mut out, stats)?;
                self.pin_for_later(bytes);
                return Ok(PendingBuffer::ready(datafusion::arrow::buffer::Buffer::from_vec(out)));
            }
            None => self.pinned_new(bytes)?,
        };
        let pinned = buf.as_mut_slice().map_err(|e| cuda_err("pinned buffer", e))?;
        if bytes > 0 {
            let view = src.slice.slice(0..len);
            let (sptr, _record) = view.device_ptr(&self.stream);
            // SAFETY: `pinned` holds at least `bytes` bytes and is not read before the event
            // recorded below completes (PendingBuffer::wait); `sptr` addresses `bytes` bytes of `src`.
            unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut pinned[..bytes], sptr, self.stream.cu_stream()) }
                .map_err(|e| cuda_err("cuMemcpyDtoHAsync", e))?;
        }
        let done = self.stream.record_event(None).map_err(|e| cuda_err("event record", e))?;
        let buffer = HostOut { buf, free: self.pinned_free.clone() }.into_buffer(bytes)?;
        stats.bytes_to_host += bytes;
        stats.to_host += start.elapsed();
        Ok(PendingBuffer { buffer, done: Some(done) })
    }

    /// Queue the copy of the first `len` elements of `src` into `dst` (their
    /// bytes) on the stream, and return at once.
    ///
    /// # Safety
    /// `dst` must be pinned host memory ([`Gpu::host_output`]) that nothing
    /// reads, writes or frees before the stream is synchronised.
    pub unsafe fn download_async_into<T: Pod>(&self, src: &DeviceBuffer<T>, len: usize, dst: &mut [u8]) -> Result<()> {
        let bytes = len * std::mem::size_of::<T>();
        if bytes > dst.len() || len > src.len() {
            return Err(DataFusionError::Internal("setfusion: download larger than its source or destination".into()));
        }
        if bytes == 0 {
            return Ok(());
        }
        let view = src.slice.slice(0..len);
        let (sptr, _record) = view.device_ptr(&self.stream);
        // SAFETY: `dst` holds `bytes` bytes of pinned memory the caller keeps untouched until the stream is synchronised.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut dst[..bytes], sptr, self.stream.cu_stream()) }
            .map_err(|e| cuda_err("cuMemcpyDtoHAsync", e))
    }

    /// Read one element (a count the host needs to size the next step).
    pub fn read_one<T: Pod>(&self, src: &DeviceBuffer<T>, index: usize, stats: &mut TransferStats) -> Result<T> {
        let start = Instant::now();
        let mut out = [T::default()];
        self.stream
            .memcpy_dtoh(&src.slice.slice(index..index + 1), &mut out)
            .map_err(|e| cuda_err("cuMemcpyDtoH", e))?;
        self.synchronize()?;
        stats.bytes_to_host += std::mem::size_of::<T>();
        stats.to_host += start.elapsed();
        Ok(out[0])
    }
}

/// [min, max] of `n` device keys (n > 0), by a reduction kernel.
pub fn gpu_min_max(gpu: &Gpu, keys: &DeviceBuffer<u64>, n: usize, stats: &mut TransferStats) -> Result<(u64, u64)> {
    let f = gpu.function(&KERNEL, "min_max")?;
    let mut out = gpu.alloc::<u64>(2)?;
    let init = [u64::MAX, 0u64];
    gpu.stream.memcpy_htod(&init, &mut out.slice).map_err(|e| cuda_err("cuMemcpyHtoD", e))?;
    let n64 = n as u64;
    let cfg = gpu.grid_stride(n, 8);
    // SAFETY: signature matches kernels/transfer.cu; `keys` has n elements, `out` two.
    unsafe { gpu.stream.launch_builder(&f).arg(&keys.slice).arg(&n64).arg(&mut out.slice).launch(cfg) }
        .map_err(|e| cuda_err("min_max", e))?;
    let v = gpu.download(&out, 2, stats)?;
    Ok((v[0], v[1]))
}

/// An Arrow array's buffers on the device: the values (or, for strings and
/// binary, the data bytes), the offsets for variable-width types, and the
/// validity bitmap when the array has NULLs. Offsets and validity keep Arrow's
/// layout (validity bit-packed LSB first), so kernels read them directly.
#[derive(Debug)]
pub struct DeviceArray {
    pub len: usize,
    /// Bit offset into `validity` and element offset into `values`/`offsets`.
    pub offset: usize,
    pub values: DeviceBuffer<u8>,
    pub offsets: Option<DeviceBuffer<u8>>,
    pub validity: Option<DeviceBuffer<u8>>,
}

impl Gpu {
    /// Upload a primitive, boolean, Utf8/LargeUtf8 or Binary/LargeBinary array's buffers.
    pub fn upload_array(
        &self,
        array: &datafusion::arrow::array::ArrayData,
        stats: &mut TransferStats,
    ) -> Result<DeviceArray> {
        use datafusion::arrow::datatypes::DataType::*;
        let bufs = array.buffers();
        let validity = match array.nulls() {
            Some(n) if n.null_count() > 0 => Some(self.upload(n.buffer().as_slice(), stats)?),
            _ => None,
        };
        let (values, offsets) = match array.data_type() {
            Utf8 | LargeUtf8 | Binary | LargeBinary => {
                (self.upload(bufs[1].as_slice(), stats)?, Some(self.upload(bufs[0].as_slice(), stats)?))
            }
            t if t.is_primitive() || *t == Boolean => (self.upload(bufs[0].as_slice(), stats)?, None),
            other => {
                return Err(DataFusionError::NotImplemented(format!("setfusion GPU: uploading {other} arrays")));
            }
        };
        Ok(DeviceArray { len: array.len(), offset: array.offset(), values, offsets, validity })
    }
}

/// The keys of the selected rows, in row order, compacted on the device
/// (`kernels/transfer.cu`: count_kept, compact_kept) and on their way into
/// pinned memory that an Arrow buffer owns, with their number. `sel` holds
/// one bit per key of `keys` (n keys). CPU twin: [`compact_kept_keys_cpu`].
pub fn compact_kept_keys(
    gpu: &Gpu,
    keys: &DeviceBuffer<u64>,
    sel: &DeviceBuffer<u32>,
    n: usize,
    stats: &mut TransferStats,
) -> Result<(PendingBuffer, usize)> {
    let (out, total) = compact_kept_keys_on_device(gpu, keys, sel, n, stats)?;
    Ok((gpu.download_to_arrow(&out, total, stats)?, total))
}

/// [`compact_kept_keys`], the kept keys left on the device (e.g. a column's
/// non-NULL keys, `sel` its validity words). CPU twin: [`compact_kept_keys_cpu`].
pub fn compact_kept_keys_on_device(
    gpu: &Gpu,
    keys: &DeviceBuffer<u64>,
    sel: &DeviceBuffer<u32>,
    n: usize,
    stats: &mut TransferStats,
) -> Result<(DeviceBuffer<u64>, usize)> {
    const WORDS_PER_BLOCK: usize = 256; // SF_KEPT_WORDS
    let blocks = n.div_ceil(32).div_ceil(WORDS_PER_BLOCK).max(1);
    let n64 = n as u64;
    let cfg = LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (WORDS_PER_BLOCK as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let t = Instant::now();
    let counts = kept_counts(gpu, sel, n, stats)?;
    let mut offsets = Vec::with_capacity(blocks);
    let mut total = 0u64;
    for c in counts {
        offsets.push(total);
        total += c as u64;
    }
    let offsets = gpu.upload(&offsets, stats)?;
    let mut out = gpu.alloc::<u64>((total as usize).max(1))?;
    let compact = gpu.function(&KERNEL, "compact_kept")?;
    // SAFETY: signature matches kernels/transfer.cu; `keys` holds n keys, `offsets` one per
    // block, and `out` the `total` kept keys the counts add up to.
    unsafe {
        gpu.stream()
            .launch_builder(&compact)
            .arg(&sel.slice)
            .arg(&n64)
            .arg(&keys.slice)
            .arg(&offsets.slice)
            .arg(&mut out.slice)
            .launch(cfg)
    }
    .map_err(|e| cuda_err("compact_kept", e))?;
    stats.kernel += t.elapsed();
    Ok((out, total as usize))
}

/// The set bits of a selection per block of `compact_kept`'s launch (`kernels/transfer.cu`: count_kept).
fn kept_counts(gpu: &Gpu, sel: &DeviceBuffer<u32>, n: usize, stats: &mut TransferStats) -> Result<Vec<u32>> {
    const WORDS_PER_BLOCK: usize = 256; // SF_KEPT_WORDS
    let blocks = n.div_ceil(32).div_ceil(WORDS_PER_BLOCK).max(1);
    let cfg = LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (WORDS_PER_BLOCK as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut counts = gpu.alloc::<u32>(blocks)?;
    let count = gpu.function(&KERNEL, "count_kept")?;
    let n64 = n as u64;
    // SAFETY: signature matches kernels/transfer.cu; `sel` holds ceil(n / 32) words, `counts` one per block.
    unsafe { gpu.stream().launch_builder(&count).arg(&sel.slice).arg(&n64).arg(&mut counts.slice).launch(cfg) }
        .map_err(|e| cuda_err("count_kept", e))?;
    gpu.download(&counts, blocks, stats)
}

/// How many of the `n` bits of the selection `sel` are set, counted on the device.
pub fn count_kept_on_device(gpu: &Gpu, sel: &DeviceBuffer<u32>, n: usize, stats: &mut TransferStats) -> Result<usize> {
    Ok(kept_counts(gpu, sel, n, stats)?.iter().map(|&c| c as usize).sum())
}

/// The aggregates of one column's kept rows ([`reduce_kept`]): how many of
/// them hold a value, and the wrapping sum, min and max of those values (as
/// DataFusion's `sum` of 64-bit integers wraps). `min` / `max` mean nothing
/// while `values` is 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeptAggregates {
    pub values: u64,
    pub sum: i64,
    pub min: i64,
    pub max: i64,
}

impl KeptAggregates {
    /// No row kept.
    pub const EMPTY: KeptAggregates = KeptAggregates { values: 0, sum: 0, min: i64::MAX, max: i64::MIN };

    /// The aggregates of two disjoint sets of rows together.
    pub fn merge(self, o: KeptAggregates) -> KeptAggregates {
        KeptAggregates {
            values: self.values + o.values,
            sum: self.sum.wrapping_add(o.sum),
            min: self.min.min(o.min),
            max: self.max.max(o.max),
        }
    }
}

/// The aggregates of the rows of `values` (n signed 64-bit lanes: decoded
/// keys or columns) whose bit is set in the selection `sel` and, where given,
/// in `valid` (ceil(n / 32) words each), reduced on the device
/// (`kernels/transfer.cu`: reduce_kept) so only four numbers come back. CPU
/// twin: [`reduce_kept_cpu`].
pub fn reduce_kept(
    gpu: &Gpu,
    values: &DeviceBuffer<u64>,
    valid: Option<&DeviceBuffer<u32>>,
    sel: &DeviceBuffer<u32>,
    n: usize,
    stats: &mut TransferStats,
) -> Result<KeptAggregates> {
    if n == 0 {
        return Ok(KeptAggregates::EMPTY);
    }
    let words = n.div_ceil(32);
    if values.len() < n || sel.len() < words || valid.is_some_and(|v| v.len() < words) {
        return Err(DataFusionError::Internal("reduce_kept: a column or selection shorter than its rows".into()));
    }
    let t = Instant::now();
    let f = gpu.function(&KERNEL, "reduce_kept")?;
    let e = KeptAggregates::EMPTY;
    let mut out = gpu.upload(&[0u64, 0, e.min as u64, e.max as u64], stats)?;
    let (n64, has_valid) = (n as u64, valid.is_some() as u64);
    // (Without validity the selection stands in for it: the kernel does not read it.)
    let valid = valid.unwrap_or(sel);
    // SAFETY: signature matches kernels/transfer.cu; `sel` and `valid` hold ceil(n / 32) words and `values` n lanes (checked), `out` four.
    unsafe {
        gpu.stream()
            .launch_builder(&f)
            .arg(&sel.slice)
            .arg(&valid.slice)
            .arg(&has_valid)
            .arg(&n64)
            .arg(&values.slice)
            .arg(&mut out.slice)
            .launch(gpu.grid_stride(n, 8))
    }
    .map_err(|e| cuda_err("reduce_kept", e))?;
    let v = gpu.download(&out, 4, stats)?;
    stats.kernel += t.elapsed();
    Ok(KeptAggregates { values: v[0], sum: v[1] as i64, min: v[2] as i64, max: v[3] as i64 })
}

/// CPU twin of [`reduce_kept`], over a host column: the rows set in `sel`
/// (and in `valid`, where given).
pub fn reduce_kept_cpu(values: &[i64], valid: Option<&BooleanBuffer>, sel: &BooleanBuffer) -> KeptAggregates {
    let one = |i: usize| {
        let v = values[i];
        KeptAggregates { values: 1, sum: v, min: v, max: v }
    };
    let kept = |i: &usize| valid.is_none_or(|v| v.value(*i));
    sel.set_indices().filter(kept).map(one).fold(KeptAggregates::EMPTY, KeptAggregates::merge)
}

/// One exact 64-bit key per row from a composite key's columns (n signed
/// 64-bit lanes each, as decoded), for the rows set in `sel`: column by
/// column, `key = key * range + (value - lo)` with each column's
/// `(lo, range)` from `bounds` (`kernels/transfer.cu`: pack_key_column, one
/// pass a column). Two kept rows get equal keys iff their columns are equal.
/// Rows not set in `sel` hold undefined keys. None: the ranges multiply past
/// 2^64, or a kept value lies outside its column's range. CPU twin:
/// [`pack_key_columns_cpu`].
pub fn pack_key_columns(
    gpu: &Gpu,
    columns: &[&DeviceBuffer<u64>],
    bounds: &[(i64, u64)],
    sel: &DeviceBuffer<u32>,
    n: usize,
    stats: &mut TransferStats,
) -> Result<Option<DeviceBuffer<u64>>> {
    if columns.len() != bounds.len() || columns.iter().any(|c| c.len() < n) || sel.len() < n.div_ceil(32) {
        return Err(DataFusionError::Internal(
            "pack_key_columns: columns, bounds or selection shorter than the rows".into(),
        ));
    }
    if !packs_in_64_bits(bounds) {
        return Ok(None);
    }
    let t = Instant::now();
    let mut keys = gpu.alloc::<u64>(n.max(1))?;
    let mut err = gpu.upload(&[0u32], stats)?;
    let f = gpu.function(&KERNEL, "pack_key_column")?;
    let n64 = n as u64;
    for (c, (values, &(lo, range))) in columns.iter().zip(bounds).enumerate() {
        let (lo, first) = (lo as u64, (c == 0) as u64);
        // SAFETY: signature matches kernels/transfer.cu; `sel` holds ceil(n / 32) words, `values` and `keys` n lanes (checked), `err` one word.
        unsafe {
            gpu.stream()
                .launch_builder(&f)
                .arg(&sel.slice)
                .arg(&n64)
                .arg(&values.slice)
                .arg(&lo)
                .arg(&range)
                .arg(&first)
                .arg(&mut keys.slice)
                .arg(&mut err.slice)
                .launch(gpu.grid_stride(n, 8))
        }
        .map_err(|e| cuda_err("pack_key_column", e))?;
    }
    let failed = gpu.download(&err, 1, stats)?[0] != 0;
    stats.kernel += t.elapsed();
    Ok((!failed).then_some(keys))
}

/// Do columns of these `(lo, range)` bounds pack into exact 64-bit keys? ([`crate::util::mixed_radix_fits`])
pub fn packs_in_64_bits(bounds: &[(i64, u64)]) -> bool {
    crate::util::mixed_radix_fits(bounds.iter().map(|&(_, r)| r as u128))
}

/// CPU twin of [`pack_key_columns`] (rows not set in `sel` get key 0).
pub fn pack_key_columns_cpu(columns: &[&[u64]], bounds: &[(i64, u64)], sel: &BooleanBuffer) -> Option<Vec<u64>> {
    if !packs_in_64_bits(bounds) {
        return None;
    }
    let mut keys = vec![0u64; sel.len()];
    for i in sel.set_indices() {
        let mut key = 0u64;
        for (values, &(lo, range)) in columns.iter().zip(bounds) {
            let slot = values[i].wrapping_sub(lo as u64);
            if slot >= range {
                return None;
            }
            key = key.wrapping_mul(range).wrapping_add(slot);
        }
        keys[i] = key;
    }
    Some(keys)
}

/// CPU twin of [`compact_kept_keys`]: the keys whose selection bit is set, in order.
pub fn compact_kept_keys_cpu(keys: &[u64], sel: &BooleanBuffer) -> Vec<u64> {
    sel.set_indices().map(|i| keys[i]).collect()
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Array, Int32Array, StringArray};

    use super::*;

    #[test]
    fn pack_low_matches_scalar() {
        // Every alignment of the destination and every tail length; wide offsets flagged.
        let src: Vec<u64> = (0..103u64).map(|i| 1_000_000 + i * 7919).collect();
        for off in 0..4 {
            for len in [0, 1, 3, 4, 5, 8, 50, 99] {
                let mut dst = vec![0u32; 110];
                let over = pack_low(&mut dst[off..off + len], &src[..len], 999_000);
                let want: Vec<u32> = src[..len].iter().map(|k| (k - 999_000) as u32).collect();
                assert_eq!(&dst[off..off + len], &want[..]);
                assert_eq!(over, 0);
            }
        }
        let mut dst = vec![0u32; 9];
        let mut wide = src[..9].to_vec();
        wide[6] = 1 << 40;
        assert_ne!(pack_low(&mut dst, &wide, 0), 0);
        assert_eq!(dst[6], 0);
        assert_eq!(dst[5], wide[5] as u32);
    }

    #[test]
    fn packed_fill_round_trips() {
        // Narrow segments, a wide one (hash-like keys), u64::MAX / 0 extremes, pieces
        // that straddle segment boundaries, and a partial last segment.
        let narrow: Vec<u64> = (0..150_000u64).map(|i| 5_000_000_000 + (i * 2654435761) % 400_000_000).collect();
        let wide: Vec<u64> = (0..70_000u64).map(|i| i.wrapping_mul(0x9E3779B97F4A7C15)).collect();
        let edge = vec![u64::MAX, 0, u64::MAX - 1, 1];
        let chunks: Vec<&[u64]> = vec![&narrow[..1000], &wide, &edge, &narrow[1000..]];
        let all: Vec<u64> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        for threads in [1, 3] {
            let mut store = vec![0u64; STAGING_BYTES / 8];
            // SAFETY: test-only view of an 8-aligned u64 vector as bytes.
            let buf = unsafe { std::slice::from_raw_parts_mut(store.as_mut_ptr() as *mut u8, STAGING_BYTES) };
            let n = all.len();
            assert!(pack_fill(&chunks, n, buf, PACK_FILL, threads));
            assert_eq!(decode_fill_cpu(buf, n, PACK_FILL), all);
            // A fill laid out for fewer keys (small uploads, small budgets).
            assert!(pack_fill(&chunks, n, buf, n, threads));
            assert_eq!(decode_fill_cpu(buf, n, n), all);
        }
        let mut store = vec![0u64; STAGING_BYTES / 8];
        // SAFETY: as above.
        let buf = unsafe { std::slice::from_raw_parts_mut(store.as_mut_ptr() as *mut u8, STAGING_BYTES) };
        // Domain 4e8 < 2^31: every segment is narrow around its first key.
        assert!(!pack_fill(&[&narrow[..]], narrow.len(), buf, PACK_FILL, 2));
        assert_eq!(decode_fill_cpu(buf, narrow.len(), PACK_FILL), narrow);
    }

    #[test]
    fn packed_upload_matches_host() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        let mut stats = TransferStats::default();
        // Several fills: narrow keys, then a wide stretch, in uneven chunks.
        let narrow: Vec<u64> = (0..20_000_000u64).map(|i| (i * 2654435761) % 400_000_000).collect();
        let wide: Vec<u64> = (0..3_000_000u64).map(|i| i.wrapping_mul(0x9E3779B97F4A7C15)).collect();
        let chunks: Vec<&[u64]> = vec![&narrow[..12_345_678], &wide, &narrow[12_345_678..]];
        let (d, range) = gpu.upload_keys(&chunks, &mut stats).unwrap();
        let back = gpu.download(&d, d.len(), &mut stats).unwrap();
        let all: Vec<u64> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        assert!(back == all, "packed upload differs from the host keys");
        let lo = *all.iter().min().unwrap();
        let hi = *all.iter().max().unwrap();
        assert_eq!(range, Some((lo, hi)));
        assert!(stats.bytes_to_device < all.len() * 8, "narrow segments travel as 32-bit offsets");
        let (_, none) = gpu.upload_keys(&[], &mut stats).unwrap();
        assert_eq!(none, None);
    }

    /// Keys streamed through one fill buffer under a small budget (many
    /// fills) arrive whole and in order, narrow (low words alone) or not; keys
    /// streamed as narrow whose domain is 2^31 or wider are refused, never
    /// decoded wrongly.
    #[test]
    fn streamed_fills_arrive_in_order() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let gpu = gpu.lease(8 << 20);
        let mut stats = TransferStats::default();
        let narrow: Vec<u64> = (0..3_000_000u64).map(|i| 77 + (i * 2654435761) % 2_000_000_000).collect();
        let wide: Vec<u64> = (0..700_000u64).map(|i| i.wrapping_mul(0x9E3779B97F4A7C15)).collect();
        let run = |chunks: &[&[u64]], narrow: bool, stats: &mut TransferStats| -> Result<(Vec<u64>, usize)> {
            let (mut back, mut fills) = (Vec::new(), 0usize);
            gpu.stream_keys(chunks, narrow, stats, &mut |keys, first| {
                assert_eq!(first, back.len(), "fills arrive in row order");
                let mut host = vec![0u64; keys.len()];
                gpu.stream().memcpy_dtoh(keys, &mut host).map_err(|e| cuda_err("memcpy_dtoh", e))?;
                back.extend(host);
                fills += 1;
                Ok(())
            })?;
            Ok((back, fills))
        };
        let (a, b) = narrow.split_at(1_234_567);
        let (back, fills) = run(&[a, b], true, &mut stats).unwrap();
        assert!(back == narrow, "narrow keys streamed");
        assert!(fills > 4, "an 8 MiB budget streams in several fills ({fills})");
        let (back, _) = run(&[&wide, a], false, &mut stats).unwrap();
        assert!(back[..wide.len()] == wide[..] && back[wide.len()..] == a[..], "wide keys streamed");
        let err = run(&[a, &wide], true, &mut stats).unwrap_err().to_string();
        assert!(err.contains("narrow"), "{err}");
    }

    /// Pieces uploaded as they come ([`Gpu::streamed_upload`]), from
    /// page-locked memory (DMA in place) and from pageable memory (through the
    /// staging buffers), out of order, land where they were sent.
    #[test]
    fn streamed_pieces_land_in_place() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        let mut stats = TransferStats::default();
        let n = (3 << 20) + 12_345;
        let mut locked = super::super::HostBytes::zeroed(n);
        locked.iter_mut().enumerate().for_each(|(i, b)| *b = (i * 31 % 251) as u8);
        locked.page_lock(gpu.context()).unwrap();
        assert!(locked.is_page_locked());
        let pageable: Vec<u8> = (0..n).map(|i| (i * 17 % 253) as u8).collect();
        let mut dst = gpu.alloc::<u8>(2 * n).unwrap();
        let (a, b) = locked.split_at(n / 3);
        let ((), bytes, direct) = gpu
            .streamed_upload(&mut dst, &mut stats, |up, stats| {
                up.piece(n / 3, b, true, stats).unwrap();
                up.piece(n, &pageable, false, stats).unwrap();
                up.piece(0, a, true, stats).unwrap();
                assert!(up.piece(2 * n - 1, &pageable[..2], false, stats).is_err());
            })
            .unwrap();
        assert_eq!((bytes, direct), (2 * n, n));
        let back = gpu.download(&dst, 2 * n, &mut stats).unwrap();
        assert!(back[..n] == locked[..], "page-locked pieces");
        assert!(back[n..] == pageable[..], "pageable piece");
    }

    /// Composite keys packed on the device equal their CPU twin's, and two
    /// kept rows share a key iff their columns are equal (negative values,
    /// duplicates, ranges whose product is near 2^64, no row kept); a value
    /// outside its range, or ranges past 2^64, pack nothing.
    #[test]
    fn packed_key_columns_match_cpu_twin() {
        let mut x = 0x2545F4914F6CDD1Du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let n = 100_003usize;
        let a: Vec<u64> = (0..n).map(|_| ((next() % 2000) as i64 - 1000) as u64).collect();
        let b: Vec<u64> = (0..n).map(|_| (next() % 7) as u64 + (1 << 40)).collect();
        let c: Vec<u64> = (0..n).map(|_| ((next() % 3) as i64 - 1) as u64).collect();
        let sel = BooleanBuffer::from_iter((0..n).map(|_| next() % 5 != 0));
        let bounds = [(-1000i64, 2000u64), (1 << 40, 7), (-1, 3)];
        let cols: [&[u64]; 3] = [&a, &b, &c];
        let keys = pack_key_columns_cpu(&cols, &bounds, &sel).unwrap();
        let mut seen = std::collections::HashMap::new();
        for i in sel.set_indices() {
            let tuple = (a[i], b[i], c[i]);
            assert_eq!(*seen.entry(keys[i]).or_insert(tuple), tuple, "row {i}: a key shared by two tuples");
        }
        assert_eq!(
            seen.len(),
            sel.set_indices().map(|i| (a[i], b[i], c[i])).collect::<std::collections::HashSet<_>>().len()
        );
        // Out of range, and past 2^64.
        assert!(pack_key_columns_cpu(&cols, &[(-999, 2000), (1 << 40, 7), (-1, 3)], &sel).is_none());
        assert!(!packs_in_64_bits(&[(0, 1 << 33), (0, 1 << 31), (0, 3)]));
        assert!(packs_in_64_bits(&[(0, 1 << 33), (0, 1 << 31)]));
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        let mut stats = TransferStats::default();
        let up = |v: &[u64], stats: &mut TransferStats| gpu.upload(v, stats).unwrap();
        let (da, db, dc) = (up(&a, &mut stats), up(&b, &mut stats), up(&c, &mut stats));
        let words: Vec<u32> = (0..n.div_ceil(32))
            .map(|w| (0..32).filter(|j| w * 32 + j < n && sel.value(w * 32 + j)).fold(0u32, |acc, j| acc | 1 << j))
            .collect();
        let dsel = gpu.upload(&words, &mut stats).unwrap();
        let got = pack_key_columns(&gpu, &[&da, &db, &dc], &bounds, &dsel, n, &mut stats).unwrap().unwrap();
        let got = gpu.download(&got, n, &mut stats).unwrap();
        assert!(sel.set_indices().all(|i| got[i] == keys[i]), "device keys differ from the CPU twin's");
        let out =
            pack_key_columns(&gpu, &[&da, &db, &dc], &[(-999, 2000), (1 << 40, 7), (-1, 3)], &dsel, n, &mut stats);
        assert!(out.unwrap().is_none(), "a kept value outside its range");
        let none = gpu.upload(&vec![0u32; n.div_ceil(32)], &mut stats).unwrap();
        assert!(pack_key_columns(&gpu, &[&da, &db, &dc], &[(0, 1), (0, 1), (0, 1)], &none, n, &mut stats)
            .unwrap()
            .is_some());
    }

    #[test]
    fn arrow_buffers_round_trip() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking(); // other tests change the memory budget under this lock
        let mut stats = TransferStats::default();
        let ints = Int32Array::from(vec![Some(1), None, Some(-3), Some(4)]);
        let d = gpu.upload_array(&ints.to_data(), &mut stats).unwrap();
        let bytes = gpu.download(&d.values, d.values.len(), &mut stats).unwrap();
        assert_eq!(&bytes[..16], ints.to_data().buffers()[0].as_slice());
        let validity = gpu.download(d.validity.as_ref().unwrap(), 1, &mut stats).unwrap();
        assert_eq!(validity[0] & 0xf, 0b1101);
        let strings = StringArray::from(vec![Some("setfusion"), None, Some(""), Some("gpu")]);
        let d = gpu.upload_array(&strings.to_data(), &mut stats).unwrap();
        let data = gpu.download(&d.values, d.values.len(), &mut stats).unwrap();
        assert_eq!(&data[..12], b"setfusiongpu");
        let offs = gpu.download(d.offsets.as_ref().unwrap(), 20, &mut stats).unwrap();
        assert_eq!(offs, strings.to_data().buffers()[0].as_slice());
        // A large upload goes through several staging fills, a large download through both staging
        // buffers in pieces of a buffer's size (160 MB: three, the last one short; 72 MB: two; 800 KB: none).
        let big: Vec<u64> = (0..20_000_000u64).map(|i| i * 7).collect();
        let d = gpu.upload(&big, &mut stats).unwrap();
        let back = gpu.download(&d, big.len(), &mut stats).unwrap();
        assert!(back == big);
        for len in [9_000_001, 100_000] {
            assert!(gpu.download(&d, len, &mut stats).unwrap() == big[..len], "the first {len} keys");
        }
        assert!(gpu.download(&d, big.len() + 1, &mut stats).is_err(), "longer than its source");
    }
}

/// See [`Gpu::streamed_upload`]. A piece of page-locked memory
/// ([`super::HostBytes`]) is copied by DMA straight from where it lies and
/// the call returns at once; any other piece goes through the staging
/// buffers. Every piece borrows its bytes for `'a`, and only
/// [`Gpu::streamed_upload`] makes one: it waits for the copies (its drop
/// does on an unwind) before the borrows can end.
pub struct StreamedUpload<'a> {
    gpu: &'a Gpu,
    dst: &'a mut DeviceBuffer<u8>,
    bytes: usize,
    /// Of `bytes`: copied straight from page-locked memory.
    direct: usize,
    time: Duration,
}

impl<'a> StreamedUpload<'a> {
    /// Copy `src` to `dst[at..at + src.len()]`; `page_locked`: `src` lies in
    /// page-locked memory (then the copy is queued, not waited for; memory
    /// that is not locked, claimed locked, is still copied right, by the
    /// driver's own staging).
    pub fn piece(&mut self, at: usize, src: &'a [u8], page_locked: bool, stats: &mut TransferStats) -> Result<()> {
        if !page_locked {
            return self.piece_copied(at, src, stats);
        }
        if src.is_empty() {
            return Ok(());
        }
        if at.checked_add(src.len()).is_none_or(|end| end > self.dst.len()) {
            return Err(DataFusionError::Internal("streamed upload past its buffer".into()));
        }
        let t = Instant::now();
        {
            let stream = &self.gpu.stream;
            let mut view = self.dst.slice.slice_mut(at..at + src.len());
            let (dptr, _record) = view.device_ptr_mut(stream);
            // SAFETY: `src` is borrowed for 'a, and Gpu::streamed_upload, the only
            // maker of a StreamedUpload, synchronises the stream before 'a can end
            // (the drop does on an unwind); `dptr` addresses src.len() bytes of `dst`.
            unsafe { cudarc::driver::result::memcpy_htod_async(dptr, src, stream.cu_stream()) }
                .map_err(|e| cuda_err("cuMemcpyHtoDAsync", e))?;
            self.direct += src.len();
        }
        self.bytes += src.len();
        self.time += t.elapsed();
        Ok(())
    }

    /// Copy `src` to `dst[at..at + src.len()]` through the pinned staging
    /// buffers: `src` is free again when this returns (bytes made while the
    /// upload goes on, such as pages decompressed on the host).
    pub fn piece_copied(&mut self, at: usize, src: &[u8], stats: &mut TransferStats) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        if at.checked_add(src.len()).is_none_or(|end| end > self.dst.len()) {
            return Err(DataFusionError::Internal("streamed upload past its buffer".into()));
        }
        let t = Instant::now();
        let mut inner = TransferStats::default();
        self.gpu.upload_chunks_into(&[src], self.dst, at, &mut inner)?;
        stats.staging_copy += inner.staging_copy;
        stats.dma_wait += inner.dma_wait;
        self.bytes += src.len();
        self.time += t.elapsed();
        Ok(())
    }

    /// Wait for every copy; the bytes uploaded and, of them, those copied
    /// straight from page-locked memory.
    fn finish(&mut self, stats: &mut TransferStats) -> Result<(usize, usize)> {
        let t = Instant::now();
        self.gpu.stream.synchronize().map_err(|e| cuda_err("stream synchronize", e))?;
        let waited = t.elapsed();
        stats.dma_wait += waited;
        stats.to_device += self.time + waited;
        stats.bytes_to_device += self.bytes;
        let done = (self.bytes, self.direct);
        self.bytes = 0;
        self.direct = 0;
        Ok(done)
    }
}

impl Drop for StreamedUpload<'_> {
    fn drop(&mut self) {
        if self.direct > 0 {
            // Only on an unwind: the bytes' borrow ends with this value, so no copy may still read them.
            let _ = self.gpu.stream.synchronize();
        }
    }
}
