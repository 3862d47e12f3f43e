//! The device memory budget: every device allocation is charged against a
//! [`MemoryBudget`] first, so an operator learns "this does not fit" as an
//! ordinary error it can react to (partition or fall back) instead of a CUDA
//! out-of-memory deep in a kernel.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr, ValidAsZeroBits};
use datafusion::error::Result;

use super::{cuda_err, Gpu};

/// Frees up to the given number of bytes of memory held for later (a cache),
/// returning how many it freed; it must never block on a lock its caller
/// may hold.
pub type Evictor = Box<dyn Fn(usize) -> usize + Send + Sync>;

/// Budget for device memory, in bytes. The limit is set per operator run from
/// `setfusion.memory_limit` (0 = 90% of the device's memory).
pub struct MemoryBudget {
    pub(super) total: usize,
    pub(super) limit: AtomicUsize,
    pub(super) used: Arc<AtomicUsize>,
    /// Memory kept only for later (the device column cache), given back
    /// when a charge would not fit otherwise: the cache yields to operators.
    evictor: std::sync::OnceLock<Evictor>,
}

impl std::fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBudget")
            .field("total", &self.total)
            .field("limit", &self.limit)
            .field("used", &self.used)
            .finish()
    }
}

impl MemoryBudget {
    pub(super) fn new(total: usize) -> Self {
        Self {
            total,
            limit: AtomicUsize::new(total / 10 * 9),
            used: Arc::new(AtomicUsize::new(0)),
            evictor: std::sync::OnceLock::new(),
        }
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

    /// Install the one evictor of this budget (the device's column cache);
    /// false when one is installed already.
    pub fn set_evictor(&self, evictor: Evictor) -> bool {
        self.evictor.set(evictor).is_ok()
    }

    /// Charge `bytes`; the charge is returned when the [`Reservation`] drops.
    /// When it does not fit, memory kept for later (see [`Self::set_evictor`])
    /// is given back first, and the charge tried once more.
    pub fn reserve(&self, bytes: usize) -> Result<Reservation> {
        let mut tried = self.try_reserve(bytes);
        if let (Err(_), Some(evict)) = (&tried, self.evictor.get()) {
            // What the charge overshoots the limit by (the held memory may
            // already exceed a limit lowered since it was charged).
            let over = (self.used() + bytes).saturating_sub(self.limit());
            if evict(over) > 0 {
                tried = self.try_reserve(bytes);
            }
        }
        tried
    }

    fn try_reserve(&self, bytes: usize) -> Result<Reservation> {
        let limit = self.limit();
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            if cur + bytes > limit {
                return Err(super::GpuError::over_budget(
                    format!("an allocation ({cur} of {limit} bytes in use)"),
                    bytes,
                    limit.saturating_sub(cur),
                )
                .into());
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
    pub(super) bytes: usize,
    pub(super) used: Arc<AtomicUsize>,
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
    pub(super) _charge: Reservation,
}

impl<T> DeviceBuffer<T> {
    pub fn len(&self) -> usize {
        self.slice.len()
    }
    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
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
        self.alloc_zeros_on(&self.stream, len)
    }

    /// [`Gpu::alloc`] on `stream` (the main one, or one of [`Gpu::side_streams`]):
    /// freed in that stream's order, after the work queued there on it.
    pub fn alloc_on<T: Pod>(&self, stream: &Arc<CudaStream>, len: usize) -> Result<DeviceBuffer<T>> {
        let charge = self.budget.reserve(len.max(1) * std::mem::size_of::<T>())?;
        // SAFETY: the memory is uninitialised; every caller writes it (kernel or copy) before reading.
        let slice = unsafe { stream.alloc::<T>(len.max(1)) }.map_err(|e| cuda_err("cuMemAlloc", e))?;
        Ok(DeviceBuffer { slice, _charge: charge })
    }

    /// [`Gpu::alloc_zeros`] on `stream`, as [`Gpu::alloc_on`].
    pub fn alloc_zeros_on<T: Pod>(&self, stream: &Arc<CudaStream>, len: usize) -> Result<DeviceBuffer<T>> {
        let charge = self.budget.reserve(len.max(1) * std::mem::size_of::<T>())?;
        let slice = stream.alloc_zeros::<T>(len.max(1)).map_err(|e| cuda_err("cuMemAlloc", e))?;
        Ok(DeviceBuffer { slice, _charge: charge })
    }

    /// The device address of `buf` for kernels on streams other than the main
    /// one, without cudarc's per-buffer event tracking: the tracking would
    /// order every later copy into the buffer after those kernels (one event
    /// a buffer, not a byte range), which is the overlap the caller wants.
    /// The caller orders the work itself (events, then synchronising those
    /// streams before the buffer is freed or its bytes rewritten).
    pub fn untracked_address<T>(&self, buf: &DeviceBuffer<T>) -> u64 {
        let (ptr, record) = buf.slice.device_ptr(&self.stream);
        // Dropping the record would note a use on the main stream; the uses are elsewhere.
        std::mem::forget(record);
        ptr
    }

    /// Allocate `len` elements whose contents the caller will overwrite.
    pub fn alloc<T: Pod>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        self.alloc_on(&self.stream, len)
    }
}
