//! `setfusion doctor`: device report, kernel compilation, self-checks.

use datafusion::error::Result;

use setfusion::gpu;

/// One line saying which device setfusion will use, or why none.
pub fn gpu_line() -> String {
    match gpu::gpu(0) {
        Ok(g) => {
            let i = g.info();
            format!(
                "GPU: {} (sm_{}{}, {:.1} GiB)",
                i.name,
                i.compute_capability.0,
                i.compute_capability.1,
                i.total_memory as f64 / (1u64 << 30) as f64
            )
        }
        Err(e) => format!("no GPU: {e}; setfusion runs on the CPU"),
    }
}

/// `setfusion doctor --start-probe`: start the device as a fresh process does
/// (kernels from the disk cache) and print the times of its steps.
pub fn start_probe() -> i32 {
    let t = std::time::Instant::now();
    gpu::start_in_background(0, setfusion::algo::SET_SELECTION_KERNELS);
    gpu::wait_started(0);
    let started = t.elapsed();
    match (gpu::start_times(0), gpu::gpu(0)) {
        (Some(s), Ok(g)) => {
            let (_, staging) = g.warm_up();
            println!(
                "start_ms={:.1} context_ms={:.1} kernels_ms={:.1} then_staging_ms={:.1}",
                started.as_secs_f64() * 1e3,
                s.context.as_secs_f64() * 1e3,
                s.kernels.as_secs_f64() * 1e3,
                staging.as_secs_f64() * 1e3
            );
            0
        }
        _ => 1,
    }
}

/// The device start of a fresh process, measured in child processes: (ms until
/// a first upload could run: start plus staging, the probe's line), the
/// median of three probes. (The driver's start varies a lot from process to
/// process: 129 to 205 ms on one H100 loan; the best of three made the cost
/// model count on the lucky case.)
fn measure_start() -> Option<(f64, String)> {
    let exe = std::env::current_exe().ok()?;
    let mut probes: Vec<(f64, String)> = Vec::with_capacity(3);
    for _ in 0..3 {
        let out = std::process::Command::new(&exe).args(["doctor", "--start-probe"]).output().ok()?;
        let line = String::from_utf8_lossy(&out.stdout).lines().find(|l| l.starts_with("start_ms="))?.to_string();
        // What the first GPU query of a process waits for at most: the start, then the staging.
        let field = |name: &str| -> Option<f64> {
            line.split_whitespace().find_map(|f| f.strip_prefix(name)).and_then(|v| v.parse().ok())
        };
        let ms = field("start_ms=")? + field("then_staging_ms=").unwrap_or(0.0);
        probes.push((ms, line));
    }
    probes.sort_by(|a, b| a.0.total_cmp(&b.0));
    probes.into_iter().nth(1)
}

/// Exit code 0 when healthy (or when no GPU is present: that is a supported setup).
pub async fn run() -> Result<i32> {
    println!("setfusion {}", env!("CARGO_PKG_VERSION"));
    let g = match gpu::gpu(0) {
        Ok(g) => g,
        Err(e) => {
            println!("no GPU: {e}; setfusion runs on the CPU");
            let require = crate::env::require_gpu();
            return Ok(if require { 2 } else { 0 });
        }
    };
    let i = g.info();
    // Every device the driver sees (`SET setfusion.devices = 'all'` splits large set selections across them).
    let count = gpu::device_count();
    println!("devices: {count}");
    for o in (0..count).filter(|&o| o != i.ordinal) {
        match gpu::gpu(o) {
            Ok(d) => println!(
                "device {o}: {} ({:.1} GiB)",
                d.info().name,
                d.info().total_memory as f64 / (1u64 << 30) as f64
            ),
            Err(e) => println!("device {o}: not usable: {e}"),
        }
    }
    println!("device {}: {}", i.ordinal, i.name);
    println!("compute capability: {}.{}", i.compute_capability.0, i.compute_capability.1);
    println!("driver version: {}.{}", i.driver_version / 1000, (i.driver_version % 1000) / 10);
    println!("multiprocessors: {}", i.multiprocessors);
    println!(
        "memory: {:.1} GiB total, {:.1} GiB free, budget {:.1} GiB",
        i.total_memory as f64 / (1u64 << 30) as f64,
        g.free_memory()? as f64 / (1u64 << 30) as f64,
        g.budget().limit() as f64 / (1u64 << 30) as f64
    );
    let mut ok = true;
    match g.compile_all(&setfusion::algo::kernel_sources()) {
        Ok(list) => {
            for (family, t) in list {
                println!("kernel {family}: compiled/loaded in {:.1} ms", t.as_secs_f64() * 1e3);
            }
        }
        Err(e) => {
            println!("kernel compilation FAILED: {}", super::one_line(&e));
            return Ok(1);
        }
    }
    // A fresh process's device start, now that the kernels are in the disk cache.
    let start = measure_start();
    match &start {
        Some((ms, line)) => println!("device start of a fresh process: {ms:.1} ms until the first upload ({line})"),
        None => println!("device start of a fresh process: not measured (the probe process failed)"),
    }
    let upload_keys_gbps: f64;
    // Host -> device bandwidth through the pinned staging buffers (1 GiB of pageable memory).
    {
        let _lock = g.lock_blocking();
        // The fastest of three uploads (the first one also maps the staging buffers).
        let best_of_3 = |upload: &dyn Fn(&mut gpu::TransferStats) -> Result<()>| -> Result<gpu::TransferStats> {
            let mut best: Option<gpu::TransferStats> = None;
            for _ in 0..3 {
                let mut st = gpu::TransferStats::default();
                upload(&mut st)?;
                if best.as_ref().is_none_or(|b| st.to_device < b.to_device) {
                    best = Some(st);
                }
            }
            Ok(best.unwrap_or_default())
        };
        let host: Vec<u64> = (0..(1u64 << 27)).collect();
        let st = best_of_3(&|st| g.upload(&host, st).map(drop))?;
        println!(
            "upload 1 GiB: {:.1} GB/s ({:.1} ms: staging copies {:.1} ms, DMA waits {:.1} ms)",
            (1u64 << 30) as f64 / st.to_device.as_secs_f64() / 1e9,
            st.to_device.as_secs_f64() * 1e3,
            st.staging_copy.as_secs_f64() * 1e3,
            st.dma_wait.as_secs_f64() * 1e3
        );
        // The operators' path: 64-bit keys frame-of-reference packed in transit.
        let keys: Vec<u64> = (0..(1u64 << 27)).map(|i| (i * 2654435761) % 400_000_000).collect();
        let st = best_of_3(&|st| g.upload_keys(&[&keys], st).map(drop))?;
        upload_keys_gbps = (1u64 << 30) as f64 / st.to_device.as_secs_f64() / 1e9;
        println!(
            "upload 1 GiB of keys (domain 4e8, packed to {} MB): {:.1} GB/s of keys ({:.1} ms: packing {:.1} ms, DMA waits {:.1} ms)",
            st.bytes_to_device >> 20,
            (1u64 << 30) as f64 / st.to_device.as_secs_f64() / 1e9,
            st.to_device.as_secs_f64() * 1e3,
            st.staging_copy.as_secs_f64() * 1e3,
            st.dma_wait.as_secs_f64() * 1e3
        );
        // What a fresh scope of copy threads per 8M-key fill would cost here (the
        // persistent pool in src/gpu/pool.rs saves it once per fill).
        let threads = setfusion::host::copy_threads();
        let t = std::time::Instant::now();
        for _ in 0..25 {
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| std::hint::black_box(0));
                }
            });
        }
        println!(
            "host: {threads} copy threads; spawning and joining them costs {:.0} us per fill",
            t.elapsed().as_secs_f64() * 1e6 / 25.0
        );
        // Host memory bandwidth on the same threads: the ceiling for packing keys
        // and for filtering payload columns on the host (both stream memory).
        let mut dst = vec![0u64; host.len()];
        let per = host.len().div_ceil(threads);
        let mut pieces: Vec<(&[u64], &mut [u64], u64)> =
            host.chunks(per).zip(dst.chunks_mut(per)).map(|(a, b)| (a, b, 0)).collect();
        let (mut read, mut copy) = (f64::MAX, f64::MAX);
        for _ in 0..3 {
            let t = std::time::Instant::now();
            setfusion::host::for_each_mut(&mut pieces, &|_, (src, _, sum)| {
                *sum = src.iter().fold(0u64, |a, &x| a.wrapping_add(x))
            });
            read = read.min(t.elapsed().as_secs_f64());
            let t = std::time::Instant::now();
            setfusion::host::for_each_mut(&mut pieces, &|_, (src, dst, _)| dst.copy_from_slice(src));
            copy = copy.min(t.elapsed().as_secs_f64());
        }
        std::hint::black_box(&pieces);
        println!(
            "host memory on {threads} threads: read 1 GiB at {:.1} GB/s, copy 1 GiB at {:.1} GB/s (2 GiB of traffic)",
            (1u64 << 30) as f64 / read / 1e9,
            (1u64 << 30) as f64 / copy / 1e9
        );
    }
    // The cost model's inputs (src/planner/cost.rs), for every later process.
    if let (Some((start_ms, _)), true) = (&start, upload_keys_gbps > 0.0) {
        let cal = setfusion::planner::cost::Calibration {
            upload_gbps: upload_keys_gbps,
            start_ms: *start_ms,
            measured: true,
        };
        match cal.save() {
            Ok(p) => println!(
                "calibration saved to {} (upload {:.1} GB/s of keys, start {:.0} ms)",
                p.display(),
                upload_keys_gbps,
                start_ms
            ),
            Err(e) => println!("calibration not saved: {e}"),
        }
    }
    for (family, check) in setfusion::algo::self_checks() {
        let _lock = g.lock_blocking();
        match check(&g) {
            Ok(msg) => println!("self-check {family}: ok ({msg})"),
            Err(e) => {
                ok = false;
                println!("self-check {family}: FAILED: {}", super::one_line(&e));
            }
        }
    }
    println!("{}", if ok { "doctor: all checks passed" } else { "doctor: some checks FAILED" });
    Ok(if ok { 0 } else { 1 })
}
