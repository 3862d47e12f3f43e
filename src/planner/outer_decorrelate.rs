//! Subqueries whose correlation sits under the NULL-supplying side of an
//! outer join, decorrelated exactly: the domain ("magic set") rewrite of
//! Neumann & Kemper, "Unnesting Arbitrary Queries" (BTW 2015).
//!
//! DataFusion's pull-up lifts a correlated predicate to the top of the
//! subquery; lifted out of the NULL-supplying side of an outer join it drops
//! the rows the join adds with NULLs for each outer row. Here instead the
//! subquery is evaluated once for every distinct value of the outer columns
//! it reads (the domain D = `SELECT DISTINCT c.. FROM outer`): every node
//! that reads an outer column, or sits above one that does, is rewritten to
//! carry D's columns (`__sf_d{j}`, last in its output) and to read them where
//! it read the outer columns; a subtree that reads no outer column joins D
//! (a cross join) only where its parent needs it to carry D. An outer join
//! whose NULL-supplying side carries D carries it on both sides, and its ON
//! also asks the two sides' D values to be the same value, so each outer
//! value gets its own copy of the preserved side and of its NULL-extended
//! rows. The result, restricted to the rows whose D value is `v`, is the
//! subquery's answer for the outer value `v`, also for a NULL `v` (a
//! correlated `s.i = t.i` then keeps no row below the outer join, but the
//! preserved side's NULL-extended rows remain).
//!
//! The domain values are matched NULL-safely with two non-NULL keys per
//! column, `d IS NULL` and `CASE WHEN d IS NULL THEN <a default> ELSE d END`
//! (injective, and plain equalities, so hash joins and setfusion's mark
//! join, where NULL equals nothing, take them as keys).
//!
//! The mark-join rule also uses it for correlated subqueries DataFusion's
//! pull-up does not take (a derived table that renames a correlated column).
//!
//! Shapes the rewrite does not keep exact are refused with a planning error:
//! an aggregate without GROUP BY, LIMIT, window functions, set operations,
//! DISTINCT ON, a nested correlated subquery, or a correlation that reaches
//! past the query the subquery is in.

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::alias::AliasGenerator;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::common::{plan_err, Column, ScalarValue};
use datafusion::error::Result;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{
    lit, when, Aggregate, Distinct, Expr, Filter, Join, JoinType, LogicalPlan, LogicalPlanBuilder, Projection,
    Subquery, SubqueryAlias,
};

/// A subquery made uncorrelated, for a join with the outer query `left`.
pub(super) struct Unnested {
    /// The subquery's value (when asked for) then its domain keys, under one alias.
    pub build: LogicalPlan,
    /// Domain keys: (expression over `left`, column of `build`).
    pub on: Vec<(Expr, Expr)>,
    /// The subquery's first output column, in `build` (when asked for).
    pub output: Option<Expr>,
}

/// `subquery`, correlated with the outer query `left`, made uncorrelated
/// (see the module documentation); `value`: keep its first output column.
/// An error (a planning error naming the reason) when the shape cannot be
/// rewritten exactly.
pub(super) fn unnest(
    left: &LogicalPlan,
    subquery: &Subquery,
    value: bool,
    alias: &str,
    aliases: &AliasGenerator,
) -> Result<Unnested> {
    if holds_outer(left) {
        return refuse("the query around the subquery is itself correlated");
    }
    let mut outer: Vec<Column> = Vec::new();
    for e in subquery.subquery.all_out_ref_exprs() {
        let Expr::OuterReferenceColumn(_, c) = e else { return refuse("an outer reference that is not a column") };
        if !left.schema().has_column(&c) {
            return refuse(&format!("the correlated column {c} belongs to a query further out"));
        }
        if !outer.contains(&c) {
            outer.push(c);
        }
    }
    if outer.is_empty() {
        return refuse("no correlated column found");
    }
    let mut defaults = Vec::with_capacity(outer.len());
    for c in &outer {
        let ty = left.schema().qualified_field_from_column(c)?.1.data_type().clone();
        match (&ty, ScalarValue::new_default(&ty)) {
            (DataType::Null, _) | (_, Err(_)) => {
                return refuse(&format!("no NULL-safe key for the correlated column {c} of type {ty}"))
            }
            (_, Ok(v)) if v.is_null() => {
                return refuse(&format!("no NULL-safe key for the correlated column {c} of type {ty}"))
            }
            (_, Ok(v)) => defaults.push(v),
        }
    }
    let domain = Domain { left, outer, defaults, aliases };
    let lifted = domain.lift(&subquery.subquery)?;
    let first = lifted.plan.schema().columns().into_iter().next();
    let mut exprs = Vec::new();
    if value {
        let Some(first) = first else { return refuse("a subquery without columns") };
        exprs.push(Expr::Column(first).alias("__sf_value"));
    }
    let keys = domain.keys(&lifted.dom);
    let key_names: Vec<String> = (0..keys.len()).map(|k| format!("__sf_k{k}")).collect();
    exprs.extend(keys.into_iter().zip(&key_names).map(|(k, name)| k.alias(name)));
    let build = LogicalPlanBuilder::from(lifted.plan).project(exprs)?.alias(alias)?.build()?;
    let probe_keys = domain.keys(&domain.outer.iter().cloned().map(Expr::Column).collect::<Vec<_>>());
    let on = probe_keys
        .into_iter()
        .zip(&key_names)
        .map(|(p, name)| (p, Expr::Column(Column::new(Some(alias), name))))
        .collect();
    let output = value.then(|| Expr::Column(Column::new(Some(alias), "__sf_value")));
    Ok(Unnested { build, on, output })
}

fn refuse<T>(why: &str) -> Result<T> {
    plan_err!("{why}")
}

fn holds_outer(plan: &LogicalPlan) -> bool {
    !plan.all_out_ref_exprs().is_empty()
}

/// A subquery expression with outer references (to any query) among a node's own expressions.
fn has_correlated_subquery(plan: &LogicalPlan) -> bool {
    let mut found = false;
    let _ = plan.apply_expressions(|e| {
        e.apply(|e| {
            let subquery = match e {
                Expr::Exists(x) => Some(&x.subquery),
                Expr::InSubquery(x) => Some(&x.subquery),
                Expr::ScalarSubquery(s) => Some(s),
                Expr::SetComparison(x) => Some(&x.subquery),
                _ => None,
            };
            if subquery.is_some_and(|s| !s.outer_ref_columns.is_empty()) {
                found = true;
                return Ok(TreeNodeRecursion::Stop);
            }
            Ok(TreeNodeRecursion::Continue)
        })
    });
    found
}

/// The outer columns a subquery reads, and where their domain comes from.
struct Domain<'a> {
    left: &'a LogicalPlan,
    outer: Vec<Column>,
    /// A non-NULL value of each outer column's type (the NULL-safe key's stand-in for NULL).
    defaults: Vec<ScalarValue>,
    aliases: &'a AliasGenerator,
}

/// A rewritten plan: the original's columns, then the domain columns `dom`.
struct Lifted {
    plan: LogicalPlan,
    dom: Vec<Expr>,
}

impl Domain<'_> {
    /// A fresh copy of D under its own alias, and its columns.
    fn instance(&self) -> Result<(LogicalPlan, Vec<Expr>)> {
        let alias = self.aliases.next("__sf_domain");
        let exprs = self.outer.iter().enumerate().map(|(j, c)| Expr::Column(c.clone()).alias(format!("__sf_d{j}")));
        let plan =
            LogicalPlanBuilder::from(self.left.clone()).project(exprs)?.distinct()?.alias(alias.clone())?.build()?;
        let dom = (0..self.outer.len())
            .map(|j| Expr::Column(Column::new(Some(alias.clone()), format!("__sf_d{j}"))))
            .collect();
        Ok((plan, dom))
    }

    /// Two non-NULL keys per domain column, equal exactly when the values are not distinct.
    fn keys(&self, dom: &[Expr]) -> Vec<Expr> {
        dom.iter()
            .zip(&self.defaults)
            .flat_map(|(d, default)| {
                let value = when(d.clone().is_null(), lit(default.clone())).otherwise(d.clone()).expect("one WHEN");
                [d.clone().is_null(), value]
            })
            .collect()
    }

    /// `e` reading the domain columns `dom` where it read the outer columns.
    fn substitute(&self, e: &Expr, dom: &[Expr]) -> Result<Expr> {
        e.clone()
            .transform(|e| match e {
                Expr::OuterReferenceColumn(_, c) => match self.outer.iter().position(|o| *o == c) {
                    Some(j) => Ok(Transformed::yes(dom[j].clone())),
                    None => plan_err!("the correlated column {c} belongs to a query further out"),
                },
                e => Ok(Transformed::no(e)),
            })
            .data()
    }

    /// [`Self::substitute`] keeping the expression's output name (a projection's, an aggregate's).
    fn substitute_named(&self, e: &Expr, dom: &[Expr]) -> Result<Expr> {
        if !e.contains_outer() {
            return Ok(e.clone());
        }
        let saved = NamePreserver::new_for_projection().save(e);
        Ok(saved.restore(self.substitute(e, dom)?))
    }

    /// A plan reading no outer column, carrying D: every row once per domain value.
    fn cross(&self, plan: &LogicalPlan) -> Result<Lifted> {
        let (domain, dom) = self.instance()?;
        let plan = LogicalPlanBuilder::from(plan.clone()).cross_join(domain)?.build()?;
        Ok(Lifted { plan, dom })
    }

    /// `plan`'s columns in their order, then `dom` under a fresh qualifier (the
    /// node's own dom columns: two sides of a join above must not share names).
    fn reorder(&self, plan: LogicalPlan, columns: Vec<Column>, dom: Vec<Expr>) -> Result<Lifted> {
        let qualifier = self.aliases.next("__sf_domain");
        let named: Vec<Expr> = dom
            .into_iter()
            .enumerate()
            .map(|(j, d)| d.alias_qualified(Some(qualifier.as_str()), format!("__sf_d{j}")))
            .collect();
        let dom = (0..named.len())
            .map(|j| Expr::Column(Column::new(Some(qualifier.as_str()), format!("__sf_d{j}"))))
            .collect();
        let exprs = columns.into_iter().map(Expr::Column).chain(named).collect();
        let plan = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(plan))?);
        Ok(Lifted { plan, dom })
    }

    /// `plan` rewritten to carry D (see the module documentation).
    fn lift(&self, plan: &LogicalPlan) -> Result<Lifted> {
        if !holds_outer(plan) {
            return self.cross(plan);
        }
        if has_correlated_subquery(plan) {
            return refuse("a correlated subquery inside the subquery");
        }
        match plan {
            LogicalPlan::Projection(p) => {
                let input = self.lift(&p.input)?;
                let mut exprs =
                    p.expr.iter().map(|e| self.substitute_named(e, &input.dom)).collect::<Result<Vec<_>>>()?;
                exprs.extend(input.dom.iter().cloned());
                let plan = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(input.plan))?);
                Ok(Lifted { plan, dom: input.dom })
            }
            LogicalPlan::Filter(f) => {
                let input = self.lift(&f.input)?;
                let predicate = self.substitute(&f.predicate, &input.dom)?;
                let plan = LogicalPlan::Filter(Filter::try_new(predicate, Arc::new(input.plan))?);
                Ok(Lifted { plan, dom: input.dom })
            }
            LogicalPlan::SubqueryAlias(a) => {
                let input = self.lift(&a.input)?;
                let n = input.dom.len();
                let plan = LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(Arc::new(input.plan), a.alias.clone())?);
                let columns = plan.schema().columns();
                let dom = columns[columns.len() - n..].iter().cloned().map(Expr::Column).collect();
                Ok(Lifted { plan, dom })
            }
            LogicalPlan::Distinct(Distinct::All(input)) => {
                let input = self.lift(input)?;
                Ok(Lifted { plan: LogicalPlan::Distinct(Distinct::All(Arc::new(input.plan))), dom: input.dom })
            }
            // Order does not change the set an IN / EXISTS / ANY / ALL reads.
            LogicalPlan::Sort(s) if s.fetch.is_none() => self.lift(&s.input),
            LogicalPlan::Aggregate(a) => {
                if a.group_expr.is_empty() {
                    // Grouped by D it would give no row for a value whose group is empty.
                    return refuse("an aggregate without GROUP BY");
                }
                if a.group_expr.iter().any(|e| matches!(e, Expr::GroupingSet(_))) {
                    return refuse("GROUPING SETS / ROLLUP / CUBE");
                }
                let input = self.lift(&a.input)?;
                let mut group =
                    a.group_expr.iter().map(|e| self.substitute_named(e, &input.dom)).collect::<Result<Vec<_>>>()?;
                group.extend(input.dom.iter().cloned());
                let aggr =
                    a.aggr_expr.iter().map(|e| self.substitute_named(e, &input.dom)).collect::<Result<Vec<_>>>()?;
                let plan = LogicalPlan::Aggregate(Aggregate::try_new(Arc::new(input.plan), group, aggr)?);
                self.reorder(plan, a.schema.columns(), input.dom)
            }
            LogicalPlan::Join(j) => self.lift_join(j),
            LogicalPlan::Limit(_) | LogicalPlan::Sort(_) => refuse("a LIMIT"),
            LogicalPlan::Window(_) => refuse("a window function"),
            LogicalPlan::Union(_) => refuse("a set operation"),
            other => refuse(&format!("a {} node", other.display())),
        }
    }

    /// A join: the preserved side carries D, and a NULL-supplying side that
    /// reads an outer column carries it too, matched on the same D value.
    fn lift_join(&self, j: &Join) -> Result<Lifted> {
        if j.on.iter().any(|(l, r)| l.contains_outer() || r.contains_outer()) {
            return refuse("a correlated join key");
        }
        let (reads_left, reads_right) = (holds_outer(&j.left), holds_outer(&j.right));
        use JoinType::*;
        let (lift_left, lift_right) = match j.join_type {
            // Only the ON reads the outer query: the left side carries D.
            Inner => (reads_left || !reads_right, reads_right),
            Left | LeftSemi | LeftAnti | LeftMark => (true, reads_right),
            Right | RightSemi | RightAnti | RightMark => (reads_left, true),
            Full => (true, true),
        };
        let left = if lift_left { Some(self.lift(&j.left)?) } else { None };
        let right = if lift_right { Some(self.lift(&j.right)?) } else { None };
        // In the ON both sides' D values are one (asked below), so either side's will do.
        let on_dom = match (&left, &right) {
            (Some(l), _) => l.dom.clone(),
            (None, Some(r)) => r.dom.clone(),
            (None, None) => unreachable!("a side carries D"),
        };
        let mut conjuncts: Vec<Expr> = j.filter.iter().map(|f| self.substitute(f, &on_dom)).collect::<Result<_>>()?;
        if let (Some(l), Some(r)) = (&left, &right) {
            conjuncts.extend(self.keys(&l.dom).into_iter().zip(self.keys(&r.dom)).map(|(a, b)| a.eq(b)));
        }
        let dom = match (j.join_type, &left, &right) {
            (Full, Some(l), Some(r)) => l
                .dom
                .iter()
                .zip(&r.dom)
                .map(|(a, b)| when(a.clone().is_not_null(), a.clone()).otherwise(b.clone()))
                .collect::<Result<Vec<_>>>()?,
            (Right | RightSemi | RightAnti | RightMark, _, Some(r)) => r.dom.clone(),
            (_, Some(l), _) => l.dom.clone(),
            (_, None, Some(r)) => r.dom.clone(),
            (_, None, None) => unreachable!("a side carries D"),
        };
        let side = |lifted: Option<Lifted>, original: &Arc<LogicalPlan>| {
            lifted.map_or_else(|| Arc::clone(original), |l| Arc::new(l.plan))
        };
        let join = Join::try_new(
            side(left, &j.left),
            side(right, &j.right),
            j.on.clone(),
            conjunction(conjuncts),
            j.join_type,
            j.join_constraint,
            j.null_equality,
            j.null_aware,
        )?;
        self.reorder(LogicalPlan::Join(join), j.schema.columns(), dom)
    }
}
