//! Subquery predicates DataFusion gets wrong or refuses, as mark joins.
//!
//! DataFusion 55 turns a top-level `IN` / `EXISTS` / `NOT EXISTS` conjunct
//! and an uncorrelated top-level `NOT IN` into semi / anti joins, correctly
//! (where its decorrelation takes the subquery at all: it fails on some).
//! Anywhere else it fails: under OR its LeftMark join gives a two-valued mark
//! (`k NOT IN (..) OR p < 100` keeps rows it must not), in a SELECT list or
//! CASE it refuses the plan, and a correlated `NOT IN` fails as a null-aware
//! anti join with more than one key.
//!
//! The analyzer rule [`MarkJoinRule`] (after type coercion, before any
//! DataFusion decorrelation) takes exactly those subquery predicates: each
//! becomes a [`MarkJoinNode`] whose three-valued mark column replaces the
//! predicate in its expression. Subquery correlation is pulled up with
//! DataFusion's own `PullUpCorrelatedExpr`; its equalities become the join's
//! keys, anything else a residual filter. A subquery whose correlation sits
//! under the NULL-supplying side of an outer join (where the pull-up drops
//! the NULL-extended rows), or one the pull-up cannot take, is made
//! uncorrelated by the domain rewrite instead ([`super::outer_decorrelate`]);
//! the first kind is refused with a planning error where that rewrite does
//! not apply. Conjuncts without a subquery are
//! applied below the mark joins. [`MarkJoinPlanner`] plans the node as a
//! `MarkJoinExec`.

use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::catalog::Session;
use datafusion::common::alias::AliasGenerator;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::common::NullEquality;
use datafusion::common::{plan_err, Column, DFSchema, DFSchemaRef};
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::expr::{Exists, InSubquery, SetComparison, SetQuantifier};
use datafusion::logical_expr::expr_rewriter::{create_col_from_scalar_expr, replace_col, NamePreserver};
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::utils::{conjunction, split_conjunction_owned};
use datafusion::logical_expr::{
    Aggregate, BinaryExpr, Expr, ExprSchemable, Extension, Filter, Join, JoinConstraint, JoinType, LogicalPlan,
    LogicalPlanBuilder, Operator, Projection, Subquery, UserDefinedLogicalNode, UserDefinedLogicalNodeCore,
};
use datafusion::optimizer::decorrelate::PullUpCorrelatedExpr;
use datafusion::optimizer::AnalyzerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{ExtensionPlanner, PhysicalPlanner};

use crate::algo::select::SetOp;
use crate::config::{SetfusionConfig, Strategy};
use crate::exec::declined::SetfusionDeclinedExec;
use crate::exec::mark_join::{MarkJoinExec, MarkKind};
use crate::exec::pair_filter::PairFilter;

use super::{outer_decorrelate, quantified};

/// Every row of `probe` with a mark column (`mark`) answering the subquery
/// predicate for it. See the module documentation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MarkJoinNode {
    pub kind: MarkKind,
    pub probe: LogicalPlan,
    pub build: LogicalPlan,
    /// Correlation equalities: (probe expression, build expression).
    pub on: Vec<(Expr, Expr)>,
    /// IN only: (the probe expression, the subquery's output column).
    pub in_keys: Option<(Expr, Expr)>,
    /// The other correlated predicates, over both sides' columns.
    pub filter: Option<Expr>,
    pub mark: Column,
    schema: DFSchemaRef,
}

impl PartialOrd for MarkJoinNode {
    fn partial_cmp(&self, _other: &Self) -> Option<Ordering> {
        None
    }
}

impl MarkJoinNode {
    pub fn try_new(
        kind: MarkKind,
        probe: LogicalPlan,
        build: LogicalPlan,
        on: Vec<(Expr, Expr)>,
        in_keys: Option<(Expr, Expr)>,
        filter: Option<Expr>,
        mark: Column,
    ) -> Result<Self> {
        let field = Field::new(&mark.name, DataType::Boolean, kind == MarkKind::In);
        let qualifier = mark.relation.clone().unwrap_or_else(|| "".into());
        let mark_schema = DFSchema::try_from_qualified_schema(qualifier, &Schema::new(vec![field]))?;
        let schema = Arc::new(probe.schema().join(&mark_schema)?);
        Ok(Self { kind, probe, build, on, in_keys, filter, mark, schema })
    }
}

impl UserDefinedLogicalNodeCore for MarkJoinNode {
    fn name(&self) -> &str {
        "MarkJoin"
    }
    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.probe, &self.build]
    }
    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }
    /// `on` pairs, then the IN key pair, then the filter.
    fn expressions(&self) -> Vec<Expr> {
        let pairs = self.on.iter().chain(&self.in_keys).flat_map(|(p, b)| [p.clone(), b.clone()]);
        pairs.chain(self.filter.clone()).collect()
    }
    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let kind = if self.kind == MarkKind::In { "IN" } else { "EXISTS" };
        write!(f, "MarkJoin: {kind}, mark={}", self.mark)?;
        if let Some((p, b)) = &self.in_keys {
            write!(f, ", key={p} = {b}")?;
        }
        for (p, b) in &self.on {
            write!(f, ", on {p} = {b}")?;
        }
        if let Some(filter) = &self.filter {
            write!(f, ", filter={filter}")?;
        }
        Ok(())
    }
    fn with_exprs_and_inputs(&self, exprs: Vec<Expr>, mut inputs: Vec<LogicalPlan>) -> Result<Self> {
        let build = inputs.pop().expect("two inputs");
        let probe = inputs.pop().expect("two inputs");
        let mut exprs = exprs.into_iter();
        let mut pair = || (exprs.next().expect("pair"), exprs.next().expect("pair"));
        let on = (0..self.on.len()).map(|_| pair()).collect();
        let in_keys = self.in_keys.as_ref().map(|_| pair());
        let filter = self.filter.as_ref().map(|_| exprs.next().expect("filter"));
        Self::try_new(self.kind, probe, build, on, in_keys, filter, self.mark.clone())
    }
    /// Every probe column the parent reads (the node's own expressions add
    /// theirs), so projections are pushed into both inputs.
    fn necessary_children_exprs(&self, output_columns: &[usize]) -> Option<Vec<Vec<usize>>> {
        let probe_len = self.probe.schema().fields().len();
        Some(vec![output_columns.iter().copied().filter(|&i| i < probe_len).collect(), Vec::new()])
    }
    fn supports_limit_pushdown(&self) -> bool {
        false
    }
}

/// Analyzer rule: subquery predicates DataFusion cannot answer -> [`MarkJoinNode`]s.
#[derive(Debug, Default)]
pub struct MarkJoinRule;

impl AnalyzerRule for MarkJoinRule {
    fn analyze(&self, plan: LogicalPlan, config: &ConfigOptions) -> Result<LogicalPlan> {
        if !SetfusionConfig::from_options(config).enabled {
            return Ok(plan);
        }
        let aliases = AliasGenerator::new();
        let plan = plan.transform_up_with_subqueries(|p| rewrite_node(p, &aliases)).data()?;
        // What the rewrite left for DataFusion must not hold a correlation its decorrelation gets wrong.
        plan.apply_with_subqueries(|p| {
            refuse_null_supplying_correlation(p)?;
            Ok(TreeNodeRecursion::Continue)
        })?;
        Ok(plan)
    }
    fn name(&self) -> &str {
        "setfusion_mark_joins"
    }
}

fn has_subquery(e: &Expr) -> bool {
    e.exists(|e| Ok(matches!(e, Expr::InSubquery(_) | Expr::Exists(_) | Expr::SetComparison(_)))).unwrap_or(false)
}

/// A WHERE conjunct DataFusion turns into a semi / anti join, correctly:
/// not one whose correlation sits under an outer join's NULL-supplying side
/// (its pull-up drops the NULL-extended rows; see [`outer_decorrelate`]).
fn datafusion_answers(e: &Expr) -> bool {
    let uncorrelated = |s: &Subquery| s.outer_ref_columns.is_empty();
    let pulls_up = |s: &Subquery| null_supplying_join(&s.subquery).is_none();
    match e {
        Expr::Exists(Exists { subquery, .. }) => pulls_up(subquery),
        Expr::InSubquery(InSubquery { negated, subquery, .. }) => {
            (!negated || uncorrelated(subquery)) && pulls_up(subquery)
        }
        Expr::Not(inner) => match inner.as_ref() {
            Expr::Exists(Exists { subquery, .. }) => pulls_up(subquery),
            Expr::InSubquery(InSubquery { negated, subquery, .. }) => {
                (*negated || uncorrelated(subquery)) && pulls_up(subquery)
            }
            _ => false,
        },
        _ => false,
    }
}

/// Does DataFusion's own decorrelation take this WHERE conjunct over
/// `input`? Its pull-up fails on some shapes it means to take (a correlated
/// derived table joined with another that reads the same table under new
/// names: "No field named y.c1"); those go the mark-join way instead, which
/// answers them.
fn datafusion_decorrelates(c: &Expr, input: &Arc<LogicalPlan>) -> bool {
    use datafusion::optimizer::decorrelate_predicate_subquery::DecorrelatePredicateSubquery;
    use datafusion::optimizer::{OptimizerContext, OptimizerRule};
    let Ok(filter) = Filter::try_new(c.clone(), Arc::clone(input)) else { return false };
    DecorrelatePredicateSubquery::new().rewrite(LogicalPlan::Filter(filter), &OptimizerContext::new()).is_ok()
}

fn rewrite_node(plan: LogicalPlan, aliases: &AliasGenerator) -> Result<Transformed<LogicalPlan>> {
    match plan {
        LogicalPlan::Filter(filter) if has_subquery(&filter.predicate) => rewrite_filter(filter, aliases),
        LogicalPlan::Projection(p) if p.expr.iter().any(has_subquery) => {
            let mut input = p.input.as_ref().clone();
            let (exprs, changed) = mark_output_exprs(p.expr, &mut input, aliases)?;
            let plan = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(input))?);
            Ok(if changed { Transformed::yes(plan) } else { Transformed::no(plan) })
        }
        LogicalPlan::Aggregate(a) if a.group_expr.iter().chain(&a.aggr_expr).any(has_subquery) => {
            let mut input = a.input.as_ref().clone();
            let (group, group_changed) = mark_output_exprs(a.group_expr, &mut input, aliases)?;
            let (aggr, aggr_changed) = mark_output_exprs(a.aggr_expr, &mut input, aliases)?;
            let plan = LogicalPlan::Aggregate(Aggregate::try_new(Arc::new(input), group, aggr)?);
            Ok(if group_changed || aggr_changed { Transformed::yes(plan) } else { Transformed::no(plan) })
        }
        LogicalPlan::Join(mut join)
            if join.join_type == JoinType::Inner && join.filter.as_ref().is_some_and(has_subquery) =>
        {
            // In an inner join's ON a predicate may as well filter the joined rows.
            let (with, without): (Vec<_>, Vec<_>) =
                split_conjunction_owned(join.filter.take().expect("checked")).into_iter().partition(has_subquery);
            join.filter = conjunction(without);
            let joined = LogicalPlan::Join(join);
            let filter = Filter::try_new(conjunction(with).expect("one at least"), Arc::new(joined))?;
            let out = rewrite_filter(filter, aliases)?;
            Ok(Transformed::yes(out.data))
        }
        other => Ok(Transformed::no(other)),
    }
}

/// Output expressions (a projection's, an aggregate's) with their subquery
/// predicates replaced by marks over `input` (which gains the mark joins),
/// under their original names; and whether any was replaced.
fn mark_output_exprs(exprs: Vec<Expr>, input: &mut LogicalPlan, aliases: &AliasGenerator) -> Result<(Vec<Expr>, bool)> {
    let preserver = NamePreserver::new_for_projection();
    let mut changed = false;
    let mut out = Vec::with_capacity(exprs.len());
    for e in exprs {
        if !has_subquery(&e) {
            out.push(e);
            continue;
        }
        let saved = preserver.save(&e);
        let (next, e, did) = mark_subqueries(input.clone(), e, aliases)?;
        *input = next;
        changed |= did;
        out.push(saved.restore(e));
    }
    Ok((out, changed))
}

/// A filter whose subquery predicates DataFusion cannot answer: plain
/// conjuncts first, then the mark joins, then the predicates over the marks;
/// the marks are projected away.
fn rewrite_filter(filter: Filter, aliases: &AliasGenerator) -> Result<Transformed<LogicalPlan>> {
    // `= ANY` / `<> ALL` first become IN / NOT IN, which DataFusion may answer.
    let mut normalized = false;
    let conjuncts = split_conjunction_owned(filter.predicate.clone())
        .into_iter()
        .map(|c| {
            let t = c.transform(|e| Ok(quantified::as_in_subquery(e)))?;
            normalized |= t.transformed;
            Ok(t.data)
        })
        .collect::<Result<Vec<_>>>()?;
    // Which subquery conjuncts DataFusion answers (its decorrelation tried once each).
    let left_to_datafusion: Vec<bool> = conjuncts
        .iter()
        .map(|c| has_subquery(c) && datafusion_answers(c) && datafusion_decorrelates(c, &filter.input))
        .collect();
    if conjuncts.iter().zip(&left_to_datafusion).all(|(c, &left)| !has_subquery(c) || left) {
        if normalized {
            let predicate = conjunction(conjuncts).expect("one at least");
            return Ok(Transformed::yes(LogicalPlan::Filter(Filter::try_new(predicate, filter.input)?)));
        }
        return Ok(Transformed::no(LogicalPlan::Filter(filter)));
    }
    let columns = filter.input.schema().columns();
    let (plain, with): (Vec<_>, Vec<_>) =
        conjuncts.into_iter().zip(left_to_datafusion).partition(|(c, _)| !has_subquery(c));
    let mut input = filter.input.as_ref().clone();
    if let Some(p) = conjunction(plain.into_iter().map(|(c, _)| c)) {
        input = LogicalPlan::Filter(Filter::try_new(p, Arc::new(input))?);
    }
    let mut above = Vec::with_capacity(with.len());
    let mut changed = normalized;
    for (c, left) in with {
        if left {
            above.push(c);
            continue;
        }
        let (next, c, did) = mark_subqueries(input, c, aliases)?;
        input = next;
        changed |= did;
        above.push(c);
    }
    if !changed {
        return Ok(Transformed::no(LogicalPlan::Filter(filter)));
    }
    let filtered = LogicalPlan::Filter(Filter::try_new(conjunction(above).expect("one at least"), Arc::new(input))?);
    let plan = LogicalPlanBuilder::from(filtered).project(columns.into_iter().map(Expr::Column))?.build()?;
    Ok(Transformed::yes(plan))
}

/// Replace every subquery predicate in `e` by a mark over `input`, adding
/// the mark joins to `input`. A subquery that cannot be decorrelated stays.
fn mark_subqueries(input: LogicalPlan, e: Expr, aliases: &AliasGenerator) -> Result<(LogicalPlan, Expr, bool)> {
    let mut input = input;
    let mut changed = false;
    let e = e
        .transform(|e| {
            let Transformed { data: e, transformed: normalized, .. } = quantified::as_in_subquery(e);
            if let Expr::SetComparison(sc) = &e {
                return match quantified_mark(&input, sc, aliases)? {
                    Some((plan, answer)) => {
                        input = plan;
                        changed = true;
                        Ok(Transformed::yes(answer))
                    }
                    None => Ok(Transformed::no(e)),
                };
            }
            let (subquery, in_expr, negated) = match &e {
                Expr::Exists(Exists { subquery, negated }) => (subquery, None, *negated),
                Expr::InSubquery(InSubquery { expr, subquery, negated }) => (subquery, Some(expr.as_ref()), *negated),
                _ => return Ok(Transformed::no(e)),
            };
            match mark_join(&input, subquery, in_expr, aliases)? {
                Some((plan, mark)) => {
                    input = plan;
                    changed = true;
                    let mark = Expr::Column(mark);
                    Ok(Transformed::yes(if negated { Expr::Not(Box::new(mark)) } else { mark }))
                }
                None => Ok(Transformed::new_transformed(e, normalized)),
            }
        })?
        .data;
    Ok((input, e, changed))
}

/// A subquery decorrelated by DataFusion's pull-up, as the build side of a join with `left`.
struct Decorrelated {
    /// The decorrelated subquery under `alias`.
    build: LogicalPlan,
    alias: String,
    /// Correlation equalities: (probe expression, build expression).
    on: Vec<(Expr, Expr)>,
    /// The other correlation predicates, over both sides.
    residual: Vec<Expr>,
    /// The subquery's first output column, under `alias` (None when it has no projection).
    output: Option<Expr>,
}

/// `subquery` decorrelated with `pull_up` against `left`; None when the
/// pull-up cannot decorrelate it, a correlation reaches past `left` (an
/// outer query further out), or an outer column shares its name with a
/// correlated column of the subquery (the pull-up strips outer references,
/// and the two would become one column).
fn decorrelate(
    left: &LogicalPlan,
    subquery: &Subquery,
    mut pull_up: PullUpCorrelatedExpr,
    prefix: &str,
    aliases: &AliasGenerator,
) -> Result<Option<Decorrelated>> {
    let sub = subquery.subquery.as_ref();
    let head = sub.head_output_expr()?;
    // The pull-up fails on some shapes (a derived table renaming a correlated
    // column): the domain rewrite may still take them.
    let Ok(decorrelated) = sub.clone().rewrite(&mut pull_up).data() else { return Ok(None) };
    if !pull_up.can_pull_up || pull_up.pull_up_having_expr.is_some() {
        return Ok(None);
    }
    // The pull-up renames the correlated columns it passes through a derived
    // table's alias by name, but not the lifted predicates, which may read
    // `b.c0` where the decorrelated plan has `x.c0`: matching by name would
    // work only by chance (or pick another column of that name).
    let outputs = decorrelated.schema().columns();
    if pull_up.join_filters.iter().flat_map(|f| f.column_refs()).any(|c| !outputs.contains(c)) {
        return Ok(None);
    }
    // The subquery's own columns in the correlation predicates, renamed under the alias.
    let correlated: BTreeSet<Column> = pull_up.correlated_subquery_cols_map.values().flatten().cloned().collect();
    let outer_named_alike = subquery
        .outer_ref_columns
        .iter()
        .any(|e| matches!(e, Expr::OuterReferenceColumn(_, c) if correlated.contains(c)));
    if outer_named_alike {
        return Ok(None);
    }
    let alias = aliases.next(prefix);
    // Under one alias two columns of one name (`x.c0`, `y.c0` of a join) would be one:
    // then every column is projected under a name of its position first.
    let fields = decorrelated.schema().columns();
    let mut names = std::collections::HashSet::new();
    let positional = !fields.iter().all(|c| names.insert(c.name.clone()));
    let name_of = |c: &Column| -> String {
        match fields.iter().position(|f| f == c) {
            Some(i) if positional => format!("__sf_c{i}"),
            _ => c.name.clone(),
        }
    };
    let decorrelated = if positional {
        let exprs = fields.iter().enumerate().map(|(i, c)| Expr::Column(c.clone()).alias(format!("__sf_c{i}")));
        LogicalPlanBuilder::from(decorrelated).project(exprs)?.build()?
    } else {
        decorrelated
    };
    let build = LogicalPlanBuilder::from(decorrelated).alias(alias.clone())?.build()?;
    let renamed: Vec<Column> = correlated.iter().map(|c| Column::new(Some(alias.clone()), name_of(c))).collect();
    let map: HashMap<&Column, &Column> = correlated.iter().zip(&renamed).collect();
    let correlation = match conjunction(pull_up.join_filters) {
        Some(f) => split_conjunction_owned(replace_col(f, &map)?),
        None => Vec::new(),
    };
    let (probe_schema, build_schema) = (left.schema(), build.schema());
    let (mut on, mut residual) = (Vec::new(), Vec::new());
    for c in correlation {
        if !c.column_refs().iter().all(|col| probe_schema.has_column(col) || build_schema.has_column(col)) {
            return Ok(None);
        }
        if let Expr::BinaryExpr(BinaryExpr { left: l, op: Operator::Eq, right: r }) = &c {
            match (side(l, probe_schema, build_schema), side(r, probe_schema, build_schema)) {
                (Some(true), Some(false)) if same_type(l, r, probe_schema, build_schema) => {
                    on.push((l.as_ref().clone(), r.as_ref().clone()));
                    continue;
                }
                (Some(false), Some(true)) if same_type(r, l, probe_schema, build_schema) => {
                    on.push((r.as_ref().clone(), l.as_ref().clone()));
                    continue;
                }
                _ => {}
            }
        }
        residual.push(c);
    }
    // The pull-up keeps the subquery's own outputs first: its head is the first column.
    let output = match head {
        Some(_) if positional => Some(Expr::Column(Column::new(Some(alias.clone()), "__sf_c0"))),
        head => head.map(|out| create_col_from_scalar_expr(&out, alias.clone()).map(Expr::Column)).transpose()?,
    };
    Ok(Some(Decorrelated { build, alias, on, residual, output }))
}

/// Which side an expression reads: Some(true) the probe, Some(false) the build, None both or neither.
fn side(e: &Expr, probe: &DFSchema, build: &DFSchema) -> Option<bool> {
    let cols = e.column_refs();
    if cols.is_empty() {
        None
    } else if cols.iter().all(|c| probe.has_column(c)) {
        Some(true)
    } else if cols.iter().all(|c| build.has_column(c)) {
        Some(false)
    } else {
        None
    }
}

/// A probe expression and a build expression of one type.
fn same_type(p: &Expr, b: &Expr, probe: &DFSchema, build: &DFSchema) -> bool {
    matches!((p.get_type(probe), b.get_type(build)), (Ok(x), Ok(y)) if x == y)
}

/// `left` with a mark join against the decorrelated `subquery`; None when
/// it cannot be decorrelated exactly (see [`decorrelate`], [`hazards`]).
fn mark_join(
    left: &LogicalPlan,
    subquery: &Subquery,
    in_expr: Option<&Expr>,
    aliases: &AliasGenerator,
) -> Result<Option<(LogicalPlan, Column)>> {
    let sub = subquery.subquery.as_ref();
    if let Some(join) = null_supplying_join(sub) {
        return outer_mark_join(left, subquery, in_expr, join, aliases).map(Some);
    }
    let output = match (in_expr, sub.head_output_expr()?) {
        (Some(_), None) => return Ok(None),
        (_, output) => output,
    };
    // DataFusion drops a correlated LIMIT of an EXISTS subquery (right for EXISTS), and refuses one of IN.
    if let Some(h) = hazards(sub, in_expr.is_none()).first() {
        crate::util::trace(&format!("setfusion leaves a subquery predicate to DataFusion: {h}"));
        return Ok(None);
    }
    let in_predicate = in_expr.zip(output).map(|(e, out)| e.clone().eq(out));
    // The pull-up drops a correlation predicate equal to the IN predicate (a
    // semi join needs it once), but for a mark it is not redundant: in
    // `y IN (SELECT i.y FROM i WHERE i.y = o.y)` a NULL `o.y` has an empty
    // group (FALSE), not a NULL answer. The pull-up only tests the predicate
    // for presence and for that equality, so it gets one that equals nothing.
    let presence = in_predicate.clone().map(|p| Expr::IsTrue(Box::new(p)));
    let pull_up =
        PullUpCorrelatedExpr::new().with_in_predicate_opt(presence).with_exists_sub_query(in_predicate.is_none());
    let Some(d) = decorrelate(left, subquery, pull_up, "__sf_mark", aliases)? else {
        // Exact where it applies; else DataFusion's own decorrelation, as before.
        return Ok(domain_mark_join(left, subquery, in_expr, aliases).ok());
    };
    let in_keys = match (in_expr, d.output) {
        (Some(e), Some(out)) => {
            let (probe_schema, build_schema) = (left.schema(), d.build.schema());
            if !same_type(e, &out, probe_schema, build_schema) || side(e, probe_schema, build_schema) == Some(false) {
                return Ok(None);
            }
            Some((e.clone(), out))
        }
        _ => None,
    };
    let kind = if in_keys.is_some() { MarkKind::In } else { MarkKind::Exists };
    let mark = Column::new(Some(d.alias), "mark");
    let node =
        MarkJoinNode::try_new(kind, left.clone(), d.build, d.on, in_keys, conjunction(d.residual), mark.clone())?;
    Ok(Some((LogicalPlan::Extension(Extension { node: Arc::new(node) }), mark)))
}

/// The outer join whose NULL-supplying side holds a correlated predicate of a subquery plan, if any.
fn null_supplying_join(plan: &LogicalPlan) -> Option<JoinType> {
    hazards(plan, true).into_iter().find_map(|h| match h {
        Hazard::NullSupplying(j) => Some(j),
        Hazard::Other(_) => None,
    })
}

/// The planning error for a subquery predicate (`what`) whose correlation
/// under `join`'s NULL-supplying side setfusion cannot decorrelate exactly.
fn null_supplying_error(what: &str, join: JoinType, why: &str) -> DataFusionError {
    DataFusionError::Plan(format!(
        "setfusion: not supported: {what} (subquery) with a correlated predicate under the NULL-supplying side of a {} JOIN \
         inside the subquery: {why}",
        join.to_string().to_uppercase()
    ))
}

/// The reason in a planning error (its text without DataFusion's prefix).
fn reason(e: DataFusionError) -> String {
    match e {
        DataFusionError::Plan(why) => why,
        e => e.strip_backtrace(),
    }
}

/// A mark join over the subquery made uncorrelated by the domain rewrite
/// ([`outer_decorrelate`]), joined on its domain keys: for a correlation
/// under an outer join's NULL-supplying side, and for correlated shapes
/// DataFusion's pull-up does not take. A planning error with the reason
/// when the rewrite does not apply.
fn domain_mark_join(
    left: &LogicalPlan,
    subquery: &Subquery,
    in_expr: Option<&Expr>,
    aliases: &AliasGenerator,
) -> Result<(LogicalPlan, Column)> {
    if let Some(e) = in_expr {
        if e.contains_outer() || !e.column_refs().iter().all(|c| left.schema().has_column(c)) {
            return plan_err!("an IN value that reads a query further out");
        }
    }
    let alias = aliases.next("__sf_outer");
    let u = outer_decorrelate::unnest(left, subquery, in_expr.is_some(), &alias, aliases)?;
    let in_keys = match (in_expr, u.output) {
        (Some(e), Some(out)) => {
            if !same_type(e, &out, left.schema(), u.build.schema()) {
                return plan_err!("an IN value of another type than the subquery's column");
            }
            Some((e.clone(), out))
        }
        _ => None,
    };
    let kind = if in_keys.is_some() { MarkKind::In } else { MarkKind::Exists };
    let mark = Column::new(Some(alias), "mark");
    let node = MarkJoinNode::try_new(kind, left.clone(), u.build, u.on, in_keys, None, mark.clone())?;
    Ok((LogicalPlan::Extension(Extension { node: Arc::new(node) }), mark))
}

/// [`domain_mark_join`] for a correlation under `join`'s NULL-supplying side:
/// its failure is a planning error naming the predicate.
fn outer_mark_join(
    left: &LogicalPlan,
    subquery: &Subquery,
    in_expr: Option<&Expr>,
    join: JoinType,
    aliases: &AliasGenerator,
) -> Result<(LogicalPlan, Column)> {
    let what = if in_expr.is_some() { "IN" } else { "EXISTS" };
    domain_mark_join(left, subquery, in_expr, aliases)
        .map_err(|e| null_supplying_error(what, join, &format!("its exact rewrite does not take {}", reason(e))))
}

/// `x op ANY / ALL (subquery)` over the subquery made uncorrelated by the
/// domain rewrite: the summary per domain value, as [`quantified_mark`].
fn domain_quantified(left: &LogicalPlan, sc: &SetComparison, aliases: &AliasGenerator) -> Result<(LogicalPlan, Expr)> {
    let alias = aliases.next("__sf_quantified");
    let u = outer_decorrelate::unnest(left, &sc.subquery, true, &alias, aliases)?;
    let value = u.output.expect("the value was asked for");
    let (x, value) = quantified::comparable(sc.expr.as_ref().clone(), value, left.schema(), u.build.schema())?;
    let (plan, summary) = quantified::summary_join(left.clone(), u.build, u.on, value, &format!("{alias}_summary"))?;
    Ok((plan, quantified::decide(x, sc.op, sc.quantifier, &summary)?))
}

/// `x op ANY / ALL (subquery)` (op not `=` ANY / `<>` ALL, which are IN)
/// over `left`: the plan with what the answer reads, and the answer; None
/// when it cannot be decorrelated exactly. See [`super::quantified`].
fn quantified_mark(
    left: &LogicalPlan,
    sc: &SetComparison,
    aliases: &AliasGenerator,
) -> Result<Option<(LogicalPlan, Expr)>> {
    let x = sc.expr.as_ref();
    let sub = sc.subquery.subquery.as_ref();
    if x.contains_outer() || !x.column_refs().iter().all(|c| left.schema().has_column(c)) {
        return Ok(None);
    }
    if let Some(join) = null_supplying_join(sub) {
        let what = if sc.quantifier == SetQuantifier::Any { "ANY" } else { "ALL" };
        return domain_quantified(left, sc, aliases)
            .map(Some)
            .map_err(|e| null_supplying_error(what, join, &format!("its exact rewrite does not take {}", reason(e))));
    }
    if !hazards(sub, false).is_empty() {
        return Ok(None);
    }
    let Some(d) = decorrelate(left, &sc.subquery, PullUpCorrelatedExpr::new(), "__sf_quantified", aliases)? else {
        return Ok(domain_quantified(left, sc, aliases).ok());
    };
    if d.residual.is_empty() {
        let Some(value) = d.output else { return Ok(None) };
        let (x, value) = quantified::comparable(x.clone(), value, left.schema(), d.build.schema())?;
        let (plan, summary) =
            quantified::summary_join(left.clone(), d.build, d.on, value, &format!("{}_summary", d.alias))?;
        return Ok(Some((plan, quantified::decide(x, sc.op, sc.quantifier, &summary)?)));
    }
    // A residual correlation: a summary per group cannot answer; SQL's EXISTS form, as mark joins.
    let case =
        quantified::as_exists(x, &sc.subquery, sc.op, sc.quantifier, left.schema(), &aliases.next("__sf_value"))?;
    let (plan, e, _) = mark_subqueries(left.clone(), case, aliases)?;
    Ok((!has_subquery(&e)).then_some((plan, e)))
}

/// Why DataFusion's pull-up of a subquery's correlated predicates would
/// change the rows the subquery gives an outer row.
#[derive(Debug, Clone, PartialEq)]
enum Hazard {
    /// Under the NULL-supplying side of an outer join: the pull-up lifts the
    /// predicate above the join, which then drops the NULL-extended rows the
    /// join adds per outer row.
    NullSupplying(JoinType),
    /// Anything else the pull-up does not keep exact.
    Other(&'static str),
}

impl fmt::Display for Hazard {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Hazard::NullSupplying(j) => write!(
                f,
                "a correlated predicate under the NULL-supplying side of a {} JOIN",
                j.to_string().to_uppercase()
            ),
            Hazard::Other(why) => f.write_str(why),
        }
    }
}

fn holds_outer(plan: &LogicalPlan) -> bool {
    !plan.all_out_ref_exprs().is_empty()
}

/// Every [`Hazard`] of a subquery plan; `limit_ok`: a LIMIT above a
/// correlated predicate may go (an EXISTS subquery's).
fn hazards(plan: &LogicalPlan, limit_ok: bool) -> Vec<Hazard> {
    let mut out = Vec::new();
    collect_hazards(plan, limit_ok, &mut out);
    out
}

fn collect_hazards(plan: &LogicalPlan, limit_ok: bool, out: &mut Vec<Hazard>) {
    if !holds_outer(plan) {
        return;
    }
    match plan {
        LogicalPlan::Join(j) => {
            let (left_kept, right_kept) = match j.join_type {
                JoinType::Inner => (true, true),
                JoinType::Left | JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark => (true, false),
                JoinType::Right | JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark => (false, true),
                JoinType::Full => (false, false),
            };
            for (child, kept) in [(j.left.as_ref(), left_kept), (j.right.as_ref(), right_kept)] {
                if !kept && holds_outer(child) {
                    out.push(match j.join_type {
                        JoinType::Left | JoinType::Right | JoinType::Full => Hazard::NullSupplying(j.join_type),
                        _ => Hazard::Other("a correlated predicate in the filtering side of a semi / anti join"),
                    });
                }
            }
        }
        LogicalPlan::Aggregate(a) if a.group_expr.is_empty() && holds_outer(&a.input) => {
            // Decorrelated it groups by the correlation: an empty group loses the one row it has.
            out.push(Hazard::Other("a correlated predicate under an aggregate without GROUP BY"));
        }
        LogicalPlan::Limit(l) if !limit_ok && holds_outer(&l.input) => {
            out.push(Hazard::Other("a correlated predicate under a LIMIT"))
        }
        LogicalPlan::Window(w) if holds_outer(&w.input) => {
            out.push(Hazard::Other("a correlated predicate under a window function"))
        }
        _ => {}
    }
    plan.inputs().into_iter().for_each(|c| collect_hazards(c, limit_ok, out));
}

/// Refuse, with a clear error, a subquery predicate of `plan` (left to
/// DataFusion) whose correlation sits under the NULL-supplying side of an
/// outer join inside the subquery: DataFusion's decorrelation would drop the
/// join's NULL-extended rows and answer wrongly. The mark-join rule rewrites
/// those it reaches ([`outer_decorrelate`]); this catches the others (a
/// subquery in an outer join's ON, in ORDER BY, ...).
fn refuse_null_supplying_correlation(plan: &LogicalPlan) -> Result<()> {
    let mut refused = None;
    plan.apply_expressions(|e| {
        e.apply(|e| {
            let (what, subquery) = match e {
                Expr::InSubquery(InSubquery { subquery, negated, .. }) => {
                    (if *negated { "NOT IN" } else { "IN" }, subquery)
                }
                Expr::Exists(Exists { subquery, negated }) => {
                    (if *negated { "NOT EXISTS" } else { "EXISTS" }, subquery)
                }
                Expr::SetComparison(SetComparison { subquery, quantifier, .. }) => {
                    (if *quantifier == SetQuantifier::Any { "ANY" } else { "ALL" }, subquery)
                }
                _ => return Ok(TreeNodeRecursion::Continue),
            };
            if let Some(join) = null_supplying_join(&subquery.subquery) {
                let why = "setfusion's exact rewrite does not reach a subquery in this position, \
                           and decorrelating it would drop the join's NULL-extended rows and answer wrongly";
                refused = Some(null_supplying_error(what, join, why));
                return Ok(TreeNodeRecursion::Stop);
            }
            Ok(TreeNodeRecursion::Continue)
        })
    })?;
    match refused {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// DataFusion's LeftMark join gives this node's answer: an EXISTS mark is two-valued,
/// and an IN mark is too when neither key can be NULL.
fn datafusion_is_right(node: &MarkJoinNode) -> Result<bool> {
    Ok(match &node.in_keys {
        None => true,
        Some((p, b)) => !p.nullable(node.probe.schema().as_ref())? && !b.nullable(node.build.schema().as_ref())?,
    })
}

/// Physical planning of [`MarkJoinNode`]: setfusion's operator on the GPU when the cost
/// model says so; on the CPU, DataFusion's LeftMark join where its answer is right
/// (EXPLAIN says why), setfusion's CPU backend where it is not.
#[derive(Debug, Default)]
pub struct MarkJoinPlanner;

#[async_trait]
impl ExtensionPlanner for MarkJoinPlanner {
    async fn plan_extension(
        &self,
        planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        session_state: &dyn Session,
        planning_ctx: &PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(node) = node.as_any().downcast_ref::<MarkJoinNode>() else { return Ok(None) };
        let (probe, build) = (physical_inputs[0].clone(), physical_inputs[1].clone());
        let (probe_schema, build_schema) = (logical_inputs[0].schema(), logical_inputs[1].schema());
        let physical =
            |e: &Expr, schema: &DFSchema| planner.create_physical_expr(e, schema, session_state, planning_ctx);
        let pair =
            |(p, b): &(Expr, Expr)| -> Result<_> { Ok((physical(p, probe_schema)?, physical(b, build_schema)?)) };
        let on = node.on.iter().map(pair).collect::<Result<Vec<_>>>()?;
        let in_keys = node.in_keys.as_ref().map(pair).transpose()?;
        let filter = match &node.filter {
            None => None,
            Some(f) => {
                // The filter reads an intermediate batch of just the columns it names.
                let mut columns = Vec::new();
                let mut fields = Vec::new();
                for c in f.column_refs() {
                    let (from_probe, schema) =
                        if probe_schema.has_column(c) { (true, probe_schema) } else { (false, build_schema) };
                    let i = schema.index_of_column(c)?;
                    let (q, field) = schema.qualified_field(i);
                    columns.push((from_probe, i));
                    fields.push((q.cloned(), field.clone()));
                }
                let schema = DFSchema::new_with_metadata(fields, Default::default())?;
                let expr = physical(f, &schema)?;
                Some(PairFilter { expr, columns, schema: Arc::new(schema.as_arrow().clone()) })
            }
        };
        let cfg = SetfusionConfig::from_options(session_state.config_options());
        let threads = session_state.config_options().execution.target_partitions;
        let probe_arrow = probe.schema();
        let decision = if let Some(f) = &filter {
            let on_types: Vec<DataType> = on.iter().map(|(p, _)| p.data_type(&probe_arrow)).collect::<Result<_>>()?;
            let in_types = match &in_keys {
                Some((p, b)) => Some((p.data_type(&probe_arrow)?, b.data_type(&build.schema())?)),
                None => None,
            };
            super::decision::decide_filtered(
                &cfg,
                &probe,
                &build,
                &on_types,
                f,
                in_types.as_ref().map(|(p, b)| (p, b)),
                threads,
            )
        } else {
            let types: Vec<DataType> =
                on.iter().chain(&in_keys).map(|(p, _)| p.data_type(&probe_arrow)).collect::<Result<_>>()?;
            super::decision::decide(&cfg, SetOp::Semi, &probe, &build, &types, threads)
        };
        if !decision.on_gpu() && cfg.strategy != Strategy::Cpu && datafusion_is_right(node)? {
            // On the CPU DataFusion's own LeftMark hash join is the faster one, and
            // here its two-valued mark is right: plan it from the node, saying why.
            crate::util::trace(&format!("setfusion keeps DataFusion's LeftMark join: {}", decision.reason));
            let join = Join::try_new(
                Arc::new(node.probe.clone()),
                Arc::new(node.build.clone()),
                node.on.iter().chain(&node.in_keys).cloned().collect(),
                node.filter.clone(),
                JoinType::LeftMark,
                JoinConstraint::On,
                NullEquality::NullEqualsNothing,
                false,
            )?;
            let plan = super::plan_subtree(planner, &LogicalPlan::Join(join), session_state).await?;
            return Ok(Some(Arc::new(SetfusionDeclinedExec::new(plan, decision.reason))));
        }
        let exec = MarkJoinExec::try_new(node.kind, probe, build, on, in_keys, filter, &node.mark.name, decision)?
            .with_broadcast_build(cfg.hash_partition_inputs);
        Ok(Some(Arc::new(exec)))
    }
}
