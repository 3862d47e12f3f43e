//! Every environment variable setfusion reads, in one place. Session settings
//! (`SET setfusion.*`) live in [`crate::config`]; these are process-wide
//! switches for operators, tests and benchmarks. Each is read when asked (no
//! caching), so a test harness that sets one before the call sees it.

use std::path::PathBuf;
use std::str::FromStr;

fn flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1")
}

fn parsed<T: FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name).map(PathBuf::from)
}

/// `SETFUSION_REQUIRE_GPU=1`: a missing GPU fails GPU tests, `doctor` and the slt gpu mode instead of skipping.
pub fn require_gpu() -> bool {
    flag("SETFUSION_REQUIRE_GPU")
}

/// `SETFUSION_DISABLE_GPU=1`: act as if no device were present.
pub fn disable_gpu() -> bool {
    flag("SETFUSION_DISABLE_GPU")
}

/// `SETFUSION_TRACE` (any value): print per-query timelines to stderr.
pub fn trace() -> bool {
    std::env::var_os("SETFUSION_TRACE").is_some()
}

/// `SETFUSION_CALIBRATION`: the cost model's calibration file, instead of the cache's.
pub fn calibration_file() -> Option<PathBuf> {
    path("SETFUSION_CALIBRATION")
}

/// `SETFUSION_CACHE_DIR`: the compiled-kernel cache, instead of the user cache's `setfusion/kernels`.
pub fn kernel_cache_dir() -> Option<PathBuf> {
    path("SETFUSION_CACHE_DIR")
}

/// The user's cache folder: `$XDG_CACHE_HOME`, else `$HOME/.cache`.
pub fn user_cache_dir() -> Option<PathBuf> {
    path("XDG_CACHE_HOME").or_else(|| path("HOME").map(|h| h.join(".cache")))
}

/// `SETFUSION_TPCH_DIR`: where `bench tpch` caches its Parquet files (else `~/.cache/setfusion/tpch`).
pub fn tpch_dir() -> PathBuf {
    path("SETFUSION_TPCH_DIR")
        .unwrap_or_else(|| path("HOME").unwrap_or_else(std::env::temp_dir).join(".cache/setfusion/tpch"))
}

/// `SETFUSION_PARQUET_DIR`: where `bench parquet` caches its Parquet files (else `~/.cache/setfusion/parquet`).
pub fn parquet_bench_dir() -> PathBuf {
    path("SETFUSION_PARQUET_DIR")
        .unwrap_or_else(|| path("HOME").unwrap_or_else(std::env::temp_dir).join(".cache/setfusion/parquet"))
}

/// `SETFUSION_DATA_DIR`: the shared test data (else `../shared/data` beside the crate).
pub fn data_dir() -> PathBuf {
    path("SETFUSION_DATA_DIR")
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data"))
}

/// `SETFUSION_DEMO_ROWS`: rows per table in `setfusion demo`.
pub fn demo_rows() -> Option<u64> {
    parsed("SETFUSION_DEMO_ROWS")
}

/// `SETFUSION_BENCH_ROWS`: rows per table in `bench setops` / `bench filter`.
pub fn bench_rows() -> Option<u64> {
    parsed("SETFUSION_BENCH_ROWS")
}

/// `SETFUSION_BENCH_RUNS`: timed runs per query.
pub fn bench_runs() -> Option<usize> {
    parsed("SETFUSION_BENCH_RUNS")
}

/// `SETFUSION_BENCH_ONLY=a,b`: run only the benchmark queries whose names contain one of these.
pub fn bench_only() -> Vec<String> {
    std::env::var("SETFUSION_BENCH_ONLY").map(|v| v.split(',').map(str::to_string).collect()).unwrap_or_default()
}

/// `SETFUSION_BENCH_MEMORY_LIMIT=160M`: the device budget (`setfusion.memory_limit`) of `bench setops`' setfusion session.
pub fn bench_memory_limit() -> Option<String> {
    std::env::var("SETFUSION_BENCH_MEMORY_LIMIT").ok()
}

/// `SETFUSION_BENCH_DEVICES='0,1'`: `bench setops`' setfusion session splits its work across these devices (`setfusion.devices`).
pub fn bench_devices() -> Option<String> {
    std::env::var("SETFUSION_BENCH_DEVICES").ok()
}

/// `SETFUSION_BENCH_SKIP_DATAFUSION=1`: `bench setops` times setfusion alone
/// (DataFusion's columns read 0; for comparing setfusion's own settings).
pub fn bench_skip_datafusion() -> bool {
    flag("SETFUSION_BENCH_SKIP_DATAFUSION")
}

/// `SETFUSION_DEVICES_KEY_SPLIT=1`: several devices always split the keys by
/// hash on the host (the general way), for comparing it with the row-range
/// split in benchmarks.
pub fn devices_key_split() -> bool {
    flag("SETFUSION_DEVICES_KEY_SPLIT")
}

/// `SETFUSION_BENCH_SPARSE=1`: `bench setops` spreads its keys over all 64 bits
/// (the same matches; no dense domain, so over the device budget the work hash-partitions).
pub fn bench_sparse() -> bool {
    flag("SETFUSION_BENCH_SPARSE")
}

/// `SETFUSION_BENCH_SORTED_LOG2`: log2 of the sorted-intersection microbenchmark's size.
pub fn bench_sorted_log2() -> Option<u32> {
    parsed("SETFUSION_BENCH_SORTED_LOG2")
}

/// `SETFUSION_BENCH_OUT`: file the benchmark's markdown table is written to.
pub fn bench_out() -> Option<String> {
    std::env::var("SETFUSION_BENCH_OUT").ok()
}

/// `SSJOIN_BENCH_OUT`: file the similarity-join benchmark's table is written to.
pub fn ssjoin_bench_out() -> Option<String> {
    std::env::var("SSJOIN_BENCH_OUT").ok()
}

/// `SSJOIN_BENCH_NLJ_SETS`: sets in the nested-loop reference of the similarity benchmark.
pub fn ssjoin_nlj_sets() -> Option<usize> {
    parsed("SSJOIN_BENCH_NLJ_SETS")
}

/// `SSJOIN_PLAN_THREADS=1,16`: thread counts of the ssjoin planning experiment (an ignored test).
pub fn ssjoin_plan_threads() -> Option<Vec<usize>> {
    std::env::var("SSJOIN_PLAN_THREADS").ok().map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
}

/// `SETFUSION_SLT=name`: run only the slt files whose names contain it (tests).
pub fn slt_filter() -> Option<String> {
    std::env::var("SETFUSION_SLT").ok()
}

/// `SETFUSION_FUZZ_QUERIES`: queries of the CI fuzz test.
pub fn fuzz_queries() -> Option<usize> {
    parsed("SETFUSION_FUZZ_QUERIES")
}

/// `SETFUSION_FUZZ_OUTER=0`: the fuzzer leaves out its outer joins inside
/// correlated subqueries (on by default). A GPU run of tests/all's fuzz with
/// them once grew past 120 GB of host memory; the same run through
/// `setfusion fuzz` with a per-query trace (`SETFUSION_FUZZ_TRACE`) stayed
/// small and agreed, so they are on again.
pub fn fuzz_outer_joins() -> bool {
    std::env::var_os("SETFUSION_FUZZ_OUTER").is_none_or(|v| v != "0")
}

/// `SETFUSION_FUZZ_TRACE`: a file the fuzz appends each query to (round,
/// backend, SQL) before running it, so a run that dies (out of memory, a
/// crash) leaves its last query behind.
pub fn fuzz_trace() -> Option<PathBuf> {
    path("SETFUSION_FUZZ_TRACE")
}

/// `SETFUSION_KERNEL_SOURCE_DIR`: read each kernel family's `.cu` file (and
/// `common.cuh`) from this folder at run time instead of the copy built into
/// the binary, to try kernel changes on a machine without a Rust toolchain.
/// A family whose file is missing there uses the built-in copy.
pub fn kernel_source_dir() -> Option<PathBuf> {
    path("SETFUSION_KERNEL_SOURCE_DIR")
}

/// `SETFUSION_SNAPPY_WARPS`: warps a block of `pq_snappy` (one page each; default 4).
pub fn snappy_warps() -> Option<u32> {
    parsed("SETFUSION_SNAPPY_WARPS")
}

/// `SETFUSION_ROOT`: the repository root the tests read `sql-tests/` from (else the crate's own).
pub fn repo_root() -> PathBuf {
    path("SETFUSION_ROOT").unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// `SETFUSION_SNAPPY_SERIAL=1`: the device scan decompresses SNAPPY pages with
/// one thread per page (`pq_snappy_serial`) instead of one warp per page
/// (`pq_snappy`, the default), to measure one against the other.
pub fn snappy_serial() -> bool {
    flag("SETFUSION_SNAPPY_SERIAL")
}

/// `SETFUSION_SCAN_PART_MB=N`: the device scan reads, uploads and decodes in
/// parts of N MiB of column chunks (default 64); 0 reads each side whole
/// before decoding it, to measure the overlap against its absence.
pub fn scan_part_mb() -> Option<usize> {
    parsed("SETFUSION_SCAN_PART_MB")
}

/// `SETFUSION_SCAN_COLUMNS_APART=1`: a filtered input's columns are read one
/// after another (each its own pipeline) instead of together, to measure one against the other.
pub fn scan_columns_apart() -> bool {
    flag("SETFUSION_SCAN_COLUMNS_APART")
}

/// `SETFUSION_SCAN_READERS=N`: reader threads a device scan's parts are read by (default 2).
pub fn scan_readers() -> Option<usize> {
    parsed("SETFUSION_SCAN_READERS")
}
