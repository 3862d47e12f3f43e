//! Every environment variable setfusion reads, in one place. Session settings
//! (`SET setfusion.*`) live in [`crate::config`]; these are process-wide
//! switches for operators and the measurements of their alternatives (the
//! command's, benchmarks' and tests' knobs are `setfusion_tools::env`). Each is read when asked (no
//! caching), so a test harness that sets one before the call sees it.

use std::path::PathBuf;
use std::str::FromStr;

/// `name` is set to `1`.
pub fn flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1")
}

/// `name`'s value parsed as a `T` (None: unset or not a `T`).
pub fn parsed<T: FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// `name`'s value as a path.
pub fn path(name: &str) -> Option<PathBuf> {
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

/// `SETFUSION_COLLECT_CPU_PROBE=1`: the CPU backend's set operations collect
/// their kept side before selecting, instead of streaming it past the other
/// side's counts (`exec::streamed_probe`), for comparing the two in benchmarks.
pub fn collect_cpu_probe() -> bool {
    flag("SETFUSION_COLLECT_CPU_PROBE")
}

/// `SETFUSION_DEVICES_KEY_SPLIT=1`: several devices always split the keys by
/// hash on the host (the general way), for comparing it with the row-range
/// split in benchmarks.
pub fn devices_key_split() -> bool {
    flag("SETFUSION_DEVICES_KEY_SPLIT")
}

/// `SETFUSION_SSJOIN_START_AT_PLANNING_ROWS=N`: a similarity join of N input
/// rows or more starts an unstarted device at planning (the default's 1M;
/// 0 gives the start at planning of every GPU plan, as before the
/// fifty-seventh session), for comparing the two in one benchmark run.
pub fn ssjoin_start_at_planning_rows() -> Option<usize> {
    parsed("SETFUSION_SSJOIN_START_AT_PLANNING_ROWS")
}

/// `SSJOIN_PLAN_THREADS=1,16`: thread counts of the ssjoin planning experiment (an ignored test).
pub fn ssjoin_plan_threads() -> Option<Vec<usize>> {
    std::env::var("SSJOIN_PLAN_THREADS").ok().map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
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

/// `SETFUSION_SNAPPY_PAIRS=N` (1 to 4): pages a block of `pq_snappy_pipe`
/// (two warps each), to measure the choice (`scan::decode`'s `SNAPPY_PAIRS`).
pub fn snappy_pairs() -> Option<u32> {
    parsed("SETFUSION_SNAPPY_PAIRS")
}

/// `SETFUSION_SNAPPY_SERIAL=1`: the device scan decompresses SNAPPY pages with
/// one thread per page (`pq_snappy_serial`) instead of two warps per page
/// (`pq_snappy_pipe`, the default), to measure one against the other.
pub fn snappy_serial() -> bool {
    flag("SETFUSION_SNAPPY_SERIAL")
}

/// `SETFUSION_SNAPPY_ONE_WARP=1`: one warp per SNAPPY page (`pq_snappy`, the
/// host harness's form) instead of two (`pq_snappy_pipe`, the default).
pub fn snappy_one_warp() -> bool {
    flag("SETFUSION_SNAPPY_ONE_WARP")
}

/// Does the device scan decompress ZSTD pages on the device (`kernels/zstd.cu`)?
/// Yes by default; `SETFUSION_DEVICE_ZSTD=0` inflates them on host threads
/// before the upload instead. On an H200 the device's decoder made warm
/// 100M x 100M queries over zstd files 10.8-16.2x DataFusion, against
/// 3.6-10.7x with the host's inflation (BENCHMARKS section 36).
pub fn device_zstd() -> bool {
    std::env::var("SETFUSION_DEVICE_ZSTD").map_or(true, |v| v.trim() != "0")
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

/// `SETFUSION_FAMILIES_HOST_OUTPUT=1`: the distinct level of
/// `intersect_families` downloads its sets and orders them on the host, as
/// before the device laid out the output columns (for comparing the two).
pub fn families_host_output() -> bool {
    flag("SETFUSION_FAMILIES_HOST_OUTPUT")
}

/// `SETFUSION_PACK_MIN_SEGMENTS=N`: fills of fewer than N segments of 65,536
/// keys are packed by one thread (default 4; the earlier rule was 16).
pub fn pack_min_segments() -> usize {
    parsed("SETFUSION_PACK_MIN_SEGMENTS").unwrap_or(4)
}
