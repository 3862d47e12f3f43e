//! Analyzer rule: `f IN (list)` over floats finds -0.0 as `=` does.
//!
//! DataFusion 55.2 turns IN lists of up to three items into `=` comparisons,
//! which equate -0.0 and 0.0, and looks longer lists of literals up in a hash
//! set of their bits, where -0.0 and 0.0 differ: `f IN (0.0, 1.5, 2.5, 3.5)`
//! missed the rows of -0.0 (and `NOT IN` kept them). This rule adds 0.0 to
//! both sides of every float IN list (`f + 0.0 IN (0.0 + 0.0, ...)`): IEEE's
//! `-0.0 + 0.0` is 0.0, every other value, NaNs included, stays itself, and
//! the simplifier folds the list back into literals. The expressions keep
//! their names. Runs after type coercion, only with setfusion enabled.

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::logical_expr::expr::InList;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{Expr, ExprSchemable, LogicalPlan};
use datafusion::optimizer::AnalyzerRule;

use crate::config::SetfusionConfig;

/// Lists this long or shorter DataFusion compares item by item (its
/// simplifier's `THRESHOLD_INLINE_INLIST`): they need no rewrite.
const COMPARED_ITEM_BY_ITEM: usize = 3;

#[derive(Debug, Default)]
pub struct FloatInListRule;

impl AnalyzerRule for FloatInListRule {
    fn analyze(&self, plan: LogicalPlan, config: &ConfigOptions) -> Result<LogicalPlan> {
        if !SetfusionConfig::from_options(config).enabled {
            return Ok(plan);
        }
        plan.transform_up_with_subqueries(|p| {
            // Most nodes hold no IN list: they need no schema.
            let mut in_list = false;
            p.apply_expressions(|e| {
                in_list = e.exists(|e| Ok(matches!(e, Expr::InList(_))))?;
                Ok(if in_list { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
            })?;
            if !in_list {
                return Ok(Transformed::no(p));
            }
            // The expressions read the inputs' columns.
            let mut schema = DFSchema::empty();
            for input in p.inputs() {
                schema.merge(input.schema());
            }
            let names = NamePreserver::new(&p);
            p.map_expressions(|e| {
                let saved = names.save(&e);
                let rewritten = e.transform_up(|e| zero_added(e, &schema))?;
                Ok(rewritten.update_data(|e| saved.restore(e)))
            })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "setfusion_float_in_list"
    }
}

/// `e + 0.0` on both sides of a float IN list longer than DataFusion compares item by item.
fn zero_added(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    let Expr::InList(InList { expr, list, negated }) = &e else {
        return Ok(Transformed::no(e));
    };
    let Ok(t) = expr.get_type(schema) else {
        return Ok(Transformed::no(e));
    };
    if !t.is_floating() || list.len() <= COMPARED_ITEM_BY_ITEM || adds_zero(expr, &t) {
        return Ok(Transformed::no(e));
    }
    let zero = Expr::Literal(ScalarValue::new_zero(&t)?, None);
    let plus = |x: &Expr| x.clone() + zero.clone();
    Ok(Transformed::yes(Expr::InList(InList::new(Box::new(plus(expr)), list.iter().map(plus).collect(), *negated))))
}

/// Is `x` already `y + 0.0` with a zero of type `t` (the rule ran before)?
fn adds_zero(x: &Expr, t: &datafusion::arrow::datatypes::DataType) -> bool {
    use datafusion::logical_expr::{BinaryExpr, Operator};
    let Expr::BinaryExpr(BinaryExpr { op: Operator::Plus, right, .. }) = x else {
        return false;
    };
    matches!(right.as_ref(), Expr::Literal(v, _) if ScalarValue::new_zero(t).is_ok_and(|z| &z == v))
}
