//! Planning: the logical step that gives INTERSECT ALL / EXCEPT ALL their exact
//! multiset semantics, and the physical rule that puts setfusion operators in
//! place of DataFusion's semi/anti joins.

mod set_ops;
mod semi_join;
mod similarity;

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::physical_plan::ExecutionPlan;

use crate::config::{SetfusionConfig, Strategy};
use crate::exec::set_select::Backend;

pub use semi_join::SemiJoinRule;
pub use similarity::SimilarityJoinRule;
pub use set_ops::{SetOpNode, SetOpPlanner, SetOpRule, SetfusionQueryPlanner};

/// Estimated rows of a plan (None when unknown).
#[allow(deprecated)] // StatisticsContext needs a session we do not have in a physical rule
pub fn estimated_rows(plan: &Arc<dyn ExecutionPlan>) -> Option<usize> {
    plan.partition_statistics(None).ok().and_then(|s| s.num_rows.get_value().copied())
}

/// Estimated rows of both inputs of an operator together (None if either is unknown).
pub fn estimated_input_rows(a: &Arc<dyn ExecutionPlan>, b: &Arc<dyn ExecutionPlan>) -> Option<usize> {
    Some(estimated_rows(a)? + estimated_rows(b)?)
}

/// Apply a plan rewrite bottom-up when setfusion is enabled (the body of every setfusion physical rule).
pub fn rewrite_when_enabled(
    plan: Arc<dyn ExecutionPlan>,
    config: &datafusion::config::ConfigOptions,
    rewrite: impl Fn(Arc<dyn ExecutionPlan>, &SetfusionConfig) -> datafusion::error::Result<datafusion::common::tree_node::Transformed<Arc<dyn ExecutionPlan>>>,
) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
    use datafusion::common::tree_node::TreeNode;
    let cfg = SetfusionConfig::from_options(config);
    if !cfg.enabled {
        return Ok(plan);
    }
    plan.transform_up(|p| rewrite(p, &cfg)).map(|t| t.data)
}

/// GPU or CPU, with the reason for a CPU choice (shown in EXPLAIN).
pub fn choose_backend(cfg: &SetfusionConfig, rows: Option<usize>, key_types: &[DataType]) -> Backend {
    if !cfg.enabled {
        return Backend::Cpu("setfusion.enabled = false".into());
    }
    if cfg.strategy == Strategy::Cpu {
        return Backend::Cpu("setfusion.strategy = cpu".into());
    }
    if let Some(reason) = crate::keys::unsupported_reason(key_types) {
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
