//! The GPU-or-CPU decision (issue 29): every operator, UDF and table function
//! asks here, and gets a [`Decision`] (backend, strategy, [`Reason`]) that
//! EXPLAIN renders. The numbers come from one cost model ([`super::cost`]);
//! `setfusion.min_rows` is compared in one place
//! ([`crate::exec::common::below_min_rows`], whose [`Unit`] table says what
//! each operator counts).
//!
//! At plan time: set selections, semi / anti / mark joins, INTERSECT /
//! EXCEPT ([`decide`], [`decide_filtered`]) and the similarity join
//! ([`decide_similarity`]). At run time, for work whose size the plan does
//! not know: the list functions' batches ([`list_function`], [`k_way`]) and
//! the `families` operator's pairs, both through the one runtime rule
//! [`decide_at_run_time`] (which lives beside the types in `exec::common`,
//! since the families operator may not import the planner). Beside it there,
//! [`crate::exec::common::device_finishes_first`] says when a similarity
//! join planned onto a device that was still starting, and begun on the
//! host meanwhile, is handed to the device.
//!
//! The order of the rules, for every caller: settings and key types that
//! rule the GPU out ([`forced_cpu`]); no usable device; a forced GPU
//! (`hash` / `bitmap` / `sort`, or `min_rows = 0`); `min_rows`; the cost
//! model.

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::physical_plan::ExecutionPlan;

use super::cost;
use crate::algo::select::SetOp;
use crate::algo::ssjoin::Threshold;
use crate::config::{SetfusionConfig, Strategy};
use crate::gpu::Gpu;

pub use crate::exec::common::{below_min_rows, decide_at_run_time, Backend, Decision, Reason, Unit};

/// The reasons for the CPU that need no estimate: settings and key types.
fn forced_cpu(cfg: &SetfusionConfig, key_types: &[DataType]) -> Option<Reason> {
    if !cfg.enabled {
        return Some(Reason::Disabled);
    }
    if cfg.strategy == Strategy::Cpu {
        return Some(Reason::StrategyCpu);
    }
    crate::keys::unsupported_reason(key_types).map(Reason::UnsupportedKeys)
}

/// An explicit GPU strategy or `min_rows = 0`: the GPU whenever one is usable.
fn forced_gpu(cfg: &SetfusionConfig) -> Option<Reason> {
    if cfg.strategy != Strategy::Auto {
        Some(Reason::StrategyForced(cfg.strategy))
    } else if cfg.min_rows == 0 {
        Some(Reason::MinRowsZero)
    } else {
        None
    }
}

/// A set selection's backend (semi / anti join, INTERSECT / EXCEPT, a mark
/// join without a residual filter). On the CPU, the rule keeps DataFusion's
/// own operator where that one is right (with a `SetfusionDeclinedExec`
/// saying why), setfusion's CPU backend otherwise (INTERSECT / EXCEPT ALL,
/// `strategy = cpu`).
///
/// An explicit GPU strategy (`hash`, `bitmap`, `sort`) or `min_rows = 0` takes
/// the GPU whenever one is usable, waiting for its start; otherwise inputs
/// under `min_rows` rows stay on the CPU and the cost model ([`cost::estimate`])
/// decides, without waiting for a device that is still starting.
pub fn decide(
    cfg: &SetfusionConfig,
    op: SetOp,
    a: &Arc<dyn ExecutionPlan>,
    b: &Arc<dyn ExecutionPlan>,
    key_types: &[DataType],
    threads: usize,
) -> Decision {
    decide_reading(cfg, op, a, b, key_types, threads, Reading::default())
}

/// How an operator's inputs would be read, as the device scan rule would
/// read them (`planner::device_scan::reading`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reading {
    /// The device scan reads both inputs (their keys, and the kept side's
    /// output columns): string keys then cost no host encoding and no host
    /// output filter.
    pub device_read: bool,
    /// The inputs' Parquet pages inflated on host threads before the
    /// selection, and the ZSTD pages the device decompresses
    /// ([`cost::Candidate::inflated`]).
    pub inflated: crate::scan::InflatedBytes,
    /// The device scan reads an input (its last decode runs after the reads).
    pub device_scans: bool,
}

/// [`decide`], with the inputs read as `reading` says.
pub fn decide_reading(
    cfg: &SetfusionConfig,
    op: SetOp,
    a: &Arc<dyn ExecutionPlan>,
    b: &Arc<dyn ExecutionPlan>,
    key_types: &[DataType],
    threads: usize,
    reading: Reading,
) -> Decision {
    let Reading { device_read, inflated, device_scans } = reading;
    if let Some(reason) = forced_cpu(cfg, key_types) {
        return Decision::cpu(reason);
    }
    let forced = forced_gpu(cfg);
    if forced.is_some() {
        crate::gpu::wait_started(cfg.device);
    }
    // A forced GPU opens the device now; otherwise a device nobody started
    // is weighed as starting from scratch, and started only if chosen.
    let started = if forced.is_some() {
        Some(crate::gpu::readiness(cfg.device))
    } else {
        crate::gpu::readiness_if_started(cfg.device)
    };
    if let Some(crate::gpu::Readiness::Unavailable(e)) = &started {
        return Decision::cpu(Reason::NoGpu(e.to_string()));
    }
    if let Some(why) = forced {
        return Decision::gpu(cfg.strategy, why);
    }
    let rows = super::estimated_input_rows(a, b);
    if let Some(reason) = rows.and_then(|n| below_min_rows(cfg, n as u64, Unit::Rows)) {
        return Decision::cpu(reason);
    }
    // Costed as encoded: a dictionary as its values (string dictionaries as views).
    let encoded: Vec<DataType> = key_types.iter().map(crate::keys::key_type).collect();
    let candidate = cost::Candidate { op, rows, key_types: &encoded, threads, device_read, inflated, device_scans };
    let calibration = cost::Calibration::current();
    let Some(readiness) = started else {
        let from_scratch = cost::not_started(&calibration);
        let d = cost::estimate(&candidate, &from_scratch, &calibration);
        if d.on_gpu() {
            crate::gpu::start_for_query(cfg.device, &crate::algo::QUERY_KERNELS);
            return d;
        }
        // Would a started device win? Then it starts once this query has run.
        return match (cost::estimate(&candidate, &crate::gpu::Readiness::Ready, &calibration).on_gpu(), d.reason) {
            (true, Reason::CostModel(estimate)) => {
                Decision::cpu(Reason::StartsAfterQuery { device: cfg.device, estimate })
            }
            (_, reason) => Decision::cpu(reason),
        };
    };
    cost::estimate(&candidate, &readiness, &calibration)
}

/// [`decide`] for a semi / anti / mark join with a residual filter. The GPU
/// finds each probe row's group (fixed-width correlation keys) and evaluates
/// the filter when it compiles to a device program
/// ([`crate::exec::pair_filter`]). Without that, only a forced GPU strategy
/// or `min_rows = 0` takes the device (it then finds the groups, and the host
/// evaluates the filter); otherwise the CPU, with the reason. The cost model
/// weighs the correlation keys and the filter's columns, all of which travel.
pub fn decide_filtered(
    cfg: &SetfusionConfig,
    a: &Arc<dyn ExecutionPlan>,
    b: &Arc<dyn ExecutionPlan>,
    on_types: &[DataType],
    filter: &crate::exec::pair_filter::PairFilter,
    in_types: Option<(&DataType, &DataType)>,
    threads: usize,
) -> Decision {
    let device = if on_types.iter().all(|t| crate::keys::is_exact(std::slice::from_ref(t))) {
        crate::exec::pair_filter::compile(filter, in_types).map(|_| ())
    } else {
        Err(format!("correlation keys {on_types:?} are not fixed-width"))
    };
    let mut types = on_types.to_vec();
    types.extend(in_types.map(|(p, _)| p.clone()));
    types.extend(filter.schema.fields().iter().map(|f| f.data_type().clone()));
    let d = decide(cfg, SetOp::Semi, a, b, &types, threads);
    match device {
        Err(why) if d.on_gpu() && forced_gpu(cfg).is_none() => Decision::cpu(Reason::HostFilter(why)),
        _ => d,
    }
}

/// The similarity join's backend: settings, the device, `min_rows` on the
/// estimated rows of both inputs, then, under `auto`, the similarity cost
/// model ([`cost::similarity_estimate`]) on the threshold and the estimated
/// pairs (its size floor off when `min_rows = 0`).
///
/// Only an explicit GPU strategy opens the device here and waits for it.
/// Under `auto`, a device nobody started is not waited for at planning: a
/// GPU choice over large inputs ([`SIMILARITY_START_AT_PLANNING_ROWS`])
/// starts it in the background, beside the scans and the sets' encoding,
/// smaller ones leave the start to the join, and the join itself does not
/// wait for a start that is not done
/// ([`crate::exec::similarity_join::join_sets`]: the host joins
/// meanwhile). Before, planning opened the device, so a fresh process paid
/// the whole start (~250-600 ms) before its first scan.
pub fn decide_similarity(
    cfg: &SetfusionConfig,
    threshold: &Threshold,
    left: &Arc<dyn ExecutionPlan>,
    right: &Arc<dyn ExecutionPlan>,
) -> Decision {
    if let Some(reason) = forced_cpu(cfg, &[]) {
        return Decision::cpu(reason);
    }
    let forced = cfg.strategy != Strategy::Auto;
    let started =
        if forced { Some(crate::gpu::readiness(cfg.device)) } else { crate::gpu::readiness_if_started(cfg.device) };
    if let Some(crate::gpu::Readiness::Unavailable(e)) = &started {
        return Decision::cpu(Reason::NoGpu(e.to_string()));
    }
    let rows = super::estimated_input_rows(left, right);
    if let Some(reason) = rows.and_then(|n| below_min_rows(cfg, n as u64, Unit::Rows)) {
        return Decision::cpu(reason);
    }
    if forced {
        return Decision::gpu(cfg.strategy, Reason::StrategyForced(cfg.strategy));
    }
    let pairs = super::estimated_rows(left).zip(super::estimated_rows(right)).map(|(l, r)| l as f64 * r as f64);
    let mut d = cost::similarity_estimate(threshold, pairs, cfg.min_rows > 0);
    if d.on_gpu() && started.is_none() {
        let at_planning = crate::env::ssjoin_start_at_planning_rows().unwrap_or(SIMILARITY_START_AT_PLANNING_ROWS);
        let how = if rows.is_some_and(|n| n >= at_planning) {
            crate::gpu::start_for_query(cfg.device, &crate::algo::SIMILARITY_KERNELS);
            "; the device starts now, and the host joins until it is ready"
        } else {
            "; the host joins, and starts the device once its join would outlast the start"
        };
        if let Reason::CostModel(why) = &mut d.reason {
            why.push_str(how);
        }
    }
    d
}

/// A similarity join of this many input rows or more (both sides) starts a
/// device nobody started as it is planned, beside the scans: its sets may be
/// too many to preprocess on the host while the device starts
/// (`exec::similarity_join`'s `HOST_PREP_MAX_ELEMENTS`; the 1M-set
/// collections' 30M elements wait for the device). Smaller joins leave the
/// start to the host's join, which starts the device only once it would
/// outlast the start: a start beside the scans and a 60-230 ms host join
/// cost the 100k-set collections 8-24 ms in one-query processes on the H200
/// (0.76-0.93x the CPU backend, issue 31), and their joins never needed it.
const SIMILARITY_START_AT_PLANNING_ROWS: usize = 1_000_000;

/// The device for one batch of a list function (`set_intersect_all` and
/// friends) of `elements` list elements, both arguments (of strings when
/// `strings`), or the CPU decision: [`decide_at_run_time`] with the list
/// cost rule ([`cost::list_function_estimate`]: no usable device, a device
/// still starting, small batches stay on the CPU). Per batch: the batch
/// sizes are only known at run time.
pub fn list_function(cfg: &SetfusionConfig, elements: usize, strings: bool) -> Result<(Arc<Gpu>, Decision), Decision> {
    decide_at_run_time(cfg, elements, Unit::ListElements, || {
        cost::list_function_estimate(elements, strings, &readiness_starting(cfg), &cost::Calibration::current())
    })
}

/// The device's readiness for a run-time decision, never waiting: a device
/// nobody started starts now in the background (this batch stays on the CPU).
fn readiness_starting(cfg: &SetfusionConfig) -> crate::gpu::Readiness {
    crate::gpu::readiness_if_started(cfg.device).unwrap_or_else(|| {
        crate::gpu::start_in_background(cfg.device, crate::algo::SET_SELECTION_KERNELS);
        crate::gpu::Readiness::Starting(std::time::Duration::ZERO)
    })
}

/// `set_intersect_agg`'s inputs (all lists of a batch and the running
/// intersection) from this many elements in total go to the device.
pub const KWAY_GPU_MIN_ELEMENTS: usize = 1 << 22;

/// The device for `set_intersect_agg`'s k-way intersection of `total`
/// elements, or the CPU decision: [`decide_at_run_time`] with its own size
/// rule ([`KWAY_GPU_MIN_ELEMENTS`], a ready device).
pub fn k_way(cfg: &SetfusionConfig, total: usize) -> Result<(Arc<Gpu>, Decision), Decision> {
    decide_at_run_time(cfg, total, Unit::ListElements, || {
        if total < KWAY_GPU_MIN_ELEMENTS {
            Decision::cpu(Reason::CostModel(format!("{total} list elements < {KWAY_GPU_MIN_ELEMENTS}")))
        } else if !matches!(readiness_starting(cfg), crate::gpu::Readiness::Ready) {
            Decision::cpu(Reason::DeviceStarting)
        } else {
            Decision::gpu(
                Strategy::Auto,
                Reason::CostModel(format!("{total} list elements >= {KWAY_GPU_MIN_ELEMENTS}")),
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// EXPLAIN's words for each kind of reason.
    #[test]
    fn reasons_render_for_explain() {
        let cpu = |r: Reason| Decision::cpu(r).to_string();
        assert_eq!(cpu(Reason::StrategyCpu), "backend=cpu, reason=\"setfusion.strategy = cpu\"");
        assert_eq!(
            cpu(Reason::NoGpu("no NVIDIA driver (libcuda.so not found)".into())),
            "backend=cpu, reason=\"no GPU: no NVIDIA driver (libcuda.so not found)\""
        );
        assert_eq!(
            cpu(Reason::BelowMinRows { count: 12, unit: Unit::Rows, min_rows: 100_000 }),
            "backend=cpu, reason=\"12 estimated rows < setfusion.min_rows = 100000\""
        );
        assert_eq!(
            cpu(Reason::BelowMinRows { count: 3, unit: Unit::Pairs, min_rows: 10 }),
            "backend=cpu, reason=\"3 pair(s) < setfusion.min_rows = 10\""
        );
        assert_eq!(
            Decision::gpu(Strategy::Hash, Reason::StrategyForced(Strategy::Hash)).to_string(),
            "backend=gpu, strategy=hash, reason=\"setfusion.strategy = hash\""
        );
        assert_eq!(Reason::CostModel("x".into()).to_string(), "cost model: x");
        assert_eq!(
            Reason::StartsAfterQuery { device: 0, estimate: "x".into() }.to_string(),
            "cost model: x; the device starts after this query, for the next ones"
        );
    }

    /// The runtime rule: `cpu` never, `auto` from `min_rows` where the cost
    /// rule agrees, the cost rule not asked under `min_rows = 0`.
    #[test]
    fn runtime_rule() {
        let cfg = |strategy, min_rows| SetfusionConfig { strategy, min_rows, ..SetfusionConfig::default() };
        let never = || -> Decision { panic!("the cost rule is not asked") };
        let d = decide_at_run_time(&cfg(Strategy::Cpu, 0), 1 << 30, Unit::Pairs, never).unwrap_err();
        assert_eq!(d.reason, Reason::StrategyCpu);
        let d = decide_at_run_time(&cfg(Strategy::Auto, 100), 99, Unit::ListElements, never).unwrap_err();
        assert_eq!(d.reason, Reason::BelowMinRows { count: 99, unit: Unit::ListElements, min_rows: 100 });
        let no = || Decision::cpu(Reason::CostModel("no".into()));
        let d = decide_at_run_time(&cfg(Strategy::Auto, 100), 100, Unit::ListElements, no).unwrap_err();
        assert_eq!(d.reason, Reason::CostModel("no".into()));
        // With the device allowed, the answer is the device or, without one, why not.
        match decide_at_run_time(&cfg(Strategy::Auto, 0), 1, Unit::Rows, never) {
            Ok((_, d)) => assert_eq!(d.reason, Reason::MinRowsZero),
            Err(d) => assert!(matches!(d.reason, Reason::NoGpu(_)), "{d:?}"),
        }
    }

    /// EXPLAIN of a candidate says where it runs and why, also when setfusion
    /// keeps DataFusion's operator: without a GPU, the driver's message; with
    /// one, these few rows are below `min_rows`.
    #[tokio::test]
    async fn explain_always_says_where_and_why() {
        let ctx = crate::context();
        for ddl in ["CREATE TABLE a(k BIGINT) AS VALUES (1), (2), (3)", "CREATE TABLE b(k BIGINT) AS VALUES (2), (3)"] {
            ctx.sql(ddl).await.unwrap().collect().await.unwrap();
        }
        let want = match crate::gpu::available(0) {
            Err(e) => format!("backend=cpu, reason=\"no GPU: {e}\""),
            Ok(()) => "estimated rows < setfusion.min_rows = 100000\"".to_string(),
        };
        for sql in [
            "SELECT k FROM a WHERE k IN (SELECT k FROM b)",
            "SELECT k FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE a.k = b.k AND b.k > 2)",
            "SELECT k FROM a INTERSECT SELECT k FROM b",
            "SELECT k FROM a EXCEPT ALL SELECT k FROM b",
        ] {
            let batches = ctx.sql(&format!("EXPLAIN {sql}")).await.unwrap().collect().await.unwrap();
            let plan = datafusion::arrow::util::pretty::pretty_format_batches(&batches).unwrap().to_string();
            assert!(plan.contains(&want), "{sql}: no {want} in\n{plan}");
        }
    }
}
