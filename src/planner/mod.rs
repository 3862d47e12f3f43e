//! Planning: the logical step that gives INTERSECT ALL / EXCEPT ALL their exact
//! multiset semantics, and the physical rule that puts setfusion operators in
//! place of DataFusion's semi/anti joins.

pub mod cost;
mod device_scan;
mod mark_join;
mod outer_decorrelate;
mod quantified;
mod semi_join;
mod set_ops;
mod similarity;

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::physical_plan::ExecutionPlan;

use crate::algo::select::SetOp;
use crate::config::{SetfusionConfig, Strategy};
use crate::exec::common::Backend;

pub use device_scan::DeviceScanRule;
pub use mark_join::{MarkJoinNode, MarkJoinPlanner, MarkJoinRule};
pub use semi_join::SemiJoinRule;
pub use set_ops::{SetOpNode, SetOpPlanner, SetOpRule, SetfusionQueryPlanner};
pub use similarity::SimilarityJoinRule;

/// Estimated rows of a plan (None when unknown). A node without an estimate
/// whose only input has one (an aggregate, a projection) is bounded by it:
/// none of those nodes adds rows.
pub fn estimated_rows(plan: &Arc<dyn ExecutionPlan>) -> Option<usize> {
    // DataFusion 55 computes statistics bottom-up through StatisticsContext; the
    // deprecated per-node `partition_statistics` answers "unknown" for most nodes.
    // One context for the whole walk: it caches every node it computed.
    rows_or_bound(plan, &datafusion::physical_plan::statistics::StatisticsContext::new())
}

fn rows_or_bound(
    plan: &Arc<dyn ExecutionPlan>,
    ctx: &datafusion::physical_plan::statistics::StatisticsContext,
) -> Option<usize> {
    let stats = ctx.compute(plan.as_ref(), &datafusion::physical_plan::statistics::StatisticsArgs::new()).ok();
    if let Some(n) = stats.and_then(|s| s.num_rows.get_value().copied()) {
        return Some(n);
    }
    // A semi / anti join, setfusion's selections and mark joins keep at most the
    // rows of their probe side; a declined note passes its child through.
    if let Some(side) = kept_side(plan) {
        return rows_or_bound(plan.children()[side], ctx);
    }
    let bounded = plan.name().starts_with("Aggregate")
        || plan.name().starts_with("Projection")
        || plan.name().starts_with("Filter")
        || plan.name().starts_with("Repartition")
        || plan.name().starts_with("Coalesce")
        || plan.name().starts_with("Sort");
    match plan.children().as_slice() {
        [child] if bounded => rows_or_bound(child, ctx),
        _ => None,
    }
}

/// The child whose rows bound a node's output, for joins that only keep rows.
fn kept_side(plan: &Arc<dyn ExecutionPlan>) -> Option<usize> {
    use datafusion::common::JoinType::*;
    use datafusion::physical_plan::joins::{HashJoinExec, SortMergeJoinExec};
    let join_type = if let Some(j) = plan.downcast_ref::<HashJoinExec>() {
        Some(*j.join_type())
    } else {
        plan.downcast_ref::<SortMergeJoinExec>().map(|j| j.join_type())
    };
    match join_type {
        Some(LeftSemi | LeftAnti | LeftMark) => Some(0),
        Some(RightSemi | RightAnti | RightMark) => Some(1),
        Some(_) => None,
        None => match plan.name() {
            "SetfusionDeclinedExec" | "MarkJoinExec" | "SemiJoinExec" => Some(0),
            _ => None,
        },
    }
}

/// Estimated rows of both inputs of an operator together (None if either is unknown).
pub fn estimated_input_rows(a: &Arc<dyn ExecutionPlan>, b: &Arc<dyn ExecutionPlan>) -> Option<usize> {
    Some(estimated_rows(a)? + estimated_rows(b)?)
}

/// Apply a plan rewrite bottom-up when setfusion is enabled (the body of every setfusion physical rule).
pub fn rewrite_when_enabled(
    plan: Arc<dyn ExecutionPlan>,
    config: &datafusion::config::ConfigOptions,
    rewrite: impl Fn(
        Arc<dyn ExecutionPlan>,
        &SetfusionConfig,
    ) -> datafusion::error::Result<datafusion::common::tree_node::Transformed<Arc<dyn ExecutionPlan>>>,
) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
    use datafusion::common::tree_node::TreeNode;
    let cfg = SetfusionConfig::from_options(config);
    if !cfg.enabled {
        return Ok(plan);
    }
    plan.transform_up(|p| rewrite(p, &cfg)).map(|t| t.data)
}

/// The physical plan of `plan`, a subtree of the plan being built, optimized
/// without DataFusion's last filter pushdown (the one that creates dynamic
/// filters): the whole plan is optimized again afterwards, and a hash join
/// whose dynamic filter already exists makes the second JoinSelection fail
/// ("Cannot swap HashJoinExec inputs after dynamic filters have been
/// constructed"; a kept LeftMark join under NOT EXISTS with a `<>` filter in
/// CASE did, where plain DataFusion answers). The rest of the optimizer still
/// runs here: an unoptimized subtree broke the Ballista plans (a sort-merge
/// join's inputs not co-partitioned).
pub async fn plan_subtree(
    planner: &dyn datafusion::physical_planner::PhysicalPlanner,
    plan: &datafusion::logical_expr::LogicalPlan,
    session: &dyn datafusion::catalog::Session,
) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
    use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
    match session.as_any().downcast_ref::<SessionState>() {
        Some(state) => {
            use datafusion::physical_optimizer::{filter_pushdown::FilterPushdown, PhysicalOptimizerRule};
            let last_pushdown = FilterPushdown::new_post_optimization();
            let rules =
                state.physical_optimizers().iter().filter(|r| r.name() != last_pushdown.name()).cloned().collect();
            let without_dynamic_filters =
                SessionStateBuilder::new_from_existing(state.clone()).with_physical_optimizer_rules(rules).build();
            planner.create_physical_plan(plan, &without_dynamic_filters).await
        }
        None => planner.create_physical_plan(plan, session).await,
    }
}

/// GPU or CPU, with the reason for a CPU choice (shown in EXPLAIN). Waits for
/// a device still starting (the similarity join's rule; the set selections
/// use [`decide`]).
pub fn choose_backend(cfg: &SetfusionConfig, rows: Option<usize>, key_types: &[DataType]) -> Backend {
    if let Some(reason) = forced_cpu(cfg, key_types) {
        return Backend::Cpu(reason);
    }
    if let Err(e) = crate::gpu::available(cfg.device) {
        return Backend::Cpu(e.to_string());
    }
    if let Some(n) = rows {
        if n < cfg.min_rows {
            return Backend::Cpu(format!("{n} estimated rows < setfusion.min_rows = {}", cfg.min_rows));
        }
    }
    Backend::Gpu(cfg.strategy)
}

/// [`decide`] for a semi / anti / mark join with a residual filter. The GPU
/// finds each probe row's group (fixed-width correlation keys) and evaluates
/// the filter when it compiles to a device program
/// ([`crate::exec::pair_filter`]). Without that, only a forced GPU strategy
/// or `min_rows = 0` takes the device (it then finds the groups, and the host
/// evaluates the filter); otherwise the CPU, with the reason. The cost model
/// weighs the correlation keys and the filter's columns, all of which travel.
#[allow(clippy::too_many_arguments)]
pub fn decide_filtered(
    cfg: &SetfusionConfig,
    a: &Arc<dyn ExecutionPlan>,
    b: &Arc<dyn ExecutionPlan>,
    on_types: &[DataType],
    filter: &crate::exec::pair_filter::PairFilter,
    in_types: Option<(&DataType, &DataType)>,
    threads: usize,
) -> Decision {
    let forced = cfg.strategy != Strategy::Auto || cfg.min_rows == 0;
    let device = if on_types.iter().all(|t| crate::keys::is_exact(std::slice::from_ref(t))) {
        crate::exec::pair_filter::compile(filter, in_types).map(|_| ())
    } else {
        Err(format!("correlation keys {on_types:?} are not fixed-width"))
    };
    let mut types = on_types.to_vec();
    types.extend(in_types.map(|(p, _)| p.clone()));
    types.extend(filter.schema.fields().iter().map(|f| f.data_type().clone()));
    let d = decide(cfg, SetOp::Semi, a, b, &types, threads);
    match (&d.backend, device) {
        (Backend::Gpu(_), Err(why)) if !forced => Decision {
            backend: Backend::Cpu(format!("residual filter on the host: {why}")),
            note: None,
            declined: true,
        },
        _ => d,
    }
}

/// The reasons for the CPU that need no estimate: settings and key types.
fn forced_cpu(cfg: &SetfusionConfig, key_types: &[DataType]) -> Option<String> {
    if !cfg.enabled {
        return Some("setfusion.enabled = false".into());
    }
    if cfg.strategy == Strategy::Cpu {
        return Some("setfusion.strategy = cpu".into());
    }
    crate::keys::unsupported_reason(key_types)
}

/// The planner's choice for one set selection.
#[derive(Debug, Clone)]
pub struct Decision {
    pub backend: Backend,
    /// Why the GPU was chosen (the estimate), for EXPLAIN.
    pub note: Option<String>,
    /// A usable device was turned down (cost model, `min_rows`): where
    /// DataFusion's operator stays, EXPLAIN says so above it.
    pub declined: bool,
}

/// A set selection's backend, with the estimate behind the choice (for
/// EXPLAIN). `Backend::Cpu` means DataFusion's own operator where that one is
/// right, setfusion's CPU backend otherwise (INTERSECT / EXCEPT ALL).
///
/// An explicit GPU strategy (`hash`, `bitmap`, `sort`) or `min_rows = 0` takes
/// the GPU whenever one is usable, waiting for its start; otherwise inputs
/// under `min_rows` stay on the CPU and the cost model ([`cost::estimate`])
/// decides, without waiting for a device that is still starting.
pub fn decide(
    cfg: &SetfusionConfig,
    op: SetOp,
    a: &Arc<dyn ExecutionPlan>,
    b: &Arc<dyn ExecutionPlan>,
    key_types: &[DataType],
    threads: usize,
) -> Decision {
    let cpu = |reason: String, declined: bool| Decision { backend: Backend::Cpu(reason), note: None, declined };
    if let Some(reason) = forced_cpu(cfg, key_types) {
        return cpu(reason, false);
    }
    let forced = cfg.strategy != Strategy::Auto || cfg.min_rows == 0;
    if forced {
        crate::gpu::wait_started(cfg.device);
    }
    let readiness = crate::gpu::readiness(cfg.device);
    if let crate::gpu::Readiness::Unavailable(e) = &readiness {
        return cpu(e.to_string(), false);
    }
    if forced {
        let why = if cfg.strategy != Strategy::Auto {
            format!("setfusion.strategy = {}", cfg.strategy)
        } else {
            "setfusion.min_rows = 0".into()
        };
        return Decision { backend: Backend::Gpu(cfg.strategy), note: Some(why), declined: false };
    }
    let rows = estimated_input_rows(a, b);
    if let Some(n) = rows {
        if n < cfg.min_rows {
            return cpu(format!("{n} estimated rows < setfusion.min_rows = {}", cfg.min_rows), true);
        }
    }
    // Costed as encoded: a dictionary as its values (string dictionaries as views).
    let encoded: Vec<DataType> = key_types.iter().map(crate::keys::key_type).collect();
    let candidate = cost::Candidate { op, rows, key_types: &encoded, threads };
    match cost::estimate(&candidate, &readiness, &cost::Calibration::current()) {
        cost::Verdict::Gpu(why) => Decision { backend: Backend::Gpu(Strategy::Auto), note: Some(why), declined: false },
        cost::Verdict::Cpu(why) => cpu(why, true),
    }
}
