//! Device runtime: the only place that talks to CUDA.
//!
//! One lazily created, process-wide [`Gpu`] per device ordinal. Discovery never
//! panics: when no driver, no device or no NVRTC is present, [`gpu`] returns an
//! [`Unavailable`] reason that the planner shows in EXPLAIN and the CLI prints
//! as a one-line notice. Nothing here knows about SQL.

mod budget;
pub mod calibration;
mod compile;
mod error;
mod packing;
mod staging;
pub mod transfer;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DriverError};
use datafusion::error::DataFusionError;

pub use budget::{DeviceBuffer, MemoryBudget, Pod, Reservation};
pub use compile::{check_compiles, no_defines, prefixed, setfusion_cache_dir, KernelSource};
pub use error::{is_out_of_memory, GpuError};
pub use staging::{HostBytes, HostOut, PendingBuffer, PinnedArena, PinnedLoan, STAGING_HOST_BYTES};
pub use transfer::{
    compact_kept_keys, compact_kept_keys_cpu, compact_kept_keys_on_device, count_kept_on_device, gpu_min_max,
    pack_key_columns, pack_key_columns_cpu, packs_in_64_bits, reduce_kept, reduce_kept_cpu, DeviceArray,
    KeptAggregates, StreamedUpload, TransferStats,
};

/// Why the GPU backend cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unavailable {
    /// `libcuda.so` could not be loaded (no NVIDIA driver on this machine).
    NoDriver,
    /// The driver loaded but reports no device with the requested ordinal.
    NoDevice { ordinal: usize, count: i32 },
    /// The driver failed to initialise or create a context.
    DriverInit(String),
    /// `libnvrtc.so` could not be loaded, so kernels cannot be compiled.
    NoNvrtc,
    /// A kernel failed to compile or load.
    Kernel(String),
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unavailable::NoDriver => write!(f, "no NVIDIA driver (libcuda.so not found)"),
            Unavailable::NoDevice { ordinal, count } => {
                write!(f, "no CUDA device {ordinal} ({count} device(s) present)")
            }
            Unavailable::DriverInit(e) => write!(f, "CUDA driver failed to initialise: {e}"),
            Unavailable::NoNvrtc => {
                write!(f, "NVRTC not found (libnvrtc.so): kernels cannot be compiled")
            }
            Unavailable::Kernel(e) => write!(f, "kernel compilation failed: {e}"),
        }
    }
}

/// Static facts about the device, for `doctor` and EXPLAIN.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub total_memory: usize,
    pub driver_version: i32,
    pub multiprocessors: i32,
}

/// A usable device: context, one stream, compiled kernels and a memory budget.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    budget: MemoryBudget,
    /// Serialises whole operators on the device: one operator owns the stream
    /// (and the pinned staging buffers) at a time, which keeps memory
    /// accounting simple and transfers in large contiguous batches.
    exclusive: tokio::sync::Mutex<()>,
    staging: Mutex<Option<staging::Staging>>,
    /// Pinned buffers returned by the Arrow arrays that owned them, for reuse.
    pinned_free: staging::PinnedFree,
    /// Leases taken since the device started ([`Gpu::leases`]).
    leases: std::sync::atomic::AtomicU64,
    /// Work for the background thread once the current lease ends ([`Gpu::after_lease`]).
    after_lease: Mutex<Vec<Box<dyn FnOnce() + Send>>>,
    /// Streams beside `stream` for work that overlaps its copies ([`Gpu::side_streams`]).
    side: Mutex<Vec<Arc<CudaStream>>>,
    /// The stream of copies queued before their operator's lease ([`Gpu::ahead_stream`]).
    ahead: OnceLock<Arc<CudaStream>>,
}

impl fmt::Debug for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gpu").field("info", &self.info).finish()
    }
}

type Slot = OnceLock<Result<Arc<Gpu>, Unavailable>>;
static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<Slot>>>> = OnceLock::new();

/// The process-wide device `ordinal`, created on first use.
pub fn gpu(ordinal: usize) -> Result<Arc<Gpu>, Unavailable> {
    if disabled() {
        return Err(Unavailable::DriverInit("SETFUSION_DISABLE_GPU=1".into()));
    }
    let slot = {
        let mut map = DEVICES.get_or_init(Default::default).lock().unwrap();
        map.entry(ordinal).or_default().clone()
    };
    slot.get_or_init(|| Gpu::open(ordinal).map(Arc::new)).clone()
}

/// How many CUDA devices the driver sees (0 without a driver).
pub fn device_count() -> usize {
    if disabled() || !driver_present() {
        return 0;
    }
    CudaContext::device_count().map_or(0, |n| n.max(0) as usize)
}

/// Is the CUDA driver library installed? Probed once per process: each probe
/// loads and unloads libcuda (cudarc's `is_culib_present`: dlopen, then
/// dlclose), which maps and unmaps it and takes the loader's lock. Asked per
/// chunk of a similarity join's host work before any device was opened, the
/// probes slowed that join so much on the H100 that every 100k-set join
/// stopped to start a device it did not need (issue 31; BENCHMARKS section
/// 51; most likely also the 2-5x of section 49).
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only probes for the shared library with dlopen; no CUDA call is made.
    *PRESENT.get_or_init(|| unsafe { cudarc::driver::sys::is_culib_present() })
}

/// Is a CUDA driver library visible to the loader? Looked for by name, without
/// loading it: `libcuda.so[.1]` in `LD_LIBRARY_PATH`'s folders or the
/// usual library folders, or the name in the loader's cache. For the
/// questions planning asks of a device nobody opened ([`readiness_if_started`],
/// [`start_in_background`]): loading libcuda to answer took a one-query
/// process ~5-8 ms on the H100 host, 7% of a 70 ms similarity join kept on the
/// host (BENCHMARKS section 51). A library seen here that does not load is
/// found out where the device is opened ([`driver_present`]), which then
/// reports no driver.
fn driver_visible() -> bool {
    static VISIBLE: OnceLock<bool> = OnceLock::new();
    *VISIBLE.get_or_init(|| {
        if !cfg!(target_os = "linux") {
            return driver_present();
        }
        let mut dirs: Vec<std::path::PathBuf> =
            std::env::var_os("LD_LIBRARY_PATH").map(|v| std::env::split_paths(&v).collect()).unwrap_or_default();
        dirs.extend(
            [
                "/usr/lib/x86_64-linux-gnu",
                "/usr/lib/aarch64-linux-gnu",
                "/usr/lib64",
                "/usr/lib",
                "/lib64",
                "/usr/lib/wsl/lib",
            ]
            .map(std::path::PathBuf::from),
        );
        let in_dirs = dirs.iter().any(|d| ["libcuda.so.1", "libcuda.so"].iter().any(|n| d.join(n).exists()));
        in_dirs || std::fs::read("/etc/ld.so.cache").is_ok_and(|c| c.windows(10).any(|w| w == b"libcuda.so"))
    })
}

/// Is NVRTC installed? Probed once per process, as [`driver_present`].
pub fn nvrtc_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only probes for the shared library with dlopen.
    *PRESENT.get_or_init(|| unsafe { cudarc::nvrtc::sys::is_culib_present() })
}

/// Is a device usable? Cheap after the first call.
pub fn available(ordinal: usize) -> Result<(), Unavailable> {
    gpu(ordinal).map(|_| ())
}

fn disabled() -> bool {
    crate::env::disable_gpu()
}

/// How long each step of a device's background start took (for `doctor` and
/// the cost model). Pinned staging and copy threads come later, at the first
/// operator that uploads.
#[derive(Debug, Clone, Copy, Default)]
pub struct StartTimes {
    /// Driver initialisation and context creation.
    pub context: std::time::Duration,
    /// Loading the set-selection kernel families (native code from the disk cache).
    pub kernels: std::time::Duration,
}

struct Start {
    began: std::time::Instant,
    done: OnceLock<StartTimes>,
}

static STARTS: OnceLock<Mutex<HashMap<usize, Arc<Start>>>> = OnceLock::new();

/// The background start of `ordinal`, if one was requested.
fn start_of(ordinal: usize) -> Option<Arc<Start>> {
    STARTS.get().and_then(|m| m.lock().unwrap().get(&ordinal).cloned())
}

/// The kernel families the background start loads (the set selection's),
/// named by the caller of [`start_in_background`] (the layer that owns them).
static PRELOAD: OnceLock<&'static [&'static KernelSource]> = OnceLock::new();

/// Start device `ordinal` on a background thread (context and the `preload`
/// kernel families; see [`Gpu::warm_up`] for the rest) unless it is started already, and
/// return at once: planning and the scans overlap the start instead of the
/// first query waiting for it (issue 13). Without a driver nothing starts.
pub fn start_in_background(ordinal: usize, preload: &'static [&'static KernelSource]) {
    start(ordinal, preload, false)
}

/// [`start_in_background`] for a query that will use the device as soon as it
/// is there: the start runs at normal priority (at the background's, the host
/// threads reading the query's files held a one-query process's device start
/// back by 60-170 ms on the H200).
pub fn start_for_query(ordinal: usize, preload: &'static [&'static KernelSource]) {
    start(ordinal, preload, true)
}

fn start(ordinal: usize, preload: &'static [&'static KernelSource], urgent: bool) {
    let _ = PRELOAD.set(preload);
    if disabled() || !driver_visible() {
        return;
    }
    let start = {
        let mut map = STARTS.get_or_init(Default::default).lock().unwrap();
        if map.contains_key(&ordinal) {
            return;
        }
        let start = Arc::new(Start { began: std::time::Instant::now(), done: OnceLock::new() });
        map.insert(ordinal, start.clone());
        start
    };
    let spawned = crate::host::spawn("gpu-start", move || {
        // Yield the cores to the query running beside the start: a one-query
        // process whose plan keeps DataFusion's operators must not slow down for
        // a device it will not use (measured 5-7% on 250 ms TPC-H queries at
        // normal priority with the staging buffers pinned here too).
        if !urgent {
            // SAFETY: plain syscall on the calling thread (who = 0), no memory passed.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 15) };
        }
        let t = std::time::Instant::now();
        let mut times = StartTimes::default();
        if let Ok(g) = gpu(ordinal) {
            times.context = t.elapsed();
            crate::util::trace("device start: context made");
            if urgent {
                // The query's first upload needs them (pinning them costs the host
                // ~40 ms; here it overlaps the query's own device allocations).
                drop(g.staging());
            }
            times.kernels = g.load_set_selection_kernels();
            crate::util::trace("device start: kernels loaded");
        }
        let _ = start.done.set(times);
    });
    if spawned.is_err() {
        // No thread: the first query opens the device itself.
        STARTS.get_or_init(Default::default).lock().unwrap().remove(&ordinal);
    }
}

/// See [`Gpu::lease`]; dereferences to the [`Gpu`].
pub struct Lease<'a> {
    gpu: &'a Gpu,
    _lock: tokio::sync::MutexGuard<'a, ()>,
}

impl std::ops::Deref for Lease<'_> {
    type Target = Gpu;
    fn deref(&self) -> &Gpu {
        self.gpu
    }
}

impl Drop for Lease<'_> {
    /// The default limit comes back while the lock is still held (fields drop
    /// after this); the work kept for after the lease goes to the background thread.
    fn drop(&mut self) {
        self.gpu.budget.set_limit(0);
        let tasks = std::mem::take(&mut *self.gpu.after_lease.lock().unwrap_or_else(|e| e.into_inner()));
        tasks.into_iter().for_each(crate::host::later);
    }
}

/// End the process now, without libc's exit handlers. A one-query process
/// can finish while the background start is still inside the driver (its
/// planner kept DataFusion's operators); `exit` would then run libcuda's
/// teardown and the loader's finalisers beside that thread, which can wait
/// on each other forever (a fresh `bench tpch --one` process hung once in
/// this way on the H100). The kernel reclaims the context like any other
/// process resource. Flushes Rust's stdout and stderr first.
pub fn exit_process(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: plain syscall wrapper; every Rust-side buffer that holds output was flushed above.
    unsafe { libc::_exit(code) }
}

/// How far device `ordinal` is, asked without waiting (the planner's question).
#[derive(Debug, Clone)]
pub enum Readiness {
    /// Usable now, kernels loaded.
    Ready,
    /// Starting in the background for this long so far.
    Starting(std::time::Duration),
    Unavailable(Unavailable),
}

/// Has anyone opened device `ordinal` or started it in the background?
fn opened_or_started(ordinal: usize) -> bool {
    start_of(ordinal).is_some()
        || DEVICES.get().is_some_and(|m| m.lock().unwrap().get(&ordinal).is_some_and(|slot| slot.get().is_some()))
}

/// The planner's question, which never opens a device: [`Readiness`], or
/// None when nobody has opened or started device `ordinal` yet (a driver
/// library is present). The planner then weighs the whole start and starts
/// the device only for a plan that uses it ([`start_in_background`]): a
/// process whose plans keep DataFusion's operators never pays for a device
/// (on the H100, a started device cost one-query TPC-H SF10 processes
/// 110-160 ms while DataFusion's plans ran beside it).
pub fn readiness_if_started(ordinal: usize) -> Option<Readiness> {
    // Disabled or without a driver, `readiness` answers Unavailable without a CUDA call.
    let no_driver = disabled() || !driver_visible();
    (no_driver || opened_or_started(ordinal)).then(|| readiness(ordinal))
}

/// See [`Readiness`]. A device nobody started is opened here, synchronously.
pub fn readiness(ordinal: usize) -> Readiness {
    if disabled() {
        return Readiness::Unavailable(Unavailable::DriverInit("SETFUSION_DISABLE_GPU=1".into()));
    }
    if let Some(st) = start_of(ordinal) {
        if st.done.get().is_none() {
            return Readiness::Starting(st.began.elapsed());
        }
    }
    match gpu(ordinal) {
        Ok(_) => Readiness::Ready,
        Err(e) => Readiness::Unavailable(e),
    }
}

/// The times of device `ordinal`'s background start, once it has finished.
pub fn start_times(ordinal: usize) -> Option<StartTimes> {
    start_of(ordinal).and_then(|s| s.done.get().copied())
}

/// Wait until a background start of `ordinal` (if any) has finished.
pub fn wait_started(ordinal: usize) {
    if let Some(st) = start_of(ordinal) {
        while st.done.get().is_none() {
            std::thread::sleep(std::time::Duration::from_micros(500));
        }
    }
}

impl Gpu {
    fn open(ordinal: usize) -> Result<Self, Unavailable> {
        crate::util::trace("device start: opening");
        if !driver_present() {
            return Err(Unavailable::NoDriver);
        }
        if !nvrtc_present() {
            return Err(Unavailable::NoNvrtc);
        }
        crate::util::trace("device start: driver libraries found");
        let count = CudaContext::device_count().map_err(|e| Unavailable::DriverInit(e.to_string()))?;
        if ordinal as i32 >= count {
            return Err(Unavailable::NoDevice { ordinal, count });
        }
        crate::util::trace("device start: driver initialised");
        let ctx = CudaContext::new(ordinal).map_err(|e| Unavailable::DriverInit(e.to_string()))?;
        crate::util::trace("device start: context created");
        let err = |e: DriverError| Unavailable::DriverInit(e.to_string());
        let mut driver_version = 0i32;
        // SAFETY: plain out-parameter query on an initialised driver.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) };
        let info = DeviceInfo {
            ordinal,
            name: ctx.name().map_err(err)?,
            compute_capability: ctx.compute_capability().map_err(err)?,
            total_memory: ctx.total_mem().map_err(err)?,
            driver_version,
            multiprocessors: ctx
                .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .map_err(err)?,
        };
        let stream = ctx.new_stream().map_err(err)?;
        if ctx.has_async_alloc() {
            // Keep freed device memory in the stream-ordered pool (up to 90% of the
            // device, the default budget) instead of unmapping it at every
            // synchronisation: operators allocate and free GBs per query, and
            // remapping costs more than some of their kernels.
            let mut pool: cudarc::driver::sys::CUmemoryPool = std::ptr::null_mut();
            let mut keep: u64 = info.total_memory as u64 / 10 * 9;
            // SAFETY: out-parameter query and attribute set on the initialised device's default pool.
            unsafe {
                if cudarc::driver::sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device())
                    == cudarc::driver::sys::CUresult::CUDA_SUCCESS
                {
                    cudarc::driver::sys::cuMemPoolSetAttribute(
                        pool,
                        cudarc::driver::sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                        &mut keep as *mut u64 as *mut std::ffi::c_void,
                    );
                }
            }
        }
        let budget = MemoryBudget::new(info.total_memory);
        let gpu = Gpu {
            ctx,
            stream,
            info,
            modules: Mutex::new(HashMap::new()),
            budget,
            exclusive: tokio::sync::Mutex::new(()),
            staging: Mutex::new(None),
            pinned_free: Default::default(),
            leases: Default::default(),
            after_lease: Default::default(),
            side: Default::default(),
            ahead: OnceLock::new(),
        };
        Ok(gpu)
    }

    /// What every set selection needs: the kernel families of the semi / anti
    /// join and set-operation path, the pinned staging buffers and the host copy
    /// threads (other families load when first used). Returns the time of the
    /// kernels and of the rest; a failure here shows again, with its error, when
    /// a query needs the same step.
    pub fn warm_up(&self) -> (std::time::Duration, std::time::Duration) {
        let kernels = self.load_set_selection_kernels();
        let t = std::time::Instant::now();
        drop(self.staging());
        crate::host::warm_up();
        (kernels, t.elapsed())
    }

    /// Load the set-selection kernel families (the background start's part of
    /// [`Gpu::warm_up`]: pinning the staging buffers costs the host ~50-90 ms of
    /// kernel work, which a query that ends up on the GPU pays at its first upload).
    pub fn load_set_selection_kernels(&self) -> std::time::Duration {
        let t = std::time::Instant::now();
        for family in PRELOAD.get().copied().unwrap_or_default() {
            let _ = self.module(family);
        }
        t.elapsed()
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// `n` streams beside [`Gpu::stream`] (made on first use, then kept), for
    /// kernels that run while the main stream copies: the device scan decodes
    /// each part of its reads on one of them while the next parts upload.
    /// Their work is ordered against the main stream only by events the
    /// caller records and waits on, and by synchronising them.
    pub fn side_streams(&self, n: usize) -> Result<Vec<Arc<CudaStream>>, DataFusionError> {
        let mut side = self.side.lock().unwrap_or_else(|e| e.into_inner());
        while side.len() < n {
            side.push(self.ctx.new_stream().map_err(|e| cuda_err("cuStreamCreate", e))?);
        }
        Ok(side[..n].to_vec())
    }

    /// The stream for copies a partition queues before it takes the device
    /// (the list functions' batches, [`crate::gpu::Gpu::upload_loaned_on`]), so
    /// that one batch's DMA overlaps another's kernels. Work on the main stream
    /// that reads such a copy waits for it (cudarc's events per buffer), and
    /// the buffers are freed on this stream after those reads.
    pub fn ahead_stream(&self) -> Result<Arc<CudaStream>, DataFusionError> {
        if let Some(s) = self.ahead.get() {
            return Ok(s.clone());
        }
        let made = self.ctx.new_stream().map_err(|e| cuda_err("cuStreamCreate", e))?;
        Ok(self.ahead.get_or_init(|| made).clone())
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn budget(&self) -> &MemoryBudget {
        &self.budget
    }

    /// The stream-ordered pool's memory, for traces: (reserved from the
    /// device, in use by allocations) bytes; None without the pool.
    pub fn pool_bytes(&self) -> Option<(u64, u64)> {
        use cudarc::driver::sys::{self, CUmemPool_attribute as A};
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        let (mut reserved, mut used) = (0u64, 0u64);
        // SAFETY: out-parameter queries on this initialised device's default pool.
        unsafe {
            if sys::cuDeviceGetDefaultMemPool(&mut pool, self.ctx.cu_device()) != sys::CUresult::CUDA_SUCCESS {
                return None;
            }
            let at = |a: A, v: &mut u64| sys::cuMemPoolGetAttribute(pool, a, v as *mut u64 as *mut std::ffi::c_void);
            if at(A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &mut reserved) != sys::CUresult::CUDA_SUCCESS
                || at(A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &mut used) != sys::CUresult::CUDA_SUCCESS
            {
                return None;
            }
        }
        Some((reserved, used))
    }

    /// Take the device for one operator's run. Held across awaits.
    pub async fn lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.exclusive.lock().await
    }

    /// One operator's hold on the device: the device lock, and the memory
    /// budget's limit set to `memory_limit` (`setfusion.memory_limit`; 0 =
    /// 90% of the device) until the [`Lease`] drops, which restores the
    /// default even when the holder panics or returns early.
    pub fn lease(&self, memory_limit: usize) -> Lease<'_> {
        let lock = self.lock_blocking();
        self.leases.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.budget.set_limit(memory_limit);
        Lease { gpu: self, _lock: lock }
    }

    /// Run `task` on the background thread once the current lease ends (at
    /// the end of the next one when only a plain lock is held): work that would otherwise
    /// slow the operator's own calls into the driver, such as page-locking
    /// host memory (`cuMemHostRegister` of a large buffer held up the rest of
    /// a query's device work by ~100 ms on the H100).
    /// With no lease held, the task goes to the background thread now.
    pub fn after_lease(&self, task: Box<dyn FnOnce() + Send>) {
        let mut waiting = self.after_lease.lock().unwrap_or_else(|e| e.into_inner());
        if self.exclusive.try_lock().is_ok() {
            drop(waiting);
            crate::host::later(task);
        } else {
            waiting.push(task);
        }
    }

    /// How many leases this device has given since it started: a test's
    /// evidence that work reached the device (a Ballista executor in the same
    /// process, say) and did not fall back to the CPU before asking.
    pub fn leases(&self) -> u64 {
        self.leases.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A grid-stride launch over `n` items in blocks of 256 threads: enough
    /// blocks to cover them, at most `blocks_per_sm` on each of this device's
    /// multiprocessors (read from the device, not assumed to be an H100's 132).
    pub fn grid_stride(&self, n: usize, blocks_per_sm: usize) -> cudarc::driver::LaunchConfig {
        let max_blocks = self.info.multiprocessors.max(1) as usize * blocks_per_sm.max(1);
        let blocks = n.div_ceil(256).clamp(1, max_blocks) as u32;
        cudarc::driver::LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
    }

    /// Blocking variant of [`Gpu::lock`] for synchronous algorithm code.
    pub fn lock_blocking(&self) -> tokio::sync::MutexGuard<'_, ()> {
        loop {
            if let Ok(g) = self.exclusive.try_lock() {
                return g;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }

    /// Free device memory as the driver reports it.
    pub fn free_memory(&self) -> Result<usize, DataFusionError> {
        self.ctx.mem_get_info().map(|(free, _)| free).map_err(|e| cuda_err("cuMemGetInfo", e))
    }

    /// Compile (or fetch from the disk cache) and load one kernel family.
    pub fn module(&self, src: &'static KernelSource) -> Result<Arc<CudaModule>, DataFusionError> {
        let family = src.family;
        let mut modules = self.modules.lock().unwrap();
        if let Some(m) = modules.get(family) {
            return Ok(m.clone());
        }
        let cubin = compile::compile_cached(src, &self.info)?;
        let module = match self.ctx.load_module(cubin) {
            Ok(m) => m,
            // A driver older than NVRTC refuses its native code: JIT the PTX instead.
            Err(_) => self
                .ctx
                .load_module(compile::compile_ptx(src, &self.info)?)
                .map_err(|e| cuda_err(&format!("loading kernels/{family}.cu"), e))?,
        };
        modules.insert(family, module.clone());
        crate::util::trace(&format!("device: kernels/{family}.cu loaded"));
        Ok(module)
    }

    /// A kernel function from a family.
    pub fn function(&self, family: &'static KernelSource, name: &str) -> Result<CudaFunction, DataFusionError> {
        self.module(family)?
            .load_function(name)
            .map_err(|e| cuda_err(&format!("loading kernel {}::{name}", family.family), e))
    }

    /// Compile every kernel family of `sources` (used by `doctor`).
    pub fn compile_all(
        &self,
        sources: &[&'static KernelSource],
    ) -> Result<Vec<(&'static str, std::time::Duration)>, DataFusionError> {
        sources
            .iter()
            .map(|k| {
                let t = std::time::Instant::now();
                self.module(k).map(|_| (k.family, t.elapsed()))
            })
            .collect()
    }

    pub fn synchronize(&self) -> Result<(), DataFusionError> {
        self.stream.synchronize().map_err(|e| cuda_err("stream synchronize", e))
    }
}

/// A failed CUDA driver call as a typed [`GpuError`] (out of memory, or a driver error), with context.
pub fn cuda_err(what: &str, e: DriverError) -> DataFusionError {
    GpuError::driver(what, e).into()
}

/// The turn of the GPU test that holds it: GPU tests of one binary run one at
/// a time, because a test that charges the device's budget without a lease
/// (an algorithm called with `&Gpu`) would otherwise be charged to the
/// budget tests beside it, which lease a few MiB and count on them.
static GPU_TEST_TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

thread_local! {
    /// This test thread's turn, held until the thread (the test) ends.
    static GPU_TEST_HELD: std::cell::RefCell<Option<std::sync::MutexGuard<'static, ()>>> =
        const { std::cell::RefCell::new(None) };
}

/// For tests: the device, or `None` after printing why the GPU part is skipped.
/// With `SETFUSION_REQUIRE_GPU=1` a missing device is a test failure. The
/// calling test holds the GPU tests' one turn until its thread ends (the test
/// harness runs each test on a thread of its own), so other tests' device
/// memory is never charged to its budget; tests without a GPU run alongside.
pub fn test_gpu() -> Option<Arc<Gpu>> {
    match gpu(0) {
        Ok(g) => {
            GPU_TEST_HELD.with(|held| {
                let mut held = held.borrow_mut();
                if held.is_none() {
                    // A test that failed holding the turn poisons it; the next test's device is still sound.
                    *held = Some(GPU_TEST_TURN.lock().unwrap_or_else(|e| e.into_inner()));
                }
            });
            Some(g)
        }
        Err(e) => {
            if crate::env::require_gpu() {
                panic!("SETFUSION_REQUIRE_GPU=1 but no usable GPU: {e}");
            }
            // Written past the test harness's capture, so CI logs say why the GPU part did not run.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "skipping GPU part: {e}");
            None
        }
    }
}
