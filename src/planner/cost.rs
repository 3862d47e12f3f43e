//! The cost model behind every semi / anti join and set operation (issue 13):
//! DataFusion's own operator against setfusion's GPU backend, so that a
//! query is never slower for having setfusion installed. The list functions'
//! rule ([`list_function_estimate`]) and the similarity join's
//! ([`similarity_estimate`]) are here too; [`super::decision`] applies them
//! and is the only caller.
//!
//! Both estimates are wall-clock milliseconds from the planner's row
//! estimates (an upper bound through nodes without one), the key types, the
//! threads DataFusion would use, the device's readiness (a device still
//! starting in the background adds what is left of its start) and the host's
//! measured rates: `setfusion doctor` stores them in a calibration file
//! ([`Calibration`]); without one, conservative defaults hold.
//!
//! DataFusion's cost is per input row and thread, from its measured times on
//! the H100 host (100M x 100M BIGINT: IN 1.39 s, INTERSECT 2.64 s on 16
//! threads); string and composite keys cost it twice as much. setfusion's GPU
//! cost is a fixed launch-and-synchronise cost, the keys' PCIe bytes at the
//! measured packed-upload rate (one string / binary column: its views or
//! values, hashed on the device; composite keys of exact and string columns:
//! each column's buffers, hashed column by column on the device, plus a NULL
//! mask), and for the remaining composite keys (a wide decimal, fixed-size
//! binary, ...) the host's row encoding, measured at ~40 ns a row (issue 13:
//! 761 ms for 18M keys) — so those stay with DataFusion.

use datafusion::arrow::datatypes::DataType;

use crate::algo::select::SetOp;
use crate::algo::ssjoin::{Metric, Threshold};
use crate::config::Strategy;
use crate::exec::common::{Decision, Reason};
pub use crate::gpu::calibration::Calibration;
use crate::gpu::Readiness;

/// DataFusion's cost per input row and thread, ns (fixed-width keys): a lower
/// bound of its measured times (H100 host, 16 threads: 100M x 100M IN 111,
/// TPC-H SF10 anti join of lineitem and orders 66), so the GPU must win clearly.
const DF_JOIN_NS: f64 = 60.0;
/// The same for INTERSECT / EXCEPT, a distinct aggregate and a join (measured
/// 114 on TPC-H SF10 customers, 190 on 100M x 100M in memory).
const DF_SETOP_NS: f64 = 100.0;
/// setfusion's CPU backend (the only exact CPU choice for INTERSECT / EXCEPT
/// ALL), per row of both inputs and thread, for integer-like keys, which it
/// streams past a table of the other side's counts (`exec::streamed_probe`):
/// elapsed_compute summed over 16 partitions on the H200, TPC-H SF10
/// `except_all_orderkeys` (60M rows, an array of counts) 15 ns a row,
/// `intersect_all_part_supp` (20M rows, hash buckets of a cache line) 47
/// (71 with linear probing in 16-byte slots).
/// (Collecting both sides first, it was 350 ns.) Strings and other hashed
/// keys are still collected: 5,700 ns measured for those composites.
const SF_CPU_NS: f64 = 50.0;
const SF_CPU_WIDE_NS: f64 = 5_700.0;
/// String / binary / composite keys cost DataFusion this much more.
const DF_WIDE_FACTOR: f64 = 2.0;
/// setfusion's GPU path: fixed cost per operator (launches, synchronisation, the output), ms.
const GPU_FIXED_MS: f64 = 2.0;
/// Host row encoding of composite keys with a string or wide decimal, ns per row (wall, all threads).
const GPU_WIDE_HOST_NS: f64 = 40.0;
/// PCIe bytes per row of one string / binary column: a 16-byte view, or the
/// value and its offset, plus a share of the value buffers.
const GPU_STRING_ROW_BYTES: f64 = 24.0;
/// Fixed cost of the device string path, ms: measured on the H100, TPC-H
/// `string_in` lost 47 ms warm at SF1 (1.5M probe rows) on the device and
/// won 50 ms at SF10; both fit a fixed ~40 ms (more launches and
/// synchronisations than integer keys, the views' batch table, the inputs
/// collected before the first upload). Not broken down further yet.
const GPU_STRING_FIXED_MS: f64 = 40.0;
/// The host's work per input row of string keys, ns (wall): the key
/// column's encoding for the device and the host's output filter of the
/// probe side. Measured on the H100 (TPC-H SF10 `string_in`, 15M probe rows,
/// warm): key_encode_time 43.7 ms, the output filter ~58 ms wall (926 ms
/// summed over 16 partitions), setfusion 171 ms against the model's 48 ms
/// without this term; DataFusion took 80 ms. With it, a semi join on string
/// keys stays with DataFusion on 16 threads at any size.
const GPU_STRING_HOST_NS: f64 = 7.0;
/// What is left of a background start, weighed against a query running beside it.
const STARTING_FACTOR: f64 = 3.0;
/// A device nobody started, weighed for a plan that would start it now:
/// its whole start counts this many times (it runs beside the query's own
/// host reads, not beside a query that does not use it). Measured on the
/// H100 (`bench parquet`, 100M x 100M IN, one-query processes): 433 ms with
/// the device started beside the query against 127 ms warm and DataFusion's
/// 1906 ms; counted 3 times, the start (221 ms on that loan) kept
/// DataFusion's plan there (1.01x).
const FROM_SCRATCH_FACTOR: f64 = 1.5;

/// The [`Readiness`] that [`estimate`] weighs for a device nobody has
/// started: a start just begun, counted [`FROM_SCRATCH_FACTOR`] times (as
/// the background start already half over that counts 3 times).
pub fn not_started(cal: &Calibration) -> Readiness {
    let counted = (1.0 - FROM_SCRATCH_FACTOR / STARTING_FACTOR).max(0.0);
    Readiness::Starting(std::time::Duration::from_secs_f64(cal.start_ms * counted / 1e3))
}
/// The GPU is chosen when its estimate is below DataFusion's by this factor.
const MARGIN: f64 = 1.25;

/// What the planner knows of one candidate operator.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    pub op: SetOp,
    /// Estimated rows of both inputs together (None: unknown).
    pub rows: Option<usize>,
    pub key_types: &'a [DataType],
    /// Threads DataFusion's operator would use (target partitions).
    pub threads: usize,
    /// Both inputs are Parquet scans the device scan may read: string keys are
    /// then decoded and hashed on the device, with no host encoding and no host
    /// output filter ([`crate::exec::device_scan`]).
    pub device_read: bool,
    /// Decompressed page bytes of the inputs' Parquet files that are
    /// inflated on host threads (GZIP and the like) before setfusion's
    /// selection can start, and those of the ZSTD pages the device
    /// decompresses; DataFusion inflates both inside its pipelined scan and
    /// join ([`HOST_INFLATE_NS`], [`DEVICE_ZSTD_NS`]).
    pub inflated: crate::scan::InflatedBytes,
    /// An input is a Parquet scan the device scan reads: its last decode
    /// launch runs after the reads ([`DEVICE_SCAN_TAIL_MS`]).
    pub device_scans: bool,
}

/// Host inflation of ZSTD (and GZIP, LZ4_RAW) pages, ns per decompressed
/// byte on one thread. Both plans inflate the same pages, but setfusion's
/// inputs are inflated before its selection starts, while DataFusion's scan
/// inflates them beside its pipelined join: the GPU's time is the inflation
/// plus its own work, DataFusion's the larger of its join and the
/// inflation. Measured on an H200 host with 16 threads (DataFusion-written
/// zstd files, 100M rows, two columns): 1.6 GB read and inflated in ~283 ms,
/// then ~80 ms to upload and decode; 4 ns a byte a thread (4 GB/s on 16)
/// covers both. Without it the model chose the GPU where DataFusion's join
/// is light (a 1M-key build side) and lost (0.87-0.93x warm, BENCHMARKS
/// section 25).
const HOST_INFLATE_NS: f64 = 4.0;

/// The device's ZSTD decoder (`kernels/zstd.cu`, one warp a page), ns per
/// decompressed byte; its fixed cost is the scan's last decode launch
/// ([`DEVICE_SCAN_TAIL_MS`]: a launch lasts at least one page's decode, 7.9
/// ms for 20,000 BIGINT keys alone on an H200). The
/// scan's launches decoded two columns of 100M keys (1.6 GB) from ~12 to
/// ~92 ms after the run began, beside the reads (~20 GB/s, once the 1 MiB
/// dictionary pages went to the host threads; BENCHMARKS section 36; it was
/// 0.1 ns, from ~165 ms before that). DataFusion inflates the same pages on
/// its threads ([`HOST_INFLATE_NS`]).
const DEVICE_ZSTD_NS: f64 = 0.05;

/// What a device scan adds after its last read, ms: a decode launch lasts
/// as long as its slowest page (one warp decompresses a ~160 KB zstd page in
/// ~7.9 ms on an H200; two warps a snappy page in 2-3 ms alone, and the last
/// launch of a warm `except_parts` ends 5.3 ms after the reads: BENCHMARKS
/// section 43), and small inputs pay it whole. TPC-H q16's anti
/// join against supplier (100,000 rows, 14 pages) was estimated at 2.7 ms on
/// the GPU against DataFusion's 6.1 ms; its device scan decoded 8.8-11.2 ms
/// after the reads, and q16 ran 0.86-0.98x warm (BENCHMARKS section 39).
/// Paid once whatever the pages' codec (a zstd page's launch is this tail too).
const DEVICE_SCAN_TAIL_MS: f64 = 8.0;

/// Keys DataFusion compares as more than one fixed-width value.
fn wide(types: &[DataType]) -> bool {
    types.len() > 1 || hashed(types)
}

/// Keys setfusion hashes: any column that is not exact on its own (strings,
/// binary, wide decimals). Composite keys of exact columns are packed into
/// one 64-bit key when their ranges allow (`keys::encode_packed`).
fn hashed(types: &[DataType]) -> bool {
    !types.iter().all(|t| crate::keys::is_exact(std::slice::from_ref(t)))
}

/// Hashed keys whose bytes the host must first row-encode (all but one
/// string / binary column, whose values the device reads in place, and
/// composite keys the device hashes column by column).
fn row_encoded(types: &[DataType]) -> bool {
    hashed(types) && !crate::keys::is_byte_column(types) && !column_hashed(types)
}

/// Composite keys with a string / binary column, hashed column by column on
/// the device from the columns' own buffers (`keys::is_column_hashed`).
/// Composites of exact columns alone are counted as packed.
fn column_hashed(types: &[DataType]) -> bool {
    hashed(types) && crate::keys::is_column_hashed(types)
}

/// PCIe bytes per row of column-hashed keys: each exact column's 8-byte
/// image, each string column as one string key, and the NULL masks' word
/// (charged whether or not a column holds a NULL).
fn column_hashed_row_bytes(types: &[DataType]) -> f64 {
    let string = |t: &DataType| crate::keys::is_byte_column(std::slice::from_ref(&crate::keys::key_type(t)));
    types.iter().map(|t| if string(t) { GPU_STRING_ROW_BYTES } else { 8.0 }).sum::<f64>() + 8.0
}

/// Estimate DataFusion's and the GPU's time for `c` and choose: the GPU
/// (strategy `auto`) or the CPU (DataFusion's operator, or where it is wrong,
/// setfusion's CPU backend), with the estimate as the reason.
pub fn estimate(c: &Candidate, readiness: &Readiness, cal: &Calibration) -> Decision {
    // INTERSECT / EXCEPT ALL must be replaced (DataFusion's answer is wrong): the
    // GPU's rival is then setfusion's own CPU backend.
    let exact_only = matches!(c.op, SetOp::IntersectAll | SetOp::ExceptAll);
    if let Readiness::Unavailable(e) = readiness {
        return Decision::cpu(Reason::NoGpu(e.to_string()));
    }
    let Some(rows) = c.rows else {
        return if exact_only {
            Decision::gpu(
                Strategy::Auto,
                Reason::CostModel("no row estimate; setfusion's CPU backend is the slower exact choice".into()),
            )
        } else {
            Decision::cpu(Reason::CostModel("no row estimate for an input, so no basis to move it to the GPU".into()))
        };
    };
    let n = rows as f64;
    let wide = wide(c.key_types);
    let threads = c.threads.max(1) as f64;
    let (rival, cpu_ms) = if exact_only {
        ("setfusion's CPU backend", n * if hashed(c.key_types) { SF_CPU_WIDE_NS } else { SF_CPU_NS } / threads / 1e6)
    } else {
        let per_row = match c.op {
            SetOp::IntersectDistinct | SetOp::ExceptDistinct => DF_SETOP_NS,
            _ => DF_JOIN_NS,
        } * if wide { DF_WIDE_FACTOR } else { 1.0 };
        ("DataFusion", n * per_row / threads / 1e6)
    };
    let (start_left, starting) = match readiness {
        Readiness::Ready => (0.0, String::new()),
        Readiness::Starting(elapsed) => {
            // A start running past its calibrated time still costs something. It runs
            // at low priority beside the query's own scans, so it takes longer than
            // doctor measured it alone: counted 3 times over (TPC-H SF10 one-query
            // processes lost 18-24% when the GPU was chosen on the plain estimate).
            // A start already past half its calibrated time is assumed to need at least
            // that half again: beside a query's scans it runs late (TPC-H SF10
            // intersect_customers lost 0.66x fresh with a floor of a tenth).
            let left = STARTING_FACTOR * (cal.start_ms - elapsed.as_secs_f64() * 1e3).max(cal.start_ms / 2.0);
            (left, format!(" incl. {left:.0} ms of device start left"))
        }
        Readiness::Unavailable(_) => unreachable!("handled above"),
    };
    let strings = crate::keys::is_byte_column(c.key_types);
    let columns = column_hashed(c.key_types);
    let row_bytes = if strings {
        GPU_STRING_ROW_BYTES
    } else if columns {
        column_hashed_row_bytes(c.key_types)
    } else {
        8.0
    };
    let transfer_ms = n * row_bytes / (cal.upload_gbps * 1e9) * 1e3;
    let row_encoded = row_encoded(c.key_types);
    let host_ms = if row_encoded {
        n * GPU_WIDE_HOST_NS / 1e6
    } else if strings && !c.device_read {
        n * GPU_STRING_HOST_NS / 1e6
    } else {
        0.0
    };
    // Column-hashed keys: the string path's launches and synchronisations, and more (one pass a column).
    let fixed_ms = if strings || columns { GPU_STRING_FIXED_MS } else { GPU_FIXED_MS };
    let inflate_ms = c.inflated.host as f64 * HOST_INFLATE_NS / threads / 1e6;
    let device_zstd_ms = c.inflated.device_zstd as f64 * DEVICE_ZSTD_NS / 1e6;
    // (The device's zstd decoding is setfusion's own work: the margin applies to it.)
    let scan_tail_ms = if c.device_scans || c.inflated.device_zstd > 0 { DEVICE_SCAN_TAIL_MS } else { 0.0 };
    let own_ms = start_left + fixed_ms + transfer_ms + host_ms + device_zstd_ms + scan_tail_ms;
    let gpu_ms = own_ms + inflate_ms;
    // The rival inflates the pages too (the device's ZSTD pages on its
    // threads): DataFusion beside its join, setfusion's CPU backend (which
    // collects its inputs first) before it.
    let rival_inflate_ms = (c.inflated.host + c.inflated.device_zstd) as f64 * HOST_INFLATE_NS / threads / 1e6;
    let rival_ms = if exact_only { cpu_ms + rival_inflate_ms } else { cpu_ms.max(rival_inflate_ms) };
    let mut inflating = String::new();
    if inflate_ms > 0.0 {
        inflating += &format!(" incl. {inflate_ms:.0} ms of pages inflated first on host threads");
    }
    if device_zstd_ms > 0.0 {
        inflating += &format!(" incl. {device_zstd_ms:.0} ms of zstd pages decompressed on the device");
    }
    if scan_tail_ms > 0.0 {
        inflating += &format!(" incl. {scan_tail_ms:.0} ms of the device scan's last decode");
    }
    let cal_note = if cal.measured { "" } else { ", uncalibrated (run setfusion doctor)" };
    let what = format!(
        "~{rows} rows{}: GPU ~{gpu_ms:.1} ms{starting}{inflating}, {rival} ~{rival_ms:.1} ms on {} threads{cal_note}",
        if row_encoded {
            ", keys row-encoded on the host"
        } else if strings && c.device_read {
            ", string keys read, decoded and hashed by the device"
        } else if strings {
            ", string keys hashed on the device"
        } else if columns {
            ", composite keys hashed column by column on the device"
        } else if wide {
            ", composite keys packed"
        } else {
            ""
        },
        c.threads
    );
    // The GPU must win by the margin against DataFusion (on its own work, not
    // the inflation both pay); against setfusion's own CPU backend, any win will do.
    if own_ms * if exact_only { 1.0 } else { MARGIN } + inflate_ms < rival_ms {
        Decision::gpu(Strategy::Auto, Reason::CostModel(what))
    } else {
        Decision::cpu(Reason::CostModel(what))
    }
}

/// setfusion's per-row CPU list functions (`set_intersect_all` and friends),
/// ns per list element on the one thread that evaluates a batch: a copy,
/// an unstable sort and a merge (~15-40 ns measured on lists of 10-1000
/// random ints; the conservative end is taken so the GPU must win clearly).
const SF_LIST_CPU_NS: f64 = 15.0;
/// The host's ranking of string lists, ns per element, paid by both paths
/// (`algo::multiset::StringRanks`: one hash lookup per element, the
/// distinct strings sorted, the result's strings taken back; ~15-20 ns
/// measured on lists of 10-1000 short strings; batches of strings of at
/// most 7 bytes are keyed inline, for less, so this is the upper end).
const STRING_RANK_NS: f64 = 20.0;
/// String lists on the CPU: ranked, then the integer rules per row.
const SF_STRING_LIST_CPU_NS: f64 = SF_LIST_CPU_NS + STRING_RANK_NS;
/// The GPU list path's fixed cost per batch, ms: the batch is packed by its
/// partition's thread into pinned memory (`algo::list_pack`), then ~15
/// launches and two synchronisations (the result's offsets, then its
/// values). Measured on the H200 (BENCHMARKS 32): 1,233 batches of ~8.2M
/// elements in 2.71 s, 2.2 ms a batch with its transfers.
const GPU_LIST_FIXED_MS: f64 = 1.5;

/// The rule of the list functions (`set_intersect_all`, `set_except_all`,
/// `set_union_all`, `set_symmetric_difference`, `sorted_intersect`) for one
/// batch of `elements` list elements (both arguments): the per-row CPU path
/// against the segmented GPU kernels, which move each element up once (8
/// bytes) and each result element down once (counted as 8 more bytes per
/// input element). String lists (`strings`) are ranked on the host first,
/// on either path. A device still starting is not waited for.
pub fn list_function_estimate(elements: usize, strings: bool, readiness: &Readiness, cal: &Calibration) -> Decision {
    match readiness {
        Readiness::Unavailable(e) => return Decision::cpu(Reason::NoGpu(e.to_string())),
        Readiness::Starting(_) => return Decision::cpu(Reason::DeviceStarting),
        Readiness::Ready => {}
    }
    let n = elements as f64;
    let (cpu_ns, host_ns) = if strings { (SF_STRING_LIST_CPU_NS, STRING_RANK_NS) } else { (SF_LIST_CPU_NS, 0.0) };
    let cpu_ms = n * cpu_ns / 1e6;
    let gpu_ms = GPU_LIST_FIXED_MS + n * host_ns / 1e6 + n * 16.0 / (cal.upload_gbps * 1e9) * 1e3;
    let what = format!("{elements} list elements: GPU ~{gpu_ms:.1} ms, per-row CPU ~{cpu_ms:.1} ms");
    if gpu_ms * MARGIN < cpu_ms {
        Decision::gpu(Strategy::Auto, Reason::CostModel(what))
    } else {
        Decision::cpu(Reason::CostModel(what))
    }
}

// The similarity join's model (issue 29: moved here from planner/similarity.rs,
// so that one module holds every estimate). The sets' sizes are not known at
// plan time, so it weighs the threshold and the estimated pairs.

/// Below this many estimated pairs (|left| x |right|, about 5k x 5k sets)
/// the GPU's fixed cost (uploads, launches, a few syncs) exceeds the whole
/// CPU join: the SQL run on 4,000 DBLP sets took 24.9 ms on the CPU backend
/// and 30.6 ms with the GPU (BENCHMARKS.md section 2).
const MIN_GPU_PAIRS: f64 = 2.5e7;
/// Jaccard threshold from which the CPU backend is chosen. On the H100 (09:25
/// run, threaded plan step, GPU ms / 16-thread CPU ms; BENCHMARKS.md section
/// 2) the GPU won every measured cell of the 18k, 100k and 1M-set collections,
/// 0.9 included (DBLP 1.7 / 2.8, UNIFORM-100k 3.8 / 10.1, ZIPF-100k 4.2 / 6.9);
/// an earlier run of the kernel, with the serial plan step, lost at 0.9 on
/// DBLP and ZIPF. Above the highest measured threshold prefix filtering
/// leaves the CPU almost no candidates, so the CPU keeps 0.95 and up.
const JACCARD_CROSSOVER: f64 = 0.95;
/// Pairs of the largest measured collection (100k x 100k sets).
const CALIBRATED_PAIRS: f64 = 1e10;

/// The Jaccard threshold with the same prefix-filter selectivity: dice
/// d = 2j / (1 + j), so j = d / (2 - d); cosine is at least dice, so the dice
/// bound is used for it too. Overlap (an absolute count) has none.
fn jaccard_equivalent(t: &Threshold) -> Option<f64> {
    match t.metric {
        Metric::Jaccard => Some(t.value),
        Metric::Dice | Metric::Cosine => Some(t.value / (2.0 - t.value)),
        Metric::Overlap => None,
    }
}

/// The planning-time cost model, from what the rule knows: the metric and
/// threshold, and the estimated input rows (`pairs` = |left| x |right|, None
/// when either estimate is missing); the sets' sizes are not known before
/// execution. Calibrated on H100 measurements (GPU vs 16-thread CPU backend,
/// Jaccard self joins of 18k and 100k sets, see [`JACCARD_CROSSOVER`]):
///
/// * fewer than [`MIN_GPU_PAIRS`] estimated pairs: CPU (`size_floor`;
///   off when `setfusion.min_rows = 0` asks for the GPU at any size);
/// * otherwise CPU iff the Jaccard-equivalent threshold is at least the
///   crossover, 0.95 up to 100k x 100k pairs. CPU work grows with the pairs
///   and roughly halves with every +0.1 of threshold in the measurements, while the
///   GPU's fixed cost does not grow with them, so beyond the measured size the
///   crossover moves up by 0.1 per doubling of the pairs (so 1M x 1M sets go
///   to the GPU at any threshold; measured there: 7.6x at 0.9 on UNIFORM-1M,
///   2.7x on ZIPF-1M);
/// * overlap joins: GPU (no threshold scale to compare).
pub fn similarity_estimate(t: &Threshold, pairs: Option<f64>, size_floor: bool) -> Decision {
    let size = match pairs {
        Some(p) => format!("~{p:.1e} estimated pairs"),
        None => "unknown input size".to_string(),
    };
    if let (Some(p), true) = (pairs, size_floor) {
        if p < MIN_GPU_PAIRS {
            return Decision::cpu(Reason::CostModel(format!(
                "{size} < {MIN_GPU_PAIRS:.1e}: the GPU's fixed cost exceeds the CPU join"
            )));
        }
    }
    let Some(tj) = jaccard_equivalent(t) else {
        return Decision::gpu(Strategy::Auto, Reason::CostModel(format!("overlap join, {size}")));
    };
    let crossover = match pairs {
        Some(p) if p > CALIBRATED_PAIRS => JACCARD_CROSSOVER + 0.1 * (p / CALIBRATED_PAIRS).log2(),
        _ => JACCARD_CROSSOVER,
    };
    let what = if t.metric == Metric::Jaccard {
        format!("jaccard {}", t.value)
    } else {
        format!("{} {} (jaccard-equivalent {tj:.3})", t.metric.name(), t.value)
    };
    if tj >= crossover {
        Decision::cpu(Reason::CostModel(format!(
            "{what} >= crossover {crossover:.2} at {size}: the CPU prefix-filter join was faster there on the H100 measurements"
        )))
    } else {
        Decision::gpu(Strategy::Auto, Reason::CostModel(format!("{what} < crossover {crossover:.2} at {size}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn cand(op: SetOp, rows: usize, types: &[DataType]) -> Candidate<'_> {
        Candidate {
            op,
            rows: Some(rows),
            key_types: types,
            threads: 16,
            device_read: false,
            inflated: Default::default(),
            device_scans: false,
        }
    }

    /// A device-scanned input pays its last decode launch after the reads:
    /// TPC-H q16's anti join (1.62M rows) stays with DataFusion, 15M rows still go to the GPU.
    #[test]
    fn a_device_scan_counts_its_last_decode() {
        let cal = Calibration { upload_gbps: 40.0, start_ms: 300.0, measured: true };
        let int = [DataType::Int64];
        let scanned = |rows| Candidate { device_scans: true, ..cand(SetOp::Anti, rows, &int) };
        assert!(estimate(&cand(SetOp::Anti, 1_620_000, &int), &Readiness::Ready, &cal).on_gpu());
        let q16 = estimate(&scanned(1_620_000), &Readiness::Ready, &cal);
        assert!(!q16.on_gpu(), "{q16:?}");
        assert!(q16.reason.to_string().contains("ms of the device scan's last decode"), "{q16:?}");
        assert!(estimate(&scanned(15_000_000), &Readiness::Ready, &cal).on_gpu());
    }

    #[test]
    fn gpu_only_where_it_wins() {
        let cal = Calibration { upload_gbps: 40.0, start_ms: 300.0, measured: true };
        let int = [DataType::Int64];
        let gpu = |v: Decision| v.on_gpu();
        // Warm device: 200M keys go to the GPU; 10K rows stay with DataFusion.
        assert!(gpu(estimate(&cand(SetOp::Semi, 200_000_000, &int), &Readiness::Ready, &cal)));
        assert!(!gpu(estimate(&cand(SetOp::Semi, 10_000, &int), &Readiness::Ready, &cal)));
        // A TPC-H SF10-sized semi join (~15M rows): GPU when warm, not while the device starts.
        assert!(gpu(estimate(&cand(SetOp::Semi, 15_000_000, &int), &Readiness::Ready, &cal)));
        assert!(!gpu(estimate(
            &cand(SetOp::Semi, 15_000_000, &int),
            &Readiness::Starting(Duration::from_millis(50)),
            &cal
        )));
        // INTERSECT ALL's rival is setfusion's CPU backend, which streams 50M
        // integer keys in less than the start left: the GPU only once started.
        assert!(!gpu(estimate(
            &cand(SetOp::IntersectAll, 50_000_000, &int),
            &Readiness::Starting(Duration::from_millis(50)),
            &cal
        )));
        assert!(gpu(estimate(&cand(SetOp::IntersectAll, 50_000_000, &int), &Readiness::Ready, &cal)));
        assert!(!gpu(estimate(
            &cand(SetOp::IntersectAll, 10_000, &int),
            &Readiness::Starting(Duration::from_millis(50)),
            &cal
        )));
        // ... and a 1G-row one is worth waiting for.
        assert!(gpu(estimate(
            &cand(SetOp::IntersectAll, 1_000_000_000, &int),
            &Readiness::Starting(Duration::ZERO),
            &cal
        )));
        // One string column is hashed on the device, but its host work (the key
        // encoding, the output filter) costs as much a row as DataFusion's join on
        // 16 threads: TPC-H string_in at SF10 (18M rows) and SF1 stay with
        // DataFusion, as measured (0.47x on the device at SF10). A string
        // INTERSECT (DataFusion's aggregate and join) goes to the GPU at scale,
        // and a semi join with DataFusion on few threads.
        let s = [DataType::Utf8View];
        assert!(!gpu(estimate(&cand(SetOp::Semi, 18_000_000, &s), &Readiness::Ready, &cal)));
        // Both inputs Parquet, read by the device scan: the host neither encodes
        // the keys nor filters the output, and the semi join goes to the GPU.
        let read = Candidate { device_read: true, ..cand(SetOp::Semi, 18_000_000, &s) };
        assert!(gpu(estimate(&read, &Readiness::Ready, &cal)));
        assert!(!gpu(estimate(&cand(SetOp::Semi, 1_800_000, &s), &Readiness::Ready, &cal)));
        assert!(!gpu(estimate(&cand(SetOp::Semi, 100_000, &s), &Readiness::Ready, &cal)));
        assert!(gpu(estimate(&cand(SetOp::IntersectDistinct, 20_000_000, &s), &Readiness::Ready, &cal)));
        let few_threads = Candidate { threads: 4, ..cand(SetOp::Semi, 20_000_000, &s) };
        assert!(gpu(estimate(&few_threads, &Readiness::Ready, &cal)));
        let host = |bytes| crate::scan::InflatedBytes { host: bytes, device_zstd: 0 };
        let device = |bytes| crate::scan::InflatedBytes { host: 0, device_zstd: bytes };
        // Pages inflated on the host first (zstd under SETFUSION_DEVICE_ZSTD=0, gzip): a 100M-row probe side against
        // 1M keys whose three columns (2.4 GB) must be inflated stays with
        // DataFusion, whose light join hides under the inflation (measured
        // 0.92x on the device); the same join over snappy files goes to the
        // GPU, and so do 100M x 100M joins, whose DataFusion join outweighs
        // the inflation (IN 8.8x measured; NOT IN with its payload below).
        let zstd = |rows, bytes| Candidate { inflated: host(bytes), ..cand(SetOp::Semi, rows, &int) };
        assert!(!gpu(estimate(&zstd(101_000_000, 2_400_000_000), &Readiness::Ready, &cal)));
        assert!(gpu(estimate(&zstd(101_000_000, 0), &Readiness::Ready, &cal)));
        assert!(gpu(estimate(&zstd(200_000_000, 1_600_000_000), &Readiness::Ready, &cal)));
        let not_in = Candidate { inflated: host(2_400_000_000), ..cand(SetOp::Anti, 200_000_000, &int) };
        assert!(gpu(estimate(&not_in, &Readiness::Ready, &cal)));
        let why = estimate(&zstd(101_000_000, 2_400_000_000), &Readiness::Ready, &cal).reason.to_string();
        assert!(why.contains("of pages inflated first on host threads"), "{why}");
        // zstd pages decompressed by the device: 100M x 100M goes to the GPU
        // (IN 12.2x measured), and so does the probe side above, whose pages
        // DataFusion must inflate on its threads; 1M x 1M keys stay with
        // DataFusion (a launch lasts at least one page's decode, ~8 ms).
        let on_device = |rows, bytes| Candidate { inflated: device(bytes), ..cand(SetOp::Semi, rows, &int) };
        assert!(gpu(estimate(&on_device(200_000_000, 1_600_000_000), &Readiness::Ready, &cal)));
        assert!(gpu(estimate(&on_device(101_000_000, 2_400_000_000), &Readiness::Ready, &cal)));
        assert!(!gpu(estimate(&on_device(2_000_000, 16_000_000), &Readiness::Ready, &cal)));
        let why = estimate(&on_device(2_000_000, 16_000_000), &Readiness::Ready, &cal).reason.to_string();
        assert!(why.contains("of zstd pages decompressed on the device"), "{why}");
        // Composite keys with a wide decimal are row-encoded on the host: they lose to DataFusion at any size.
        let rc = [DataType::Utf8, DataType::Decimal128(38, 2)];
        assert!(!gpu(estimate(&cand(SetOp::Semi, 200_000_000, &rc), &Readiness::Ready, &cal)));
        // Unknown sizes and missing devices: DataFusion.
        let unknown = Candidate { rows: None, ..cand(SetOp::Semi, 0, &int) };
        assert!(!gpu(estimate(&unknown, &Readiness::Ready, &cal)));
        let unknown_all = Candidate { rows: None, ..cand(SetOp::ExceptAll, 0, &int) };
        assert!(gpu(estimate(&unknown_all, &Readiness::Ready, &cal)));
        let none = Readiness::Unavailable(crate::gpu::Unavailable::NoDriver);
        assert_eq!(
            estimate(&cand(SetOp::Semi, 1 << 30, &int), &none, &cal),
            Decision::cpu(Reason::NoGpu("no NVIDIA driver (libcuda.so not found)".into()))
        );
    }

    /// A device nobody started counts its whole start 1.5 times: 100M x 100M
    /// IN (and 100M x 50M) start it, as measured on the H100; a TPC-H SF10
    /// semi join (60M rows) keeps DataFusion's plan.
    #[test]
    fn a_device_nobody_started_is_weighed_from_scratch() {
        let cal = Calibration { upload_gbps: 46.8, start_ms: 221.0, measured: true };
        let from_scratch = not_started(&cal);
        assert!(estimate(&cand(SetOp::Semi, 200_000_000, &[DataType::Int64]), &from_scratch, &cal).on_gpu());
        assert!(estimate(&cand(SetOp::Semi, 150_000_000, &[DataType::Int64]), &from_scratch, &cal).on_gpu());
        let q4 = estimate(&cand(SetOp::Semi, 60_000_000, &[DataType::Int64]), &from_scratch, &cal);
        assert!(!q4.on_gpu());
        assert!(q4.reason.to_string().contains("incl. 332 ms of device start left"), "{}", q4.reason);
    }

    /// Composite keys of strings and exact columns are hashed column by column
    /// on the device: no host encoding is charged, only their columns' bytes,
    /// so they go to the GPU at scale and stay with DataFusion when small.
    #[test]
    fn composite_string_keys_are_charged_their_columns() {
        let cal = Calibration { upload_gbps: 40.0, start_ms: 300.0, measured: true };
        let gpu = |v: &Decision| v.on_gpu();
        let sc = [DataType::Utf8, DataType::Int64];
        let big = estimate(&cand(SetOp::Semi, 200_000_000, &sc), &Readiness::Ready, &cal);
        assert!(gpu(&big), "{big:?}");
        let why = big.reason.to_string();
        assert!(why.contains("hashed column by column") && !why.contains("row-encoded"), "{why}");
        assert!(gpu(&estimate(&cand(SetOp::IntersectDistinct, 18_000_000, &sc), &Readiness::Ready, &cal)));
        assert!(!gpu(&estimate(&cand(SetOp::Semi, 1_000_000, &sc), &Readiness::Ready, &cal)));
        // (date, string) as in TPC-H's set operations; dictionaries of strings count as strings.
        let ds = [
            DataType::Date32,
            DataType::Utf8View,
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
        ];
        assert!(gpu(&estimate(&cand(SetOp::ExceptDistinct, 50_000_000, &ds), &Readiness::Ready, &cal)));
        // Each string column costs more bytes than an exact one.
        assert!(column_hashed_row_bytes(&ds) > column_hashed_row_bytes(&sc));
        assert_eq!(column_hashed_row_bytes(&sc), GPU_STRING_ROW_BYTES + 16.0);
    }

    #[test]
    fn calibration_round_trip() {
        let c = Calibration::parse("# x\nupload_gbps = 41.5\nstart_ms=180\nbogus = 3\nstart_ms = -1\n");
        assert_eq!(c, Calibration { upload_gbps: 41.5, start_ms: 180.0, measured: true });
        assert!(!Calibration::parse("nothing here").measured);
    }

    #[test]
    fn list_functions_go_to_the_gpu_for_large_batches() {
        let cal = Calibration { upload_gbps: 40.0, start_ms: 300.0, measured: true };
        let gpu = |v: Decision| v.on_gpu();
        // A default 8192-row batch of lists of ~500 elements: the GPU; a few small rows: the CPU.
        assert!(gpu(list_function_estimate(8_000_000, false, &Readiness::Ready, &cal)));
        assert!(!gpu(list_function_estimate(20_000, false, &Readiness::Ready, &cal)));
        assert!(!gpu(list_function_estimate(8_000_000, false, &Readiness::Starting(Duration::ZERO), &cal)));
        let none = Readiness::Unavailable(crate::gpu::Unavailable::NoDriver);
        assert!(!gpu(list_function_estimate(1 << 30, false, &none, &cal)));
        // String lists: the host's ranking is paid, but the per-row string path is slower still.
        assert!(gpu(list_function_estimate(8_000_000, true, &Readiness::Ready, &cal)));
        assert!(!gpu(list_function_estimate(20_000, true, &Readiness::Ready, &cal)));
    }

    #[test]
    fn similarity_model_follows_the_measurements() {
        let cpu = |d: Decision| !d.on_gpu();
        let j = |t| Threshold::new(Metric::Jaccard, t);
        // Unknown size: the crossover.
        assert!(!cpu(similarity_estimate(&j(0.9), None, true)));
        assert!(cpu(similarity_estimate(&j(0.95), None, true)));
        // 18k and 100k self joins: GPU up to 0.9 (measured faster in every
        // cell), CPU from 0.95 (unmeasured; prefix filters leave ~no work).
        for n in [18_000f64, 100_000.0] {
            for t in [0.5, 0.6, 0.7, 0.8, 0.85, 0.9] {
                assert!(!cpu(similarity_estimate(&j(t), Some(n * n), true)), "{n} {t}");
            }
            assert!(cpu(similarity_estimate(&j(0.95), Some(n * n), true)));
            assert!(cpu(similarity_estimate(&j(1.0), Some(n * n), true)));
        }
        // Tiny inputs: CPU at any threshold, unless setfusion.min_rows = 0.
        assert!(cpu(similarity_estimate(&j(0.3), Some(1000.0 * 1000.0), true)));
        assert!(!cpu(similarity_estimate(&j(0.3), Some(1000.0 * 1000.0), false)));
        // 1M x 1M: the crossover passes 1.0 (extrapolated).
        assert!(!cpu(similarity_estimate(&j(0.9), Some(1e12), true)));
        // Dice / cosine compare in Jaccard terms; overlap goes to the GPU.
        // dice 0.98 ~ jaccard 0.961, dice 0.9 ~ jaccard 0.818, cosine 0.8 <= jaccard 0.667.
        assert!(cpu(similarity_estimate(&Threshold::new(Metric::Dice, 0.98), None, true)));
        assert!(!cpu(similarity_estimate(&Threshold::new(Metric::Dice, 0.9), None, true)));
        assert!(!cpu(similarity_estimate(&Threshold::new(Metric::Cosine, 0.8), None, true)));
        assert!(!cpu(similarity_estimate(&Threshold::new(Metric::Overlap, 3.0), Some(1e9), true)));
    }
}
