//! `SetfusionDeclinedExec`: a pass-through node above a DataFusion operator
//! that setfusion could have replaced but did not, saying why in EXPLAIN (the
//! [`Reason`] of `planner::decision`: no GPU, `min_rows`, the cost model's
//! estimate, unsupported key types, ...). It changes nothing else: its
//! output, partitioning, orderings and equivalences are its input's, it hands
//! projections and filters down to its input, and `execute` is its input's.
//! Added wherever a rule keeps DataFusion's operator for a CPU decision, so
//! EXPLAIN always says where a candidate runs and why (issue 29).

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::filter_pushdown::{
    ChildPushdownResult, FilterDescription, FilterPushdownPhase, FilterPushdownPropagation,
};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};

use super::common::Reason;

#[derive(Debug)]
pub struct SetfusionDeclinedExec {
    input: Arc<dyn ExecutionPlan>,
    reason: Reason,
}

impl SetfusionDeclinedExec {
    pub fn new(input: Arc<dyn ExecutionPlan>, reason: Reason) -> Self {
        Self { input, reason }
    }
    pub fn reason(&self) -> &Reason {
        &self.reason
    }
}

impl DisplayAs for SetfusionDeclinedExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "SetfusionDeclinedExec: kept DataFusion's operator below, backend=cpu, reason=\"{}\"", self.reason)
    }
}

impl ExecutionPlan for SetfusionDeclinedExec {
    fn name(&self) -> &str {
        "SetfusionDeclinedExec"
    }
    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }
    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }
    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }
    fn with_new_children(self: Arc<Self>, mut children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        match (children.pop(), children.is_empty()) {
            (Some(input), true) => Ok(Arc::new(Self::new(input, self.reason.clone()))),
            _ => Err(DataFusionError::Internal("SetfusionDeclinedExec has one child".into())),
        }
    }
    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        self.input.execute(partition, context)
    }
    /// A projection above goes into the operator below, as if this node were not here.
    fn try_swapping_with_projection(&self, projection: &ProjectionExec) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        Ok(self
            .input
            .try_swapping_with_projection(projection)?
            .map(|input| Arc::new(Self::new(input, self.reason.clone())) as Arc<dyn ExecutionPlan>))
    }
    fn gather_filters_for_pushdown(
        &self,
        _phase: FilterPushdownPhase,
        parent_filters: Vec<Arc<dyn PhysicalExpr>>,
        _config: &ConfigOptions,
    ) -> Result<FilterDescription> {
        FilterDescription::from_children(parent_filters, &self.children())
    }
    fn handle_child_pushdown_result(
        &self,
        _phase: FilterPushdownPhase,
        child_pushdown_result: ChildPushdownResult,
        _config: &ConfigOptions,
    ) -> Result<FilterPushdownPropagation<Arc<dyn ExecutionPlan>>> {
        Ok(FilterPushdownPropagation::if_all(child_pushdown_result))
    }
}
