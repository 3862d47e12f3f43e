//! Physical rule: DataFusion's semi / anti joins -> `SemiJoinExec`.
//!
//! IN / EXISTS become semi joins and NOT IN / NOT EXISTS anti joins (NOT IN
//! null-aware) during DataFusion's own optimisation; this rule runs last and
//! replaces each `HashJoinExec` / `SortMergeJoinExec` of those types that has
//! only equality keys. When the GPU backend is not chosen the DataFusion join
//! is kept (it is the better CPU implementation), unless `setfusion.strategy =
//! cpu` asks for setfusion's CPU backend explicitly (tests, benchmarks).

use std::sync::Arc;

use datafusion::common::tree_node::Transformed;
use datafusion::common::{JoinType, NullEquality};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::{HashJoinExec, SortMergeJoinExec};
use datafusion::physical_plan::ExecutionPlan;

use crate::algo::setops::SetOp;
use crate::config::{SetfusionConfig, Strategy};
use crate::exec::set_select::{Backend, NullMode, SetSelectExec};

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
}

fn parts_of(plan: &Arc<dyn ExecutionPlan>) -> Option<JoinParts> {
    if let Some(j) = plan.downcast_ref::<HashJoinExec>() {
        if j.filter().is_some() {
            return None;
        }
        return Some(JoinParts {
            left: j.left().clone(),
            right: j.right().clone(),
            on: j.on().to_vec(),
            join_type: *j.join_type(),
            null_equality: j.null_equality(),
            null_aware: j.null_aware,
            projection: j.projection.as_ref().map(|p| p.iter().copied().collect()),
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
        });
    }
    None
}

impl SemiJoinRule {
    fn rewrite(plan: Arc<dyn ExecutionPlan>, cfg: &SetfusionConfig) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
        let Some(j) = parts_of(&plan) else { return Ok(Transformed::no(plan)) };
        let (op, keep_left) = match j.join_type {
            JoinType::LeftSemi => (SetOp::Semi, true),
            JoinType::RightSemi => (SetOp::Semi, false),
            JoinType::LeftAnti => (SetOp::Anti, true),
            JoinType::RightAnti => (SetOp::Anti, false),
            _ => return Ok(Transformed::no(plan)),
        };
        let (keep, other) = if keep_left { (j.left, j.right) } else { (j.right, j.left) };
        let (keep_keys, other_keys): (Vec<_>, Vec<_>) =
            j.on.into_iter().map(|(l, r)| if keep_left { (l, r) } else { (r, l) }).unzip();
        let schema = keep.schema();
        let types: Vec<_> = keep_keys.iter().map(|k| k.data_type(&schema)).collect::<Result<_>>()?;
        let rows = super::estimated_input_rows(&keep, &other);
        let backend = super::choose_backend(cfg, rows, &types);
        if matches!(backend, Backend::Cpu(_)) && cfg.strategy != Strategy::Cpu {
            return Ok(Transformed::no(plan));
        }
        let nulls = if j.null_aware {
            NullMode::NullAware
        } else if j.null_equality == NullEquality::NullEqualsNull {
            NullMode::Equal
        } else {
            NullMode::NeverEqual
        };
        let exec = SetSelectExec::try_new(op, keep, other, keep_keys, other_keys, nulls, backend, j.projection)?;
        Ok(Transformed::yes(Arc::new(exec)))
    }
}

impl PhysicalOptimizerRule for SemiJoinRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        crate::exec::trace("physical rule setfusion_semi_join");
        super::rewrite_when_enabled(plan, config, Self::rewrite)
    }
    fn name(&self) -> &str {
        "setfusion_semi_join"
    }
    fn schema_check(&self) -> bool {
        true
    }
}
