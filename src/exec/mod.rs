//! DataFusion `ExecutionPlan`s: one operator per file, the plan node separate from its stream.
pub mod common;
pub mod declined;
pub mod device_scan;
mod device_select;
pub mod dynamic_filter;
pub mod families;
pub mod mark_join;
pub mod memory;
pub mod output_filter;
pub mod pair_filter;
pub mod selection;
pub mod set_select;
pub mod similarity_join;

use std::fmt;
use std::sync::Mutex;

use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder, Time};
use datafusion::physical_plan::DisplayFormatType;

use crate::gpu::TransferStats;

/// The device metrics every setfusion operator reports in EXPLAIN ANALYZE.
#[derive(Debug, Clone)]
pub struct DeviceMetrics {
    pub input_rows: Count,
    bytes_to_device: Count,
    bytes_to_host: Count,
    transfer_time: Time,
    /// Of transfer_time: host copies / packing into pinned staging.
    staging_copy_time: Time,
    kernel_time: Time,
}

impl DeviceMetrics {
    pub fn new(m: &ExecutionPlanMetricsSet) -> Self {
        Self {
            input_rows: MetricBuilder::new(m).global_counter("input_rows"),
            bytes_to_device: MetricBuilder::new(m).global_counter("bytes_to_device"),
            bytes_to_host: MetricBuilder::new(m).global_counter("bytes_to_host"),
            transfer_time: MetricBuilder::new(m).subset_time("transfer_time", 0),
            staging_copy_time: MetricBuilder::new(m).subset_time("staging_copy_time", 0),
            kernel_time: MetricBuilder::new(m).subset_time("kernel_time", 0),
        }
    }

    /// Add one device run's bytes and times.
    pub fn record(&self, s: &TransferStats) {
        self.bytes_to_device.add(s.bytes_to_device);
        self.bytes_to_host.add(s.bytes_to_host);
        self.transfer_time.add_duration(s.to_device + s.to_host);
        self.staging_copy_time.add_duration(s.staging_copy);
        self.kernel_time.add_duration(s.kernel);
    }
}

/// `ExecutionPlan::apply_expressions` for an operator whose expressions are `exprs`:
/// visit each until `f` stops.
pub(crate) fn visit_exprs<'a>(
    exprs: impl IntoIterator<Item = &'a std::sync::Arc<dyn datafusion::physical_expr::PhysicalExpr>>,
    f: &mut dyn FnMut(
        &std::sync::Arc<dyn datafusion::physical_expr::PhysicalExpr>,
    ) -> datafusion::error::Result<datafusion::common::tree_node::TreeNodeRecursion>,
) -> datafusion::error::Result<datafusion::common::tree_node::TreeNodeRecursion> {
    use datafusion::common::tree_node::TreeNodeRecursion;
    for e in exprs {
        if f(e)? == TreeNodeRecursion::Stop {
            return Ok(TreeNodeRecursion::Stop);
        }
    }
    Ok(TreeNodeRecursion::Continue)
}

/// The two children `with_new_children` received, in order (an error naming `operator` otherwise).
pub(crate) fn two_children(
    children: Vec<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>,
    operator: &str,
) -> datafusion::error::Result<(
    std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>,
)> {
    match <[_; 2]>::try_from(children) {
        Ok([first, second]) => Ok((first, second)),
        Err(_) => Err(datafusion::error::DataFusionError::Internal(format!("{operator} has two children"))),
    }
}

/// Run an operator's synchronous part (key encoding, device work under the
/// device lease, host filtering) on tokio's blocking pool, off the async
/// worker threads: the lease may wait for another query's device work, and
/// none of it should stall the runtime's other tasks (the inputs' scans of
/// other queries). Outside a tokio runtime it runs in place.
pub(crate) async fn off_runtime<T: Send + 'static>(
    f: impl FnOnce() -> datafusion::error::Result<T> + Send + 'static,
) -> datafusion::error::Result<T> {
    if tokio::runtime::Handle::try_current().is_err() {
        return f();
    }
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(datafusion::error::DataFusionError::Execution(format!("setfusion: operator task ended: {e}"))),
    }
}

/// The tail every setfusion operator's EXPLAIN line ends with: the embedded
/// projection, and (after a run, except in the tree view) what actually ran.
pub(crate) fn fmt_projection_and_ran(
    f: &mut fmt::Formatter,
    t: DisplayFormatType,
    projection: &Option<Vec<usize>>,
    ran: &Mutex<Option<String>>,
) -> fmt::Result {
    if let Some(p) = projection {
        write!(f, ", projection={p:?}")?;
    }
    if !matches!(t, DisplayFormatType::TreeRender) {
        if let Some(ran) = ran.lock().unwrap().as_ref() {
            write!(f, ", ran={ran}")?;
        }
    }
    Ok(())
}
