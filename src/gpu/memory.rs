//! Device memory budget, pinned staging and host<->device transfers.
//!
//! Every device allocation is charged against a [`MemoryBudget`] first, so an
//! operator learns "this does not fit" as an ordinary error it can react to
//! (partition or fall back) instead of a CUDA out-of-memory deep in a kernel.
//! Uploads go through two pinned staging buffers used alternately, so copying
//! the next chunk out of pageable Arrow memory overlaps the DMA of the last.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaEvent, CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, PinnedHostSlice, PushKernelArg, ValidAsZeroBits};
use datafusion::arrow::buffer::Buffer;
use datafusion::error::{DataFusionError, Result};

use super::{cuda_err, Gpu};

/// Bytes of each pinned staging buffer: 64 MiB of data plus room for one
/// packed fill's segment descriptors (see [`Gpu::upload_keys`]).
const STAGING_BYTES: usize = (64 << 20) + PACK_DESC;

// Frame-of-reference packing of u64 keys in transit (kernels/transfer.cu has the
// same constants): a fill of PACK_FILL keys in PACK_SEGS segments of PACK_SEG.
const PACK_SEG: usize = 1 << 16;
const PACK_SEGS: usize = 128;
const PACK_FILL: usize = PACK_SEG * PACK_SEGS;
const PACK_DESC: usize = 4096;

/// Budget for device memory, in bytes. The limit is set per operator run from
/// `setfusion.memory_limit` (0 = 90% of the device's memory).
#[derive(Debug)]
pub struct MemoryBudget {
    total: usize,
    limit: AtomicUsize,
    used: Arc<AtomicUsize>,
}

impl MemoryBudget {
    pub(super) fn new(total: usize) -> Self {
        Self { total, limit: AtomicUsize::new(total / 10 * 9), used: Arc::new(AtomicUsize::new(0)) }
    }

    /// Set the limit; 0 means 90% of device memory.
    pub fn set_limit(&self, bytes: usize) {
        let l = if bytes == 0 { self.total / 10 * 9 } else { bytes.min(self.total) };
        self.limit.store(l, Ordering::Relaxed);
    }

    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Bytes still available under the limit.
    pub fn available(&self) -> usize {
        self.limit().saturating_sub(self.used())
    }

    /// Charge `bytes`; the charge is returned when the [`Reservation`] drops.
    pub fn reserve(&self, bytes: usize) -> Result<Reservation> {
        let limit = self.limit();
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            if cur + bytes > limit {
                return Err(DataFusionError::ResourcesExhausted(format!(
                    "setfusion GPU: device memory budget exceeded: need {bytes} bytes, {} of {limit} in use",
                    cur
                )));
            }
            match self.used.compare_exchange(cur, cur + bytes, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Ok(Reservation { bytes, used: self.used.clone() }),
                Err(actual) => cur = actual,
            }
        }
    }
}

/// A charge against the budget, released on drop.
#[derive(Debug)]
pub struct Reservation {
    bytes: usize,
    used: Arc<AtomicUsize>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A typed device allocation that holds its budget charge.
#[derive(Debug)]
pub struct DeviceBuffer<T> {
    pub slice: CudaSlice<T>,
    _charge: Reservation,
}

impl<T> DeviceBuffer<T> {
    pub fn len(&self) -> usize {
        self.slice.len()
    }
    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }
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

/// Two pinned buffers, each with the event of the last copy out of it.
pub(super) struct Staging {
    bufs: [PinnedHostSlice<u8>; 2],
    pending: [Option<CudaEvent>; 2],
}

impl Staging {
    /// Wait until the DMA out of buffer `b` (if any is in flight) is done.
    fn wait(&mut self, b: usize, stats: &mut TransferStats) -> Result<()> {
        if let Some(ev) = self.pending[b].take() {
            let w = Instant::now();
            ev.synchronize().map_err(|e| cuda_err("staging event", e))?;
            stats.dma_wait += w.elapsed();
        }
        Ok(())
    }
}

/// Pinned host buffers given back by the Arrow arrays that owned them.
pub(super) type PinnedFree = Arc<Mutex<Vec<PinnedHostSlice<u8>>>>;

/// At most this many pinned buffers wait for reuse (freeing one costs no more than the pinning saved).
const PINNED_KEEP: usize = 4;

/// Owner of a pinned buffer inside an Arrow [`Buffer`]: gives it back to the
/// device's pool when the last array using it is dropped.
struct PinnedOwner {
    buf: Option<PinnedHostSlice<u8>>,
    free: PinnedFree,
}

impl Drop for PinnedOwner {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            if free.len() < PINNED_KEEP {
                free.push(buf);
            }
        }
    }
}

/// A pinned buffer being filled by the host, then owned by an Arrow [`Buffer`].
pub struct HostOut {
    buf: PinnedHostSlice<u8>,
    free: PinnedFree,
}

impl HostOut {
    /// The bytes to fill.
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8]> {
        self.buf.as_mut_slice().map_err(|e| cuda_err("pinned buffer", e))
    }
    /// Its first `len` bytes (all written by now) as an Arrow buffer; the memory
    /// returns to the pool when the last array using it is dropped.
    pub fn into_buffer(self, len: usize) -> Result<Buffer> {
        let HostOut { mut buf, free } = self;
        if len > buf.len() {
            return Err(DataFusionError::Internal("pinned output overrun".into()));
        }
        let ptr = std::ptr::NonNull::new(buf.as_mut_ptr().map_err(|e| cuda_err("pinned buffer", e))?)
            .ok_or_else(|| DataFusionError::Internal("null pinned buffer".into()))?;
        let owner = Arc::new(PinnedOwner { buf: Some(buf), free });
        // SAFETY: `ptr` addresses at least `len` bytes of pinned memory that `owner` keeps
        // allocated (and out of the pool) for as long as the Buffer lives; the bytes are
        // written before they are read (by the host, or by a DMA PendingBuffer::wait waits for).
        Ok(unsafe { Buffer::from_custom_allocation(ptr, len, owner) })
    }
}

/// A host buffer that a device-to-host copy is still filling.
pub struct PendingBuffer {
    buffer: Buffer,
    /// The copy's event (None: the bytes are there already).
    done: Option<CudaEvent>,
}

impl PendingBuffer {
    /// A buffer whose bytes are already there (the CPU twins' results).
    pub fn ready(buffer: Buffer) -> Self {
        Self { buffer, done: None }
    }
    /// The number of bytes it will hold.
    pub fn len(&self) -> usize {
        self.buffer.len()
    }
    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }
    /// Wait for the copy; then the bytes are there.
    pub fn wait(self) -> Result<Buffer> {
        if let Some(done) = &self.done {
            done.synchronize().map_err(|e| cuda_err("download event", e))?;
        }
        Ok(self.buffer)
    }
}

/// Plain numeric element types that may be reinterpreted from bytes.
pub trait Pod: DeviceRepr + ValidAsZeroBits + Copy + Default + Send + Sync + 'static {}
impl Pod for u8 {}
impl Pod for u32 {}
impl Pod for i32 {}
impl Pod for u64 {}
impl Pod for i64 {}

impl Gpu {
    /// Allocate `len` zeroed elements, charged to the budget.
    pub fn alloc_zeros<T: Pod>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let charge = self.budget.reserve(len.max(1) * std::mem::size_of::<T>())?;
        let slice = self.stream.alloc_zeros::<T>(len.max(1)).map_err(|e| cuda_err("cuMemAlloc", e))?;
        Ok(DeviceBuffer { slice, _charge: charge })
    }

    /// Allocate `len` elements whose contents the caller will overwrite.
    pub fn alloc<T: Pod>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let charge = self.budget.reserve(len.max(1) * std::mem::size_of::<T>())?;
        // SAFETY: the memory is uninitialised; every caller writes it (kernel or copy) before reading.
        let slice = unsafe { self.stream.alloc::<T>(len.max(1)) }.map_err(|e| cuda_err("cuMemAlloc", e))?;
        Ok(DeviceBuffer { slice, _charge: charge })
    }

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

    fn upload_chunks_into_observed<T: Pod>(
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
        let Some(staging) = guard.as_mut() else { return Err(DataFusionError::Internal("staging buffers missing".into())) };
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

    /// The pinned staging buffers, allocated on first use (held while uploading).
    pub(super) fn staging(&self) -> Result<std::sync::MutexGuard<'_, Option<Staging>>> {
        let mut guard = self.staging.lock().map_err(|_| DataFusionError::Internal("staging lock poisoned".into()))?;
        if guard.is_none() {
            // SAFETY: the pinned memory is written by the host before any DMA reads it.
            let mk = || unsafe { self.ctx.alloc_pinned::<u8>(STAGING_BYTES) }.map_err(|e| cuda_err("cuMemHostAlloc", e));
            *guard = Some(Staging { bufs: [mk()?, mk()?], pending: [None, None] });
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
    pub fn upload_keys(&self, chunks: &[&[u64]], stats: &mut TransferStats) -> Result<(DeviceBuffer<u64>, Option<(u64, u64)>)> {
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
        let mut dst = self.alloc::<u64>(total)?;
        if total == 0 {
            return Ok((dst, None));
        }
        let decode = self.function("transfer", "decode_for")?;
        // Keys per fill: a whole staging buffer, or less for small uploads and
        // small budgets (two device scratch buffers hold the fills in flight).
        let affordable = (self.budget.available() / 8).saturating_sub(PACK_DESC) / 8 / PACK_SEG * PACK_SEG;
        let cap = if total <= PACK_FILL.min(affordable.max(PACK_SEG)) { total } else { PACK_FILL.min(affordable).max(PACK_SEG) };
        let high_off = PACK_DESC + cap * 4;
        let mut scratch = [self.alloc::<u8>(high_off + cap * 4)?, self.alloc::<u8>(high_off + cap * 4)?];
        let start = Instant::now();
        let mut guard = self.staging()?;
        let Some(staging) = guard.as_mut() else { return Err(DataFusionError::Internal("staging buffers missing".into())) };
        let threads = copy_threads();
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
            let stream = self.stream.cu_stream();
            let mut copy = |from: usize, len: usize| -> Result<()> {
                let mut view = scratch[b].slice.slice_mut(from..from + len);
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
            let mut out = dst.slice.slice_mut(done..done + n);
            let cfg = self.grid_stride(n, 16);
            // SAFETY: signature matches kernels/transfer.cu; the scratch holds this fill's
            // descriptors, low and (if read) high words for n keys; `out` has n elements.
            unsafe { self.stream.launch_builder(&decode).arg(&scratch[b].slice).arg(&n64).arg(&high64).arg(&mut out).launch(cfg) }
                .map_err(|e| cuda_err("decode_for", e))?;
            staging.pending[b] = Some(self.stream.record_event(None).map_err(|e| cuda_err("event record", e))?);
            // After the staging event: the next fill's packing waits for this
            // fill's copy only, not for the work queued here.
            on_fill(&dst.slice.slice(done..done + n), done)?;
            done += n;
        }
        staging.wait(0, stats)?;
        staging.wait(1, stats)?;
        stats.to_device += start.elapsed();
        if !want_range {
            return Ok((dst, None));
        }
        // The domain, reduced on the device (3 TB/s) rather than on the host
        // threads, whose packing pass is kept to one compare-free sweep.
        let t = Instant::now();
        let range = gpu_min_max(self, &dst, total, stats)?;
        stats.kernel += t.elapsed();
        Ok((dst, Some(range)))
    }

    /// Copy the first `len` elements of a device buffer back to the host.
    /// Up to a staging buffer's size the copy lands in pinned staging and is
    /// copied out on the copy threads: a DMA into pageable memory goes through
    /// the driver's own bounce buffers, measured at 4.3 GB/s on the GPU
    /// machine (2.9 ms for a 100M-row selection bitmap, 0.5 ms this way).
    pub fn download<T: Pod>(&self, src: &DeviceBuffer<T>, len: usize, stats: &mut TransferStats) -> Result<Vec<T>> {
        let start = Instant::now();
        let mut out = vec![T::default(); len];
        let bytes = len * std::mem::size_of::<T>();
        if bytes >= (1 << 20) && bytes <= STAGING_BYTES {
            let mut guard = self.staging()?;
            let Some(staging) = guard.as_mut() else { return Err(DataFusionError::Internal("staging buffers missing".into())) };
            staging.wait(0, stats)?;
            let pinned = staging.bufs[0].as_mut_slice().map_err(|e| cuda_err("pinned buffer", e))?;
            // SAFETY: the pinned buffer is page aligned and holds at least `bytes` bytes (checked above).
            let typed: &mut [T] = unsafe { std::slice::from_raw_parts_mut(pinned.as_mut_ptr() as *mut T, len) };
            let view = src.slice.slice(0..len);
            let (sptr, _record) = view.device_ptr(&self.stream);
            // SAFETY: `typed` is pinned host memory of len elements, not touched until the
            // synchronisation below; `sptr` addresses len elements of `src`.
            unsafe { cudarc::driver::result::memcpy_dtoh_async(typed, sptr, self.stream.cu_stream()) }
                .map_err(|e| cuda_err("cuMemcpyDtoHAsync", e))?;
            self.synchronize()?;
            parallel_gather(&[&*typed], &mut out, copy_threads(), &|_| {});
        } else if len > 0 {
            self.stream
                .memcpy_dtoh(&src.slice.slice(0..len), &mut out)
                .map_err(|e| cuda_err("cuMemcpyDtoH", e))?;
            self.synchronize()?;
        }
        stats.bytes_to_host += len * std::mem::size_of::<T>();
        stats.to_host += start.elapsed();
        Ok(out)
    }

    /// Start copying the first `len` elements of a device buffer into pinned
    /// host memory that an Arrow [`Buffer`] owns: the DMA runs at full PCIe
    /// speed while the host goes on, and no host thread touches the data. The
    /// memory goes back to a small pool when the last array using it is
    /// dropped, so warm queries pin none. The device buffer may be dropped at
    /// once (frees are ordered on the stream after the copy).
    pub fn download_to_arrow<T: Pod>(&self, src: &DeviceBuffer<T>, len: usize, stats: &mut TransferStats) -> Result<PendingBuffer> {
        let start = Instant::now();
        let bytes = len * std::mem::size_of::<T>();
        let mut buf = self.pinned_from_pool(bytes)?;
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

    /// A pinned buffer of at least `bytes` bytes: the smallest one in the pool
    /// that holds them, else a new one (16 MiB multiples, so sizes recur).
    fn pinned_from_pool(&self, bytes: usize) -> Result<PinnedHostSlice<u8>> {
        let reused = {
            let mut free = self.pinned_free.lock().unwrap_or_else(|e| e.into_inner());
            let best = free.iter().enumerate().filter(|(_, b)| b.len() >= bytes).min_by_key(|(_, b)| b.len()).map(|(i, _)| i);
            best.map(|i| free.swap_remove(i))
        };
        match reused {
            Some(b) => Ok(b),
            // SAFETY: the caller writes the bytes it hands out before anything reads them.
            None => unsafe { self.ctx.alloc_pinned::<u8>(bytes.max(1).next_multiple_of(16 << 20)) }.map_err(|e| cuda_err("cuMemHostAlloc", e)),
        }
    }

    /// Host memory for query output that the host fills: pinned buffers from
    /// the same pool, so their pages are resident and reused. Fresh output
    /// allocations fault in every page (zeroed by the kernel): cutting 25M kept
    /// BIGINTs out of 100M measured 17.2 ms into fresh buffers, 11.6 ms into
    /// reused ones (`setfusion bench filter`).
    pub fn host_output(&self, bytes: usize) -> Result<HostOut> {
        Ok(HostOut { buf: self.pinned_from_pool(bytes)?, free: self.pinned_free.clone() })
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

/// Host threads for copies, packing and scans over key columns: one per core,
/// at most 16 (beyond that the copies are bound by memory bandwidth).
pub(crate) fn copy_threads() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get()).min(16)
}

/// Reads several slices back to back, `n` elements at a time.
struct Cursor<'a, T> {
    chunks: &'a [&'a [T]],
    ci: usize,
    pos: usize,
}

impl<'a, T> Cursor<'a, T> {
    fn new(chunks: &'a [&'a [T]]) -> Self {
        Self { chunks, ci: 0, pos: 0 }
    }

    /// The next `n` elements as pieces of the source slices (fewer at the end).
    fn take(&mut self, n: usize) -> Vec<&'a [T]> {
        let mut pieces = Vec::new();
        let mut need = n;
        while need > 0 && self.ci < self.chunks.len() {
            let c = self.chunks[self.ci];
            let take = (c.len() - self.pos).min(need);
            if take > 0 {
                pieces.push(&c[self.pos..self.pos + take]);
            }
            self.pos += take;
            need -= take;
            if self.pos == c.len() {
                self.ci += 1;
                self.pos = 0;
            }
        }
        pieces
    }
}

/// Call `f` on the parts of the concatenation of `pieces` in [lo, hi).
fn for_range<T>(pieces: &[&[T]], lo: usize, hi: usize, mut f: impl FnMut(&[T])) {
    let mut pos = 0;
    for p in pieces {
        let (p_lo, p_hi) = (pos, pos + p.len());
        pos = p_hi;
        let (a, b) = (p_lo.max(lo), p_hi.min(hi));
        if a < b {
            f(&p[a - p_lo..b - p_lo]);
        }
        if pos >= hi {
            break;
        }
    }
}

/// Frame-of-reference code one fill of `n` keys (at most `cap`) into a staging
/// buffer laid out for `cap` keys (layout in kernels/transfer.cu). Threads
/// take whole segments. A segment's base is its first key minus 2^31, so one
/// sweep can write every offset's low word and OR together the high words:
/// the segment is narrow iff that OR is zero (no compares, so it vectorises);
/// only wide segments are swept again for their high words.
/// Returns whether any segment needed high words.
fn pack_fill(pieces: &[&[u64]], n: usize, buf: &mut [u8], cap: usize, threads: usize) -> bool {
    let segs = n.div_ceil(PACK_SEG);
    let (desc, rest) = buf.split_at_mut(PACK_DESC);
    let (low_bytes, high_bytes) = rest.split_at_mut(cap * 4);
    assert!(high_bytes.len() >= n * 4 && low_bytes.len() >= n * 4 && segs <= PACK_SEGS, "staging layout too small");
    // SAFETY: cuMemHostAlloc memory is page aligned and every region starts at a
    // multiple of 4 (desc at 0, low at 4096, high at 4096 + 4 cap) or 8 (bases);
    // u64/u32 have no invalid bit patterns; lengths were checked above.
    let (bases, flags, low, high) = unsafe {
        (
            std::slice::from_raw_parts_mut(desc.as_mut_ptr() as *mut u64, PACK_SEGS),
            std::slice::from_raw_parts_mut(desc.as_mut_ptr().add(PACK_SEGS * 8) as *mut u32, PACK_SEGS),
            std::slice::from_raw_parts_mut(low_bytes.as_mut_ptr() as *mut u32, n),
            std::slice::from_raw_parts_mut(high_bytes.as_mut_ptr() as *mut u32, n),
        )
    };
    struct Seg<'s> {
        at: usize,
        base: &'s mut u64,
        wide: &'s mut u32,
        low: &'s mut [u32],
        high: &'s mut [u32],
    }
    let mut work: Vec<Seg> = bases
        .iter_mut()
        .zip(flags.iter_mut())
        .zip(low.chunks_mut(PACK_SEG).zip(high.chunks_mut(PACK_SEG)))
        .take(segs)
        .enumerate()
        .map(|(i, ((base, wide), (low, high)))| Seg { at: i * PACK_SEG, base, wide, low, high })
        .collect();
    let pack = |segs: &mut [Seg]| -> bool {
        let mut any_wide = false;
        for s in segs {
            let len = s.low.len();
            let mut first = None;
            for_range(pieces, s.at, s.at + 1, |p| first = p.first().copied());
            let base = first.unwrap_or(0).wrapping_sub(1 << 31);
            let (mut at, mut over) = (0usize, 0u64);
            for_range(pieces, s.at, s.at + len, |p| {
                over |= pack_low(&mut s.low[at..at + p.len()], p, base);
                at += p.len();
            });
            let wide = over != 0;
            if wide {
                let mut at = 0;
                for_range(pieces, s.at, s.at + len, |p| {
                    s.high[at..at + p.len()].iter_mut().zip(p).for_each(|(o, &k)| *o = (k.wrapping_sub(base) >> 32) as u32);
                    at += p.len();
                });
            }
            *s.base = base;
            *s.wide = wide as u32;
            any_wide |= wide;
        }
        any_wide
    };
    if threads <= 1 || n < (1 << 20) {
        return pack(&mut work);
    }
    // The pool's persistent threads: a fresh thread scope per fill cost ~0.5 ms.
    // Four parts per thread, claimed as threads come free: with one part each,
    // a fill waits for its slowest thread, and on a busy host one thread that
    // loses its core for a while (the reaper freeing the last query's inputs,
    // another tenant) stretches every fill.
    let per = work.len().div_ceil(threads * 4).max(1);
    let mut parts: Vec<&mut [Seg]> = work.chunks_mut(per).collect();
    let any_wide = std::sync::atomic::AtomicBool::new(false);
    super::pool::for_each_mut(&mut parts, &|_, segs| {
        if pack(segs) {
            any_wide.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    any_wide.into_inner()
}

/// Write the low words of `k - base` for every key of `src` into `dst` (same
/// length) and return the OR of their high words (zero: all offsets fit 32 bits).
/// On x86_64 the bulk goes through SSE2 non-temporal stores: the pinned staging
/// memory is only read again by the DMA engine, so filling cache lines for it
/// (a read-for-ownership per line) would cost a third of the memory traffic.
fn pack_low(dst: &mut [u32], src: &[u64], base: u64) -> u64 {
    debug_assert_eq!(dst.len(), src.len());
    let n = dst.len().min(src.len());
    let mut over = 0u64;
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        // Scalar head up to a 16-byte aligned destination.
        while i < n && (dst.as_ptr() as usize + i * 4) % 16 != 0 {
            let v = src[i].wrapping_sub(base);
            dst[i] = v as u32;
            over |= v >> 32;
            i += 1;
        }
        if i + 4 <= n {
            // SAFETY: SSE2 is part of the x86_64 baseline; every access is within
            // i + 4 <= n elements of both slices, and dst + i is 16-byte aligned
            // (checked above) as the streaming store requires; the sfence orders
            // the non-temporal stores before this thread's later (joined) writes.
            unsafe {
                let vb = _mm_set1_epi64x(base as i64);
                let mut vo = _mm_setzero_si128();
                while i + 4 <= n {
                    let a = _mm_sub_epi64(_mm_loadu_si128(src.as_ptr().add(i) as *const __m128i), vb);
                    let b = _mm_sub_epi64(_mm_loadu_si128(src.as_ptr().add(i + 2) as *const __m128i), vb);
                    vo = _mm_or_si128(vo, _mm_or_si128(_mm_srli_epi64(a, 32), _mm_srli_epi64(b, 32)));
                    // dwords 0 and 2 of a, then of b: the four low words in key order
                    let lo = _mm_castps_si128(_mm_shuffle_ps(_mm_castsi128_ps(a), _mm_castsi128_ps(b), 0b10_00_10_00));
                    _mm_stream_si128(dst.as_mut_ptr().add(i) as *mut __m128i, lo);
                    i += 4;
                }
                _mm_sfence();
                let mut lanes = [0u64; 2];
                _mm_storeu_si128(lanes.as_mut_ptr() as *mut __m128i, vo);
                over |= lanes[0] | lanes[1];
            }
        }
    }
    while i < n {
        let v = src[i].wrapping_sub(base);
        dst[i] = v as u32;
        over |= v >> 32;
        i += 1;
    }
    over
}

/// [min, max] of `n` device keys (n > 0), by a reduction kernel.
fn gpu_min_max(gpu: &Gpu, keys: &DeviceBuffer<u64>, n: usize, stats: &mut TransferStats) -> Result<(u64, u64)> {
    let f = gpu.function("transfer", "min_max")?;
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

/// CPU twin of `decode_for` in kernels/transfer.cu: the keys of one packed fill.
#[cfg(test)]
fn decode_fill_cpu(buf: &[u8], n: usize, cap: usize) -> Vec<u64> {
    let word = |off: usize| u32::from_le_bytes(buf[off..off + 4].try_into().unwrap()) as u64;
    (0..n)
        .map(|i| {
            let s = i / PACK_SEG;
            let base = u64::from_le_bytes(buf[s * 8..s * 8 + 8].try_into().unwrap());
            let wide = word(PACK_SEGS * 8 + s * 4) != 0;
            let mut v = word(PACK_DESC + i * 4);
            if wide {
                v |= word(PACK_DESC + cap * 4 + i * 4) << 32;
            }
            base.wrapping_add(v)
        })
        .collect()
}

/// Copy `pieces` back to back into `dst`, splitting the work over `threads`.
fn parallel_gather<T: Copy + Send + Sync>(pieces: &[&[T]], dst: &mut [T], threads: usize, observe: &(dyn Fn(&[T]) + Sync)) {
    let total = dst.len();
    // At least 2 MiB per thread: small uploads (a similarity join's 11 MB
    // collection) pay more for spawning 16 threads than they save, and compete
    // with the host work they overlap.
    let threads = threads.min((total * std::mem::size_of::<T>()) >> 21);
    if threads <= 1 || total < (1 << 20) {
        let mut at = 0;
        for p in pieces {
            dst[at..at + p.len()].copy_from_slice(p);
            observe(p);
            at += p.len();
        }
        return;
    }
    let per = total.div_ceil(threads);
    let mut parts = Vec::with_capacity(threads);
    let (mut rest, mut base) = (dst, 0usize);
    while !rest.is_empty() {
        let n = per.min(rest.len());
        let (mine, tail) = rest.split_at_mut(n);
        rest = tail;
        parts.push((base, mine));
        base += n;
    }
    super::pool::for_each_mut(&mut parts, &|_, (lo, mine)| {
        let (lo, n) = (*lo, mine.len());
        // Copy the part of the concatenation [lo, lo + n) into `mine`.
        let (mut at, mut pos) = (0usize, 0usize);
        for p in pieces {
            let (p_lo, p_hi) = (pos, pos + p.len());
            pos = p_hi;
            let (a, b) = (p_lo.max(lo), p_hi.min(lo + n));
            if a < b {
                let src = &p[a - p_lo..b - p_lo];
                mine[at..at + (b - a)].copy_from_slice(src);
                observe(src);
                at += b - a;
            }
        }
    });
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
    pub fn upload_array(&self, array: &datafusion::arrow::array::ArrayData, stats: &mut TransferStats) -> Result<DeviceArray> {
        use datafusion::arrow::datatypes::DataType::*;
        let bufs = array.buffers();
        let validity = match array.nulls() {
            Some(n) if n.null_count() > 0 => Some(self.upload(n.buffer().as_slice(), stats)?),
            _ => None,
        };
        let (values, offsets) = match array.data_type() {
            Utf8 | LargeUtf8 | Binary | LargeBinary => (self.upload(bufs[1].as_slice(), stats)?, Some(self.upload(bufs[0].as_slice(), stats)?)),
            t if t.is_primitive() || *t == Boolean => (self.upload(bufs[0].as_slice(), stats)?, None),
            other => {
                return Err(DataFusionError::NotImplemented(format!("setfusion GPU: uploading {other} arrays")));
            }
        };
        Ok(DeviceArray { len: array.len(), offset: array.offset(), values, offsets, validity })
    }
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
        // A large upload goes through several staging fills.
        let big: Vec<u64> = (0..20_000_000u64).map(|i| i * 7).collect();
        let d = gpu.upload(&big, &mut stats).unwrap();
        let back = gpu.download(&d, big.len(), &mut stats).unwrap();
        assert!(back == big);
    }
}
