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
//! under a cast that keeps its values, as for `overlap(a, b) >= 1.5`), `t` a
//! literal (under casts, evaluated as DataFusion does), and each argument
//! must read columns of one input only, the two arguments opposite inputs.
//! The other conjuncts become the operator's residual filter. The predicate
//! is DataFusion's to the bit: compared in DataFusion's order of floats
//! (`util::double_order_key`), so any threshold is exact (none passes
//! `jaccard > 1`; `> -0.0` is `> 0`).
//! Joins not of this form keep DataFusion's plan; those with a similarity
//! comparison the operator does not decide keep it under a
//! `SetfusionDeclinedExec` that says why: every pair passes (`jaccard >= 0`,
//! `overlap > -1`: the operator lists pairs that share an element), or a
//! cast changes the metric's values (`CAST(jaccard(a, b) AS INT) >= 1`).
//!
//! Backend choice ([`super::cost::similarity_estimate`], through [`super::decision::decide_similarity`]): GPU unless the CPU prefix-filter join is
//! expected to be faster, from the threshold and the estimated input rows.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema};
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
use crate::exec::common::Reason;
use crate::exec::declined::SetfusionDeclinedExec;
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

/// The metric a comparison operand calls and the type it is compared in,
/// through casts that keep every value the metric can take: `overlap`'s
/// integers as BIGINT, UBIGINT or DOUBLE (exact below 2^53), a float metric
/// as DOUBLE. None for anything else, `CAST(jaccard(a, b) AS INT)` among
/// them: comparing that is not comparing the metric.
fn metric_call(e: &Arc<dyn PhysicalExpr>) -> Option<(&ScalarFunctionExpr, Metric, DataType)> {
    if let Some(f) = e.downcast_ref::<ScalarFunctionExpr>() {
        let metric = Metric::from_name(f.name())?;
        return (f.args().len() == 2).then(|| (f, metric, f.return_type().clone()));
    }
    let (inner, to) = if let Some(c) = e.downcast_ref::<CastExpr>() {
        (c.expr(), c.cast_type())
    } else if let Some(c) = e.downcast_ref::<TryCastExpr>() {
        (c.expr(), c.cast_type())
    } else {
        return None;
    };
    let (f, metric, from) = metric_call(inner)?;
    let keeps = from == *to
        || (metric == Metric::Overlap && matches!(to, DataType::Int64 | DataType::UInt64 | DataType::Float64));
    keeps.then(|| (f, metric, to.clone()))
}

/// Does a metric function appear under `e`'s casts (one that [`metric_call`]
/// does not take, so EXPLAIN can say why the join stays DataFusion's)?
fn rounded_metric(e: &Arc<dyn PhysicalExpr>) -> Option<String> {
    let mut e = e;
    loop {
        if let Some(c) = e.downcast_ref::<CastExpr>() {
            e = c.expr();
        } else if let Some(c) = e.downcast_ref::<TryCastExpr>() {
            e = c.expr();
        } else {
            break;
        }
    }
    let f = e.downcast_ref::<ScalarFunctionExpr>()?;
    Metric::from_name(f.name()).map(|m| m.name().to_string())
}

/// The value of a constant operand: a literal under casts, each applied as
/// DataFusion applies it. None: not a constant, or a cast that fails.
fn constant(e: &Arc<dyn PhysicalExpr>) -> Option<ScalarValue> {
    if let Some(l) = e.downcast_ref::<Literal>() {
        return Some(l.value().clone());
    }
    if let Some(c) = e.downcast_ref::<CastExpr>() {
        return constant(c.expr())?.cast_to_with_options(c.cast_type(), c.cast_options()).ok();
    }
    if let Some(c) = e.downcast_ref::<TryCastExpr>() {
        return constant(c.expr())?.cast_to(c.cast_type()).ok();
    }
    None
}

/// A threshold of the compared type as a double: exact for DOUBLE, and for
/// the integers `overlap` is compared with (overlaps stay far below 2^53, so
/// a rounded large integer orders the same against every one of them).
fn threshold_f64(v: &ScalarValue, compared: &DataType) -> Option<f64> {
    if v.data_type() != *compared {
        return None;
    }
    match v {
        ScalarValue::Float64(Some(f)) => Some(*f),
        ScalarValue::Int64(Some(i)) => Some(*i as f64),
        ScalarValue::UInt64(Some(u)) => Some(*u as f64),
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

/// What the conjuncts hold for the rule.
enum Search {
    Found(Found),
    /// A similarity comparison the operator does not decide (why), and none it does.
    Declined(String),
    None,
}

/// Find `metric(a, b) >= t` among the conjuncts: the first the operator
/// decides exactly, else the reason the first one it does not.
fn find(conjuncts: &[&Arc<dyn PhysicalExpr>], filter: &JoinFilter) -> Search {
    let mut declined = None;
    for (index, c) in conjuncts.iter().enumerate() {
        let Some(b) = c.downcast_ref::<BinaryExpr>() else { continue };
        let (call, lit, strict) = match b.op() {
            Operator::GtEq => (b.left(), b.right(), false),
            Operator::Gt => (b.left(), b.right(), true),
            Operator::LtEq => (b.right(), b.left(), false),
            Operator::Lt => (b.right(), b.left(), true),
            _ => continue,
        };
        let Some(value) = constant(lit) else { continue };
        let Some((f, metric, compared)) = metric_call(call) else {
            if let Some(name) = rounded_metric(call) {
                declined.get_or_insert(format!("`{call}` changes {name}'s values: compared as DataFusion compares it"));
            }
            continue;
        };
        let (a0, a1) = (&f.args()[0], &f.args()[1]);
        let (left_arg, right_arg) = match (side_of(a0, filter), side_of(a1, filter)) {
            (Some(JoinSide::Left), Some(JoinSide::Right)) => (a0.clone(), a1.clone()),
            (Some(JoinSide::Right), Some(JoinSide::Left)) => (a1.clone(), a0.clone()),
            _ => continue,
        };
        if value.is_null() {
            // Never true: DataFusion's join answers no rows, as it should.
            declined.get_or_insert(format!("`{c}` compares with NULL"));
            continue;
        }
        let Some(t) = threshold_f64(&value, &compared) else {
            declined.get_or_insert(format!("`{c}`: a threshold of type {} against {compared}", value.data_type()));
            continue;
        };
        let threshold = Threshold { metric, value: t, strict };
        if let Err(why) = threshold.check() {
            declined.get_or_insert(why);
            continue;
        }
        return Search::Found(Found { index, threshold, left_arg, right_arg });
    }
    declined.map_or(Search::None, Search::Declined)
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
        if let Some(d) = plan.downcast_ref::<SetfusionDeclinedExec>() {
            // A plan optimised twice: one note is enough.
            let inner = d.children()[0];
            if inner.downcast_ref::<SetfusionDeclinedExec>().is_some() {
                return Ok(Transformed::yes(inner.clone()));
            }
        }
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
        let found = match find(&conjuncts, filter) {
            Search::Found(found) => found,
            Search::None => return Ok(Transformed::no(plan)),
            Search::Declined(why) => {
                // DataFusion's join answers it (slowly where every pair passes): keep it, saying why.
                let reason = Reason::UnsupportedPredicate(why);
                return Ok(Transformed::yes(Arc::new(SetfusionDeclinedExec::new(plan, reason))));
            }
        };
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
