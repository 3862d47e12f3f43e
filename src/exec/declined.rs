//! `SetfusionDeclinedExec`: a pass-through node above a DataFusion operator
//! that setfusion could have replaced but did not, saying why in EXPLAIN (the
//! [`Reason`] of `planner::decision`: no GPU, `min_rows`, the cost model's
//! estimate, unsupported key types, ...). It changes nothing else: its
//! output, partitioning, orderings and equivalences are its input's, it hands
//! projections and filters down to its input, and `execute` is its input's.
//! Added wherever a rule keeps DataFusion's operator for a CPU decision, so
//! EXPLAIN always says where a candidate runs and why (issue 29).
//!
//! With [`Reason::FloatKeyBounds`] it is the one exception to "changes
//! nothing": placed above the probe side of a DataFusion hash join on float
//! keys (`planner::float_key_bounds`), it refuses the last filter pushdown's
//! filters, whose bounds would drop rows the join keeps.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::StreamExt;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::filter_pushdown::{
    ChildPushdownResult, FilterDescription, FilterPushdownPhase, FilterPushdownPropagation,
};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};

use super::common::Reason;

#[derive(Debug)]
pub struct SetfusionDeclinedExec {
    input: Arc<dyn ExecutionPlan>,
    reason: Reason,
    /// Partitions whose output is not done yet ([`Reason::StartsAfterQuery`]:
    /// when the last one is, the device is asked to start for the next queries).
    running: Arc<AtomicUsize>,
    /// The baseline metrics of the batches passed on (the operator below
    /// does the work: this node's elapsed_compute stays about 0).
    metrics: ExecutionPlanMetricsSet,
}

impl SetfusionDeclinedExec {
    pub fn new(input: Arc<dyn ExecutionPlan>, reason: Reason) -> Self {
        let running = Arc::new(AtomicUsize::new(input.properties().partitioning.partition_count()));
        Self { input, reason, running, metrics: ExecutionPlanMetricsSet::new() }
    }
    pub fn reason(&self) -> &Reason {
        &self.reason
    }
}

impl DisplayAs for SetfusionDeclinedExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        if self.reason == Reason::FloatKeyBounds {
            return write!(
                f,
                "SetfusionDeclinedExec: the join's dynamic filter stops here, reason=\"{}\"",
                self.reason
            );
        }
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
    /// The input's stream; under [`Reason::StartsAfterQuery`], once the last
    /// partition's output is done, the device is asked to start when the next
    /// query is planned (`exec::common::start_for_next_queries`: not beside
    /// this query's operators, which it slows).
    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let input = self.input.execute(partition, context)?;
        let schema = input.schema();
        let stream =
            Box::pin(RecordBatchStreamAdapter::new(schema.clone(), super::observed(Box::pin(input), baseline)));
        let Reason::StartsAfterQuery { device, .. } = self.reason else { return Ok(stream) };
        let running = self.running.clone();
        let mut counted = false;
        let start = futures::stream::poll_fn(move |_| {
            let last = !std::mem::replace(&mut counted, true) && running.fetch_sub(1, Ordering::AcqRel) <= 1;
            if last {
                super::common::start_for_next_queries(device);
            }
            std::task::Poll::Ready(None)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream.chain(start))))
    }
    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
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
        phase: FilterPushdownPhase,
        parent_filters: Vec<Arc<dyn PhysicalExpr>>,
        _config: &ConfigOptions,
    ) -> Result<FilterDescription> {
        // The last pushdown's filters are the dynamic ones (a hash join's bounds).
        if self.reason == Reason::FloatKeyBounds && matches!(phase, FilterPushdownPhase::Post) {
            return Ok(FilterDescription::all_unsupported(&parent_filters, &self.children()));
        }
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
