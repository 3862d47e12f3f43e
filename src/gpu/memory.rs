//! Device memory budget, pinned staging and host<->device transfers.
//!
//! Every device allocation is charged against a [`MemoryBudget`] first, so an
//! operator learns "this does not fit" as an ordinary error it can react to
//! (partition or fall back) instead of a CUDA out-of-memory deep in a kernel.
//! Uploads go through two pinned staging buffers used alternately, so copying
//! the next chunk out of pageable Arrow memory overlaps the DMA of the last.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaEvent, CudaSlice, DevicePtrMut, DeviceRepr, PinnedHostSlice, ValidAsZeroBits};
use datafusion::error::{DataFusionError, Result};

use super::{cuda_err, Gpu};

/// Bytes of each pinned staging buffer.
const STAGING_BYTES: usize = 64 << 20;

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
        let mut guard = self.staging.lock().unwrap();
        if guard.is_none() {
            // SAFETY: the pinned memory is written (copy_from_slice) before any DMA reads it.
            let mk = || unsafe { self.ctx.alloc_pinned::<u8>(STAGING_BYTES) }.map_err(|e| cuda_err("cuMemHostAlloc", e));
            *guard = Some(Staging { bufs: [mk()?, mk()?], pending: [None, None] });
        }
        let staging = guard.as_mut().unwrap();
        let elem = std::mem::size_of::<T>();
        let per_fill = STAGING_BYTES / elem;
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get()).min(16);
        // Cursor over the source chunks: (chunk index, position inside it).
        let (mut ci, mut cpos) = (0usize, 0usize);
        let mut done = 0usize;
        let mut fill = 0usize;
        while done < total {
            let b = fill % 2;
            fill += 1;
            if let Some(ev) = staging.pending[b].take() {
                let w = Instant::now();
                ev.synchronize().map_err(|e| cuda_err("staging event", e))?;
                stats.dma_wait += w.elapsed();
            }
            let n = per_fill.min(total - done);
            // Pieces of source chunks that make up this fill.
            let mut pieces: Vec<&[T]> = Vec::new();
            let mut need = n;
            while need > 0 {
                let c = chunks[ci];
                let take = (c.len() - cpos).min(need);
                if take > 0 {
                    pieces.push(&c[cpos..cpos + take]);
                }
                cpos += take;
                need -= take;
                if cpos == c.len() {
                    ci += 1;
                    cpos = 0;
                }
            }
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
        let w = Instant::now();
        for p in staging.pending.iter_mut() {
            if let Some(ev) = p.take() {
                ev.synchronize().map_err(|e| cuda_err("staging event", e))?;
            }
        }
        stats.dma_wait += w.elapsed();
        stats.bytes_to_device += total * elem;
        stats.to_device += start.elapsed();
        Ok(())
    }

    /// Copy the first `len` elements of a device buffer back to the host.
    pub fn download<T: Pod>(&self, src: &DeviceBuffer<T>, len: usize, stats: &mut TransferStats) -> Result<Vec<T>> {
        let start = Instant::now();
        let mut out = vec![T::default(); len];
        if len > 0 {
            self.stream
                .memcpy_dtoh(&src.slice.slice(0..len), &mut out)
                .map_err(|e| cuda_err("cuMemcpyDtoH", e))?;
            self.synchronize()?;
        }
        stats.bytes_to_host += len * std::mem::size_of::<T>();
        stats.to_host += start.elapsed();
        Ok(out)
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

/// Copy `pieces` back to back into `dst`, splitting the work over `threads`.
fn parallel_gather<T: Copy + Send + Sync>(pieces: &[&[T]], dst: &mut [T], threads: usize, observe: &(dyn Fn(&[T]) + Sync)) {
    let total = dst.len();
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
    std::thread::scope(|s| {
        let mut rest = dst;
        let mut base = 0;
        while !rest.is_empty() {
            let n = per.min(rest.len());
            let (mine, tail) = rest.split_at_mut(n);
            rest = tail;
            let lo = base;
            base += n;
            s.spawn(move || {
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
