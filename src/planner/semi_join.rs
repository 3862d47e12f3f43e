//! Physical rule: DataFusion's semi / anti joins -> `SemiJoinExec`.
//!
//! IN / EXISTS become semi joins and NOT IN / NOT EXISTS anti joins (NOT IN
//! null-aware) during DataFusion's own optimisation; this rule runs last and
//! replaces each `HashJoinExec` / `SortMergeJoinExec` of those types that has
//! only equality keys (one with a residual filter too, as a `MarkJoinExec`:
//! see [`SemiJoinRule::rewrite_filtered`]). When the GPU backend is not chosen the DataFusion join
//! is kept (it is the better CPU implementation), unless `setfusion.strategy =
//! cpu` asks for setfusion's CPU backend explicitly (tests, benchmarks).

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{JoinType, NullEquality};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::{HashJoinExec, SortMergeJoinExec};
use datafusion::physical_plan::ExecutionPlan;

use crate::algo::select::SetOp;
use crate::config::{SetfusionConfig, Strategy};
use crate::exec::common::NullMode;
use crate::exec::declined::SetfusionDeclinedExec;
use crate::exec::set_select::SetSelectExec;

#[derive(Debug, Default)]
pub struct SemiJoinRule;

struct JoinParts {
    left: Arc<dyn ExecutionPlan>,
    right: Arc<dyn ExecutionPlan>,
    on: Vec<(PhysicalExprRef, PhysicalExprRef)>,
    join_type: JoinType,
    null_equality: NullEquality,
    null_aware: bool,
    projection: Option<Vec<usize>>,
    filter: Option<datafusion::physical_plan::joins::utils::JoinFilter>,
}

fn parts_of(plan: &Arc<dyn ExecutionPlan>) -> Option<JoinParts> {
    if let Some(j) = plan.downcast_ref::<HashJoinExec>() {
        return Some(JoinParts {
            left: j.left().clone(),
            right: j.right().clone(),
            on: j.on().to_vec(),
            join_type: *j.join_type(),
            null_equality: j.null_equality(),
            null_aware: j.null_aware,
            projection: j.projection.as_ref().map(|p| p.iter().copied().collect()),
            filter: j.filter().cloned(),
        });
    }
    if let Some(j) = plan.downcast_ref::<SortMergeJoinExec>() {
        if j.filter().is_some() {
            return None;
        }
        return Some(JoinParts {
            left: j.left().clone(),
            right: j.right().clone(),
            on: j.on().to_vec(),
            join_type: j.join_type(),
            null_equality: j.null_equality(),
            null_aware: false,
            projection: None,
            filter: j.filter().clone(),
        });
    }
    None
}

impl SemiJoinRule {
    fn rewrite(
        plan: Arc<dyn ExecutionPlan>,
        cfg: &SetfusionConfig,
        threads: usize,
        used: &ColumnsUsed,
    ) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
        if let Some(d) = plan.downcast_ref::<SetfusionDeclinedExec>() {
            // Planned twice (a subtree DataFusion planned for a set operation is
            // optimised again with the whole plan): one note is enough.
            let inner = d.children()[0];
            if inner.downcast_ref::<SetfusionDeclinedExec>().is_some() {
                return Ok(Transformed::yes(inner.clone()));
            }
        }
        let Some(j) = parts_of(&plan) else { return Ok(Transformed::no(plan)) };
        let (op, keep_left) = match j.join_type {
            JoinType::LeftSemi => (SetOp::Semi, true),
            JoinType::RightSemi => (SetOp::Semi, false),
            JoinType::LeftAnti => (SetOp::Anti, true),
            JoinType::RightAnti => (SetOp::Anti, false),
            _ => return Ok(Transformed::no(plan)),
        };
        if let Some(filter) = &j.filter {
            return Self::rewrite_filtered(plan.clone(), cfg, &j, filter, op == SetOp::Anti, keep_left, threads);
        }
        let (keep, other) = if keep_left { (j.left, j.right) } else { (j.right, j.left) };
        let (keep_keys, other_keys): (Vec<_>, Vec<_>) =
            j.on.into_iter().map(|(l, r)| if keep_left { (l, r) } else { (r, l) }).unzip();
        let schema = keep.schema();
        let types: Vec<_> = keep_keys.iter().map(|k| k.data_type(&schema)).collect::<Result<_>>()?;
        // One key over Parquet inputs: how the device scan rule would read them
        // (the kept side's output columns too).
        let reading = match (keep_keys.as_slice(), other_keys.as_slice(), types.as_slice()) {
            ([kk], [ok], [t]) => {
                // The join's own projection, else the columns the projection above it reads, else all.
                let output: Vec<usize> = j
                    .projection
                    .clone()
                    .or_else(|| used.get(&node_address(&plan)).cloned())
                    .unwrap_or_else(|| (0..schema.fields().len()).collect());
                super::device_scan::reading(cfg, t, &[(&keep, kk, Some(&output)), (&other, ok, None)])
            }
            _ => Default::default(),
        };
        let decision = super::decision::decide_reading(cfg, op, &keep, &other, &types, threads, reading);
        if !decision.on_gpu() && cfg.strategy != Strategy::Cpu {
            // DataFusion's join is right and, by the decision, not slower: keep it, saying why.
            crate::util::trace(&format!("setfusion keeps DataFusion's {:?} join: {}", j.join_type, decision.reason));
            return Ok(Transformed::yes(Arc::new(SetfusionDeclinedExec::new(plan, decision.reason))));
        }
        let nulls = if j.null_aware {
            NullMode::NullAware
        } else if j.null_equality == NullEquality::NullEqualsNull {
            NullMode::Equal
        } else {
            NullMode::NeverEqual
        };
        let exec = SetSelectExec::try_new(op, keep, other, keep_keys, other_keys, nulls, decision, j.projection)?
            .with_partitioned_inputs(cfg.hash_partition_inputs)?;
        Ok(Transformed::yes(Arc::new(exec)))
    }
}

impl SemiJoinRule {
    /// A semi / anti join with a residual filter: `MarkJoinExec` on the GPU
    /// when [`super::decision::decide_filtered`] says so (the device finds the groups
    /// and evaluates the filter), on setfusion's CPU backend under
    /// `strategy = cpu` (tests, comparisons); otherwise DataFusion's join
    /// stays. A null-aware anti join stays DataFusion's.
    #[allow(clippy::too_many_arguments)]
    fn rewrite_filtered(
        plan: Arc<dyn ExecutionPlan>,
        cfg: &SetfusionConfig,
        j: &JoinParts,
        filter: &datafusion::physical_plan::joins::utils::JoinFilter,
        anti: bool,
        keep_left: bool,
        threads: usize,
    ) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
        if j.null_aware {
            crate::util::trace("setfusion keeps DataFusion's null-aware anti join with a residual filter");
            return Ok(Transformed::no(plan));
        }
        use datafusion::common::JoinSide;
        let (keep, other) =
            if keep_left { (j.left.clone(), j.right.clone()) } else { (j.right.clone(), j.left.clone()) };
        let on: Vec<(PhysicalExprRef, PhysicalExprRef)> =
            j.on.iter().map(|(l, r)| if keep_left { (l.clone(), r.clone()) } else { (r.clone(), l.clone()) }).collect();
        let columns =
            filter.column_indices().iter().map(|c| ((c.side == JoinSide::Left) == keep_left, c.index)).collect();
        let pair_filter = crate::exec::pair_filter::PairFilter {
            expr: filter.expression().clone(),
            columns,
            schema: filter.schema().clone(),
        };
        let schema = keep.schema();
        let on_types: Vec<_> = on.iter().map(|(k, _)| k.data_type(&schema)).collect::<Result<_>>()?;
        let decision = super::decision::decide_filtered(cfg, &keep, &other, &on_types, &pair_filter, None, threads);
        if !decision.on_gpu() && cfg.strategy != Strategy::Cpu {
            crate::util::trace(&format!(
                "setfusion keeps DataFusion's {:?} join with a filter: {}",
                j.join_type, decision.reason
            ));
            return Ok(Transformed::yes(Arc::new(SetfusionDeclinedExec::new(plan, decision.reason))));
        }
        let exec: Arc<dyn ExecutionPlan> = Arc::new(
            crate::exec::mark_join::MarkJoinExec::semi_or_anti(anti, keep, other, on, pair_filter, decision)?
                .with_broadcast_build(cfg.hash_partition_inputs),
        );
        let exec = match &j.projection {
            None => exec,
            Some(p) => {
                let schema = exec.schema();
                let exprs: Vec<(PhysicalExprRef, String)> = p
                    .iter()
                    .map(|&i| {
                        (
                            Arc::new(datafusion::physical_expr::expressions::Column::new(schema.field(i).name(), i))
                                as PhysicalExprRef,
                            schema.field(i).name().clone(),
                        )
                    })
                    .collect();
                Arc::new(datafusion::physical_plan::projection::ProjectionExec::try_new(exprs, exec)?)
            }
        };
        Ok(Transformed::yes(exec))
    }
}

/// The output columns of a join that the projection right above it reads, by the join node's address.
type ColumnsUsed = HashMap<usize, Vec<usize>>;

fn node_address(plan: &Arc<dyn ExecutionPlan>) -> usize {
    Arc::as_ptr(plan) as *const () as usize
}

/// For each hash join under a projection (before DataFusion embeds the
/// projection in the join): the join's output columns the projection reads.
/// A string key that is not output can then be read by the device scan.
fn columns_used_above_joins(plan: &Arc<dyn ExecutionPlan>) -> ColumnsUsed {
    use datafusion::physical_expr::expressions::Column;
    use datafusion::physical_plan::projection::ProjectionExec;
    let mut used = ColumnsUsed::new();
    let _ = plan.apply(|node| {
        if let Some(p) = node.downcast_ref::<ProjectionExec>() {
            if p.input().downcast_ref::<HashJoinExec>().is_some() {
                let mut columns = std::collections::BTreeSet::new();
                for e in p.expr() {
                    let _ = e.expr.apply(|x| {
                        if let Some(c) = x.downcast_ref::<Column>() {
                            columns.insert(c.index());
                        }
                        Ok(TreeNodeRecursion::Continue)
                    });
                }
                used.insert(node_address(p.input()), columns.into_iter().collect());
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    used
}

impl PhysicalOptimizerRule for SemiJoinRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        crate::util::trace("physical rule setfusion_semi_join");
        let threads = config.execution.target_partitions;
        let used = columns_used_above_joins(&plan);
        super::rewrite_when_enabled(plan, config, |p, cfg| Self::rewrite(p, cfg, threads, &used))
    }
    fn name(&self) -> &str {
        "setfusion_semi_join"
    }
    fn schema_check(&self) -> bool {
        true
    }
}
