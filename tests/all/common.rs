//! Helpers shared by the modules of the `all` test binary.

#![allow(dead_code)]

use std::path::PathBuf;

/// The crate root (tests run with any working directory). `SETFUSION_ROOT`
/// overrides it where the test binary runs away from its source tree (the GPU
/// machine, see scripts/gpu-run.sh).
pub fn crate_root() -> PathBuf {
    setfusion_tools::env::repo_root()
}

/// A test data file from `SETFUSION_DATA_DIR` (else `../shared/data`). A
/// missing file fails the test, unless `SETFUSION_SKIP_MISSING_DATA=1`
/// (then the test says it skips and returns None).
pub fn data_file(name: &str) -> Option<String> {
    let path = setfusion_tools::env::data_dir().join(name);
    match std::fs::read_to_string(&path) {
        Ok(text) => Some(text),
        Err(e) if std::env::var("SETFUSION_SKIP_MISSING_DATA").is_ok_and(|v| v == "1") => {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "skipping: {}: {e} (SETFUSION_SKIP_MISSING_DATA=1)", path.display());
            None
        }
        Err(e) => panic!(
            "test data {}: {e} (set SETFUSION_DATA_DIR, or SETFUSION_SKIP_MISSING_DATA=1 to skip)",
            path.display()
        ),
    }
}

/// `SETFUSION_REQUIRE_GPU=1`: GPU-mode tests fail instead of skipping when no
/// GPU is usable.
pub fn require_gpu() -> bool {
    setfusion::env::require_gpu()
}

/// `Ok(())` when GPU-mode tests should run; `Err(reason)` after printing
/// `skipping gpu mode: <reason>` when they should be skipped. Panics when no
/// GPU is usable and `SETFUSION_REQUIRE_GPU=1`.
pub fn gpu_or_skip() -> Result<(), String> {
    match setfusion_tools::slt::gpu_mode_status() {
        Ok(()) => Ok(()),
        Err(reason) if require_gpu() => panic!("SETFUSION_REQUIRE_GPU=1 but no usable GPU: {reason}"),
        Err(reason) => {
            // Past the harness's capture, so the CI log shows it.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "skipping gpu mode: {reason}");
            Err(reason)
        }
    }
}

/// A multi-threaded tokio runtime for a test.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_stack_size(8 << 20)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Run `f` on a thread with a large stack (DataFusion's planner recurses deeply
/// on big queries) inside a fresh runtime.
pub fn block_on<F, Fut, T>(f: F) -> T
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T>,
    T: Send + 'static,
{
    std::thread::Builder::new()
        .stack_size(16 << 20)
        .spawn(move || runtime().block_on(f()))
        .expect("spawn test thread")
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// The device as the tests of this binary share it: every test that can run
/// on it holds the shared side while it runs, the concurrency test the exclusive side, so
/// that its before/after reading of the device budget sees no other test's
/// buffers (the harness runs tests on several threads).
static DEVICE: std::sync::RwLock<()> = std::sync::RwLock::new(());

pub fn shared_device() -> std::sync::RwLockReadGuard<'static, ()> {
    DEVICE.read().unwrap_or_else(|e| e.into_inner())
}

pub fn exclusive_device() -> std::sync::RwLockWriteGuard<'static, ()> {
    DEVICE.write().unwrap_or_else(|e| e.into_inner())
}

/// A query's answer as sorted canonical rows (a failure names the query).
pub async fn rows(ctx: &datafusion::prelude::SessionContext, sql: &str) -> Vec<String> {
    let batches = ctx
        .sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    setfusion_tools::bench::tpch::canonical_rows(&batches).unwrap()
}

/// The query's EXPLAIN (`analyze`: EXPLAIN ANALYZE) as one string.
pub async fn explain(ctx: &datafusion::prelude::SessionContext, sql: &str, analyze: bool) -> String {
    let q = format!("EXPLAIN {}{sql}", if analyze { "ANALYZE " } else { "" });
    let batches = ctx.sql(&q).await.unwrap().collect().await.unwrap();
    setfusion_tools::bench::tpch::canonical_rows(&batches).unwrap().join("\n")
}
