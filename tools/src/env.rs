//! The environment variables of the command, the benchmarks and the tests (the
//! library's own switches are [`setfusion::env`]). Each is read when asked (no
//! caching), so a test harness that sets one before the call sees it.

use std::path::PathBuf;

use setfusion::env::{flag, parsed, path};
pub use setfusion::env::{require_gpu, user_cache_dir};

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
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data"))
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

/// `SETFUSION_ROOT`: the repository root the tests read `sql-tests/` from (else the crate's own).
pub fn repo_root() -> PathBuf {
    path("SETFUSION_ROOT").unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/..")))
}
