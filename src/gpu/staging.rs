//! Pinned host memory: the two staging buffers uploads alternate between (so
//! copying the next chunk out of pageable Arrow memory overlaps the DMA of the
//! last), and the pool of pinned buffers downloads land in and Arrow then owns.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::driver::{CudaEvent, PinnedHostSlice};
use datafusion::arrow::buffer::Buffer;
use datafusion::error::{DataFusionError, Result};

use super::packing::PACK_DESC;
use super::{cuda_err, Gpu, TransferStats};

/// Bytes of each pinned staging buffer: 64 MiB of data plus room for one
/// packed fill's segment descriptors (see [`Gpu::upload_keys`]).
pub(super) const STAGING_BYTES: usize = (64 << 20) + PACK_DESC;

/// The pinned host bytes an operator's uploads stage through while it holds
/// the device (both staging buffers): what the operators count against
/// DataFusion's memory pool for the time they hold it.
pub const STAGING_HOST_BYTES: usize = 2 * STAGING_BYTES;

/// Two pinned buffers, each with the event of the last copy out of it.
pub(super) struct Staging {
    pub(super) bufs: [PinnedHostSlice<u8>; 2],
    pub(super) pending: [Option<CudaEvent>; 2],
}

impl Staging {
    /// Wait until the DMA out of buffer `b` (if any is in flight) is done.
    pub(super) fn wait(&mut self, b: usize, stats: &mut TransferStats) -> Result<()> {
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

/// At most this many pinned buffers wait for reuse (freeing one costs no more than the pinning saved)...
pub(super) const PINNED_KEEP: usize = 32;
/// ... holding at most this many bytes together (the list functions lend one
/// buffer to each partition preparing a batch, so 16 partitions keep 16).
pub(super) const PINNED_KEEP_BYTES: usize = 4 << 30;

/// Put `buf` back into the pool unless the pool holds enough already (then
/// it is freed).
pub(super) fn give_back(free: &PinnedFree, buf: PinnedHostSlice<u8>) {
    let mut free = free.lock().unwrap_or_else(|e| e.into_inner());
    let held: usize = free.iter().map(|b| b.len()).sum();
    if free.len() < PINNED_KEEP && held + buf.len() <= PINNED_KEEP_BYTES {
        free.push(buf);
    }
}

/// The size of a new pinned buffer for `bytes`: 16 MiB multiples, so sizes recur.
fn pinned_size(bytes: usize) -> usize {
    bytes.max(1).next_multiple_of(16 << 20)
}

/// Owner of a pinned buffer inside an Arrow [`Buffer`]: gives it back to the
/// device's pool when the last array using it is dropped.
pub(super) struct PinnedOwner {
    pub(super) buf: Option<PinnedHostSlice<u8>>,
    pub(super) free: PinnedFree,
}

impl Drop for PinnedOwner {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            give_back(&self.free, buf);
        }
    }
}

/// A pinned buffer lent from the pool: filled on the host, outside the
/// device lock, then copied to the device in one DMA per piece
/// ([`Gpu::upload_loaned`]) with no staging copy. Dropped, it waits for the
/// copies out of it, then goes back to the pool.
pub struct PinnedLoan {
    buf: Option<PinnedHostSlice<u8>>,
    free: PinnedFree,
    /// The event after the last copy out of it.
    copied: Option<CudaEvent>,
}

impl PinnedLoan {
    /// The bytes to fill (at least the size asked for).
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8]> {
        self.wait()?;
        match self.buf.as_mut() {
            Some(b) => b.as_mut_slice().map_err(|e| cuda_err("pinned buffer", e)),
            None => Err(DataFusionError::Internal("pinned loan already returned".into())),
        }
    }

    /// Wait for the copies out of the buffer.
    fn wait(&mut self) -> Result<()> {
        if let Some(ev) = self.copied.take() {
            ev.synchronize().map_err(|e| cuda_err("pinned loan event", e))?;
        }
        Ok(())
    }
}

impl Drop for PinnedLoan {
    fn drop(&mut self) {
        // A copy still reading the buffer must finish before anyone else may write it;
        // if the wait fails the buffer is leaked rather than reused.
        if self.wait().is_err() {
            if let Some(buf) = self.buf.take() {
                std::mem::forget(buf);
            }
            return;
        }
        if let Some(buf) = self.buf.take() {
            give_back(&self.free, buf);
        }
    }
}

/// A pinned buffer being filled by the host, then owned by an Arrow [`Buffer`].
pub struct HostOut {
    pub(super) buf: PinnedHostSlice<u8>,
    pub(super) free: PinnedFree,
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
    pub(super) buffer: Buffer,
    /// The copy's event (None: the bytes are there already).
    pub(super) done: Option<CudaEvent>,
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

impl Gpu {
    /// A pinned buffer of at least `bytes` bytes: the smallest one in the pool
    /// that holds them, else a new one (16 MiB multiples, so sizes recur).
    pub(super) fn pinned_from_pool(&self, bytes: usize) -> Result<PinnedHostSlice<u8>> {
        match self.pinned_reused(bytes) {
            Some(b) => Ok(b),
            None => self.pinned_new(bytes),
        }
    }

    /// A new pinned buffer of at least `bytes` bytes (for the pool once its owner drops it).
    pub(super) fn pinned_new(&self, bytes: usize) -> Result<PinnedHostSlice<u8>> {
        let t = Instant::now();
        // SAFETY: the caller writes the bytes it hands out before anything reads them.
        let buf =
            unsafe { self.ctx.alloc_pinned::<u8>(pinned_size(bytes)) }.map_err(|e| cuda_err("cuMemHostAlloc", e))?;
        if crate::env::trace() {
            let mb = |b: usize| b as f64 / 1e6;
            crate::util::trace(&format!(
                "pinned {:.1} MB anew in {:.2} ms (the pool held {:.1} MB)",
                mb(buf.len()),
                t.elapsed().as_secs_f64() * 1e3,
                mb(self.pinned_free.lock().map_or(0, |f| f.iter().map(|b| b.len()).sum()))
            ));
        }
        Ok(buf)
    }

    /// The smallest pinned buffer in the pool that holds `bytes`, if any.
    pub(super) fn pinned_reused(&self, bytes: usize) -> Option<PinnedHostSlice<u8>> {
        let mut free = self.pinned_free.lock().unwrap_or_else(|e| e.into_inner());
        let best =
            free.iter().enumerate().filter(|(_, b)| b.len() >= bytes).min_by_key(|(_, b)| b.len()).map(|(i, _)| i);
        best.map(|i| free.swap_remove(i))
    }

    /// Pin a buffer of `bytes` for the pool on the background thread once
    /// the operator's lease ends, so that the next download of this size
    /// finds one. (Pinned beside the query, on the H200 host two 800 MB
    /// buffers held the query's own downloads up by ~600 ms: the driver
    /// serialises them.)
    pub(super) fn pin_for_later(&self, bytes: usize) {
        let (ctx, free) = (self.ctx.clone(), self.pinned_free.clone());
        self.after_lease(Box::new(move || {
            // SAFETY: the pool hands the buffer only to callers that write its bytes before anything reads them.
            if let Ok(buf) = unsafe { ctx.alloc_pinned::<u8>(pinned_size(bytes)) } {
                give_back(&free, buf);
            }
        }));
    }

    /// A pinned buffer of at least `bytes` bytes lent from the pool (see [`PinnedLoan`]).
    pub fn pinned_loan(&self, bytes: usize) -> Result<PinnedLoan> {
        Ok(PinnedLoan { buf: Some(self.pinned_from_pool(bytes)?), free: self.pinned_free.clone(), copied: None })
    }

    /// `len` elements of `T` at byte `at` of `loan` in a new device buffer:
    /// one DMA queued on the main stream, not waited for (work queued after
    /// it reads the copy; the loan waits for it before its bytes are reused).
    pub fn upload_loaned<T: super::Pod>(
        &self,
        loan: &mut PinnedLoan,
        at: usize,
        len: usize,
        stats: &mut TransferStats,
    ) -> Result<super::DeviceBuffer<T>> {
        self.upload_loaned_on(&self.stream, loan, at, len, stats)
    }

    /// [`Gpu::upload_loaned`] on `stream`, whose order the new buffer's
    /// allocation, copy and (later) free follow; work on other streams that
    /// reads the buffer waits for the copy (cudarc's events per buffer).
    pub fn upload_loaned_on<T: super::Pod>(
        &self,
        stream: &Arc<cudarc::driver::CudaStream>,
        loan: &mut PinnedLoan,
        at: usize,
        len: usize,
        stats: &mut TransferStats,
    ) -> Result<super::DeviceBuffer<T>> {
        use cudarc::driver::DevicePtrMut;
        let t = Instant::now();
        let mut dst = self.alloc_on::<T>(stream, len)?;
        let bytes = len * std::mem::size_of::<T>();
        if bytes == 0 {
            return Ok(dst);
        }
        let Some(buf) = loan.buf.as_ref() else {
            return Err(DataFusionError::Internal("pinned loan already returned".into()));
        };
        if at % std::mem::align_of::<T>() != 0 || at + bytes > buf.len() {
            return Err(DataFusionError::Internal(format!(
                "upload_loaned: bytes {at}..{} of a {}-byte loan",
                at + bytes,
                buf.len()
            )));
        }
        let host = buf.as_ptr().map_err(|e| cuda_err("pinned buffer", e))?;
        // SAFETY: `host` addresses the loan's pinned bytes, of which at..at + bytes are in bounds (checked above).
        let src: &[u8] = unsafe { std::slice::from_raw_parts(host.add(at), bytes) };
        {
            let (dptr, _record) = dst.slice.device_ptr_mut(stream);
            // SAFETY: `src` is pinned memory the loan keeps unwritten and allocated until the
            // event recorded below completes (its drop and as_mut_slice wait); `dptr` addresses `len` elements.
            unsafe { cudarc::driver::result::memcpy_htod_async(dptr, src, stream.cu_stream()) }
                .map_err(|e| cuda_err("cuMemcpyHtoDAsync", e))?;
        }
        // (Every part of a loan goes on one stream, so the last event covers them all.)
        loan.copied = Some(stream.record_event(None).map_err(|e| cuda_err("event record", e))?);
        stats.bytes_to_device += bytes;
        stats.to_device += t.elapsed();
        Ok(dst)
    }

    /// Host memory for query output that the host fills: pinned buffers from
    /// the same pool, so their pages are resident and reused. Fresh output
    /// allocations fault in every page (zeroed by the kernel): cutting 25M kept
    /// BIGINTs out of 100M measured 17.2 ms into fresh buffers, 11.6 ms into
    /// reused ones (`setfusion bench filter`).
    pub fn host_output(&self, bytes: usize) -> Result<HostOut> {
        Ok(HostOut { buf: self.pinned_from_pool(bytes)?, free: self.pinned_free.clone() })
    }
}

/// Host bytes that can be page-locked for the device in place
/// (`cuMemHostRegister`), so a device reads them by DMA with no copy through
/// the staging buffers and without stalling the host. The device scan reads
/// column chunks into such buffers and keeps them for the next scan: a
/// buffer is locked once, in the background after its second scan
/// ([`HostBytes::page_lock`]), and every later scan uploads from it directly
/// while it still reads ([`Gpu::streamed_upload`]).
pub struct HostBytes {
    buf: Vec<u8>,
    /// The context the pages are locked for (None: pageable memory).
    locked: Option<Arc<cudarc::driver::CudaContext>>,
}

impl HostBytes {
    /// `len` zero bytes, pageable. Large buffers ask for transparent huge
    /// pages (`MADV_HUGEPAGE`, before any page is touched): a fresh process's
    /// first scan faults its read buffers in 2 MiB pages instead of 4 KiB
    /// ones (1.2 GB: ~600 faults, not ~300,000), and later page-locking them
    /// pins 512 times fewer pages. (On hosts whose huge pages are off, the
    /// advice does nothing.)
    pub fn zeroed(len: usize) -> Self {
        let mut buf = vec![0u8; len];
        const HUGE: usize = 2 << 20;
        if len >= 2 * HUGE {
            let start = buf.as_mut_ptr() as usize;
            let (from, to) = (start.next_multiple_of(HUGE), (start + len) / HUGE * HUGE);
            if to > from {
                // SAFETY: [from, to) lies inside the Vec's allocation and is page-aligned;
                // MADV_HUGEPAGE only changes how the kernel backs the pages, not their contents.
                unsafe { libc::madvise(from as *mut libc::c_void, to - from, libc::MADV_HUGEPAGE) };
            }
        }
        HostBytes { buf, locked: None }
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Is the device's DMA reading these bytes in place?
    pub fn is_page_locked(&self) -> bool {
        self.locked.is_some()
    }

    /// Lock the pages for the DMA of `ctx`'s device (for every context: PORTABLE). Costs
    /// about what one copy through the staging buffers would; call it off the
    /// query's path. A no-op for empty or already locked bytes.
    pub fn page_lock(&mut self, ctx: &Arc<cudarc::driver::CudaContext>) -> Result<()> {
        if self.locked.is_some() || self.buf.is_empty() {
            return Ok(());
        }
        ctx.bind_to_thread().map_err(|e| cuda_err("bind context", e))?;
        // SAFETY: the pointer and length are the Vec's own; the Vec is never resized
        // while locked (HostBytes hands out slices only) and is unlocked in Drop
        // before it is freed.
        let r = unsafe {
            cudarc::driver::sys::cuMemHostRegister_v2(
                self.buf.as_mut_ptr() as *mut std::ffi::c_void,
                self.buf.len(),
                cudarc::driver::sys::CU_MEMHOSTREGISTER_PORTABLE,
            )
        };
        r.result().map_err(|e| cuda_err("cuMemHostRegister", e))?;
        self.locked = Some(ctx.clone());
        Ok(())
    }
}

impl std::ops::Deref for HostBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf
    }
}

impl std::ops::DerefMut for HostBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }
}

impl Drop for HostBytes {
    /// A locked buffer is unlocked and freed on the background thread
    /// (unlocking GBs is slow); if its context cannot be bound, it is leaked
    /// rather than freed while still registered.
    fn drop(&mut self) {
        if let Some(ctx) = self.locked.take() {
            let mut buf = std::mem::take(&mut self.buf);
            crate::host::later(move || {
                if ctx.bind_to_thread().is_err() {
                    std::mem::forget(buf);
                    return;
                }
                // SAFETY: the pointer is the one registered in page_lock; no DMA
                // reads it any more (every upload from it synchronised before its
                // borrow ended: Gpu::streamed_upload).
                let _ = unsafe { cudarc::driver::sys::cuMemHostUnregister(buf.as_mut_ptr() as *mut std::ffi::c_void) };
                drop(buf);
            });
        }
    }
}

/// Pinned host memory for small tables made on the host while the main
/// stream is busy copying (a scan part's page table): each is written here
/// and copied on a stream of the caller's choosing, and the call returns at
/// once. ([`Gpu::upload`] goes through the staging buffers on the main
/// stream, so it waits for every copy queued there before it: a whole part.)
/// Dropped, it waits for the streams it copied on, then gives its buffers
/// back to the pool.
pub struct PinnedArena {
    bufs: Vec<PinnedHostSlice<u8>>,
    /// Bytes used of the last buffer.
    used: usize,
    streams: Vec<Arc<cudarc::driver::CudaStream>>,
    free: PinnedFree,
}

impl Gpu {
    /// An empty [`PinnedArena`] (its buffers come from the pinned pool on first use).
    pub fn pinned_arena(&self) -> PinnedArena {
        PinnedArena { bufs: Vec::new(), used: 0, streams: Vec::new(), free: self.pinned_free.clone() }
    }

    /// `host` in a new device buffer, copied on `stream` from `arena` (queued,
    /// not waited for: work queued on `stream` after this reads the copy).
    /// Returns the buffer and its device address for kernels on `stream`
    /// (untracked, as [`Gpu::untracked_address`]).
    pub fn upload_on<T: super::Pod>(
        &self,
        arena: &mut PinnedArena,
        stream: &Arc<cudarc::driver::CudaStream>,
        host: &[T],
        stats: &mut TransferStats,
    ) -> Result<(super::DeviceBuffer<T>, u64)> {
        use cudarc::driver::DevicePtrMut;
        let t = Instant::now();
        let mut dst = self.alloc_on::<T>(stream, host.len())?;
        let bytes = std::mem::size_of_val(host);
        let addr = {
            let (ptr, record) = dst.slice.device_ptr_mut(stream);
            // Only `stream` uses the buffer, in order; no event needed.
            std::mem::forget(record);
            ptr
        };
        if bytes == 0 {
            return Ok((dst, addr));
        }
        // Room in the last buffer, else a new one (kept until the arena drops).
        let at = arena.used.next_multiple_of(16);
        if arena.bufs.last().is_none_or(|b| at + bytes > b.len()) {
            arena.bufs.push(self.pinned_from_pool(bytes)?);
            arena.used = 0;
        }
        let at = arena.used.next_multiple_of(16);
        let Some(buf) = arena.bufs.last_mut() else {
            return Err(DataFusionError::Internal("pinned arena without a buffer".into()));
        };
        let pinned = buf.as_mut_slice().map_err(|e| cuda_err("pinned buffer", e))?;
        // SAFETY: T is Pod, so its bytes may be read as u8.
        let src: &[u8] = unsafe { std::slice::from_raw_parts(host.as_ptr() as *const u8, bytes) };
        pinned[at..at + bytes].copy_from_slice(src);
        // SAFETY: the source is pinned memory the arena keeps, unwritten, until it has
        // synchronised `stream` (its drop); `addr` addresses `bytes` bytes of `dst`.
        unsafe { cudarc::driver::result::memcpy_htod_async(addr, &pinned[at..at + bytes], stream.cu_stream()) }
            .map_err(|e| cuda_err("cuMemcpyHtoDAsync", e))?;
        arena.used = at + bytes;
        if !arena.streams.iter().any(|s| Arc::ptr_eq(s, stream)) {
            arena.streams.push(stream.clone());
        }
        stats.bytes_to_device += bytes;
        stats.to_device += t.elapsed();
        Ok((dst, addr))
    }
}

impl Drop for PinnedArena {
    fn drop(&mut self) {
        // No copy may still read a buffer once it is back in the pool; if a
        // stream cannot be waited for, the buffers are leaked, not reused.
        if self.streams.iter().any(|s| s.synchronize().is_err()) {
            std::mem::forget(std::mem::take(&mut self.bufs));
            return;
        }
        for b in self.bufs.drain(..) {
            give_back(&self.free, b);
        }
    }
}
