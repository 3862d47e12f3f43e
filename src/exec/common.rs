//! What several operators share, in a file of its own so that no operator's
//! file imports from another operator's (issue 29): the planner's choices every
//! operator is built with ([`Decision`], [`NullMode`]) and the task context
//! their inputs are executed with ([`input_context`]).
//!
//! One shape is shared by the operators rather than written here: each keeps
//! what it was planned with (inputs, key expressions, the [`Decision`], the
//! dynamic filter it publishes) in one `...Spec` behind an `Arc`, which the
//! node and every execution's private `Run` both hold. An execution reads the
//! node's choices, never a copy of them; the `Run` adds only its own state
//! (metrics, reservation, what ran). See `SetSelectSpec`, `MarkJoinSpec`,
//! `SimilaritySpec` and `FamiliesSpec`.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use datafusion::execution::TaskContext;

use crate::config::{SetfusionConfig, Strategy};

/// Where an operator runs, decided by `planner::decision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Gpu,
    /// setfusion's CPU backend, or DataFusion's own operator where the rule kept it.
    Cpu,
}

/// What `setfusion.min_rows` is compared with. One setting, three units, each
/// the size an operator's work grows with and the only one known where it
/// decides:
///
/// | operator | unit | when |
/// |---|---|---|
/// | set selections, semi / anti / mark joins, INTERSECT / EXCEPT | estimated rows of both inputs | plan time |
/// | similarity join | estimated rows of both inputs (the cost model then weighs pairs) | plan time |
/// | `families` table function | pairs of sets sharing an element | run time |
/// | list functions (`set_intersect_all`, ...) | list elements of a batch, both arguments | run time, per batch |
///
/// The comparison itself is written once, in [`below_min_rows`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Rows,
    Pairs,
    ListElements,
}

impl Unit {
    pub fn name(self) -> &'static str {
        match self {
            Unit::Rows => "estimated rows",
            Unit::Pairs => "pair(s)",
            Unit::ListElements => "list element(s)",
        }
    }
}

/// Why an operator runs where it does; EXPLAIN renders it ([`fmt::Display`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Reason {
    /// `setfusion.enabled = false`.
    Disabled,
    /// `setfusion.strategy = cpu`.
    StrategyCpu,
    /// An explicit GPU strategy (`hash`, `bitmap`, `sort`): the GPU whenever one is usable.
    StrategyForced(Strategy),
    /// `setfusion.min_rows = 0`: the GPU at any size.
    MinRowsZero,
    /// No usable device: the driver's or the device's own message.
    NoGpu(String),
    /// Key types the device does not take (which one, and why).
    UnsupportedKeys(String),
    /// Fewer than `setfusion.min_rows` of the operator's [`Unit`].
    BelowMinRows { count: u64, unit: Unit, min_rows: u64 },
    /// At least `setfusion.min_rows` of the operator's [`Unit`], and no cost model weighs more (`families`).
    AtLeastMinRows { count: u64, unit: Unit, min_rows: u64 },
    /// The cost model's estimate: the numbers it weighed, as the model writes them.
    CostModel(String),
    /// The device is still starting, and this decision does not wait for it.
    DeviceStarting,
    /// The cost model's estimate (its words) counted the start of device
    /// `device`, which nobody had started, and chose the CPU; the GPU would
    /// have won on a started device, so the device starts once this
    /// operator's output is done (`SetfusionDeclinedExec`), for the next queries.
    StartsAfterQuery { device: usize, estimate: String },
    /// A residual filter the device cannot evaluate (what stops it).
    HostFilter(String),
    /// Planned where no device was usable; this process (a Ballista executor) has one.
    DeviceOnExecutor,
    /// A predicate setfusion's operator does not decide as DataFusion does (why).
    UnsupportedPredicate(String),
    /// Above the probe side of a DataFusion hash join with a floating-point
    /// key: the join's dynamic filter of its build keys' bounds stops here
    /// (`planner::float_key_bounds`).
    FloatKeyBounds,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Disabled => write!(f, "setfusion.enabled = false"),
            Reason::StrategyCpu => write!(f, "setfusion.strategy = cpu"),
            Reason::StrategyForced(s) => write!(f, "setfusion.strategy = {s}"),
            Reason::MinRowsZero => write!(f, "setfusion.min_rows = 0"),
            Reason::NoGpu(why) => write!(f, "no GPU: {why}"),
            Reason::UnsupportedKeys(why) => write!(f, "{why}"),
            Reason::BelowMinRows { count, unit, min_rows } => {
                write!(f, "{count} {} < setfusion.min_rows = {min_rows}", unit.name())
            }
            Reason::AtLeastMinRows { count, unit, min_rows } => {
                write!(f, "{count} {} >= setfusion.min_rows = {min_rows}", unit.name())
            }
            Reason::CostModel(what) => write!(f, "cost model: {what}"),
            Reason::DeviceStarting => write!(f, "the device is still starting"),
            Reason::StartsAfterQuery { estimate, .. } => {
                write!(f, "cost model: {estimate}; the device starts after this query, for the next ones")
            }
            Reason::HostFilter(why) => write!(f, "residual filter on the host: {why}"),
            Reason::DeviceOnExecutor => write!(f, "planned without a device; this executor has one"),
            Reason::UnsupportedPredicate(why) => write!(f, "{why}"),
            Reason::FloatKeyBounds => write!(
                f,
                "float join keys: the hash join's dynamic filter compares its bounds in total order \
                 (-0.0 below 0.0, which the join equates), so it is not pushed below here"
            ),
        }
    }
}

/// The devices [`start_for_next_queries`] asked for, one bit each, started
/// when the next query is planned ([`start_pending_devices`]).
static STARTS_PENDING: AtomicU64 = AtomicU64::new(0);

/// Start device `device` for the next queries: an operator the cost model
/// kept off a device nobody had started ([`Reason::StartsAfterQuery`]) calls
/// this once its own work is done. The device starts when the next query is
/// planned ([`start_pending_devices`]), not now: a start beside the rest of
/// this query (the operators above, its output) slowed one-query TPC-H SF10
/// processes on the H200 by ~10 ms (`intersect_customers` 146 ms, 135 ms with
/// the GPU disabled, DataFusion 133 ms), and a one-query process never needs
/// the device.
pub fn start_for_next_queries(device: usize) {
    if device < 64 {
        STARTS_PENDING.fetch_or(1 << device, Ordering::AcqRel);
    }
}

/// Start, in the background, the devices [`start_for_next_queries`] asked for
/// (the planner's rules call this as a query is planned).
pub fn start_pending_devices() {
    let pending = STARTS_PENDING.swap(0, Ordering::AcqRel);
    for device in (0..64).filter(|d| (pending >> d) & 1 == 1) {
        crate::gpu::start_in_background(device, crate::algo::SET_SELECTION_KERNELS);
    }
}

/// [`start_for_next_queries`] where `decision` says the device starts after this query.
pub fn start_after_query(decision: &Decision) {
    if let Reason::StartsAfterQuery { device, .. } = decision.reason {
        start_for_next_queries(device);
    }
}

/// The planner's choice for one operator, UDF call or table function: where
/// it runs, the GPU strategy (`cpu` on the CPU) and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub backend: Backend,
    pub strategy: Strategy,
    pub reason: Reason,
}

impl Decision {
    pub fn cpu(reason: Reason) -> Self {
        Self { backend: Backend::Cpu, strategy: Strategy::Cpu, reason }
    }
    pub fn gpu(strategy: Strategy, reason: Reason) -> Self {
        Self { backend: Backend::Gpu, strategy, reason }
    }
    pub fn on_gpu(&self) -> bool {
        self.backend == Backend::Gpu
    }
}

/// EXPLAIN's words: `backend=gpu, strategy=auto, reason="..."` or `backend=cpu, reason="..."`.
impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.backend {
            Backend::Gpu => write!(f, "backend=gpu, strategy={}, reason=\"{}\"", self.strategy, self.reason),
            Backend::Cpu => write!(f, "backend=cpu, reason=\"{}\"", self.reason),
        }
    }
}

/// The one comparison with `setfusion.min_rows` (see [`Unit`] for what each
/// operator counts): the reason for the CPU when `count` is below it.
pub fn below_min_rows(cfg: &SetfusionConfig, count: u64, unit: Unit) -> Option<Reason> {
    (count < cfg.min_rows as u64).then_some(Reason::BelowMinRows { count, unit, min_rows: cfg.min_rows as u64 })
}

/// The decision made at run time, for work whose size is only known
/// then (the other run-time rule, [`device_finishes_first`], only hands a
/// planned GPU join over once the device is up): the `families` operator's pairs (counted from its inputs' sets) and
/// the list functions' elements (a batch at a time). `planner::decision` is
/// where everything else is decided; this function lives here, beside the
/// types, because the families operator (`exec`) may not import the planner.
/// The rule: `strategy = cpu` never takes the device; `auto` takes it from
/// `setfusion.min_rows` of `unit` where `cost` (the cost model's rule for the
/// caller; not asked when `min_rows = 0`) does not say otherwise; `hash` /
/// `bitmap` / `sort` take it whenever one is usable (waiting for its start).
/// `Ok`: the device, with the decision's reason; `Err`: the CPU decision.
pub fn decide_at_run_time(
    cfg: &SetfusionConfig,
    count: usize,
    unit: Unit,
    cost: impl FnOnce() -> Decision,
) -> Result<(Arc<crate::gpu::Gpu>, Decision), Decision> {
    let decision = match cfg.strategy {
        Strategy::Cpu => return Err(Decision::cpu(Reason::StrategyCpu)),
        Strategy::Auto => {
            if let Some(reason) = below_min_rows(cfg, count as u64, unit) {
                return Err(Decision::cpu(reason));
            }
            if cfg.min_rows > 0 {
                let d = cost();
                if !d.on_gpu() {
                    return Err(d);
                }
                d
            } else {
                Decision::gpu(Strategy::Auto, Reason::MinRowsZero)
            }
        }
        s => {
            crate::gpu::wait_started(cfg.device);
            Decision::gpu(s, Reason::StrategyForced(s))
        }
    };
    match crate::gpu::gpu(cfg.device) {
        Ok(g) => Ok((g, decision)),
        Err(e) => Err(Decision::cpu(Reason::NoGpu(e.to_string()))),
    }
}

/// The device join's fixed cost on a device that has just started (a fresh
/// process's first join: its first device allocations, the upload, the
/// launches, the pairs' download), ms. Measured on the H100: UNIFORM-100k at
/// Jaccard 0.5, handed over 56 ms into the host's work, ended ~54 ms later,
/// against 5 ms for the same join warm; at 5 ms, joins of 5-10 ms on the host
/// were handed over and lost 7-30 ms (BENCHMARKS section 28). On the H200
/// a ZIPF-100k join at 0.7 handed over lost ~50 ms to the host's ~55 ms
/// left (BENCHMARKS section 47): ~100 ms there.
const GPU_JOIN_FIXED_MS: f64 = 80.0;
/// The host's join is watched this long before its progress is extrapolated
/// (the first chunks tell nothing: the first question came with nothing
/// done, which handed every join to a device ready by then, 60 ms joins too).
pub const HANDOVER_OBSERVE_MS: f64 = 10.0;
/// The GPU join's speed over the CPU join's, at least, on joins long enough
/// to matter: 9.7-37x where the CPU join took 24 ms or more, 1.4-5x on the
/// 3-16 ms joins of high thresholds (BENCHMARKS section 2). The fixed cost
/// above covers the short ones.
const GPU_JOIN_MIN_SPEEDUP: f64 = 4.0;

/// The other run-time rule: should the similarity join's host join (run
/// while the device started, `exec::similarity_join`), having joined for
/// `joined_ms` and handed out `done` of its probe side's elements, stop for
/// the device, now ready? Yes when the work left (extrapolated from the work
/// done) takes longer than the whole join would on a just-started device.
/// None before [`HANDOVER_OBSERVE_MS`]: too early to say. Nothing done by
/// then: the plan's choice, the device, stands.
pub fn device_finishes_first(joined_ms: f64, done: f64) -> Option<bool> {
    device_finishes_first_after(0.0, joined_ms, done)
}

/// The similarity join's rule for a device nobody has started yet: should
/// the host's join, having joined for `joined_ms` and handed out `done` of
/// its probe elements, start the device now? Yes when a device started now,
/// ready `start_ms` later (the calibration's fresh start), would still finish
/// first ([`device_finishes_first`] after the start). So a join the host
/// finishes first never pays for a start beside it (on the H200 a start
/// beside the 100k collections' 60-230 ms host joins, made at planning, cost
/// them 8-24 ms: 0.76-0.93x the CPU backend in fresh processes, issue 31),
/// and a long join still ends on the device.
pub fn device_worth_starting(joined_ms: f64, done: f64, start_ms: f64) -> Option<bool> {
    device_finishes_first_after(start_ms, joined_ms, done)
}

/// Would a device ready `wait_ms` from now finish the host's join first?
fn device_finishes_first_after(wait_ms: f64, joined_ms: f64, done: f64) -> Option<bool> {
    if joined_ms < HANDOVER_OBSERVE_MS {
        return None;
    }
    if done <= 0.0 {
        return Some(true);
    }
    let left_ms = joined_ms * (1.0 - done) / done;
    Some(left_ms > wait_ms + GPU_JOIN_FIXED_MS + (joined_ms + left_ms) / GPU_JOIN_MIN_SPEEDUP)
}

/// NULL semantics of the keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NullMode {
    /// Equi-join: a NULL key matches nothing.
    NeverEqual,
    /// Set operations (and IS NOT DISTINCT FROM joins): NULL equals NULL.
    Equal,
    /// NOT IN: SQL three-valued logic (any NULL on the other side, or a NULL
    /// kept-side key, removes the row unless the other side is empty).
    NullAware,
}

/// The inputs are executed with at least this batch size. The operators read
/// all of both inputs before they output a row, so their batch size only sets
/// how many batches they handle, each with its own bookkeeping (key arrays,
/// selection slices, packing pieces): a 100M-row in-memory table comes as
/// 12,288 batches of 8,192 rows (DataSourceExec splits its 65,536-row batches
/// to the session's batch size), or as 1,536.
const INPUT_BATCH_ROWS: usize = 1 << 16;

/// `context` with a session batch size of at least [`INPUT_BATCH_ROWS`], for executing the inputs.
pub(crate) fn input_context(context: &Arc<TaskContext>) -> Arc<TaskContext> {
    let config = context.session_config();
    if config.batch_size() >= INPUT_BATCH_ROWS {
        return context.clone();
    }
    with_session_config(context, config.clone().with_batch_size(INPUT_BATCH_ROWS))
}

/// `context` with `config` for its session's settings (the one place a task context is rebuilt).
pub(crate) fn with_session_config(
    context: &Arc<TaskContext>,
    config: datafusion::execution::config::SessionConfig,
) -> Arc<TaskContext> {
    Arc::new(TaskContext::new(
        context.task_id(),
        context.session_id(),
        config,
        context.scalar_functions().clone(),
        context.higher_order_functions().clone(),
        context.aggregate_functions().clone(),
        context.window_functions().clone(),
        context.runtime_env(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_takes_over_only_where_it_finishes_first() {
        // Too early to extrapolate: ask again.
        assert_eq!(device_finishes_first(0.0, 0.0), None);
        assert_eq!(device_finishes_first(5.0, 0.1), None);
        // Watched long enough with nothing handed out: the plan's choice stands.
        assert_eq!(device_finishes_first(HANDOVER_OBSERVE_MS, 0.0), Some(true));
        // A tenth done in 40 ms: 360 ms left on the host against ~180 on the device.
        assert_eq!(device_finishes_first(40.0, 0.1), Some(true));
        // A twentieth done in 20 ms: 380 ms left.
        assert_eq!(device_finishes_first(20.0, 0.05), Some(true));
        // Nine tenths done: 4.4 ms left, the device's fixed cost alone is more.
        assert_eq!(device_finishes_first(40.0, 0.9), Some(false));
        // A fifth done in 12 ms: a 60 ms join, 48 ms left, stays on the host.
        assert_eq!(device_finishes_first(12.0, 0.2), Some(false));
    }

    #[test]
    fn a_device_starts_only_for_a_join_that_outlasts_its_start() {
        let start_ms = 200.0;
        assert_eq!(device_worth_starting(5.0, 0.01, start_ms), None);
        // The 100k collections' host joins (60-230 ms): a tenth in 20 ms, 180 ms left,
        // less than the start, the device's fixed cost and its share.
        assert_eq!(device_worth_starting(20.0, 0.1, start_ms), Some(false));
        // A 3.5 s join (DBLP x5 at 0.5): a fortieth in 88 ms.
        assert_eq!(device_worth_starting(88.0, 0.025, start_ms), Some(true));
        // A 0.3 s join: stays on the host.
        assert_eq!(device_worth_starting(30.0, 0.1, start_ms), Some(false));
        // A ready device takes over what a starting one would not.
        assert_eq!(device_finishes_first(30.0, 0.1), Some(true));
        // Uncalibrated (a 550 ms start): a 0.8 s join stays on the host, a 2 s one starts it.
        assert_eq!(device_worth_starting(40.0, 0.05, 550.0), Some(false));
        assert_eq!(device_worth_starting(50.0, 0.025, 550.0), Some(true));
    }
}
