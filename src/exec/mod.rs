//! DataFusion `ExecutionPlan`s: one operator per file, the plan node separate from its stream.
pub mod common;
pub mod declined;
pub mod device_scan;
mod device_select;
pub mod dynamic_filter;
pub mod families;
pub mod kept_aggregate;
pub mod mark_join;
pub mod memory;
pub mod output_filter;
pub mod pair_filter;
pub mod selection;
pub mod set_select;
pub mod sets_cache;
pub mod similarity_join;
mod streamed_probe;

use std::fmt;
use std::sync::Mutex;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, MetricCategory, MetricValue, Time,
};
use datafusion::physical_plan::DisplayFormatType;

use crate::gpu::TransferStats;

/// A builder for a metric of one execution of an operator. `partition`:
/// `None` where the execution's work (collecting the inputs, the selection,
/// the device work) is done once and shared by every output partition, so it
/// belongs to none of them; `Some(p)` where partition `p` is an execution of
/// its own (partitioned inputs, a broadcast build side, a one-partition
/// operator).
fn execution_metric(m: &ExecutionPlanMetricsSet, partition: Option<usize>) -> MetricBuilder<'_> {
    match partition {
        Some(p) => MetricBuilder::new(m).with_partition(p),
        None => MetricBuilder::new(m),
    }
}

/// A count of one execution (see [`execution_metric`] for `partition`).
pub(crate) fn execution_count(m: &ExecutionPlanMetricsSet, name: &'static str, partition: Option<usize>) -> Count {
    let count = Count::new();
    execution_metric(m, partition).build(MetricValue::Count { name: name.into(), count: count.clone() });
    count
}

/// A time of one execution (see [`execution_metric`] for `partition`).
pub(crate) fn execution_time(m: &ExecutionPlanMetricsSet, name: &'static str, partition: Option<usize>) -> Time {
    let time = Time::new();
    execution_metric(m, partition)
        .with_category(MetricCategory::Timing)
        .build(MetricValue::Time { name: name.into(), time: time.clone() });
    time
}

/// The peak bytes of one execution's memory reservation, as DataFusion's
/// operators report it (`peak_mem_used`; see [`execution_metric`] for
/// `partition`). A peak, not the current size: every reservation is freed by
/// the time EXPLAIN ANALYZE prints. Set with [`Gauge::set_max`] wherever the
/// reservation has grown.
pub(crate) fn execution_peak_memory(m: &ExecutionPlanMetricsSet, partition: Option<usize>) -> Gauge {
    let gauge = Gauge::new();
    execution_metric(m, partition)
        .with_category(MetricCategory::Bytes)
        .build(MetricValue::PeakMemoryUsage { name: "peak_mem_used".into(), gauge: gauge.clone() });
    gauge
}

/// `stream` with its output rows and batches (and its end) recorded in
/// `baseline`, as DataFusion's operators record their output.
pub(crate) fn observed(
    mut stream: futures::stream::BoxStream<'static, datafusion::error::Result<RecordBatch>>,
    baseline: BaselineMetrics,
) -> futures::stream::BoxStream<'static, datafusion::error::Result<RecordBatch>> {
    use futures::StreamExt;
    futures::stream::poll_fn(move |cx| baseline.record_poll(stream.poll_next_unpin(cx))).boxed()
}

/// The device metrics every setfusion operator reports in EXPLAIN ANALYZE,
/// registered once per execution (see [`execution_metric`] for the partition;
/// `Default`: not registered).
#[derive(Debug, Clone, Default)]
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
    /// `partition`: None where the device work of an execution is shared by
    /// all output partitions (a selection runs once for all of them), so
    /// that no partition is claimed; `Some(p)` where the execution is
    /// partition `p`'s own.
    pub fn new(m: &ExecutionPlanMetricsSet, partition: Option<usize>) -> Self {
        Self {
            input_rows: execution_count(m, "input_rows", partition),
            bytes_to_device: execution_count(m, "bytes_to_device", partition),
            bytes_to_host: execution_count(m, "bytes_to_host", partition),
            transfer_time: execution_time(m, "transfer_time", partition),
            staging_copy_time: execution_time(m, "staging_copy_time", partition),
            kernel_time: execution_time(m, "kernel_time", partition),
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

/// What the operators' tests check of their metrics after a query: DataFusion's
/// baseline metrics, each registered once (the SQL-driven ones are in
/// `crate::operator_tests`, above the planner).
#[cfg(test)]
pub(crate) mod metrics_check {
    use std::collections::HashMap;
    use std::sync::Arc;

    use datafusion::physical_plan::{displayable, ExecutionPlan};

    /// Every node named `name` in `plan` (at least one) reports `rows` output
    /// rows, output batches when it has rows, an elapsed_compute (and a
    /// peak_mem_used with `memory`), and no metric twice for one partition.
    pub(crate) fn check(plan: &Arc<dyn ExecutionPlan>, name: &str, rows: usize, memory: bool) {
        let text = displayable(plan.as_ref()).indent(true).to_string();
        let mut nodes = vec![plan.clone()];
        let mut found = 0;
        while let Some(node) = nodes.pop() {
            nodes.extend(node.children().into_iter().cloned());
            if node.name() != name {
                continue;
            }
            found += 1;
            let metrics = node.metrics().unwrap_or_else(|| panic!("{name} has no metrics in\n{text}"));
            let mut seen: HashMap<String, usize> = HashMap::new();
            for m in metrics.iter() {
                let labels: Vec<String> = m.labels().iter().map(|l| l.to_string()).collect();
                *seen.entry(format!("{} partition={:?} {labels:?}", m.value().name(), m.partition())).or_default() += 1;
            }
            let twice: Vec<_> = seen.iter().filter(|(_, &n)| n > 1).collect();
            assert!(twice.is_empty(), "{name}: metrics registered more than once: {twice:?}\n{metrics}");
            assert_eq!(metrics.output_rows(), Some(rows), "{name}: output_rows\n{metrics}\n{text}");
            // Summed here: `MetricsSet::sum_by_name` does not sum output_batches or peak_mem_used.
            let sum = |name: &str| {
                let values: Vec<usize> =
                    metrics.iter().filter(|m| m.value().name() == name).map(|m| m.value().as_usize()).collect();
                (!values.is_empty()).then(|| values.iter().sum::<usize>())
            };
            let batches = sum("output_batches");
            assert!(batches.is_some(), "{name}: no output_batches\n{metrics}");
            if rows > 0 {
                assert!(batches >= Some(1), "{name}: {rows} rows in no batch\n{metrics}");
            }
            assert!(metrics.elapsed_compute().is_some(), "{name}: no elapsed_compute\n{metrics}");
            if memory {
                // The inputs alone are reserved: a peak above 0.
                let peak = sum("peak_mem_used");
                assert!(peak > Some(0), "{name}: peak_mem_used {peak:?}\n{metrics}");
            }
        }
        assert!(found > 0, "no {name} in\n{text}");
    }
}
