//! Quantified comparisons `x op ANY / SOME / ALL (subquery)`, exactly.
//!
//! DataFusion 55.2 rewrites them (`RewriteSetComparison`) into a CASE over
//! EXISTS subqueries whose comparison reads `x` as an outer reference under
//! its own name, which collides with the subquery's column when both come
//! from one table (`i >= ALL (SELECT i FROM integers ...)` compares the
//! subquery's `i` with itself), and the LeftMark joins it builds compare
//! row by row. setfusion's analyzer rule takes them first:
//!
//! * `x = ANY (S)` is `x IN (S)` and `x <> ALL (S)` is `x NOT IN (S)`
//!   (SQL's definitions): they take the IN paths ([`as_in_subquery`]).
//! * The others, when the subquery's correlation is equalities only (or
//!   none): per correlation group (one group when uncorrelated) the
//!   subquery's row count, non-NULL count, min and max ([`summary_join`]),
//!   joined to the outer rows (LEFT: a row without a group has an empty
//!   set), and the answer decided from those ([`decide`]): for x non-NULL
//!   and a non-empty set, a comparison with some non-NULL value is TRUE
//!   (ANY) / FALSE (ALL) exactly when one with the max or the min is, and
//!   `x <> v` for some v (`<> ANY`, `= ALL`) exactly when x differs from the
//!   min or the max. Floats are summarised by their order keys
//!   ([`comparable`]), since DataFusion's grouped min and max of floats do
//!   not follow its own order over NaNs.
//! * With a residual (non-equality) correlation: SQL's definition over
//!   EXISTS ([`as_exists`]) with the compared value under a fresh name, for
//!   setfusion's mark joins (which evaluate the residual per pair).
//!
//! SQL's rule (ISO 9075, 8.9 <quantified comparison predicate>): ALL is TRUE
//! over an empty set, FALSE if some comparison is FALSE, else NULL if some is
//! NULL, else TRUE; ANY is FALSE over an empty set, TRUE if some comparison is
//! TRUE, else NULL if some is NULL, else FALSE.

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::common::{plan_err, Column, DFSchema, ExprSchema, ScalarValue};
use datafusion::error::Result;
use datafusion::functions_aggregate::expr_fn::{count, max, min};
use datafusion::logical_expr::expr::{Exists, InSubquery, SetComparison, SetQuantifier};
use datafusion::logical_expr::type_coercion::binary::comparison_coercion;
use datafusion::logical_expr::{
    binary_expr, cast, lit, when, Expr, ExprSchemable, JoinType, LogicalPlan, LogicalPlanBuilder, Operator, Subquery,
};

use crate::udf::float_order::float_order;

/// `x = ANY (S)` as `x IN (S)`, `x <> ALL (S)` as `x NOT IN (S)`; anything else unchanged.
pub(super) fn as_in_subquery(e: Expr) -> Transformed<Expr> {
    match e {
        Expr::SetComparison(SetComparison { expr, subquery, op, quantifier }) => match (op, quantifier) {
            (Operator::Eq, SetQuantifier::Any) => {
                Transformed::yes(Expr::InSubquery(InSubquery::new(expr, subquery, false)))
            }
            (Operator::NotEq, SetQuantifier::All) => {
                Transformed::yes(Expr::InSubquery(InSubquery::new(expr, subquery, true)))
            }
            (op, quantifier) => {
                Transformed::no(Expr::SetComparison(SetComparison::new(expr, subquery, op, quantifier)))
            }
        },
        e => Transformed::no(e),
    }
}

/// `x` and the subquery's `value` (`x` over `outer`, `value` over `build`)
/// as the summary compares them. Where DataFusion compares them as floats,
/// both become their order keys ([`float_order`], after the cast to the
/// type the comparison is made in): DataFusion's grouped `min` / `max` of
/// floats compare with IEEE's `<`, so over NaNs they depend on the rows'
/// order, while its comparisons (and ungrouped `min` / `max`) use its total
/// order. Other types are compared as they are.
pub(super) fn comparable(x: Expr, value: Expr, outer: &DFSchema, build: &DFSchema) -> Result<(Expr, Expr)> {
    let (xt, vt) = (x.get_type(outer)?, value.get_type(build)?);
    let Some(common) = comparison_coercion(&xt, &vt) else { return Ok((x, value)) };
    if !matches!(common, DataType::Float16 | DataType::Float32 | DataType::Float64) {
        return Ok((x, value));
    }
    let key = |e: Expr, t: &DataType| {
        let e = if *t == common { e } else { cast(e, common.clone()) };
        let e = if common == DataType::Float64 { e } else { cast(e, DataType::Float64) };
        float_order(e)
    };
    Ok((key(x, &xt), key(value, &vt)))
}

/// A correlation group's summary, as columns of the joined plan.
pub(super) struct Summary {
    /// count(*); NULL for an outer row without a group.
    rows: Expr,
    /// count(value).
    values: Expr,
    min: Expr,
    max: Expr,
}

/// `left` with the summary of `build`'s `value` per group of the build
/// sides of `on` (LEFT join on the probe sides, NULL equal to nothing), or
/// with the one global summary when `on` is empty; the summary is qualified
/// by `alias`.
pub(super) fn summary_join(
    left: LogicalPlan,
    build: LogicalPlan,
    on: Vec<(Expr, Expr)>,
    value: Expr,
    alias: &str,
) -> Result<(LogicalPlan, Summary)> {
    let keys: Vec<Expr> = on.iter().enumerate().map(|(i, (_, b))| b.clone().alias(format!("k{i}"))).collect();
    let aggregates = vec![
        count(lit(1i64)).alias("n"),
        count(value.clone()).alias("nn"),
        min(value.clone()).alias("lo"),
        max(value).alias("hi"),
    ];
    let summary = LogicalPlanBuilder::from(build).aggregate(keys, aggregates)?.alias(alias)?.build()?;
    let col = |name: &str| Expr::Column(Column::new(Some(alias), name));
    let joined = if on.is_empty() {
        // A global aggregate has exactly one row, also over an empty input.
        LogicalPlanBuilder::from(left).cross_join(summary)?.build()?
    } else {
        let probe_keys: Vec<Expr> = on.iter().map(|(p, _)| p.clone()).collect();
        let summary_keys: Vec<Expr> = (0..on.len()).map(|i| col(&format!("k{i}"))).collect();
        LogicalPlanBuilder::from(left)
            .join_with_expr_keys(summary, JoinType::Left, (probe_keys, summary_keys), None)?
            .build()?
    };
    Ok((joined, Summary { rows: col("n"), values: col("nn"), min: col("lo"), max: col("hi") }))
}

/// `x op ANY / ALL` from the summary of x's set (see the module documentation).
pub(super) fn decide(x: Expr, op: Operator, quantifier: SetQuantifier, s: &Summary) -> Result<Expr> {
    let any = quantifier == SetQuantifier::Any;
    let (lo, hi) = (s.min.clone(), s.max.clone());
    // ANY: some non-NULL value v has `x op v` TRUE; ALL: some has it FALSE.
    let decisive = match (op, any) {
        (Operator::Lt, true) => x.clone().lt(hi),
        (Operator::LtEq, true) => x.clone().lt_eq(hi),
        (Operator::Gt, true) => x.clone().gt(lo),
        (Operator::GtEq, true) => x.clone().gt_eq(lo),
        (Operator::NotEq, true) | (Operator::Eq, false) => x.clone().not_eq(lo).or(x.clone().not_eq(hi)),
        (Operator::Lt, false) => x.clone().gt_eq(lo),
        (Operator::LtEq, false) => x.clone().gt(lo),
        (Operator::Gt, false) => x.clone().lt_eq(hi),
        (Operator::GtEq, false) => x.clone().lt(hi),
        (op, q) => return plan_err!("setfusion: no summary rule for {op} {q:?} (the IN paths take = ANY and <> ALL)"),
    };
    let null = lit(ScalarValue::Boolean(None));
    let empty = s.rows.clone().is_null().or(s.rows.clone().eq(lit(0i64)));
    // With a non-NULL value (nn > 0) min and max are not NULL, so `decisive` is two-valued.
    when(empty, lit(!any))
        .when(x.is_null(), null.clone())
        .when(s.values.clone().gt(lit(0i64)).and(decisive), lit(any))
        .when(s.values.clone().lt(s.rows.clone()), null)
        .otherwise(lit(!any))
}

/// SQL's definition over EXISTS: ANY is `CASE WHEN EXISTS (S WHERE (x op v)
/// IS TRUE) THEN TRUE WHEN EXISTS (S WHERE (x op v) IS NULL) THEN NULL ELSE
/// FALSE END`, ALL the same with IS FALSE / FALSE and TRUE swapped. `x`
/// reads `outer` (it becomes an outer reference); the subquery's value is
/// projected as `value_name`, so no outer column shares its name.
pub(super) fn as_exists(
    x: &Expr,
    subquery: &Subquery,
    op: Operator,
    quantifier: SetQuantifier,
    outer: &DFSchema,
    value_name: &str,
) -> Result<Expr> {
    let sub = subquery.subquery.as_ref();
    if sub.schema().fields().len() != 1 {
        return plan_err!("setfusion: a quantified comparison's subquery must return one column");
    }
    let value = Expr::Column(Column::from(sub.schema().qualified_field(0)));
    let named = LogicalPlanBuilder::from(sub.clone()).project(vec![value.alias(value_name)])?.build()?;
    let x_outer = x
        .clone()
        .transform(|e| match e {
            Expr::Column(c) => {
                let field = outer.field_from_column(&c)?;
                Ok(Transformed::yes(Expr::OuterReferenceColumn(Arc::clone(field), c)))
            }
            e => Ok(Transformed::no(e)),
        })
        .data()?;
    let comparison = binary_expr(x_outer, op, Expr::Column(Column::new_unqualified(value_name)));
    let exists = |test: Expr| -> Result<Expr> {
        let plan = LogicalPlanBuilder::from(named.clone()).filter(test)?.build()?;
        let outer_ref_columns = plan.all_out_ref_exprs();
        Ok(Expr::Exists(Exists::new(
            Subquery { subquery: Arc::new(plan), outer_ref_columns, spans: subquery.spans.clone() },
            false,
        )))
    };
    let null = lit(ScalarValue::Boolean(None));
    let is_null = exists(comparison.clone().is_null())?;
    match quantifier {
        SetQuantifier::Any => when(exists(comparison.is_true())?, lit(true)).when(is_null, null).otherwise(lit(false)),
        SetQuantifier::All => when(exists(comparison.is_false())?, lit(false)).when(is_null, null).otherwise(lit(true)),
    }
}
