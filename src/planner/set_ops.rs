//! INTERSECT / EXCEPT [ALL] with exact SQL multiset semantics.
//!
//! DataFusion plans `a INTERSECT ALL b` as a left semi join on all columns
//! (keeping every copy of a matching row: min(m, n) is lost) and
//! `a EXCEPT ALL b` as a left anti join (max(m - n, 0) is lost). The analyzer
//! rule [`SetOpRule`] recognises the shapes `LogicalPlanBuilder::intersect` /
//! `except` build — a semi/anti join on every column with NULLs equal and no
//! filter, over a `Distinct` for the distinct forms — and replaces them with a
//! [`SetOpNode`], which [`SetOpPlanner`] turns into a `SetOpExec`.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchemaRef, NullEquality};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::execution::context::QueryPlanner;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{
    Distinct, Expr, Extension, Join, JoinConstraint, JoinType, LogicalPlan, LogicalPlanBuilder, UserDefinedLogicalNode,
    UserDefinedLogicalNodeCore,
};
use datafusion::optimizer::AnalyzerRule;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};

use crate::algo::select::SetOp;
use crate::config::{SetfusionConfig, Strategy};
use crate::exec::common::NullMode;
use crate::exec::declined::SetfusionDeclinedExec;
use crate::exec::set_select::SetSelectExec;

/// A set operation with exact semantics: rows of `left` selected against
/// `right`, comparing `left_keys[i]` with `right_keys[i]` (every column, with
/// the casts type coercion put on them).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SetOpNode {
    pub op: SetOp,
    pub left: LogicalPlan,
    pub right: LogicalPlan,
    pub left_keys: Vec<Expr>,
    pub right_keys: Vec<Expr>,
}

impl PartialOrd for SetOpNode {
    fn partial_cmp(&self, _other: &Self) -> Option<Ordering> {
        None
    }
}

impl UserDefinedLogicalNodeCore for SetOpNode {
    fn name(&self) -> &str {
        "SetOp"
    }
    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.left, &self.right]
    }
    fn schema(&self) -> &DFSchemaRef {
        self.left.schema()
    }
    fn expressions(&self) -> Vec<Expr> {
        self.left_keys.iter().chain(&self.right_keys).cloned().collect()
    }
    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "SetOp: {}", self.op.name().to_uppercase())
    }
    fn with_exprs_and_inputs(&self, mut exprs: Vec<Expr>, mut inputs: Vec<LogicalPlan>) -> Result<Self> {
        let right = inputs.pop().unwrap();
        let left = inputs.pop().unwrap();
        let right_keys = exprs.split_off(exprs.len() / 2);
        Ok(Self { op: self.op, left, right, left_keys: exprs, right_keys })
    }
    fn supports_limit_pushdown(&self) -> bool {
        false
    }
}

/// Analyzer rule: set-operation joins -> [`SetOpNode`].
#[derive(Debug, Default)]
pub struct SetOpRule;

impl SetOpRule {
    fn rewrite(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
        let LogicalPlan::Join(join) = &plan else { return Ok(Transformed::no(plan)) };
        let Some(op_all) = set_op_of(join) else { return Ok(Transformed::no(plan)) };
        let (op, left) = match join.left.as_ref() {
            LogicalPlan::Distinct(Distinct::All(input)) => {
                let op = if op_all == SetOp::IntersectAll { SetOp::IntersectDistinct } else { SetOp::ExceptDistinct };
                (op, input.as_ref().clone())
            }
            other => (op_all, other.clone()),
        };
        let (left_keys, right_keys) = join.on.iter().cloned().unzip();
        let node = SetOpNode { op, left, right: join.right.as_ref().clone(), left_keys, right_keys };
        Ok(Transformed::yes(LogicalPlan::Extension(Extension { node: Arc::new(node) })))
    }
}

/// The ALL set operation a join implements, if it has the shape of one.
fn set_op_of(join: &Join) -> Option<SetOp> {
    let op = match join.join_type {
        JoinType::LeftSemi => SetOp::IntersectAll,
        JoinType::LeftAnti => SetOp::ExceptAll,
        _ => return None,
    };
    let left_fields = join.left.schema().fields().len();
    let right_fields = join.right.schema().fields().len();
    let shape = join.filter.is_none()
        && join.null_equality == NullEquality::NullEqualsNull
        && join.join_constraint == JoinConstraint::On
        && !join.null_aware
        && join.on.len() == left_fields
        && left_fields == right_fields
        && join.on.iter().enumerate().all(|(i, (l, r))| {
            is_column_named(l, join.left.schema().field(i).name())
                && is_column_named(r, join.right.schema().field(i).name())
        });
    shape.then_some(op)
}

/// `name`, possibly under the casts that type coercion adds to join keys.
fn is_column_named(e: &Expr, name: &str) -> bool {
    match e {
        Expr::Column(c) => c.name == name,
        Expr::Cast(c) => is_column_named(&c.expr, name),
        Expr::TryCast(c) => is_column_named(&c.expr, name),
        _ => false,
    }
}

impl AnalyzerRule for SetOpRule {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        // Into subqueries too: an INTERSECT ALL inside a scalar or IN subquery is
        // just as wrong. A subquery whose root becomes the extension node gets an
        // identity projection above it: DataFusion's decorrelation reads the
        // subquery's first output column through `head_output_expr`, which an
        // extension node does not answer.
        let plan = plan.transform_up_with_subqueries(Self::rewrite)?.data;
        plan.transform_up_with_subqueries(|p| match p {
            LogicalPlan::Subquery(mut sub) if matches!(sub.subquery.as_ref(), LogicalPlan::Extension(e) if e.node.as_any().is::<SetOpNode>()) => {
                let root = sub.subquery.as_ref().clone();
                let columns = root.schema().columns().into_iter().map(Expr::Column).collect::<Vec<_>>();
                sub.subquery = Arc::new(LogicalPlan::Projection(datafusion::logical_expr::Projection::try_new(columns, Arc::new(root))?));
                Ok(Transformed::yes(LogicalPlan::Subquery(sub)))
            }
            other => Ok(Transformed::no(other)),
        })
        .map(|t| t.data)
    }
    fn name(&self) -> &str {
        "setfusion_exact_set_ops"
    }
}

/// Physical planning of [`SetOpNode`].
#[derive(Debug, Default)]
pub struct SetOpPlanner;

#[async_trait]
impl ExtensionPlanner for SetOpPlanner {
    async fn plan_extension(
        &self,
        planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        session_state: &dyn Session,
        planning_ctx: &PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(node) = node.as_any().downcast_ref::<SetOpNode>() else { return Ok(None) };
        let (left, right) = (physical_inputs[0].clone(), physical_inputs[1].clone());
        let keys = |exprs: &[Expr], input: &LogicalPlan| -> Result<Vec<PhysicalExprRef>> {
            exprs.iter().map(|e| planner.create_physical_expr(e, input.schema(), session_state, planning_ctx)).collect()
        };
        let left_keys = keys(&node.left_keys, logical_inputs[0])?;
        let right_keys = keys(&node.right_keys, logical_inputs[1])?;
        let cfg = SetfusionConfig::from_options(session_state.config_options());
        let left_schema = left.schema();
        let types: Vec<_> = left_keys.iter().map(|k| k.data_type(&left_schema)).collect::<Result<_>>()?;
        let threads = session_state.config_options().execution.target_partitions;
        let decision = super::decision::decide(&cfg, node.op, &left, &right, &types, threads);
        let exact_either_way = matches!(node.op, SetOp::IntersectAll | SetOp::ExceptAll);
        if !decision.on_gpu() && !exact_either_way && cfg.strategy != Strategy::Cpu {
            // DataFusion's plan of INTERSECT / EXCEPT (distinct) is right and, by the
            // decision, not slower than the GPU: rebuild it from the node and plan it, saying why.
            crate::util::trace(&format!("setfusion keeps DataFusion's {}: {}", node.op.name(), decision.reason));
            let plan = datafusion_plan(node, logical_inputs[0], logical_inputs[1])?;
            let plan = super::plan_subtree(planner, &plan, session_state).await?;
            return Ok(Some(Arc::new(SetfusionDeclinedExec::new(plan, decision.reason))));
        }
        let exec = SetSelectExec::try_new(
            node.op,
            left.clone(),
            right.clone(),
            left_keys,
            right_keys,
            NullMode::Equal,
            decision,
            None,
        )?
        .with_partitioned_inputs(cfg.hash_partition_inputs)?;
        Ok(Some(Arc::new(exec)))
    }
}

/// DataFusion's own plan of a distinct set operation, as `LogicalPlanBuilder::intersect`
/// / `except` build it: a semi (anti) join on every column, NULLs equal, over
/// the distinct left input.
fn datafusion_plan(node: &SetOpNode, left: &LogicalPlan, right: &LogicalPlan) -> Result<LogicalPlan> {
    let join_type = if node.op == SetOp::IntersectDistinct { JoinType::LeftSemi } else { JoinType::LeftAnti };
    // As DataFusion's optimizer leaves it: the physical planner takes no Distinct node.
    let columns: Vec<Expr> = left.schema().columns().into_iter().map(Expr::Column).collect();
    let distinct = LogicalPlanBuilder::from(left.clone()).aggregate(columns, Vec::<Expr>::new())?.build()?;
    let on = node.left_keys.iter().cloned().zip(node.right_keys.iter().cloned()).collect();
    let join = Join::try_new(
        Arc::new(distinct),
        Arc::new(right.clone()),
        on,
        None,
        join_type,
        JoinConstraint::On,
        NullEquality::NullEqualsNull,
        false,
    )?;
    Ok(LogicalPlan::Join(join))
}

/// DataFusion's planner with [`SetOpPlanner`] and [`super::MarkJoinPlanner`] added.
#[derive(Debug, Default)]
pub struct SetfusionQueryPlanner;

#[async_trait]
impl QueryPlanner for SetfusionQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session_state: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let planner = DefaultPhysicalPlanner::with_extension_planners(vec![
            Arc::new(SetOpPlanner),
            Arc::new(super::MarkJoinPlanner),
        ]);
        planner.create_physical_plan(logical_plan, session_state).await
    }
}
