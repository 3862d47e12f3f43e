//! Planning: the logical step that gives INTERSECT ALL / EXCEPT ALL their exact
//! multiset semantics, and the physical rule that puts setfusion operators in
//! place of DataFusion's semi/anti joins.

pub mod cost;
pub mod decision;
mod device_scan;
mod float_in_list;
mod float_key_bounds;
mod float_statistics;
mod mark_join;
mod outer_decorrelate;
mod quantified;
mod scan_split;
mod semi_join;
mod set_ops;
mod similarity;

use std::sync::Arc;

use datafusion::physical_plan::ExecutionPlan;

use crate::config::SetfusionConfig;

pub use device_scan::DeviceScanRule;
pub use float_in_list::FloatInListRule;
pub use float_key_bounds::FloatKeyBoundsRule;
pub use float_statistics::{FloatStatisticsRule, UnprunedFloatFiltersRule};
pub use mark_join::{MarkJoinNode, MarkJoinPlanner, MarkJoinRule};
pub use scan_split::ScanRangesRule;
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
    match plan.children().as_slice() {
        [child] if at_most_its_input(plan) => rows_or_bound(child, ctx),
        _ => None,
    }
}

/// Nodes whose output rows are at most their one input's.
fn at_most_its_input(plan: &Arc<dyn ExecutionPlan>) -> bool {
    use datafusion::physical_plan::aggregates::AggregateExec;
    use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
    use datafusion::physical_plan::filter::FilterExec;
    use datafusion::physical_plan::projection::ProjectionExec;
    use datafusion::physical_plan::repartition::RepartitionExec;
    use datafusion::physical_plan::sorts::sort::SortExec;
    use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
    plan.downcast_ref::<AggregateExec>().is_some()
        || plan.downcast_ref::<ProjectionExec>().is_some()
        || plan.downcast_ref::<FilterExec>().is_some()
        || plan.downcast_ref::<RepartitionExec>().is_some()
        || plan.downcast_ref::<CoalescePartitionsExec>().is_some()
        || plan.downcast_ref::<SortExec>().is_some()
        || plan.downcast_ref::<SortPreservingMergeExec>().is_some()
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
    // A device an earlier query asked to start for the next ones starts now.
    crate::exec::common::start_pending_devices();
    plan.transform_up(|p| rewrite(p, &cfg)).map(|t| t.data)
}

/// Is `rule` DataFusion's last filter pushdown, the one that makes the hash
/// joins' dynamic filters?
pub fn is_last_filter_pushdown(rule: &dyn datafusion::physical_optimizer::PhysicalOptimizerRule) -> bool {
    use datafusion::physical_optimizer::{filter_pushdown::FilterPushdown, PhysicalOptimizerRule};
    rule.name() == FilterPushdown::new_post_optimization().name()
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
            let rules =
                state.physical_optimizers().iter().filter(|r| !is_last_filter_pushdown(r.as_ref())).cloned().collect();
            let without_dynamic_filters =
                SessionStateBuilder::new_from_existing(state.clone()).with_physical_optimizer_rules(rules).build();
            planner.create_physical_plan(plan, &without_dynamic_filters).await
        }
        None => planner.create_physical_plan(plan, session).await,
    }
}
