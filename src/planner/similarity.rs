//! Physical rule: an inner `NestedLoopJoinExec` whose filter has a conjunct
//! `metric(l, r) >= t` / `> t` (also written `t <= metric(l, r)`, and with the
//! arguments on either side) -> [`SimilarityJoinExec`].
//!
//! `metric` is one of `jaccard`, `dice`, `set_cosine`, `overlap` (possibly
//! under a cast, as for `overlap(a, b) >= 1.5`), `t` a literal, and each
//! argument must read columns of one input only, the two arguments opposite
//! inputs. The other conjuncts become the operator's residual filter. A
//! threshold outside (0, 1] (jaccard, dice, set_cosine) or below 1 (overlap)
//! is a planning error. Joins not of this form keep DataFusion's plan (a join
//! with equality keys is already a hash join and is left alone).

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{JoinSide, JoinType, ScalarValue};
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, CastExpr, Column, Literal, TryCastExpr};
use datafusion::physical_expr::{conjunction_opt, split_conjunction, PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::utils::JoinFilter;
use datafusion::physical_plan::joins::NestedLoopJoinExec;
use datafusion::physical_plan::ExecutionPlan;

use crate::algo::ssjoin::{Metric, Threshold};
use crate::config::{SetfusionConfig, Strategy};
use crate::exec::set_select::Backend;
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
fn to_side(e: &Arc<dyn PhysicalExpr>, filter: &JoinFilter, input: &Arc<dyn ExecutionPlan>) -> Result<Arc<dyn PhysicalExpr>> {
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

impl SimilarityJoinRule {
    fn rewrite(plan: Arc<dyn ExecutionPlan>, cfg: &SetfusionConfig) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
        let Some(j) = plan.downcast_ref::<NestedLoopJoinExec>() else { return Ok(Transformed::no(plan)) };
        if *j.join_type() != JoinType::Inner {
            return Ok(Transformed::no(plan));
        }
        let Some(filter) = j.filter() else { return Ok(Transformed::no(plan)) };
        let conjuncts = split_conjunction(filter.expression());
        let Some(found) = find(&conjuncts, filter)? else { return Ok(Transformed::no(plan)) };
        let rest: Vec<Arc<dyn PhysicalExpr>> =
            conjuncts.iter().enumerate().filter(|(i, _)| *i != found.index).map(|(_, c)| (*c).clone()).collect();
        let residual = conjunction_opt(rest)
            .map(|e| JoinFilter::new(e, filter.column_indices().to_vec(), filter.schema().clone()));
        let left_set = to_side(&found.left_arg, filter, j.left())?;
        let right_set = to_side(&found.right_arg, filter, j.right())?;
        let rows = super::estimated_input_rows(j.left(), j.right());
        let backend = match super::choose_backend(cfg, rows, &[]) {
            Backend::Gpu(Strategy::Auto) if cpu_is_faster(&found.threshold) => Backend::Cpu(format!(
                "{} >= {} is a high threshold: the CPU prefix-filter join is faster there (BENCHMARKS.md)",
                found.threshold.metric.name(),
                found.threshold.value
            )),
            b => b,
        };
        let projection = j.projection().as_ref().map(|p| p.iter().copied().collect());
        let exec = SimilarityJoinExec::try_new(
            j.left().clone(),
            j.right().clone(),
            left_set,
            right_set,
            found.threshold,
            residual,
            projection,
            backend,
        )?;
        Ok(Transformed::yes(Arc::new(exec)))
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

/// Measured on the H100 (BENCHMARKS.md): at high thresholds prefix filtering
/// leaves the CPU so few candidates that the GPU's fixed costs dominate.
/// Thresholds are compared in Jaccard terms (dice d = 2j / (1 + j); cosine is
/// at least dice, so the dice bound is used for it too).
fn cpu_is_faster(t: &crate::algo::ssjoin::Threshold) -> bool {
    use crate::algo::ssjoin::Metric;
    const JACCARD_CPU_FROM: f64 = 0.7;
    let dice_from = 2.0 * JACCARD_CPU_FROM / (1.0 + JACCARD_CPU_FROM);
    match t.metric {
        Metric::Jaccard => t.value >= JACCARD_CPU_FROM,
        Metric::Dice | Metric::Cosine => t.value >= dice_from,
        Metric::Overlap => false,
    }
}
