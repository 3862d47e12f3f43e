//! Physical rule: no dynamic filter of float key bounds below a DataFusion
//! hash join.
//!
//! DataFusion 55's hash join pushes a dynamic filter of its build keys'
//! bounds (`key >= min AND key <= max`) into its probe side, and compares
//! floats there in IEEE total order, where -0.0 lies below 0.0. The join
//! itself equates them (its hashes and its `=` make -0.0 into 0.0). So a
//! probe row of -0.0 is dropped when the build side's least key is 0.0, and
//! 0.0 when its greatest is -0.0: `SELECT a FROM t JOIN s ON a = b ORDER BY
//! a` and `... WHERE a IN (SELECT b FROM s) ORDER BY a` lose the rows of
//! -0.0 that match 0.0 (their plans put the probe side under a filter the
//! bounds reach; without ORDER BY they answered). This rule puts a
//! [`SetfusionDeclinedExec`] with [`Reason::FloatKeyBounds`] above the probe
//! side of every hash join with a floating-point key: it refuses the last
//! filter pushdown's filters (the dynamic ones) and says why in EXPLAIN.
//! Runs before that pushdown, and only with setfusion enabled.

use std::sync::Arc;

use datafusion::common::tree_node::Transformed;
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::{replace_children_if_necessary, ExecutionPlan};

use crate::exec::common::Reason;
use crate::exec::declined::SetfusionDeclinedExec;
use crate::util::holds_float;

#[derive(Debug, Default)]
pub struct FloatKeyBoundsRule;

impl PhysicalOptimizerRule for FloatKeyBoundsRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        if !config.optimizer.enable_join_dynamic_filter_pushdown {
            return Ok(plan);
        }
        super::rewrite_when_enabled(plan, config, |p, _| {
            let Some(join) = p.downcast_ref::<HashJoinExec>() else {
                return Ok(Transformed::no(p));
            };
            let probe = join.right();
            let schema = probe.schema();
            let float_key = join.on().iter().any(|(_, k)| k.data_type(&schema).is_ok_and(|t| holds_float(&t)));
            let stopped =
                probe.downcast_ref::<SetfusionDeclinedExec>().is_some_and(|d| d.reason() == &Reason::FloatKeyBounds);
            if !float_key || stopped {
                return Ok(Transformed::no(p));
            }
            let barrier: Arc<dyn ExecutionPlan> =
                Arc::new(SetfusionDeclinedExec::new(probe.clone(), Reason::FloatKeyBounds));
            let left = join.left().clone();
            Ok(Transformed::yes(replace_children_if_necessary(p.clone(), vec![left, barrier])?))
        })
    }

    fn name(&self) -> &str {
        "setfusion_float_key_bounds"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{DataType, Field};

    #[test]
    fn float_keys_are_found_inside_other_types() {
        let f = |t: DataType| Arc::new(Field::new("x", t, true));
        assert!(holds_float(&DataType::Float32));
        assert!(holds_float(&DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Float64))));
        assert!(holds_float(&DataType::Struct(vec![f(DataType::Int64), f(DataType::Float16)].into())));
        assert!(holds_float(&DataType::List(f(DataType::Float64))));
        assert!(!holds_float(&DataType::Int64));
        assert!(!holds_float(&DataType::Decimal128(10, 2)));
        assert!(!holds_float(&DataType::List(f(DataType::Utf8))));
    }
}
