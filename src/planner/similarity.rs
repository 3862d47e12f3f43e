//! Physical rule: an inner `NestedLoopJoinExec` or `HashJoinExec` whose
//! filter has a conjunct `metric(l, r) >= t` / `> t` (also written
//! `t <= metric(l, r)`, and with the arguments on either side) ->
//! [`SimilarityJoinExec`]. A hash join's equality keys (`l.k = r.k`, or
//! `IS NOT DISTINCT FROM` for null-equal keys) join the other filter conjuncts
//! in the operator's residual filter, applied to the candidate pairs; when the
//! hash join's output was hash-partitioned, a `RepartitionExec` with the same
//! partitioning is put on top so parents that relied on it still get it
//! (this rule runs after distribution enforcement). A hash join that declares
//! an output ordering or a fetch limit is left alone.
//!
//! `metric` is one of `jaccard`, `dice`, `set_cosine`, `overlap` (possibly
//! under a cast, as for `overlap(a, b) >= 1.5`), `t` a literal, and each
//! argument must read columns of one input only, the two arguments opposite
//! inputs. The other conjuncts become the operator's residual filter. A
//! threshold outside (0, 1] (jaccard, dice, set_cosine) or below 1 (overlap)
//! is a planning error. Joins not of this form keep DataFusion's plan.
//!
//! Backend choice ([`super::cost::similarity_estimate`], through [`super::decision::decide_similarity`]): GPU unless the CPU prefix-filter join is
//! expected to be faster, from the threshold and the estimated input rows.

use std::sync::Arc;

use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{JoinSide, JoinType, NullEquality, ScalarValue};
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, CastExpr, Column, Literal, TryCastExpr};
use datafusion::physical_expr::{conjunction_opt, split_conjunction, PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::utils::{ColumnIndex, JoinFilter};
use datafusion::physical_plan::joins::{HashJoinExec, NestedLoopJoinExec};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, Partitioning};

use crate::algo::ssjoin::{Metric, Threshold};
use crate::config::SetfusionConfig;
use crate::exec::similarity_join::SimilarityJoinExec;

#[derive(Debug, Default)]
pub struct SimilarityJoinRule;

/// A recognised similarity conjunct.
struct Found {
    index: usize,
    threshold: Threshold,
    left_arg: Arc<dyn PhysicalExpr>,
    right_arg: Arc<dyn PhysicalExpr>,
}

fn strip_cast(e: &Arc<dyn PhysicalExpr>) -> &Arc<dyn PhysicalExpr> {
    if let Some(c) = e.downcast_ref::<CastExpr>() {
        return strip_cast(c.expr());
    }
    if let Some(c) = e.downcast_ref::<TryCastExpr>() {
        return strip_cast(c.expr());
    }
    e
}

fn literal_f64(e: &Arc<dyn PhysicalExpr>) -> Option<f64> {
    let l = strip_cast(e).downcast_ref::<Literal>()?;
    let v = l.value();
    if v.is_null() {
        return None;
    }
    match v.cast_to(&datafusion::arrow::datatypes::DataType::Float64).ok()? {
        ScalarValue::Float64(Some(f)) => Some(f),
        _ => None,
    }
}

/// The single input side an expression reads (None: both, or none).
fn side_of(e: &Arc<dyn PhysicalExpr>, filter: &JoinFilter) -> Option<JoinSide> {
    let mut side = None;
    let mut mixed = false;
    let _ = e.apply(|n| {
        if let Some(c) = n.downcast_ref::<Column>() {
            let s = filter.column_indices().get(c.index()).map(|ci| ci.side);
            match (side, s) {
                (_, None) => mixed = true,
                (None, Some(s)) => side = Some(s),
                (Some(a), Some(b)) if a != b => mixed = true,
                _ => {}
            }
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    });
    if mixed {
        None
    } else {
        side.filter(|s| matches!(s, JoinSide::Left | JoinSide::Right))
    }
}

/// Rewrite an expression over the filter's intermediate schema onto one input's schema.
fn to_side(
    e: &Arc<dyn PhysicalExpr>,
    filter: &JoinFilter,
    input: &Arc<dyn ExecutionPlan>,
) -> Result<Arc<dyn PhysicalExpr>> {
    let schema = input.schema();
    e.clone()
        .transform(|n| {
            if let Some(c) = n.downcast_ref::<Column>() {
                let idx = filter.column_indices()[c.index()].index;
                let name = schema.field(idx).name().clone();
                return Ok(Transformed::yes(Arc::new(Column::new(&name, idx)) as Arc<dyn PhysicalExpr>));
            }
            Ok(Transformed::no(n))
        })
        .map(|t| t.data)
}

/// Find `metric(a, b) >= t` among the conjuncts.
fn find(conjuncts: &[&Arc<dyn PhysicalExpr>], filter: &JoinFilter) -> Result<Option<Found>> {
    for (index, c) in conjuncts.iter().enumerate() {
        let Some(b) = c.downcast_ref::<BinaryExpr>() else { continue };
        let (call, lit, strict) = match b.op() {
            Operator::GtEq => (b.left(), b.right(), false),
            Operator::Gt => (b.left(), b.right(), true),
            Operator::LtEq => (b.right(), b.left(), false),
            Operator::Lt => (b.right(), b.left(), true),
            _ => continue,
        };
        let Some(f) = strip_cast(call).downcast_ref::<ScalarFunctionExpr>() else { continue };
        let Some(metric) = Metric::from_name(f.name()) else { continue };
        if f.args().len() != 2 {
            continue;
        }
        let Some(t) = literal_f64(lit) else { continue };
        let (a0, a1) = (&f.args()[0], &f.args()[1]);
        let (left_arg, right_arg) = match (side_of(a0, filter), side_of(a1, filter)) {
            (Some(JoinSide::Left), Some(JoinSide::Right)) => (a0.clone(), a1.clone()),
            (Some(JoinSide::Right), Some(JoinSide::Left)) => (a1.clone(), a0.clone()),
            _ => continue,
        };
        metric.check_threshold(t).map_err(|e| DataFusionError::Plan(format!("setfusion similarity join: {e}")))?;
        let threshold = Threshold { metric, value: t, strict };
        return Ok(Some(Found { index, threshold, left_arg, right_arg }));
    }
    Ok(None)
}

/// The parts of a join the rule needs, from either join operator.
struct JoinParts<'a> {
    left: &'a Arc<dyn ExecutionPlan>,
    right: &'a Arc<dyn ExecutionPlan>,
    filter: &'a JoinFilter,
    /// Equality keys (hash join), over the left / right input schemas.
    on: &'a [(Arc<dyn PhysicalExpr>, Arc<dyn PhysicalExpr>)],
    null_equal: bool,
    projection: Option<Vec<usize>>,
}

/// `rest` plus `l = r` for every equality key, as one filter over an
/// intermediate schema extended with the key columns.
fn residual_filter(rest: Vec<Arc<dyn PhysicalExpr>>, parts: &JoinParts) -> Result<Option<JoinFilter>> {
    let filter = parts.filter;
    let mut fields: Vec<Field> = filter.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut indices: Vec<ColumnIndex> = filter.column_indices().to_vec();
    let mut conjuncts = rest;
    for (l, r) in parts.on {
        let mut map = |e: &Arc<dyn PhysicalExpr>,
                       side: JoinSide,
                       input: &Arc<dyn ExecutionPlan>|
         -> Result<Arc<dyn PhysicalExpr>> {
            let schema = input.schema();
            e.clone()
                .transform(|n| {
                    let Some(c) = n.downcast_ref::<Column>() else { return Ok(Transformed::no(n)) };
                    let at = match indices.iter().position(|ci| ci.side == side && ci.index == c.index()) {
                        Some(at) => at,
                        None => {
                            let f = schema.field(c.index());
                            // Unique names: Column evaluates by index, the name is for display.
                            fields.push(Field::new(
                                format!("{}#sfkey{}", f.name(), fields.len()),
                                f.data_type().clone(),
                                f.is_nullable(),
                            ));
                            indices.push(ColumnIndex { index: c.index(), side });
                            indices.len() - 1
                        }
                    };
                    Ok(Transformed::yes(Arc::new(Column::new(fields[at].name(), at)) as Arc<dyn PhysicalExpr>))
                })
                .map(|t| t.data)
        };
        let (l, r) = (map(l, JoinSide::Left, parts.left)?, map(r, JoinSide::Right, parts.right)?);
        let op = if parts.null_equal { Operator::IsNotDistinctFrom } else { Operator::Eq };
        conjuncts.push(Arc::new(BinaryExpr::new(l, op, r)));
    }
    let Some(e) = conjunction_opt(conjuncts) else { return Ok(None) };
    // Only the columns the filter reads: the operator gathers each of them for every
    // candidate pair (the set columns, which the join's own filter read, are not).
    let mut used: Vec<usize> = Vec::new();
    e.apply(|n| {
        if let Some(c) = n.downcast_ref::<Column>() {
            used.push(c.index());
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    used.sort_unstable();
    used.dedup();
    let e = e
        .transform(|n| {
            let Some(c) = n.downcast_ref::<Column>() else { return Ok(Transformed::no(n)) };
            let at = used
                .binary_search(&c.index())
                .map_err(|_| DataFusionError::Internal(format!("similarity join filter: column {c} not collected")))?;
            Ok(Transformed::yes(Arc::new(Column::new(c.name(), at)) as Arc<dyn PhysicalExpr>))
        })?
        .data;
    let fields: Vec<Field> = used.iter().map(|&i| fields[i].clone()).collect();
    let indices: Vec<ColumnIndex> = used.iter().map(|&i| indices[i].clone()).collect();
    Ok(Some(JoinFilter::new(e, indices, Arc::new(Schema::new(fields)))))
}

impl SimilarityJoinRule {
    fn rewrite(plan: Arc<dyn ExecutionPlan>, cfg: &SetfusionConfig) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
        let parts = if let Some(j) = plan.downcast_ref::<NestedLoopJoinExec>() {
            if *j.join_type() != JoinType::Inner {
                return Ok(Transformed::no(plan));
            }
            let Some(filter) = j.filter() else { return Ok(Transformed::no(plan)) };
            JoinParts {
                left: j.left(),
                right: j.right(),
                filter,
                on: &[],
                null_equal: false,
                projection: j.projection().as_ref().map(|p| p.iter().copied().collect()),
            }
        } else if let Some(j) = plan.downcast_ref::<HashJoinExec>() {
            if *j.join_type() != JoinType::Inner
                || j.null_aware
                || j.fetch().is_some()
                || j.properties().output_ordering().is_some()
            {
                return Ok(Transformed::no(plan));
            }
            let Some(filter) = j.filter() else { return Ok(Transformed::no(plan)) };
            JoinParts {
                left: j.left(),
                right: j.right(),
                filter,
                on: j.on(),
                null_equal: j.null_equality() == NullEquality::NullEqualsNull,
                projection: j.projection.as_ref().map(|p| p.iter().copied().collect()),
            }
        } else {
            return Ok(Transformed::no(plan));
        };
        let filter = parts.filter;
        let conjuncts = split_conjunction(filter.expression());
        let Some(found) = find(&conjuncts, filter)? else { return Ok(Transformed::no(plan)) };
        let rest: Vec<Arc<dyn PhysicalExpr>> =
            conjuncts.iter().enumerate().filter(|(i, _)| *i != found.index).map(|(_, c)| (*c).clone()).collect();
        let residual = residual_filter(rest, &parts)?;
        let left_set = to_side(&found.left_arg, filter, parts.left)?;
        let right_set = to_side(&found.right_arg, filter, parts.right)?;
        let decision = super::decision::decide_similarity(cfg, &found.threshold, parts.left, parts.right);
        let exec = SimilarityJoinExec::try_new(
            parts.left.clone(),
            parts.right.clone(),
            left_set,
            right_set,
            found.threshold,
            residual,
            parts.projection.clone(),
            decision,
        )?;
        let exec: Arc<dyn ExecutionPlan> = Arc::new(exec);
        // Keep a hash join's output partitioning for the parents planned on it.
        let exec = match plan.output_partitioning() {
            p @ Partitioning::Hash(_, n) if *n > 1 => Arc::new(RepartitionExec::try_new(exec, p.clone())?),
            _ => exec,
        };
        Ok(Transformed::yes(exec))
    }
}

impl PhysicalOptimizerRule for SimilarityJoinRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        super::rewrite_when_enabled(plan, config, Self::rewrite)
    }
    fn name(&self) -> &str {
        "setfusion_similarity_join"
    }
    fn schema_check(&self) -> bool {
        true
    }
}
