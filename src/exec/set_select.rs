//! `SemiJoinExec` / `SetOpExec`: keep the rows of one input that a multiset
//! rule selects against the other input.
//!
//! Semi and anti joins (IN, EXISTS, NOT IN, NOT EXISTS) and INTERSECT / EXCEPT
//! [ALL] are the same operator: both sides' key columns are encoded into
//! 64-bit keys, one selection bit per kept-side row is computed by
//! [`crate::algo::select`] (GPU or CPU backend), and the kept side's batches
//! are filtered on the host. Only key columns ever reach the device; when the
//! output holds the (single, 64-bit) key column, the GPU backend sends its
//! kept values back and the host filters only the other columns.
//!
//! The output keeps the kept side's partitioning and order: the selection is
//! computed once for all partitions (ranks in INTERSECT ALL are global), and
//! `execute(p)` streams partition `p`'s output batches (about 128K rows each),
//! filtered from its input batches chunk by chunk as the stream is read (see
//! [`super::output_filter`]).
//!
//! With hash-partitioned inputs ([`SetSelectExec::with_partitioned_inputs`],
//! for a Ballista cluster, where each task executes one partition) the node
//! asks for both inputs hash-partitioned on the keys, and `execute(p)` decides
//! partition `p` from the inputs' partitions `p` alone: equal keys meet in one
//! partition, so multiplicities (INTERSECT ALL's min(m, n)) stay exact. NOT IN
//! (null-aware) needs the whole subquery in every partition (one NULL anywhere
//! removes every row, an empty one keeps them all), so it takes each input in
//! one partition instead, as do keys of different types on the two sides.
//!
//! Memory: one `MemoryConsumer` per execution (named after the operator)
//! reserves both collected inputs, the encoded keys and the selection; the
//! build side's bytes are released after the selection, each partition's
//! input bytes as its stream outputs them. Nothing spills: a query over
//! `datafusion.runtime.memory_limit` fails with `ResourcesExhausted`.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use datafusion::arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use datafusion::arrow::buffer::BooleanBuffer;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::projection::ProjectionMapping;
use datafusion::physical_expr::{PhysicalExpr, PhysicalExprRef};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::filter_pushdown::{
    ChildPushdownResult, FilterDescription, FilterPushdownPhase, FilterPushdownPropagation,
};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet, Time};
use datafusion::physical_plan::projection::{try_embed_projection, EmbeddedProjection, ProjectionExec};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};

use crate::algo::select::SetOp;
use crate::config::SetfusionConfig;
use crate::gpu::{self};
use crate::keys::{self};

use super::common::{input_context, Backend, Decision, NullMode};
use super::device_scan::DeviceScanExec;
use super::device_select::Side;
use super::dynamic_filter::{self, DynamicKeyFilter, FilteredInput, KeepNulls, KeyFilterPlan};
use super::kept_aggregate::{AggregateAbove, Folding};
use super::memory::{batch_bytes, collect_partitions_reserved, reservation, Parts, SharedRun};
#[cfg(test)]
use super::output_filter::filter_all;
use super::output_filter::{plan_partitions, stream_chunks, OutputColumns, OutputSpec, PartitionOutput};
use super::selection::{key_columns, Metrics, Selector};
use super::streamed_probe::ProbeTable;

/// The computed result, per partition of the kept side: its output to
/// filter (kept rows, projected), or for an output without columns only the
/// number of kept rows; each partition's stream takes its own.
struct Selected {
    outputs: Parts<PartitionOutput>,
    /// With an aggregate above, its row where the device computed it (the
    /// outputs are then empty); else the outputs are folded into it.
    aggregated: Option<RecordBatch>,
    /// With the probe side streamed (see [`super::streamed_probe`]), the
    /// build side's table, one handle per partition (the outputs are then
    /// empty): each partition filters its own probe partition through it.
    streamed: Parts<Arc<ProbeTable>>,
}

impl Selected {
    fn outputs(outputs: Vec<PartitionOutput>) -> Self {
        Selected { outputs: Parts::new(outputs), aggregated: None, streamed: Parts::new(Vec::new()) }
    }
}

/// The operator. See the module documentation.
#[derive(Debug)]
pub struct SetSelectExec {
    /// What every execution reads, shared with it (see `exec::common`).
    spec: Arc<SetSelectSpec>,
    cache: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    result: Arc<SharedRun<Selected>>,
    /// What ran (strategy, partitions), for EXPLAIN ANALYZE.
    ran: Arc<Mutex<Option<String>>>,
    /// Why a Parquet input is not read by the device (the device scan rule), for EXPLAIN.
    scan_note: Option<String>,
    /// Both inputs hash-partitioned on the keys, each partition decided on
    /// its own (see the module documentation); false: all partitions at once.
    partitioned: bool,
    /// Partitioning was asked for but cannot be used: each input in one
    /// partition instead (a Ballista task may see only its own partition of
    /// an input, where this node needs every partition of both).
    single_partition_inputs: bool,
    /// Output at most this many rows per partition (a LIMIT absorbed by the node).
    fetch: Option<usize>,
    /// The aggregate above, absorbed ([`SetSelectExec::with_aggregate_above`]):
    /// the node outputs its one row.
    aggregate_above: Option<Arc<AggregateAbove>>,
}

/// The node's inputs and choices, shared by the node and its executions.
#[derive(Debug, Clone)]
struct SetSelectSpec {
    op: SetOp,
    /// The side whose rows are output.
    probe: Arc<dyn ExecutionPlan>,
    /// The side that is only looked up.
    build: Arc<dyn ExecutionPlan>,
    probe_keys: Vec<PhysicalExprRef>,
    build_keys: Vec<PhysicalExprRef>,
    nulls: NullMode,
    /// The planner's choice (`planner::decision`), shown in EXPLAIN.
    decision: Decision,
    /// Optional projection of the kept side's columns.
    projection: Option<Vec<usize>>,
    /// The node's output schema.
    schema: SchemaRef,
    /// The dynamic filter this node publishes into one input, once a scan
    /// below accepted it (published before that input is read).
    dynamic_filter: Option<DynamicKeyFilter>,
}

impl SetSelectExec {
    #[allow(clippy::too_many_arguments)]
    pub fn try_new(
        op: SetOp,
        probe: Arc<dyn ExecutionPlan>,
        build: Arc<dyn ExecutionPlan>,
        probe_keys: Vec<PhysicalExprRef>,
        build_keys: Vec<PhysicalExprRef>,
        nulls: NullMode,
        decision: Decision,
        projection: Option<Vec<usize>>,
    ) -> Result<Self> {
        if probe_keys.len() != build_keys.len() || probe_keys.is_empty() {
            return Err(DataFusionError::Plan("setfusion: key lists must be non-empty and of equal length".into()));
        }
        let probe_schema = probe.schema();
        let schema = match &projection {
            Some(p) => Arc::new(probe_schema.project(p)?),
            None => probe_schema.clone(),
        };
        // Filtering keeps the kept side's partitioning, orderings and equivalences; a
        // (column-only) projection maps them onto the output columns, as HashJoinExec
        // does. Dropping them instead broke TPC-H Q20: a sort pushed below this node
        // was lost once a projection was embedded, and SortPreservingMergeExec above
        // no longer saw its order.
        let (eq, partitioning) = match &projection {
            None => (probe.equivalence_properties().clone(), probe.output_partitioning().clone()),
            Some(p) => {
                let mapping = ProjectionMapping::from_indices(p, &probe_schema)?;
                let input_eq = probe.equivalence_properties();
                (input_eq.project(&mapping, schema.clone()), probe.output_partitioning().project(&mapping, input_eq))
            }
        };
        let cache = Arc::new(PlanProperties::new(eq, partitioning, EmissionType::Final, Boundedness::Bounded));
        Ok(Self {
            spec: Arc::new(SetSelectSpec {
                op,
                probe,
                build,
                probe_keys,
                build_keys,
                nulls,
                decision,
                projection,
                schema,
                dynamic_filter: None,
            }),
            cache,
            metrics: ExecutionPlanMetricsSet::new(),
            result: Arc::new(SharedRun::new()),
            ran: Arc::new(Mutex::new(None)),
            scan_note: None,
            partitioned: false,
            single_partition_inputs: false,
            fetch: None,
            aggregate_above: None,
        })
    }

    /// This node over other inputs and with another projection of the kept
    /// side, keeping its settings, dynamic filter and fetch.
    pub(crate) fn rebuilt(
        &self,
        probe: Arc<dyn ExecutionPlan>,
        build: Arc<dyn ExecutionPlan>,
        projection: Option<Vec<usize>>,
    ) -> Result<Self> {
        let mut exec = SetSelectExec::try_new(
            self.spec.op,
            probe,
            build,
            self.spec.probe_keys.clone(),
            self.spec.build_keys.clone(),
            self.spec.nulls,
            self.spec.decision.clone(),
            projection,
        )?
        .with_scan_note(self.scan_note.clone())
        .with_partitioned_inputs(self.partitioned_inputs_requested())?;
        Arc::make_mut(&mut exec.spec).dynamic_filter = self.spec.dynamic_filter.clone();
        exec.fetch = self.fetch;
        if let Some(above) = &self.aggregate_above {
            exec.aggregate_above = Some(above.clone());
            exec.cache = self.cache.clone();
        }
        Ok(exec)
    }

    /// This node with the aggregate above it absorbed: `above` (the
    /// aggregate's final node, whose output it takes over: schema and
    /// properties) and what it computes. Err: why not (the node is not one
    /// whose kept rows the device reads: a GPU backend, its probe side a
    /// device scan, all partitions at once, no fetch).
    pub fn with_aggregate_above(
        &self,
        above: &Arc<dyn ExecutionPlan>,
        aggregate: AggregateAbove,
    ) -> std::result::Result<Self, String> {
        if self.aggregate_above.is_some() || self.fetch.is_some() || self.partitioned_inputs_requested() {
            return Err("a selection with a fetch, an aggregate or partitioned inputs".into());
        }
        if !self.spec.decision.on_gpu() {
            return Err("not a selection on the GPU backend".into());
        }
        let Some(scan) = self.spec.probe.downcast_ref::<DeviceScanExec>() else {
            return Err("the kept side is not read by the device".into());
        };
        if self.spec.probe_keys.len() != scan.key_count() {
            return Err("the kept side's device scan does not read its key columns".into());
        }
        if scan.payload().is_none() && !self.spec.schema.fields().is_empty() {
            return Err("the kept side's output columns are not decoded by the device".into());
        }
        if aggregate.schema().as_ref() != above.schema().as_ref() {
            return Err("the aggregate's output is not its node's".into());
        }
        let mut exec = self
            .rebuilt(self.spec.probe.clone(), self.spec.build.clone(), self.spec.projection.clone())
            .map_err(|e| crate::util::one_line(&e))?;
        exec.aggregate_above = Some(Arc::new(aggregate));
        exec.cache = above.properties().clone();
        Ok(exec)
    }

    /// The absorbed aggregate above, if any.
    pub fn aggregate_above(&self) -> Option<&AggregateAbove> {
        self.aggregate_above.as_deref()
    }

    /// The dynamic filter this node can publish, as DataFusion's hash join
    /// would for the same join, restricted to what is exact for the
    /// operator: IN / EXISTS and INTERSECT prune the kept (probe) side with
    /// the other side's keys; NOT EXISTS and EXCEPT prune only the other side,
    /// with the kept side's keys (its rows that match no kept row change
    /// nothing); NOT IN too, keeping the subquery's NULLs, and only when no
    /// kept key can be NULL (an emptied subquery would keep a NULL row). None
    /// when each partition decides on its own (a filter from one partition
    /// would prune the others').
    pub fn key_filter_plan(&self) -> Option<KeyFilterPlan> {
        if self.partitioned {
            return None;
        }
        let equal_nulls =
            if self.spec.nulls == NullMode::Equal { KeepNulls::WhenSourceHasNull } else { KeepNulls::Never };
        let (input, nulls) = match (self.spec.op, self.spec.nulls) {
            (SetOp::Semi | SetOp::IntersectDistinct | SetOp::IntersectAll, _) => (FilteredInput::Probe, equal_nulls),
            (SetOp::Anti, NullMode::NullAware) => {
                let schema = self.spec.probe.schema();
                if self.spec.probe_keys.iter().any(|k| k.nullable(&schema).unwrap_or(true)) {
                    return None;
                }
                (FilteredInput::Build, KeepNulls::Always)
            }
            (SetOp::Anti | SetOp::ExceptDistinct | SetOp::ExceptAll, _) => (FilteredInput::Build, equal_nulls),
        };
        match input {
            FilteredInput::Probe => KeyFilterPlan::new(
                input,
                &self.spec.build,
                &self.spec.probe,
                &self.spec.build_keys,
                &self.spec.probe_keys,
                nulls,
            ),
            FilteredInput::Build => KeyFilterPlan::new(
                input,
                &self.spec.probe,
                &self.spec.build,
                &self.spec.probe_keys,
                &self.spec.build_keys,
                nulls,
            ),
        }
    }

    /// The dynamic filter a scan below accepted, if any.
    pub fn dynamic_filter(&self) -> Option<&DynamicKeyFilter> {
        self.spec.dynamic_filter.as_ref()
    }

    /// Ask for both inputs hash-partitioned on the keys and decide each
    /// partition on its own (`true`), or read all partitions at once. Keys
    /// of different types on the two sides may hash differently, and NOT IN
    /// needs the whole subquery everywhere: such a node keeps reading all
    /// partitions at once.
    pub fn with_partitioned_inputs(mut self, partitioned: bool) -> Result<Self> {
        let (probe_schema, build_schema) = (self.spec.probe.schema(), self.spec.build.schema());
        let mut same_types = true;
        for (p, b) in self.spec.probe_keys.iter().zip(&self.spec.build_keys) {
            same_types &= p.data_type(&probe_schema)? == b.data_type(&build_schema)?;
        }
        self.partitioned = partitioned && same_types && self.spec.nulls != NullMode::NullAware;
        self.single_partition_inputs = partitioned && !self.partitioned;
        Ok(self)
    }

    /// Does each partition decide on its own (hash-partitioned inputs)?
    pub fn partitioned(&self) -> bool {
        self.partitioned
    }
    /// Were partitioned inputs asked for (whether or not they could be used)?
    pub fn partitioned_inputs_requested(&self) -> bool {
        self.partitioned || self.single_partition_inputs
    }
    pub fn probe_keys(&self) -> &[PhysicalExprRef] {
        &self.spec.probe_keys
    }
    pub fn build_keys(&self) -> &[PhysicalExprRef] {
        &self.spec.build_keys
    }
    pub fn nulls(&self) -> NullMode {
        self.spec.nulls
    }
    pub fn projection(&self) -> Option<&[usize]> {
        self.spec.projection.as_deref()
    }

    /// The input partitions `execute(partition)` reads: (probe, build).
    fn input_partitions(&self, partition: usize) -> Result<(std::ops::Range<usize>, std::ops::Range<usize>)> {
        let probe_n = self.spec.probe.output_partitioning().partition_count();
        let build_n = self.spec.build.output_partitioning().partition_count();
        if !self.partitioned {
            return Ok((0..probe_n, 0..build_n));
        }
        if build_n != probe_n {
            return Err(DataFusionError::Plan(format!(
                "{}: hash-partitioned inputs need as many partitions on both sides, got {probe_n} and {build_n}",
                self.name()
            )));
        }
        Ok((partition..partition + 1, partition..partition + 1))
    }

    /// Why Parquet inputs stay with DataFusion's scan, shown in EXPLAIN.
    pub fn with_scan_note(mut self, note: Option<String>) -> Self {
        self.scan_note = note;
        self
    }
    pub fn scan_note(&self) -> Option<&str> {
        self.scan_note.as_deref()
    }

    /// Could a device scan read this input's keys (the build side; the probe
    /// side when only the count of kept rows is output)?
    pub fn keys_only(&self, probe: bool) -> bool {
        !probe || self.spec.schema.fields().is_empty()
    }

    pub fn op(&self) -> SetOp {
        self.spec.op
    }
    pub fn decision(&self) -> &Decision {
        &self.spec.decision
    }

    fn is_join(&self) -> bool {
        matches!(self.spec.op, SetOp::Semi | SetOp::Anti)
    }

    /// The kept side's column whose kept values the GPU backend can send back
    /// instead of the host cutting them out of the batches: the only key, a
    /// plain column of a 64-bit type whose key is its own bits, and output.
    fn key_column_in_output(&self) -> Option<usize> {
        let [key] = self.spec.probe_keys.as_slice() else { return None };
        let col = key.downcast_ref::<datafusion::physical_expr::expressions::Column>()?;
        let field = self.spec.probe.schema().fields().get(col.index())?.clone();
        let own_bits = keys::key_is_own_bits(field.data_type());
        let output = !self.spec.schema.fields().is_empty()
            && self.spec.projection.as_ref().is_none_or(|p| p.contains(&col.index()));
        (own_bits && output && self.spec.decision.on_gpu()).then_some(col.index())
    }
}

impl SetSelectExec {
    /// Does an execution stream its probe side past a table of the build
    /// side's counts ([`super::streamed_probe`])? On the CPU backend, all
    /// partitions at once, no aggregate absorbed, for the rules and keys
    /// [`ProbeTable::offered`] accepts (`SETFUSION_COLLECT_CPU_PROBE=1`:
    /// never, to measure the collected path).
    fn streams_probe(&self) -> Result<bool> {
        if self.spec.decision.backend != Backend::Cpu
            || self.partitioned
            || self.aggregate_above.is_some()
            || crate::env::collect_cpu_probe()
        {
            return Ok(false);
        }
        let probe = keys::key_types(&self.spec.probe_keys, &self.spec.probe.schema())?;
        let build = keys::key_types(&self.spec.build_keys, &self.spec.build.schema())?;
        // Every column a key (as in a set operation): rows of equal keys are equal rows.
        let whole_rows = self.spec.probe_keys.len() == self.spec.probe.schema().fields().len();
        Ok(whole_rows && ProbeTable::offered(self.spec.op, self.spec.nulls, &probe, &build))
    }
}

impl DisplayAs for SetSelectExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let keys: Vec<String> =
            self.spec.probe_keys.iter().zip(&self.spec.build_keys).map(|(a, b)| format!("({a}, {b})")).collect();
        write!(f, "{}: op={}", self.name(), self.spec.op.name())?;
        if self.is_join() {
            write!(f, ", on=[{}]", keys.join(", "))?;
        } else {
            write!(f, ", columns={}", self.spec.probe_keys.len())?;
        }
        match self.spec.nulls {
            NullMode::NeverEqual => {}
            NullMode::Equal if !self.is_join() => {}
            NullMode::Equal => write!(f, ", nulls_equal")?,
            NullMode::NullAware => write!(f, ", null_aware")?,
        }
        write!(f, ", {}", self.spec.decision)?;
        if self.partitioned {
            write!(f, ", partitioned")?;
        }
        if let Some(d) = &self.spec.dynamic_filter {
            write!(f, ", dynamic_filter={}", d.plan.input.name())?;
        }
        if let Some(fetch) = self.fetch {
            write!(f, ", fetch={fetch}")?;
        }
        if let Some(note) = &self.scan_note {
            write!(f, ", device_scan=\"{note}\"")?;
        }
        if let Some(above) = &self.aggregate_above {
            write!(f, ", aggregate_above=[{}]", above.names().join(", "))?;
        }
        super::fmt_projection_and_ran(f, t, &self.spec.projection, &self.ran)
    }
}

impl ExecutionPlan for SetSelectExec {
    fn name(&self) -> &str {
        if self.is_join() {
            "SemiJoinExec"
        } else {
            "SetOpExec"
        }
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.spec.probe, &self.spec.build]
    }

    /// Kept rows leave in their input order, partition by partition.
    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true, false]
    }

    /// Partitioned: both sides partitioned on the keys. Otherwise all input
    /// partitions are read at once, in whatever partitioning they come.
    fn required_input_distribution(&self) -> Vec<Distribution> {
        match self.partitioned {
            false if self.single_partition_inputs => vec![Distribution::SinglePartition; 2],
            false => vec![Distribution::UnspecifiedDistribution; 2],
            true => vec![
                Distribution::KeyPartitioned(self.spec.probe_keys.clone()),
                Distribution::KeyPartitioned(self.spec.build_keys.clone()),
            ],
        }
    }

    /// Read all at once, repartitioning the inputs first only costs.
    /// Partitioned, yes: DataFusion's EnforceDistribution decides whether the
    /// hash repartitioning is needed before it splits a Parquet input of one
    /// file group into byte ranges, and with `false` here decided "one
    /// partition, no hash" for an input it then split (four unhashed
    /// partitions under a KeyPartitioned requirement: SanityCheckPlan failed).
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![self.partitioned; 2]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        super::visit_exprs(self.spec.probe_keys.iter().chain(&self.spec.build_keys), f)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let (probe, build) = super::two_children(children, "SetSelectExec")?;
        Ok(Arc::new(self.rebuilt(probe, build, self.spec.projection.clone())?))
    }

    fn gather_filters_for_pushdown(
        &self,
        phase: FilterPushdownPhase,
        parent_filters: Vec<Arc<dyn PhysicalExpr>>,
        config: &ConfigOptions,
    ) -> Result<FilterDescription> {
        dynamic_filter::gather(
            phase,
            parent_filters,
            config,
            self.key_filter_plan().as_ref(),
            self.spec.dynamic_filter.as_ref(),
        )
    }

    fn handle_child_pushdown_result(
        &self,
        _phase: FilterPushdownPhase,
        result: ChildPushdownResult,
        _config: &ConfigOptions,
    ) -> Result<FilterPushdownPropagation<Arc<dyn ExecutionPlan>>> {
        let updated = match dynamic_filter::accepted(&result, self.key_filter_plan().as_ref()) {
            Some(filter) => {
                let mut exec =
                    self.rebuilt(self.spec.probe.clone(), self.spec.build.clone(), self.spec.projection.clone())?;
                Arc::make_mut(&mut exec.spec).dynamic_filter = Some(filter);
                Some(Arc::new(exec) as Arc<dyn ExecutionPlan>)
            }
            None => None,
        };
        Ok(dynamic_filter::propagate(result, updated))
    }

    /// The inputs are not limited (which rows are kept depends on all of
    /// both); the node itself stops after `fetch` rows per partition.
    fn supports_limit_pushdown(&self) -> bool {
        false
    }

    fn fetch(&self) -> Option<usize> {
        self.fetch
    }

    fn with_fetch(&self, fetch: Option<usize>) -> Option<Arc<dyn ExecutionPlan>> {
        if self.aggregate_above.is_some() {
            return None;
        }
        let mut exec =
            self.rebuilt(self.spec.probe.clone(), self.spec.build.clone(), self.spec.projection.clone()).ok()?;
        exec.fetch = fetch;
        Some(Arc::new(exec))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let (probe_partitions, build_partitions) = self.input_partitions(partition)?;
        // With an aggregate above, the one output partition reads every part.
        if self.aggregate_above.is_some() && partition != 0 {
            return Err(DataFusionError::Internal(format!("{}: no partition {partition}", self.name())));
        }
        let parts = probe_partitions.len();
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        // Partitioned, each partition is an execution of its own, output as its part 0.
        let (execution, part) = if self.partitioned {
            (Arc::new(SharedRun::new()).join(partition), 0)
        } else {
            (self.result.join(partition), partition)
        };
        let stream_probe = self.streams_probe()?;
        let mut run = Run {
            stream_probe,
            spec: self.spec.clone(),
            probe_partitions,
            build_partitions,
            name: self.name().to_string(),
            output: match &self.spec.projection {
                _ if self.spec.schema.fields().is_empty() => OutputColumns::RowCount,
                None => OutputColumns::All,
                Some(p) => OutputColumns::Columns(p.clone()),
            },
            aggregate: self.aggregate_above.clone(),
            selector: Selector {
                op: self.spec.op,
                nulls: self.spec.nulls,
                backend: self.spec.decision.backend,
                key_from_device: self.key_column_in_output(),
                device_keys: Mutex::new(None),
                // Registered below by the partition that runs the execution.
                metrics: Metrics::default(),
                ran: self.ran.clone(),
                reservation: None,
            },
            elapsed_compute: baseline.elapsed_compute().clone(),
        };
        // The execution's metrics are registered once, by whichever partition runs it;
        // shared by all partitions, they name none of them (see `DeviceMetrics::new`).
        let metrics = self.metrics.clone();
        let metrics_partition = self.partitioned.then_some(partition);
        let elapsed_compute = baseline.elapsed_compute().clone();
        let fetch = self.fetch;
        let schema = self.spec.schema.clone();
        let batch_size = context.session_config().batch_size().max(1);
        let aggregate = self.aggregate_above.clone();
        let ran = self.ran.clone();
        let probe = self.spec.probe.clone();
        let probe_context = input_context(&context);
        let fut = async move {
            let sel = execution
                .get(move || {
                    run.selector.metrics = Metrics::new(&metrics, metrics_partition);
                    run.run(context)
                })
                .await?;
            crate::util::trace(&format!("partition {partition} ready"));
            if let Some(table) = sel.streamed.take(part) {
                drop(sel);
                let input = probe.execute(partition, probe_context)?;
                return Ok(table.stream(input, batch_size, elapsed_compute));
            }
            if let Some(above) = aggregate {
                // The aggregate's row: the device's, or every part's output folded into it here.
                let row = match &sel.aggregated {
                    Some(row) => row.clone(),
                    None => {
                        let mut folding = Folding::new(&above);
                        for p in 0..parts {
                            let mut batches = part_stream(sel.outputs.take(p), &schema, batch_size, &elapsed_compute);
                            while let Some(batch) = batches.next().await {
                                let batch = batch?;
                                let _timer = elapsed_compute.timer();
                                folding.add(&batch)?;
                            }
                        }
                        if let Some(r) = ran.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                            r.push_str("; the aggregate above folded on the host");
                        }
                        folding.finish()?
                    }
                };
                return Ok::<_, DataFusionError>(futures::stream::iter(vec![Ok(row)]).boxed());
            }
            let part = sel.outputs.take(part);
            drop(sel);
            Ok(part_stream(part, &schema, batch_size, &elapsed_compute))
        };
        let stream = futures::stream::once(fut).try_flatten();
        // Rows are counted as they leave, after the fetch's limit.
        let stream = super::observed(dynamic_filter::limit_stream(stream.boxed(), fetch), baseline);
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema(), stream)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    /// Absorb a column-only projection above (e.g. the empty one under
    /// count(*)): fewer columns are filtered, none at all for an empty one.
    fn try_swapping_with_projection(&self, projection: &ProjectionExec) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        if self.aggregate_above.is_some() {
            return Ok(None);
        }
        try_embed_projection(projection, self)
    }
}

impl EmbeddedProjection for SetSelectExec {
    /// `projection` indexes this node's output columns; it is composed with
    /// the node's own projection of the kept side.
    fn with_projection(&self, projection: Option<Vec<usize>>) -> Result<Self> {
        let composed = match (&self.spec.projection, projection) {
            (Some(own), Some(p)) => Some(p.iter().map(|&i| own[i]).collect()),
            (None, p) => p,
            (own, None) => own.clone(),
        };
        self.rebuilt(self.spec.probe.clone(), self.spec.build.clone(), composed)
    }
}

/// One part of the selection's output as a stream of batches: filtered
/// chunks (as the stream is read), batches, or rows without columns.
fn part_stream(
    part: Option<PartitionOutput>,
    schema: &SchemaRef,
    batch_size: usize,
    elapsed_compute: &Time,
) -> futures::stream::BoxStream<'static, Result<RecordBatch>> {
    let _timer = elapsed_compute.timer();
    let out: Vec<Result<RecordBatch>> = match part {
        Some(PartitionOutput::Chunks { chunks, reservation }) => {
            return stream_chunks(chunks, reservation, elapsed_compute.clone());
        }
        Some(PartitionOutput::Batches(batches)) => batches.into_iter().map(Ok).collect(),
        Some(PartitionOutput::Rows(rows)) => {
            // No column is read above (count(*)): row counts only, nothing filtered. Batches
            // stay at batch_size rows: the aggregate above materialises a literal per row,
            // and small arrays are reused by the allocator where huge ones page-fault.
            (0..rows)
                .step_by(batch_size)
                .map(|at| {
                    let options = RecordBatchOptions::new().with_row_count(Some(batch_size.min(rows - at)));
                    RecordBatch::try_new_with_options(schema.clone(), vec![], &options).map_err(DataFusionError::from)
                })
                .collect()
        }
        None => Vec::new(),
    };
    futures::stream::iter(out).boxed()
}

/// One execution of the operator (all partitions).
struct Run {
    /// Stream the probe side past the build side's counts (see [`SetSelectExec::streams_probe`]).
    stream_probe: bool,
    spec: Arc<SetSelectSpec>,
    /// The operator's name, for its memory consumer.
    name: String,
    /// The input partitions read (all of them unless partitioned).
    probe_partitions: std::ops::Range<usize>,
    build_partitions: std::ops::Range<usize>,
    /// The probe side's columns to output.
    output: OutputColumns,
    /// The aggregate above, absorbed: where the device reads the kept rows'
    /// columns, it reduces them instead of sending them back.
    aggregate: Option<Arc<AggregateAbove>>,
    selector: Selector,
    /// The elapsed_compute of the partition that runs the execution: the
    /// execution's own work (selection, output planning) counts there, as
    /// DataFusion's hash join counts its shared build side.
    elapsed_compute: Time,
}

impl std::ops::Deref for Run {
    type Target = Selector;
    fn deref(&self) -> &Selector {
        &self.selector
    }
}

/// The device-scan attempt's outcome: the result, or the inputs collected so
/// far and why the host must read the device-scanned ones after all.
enum DeviceOutcome {
    Done(Selected),
    Fallback { reason: String, probe_parts: Option<Vec<Vec<RecordBatch>>>, build_parts: Option<Vec<Vec<RecordBatch>>> },
}

impl Run {
    /// Is this input a device scan whose keys the device reads itself? Only a
    /// side whose batches are not output (the build side; the probe side
    /// under a row count) or whose output columns the device decodes, with
    /// the scan's key columns, on the GPU backend.
    fn device_scanned(&self, probe: bool) -> Option<&DeviceScanExec> {
        let plan = if probe { &self.spec.probe } else { &self.spec.build };
        let scan = plan.downcast_ref::<DeviceScanExec>()?;
        // The probe side's rows are output: the device decodes its columns too.
        let keys_only = !probe || self.output == OutputColumns::RowCount || scan.payload().is_some();
        (keys_only && self.backend == Backend::Gpu && self.spec.probe_keys.len() == scan.key_count()).then_some(scan)
    }

    async fn run(self, context: Arc<TaskContext>) -> Result<Selected> {
        if self.stream_probe {
            return self.run_streamed(context).await;
        }
        let cfg = SetfusionConfig::from_options(context.session_config().options());
        crate::util::trace("run start");
        let waiting = Instant::now();
        let inputs = input_context(&context);
        let memory = reservation(&context, &self.name);
        let batch_size = context.session_config().batch_size();
        let (device_probe, device_build) = (self.device_scanned(true).is_some(), self.device_scanned(false).is_some());
        let collect = |plan: &Arc<dyn ExecutionPlan>, parts: std::ops::Range<usize>, skip: bool| {
            let (plan, inputs, memory) = (plan.clone(), inputs.clone(), memory.clone());
            async move {
                match skip {
                    true => Ok(None),
                    false => collect_partitions_reserved(plan, parts, inputs, &memory).await.map(Some),
                }
            }
        };
        let mut run = self;
        let mut fell_back = None;
        let (mut probe_parts, mut build_parts) = (None, None);
        if device_probe || device_build {
            // The device reads a scanned side itself, so no host scan waits on
            // this node's dynamic filter: it is left complete and unnarrowed.
            if let Some(filter) = &run.spec.dynamic_filter {
                filter.give_up();
            }
            // One side collected on the host: the other's keys are read on
            // host threads meanwhile.
            let ahead = match (run.device_scanned(true), run.device_scanned(false)) {
                (Some(scan), None) => super::device_select::ReadAheads {
                    probe: super::device_select::read_ahead(scan, &cfg),
                    build: None,
                },
                (None, Some(scan)) => super::device_select::ReadAheads {
                    probe: None,
                    build: super::device_select::read_ahead(scan, &cfg),
                },
                _ => Default::default(),
            };
            let (p, b) = futures::try_join!(
                collect(&run.spec.probe, run.probe_partitions.clone(), device_probe),
                collect(&run.spec.build, run.build_partitions.clone(), device_build)
            )?;
            run.selector.reservation = Some(memory.clone());
            run.metrics.note_memory(&memory);
            let (c, m) = (cfg.clone(), memory.clone());
            let (back, outcome) = super::off_runtime(move || {
                let timer = run.elapsed_compute.timer();
                let outcome = run.select_device_scanned(&c, p, b, batch_size, &m, ahead);
                timer.done();
                Ok((run, outcome))
            })
            .await?;
            run = back;
            match outcome? {
                DeviceOutcome::Done(selected) => {
                    run.metrics.input_time.add_duration(waiting.elapsed());
                    return Ok(selected);
                }
                DeviceOutcome::Fallback { reason, probe_parts: p, build_parts: b } => {
                    fell_back = Some(reason);
                    (probe_parts, build_parts) = (p, b);
                }
            }
        }
        let (probe_parts, build_parts) = if device_probe || device_build {
            futures::try_join!(
                collect(&run.spec.probe, run.probe_partitions.clone(), probe_parts.is_some()),
                collect(&run.spec.build, run.build_partitions.clone(), build_parts.is_some())
            )
            .map(|(p, b)| (probe_parts.or(p).unwrap_or_default(), build_parts.or(b).unwrap_or_default()))?
        } else {
            let sides = [(&run.spec.probe, &run.probe_partitions), (&run.spec.build, &run.build_partitions)];
            let [p, b] = dynamic_filter::collect_both(
                run.spec.dynamic_filter.as_ref(),
                [&run.spec.probe, &run.spec.build],
                context.session_config().options(),
                |i| collect_partitions_reserved(sides[i].0.clone(), sides[i].1.clone(), inputs.clone(), &memory),
            )
            .await?;
            (p, b)
        };
        run.metrics.input_time.add_duration(waiting.elapsed());
        crate::util::trace("inputs collected");
        run.selector.reservation = Some(memory.clone());
        run.metrics.note_memory(&memory);
        let ran = run.ran.clone();
        let decision = run.spec.decision.clone();
        let selected = super::off_runtime(move || {
            let elapsed_compute = run.elapsed_compute.clone();
            let _timer = elapsed_compute.timer();
            run.select_and_filter(&cfg, probe_parts, build_parts, batch_size, &memory)
        })
        .await?;
        // The selection is done; what is left is the output.
        super::common::start_after_query(&decision);
        if let Some(reason) = fell_back {
            if let Some(r) = ran.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                r.push_str(&format!(", device scan fell back to the host: {reason}"));
            }
        }
        Ok(selected)
    }

    /// The streamed execution (see [`super::streamed_probe`]): the build
    /// side collected (the dynamic filter on the probe side published from
    /// it; one on the build side, whose source is never collected, given up)
    /// and its counts tabled; each partition then streams its probe
    /// partition. Keys that do not pack into 64 bits fall back to the
    /// collected path, the build side already in.
    async fn run_streamed(self, context: Arc<TaskContext>) -> Result<Selected> {
        let cfg = SetfusionConfig::from_options(context.session_config().options());
        let waiting = Instant::now();
        let inputs = input_context(&context);
        let memory = reservation(&context, &self.name);
        let config = context.session_config().options();
        let sides = [&self.spec.probe, &self.spec.build];
        let filter = dynamic_filter::in_use(self.spec.dynamic_filter.as_ref(), sides, config)?;
        let (probe_filter, build_filter) = match filter {
            Some(f) if f.plan.input == FilteredInput::Probe => (Some(f), None),
            other => (None, other),
        };
        if let Some(f) = build_filter {
            f.give_up();
        }
        let build_parts = match collect_partitions_reserved(
            self.spec.build.clone(),
            self.build_partitions.clone(),
            inputs.clone(),
            &memory,
        )
        .await
        {
            Ok(parts) => parts,
            Err(e) => {
                if let Some(f) = &probe_filter {
                    f.give_up();
                }
                return Err(e);
            }
        };
        let build_parts = match probe_filter {
            Some(f) => dynamic_filter::publish_from(f, build_parts, self.spec.probe.schema(), config).await?,
            None => build_parts,
        };
        self.metrics.input_time.add_duration(waiting.elapsed());
        self.metrics.note_memory(&memory);
        crate::util::trace("build side collected");
        let m = memory.clone();
        let (run, build_parts, table) = super::off_runtime(move || {
            let elapsed_compute = self.elapsed_compute.clone();
            let _timer = elapsed_compute.timer();
            let t = Instant::now();
            let batches: Vec<&RecordBatch> = build_parts.iter().flatten().collect();
            self.metrics.device.input_rows.add(batches.iter().map(|b| b.num_rows()).sum());
            let types = keys::key_types(&self.spec.probe_keys, &self.spec.probe.schema())?;
            let cols = key_columns(&batches, &self.spec.build_keys)?;
            let cols =
                cols.into_iter().map(|c| super::selection::coerce_like(c, &types)).collect::<Result<Vec<_>>>()?;
            crate::util::trace("build key columns evaluated");
            let table = ProbeTable::build(
                self.op,
                &cols,
                types,
                self.spec.probe_keys.clone(),
                self.output.clone(),
                self.spec.schema.clone(),
                m.clone(),
            )?;
            self.metrics.encode_time.add_duration(t.elapsed());
            drop(batches);
            Ok((self, build_parts, table))
        })
        .await?;
        let Some(table) = table else {
            // The build side's keys do not pack: the probe side collected, as without streaming.
            let probe_parts =
                collect_partitions_reserved(run.spec.probe.clone(), run.probe_partitions.clone(), inputs, &memory)
                    .await?;
            run.metrics.input_time.add_duration(waiting.elapsed());
            let mut run = run;
            run.selector.reservation = Some(memory.clone());
            return super::off_runtime(move || {
                let elapsed_compute = run.elapsed_compute.clone();
                let _timer = elapsed_compute.timer();
                run.select_and_filter(&cfg, probe_parts, build_parts, context.session_config().batch_size(), &memory)
            })
            .await;
        };
        // The build side's batches are done with: only the table's bytes stay reserved.
        let build_bytes: usize = build_parts.iter().flatten().map(batch_bytes).sum();
        crate::host::drop_later(build_parts);
        let _ = memory.try_shrink(build_bytes.min(memory.size()));
        run.metrics.note_memory(&memory);
        crate::util::trace("build side's counts tabled");
        *run.ran.lock().unwrap_or_else(|e| e.into_inner()) = Some(table.describe());
        super::common::start_after_query(&run.spec.decision);
        let table = Arc::new(table);
        let handles = (0..run.probe_partitions.len()).map(|_| table.clone()).collect();
        Ok(Selected { streamed: Parts::new(handles), ..Selected::outputs(Vec::new()) })
    }

    /// One input for the device selection: its collected batches, or its device scan.
    fn side<'a>(&'a self, parts: &'a Option<Vec<Vec<RecordBatch>>>, probe: bool) -> Option<Side<'a>> {
        let expr = if probe { &self.spec.probe_keys[0] } else { &self.spec.build_keys[0] };
        match parts {
            Some(parts) => Some(Side::Host(parts.iter().flatten().collect(), expr.clone())),
            None => self.device_scanned(probe).map(Side::Device),
        }
    }

    /// The selection with the device-scanned sides read by the device (`None`
    /// parts), then the output: a row count, or the host probe side filtered.
    fn select_device_scanned(
        &self,
        cfg: &SetfusionConfig,
        probe_parts: Option<Vec<Vec<RecordBatch>>>,
        build_parts: Option<Vec<Vec<RecordBatch>>>,
        batch_size: usize,
        memory: &Arc<datafusion::execution::memory_pool::MemoryReservation>,
        ahead: super::device_select::ReadAheads,
    ) -> Result<DeviceOutcome> {
        let key_type = keys::key_type(&self.spec.probe_keys[0].data_type(&self.spec.probe.schema())?);
        if (probe_parts.is_none() && self.device_scanned(true).is_none())
            || (build_parts.is_none() && self.device_scanned(false).is_none())
        {
            return Ok(DeviceOutcome::Fallback { reason: "no device scan".into(), probe_parts, build_parts });
        }
        let (Some(probe), Some(build)) = (self.side(&probe_parts, true), self.side(&build_parts, false)) else {
            return Err(DataFusionError::Internal("setfusion: a device-scanned input without its scan".into()));
        };
        let t = Instant::now();
        // The probe side's columns the output needs, when the device decodes them.
        let needed: Option<Vec<usize>> = match (&probe_parts, &self.output) {
            (Some(_), _) | (None, OutputColumns::RowCount) => None,
            (None, OutputColumns::All) => Some((0..self.spec.probe.schema().fields().len()).collect()),
            (None, OutputColumns::Columns(c)) => Some(c.clone()),
        };
        let outcome = super::device_select::select_device_scanned(
            &self.selector,
            cfg,
            probe,
            build,
            &key_type,
            needed.as_deref().map(|columns| super::device_select::ProbeOutput {
                columns,
                every_row: false,
                filter: None,
                reduce: self.aggregate.is_some(),
            }),
            ahead,
        );
        let super::device_select::DeviceSelected { selection, ran, reports, payload, reduced, .. } = match outcome {
            Ok(Ok(r)) => r,
            // Device trouble or files the device does not decode: the host reads those inputs.
            Ok(Err(reason)) => return Ok(DeviceOutcome::Fallback { reason, probe_parts, build_parts }),
            Err(e) => {
                return Ok(DeviceOutcome::Fallback { reason: crate::util::one_line(&e), probe_parts, build_parts })
            }
        };
        self.metrics.select_time.add_duration(t.elapsed());
        for (which, report) in &reports {
            let plan = if which == "probe" { &self.spec.probe } else { &self.spec.build };
            if let Some(scan) = plan.downcast_ref::<DeviceScanExec>() {
                scan.set_ran(report);
            }
        }
        *self.ran.lock().unwrap_or_else(|e| e.into_inner()) = Some(ran);
        // An aggregate above, over the columns the device reduced or (none read) the kept rows' number.
        if let (Some(above), None) = (&self.aggregate, &probe_parts) {
            let kept = selection.count_set_bits() as u64;
            let row = match (&reduced, &needed) {
                (Some(aggregates), _) => Some(above.row(kept, aggregates)?),
                (None, None) => Some(above.row(kept, &[])?),
                (None, Some(_)) => None,
            };
            if let Some(row) = row {
                memory.free();
                return Ok(DeviceOutcome::Done(Selected { aggregated: Some(row), ..Selected::outputs(Vec::new()) }));
            }
        }
        if let (None, Some(arrays)) = (&probe_parts, payload) {
            // The device sent the kept rows' output columns: they are the output.
            let rows = arrays.first().map_or_else(|| selection.count_set_bits(), |a| a.len());
            let outputs = self.payload_outputs(arrays, rows)?;
            memory.free();
            return Ok(DeviceOutcome::Done(Selected::outputs(outputs)));
        }
        let Some(probe_parts) = probe_parts else {
            // The probe side was never on the host: its output is a row count (see device_scanned).
            let kept = selection.count_set_bits();
            let outputs = (0..self.probe_partitions.len())
                .map(|p| PartitionOutput::Rows(if p == 0 { kept } else { 0 }))
                .collect();
            memory.free();
            return Ok(DeviceOutcome::Done(Selected::outputs(outputs)));
        };
        self.finish(cfg, probe_parts, build_parts.unwrap_or_default(), selection, batch_size, memory)
            .map(DeviceOutcome::Done)
    }

    /// The output from the kept probe rows' columns the device sent back
    /// (`arrays`, in output order): the probe side's partitions of consecutive rows.
    fn payload_outputs(&self, arrays: Vec<ArrayRef>, rows: usize) -> Result<Vec<PartitionOutput>> {
        let partitions = self.probe_partitions.len();
        let parts = super::output_filter::consecutive_batches(&self.spec.schema, &arrays, rows, partitions)?;
        Ok(parts.into_iter().map(PartitionOutput::Batches).collect())
    }

    /// The selection and the output filter over the collected inputs (synchronous: see [`super::off_runtime`]).
    fn select_and_filter(
        self,
        cfg: &SetfusionConfig,
        probe_parts: Vec<Vec<RecordBatch>>,
        build_parts: Vec<Vec<RecordBatch>>,
        batch_size: usize,
        memory: &datafusion::execution::memory_pool::MemoryReservation,
    ) -> Result<Selected> {
        let probe_batches: Vec<&RecordBatch> = probe_parts.iter().flatten().collect();
        let build_batches: Vec<&RecordBatch> = build_parts.iter().flatten().collect();
        let probe_rows: usize = probe_batches.iter().map(|b| b.num_rows()).sum();
        let build_rows: usize = build_batches.iter().map(|b| b.num_rows()).sum();
        self.metrics.device.input_rows.add(probe_rows + build_rows);
        let selection = if probe_rows == 0 {
            BooleanBuffer::new_unset(0)
        } else {
            let types = keys::key_types(&self.spec.probe_keys, &self.spec.probe.schema())?;
            let probe_cols = key_columns(&probe_batches, &self.spec.probe_keys)?;
            let build_cols = key_columns(&build_batches, &self.spec.build_keys)?;
            crate::util::trace("key columns evaluated");
            self.select_columns(cfg, probe_cols, build_cols, &types)?
        };
        crate::util::trace("select done");
        drop((probe_batches, build_batches));
        self.finish(cfg, probe_parts, build_parts, selection, batch_size, memory)
    }

    /// The output over the selection: the build side's bytes released, the
    /// probe side's partitions planned for filtering.
    fn finish(
        &self,
        cfg: &SetfusionConfig,
        probe_parts: Vec<Vec<RecordBatch>>,
        build_parts: Vec<Vec<RecordBatch>>,
        selection: BooleanBuffer,
        batch_size: usize,
        memory: &datafusion::execution::memory_pool::MemoryReservation,
    ) -> Result<Selected> {
        // The build side is done with: its bytes go back to the pool.
        let build_bytes: usize = build_parts.iter().flatten().map(batch_bytes).sum();
        crate::host::drop_later(build_parts);
        let _ = memory.try_shrink(build_bytes.min(memory.size()));
        let device_keys = self.device_keys.lock().unwrap_or_else(|e| e.into_inner()).take();
        let key_column = self.key_from_device.zip(device_keys);
        // The selection and the device's kept keys, read by every partition's stream.
        let shared = memory.new_empty();
        shared.try_grow(selection.len().div_ceil(8) + key_column.as_ref().map_or(0, |(_, k)| k.len()))?;
        let out_mem = match self.backend {
            Backend::Gpu if cfg.pinned_output => gpu::gpu(cfg.device).ok(),
            _ => None,
        };
        let spec = OutputSpec {
            columns: self.output.clone(),
            key_column,
            batch_size,
            out_mem,
            ran: self.ran.clone(),
            filter_time: self.metrics.output_filter_time.clone(),
        };
        let outputs = plan_partitions(probe_parts, &selection, spec, memory, shared)?;
        // What is left (the encoded keys' estimate is already returned) goes back to the pool.
        memory.free();
        crate::util::trace("output planned");
        Ok(Selected::outputs(outputs))
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Array, BooleanArray, Int32Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::physical_expr::expressions::col;
    use datafusion::prelude::SessionContext;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::config::Strategy;
    use crate::exec::common::Reason;

    fn batch(schema: &SchemaRef, rng: &mut rand::rngs::StdRng, n: usize) -> RecordBatch {
        let words = ["", "a", "setfusion", "a string key longer than sixteen bytes", "ß∂ƒ"];
        let s: StringArray =
            (0..n).map(|_| (rng.random_range(0..8) > 0).then(|| words[rng.random_range(0..words.len())])).collect();
        let i: Int32Array = (0..n).map(|_| Some(rng.random_range(0..3))).collect();
        RecordBatch::try_new(schema.clone(), vec![Arc::new(s), Arc::new(i)]).unwrap()
    }

    /// The output with a key column sent back by the device (here: its CPU
    /// twin's compaction) equals the host's own filtering, for every
    /// projection around the key, over partitions of many batches and several
    /// output groups, with a column holding NULLs beside the key.
    #[test]
    fn key_column_from_device_matches_host_filter() {
        use datafusion::arrow::array::Int64Array;
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("s", DataType::Utf8, true),
            Field::new("v", DataType::Int64, false),
        ]));
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mut all_keys = Vec::new();
        let parts: Vec<Vec<RecordBatch>> = [0usize, 3, 90, 1]
            .iter()
            .map(|&batches| {
                (0..batches)
                    .map(|_| {
                        let n = rng.random_range(0..5000);
                        let k: Vec<i64> = (0..n).map(|_| rng.random_range(-1000..1000)).collect();
                        all_keys.extend(k.iter().map(|&x| x as u64));
                        let s: StringArray = (0..n).map(|i| (i % 3 > 0).then(|| format!("s{i}"))).collect();
                        let v = Int64Array::from_iter_values((0..n as i64).map(|i| i * 7));
                        RecordBatch::try_new(
                            schema.clone(),
                            vec![Arc::new(Int64Array::from(k)), Arc::new(s), Arc::new(v)],
                        )
                        .unwrap()
                    })
                    .collect()
            })
            .collect();
        let g = crate::gpu::test_gpu();
        for density in [0.0, 0.3, 1.0] {
            let selection = BooleanBuffer::from_iter((0..all_keys.len()).map(|_| rng.random_bool(density)));
            let keys =
                datafusion::arrow::buffer::Buffer::from_vec(crate::gpu::compact_kept_keys_cpu(&all_keys, &selection));
            let projections: [Option<Vec<usize>>; 6] =
                [None, Some(vec![0, 2]), Some(vec![2, 0]), Some(vec![0]), Some(vec![1, 0, 0]), Some(vec![1])];
            for p in projections {
                let columns = p.clone().map_or(OutputColumns::All, OutputColumns::Columns);
                let (host, _) = filter_all(&parts, &selection, &columns, None, 8192, None).unwrap();
                // With a device, its pinned pool holds the host's fixed-width output.
                let (device, used) = filter_all(
                    &parts,
                    &selection,
                    &columns,
                    Some((0, gpu::PendingBuffer::ready(keys.clone()))),
                    8192,
                    g.clone(),
                )
                .unwrap();
                assert_eq!(used, p.as_ref().is_none_or(|p| p.contains(&0)), "projection {p:?}");
                // Kept keys that do not cover every kept row are not used.
                let short = datafusion::arrow::buffer::Buffer::from_vec(vec![0u64; selection.count_set_bits() + 1]);
                let (_, used) =
                    filter_all(&parts, &selection, &columns, Some((0, gpu::PendingBuffer::ready(short))), 8192, None)
                        .unwrap();
                assert!(!used, "projection {p:?}");
                let mut at = 0;
                for ((h, d), part) in host.iter().zip(&device).zip(&parts) {
                    let cols = p.clone().unwrap_or_else(|| vec![0, 1, 2]);
                    let out_schema = Arc::new(schema.project(&cols).unwrap());
                    // Arrow's own filter, batch by batch, is the reference.
                    let want: Vec<RecordBatch> = part
                        .iter()
                        .map(|b| {
                            let mask = BooleanArray::new(selection.slice(at, b.num_rows()), None);
                            at += b.num_rows();
                            datafusion::arrow::compute::filter_record_batch(&b.project(&cols).unwrap(), &mask).unwrap()
                        })
                        .collect();
                    let want = datafusion::arrow::compute::concat_batches(&out_schema, &want).unwrap();
                    let h = datafusion::arrow::compute::concat_batches(&out_schema, h).unwrap();
                    let d = datafusion::arrow::compute::concat_batches(&out_schema, d).unwrap();
                    assert_eq!(h.columns(), want.columns(), "host, projection {p:?}, density {density}");
                    assert_eq!(d.columns(), want.columns(), "device keys, projection {p:?}, density {density}");
                }
            }
        }
    }

    /// Every row of `batches` read by `row(batch, index)`, sorted.
    fn sorted_rows_by<T: Ord>(batches: &[RecordBatch], row: impl Fn(&RecordBatch, usize) -> T) -> Vec<T> {
        let mut v: Vec<T> =
            batches.iter().flat_map(|b| (0..b.num_rows()).map(|r| row(b, r)).collect::<Vec<_>>()).collect();
        v.sort();
        v
    }

    /// Rows of (Utf8, Int32) batches, sorted.
    fn sorted_rows(batches: &[RecordBatch]) -> Vec<(Option<String>, i32)> {
        use datafusion::arrow::array::AsArray;
        use datafusion::arrow::datatypes::Int32Type;
        sorted_rows_by(batches, |b, r| {
            let s = b.column(0).as_string::<i32>();
            (s.is_valid(r).then(|| s.value(r).to_string()), b.column(1).as_primitive::<Int32Type>().value(r))
        })
    }

    /// Row-encoded keys (strings, composite) give the same rows on the GPU
    /// backend (device row hashes; without a device, its CPU fallback with
    /// deferred host hashes) as on the CPU backend.
    #[tokio::test]
    async fn hashed_keys_gpu_backend_matches_cpu_backend() {
        let schema: SchemaRef =
            Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8, true), Field::new("i", DataType::Int32, false)]));
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        let probe_parts = vec![
            vec![batch(&schema, &mut rng, 300), batch(&schema, &mut rng, 200)],
            vec![batch(&schema, &mut rng, 250)],
        ];
        let build_parts = vec![vec![batch(&schema, &mut rng, 400)]];
        let ctx = SessionContext::new();
        let ops = [
            SetOp::Semi,
            SetOp::Anti,
            SetOp::IntersectDistinct,
            SetOp::IntersectAll,
            SetOp::ExceptDistinct,
            SetOp::ExceptAll,
        ];
        let key_sets: [&[&str]; 2] = [&["s"], &["s", "i"]];
        for keys in key_sets {
            let exprs: Vec<PhysicalExprRef> = keys.iter().map(|k| col(k, &schema).unwrap()).collect();
            for op in ops {
                for nulls in [NullMode::NeverEqual, NullMode::Equal, NullMode::NullAware] {
                    if nulls == NullMode::NullAware && op != SetOp::Anti {
                        continue;
                    }
                    let run = |decision: Decision| {
                        let probe = MemorySourceConfig::try_new_exec(&probe_parts, schema.clone(), None).unwrap();
                        let build = MemorySourceConfig::try_new_exec(&build_parts, schema.clone(), None).unwrap();
                        Arc::new(
                            SetSelectExec::try_new(
                                op,
                                probe,
                                build,
                                exprs.clone(),
                                exprs.clone(),
                                nulls,
                                decision,
                                None,
                            )
                            .unwrap(),
                        )
                    };
                    let (gpu_exec, cpu_exec) = (
                        run(Decision::gpu(Strategy::Hash, Reason::StrategyForced(Strategy::Hash))),
                        run(Decision::cpu(Reason::StrategyCpu)),
                    );
                    let got = datafusion::physical_plan::collect(gpu_exec.clone(), ctx.task_ctx()).await.unwrap();
                    let want = datafusion::physical_plan::collect(cpu_exec, ctx.task_ctx()).await.unwrap();
                    let ran = gpu_exec.ran.lock().unwrap().clone().unwrap_or_default();
                    assert!(
                        ran.starts_with("gpu/hash (device row hashes)")
                            || ran.starts_with("cpu (GPU failed")
                            || ran.starts_with("no-op"),
                        "{ran}"
                    );
                    // Set operations keep *some* copy of equal keys: when the key is not the
                    // whole row, compare the kept keys only (semi/anti keep every matching row).
                    let project = |rows: Vec<(Option<String>, i32)>| -> Vec<(Option<String>, i32)> {
                        let mut v: Vec<_> = if keys.len() == 1 && !matches!(op, SetOp::Semi | SetOp::Anti) {
                            rows.into_iter().map(|(s, _)| (s, 0)).collect()
                        } else {
                            rows
                        };
                        v.sort();
                        v
                    };
                    assert_eq!(
                        project(sorted_rows(&got)),
                        project(sorted_rows(&want)),
                        "{keys:?} {op:?} {nulls:?} ran={ran}"
                    );
                }
            }
        }
    }

    /// The CPU backend's streamed probe: composite integer keys with NULLs
    /// over several probe partitions keep SQL's multiset for every rule it
    /// takes (EXCEPT DISTINCT stays collected), under every kind of output
    /// (all columns, one, none); a build side too wide to pack falls back to
    /// the collected path with the same answer.
    #[tokio::test]
    async fn streamed_probe_keeps_the_multiset() {
        use datafusion::arrow::array::Int64Array;
        use std::collections::HashMap;
        let schema: SchemaRef =
            Arc::new(Schema::new(vec![Field::new("a", DataType::Int32, true), Field::new("b", DataType::Int64, true)]));
        let mut rng = rand::rngs::StdRng::seed_from_u64(27);
        let mut part = |n: usize, wide: bool| -> RecordBatch {
            let a: Int32Array =
                (0..n).map(|_| (rng.random_range(0..10) > 0).then(|| rng.random_range(-3..6))).collect();
            let b: Int64Array = (0..n)
                .map(|i| match (wide && i == 0, rng.random_range(0..12)) {
                    (true, _) => Some(i64::MIN),
                    (_, 0) => None,
                    (_, v) => Some(v * 1_000_000_007),
                })
                .collect();
            RecordBatch::try_new(schema.clone(), vec![Arc::new(a), Arc::new(b)]).unwrap()
        };
        let probe_parts =
            vec![vec![part(700, false), part(300, false)], vec![], vec![part(900, false)], vec![part(50, false)]];
        let builds = [vec![vec![part(600, false)], vec![part(400, false)]], vec![vec![part(500, true)]], vec![vec![]]];
        let rows = |batches: &[RecordBatch]| -> Vec<(Option<i32>, Option<i64>)> {
            use datafusion::arrow::array::AsArray;
            use datafusion::arrow::datatypes::{Int32Type, Int64Type};
            sorted_rows_by(batches, |b, r| {
                let (a, c) = (b.column(0).as_primitive::<Int32Type>(), b.column(1).as_primitive::<Int64Type>());
                (a.is_valid(r).then(|| a.value(r)), c.is_valid(r).then(|| c.value(r)))
            })
        };
        let ctx = SessionContext::new();
        let exprs: Vec<PhysicalExprRef> = ["a", "b"].iter().map(|k| col(k, &schema).unwrap()).collect();
        for build_parts in &builds {
            let (probe_rows, build_rows) =
                (rows(&probe_parts.concat()), rows(&build_parts.iter().flatten().cloned().collect::<Vec<_>>()));
            let mut n: HashMap<_, usize> = HashMap::new();
            build_rows.iter().for_each(|r| *n.entry(*r).or_default() += 1);
            for op in [SetOp::IntersectAll, SetOp::ExceptAll, SetOp::IntersectDistinct, SetOp::ExceptDistinct] {
                let mut m: HashMap<_, usize> = HashMap::new();
                probe_rows.iter().for_each(|r| *m.entry(*r).or_default() += 1);
                let mut want: Vec<(Option<i32>, Option<i64>)> = m
                    .iter()
                    .flat_map(|(r, &mk)| {
                        let nk = n.get(r).copied().unwrap_or(0);
                        let copies = match op {
                            SetOp::IntersectAll => mk.min(nk),
                            SetOp::ExceptAll => mk.saturating_sub(nk),
                            SetOp::IntersectDistinct => (nk > 0) as usize,
                            _ => (nk == 0) as usize,
                        };
                        std::iter::repeat_n(*r, copies)
                    })
                    .collect();
                want.sort();
                for projection in [None, Some(vec![1]), Some(vec![])] {
                    let probe = MemorySourceConfig::try_new_exec(&probe_parts, schema.clone(), None).unwrap();
                    let build = MemorySourceConfig::try_new_exec(build_parts, schema.clone(), None).unwrap();
                    let decision = Decision::cpu(Reason::StrategyCpu);
                    let exec = Arc::new(
                        SetSelectExec::try_new(
                            op,
                            probe,
                            build,
                            exprs.clone(),
                            exprs.clone(),
                            NullMode::Equal,
                            decision,
                            projection.clone(),
                        )
                        .unwrap(),
                    );
                    let got = datafusion::physical_plan::collect(exec.clone(), ctx.task_ctx()).await.unwrap();
                    let ran = exec.ran.lock().unwrap().clone().unwrap_or_default();
                    let streamed = ran.contains("streamed");
                    let wide = build_parts.iter().flatten().any(|b| {
                        b.column(1).as_any().downcast_ref::<Int64Array>().unwrap().iter().any(|v| v == Some(i64::MIN))
                    });
                    assert_eq!(streamed, op != SetOp::ExceptDistinct && !wide, "{op:?}: {ran}");
                    let what = format!("{op:?} {projection:?} build rows {} ran={ran}", build_rows.len());
                    match &projection {
                        None => assert_eq!(rows(&got), want, "{what}"),
                        Some(p) if p.is_empty() => {
                            assert_eq!(got.iter().map(|b| b.num_rows()).sum::<usize>(), want.len(), "{what}")
                        }
                        Some(_) => {
                            let mut b: Vec<Option<i64>> = got
                                .iter()
                                .flat_map(|x| {
                                    x.column(0)
                                        .as_any()
                                        .downcast_ref::<Int64Array>()
                                        .unwrap()
                                        .iter()
                                        .collect::<Vec<_>>()
                                })
                                .collect();
                            b.sort();
                            let mut w: Vec<Option<i64>> = want.iter().map(|r| r.1).collect();
                            w.sort();
                            assert_eq!(b, w, "{what}");
                        }
                    }
                }
            }
        }
    }
}
