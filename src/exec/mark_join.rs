//! `MarkJoinExec`: every probe row, with a three-valued mark column saying
//! whether it is `IN` (or `EXISTS` in) the other input.
//!
//! `[NOT] IN (subquery)` and `[NOT] EXISTS` under OR, NOT, CASE, in a SELECT
//! list or a correlated NOT IN (which DataFusion refuses, or answers with a
//! two-valued mark) become this operator plus an ordinary expression over the
//! mark. For a probe row `p`, its *group* is the build rows that satisfy the
//! subquery's correlation: `on` equalities (NULL equals nothing) and the
//! residual `filter` (TRUE only). Then, by SQL's rules:
//! - EXISTS: TRUE when the group is not empty, else FALSE;
//! - IN: TRUE when a row of the group has `p`'s key; otherwise NULL when the
//!   group is not empty and `p`'s key is NULL or the group holds a NULL key;
//!   otherwise FALSE.
//!
//! Without a residual filter each of "has `p`'s key", "group not empty" and
//! "group holds a NULL key" is a semi selection (on `on` + key, on `on`, and
//! on `on` over the build rows with a NULL key), computed by the same
//! [`Selector`] as `SemiJoinExec` (GPU or CPU backend). With a filter, the
//! host enumerates the candidate pairs of equal `on` keys in bounded rounds,
//! evaluates the filter with DataFusion's `PhysicalExpr` over them, and
//! reduces per probe row (a decided row takes no more pairs).
//!
//! The output keeps the probe side's partitions, order and equivalences: the
//! mark is appended to each probe batch as it came.
//!
//! Device scan: where the marks come from one key selection (a correlated
//! EXISTS on one key, or an uncorrelated IN) and the subquery side is a
//! Parquet scan, that side may be a [`DeviceScanExec`]: its keys (under its
//! filters) are read and decoded by the device, which selects the probe rows
//! against them and counts its rows and NULL keys, so the subquery side never
//! becomes Arrow batches on the host ([`single_build_key`]). The probe side
//! may be one too (its columns decoded by the device for the output): then
//! its key never exists on the host either, and its columns come back from
//! the device, every row in the order of its keys, cut into the probe side's
//! partitions of consecutive rows (the planner allows it only where the
//! probe side promises no order or hash partitioning).
//!
//! Filter above: with both sides read by the device, the node may absorb the
//! `FilterExec` over its marked rows (and that filter's projection, and a
//! projection of columns between them): [`FilterAbove`]. The device runs the
//! filter over the decoded probe columns and the marks, and only the kept
//! rows' projected columns come back (none, for a `count(*)` above); the
//! host, where the device cannot (a fallback, an overflow), evaluates
//! DataFusion's predicate over each marked batch as `FilterExec` would.
//! Above such a filter, an aggregate without grouping over the kept rows'
//! columns (not the mark) may be absorbed too ([`MarkJoinExec::with_aggregate_above`]):
//! the device reduces the kept rows' columns, and only the aggregates' row
//! comes back; the host folds the filtered batches where the device did not.
//!
//! Memory: one `MemoryConsumer` per execution reserves both collected inputs
//! and the encoded keys; once the marks are computed, each partition's probe
//! batches and their marks are reserved until its stream forms their output
//! (one batch at a time) and returns it, and the inputs' reservation is released. Nothing
//! spills: over the pool's limit the query fails with `ResourcesExhausted`.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions, UInt32Array};
use datafusion::arrow::buffer::{BooleanBuffer, NullBuffer};
use datafusion::arrow::compute::{concat, take};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::projection::ProjectionMapping;
use datafusion::physical_expr::{PhysicalExpr, PhysicalExprRef};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::filter_pushdown::{
    ChildPushdownResult, FilterDescription, FilterPushdownPhase, FilterPushdownPropagation,
};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet, Time};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};

use crate::algo::join_filter::{self, PairColumn, PairJoin, Programs};
use crate::algo::select::SetOp;
use crate::config::SetfusionConfig;
use crate::exec::common::{input_context, Backend, Decision, NullMode};
use crate::exec::device_scan::DeviceScanExec;
use crate::exec::dynamic_filter::{self, DynamicKeyFilter, FilteredInput, KeepNulls, KeyFilterPlan};
use crate::exec::kept_aggregate::{AggregateAbove, Folding};
use crate::exec::memory::{
    array_slice_bytes, collect_partitions_reserved, hold_device, reservation, slice_bytes, Execution, Parts, SharedRun,
};
use crate::exec::pair_filter::{self, PairFilter};
use crate::exec::selection::{key_columns, Metrics, Selector};
use crate::keys;

/// Which subquery predicate the mark answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd)]
pub enum MarkKind {
    /// `expr IN (subquery)`: three-valued.
    In,
    /// `EXISTS (subquery)`: never NULL.
    Exists,
}

/// What the operator outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkOutput {
    /// Every probe row, with the mark appended.
    Mark,
    /// The probe rows whose mark is TRUE (a semi join with a residual filter).
    Semi,
    /// The probe rows whose mark is FALSE (an anti join with a residual filter; EXISTS only).
    Anti,
}

/// The `FilterExec` (with its projection) above a mark join, absorbed by it:
/// the node outputs the marked rows the predicate keeps, projected (or, with
/// an aggregate above absorbed too, their aggregates' row).
#[derive(Debug, Clone)]
pub struct FilterAbove {
    /// The predicate over the marked rows (the probe columns, then the mark).
    pub predicate: PhysicalExprRef,
    /// The predicate as the device's row program, over the same columns.
    program: Vec<join_filter::Instr>,
    /// The output columns, by their index among the marked rows' columns.
    pub projection: Vec<usize>,
    /// The marked rows' schema (the node's own without the filter above).
    marked_schema: SchemaRef,
    /// The kept rows' projected schema (the `FilterExec`'s output).
    rows_schema: SchemaRef,
    /// The aggregate above, absorbed: the node outputs its one row.
    aggregate: Option<Arc<AggregateAbove>>,
}

/// A residual filter's device programs, or why the device cannot evaluate it.
pub type DeviceFilter = std::result::Result<Arc<Programs>, String>;

/// The operator. See the module documentation.
#[derive(Debug)]
pub struct MarkJoinExec {
    /// What every execution reads, shared with it (see `exec::common`).
    spec: Arc<MarkJoinSpec>,
    output: MarkOutput,
    schema: SchemaRef,
    cache: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    result: Arc<SharedRun<Parts<(Vec<(Marked, usize)>, MemoryReservation)>>>,
    ran: Arc<Mutex<Option<String>>>,
    /// On a Ballista cluster: the subquery side is broadcast. It is asked for
    /// in one partition (a task sees only its own partition of a shuffled
    /// input, where a mark needs the whole subquery, its NULLs and its row
    /// count), while the probe side keeps its partitions: each partition is
    /// marked on its own (`run(.., Some(p))`), by its own task on a cluster.
    broadcast_build: bool,
    /// With `broadcast_build`: the subquery side, collected once per plan
    /// instance and shared by the partitions' runs (one process executes
    /// every partition of one instance, and a re-executed RepartitionExec
    /// would give each run only part of the rows: misses would become wrong
    /// marks). On a cluster each task decodes its own instance and collects
    /// the whole subquery from the shuffle.
    broadcast: Arc<SharedRun<BroadcastBuild>>,
    /// Output at most this many rows per partition (a LIMIT absorbed by the node).
    fetch: Option<usize>,
    /// Why the subquery side, a Parquet scan, is not read by the device (EXPLAIN).
    scan_note: Option<String>,
    /// The filter above, absorbed (then `schema` and `cache` are the
    /// replaced `FilterExec`'s).
    filter_above: Option<Arc<FilterAbove>>,
}

/// The node's inputs and choices, shared by the node and its executions.
#[derive(Debug, Clone)]
struct MarkJoinSpec {
    kind: MarkKind,
    probe: Arc<dyn ExecutionPlan>,
    build: Arc<dyn ExecutionPlan>,
    /// Correlation equalities: probe side, build side.
    on: Vec<(PhysicalExprRef, PhysicalExprRef)>,
    /// IN only: the probe expression and the subquery's output.
    in_keys: Option<(PhysicalExprRef, PhysicalExprRef)>,
    filter: Option<PairFilter>,
    /// The filter compiled for the device, or why it does not compile.
    device_filter: Option<DeviceFilter>,
    /// The planner's choice (`planner::decision`), shown in EXPLAIN.
    decision: Decision,
    /// The dynamic filter this node publishes into its build input, once a
    /// scan below accepted it (published before the build input is read).
    dynamic_filter: Option<DynamicKeyFilter>,
}

impl MarkJoinSpec {
    /// The subquery side's device scan and the probe key it is selected
    /// against, where the device reads it ([`single_build_key`]).
    fn scanned_build(&self) -> Option<(&DeviceScanExec, PhysicalExprRef)> {
        let scan = self.build.downcast_ref::<DeviceScanExec>()?;
        let (probe_key, _) = single_build_key(&self.on, &self.in_keys, &self.filter).ok()?;
        (self.decision.backend == Backend::Gpu).then_some((scan, probe_key))
    }

    /// The probe side's device scan, where the device reads the subquery
    /// side and decodes the probe side's columns for the output.
    fn scanned_probe(&self) -> Option<&DeviceScanExec> {
        let scan = self.probe.downcast_ref::<DeviceScanExec>()?;
        (scan.payload().is_some() && self.scanned_build().is_some()).then_some(scan)
    }
}

/// The one key pair (probe, build) whose selection decides every mark, when
/// there is one: a correlated EXISTS on one key, or an uncorrelated IN,
/// without a residual filter. Else why not (a device scan of the subquery
/// side reads this key alone).
fn single_build_key(
    on: &[(PhysicalExprRef, PhysicalExprRef)],
    in_keys: &Option<(PhysicalExprRef, PhysicalExprRef)>,
    filter: &Option<PairFilter>,
) -> std::result::Result<(PhysicalExprRef, PhysicalExprRef), String> {
    if filter.is_some() {
        return Err("a residual filter (its columns are read on the host)".into());
    }
    match (on, in_keys) {
        ([(p, b)], None) | ([], Some((p, b))) => Ok((p.clone(), b.clone())),
        _ => Err(format!("{} correlation keys beside the IN key", on.len())),
    }
}

impl MarkJoinExec {
    #[allow(clippy::too_many_arguments)]
    pub fn try_new(
        kind: MarkKind,
        probe: Arc<dyn ExecutionPlan>,
        build: Arc<dyn ExecutionPlan>,
        on: Vec<(PhysicalExprRef, PhysicalExprRef)>,
        in_keys: Option<(PhysicalExprRef, PhysicalExprRef)>,
        filter: Option<PairFilter>,
        mark_name: &str,
        decision: Decision,
    ) -> Result<Self> {
        if (kind == MarkKind::In) != in_keys.is_some() {
            return Err(DataFusionError::Plan(
                "setfusion: an IN mark join needs exactly one key pair, EXISTS none".into(),
            ));
        }
        let probe_schema = probe.schema();
        let schema = if mark_name.is_empty() {
            probe_schema.clone()
        } else {
            let mut fields: Vec<Arc<Field>> = probe_schema.fields().iter().cloned().collect();
            fields.push(Arc::new(Field::new(mark_name, DataType::Boolean, kind == MarkKind::In)));
            Arc::new(Schema::new_with_metadata(fields, probe_schema.metadata().clone()))
        };
        // The probe columns pass through unchanged at their indices: partitioning,
        // orderings and equivalences carry over (the mark is only appended).
        let all: Vec<usize> = (0..probe_schema.fields().len()).collect();
        let mapping = ProjectionMapping::from_indices(&all, &probe_schema)?;
        let input_eq = probe.equivalence_properties();
        let eq = input_eq.project(&mapping, schema.clone());
        let partitioning = probe.output_partitioning().project(&mapping, input_eq);
        let cache = Arc::new(PlanProperties::new(eq, partitioning, EmissionType::Final, Boundedness::Bounded));
        let device_filter = match &filter {
            None => None,
            Some(f) => {
                let in_types = match &in_keys {
                    Some((p, b)) => Some((p.data_type(&probe_schema)?, b.data_type(&build.schema())?)),
                    None => None,
                };
                Some(pair_filter::compile(f, in_types.as_ref().map(|(p, b)| (p, b))).map(Arc::new))
            }
        };
        Ok(Self {
            spec: Arc::new(MarkJoinSpec {
                kind,
                probe,
                build,
                on,
                in_keys,
                filter,
                device_filter,
                decision,
                dynamic_filter: None,
            }),
            output: MarkOutput::Mark,
            schema,
            cache,
            metrics: ExecutionPlanMetricsSet::new(),
            result: Arc::new(SharedRun::new()),
            ran: Arc::new(Mutex::new(None)),
            broadcast_build: false,
            broadcast: Arc::new(SharedRun::new()),
            fetch: None,
            scan_note: None,
            filter_above: None,
        })
    }

    /// This node with the `FilterExec` above it absorbed: `above` (a
    /// `FilterExec`, or a projection over one, whose output it takes over:
    /// schema and properties), `predicate` over this node's output, and the
    /// output columns among them. Err: why not (the device cannot evaluate
    /// the predicate, or the node is not one whose every marked row the
    /// device decodes).
    pub fn with_filter_above(
        &self,
        above: &Arc<dyn ExecutionPlan>,
        predicate: PhysicalExprRef,
        projection: Vec<usize>,
    ) -> std::result::Result<Self, String> {
        if self.output != MarkOutput::Mark
            || self.filter_above.is_some()
            || self.fetch.is_some()
            || self.broadcast_build
        {
            return Err("not a mark join that outputs every marked row".into());
        }
        if self.spec.scanned_probe().is_none() {
            return Err("the probe side is not read by the device".into());
        }
        let marked = self.schema.clone();
        let filter = PairFilter {
            expr: predicate.clone(),
            columns: (0..marked.fields().len()).map(|i| (true, i)).collect(),
            schema: marked.clone(),
        };
        let program = pair_filter::compile(&filter, None)?.filter;
        let projected = marked.project(&projection).map_err(|e| e.to_string())?;
        let schema = above.schema();
        let types = |s: &Schema| s.fields().iter().map(|f| f.data_type().clone()).collect::<Vec<_>>();
        if types(&projected) != types(schema.as_ref()) {
            return Err("the filter's output columns are not the marked rows' columns".into());
        }
        let mut exec =
            self.rebuilt(self.spec.probe.clone(), self.spec.build.clone()).map_err(|e| crate::util::one_line(&e))?;
        let rows_schema = schema.clone();
        let filter =
            FilterAbove { predicate, program, projection, marked_schema: marked, rows_schema, aggregate: None };
        exec.filter_above = Some(Arc::new(filter));
        exec.schema = schema;
        exec.cache = above.properties().clone();
        Ok(exec)
    }

    /// This node, with its filter above absorbed, with the aggregate above
    /// that absorbed too: `above` (the aggregate's final node, whose output it
    /// takes over: schema and properties) and what it computes, over the
    /// filter's output columns but the mark. Err: why not.
    pub fn with_aggregate_above(
        &self,
        above: &Arc<dyn ExecutionPlan>,
        aggregate: AggregateAbove,
    ) -> std::result::Result<Self, String> {
        let Some(filter) = &self.filter_above else { return Err("no filter above absorbed".into()) };
        if filter.aggregate.is_some() || self.fetch.is_some() || self.broadcast_build {
            return Err("a mark join with a fetch, an aggregate or a broadcast subquery side".into());
        }
        let mark = filter.marked_schema.fields().len() - 1;
        if aggregate.columns_read().iter().any(|&c| filter.projection.get(c).is_none_or(|&m| m == mark)) {
            return Err("an aggregate over the mark".into());
        }
        if aggregate.schema().as_ref() != above.schema().as_ref() {
            return Err("the aggregate's output is not its node's".into());
        }
        let mut exec =
            self.rebuilt(self.spec.probe.clone(), self.spec.build.clone()).map_err(|e| crate::util::one_line(&e))?;
        exec.filter_above = Some(Arc::new(FilterAbove { aggregate: Some(Arc::new(aggregate)), ..(**filter).clone() }));
        exec.schema = above.schema();
        exec.cache = above.properties().clone();
        Ok(exec)
    }

    /// The absorbed aggregate above (over the absorbed filter), if any.
    pub fn aggregate_above(&self) -> Option<&AggregateAbove> {
        self.filter_above.as_ref().and_then(|f| f.aggregate.as_deref())
    }

    /// The absorbed filter above, if any.
    pub fn filter_above(&self) -> Option<&FilterAbove> {
        self.filter_above.as_deref()
    }

    /// The schema of the rows the node forms: the filter above's output where
    /// one is absorbed (an aggregate above folds them), else its own.
    fn rows_schema(&self) -> SchemaRef {
        self.filter_above.as_ref().map_or_else(|| self.schema.clone(), |a| a.rows_schema.clone())
    }

    /// The key pair (probe, build) a device scan of the subquery side would
    /// read, or why there is none ([`single_build_key`]; not on a cluster,
    /// whose tasks see one partition each).
    pub fn device_scan_keys(&self) -> std::result::Result<(PhysicalExprRef, PhysicalExprRef), String> {
        if self.broadcast_build {
            return Err("inputs in one partition (a cluster)".into());
        }
        single_build_key(&self.spec.on, &self.spec.in_keys, &self.spec.filter)
    }

    /// This node over other inputs (their device scans), with the note
    /// EXPLAIN shows where the device does not read an input.
    pub fn with_scans(
        &self,
        probe: Arc<dyn ExecutionPlan>,
        build: Arc<dyn ExecutionPlan>,
        note: Option<String>,
    ) -> Result<Self> {
        let mut exec = self.rebuilt(probe, build)?;
        exec.scan_note = note;
        Ok(exec)
    }

    /// The dynamic filter this node can publish: the build (subquery) side
    /// pruned by the probe side's correlation (`on`) keys. A build row whose
    /// `on` key equals no probe row's is in no probe row's group, so it
    /// changes no mark, whatever the output; the probe side is never
    /// pruned (every probe row is output with its mark, or decided by its
    /// group). None without `on` keys.
    pub fn key_filter_plan(&self) -> Option<KeyFilterPlan> {
        // Broadcast: each probe partition runs on its own and would publish its own keys into
        // the one build side every partition reads.
        if self.broadcast_build {
            return None;
        }
        let (probe_keys, build_keys): (Vec<_>, Vec<_>) = self.spec.on.iter().cloned().unzip();
        KeyFilterPlan::new(
            FilteredInput::Build,
            &self.spec.probe,
            &self.spec.build,
            &probe_keys,
            &build_keys,
            KeepNulls::Never,
        )
    }

    /// This node over other inputs, keeping its settings, dynamic filter and fetch.
    fn rebuilt(&self, probe: Arc<dyn ExecutionPlan>, build: Arc<dyn ExecutionPlan>) -> Result<Self> {
        let mut exec = MarkJoinExec::try_new(
            self.spec.kind,
            probe,
            build,
            self.spec.on.clone(),
            self.spec.in_keys.clone(),
            self.spec.filter.clone(),
            &self.mark_name(),
            self.spec.decision.clone(),
        )?
        .with_broadcast_build(self.broadcast_build);
        exec.output = self.output;
        Arc::make_mut(&mut exec.spec).dynamic_filter = self.spec.dynamic_filter.clone();
        exec.fetch = self.fetch;
        exec.scan_note = self.scan_note.clone();
        if let Some(above) = &self.filter_above {
            exec.filter_above = Some(above.clone());
            exec.schema = self.schema.clone();
            exec.cache = self.cache.clone();
        }
        Ok(exec)
    }

    /// Broadcast the subquery side to every probe partition (on a Ballista cluster; see the field).
    pub fn with_broadcast_build(mut self, broadcast: bool) -> Self {
        self.broadcast_build = broadcast;
        self
    }
    pub fn broadcast_build(&self) -> bool {
        self.broadcast_build
    }

    /// A semi or anti join (EXISTS / NOT EXISTS with a residual filter): the
    /// probe rows whose mark is TRUE / FALSE, without a mark column.
    pub fn semi_or_anti(
        anti: bool,
        probe: Arc<dyn ExecutionPlan>,
        build: Arc<dyn ExecutionPlan>,
        on: Vec<(PhysicalExprRef, PhysicalExprRef)>,
        filter: PairFilter,
        decision: Decision,
    ) -> Result<Self> {
        let mut exec = Self::try_new(MarkKind::Exists, probe, build, on, None, Some(filter), "", decision)?;
        exec.output = if anti { MarkOutput::Anti } else { MarkOutput::Semi };
        Ok(exec)
    }

    pub fn kind(&self) -> MarkKind {
        self.spec.kind
    }
    pub fn decision(&self) -> &Decision {
        &self.spec.decision
    }

    pub fn on(&self) -> &[(PhysicalExprRef, PhysicalExprRef)] {
        &self.spec.on
    }
    pub fn in_keys(&self) -> Option<&(PhysicalExprRef, PhysicalExprRef)> {
        self.spec.in_keys.as_ref()
    }
    pub fn filter(&self) -> Option<&PairFilter> {
        self.spec.filter.as_ref()
    }
    pub fn output(&self) -> MarkOutput {
        self.output
    }

    /// Output the probe rows whose mark is TRUE (`Semi`) or FALSE (`Anti`)
    /// instead of every row with its mark; an error unless the node was made
    /// without a mark column (`mark_name` "").
    pub fn with_output(mut self, output: MarkOutput) -> Result<Self> {
        if output != MarkOutput::Mark
            && (self.filter_above.is_some() || self.schema.fields().len() != self.spec.probe.schema().fields().len())
        {
            return Err(DataFusionError::Plan("setfusion: a semi / anti mark join has no mark column".into()));
        }
        self.output = output;
        Ok(self)
    }

    /// The mark column's name ("" for a semi / anti join, which outputs none).
    pub fn mark_name(&self) -> String {
        let marked = self.filter_above.as_ref().map_or(&self.schema, |a| &a.marked_schema);
        match self.output {
            MarkOutput::Mark => marked.fields().last().map(|f| f.name().clone()).unwrap_or_default(),
            MarkOutput::Semi | MarkOutput::Anti => String::new(),
        }
    }
}

impl DisplayAs for MarkJoinExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let kind = match self.spec.kind {
            MarkKind::In => "in",
            MarkKind::Exists => "exists",
        };
        match self.output {
            MarkOutput::Mark => write!(f, "MarkJoinExec: kind={kind}, mark={}", self.mark_name())?,
            MarkOutput::Semi => write!(f, "MarkJoinExec: kind=semi")?,
            MarkOutput::Anti => write!(f, "MarkJoinExec: kind=anti")?,
        }
        if let Some((p, b)) = &self.spec.in_keys {
            write!(f, ", key=({p}, {b})")?;
        }
        if !self.spec.on.is_empty() {
            let on: Vec<String> = self.spec.on.iter().map(|(p, b)| format!("({p}, {b})")).collect();
            write!(f, ", on=[{}]", on.join(", "))?;
        }
        if let Some(filter) = &self.spec.filter {
            write!(f, ", filter={}", filter.expr)?;
            if let (Backend::Gpu, Some(d)) = (self.spec.decision.backend, &self.spec.device_filter) {
                match d {
                    Ok(_) => write!(f, ", filter_on=device")?,
                    Err(why) => write!(f, ", filter_on=host (\"{why}\")")?,
                }
            }
        }
        write!(f, ", {}", self.spec.decision)?;
        if let Some(note) = &self.scan_note {
            write!(f, ", device_scan=\"{note}\"")?;
        }
        if self.broadcast_build {
            write!(f, ", subquery=broadcast")?;
        }
        if let Some(d) = &self.spec.dynamic_filter {
            write!(f, ", dynamic_filter={}", d.plan.input.name())?;
        }
        if let Some(above) = &self.filter_above {
            let marked = above.marked_schema.fields();
            let names: Vec<&str> = above.projection.iter().map(|&i| marked[i].name().as_str()).collect();
            write!(f, ", filter_above={} (on the device), output=[{}]", above.predicate, names.join(", "))?;
            if let Some(aggregate) = &above.aggregate {
                write!(f, ", aggregate_above=[{}]", aggregate.names().join(", "))?;
            }
        }
        if let Some(fetch) = self.fetch {
            write!(f, ", fetch={fetch}")?;
        }
        super::fmt_projection_and_ran(f, t, &None, &self.ran)
    }
}

impl ExecutionPlan for MarkJoinExec {
    fn name(&self) -> &str {
        "MarkJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.spec.probe, &self.spec.build]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true, false]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false, false]
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        let build =
            if self.broadcast_build { Distribution::SinglePartition } else { Distribution::UnspecifiedDistribution };
        vec![Distribution::UnspecifiedDistribution, build]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        let keys = self.spec.on.iter().chain(&self.spec.in_keys).flat_map(|(p, b)| [p, b]);
        super::visit_exprs(keys.chain(self.spec.filter.as_ref().map(|f| &f.expr)), f)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let (probe, build) = super::two_children(children, "MarkJoinExec")?;
        Ok(Arc::new(self.rebuilt(probe, build)?))
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
                let mut exec = self.rebuilt(self.spec.probe.clone(), self.spec.build.clone())?;
                Arc::make_mut(&mut exec.spec).dynamic_filter = Some(filter);
                Some(Arc::new(exec) as Arc<dyn ExecutionPlan>)
            }
            None => None,
        };
        Ok(dynamic_filter::propagate(result, updated))
    }

    /// The inputs are not limited (every mark depends on all of the build
    /// side); the node itself stops after `fetch` rows per partition.
    fn supports_limit_pushdown(&self) -> bool {
        false
    }

    fn fetch(&self) -> Option<usize> {
        self.fetch
    }

    fn with_fetch(&self, fetch: Option<usize>) -> Option<Arc<dyn ExecutionPlan>> {
        let mut exec = self.rebuilt(self.spec.probe.clone(), self.spec.build.clone()).ok()?;
        exec.fetch = fetch;
        Some(Arc::new(exec))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let execution = self.result.join(partition);
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let mut run = Run {
            spec: self.spec.clone(),
            memory: None,
            // Registered below by the partition that runs the execution.
            metrics: Metrics::default(),
            elapsed_compute: baseline.elapsed_compute().clone(),
            ran: self.ran.clone(),
            scan_fell_back: None,
            filter_above: self.filter_above.clone(),
            schema: self.rows_schema(),
            output_partitions: self.cache.output_partitioning().partition_count(),
        };
        let (fetch, output, schema) = (self.fetch, self.output, self.rows_schema());
        let above = self.filter_above.clone();
        let ran = self.ran.clone();
        let broadcast = self.broadcast_build.then(|| self.broadcast.join(partition));
        let metrics = self.metrics.clone();
        let elapsed_compute = baseline.elapsed_compute().clone();
        let fut = async move {
            // Broadcast: this partition's own run over its probe partition; else one run for all,
            // whose metrics (registered once) name no partition: see `DeviceMetrics::new`.
            let (parts, index) = if let Some(build) = broadcast {
                run.metrics = Metrics::new(&metrics, Some(partition));
                (Arc::new(run.run(context, Some((partition, build))).await?), 0)
            } else {
                let parts = execution
                    .get(move || {
                        run.metrics = Metrics::new(&metrics, None);
                        run.run(context, None)
                    })
                    .await?;
                (parts, partition)
            };
            let (batches, memory) = match parts.take(index) {
                Some(part) => (part.0, Some(part.1)),
                None => (Vec::new(), None),
            };
            if let Some(aggregate) = above.as_ref().and_then(|a| a.aggregate.clone()) {
                // The aggregate's row: the device's, or the filtered rows folded into it here.
                let mut folding = Folding::new(&aggregate);
                let mut row = None;
                for ((b, mark), bytes) in batches {
                    if mark.is_none() && Arc::ptr_eq(&b.schema(), aggregate.schema()) {
                        row = Some(b);
                        continue;
                    }
                    let _timer = elapsed_compute.timer();
                    if let Some(kept) = form_output(output, above.as_deref(), &schema, b, mark)? {
                        folding.add(&kept)?;
                    }
                    if let Some(m) = &memory {
                        let _ = m.try_shrink(bytes);
                    }
                }
                let row = match row {
                    Some(row) => row,
                    None => {
                        if let Some(r) = ran.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                            r.push_str("; the aggregate above folded on the host");
                        }
                        folding.finish()?
                    }
                };
                return Ok::<_, DataFusionError>(futures::stream::iter(vec![Ok(row)]).boxed());
            }
            // Each probe batch's bytes are reserved until its output is formed and returned.
            let formed = batches.into_iter().map(move |((b, mark), bytes)| {
                let _timer = elapsed_compute.timer();
                let out = form_output(output, above.as_deref(), &schema, b, mark);
                if let Some(m) = &memory {
                    let _ = m.try_shrink(bytes);
                }
                out
            });
            Ok(futures::stream::iter(formed.filter_map(|r| r.transpose())).boxed())
        };
        let stream = futures::stream::once(fut).try_flatten();
        // Rows are counted as they leave, after the fetch's limit.
        let stream = super::observed(dynamic_filter::limit_stream(stream.boxed(), fetch), baseline);
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), stream)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// A probe batch with its slice of the mark column, or (None) an output
/// batch the device formed (the rows the filter above kept).
type Marked = (RecordBatch, Option<BooleanArray>);

/// The bytes a [`Marked`] holds: its slices of the probe's buffers and the mark.
fn marked_bytes((b, mark): &Marked) -> usize {
    slice_bytes(b) + mark.as_ref().map_or(0, |m| array_slice_bytes(m))
}

/// One output batch from a probe batch and its marks: the batch with the mark
/// appended (and, with a filter above, the rows its predicate keeps,
/// projected, as `FilterExec` forms them); for semi (anti) output, its rows
/// whose mark is TRUE (FALSE; an EXISTS mark is never NULL). None when no row
/// is kept. A batch without a mark is output as it is.
fn form_output(
    output: MarkOutput,
    above: Option<&FilterAbove>,
    schema: &SchemaRef,
    b: RecordBatch,
    mark: Option<BooleanArray>,
) -> Result<Option<RecordBatch>> {
    let Some(mark) = mark else { return Ok((b.num_rows() > 0).then_some(b)) };
    if output == MarkOutput::Mark {
        let mut columns = b.columns().to_vec();
        columns.push(Arc::new(mark));
        let Some(above) = above else { return Ok(Some(RecordBatch::try_new(schema.clone(), columns)?)) };
        let marked = RecordBatch::try_new(above.marked_schema.clone(), columns)?;
        let kept = datafusion::physical_plan::filter::batch_filter(&marked, &above.predicate)?;
        let projected = kept.project(&above.projection)?;
        let options = RecordBatchOptions::new().with_row_count(Some(projected.num_rows()));
        let out = RecordBatch::try_new_with_options(schema.clone(), projected.columns().to_vec(), &options)?;
        return Ok((out.num_rows() > 0).then_some(out));
    }
    let keep = if output == MarkOutput::Semi { mark.values().clone() } else { !mark.values() };
    let kept = datafusion::arrow::compute::filter_record_batch(&b, &BooleanArray::new(keep, None))?;
    Ok((kept.num_rows() > 0).then_some(kept))
}

/// One execution (all partitions).
struct Run {
    spec: Arc<MarkJoinSpec>,
    /// The execution's memory reservation (set when it starts).
    memory: Option<Arc<MemoryReservation>>,
    /// The execution's metrics, shared by its selections.
    metrics: Metrics,
    /// The elapsed_compute of the partition that runs the execution (its
    /// marks count there, as DataFusion's hash join counts its shared build side).
    elapsed_compute: Time,
    ran: Arc<Mutex<Option<String>>>,
    /// Why the device could not read the device-scanned subquery side after all.
    scan_fell_back: Option<String>,
    /// The node's filter above, which the device runs where it reads both sides.
    filter_above: Option<Arc<FilterAbove>>,
    /// The node's output schema.
    schema: SchemaRef,
    /// The node's output partitions (with a filter above, the replaced
    /// node's: a round-robin repartition under the filter is absorbed too).
    output_partitions: usize,
}

/// A broadcast subquery side: collected once for a plan instance's probe
/// partitions, each of which takes one share; the last to take its share
/// leaves the collection to the shares, so that it (and its reservation) is
/// released when the last run is done with it.
struct BroadcastBuild {
    /// The collection while some probe partition has not taken its share yet,
    /// and how many have not.
    shares: Mutex<(Option<Arc<CollectedBuild>>, usize)>,
}

/// The subquery side's batches (its one partition) and the reservation they hold.
struct CollectedBuild {
    parts: Vec<Vec<RecordBatch>>,
    memory: Arc<MemoryReservation>,
}

impl BroadcastBuild {
    fn new(build: CollectedBuild, probe_partitions: usize) -> Self {
        Self { shares: Mutex::new((Some(Arc::new(build)), probe_partitions)) }
    }

    /// One probe partition's share. A partition takes its share once per
    /// execution (`SharedRun::join` starts a new one when a partition comes again).
    fn take_share(&self) -> Result<Arc<CollectedBuild>> {
        let mut shares = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        let (held, remaining) = &mut *shares;
        let share = held.clone().ok_or_else(|| {
            DataFusionError::Internal("MarkJoinExec: a broadcast subquery side was shared out more than once".into())
        })?;
        *remaining = remaining.saturating_sub(1);
        if *remaining == 0 {
            *held = None;
        }
        Ok(share)
    }
}

/// What a device-scanned subquery side gave: the group facts with the probe
/// rows the device sent back (None: the host's), or the output itself (the
/// rows the filter above kept, projected, per probe partition).
enum Scanned {
    Facts(GroupFacts, Option<Vec<Vec<RecordBatch>>>),
    Formed(Vec<Vec<RecordBatch>>),
}

/// Batches dealt round-robin into `partitions` partitions (as the
/// `RepartitionExec` a filter above absorbed did).
fn deal<T>(parts: Vec<Vec<T>>, partitions: usize) -> Vec<Vec<T>> {
    let mut out: Vec<Vec<T>> = (0..partitions.max(1)).map(|_| Vec::new()).collect();
    for (i, b) in parts.into_iter().flatten().enumerate() {
        let at = i % out.len();
        out[at].push(b);
    }
    out
}

/// The group facts of a single key selection `sel` against a device-scanned
/// subquery side of `build_rows` rows, `build_nulls` of them with a NULL key
/// (`probe_null`: the probe rows whose key is NULL). EXISTS on one
/// correlation key: the group is the matched rows. Uncorrelated IN: every
/// probe row's group is the whole subquery.
fn scanned_facts(
    kind: MarkKind,
    sel: BooleanBuffer,
    build_rows: usize,
    build_nulls: usize,
    probe_null: Option<BooleanBuffer>,
) -> GroupFacts {
    if kind == MarkKind::Exists {
        return GroupFacts { matched: sel.clone(), nonempty: sel, has_null: None, probe_null: None };
    }
    let n = sel.len();
    let constant = |v: bool| if v { BooleanBuffer::new_set(n) } else { BooleanBuffer::new_unset(n) };
    GroupFacts {
        matched: if build_rows == 0 { constant(false) } else { sel },
        nonempty: constant(build_rows > 0),
        has_null: (build_nulls > 0).then(|| constant(true)),
        probe_null,
    }
}

/// The mark of every probe row from its group's facts, by SQL's rules (see
/// the module documentation).
fn mark_array(kind: MarkKind, facts: GroupFacts) -> BooleanArray {
    match kind {
        MarkKind::Exists => BooleanArray::new(facts.nonempty, None),
        MarkKind::In => {
            // NULL exactly when not matched, the group is not empty, and the
            // probe key or a group key is NULL.
            let either = match (facts.probe_null, facts.has_null) {
                (None, None) => None,
                (Some(a), None) | (None, Some(a)) => Some(a),
                (Some(a), Some(b)) => Some(&a | &b),
            };
            let nulls = either.map(|e| NullBuffer::new(!&(&(&!&facts.matched & &facts.nonempty) & &e)));
            BooleanArray::new(facts.matched, nulls)
        }
    }
}

/// Per probe row: a row of the group has its key / the group is not empty /
/// the group holds a NULL key (IN only).
struct GroupFacts {
    matched: BooleanBuffer,
    nonempty: BooleanBuffer,
    /// None: no group holds a NULL key (no per-row work for the common case).
    has_null: Option<BooleanBuffer>,
    /// IN: the probe rows whose key is NULL (None: none is), from the key
    /// columns the selections already evaluated.
    probe_null: Option<BooleanBuffer>,
}

impl Run {
    /// Mark every probe partition, or, broadcast, only the given probe
    /// partition against the subquery side its plan instance collects once.
    async fn run(
        mut self,
        context: Arc<TaskContext>,
        broadcast: Option<(usize, Arc<Execution<BroadcastBuild>>)>,
    ) -> Result<Parts<(Vec<(Marked, usize)>, MemoryReservation)>> {
        let cfg = SetfusionConfig::from_options(context.session_config().options());
        let inputs = input_context(&context);
        let memory = reservation(&context, "MarkJoinExec");
        let probe_partition = broadcast.as_ref().map(|(p, _)| *p);
        // The broadcast subquery side this run holds until its marks are computed.
        let mut build_share: Option<Arc<CollectedBuild>> = None;
        let (probe_plan, build_plan) = (self.spec.probe.clone(), self.spec.build.clone());
        let sides = [&probe_plan, &build_plan];
        let ranges = [
            probe_partition.map_or(0..self.spec.probe.output_partitioning().partition_count(), |p| p..p + 1),
            0..self.spec.build.output_partitioning().partition_count(),
        ];
        let (probe_parts, build_parts, facts) = if probe_partition.is_none() && self.spec.scanned_build().is_some() {
            // The subquery side is read by the device: only the probe side is
            // collected, unless the device reads it too.
            let mut ahead = super::device_select::ReadAheads::default();
            let probe_parts = match self.spec.scanned_probe() {
                Some(_) => None,
                None => {
                    // The subquery side's keys are read on host threads meanwhile.
                    ahead.build =
                        self.spec.scanned_build().and_then(|(scan, _)| super::device_select::read_ahead(scan, &cfg));
                    Some(
                        collect_partitions_reserved(probe_plan.clone(), ranges[0].clone(), inputs.clone(), &memory)
                            .await?,
                    )
                }
            };
            // (Its peak is noted below, with whatever the host reads after a fallback.)
            self.memory = Some(memory.clone());
            let at = cfg.clone();
            let (run, probe_parts, facts) = super::off_runtime(move || {
                let facts = self.facts_scanned(&at, probe_parts.as_deref(), ahead)?;
                Ok((self, probe_parts, facts))
            })
            .await?;
            self = run;
            match facts {
                Ok(Scanned::Facts(facts, device_rows)) => {
                    (probe_parts.or(device_rows).unwrap_or_default(), Vec::new(), Some(Scanned::Facts(facts, None)))
                }
                Ok(formed @ Scanned::Formed(_)) => (Vec::new(), Vec::new(), Some(formed)),
                Err(reason) => {
                    // The host reads them after all (a scan node runs DataFusion's scan).
                    self.scan_fell_back = Some(reason);
                    let probe_parts = match probe_parts {
                        Some(parts) => parts,
                        None => {
                            collect_partitions_reserved(probe_plan.clone(), ranges[0].clone(), inputs.clone(), &memory)
                                .await?
                        }
                    };
                    let build_parts =
                        collect_partitions_reserved(build_plan.clone(), ranges[1].clone(), inputs.clone(), &memory)
                            .await?;
                    (probe_parts, build_parts, None)
                }
            }
        } else if let Some((_, shared)) = &broadcast {
            let probe_parts =
                collect_partitions_reserved(probe_plan.clone(), ranges[0].clone(), inputs.clone(), &memory).await?;
            let (plan, range, inputs, context) =
                (build_plan.clone(), ranges[1].clone(), inputs.clone(), context.clone());
            let probe_count = self.spec.probe.output_partitioning().partition_count();
            let share = shared
                .get(|| async move {
                    let memory = reservation(&context, "MarkJoinExec");
                    let parts = collect_partitions_reserved(plan, range, inputs, &memory).await?;
                    Ok(BroadcastBuild::new(CollectedBuild { parts, memory }, probe_count))
                })
                .await?
                .take_share()?;
            let build_parts = share.parts.clone();
            build_share = Some(share);
            (probe_parts, build_parts, None)
        } else {
            let [probe_parts, build_parts] = dynamic_filter::collect_both(
                self.spec.dynamic_filter.as_ref(),
                sides,
                context.session_config().options(),
                |i| collect_partitions_reserved(sides[i].clone(), ranges[i].clone(), inputs.clone(), &memory),
            )
            .await?;
            (probe_parts, build_parts, None)
        };
        crate::util::trace("mark join: inputs collected");
        self.memory = Some(memory.clone());
        self.metrics.note_memory(&memory);
        let decision = self.spec.decision.clone();
        let marked = super::off_runtime(move || {
            let (elapsed_compute, metrics) = (self.elapsed_compute.clone(), self.metrics.clone());
            let _timer = elapsed_compute.timer();
            // A filter above may have taken over a round-robin repartition's partitions: the
            // marked batches are dealt out to them.
            let dealt = self.filter_above.as_ref().map(|_| self.output_partitions);
            let out = self.mark_and_output(&cfg, probe_parts, build_parts, facts)?;
            let out = match dealt {
                Some(partitions) if out.len() != partitions => deal(out, partitions),
                _ => out,
            };
            // Each partition's probe batches and marks are reserved on their own until
            // the stream returns them; then the inputs' reservation is released.
            let parts = out
                .into_iter()
                .map(|marked| {
                    let sized: Vec<(Marked, usize)> = marked
                        .into_iter()
                        .map(|m| {
                            let n = marked_bytes(&m);
                            (m, n)
                        })
                        .collect();
                    let r = memory.new_empty();
                    r.try_grow(sized.iter().map(|(_, n)| n).sum())?;
                    Ok((sized, r))
                })
                .collect::<Result<Vec<_>>>()?;
            // The inputs (a broadcast subquery side included) and the marks' reservations, all
            // held at this point.
            let broadcast_bytes = build_share.as_ref().map_or(0, |b| b.memory.size());
            metrics
                .peak_memory
                .set_max(memory.size() + broadcast_bytes + parts.iter().map(|(_, r)| r.size()).sum::<usize>());
            memory.free();
            drop(build_share);
            Ok(Parts::new(parts))
        })
        .await;
        // The marks are done; the device (kept off this query only for its start) starts for the next ones.
        super::common::start_after_query(&decision);
        marked
    }

    /// Each probe batch with its marks, over the collected inputs, or with
    /// the facts already computed (the subquery side read by the device), or
    /// the output the device formed as it is (synchronous: see [`super::off_runtime`]).
    fn mark_and_output(
        self,
        cfg: &SetfusionConfig,
        probe_parts: Vec<Vec<RecordBatch>>,
        build_parts: Vec<Vec<RecordBatch>>,
        scanned: Option<Scanned>,
    ) -> Result<Vec<Vec<Marked>>> {
        let facts = match scanned {
            Some(Scanned::Formed(parts)) => {
                return Ok(parts.into_iter().map(|part| part.into_iter().map(|b| (b, None)).collect()).collect());
            }
            Some(Scanned::Facts(facts, _)) => facts,
            None => {
                let probe: Vec<&RecordBatch> = probe_parts.iter().flatten().collect();
                let build: Vec<&RecordBatch> = build_parts.iter().flatten().collect();
                let n: usize = probe.iter().map(|b| b.num_rows()).sum();
                let nb: usize = build.iter().map(|b| b.num_rows()).sum();
                self.metrics.device.input_rows.add(n + nb);
                let facts = if n == 0 {
                    let none = BooleanBuffer::new_unset(0);
                    GroupFacts { matched: none.clone(), nonempty: none, has_null: None, probe_null: None }
                } else if self.spec.filter.is_some() {
                    self.facts_filtered(cfg, &probe, &build)?
                } else {
                    self.facts_keyed(cfg, &probe, &build, n, nb)?
                };
                if let Some(reason) = &self.scan_fell_back {
                    if let Some(r) = self.ran.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                        r.push_str(&format!(", device scan fell back to the host: {reason}"));
                    }
                }
                facts
            }
        };
        crate::util::trace("mark join: group facts computed");
        let mark = mark_array(self.spec.kind, facts);
        crate::util::trace("mark join: mark computed");
        // Each probe batch with its slice of the mark; the output is formed as the stream returns it.
        let mut at = 0;
        let out = probe_parts
            .into_iter()
            .map(|part| {
                part.into_iter()
                    .map(|b| {
                        let m = mark.slice(at, b.num_rows());
                        at += b.num_rows();
                        (b, Some(m))
                    })
                    .collect()
            })
            .collect();
        Ok(out)
    }

    /// One semi selection of the probe rows against the build rows on `keys`
    /// (per batch, both sides), through the shared [`Selector`].
    /// `what` names the selection in EXPLAIN ANALYZE's `ran`.
    fn semi(
        &self,
        cfg: &SetfusionConfig,
        what: &str,
        probe: &[Vec<ArrayRef>],
        build: &[Vec<ArrayRef>],
        ran: &mut Vec<String>,
    ) -> Result<BooleanBuffer> {
        let Some(first) = probe.first() else { return Ok(BooleanBuffer::new_unset(0)) };
        let types: Vec<DataType> = first.iter().map(|c| keys::key_type(c.data_type())).collect();
        let said = Arc::new(Mutex::new(None));
        let mut selector = Selector::new(
            SetOp::Semi,
            NullMode::NeverEqual,
            self.spec.decision.backend,
            self.metrics.clone(),
            said.clone(),
        );
        selector.reservation = self.memory.clone();
        let sel = selector.select_columns(cfg, probe.to_vec(), build.to_vec(), &types)?;
        ran.extend(said.lock().unwrap().take().map(|r| format!("{what}: {r}")));
        Ok(sel)
    }

    /// The group facts with the subquery side's keys read by the device: one
    /// semi selection of the probe keys against them (EXISTS: the group is
    /// not empty; IN: the key is matched), the subquery's row and NULL key
    /// counts from its scan (IN: the group is every row). The probe side is
    /// `probe_parts`, or, None, read by the device too: then its rows come
    /// back as the probe side's partitions, in the order of the selection;
    /// with a filter above, the device runs it over them and their marks, and
    /// only the output comes back ([`Scanned::Formed`]).
    /// `Ok(Err(why))`: the host must read the device-scanned sides.
    fn facts_scanned(
        &self,
        cfg: &SetfusionConfig,
        probe_parts: Option<&[Vec<RecordBatch>]>,
        ahead: super::device_select::ReadAheads,
    ) -> Result<std::result::Result<Scanned, String>> {
        use super::device_select::{select_device_scanned, MarkedRowsFilter, ProbeOutput, Side};
        let Some((scan, probe_key)) = self.spec.scanned_build() else { return Ok(Err("no device scan".into())) };
        let probe_schema = self.spec.probe.schema();
        let key_type = keys::key_type(&probe_key.data_type(&probe_schema)?);
        let mut selector = Selector::new(
            SetOp::Semi,
            NullMode::NeverEqual,
            self.spec.decision.backend,
            self.metrics.clone(),
            Default::default(),
        );
        selector.reservation = self.memory.clone();
        let width = probe_schema.fields().len();
        // The probe columns the device decodes: every one, or those the filter above reads or outputs.
        let (decoded, program, projection) = match &self.filter_above {
            None => ((0..width).collect::<Vec<usize>>(), Vec::new(), Vec::new()),
            Some(above) => {
                let read = above.program.iter().filter(|i| i.op == join_filter::op::COL).map(|i| i.arg as usize);
                let mut decoded: Vec<usize> =
                    read.chain(above.projection.iter().copied()).filter(|&c| c < width).collect();
                decoded.sort_unstable();
                decoded.dedup();
                // Column numbers among the decoded ones (the mark last).
                let at = |c: usize| decoded.iter().position(|&d| d == c).unwrap_or(decoded.len());
                let program = above
                    .program
                    .iter()
                    .map(|i| match i.op {
                        join_filter::op::COL => join_filter::Instr::new(i.op, at(i.arg as usize) as u32, i.imm),
                        _ => *i,
                    })
                    .collect();
                let projection = above.projection.iter().map(|&c| at(c)).collect();
                (decoded, program, projection)
            }
        };
        let kind = self.spec.kind;
        let mark = move |sel: &BooleanBuffer, probe_nulls: Option<&NullBuffer>, rows: usize, nulls: usize| {
            let probe_null = probe_nulls.map(|n| !n.inner());
            mark_array(kind, scanned_facts(kind, sel.clone(), rows, nulls, probe_null))
        };
        let aggregate = self.filter_above.as_ref().and_then(|a| a.aggregate.clone());
        let marked_rows =
            MarkedRowsFilter { program: &program, projection: &projection, mark: &mark, reduce: aggregate.is_some() };
        let filter = self.filter_above.as_ref().map(|_| &marked_rows);
        let (probe_side, output) = match (probe_parts, self.spec.scanned_probe()) {
            (Some(parts), _) => (Side::Host(parts.iter().flatten().collect(), probe_key.clone()), None),
            (None, Some(probe)) => {
                (Side::Device(probe), Some(ProbeOutput { columns: &decoded, every_row: true, filter, reduce: false }))
            }
            (None, None) => return Ok(Err("the probe side has no device scan".into())),
        };
        let device = Side::Device(scan);
        let selected = match select_device_scanned(&selector, cfg, probe_side, device, &key_type, output, ahead) {
            Ok(Ok(s)) => s,
            Ok(Err(why)) => return Ok(Err(why)),
            Err(e) => return Ok(Err(crate::util::one_line(&e))),
        };
        for (which, report) in &selected.reports {
            let plan = if which == "probe" { &self.spec.probe } else { &self.spec.build };
            if let Some(scan) = plan.downcast_ref::<DeviceScanExec>() {
                scan.set_ran(report);
            }
        }
        *self.ran.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("key: {}", selected.ran));
        let partitions = self.spec.probe.output_partitioning().partition_count();
        let reserve = |columns: &[ArrayRef]| -> Result<()> {
            if let Some(m) = &self.memory {
                m.try_grow(columns.iter().map(|c| c.get_array_memory_size()).sum())?;
            }
            Ok(())
        };
        // The output itself: the aggregates' row over the rows the filter above kept, by the device.
        if let (Some(rows), Some(reduced), Some(aggregate)) = (selected.filtered_rows, &selected.reduced, &aggregate) {
            let row = aggregate.row(rows as u64, reduced)?;
            crate::util::trace("mark join: the aggregate above's row formed");
            return Ok(Ok(Scanned::Formed(vec![vec![row]])));
        }
        // The output itself: the rows the filter above kept, projected, by the device.
        if let (Some(rows), Some(columns)) = (selected.filtered_rows, &selected.payload) {
            reserve(columns)?;
            let parts = super::output_filter::consecutive_batches(&self.schema, columns, rows, self.output_partitions)?;
            crate::util::trace("mark join: the filter above's rows formed");
            return Ok(Ok(Scanned::Formed(parts)));
        }
        if self.filter_above.is_some() && probe_parts.is_none() {
            // Only the filter's columns came back, not every probe column: the host reads the input.
            return Ok(Err(format!("the filter above was not run on the device ({})", selected.ran)));
        }
        // The probe rows: the host's batches, or the columns the device sent back.
        let device_rows = match (probe_parts, selected.payload) {
            (Some(_), _) => None,
            (None, Some(columns)) => {
                reserve(&columns)?;
                let rows = columns.first().map_or(0, |c| c.len());
                Some(super::output_filter::consecutive_batches(&probe_schema, &columns, rows, partitions)?)
            }
            (None, None) => return Ok(Err("the probe side's columns did not come back from the device".into())),
        };
        let probe: Vec<&RecordBatch> =
            device_rows.as_deref().or(probe_parts).unwrap_or_default().iter().flatten().collect();
        let n: usize = probe.iter().map(|b| b.num_rows()).sum();
        let sel = selected.selection;
        if sel.len() != n {
            return Err(DataFusionError::Internal(format!(
                "setfusion mark join: a selection of {} rows for {n} probe rows",
                sel.len()
            )));
        }
        let probe_null = match self.spec.in_keys {
            None => None,
            Some(_) => null_bits(key_columns(&probe, std::slice::from_ref(&probe_key))?.iter().map(|k| &k[0]), n),
        };
        let facts = scanned_facts(kind, sel, selected.build_rows, selected.build_nulls, probe_null);
        Ok(Ok(Scanned::Facts(facts, device_rows)))
    }

    /// The group facts from key selections alone (no residual filter).
    fn facts_keyed(
        &self,
        cfg: &SetfusionConfig,
        probe: &[&RecordBatch],
        build: &[&RecordBatch],
        n: usize,
        nb: usize,
    ) -> Result<GroupFacts> {
        let (probe_on, build_on): (Vec<_>, Vec<_>) = self.spec.on.iter().cloned().unzip();
        let probe_on = key_columns(probe, &probe_on)?;
        let build_on = key_columns(build, &build_on)?;
        let mut ran = Vec::new();
        let constant = |v: bool| if v { BooleanBuffer::new_set(n) } else { BooleanBuffer::new_unset(n) };
        // The group is not empty: an uncorrelated subquery has one group, the whole build side.
        let nonempty = if self.spec.on.is_empty() {
            constant(nb > 0)
        } else {
            self.semi(cfg, "group", &probe_on, &build_on, &mut ran)?
        };
        let Some((probe_key, build_key)) = &self.spec.in_keys else {
            *self.ran.lock().unwrap() =
                Some(if ran.is_empty() { "constant (uncorrelated EXISTS)".into() } else { ran.join("; ") });
            return Ok(GroupFacts { matched: nonempty.clone(), nonempty, has_null: None, probe_null: None });
        };
        let probe_key_cols = key_columns(probe, std::slice::from_ref(probe_key))?;
        let build_key_cols = key_columns(build, std::slice::from_ref(build_key))?;
        let with_key = |on: &[Vec<ArrayRef>], key: &[Vec<ArrayRef>]| -> Vec<Vec<ArrayRef>> {
            on.iter().zip(key).map(|(o, k)| o.iter().chain(k).cloned().collect()).collect()
        };
        let matched = if nb == 0 {
            constant(false)
        } else {
            self.semi(
                cfg,
                "key",
                &with_key(&probe_on, &probe_key_cols),
                &with_key(&build_on, &build_key_cols),
                &mut ran,
            )?
        };
        let build_nulls: usize = build_key_cols.iter().map(|k| k[0].null_count()).sum();
        let has_null = if build_nulls == 0 {
            None
        } else if self.spec.on.is_empty() {
            Some(constant(true))
        } else {
            // The build rows whose key is NULL, by batch: the groups holding one.
            let null_keyed: Vec<Vec<ArrayRef>> = build_on
                .iter()
                .zip(&build_key_cols)
                .map(|(on, key)| {
                    let is_null = datafusion::arrow::compute::is_null(key[0].as_ref())?;
                    on.iter()
                        .map(|c| Ok(datafusion::arrow::compute::filter(c.as_ref(), &is_null)?))
                        .collect::<Result<Vec<_>>>()
                })
                .collect::<Result<_>>()?;
            Some(self.semi(cfg, "null key", &probe_on, &null_keyed, &mut ran)?)
        };
        *self.ran.lock().unwrap() = Some(ran.join("; "));
        let probe_null = null_bits(probe_key_cols.iter().map(|k| &k[0]), n);
        Ok(GroupFacts { matched, nonempty, has_null, probe_null })
    }

    /// The group facts with a residual filter. On the GPU backend the device
    /// sorts the build keys and finds each probe row's group, and evaluates
    /// the filter when it compiles ([`super::pair_filter`]); otherwise (and
    /// whenever the device cannot: keys that are not fixed-width, overflow,
    /// device trouble) the host evaluates DataFusion's expression over the
    /// candidate pairs, with the device's groups when it has them.
    fn facts_filtered(
        &self,
        cfg: &SetfusionConfig,
        probe: &[&RecordBatch],
        build: &[&RecordBatch],
    ) -> Result<GroupFacts> {
        let mut groups = None;
        let mut why = None;
        if self.spec.decision.backend == Backend::Gpu {
            match self.facts_filtered_gpu(cfg, probe, build) {
                Ok(DeviceOutcome::Facts(facts, ran)) => {
                    *self.ran.lock().unwrap() = Some(ran);
                    return Ok(facts);
                }
                Ok(DeviceOutcome::Groups(g, reason)) => {
                    groups = Some(CandidateGroups::from_device(g));
                    why = Some(format!("gpu groups, filter on the host: {reason}"));
                }
                Ok(DeviceOutcome::Host(reason)) => why = Some(format!("host: {reason}")),
                Err(e) => why = Some(format!("GPU failed: {}", crate::util::one_line(&e))),
            }
        }
        self.facts_filtered_host(probe, build, groups, why)
    }

    /// The keys of the `on` equalities as exact 64-bit keys of both sides
    /// (None: no keys; Err(reason): not fixed-width, or too wide to pack).
    fn exact_on_keys(
        &self,
        probe: &[&RecordBatch],
        build: &[&RecordBatch],
    ) -> Result<std::result::Result<Option<(keys::KeyColumns, keys::KeyColumns)>, String>> {
        if self.spec.on.is_empty() {
            return Ok(Ok(None));
        }
        let (probe_on, build_on): (Vec<_>, Vec<_>) = self.spec.on.iter().cloned().unzip();
        let (ps, bs) = (self.spec.probe.schema(), self.spec.build.schema());
        let types: Vec<DataType> = probe_on.iter().map(|e| e.data_type(&ps)).collect::<Result<_>>()?;
        let build_types: Vec<DataType> = build_on.iter().map(|e| e.data_type(&bs)).collect::<Result<_>>()?;
        if types != build_types || !types.iter().all(|t| keys::is_exact(std::slice::from_ref(t))) {
            return Ok(Err(format!(
                "correlation keys of types {types:?} and {build_types:?} are not fixed-width equal types"
            )));
        }
        let (pk, bk) = (key_columns(probe, &probe_on)?, key_columns(build, &build_on)?);
        if types.len() == 1 {
            return Ok(Ok(Some((keys::encode(&pk, &types, None, true)?, keys::encode(&bk, &types, None, true)?))));
        }
        Ok(match keys::encode_packed(&pk, &bk, &types)? {
            Some(k) => Ok(Some(k)),
            None => Err("composite correlation keys too wide to pack into 64 bits".into()),
        })
    }

    /// The device part of [`Self::facts_filtered`].
    fn facts_filtered_gpu(
        &self,
        cfg: &SetfusionConfig,
        probe: &[&RecordBatch],
        build: &[&RecordBatch],
    ) -> Result<DeviceOutcome> {
        let keys = match self.exact_on_keys(probe, build)? {
            Ok(k) => k,
            Err(reason) => return Ok(DeviceOutcome::Host(reason)),
        };
        let device_filter = self.spec.device_filter.as_ref().expect("a filter");
        if let (Err(reason), None) = (device_filter, &keys) {
            // Nothing for the device to do: no groups to find, no filter it can evaluate.
            return Ok(DeviceOutcome::Host(format!("no correlation keys, and {reason}")));
        }
        let n: usize = probe.iter().map(|b| b.num_rows()).sum();
        let nb: usize = build.iter().map(|b| b.num_rows()).sum();
        let device = crate::gpu::gpu(cfg.device).map_err(crate::gpu::GpuError::from)?;
        let g = hold_device(&device, cfg, self.memory.as_deref())?;
        if let Some(m) = &self.memory {
            self.metrics.peak_memory.set_max(m.size() + crate::gpu::STAGING_HOST_BYTES);
        }
        let mut stats = crate::gpu::TransferStats::default();
        let metrics = &self.metrics.device;
        let programs = match device_filter {
            Ok(p) => p.clone(),
            Err(reason) => {
                let (pk, bk) = keys.as_ref().expect("checked above: keys when the filter does not compile");
                let groups = join_filter::groups_gpu(&g, pk, bk, &mut stats);
                metrics.record(&stats);
                return Ok(DeviceOutcome::Groups(groups?, reason.clone()));
            }
        };
        let filter = self.spec.filter.as_ref().expect("a filter");
        let mut columns = filter
            .columns
            .iter()
            .map(|&(from_probe, i)| {
                let side = if from_probe { probe } else { build };
                let arrays: Vec<ArrayRef> = side.iter().map(|b| b.column(i).clone()).collect();
                PairColumn::new(from_probe, &arrays)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut probe_null = None;
        if let Some((p, b)) = &self.spec.in_keys {
            let pk = key_columns(probe, std::slice::from_ref(p))?;
            let bk = key_columns(build, std::slice::from_ref(b))?;
            probe_null = null_bits(pk.iter().map(|k| &k[0]), n);
            columns.push(PairColumn::new(true, &pk.into_iter().map(|mut k| k.remove(0)).collect::<Vec<_>>())?);
            columns.push(PairColumn::new(false, &bk.into_iter().map(|mut k| k.remove(0)).collect::<Vec<_>>())?);
        }
        let join = PairJoin { keys: keys.as_ref().map(|(p, b)| (p, b)), n, nb, columns: &columns, programs: &programs };
        let facts = join_filter::facts_gpu(&g, &join, &mut stats);
        metrics.record(&stats);
        let Some(facts) = facts? else {
            return Ok(DeviceOutcome::Host("the filter's checked arithmetic overflowed on the device".into()));
        };
        let bits = |mask: u8| BooleanBuffer::from_iter(facts.iter().map(|f| f & mask != 0));
        let has_null = facts.iter().any(|f| f & join_filter::HAS_NULL != 0).then(|| bits(join_filter::HAS_NULL));
        let group_facts = GroupFacts {
            matched: bits(join_filter::MATCHED),
            nonempty: bits(join_filter::NONEMPTY),
            has_null,
            probe_null,
        };
        Ok(DeviceOutcome::Facts(group_facts, "gpu (groups and residual filter on the device)".into()))
    }

    /// The group facts with a residual filter on the host: candidate pairs of
    /// equal `on` keys (the device's groups, or exact row-encoded ones found
    /// here), the filter evaluated with DataFusion's expression over them.
    fn facts_filtered_host(
        &self,
        probe: &[&RecordBatch],
        build: &[&RecordBatch],
        groups: Option<CandidateGroups>,
        why: Option<String>,
    ) -> Result<GroupFacts> {
        let filter = self.spec.filter.as_ref().expect("called with a filter");
        // One array per column over all batches (an empty array of the type when there are none).
        let concat_all = |arrays: Vec<ArrayRef>, data_type: DataType| -> Result<ArrayRef> {
            if arrays.is_empty() {
                return Ok(datafusion::arrow::array::new_empty_array(&data_type));
            }
            let refs: Vec<&dyn Array> = arrays.iter().map(|a| a.as_ref()).collect();
            Ok(concat(&refs)?)
        };
        let concat_side =
            |batches: &[&RecordBatch], exprs: &[PhysicalExprRef], schema: &SchemaRef| -> Result<Vec<ArrayRef>> {
                let per_batch = key_columns(batches, exprs)?;
                exprs
                    .iter()
                    .enumerate()
                    .map(|(c, e)| concat_all(per_batch.iter().map(|b| b[c].clone()).collect(), e.data_type(schema)?))
                    .collect()
            };
        let column = |batches: &[&RecordBatch], i: usize, schema: &SchemaRef| -> Result<ArrayRef> {
            concat_all(batches.iter().map(|b| b.column(i).clone()).collect(), schema.field(i).data_type().clone())
        };
        let (probe_schema, build_schema) = (self.spec.probe.schema(), self.spec.build.schema());
        let n: usize = probe.iter().map(|b| b.num_rows()).sum();
        let nb: usize = build.iter().map(|b| b.num_rows()).sum();
        let groups = match groups {
            Some(g) => g,
            None => {
                let (probe_on, build_on): (Vec<_>, Vec<_>) = self.spec.on.iter().cloned().unzip();
                CandidateGroups::new(
                    &concat_side(probe, &probe_on, &probe_schema)?,
                    &concat_side(build, &build_on, &build_schema)?,
                    nb,
                )?
            }
        };
        let (probe_key, build_key) = match &self.spec.in_keys {
            Some((p, b)) => (
                Some(concat_side(probe, std::slice::from_ref(p), &probe_schema)?.remove(0)),
                Some(concat_side(build, std::slice::from_ref(b), &build_schema)?.remove(0)),
            ),
            None => (None, None),
        };
        let pair_columns: Vec<ArrayRef> = filter
            .columns
            .iter()
            .map(
                |&(from_probe, i)| {
                    if from_probe {
                        column(probe, i, &probe_schema)
                    } else {
                        column(build, i, &build_schema)
                    }
                },
            )
            .collect::<Result<_>>()?;
        let ctx = PairContext {
            filter,
            pair_columns: &pair_columns,
            probe_key: probe_key.as_ref(),
            build_key: build_key.as_ref(),
            groups: &groups,
        };
        // Probe rows in chunks on the copy threads; each chunk's pairs are bounded.
        let chunks: Vec<(usize, usize)> = (0..n).step_by(PROBE_CHUNK).map(|s| (s, (s + PROBE_CHUNK).min(n))).collect();
        let results = crate::host::par_map(&chunks, 1, |&(s, e)| ctx.chunk(s, e))?;
        let (mut matched, mut nonempty, mut has_null) =
            (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        for (m, g, h) in results {
            matched.extend(m);
            nonempty.extend(g);
            has_null.extend(h);
        }
        let pairs = groups.pairs_hint(n);
        *self.ran.lock().unwrap() = Some(match why {
            Some(why) => format!("{why} ({pairs} candidate pairs)"),
            None => format!("cpu (residual filter on the host, {pairs} candidate pairs)"),
        });
        let has_null = has_null.contains(&true).then(|| BooleanBuffer::from(has_null));
        let probe_null = probe_key.as_ref().and_then(|k| null_bits(std::iter::once(k), n));
        Ok(GroupFacts {
            matched: BooleanBuffer::from(matched),
            nonempty: BooleanBuffer::from(nonempty),
            has_null,
            probe_null,
        })
    }
}

/// What the device made of a filtered join.
enum DeviceOutcome {
    /// The facts, and how they were computed (EXPLAIN ANALYZE's `ran`).
    Facts(GroupFacts, String),
    /// Each probe row's group; the filter, for the reason given, is the host's.
    Groups(join_filter::Groups, String),
    /// Nothing: the host does it all, for the reason given.
    Host(String),
}

/// Probe rows per task of the filtered path.
const PROBE_CHUNK: usize = 1 << 14;
/// Candidate pairs evaluated at once (per task): bounds memory when keys have many duplicates.
const PAIR_BATCH: usize = 1 << 16;

/// The build rows of each probe row's group by `on` keys (all build rows when there are none).
struct CandidateGroups {
    /// Build rows sorted by key, and each probe row's range in it.
    build_rows: Vec<u32>,
    ranges: Vec<(u32, u32)>,
    all: bool,
    nb: usize,
}

impl CandidateGroups {
    fn new(probe_on: &[ArrayRef], build_on: &[ArrayRef], nb: usize) -> Result<Self> {
        if probe_on.is_empty() {
            return Ok(Self { build_rows: Vec::new(), ranges: Vec::new(), all: true, nb });
        }
        let fields: Vec<SortField> = probe_on.iter().map(|a| SortField::new(a.data_type().clone())).collect();
        let converter = RowConverter::new(fields)?;
        let probe_rows = converter.convert_columns(probe_on)?;
        let build_rows = converter.convert_columns(build_on)?;
        let any_null = |cols: &[ArrayRef], i: usize| cols.iter().any(|c| c.is_null(i));
        // NULL equals nothing: such rows have no group / join none.
        let mut by_key: HashMap<&[u8], Vec<u32>> = HashMap::new();
        for i in 0..build_rows.num_rows() {
            if !any_null(build_on, i) {
                by_key.entry(build_rows.row(i).data()).or_default().push(i as u32);
            }
        }
        let mut flat = Vec::with_capacity(build_rows.num_rows());
        let mut at: HashMap<&[u8], (u32, u32)> = HashMap::with_capacity(by_key.len());
        for (k, rows) in by_key {
            let s = flat.len() as u32;
            flat.extend(rows);
            at.insert(k, (s, flat.len() as u32));
        }
        let ranges = (0..probe_rows.num_rows())
            .map(|i| {
                if any_null(probe_on, i) {
                    (0, 0)
                } else {
                    at.get(probe_rows.row(i).data()).copied().unwrap_or((0, 0))
                }
            })
            .collect();
        Ok(Self { build_rows: flat, ranges, all: false, nb })
    }

    /// The device's groups ([`join_filter::groups_gpu`]).
    fn from_device(g: join_filter::Groups) -> Self {
        let nb = g.rows.len();
        Self { build_rows: g.rows, ranges: g.ranges, all: false, nb }
    }

    fn len(&self, p: usize) -> usize {
        if self.all {
            self.nb
        } else {
            let (s, e) = self.ranges[p];
            (e - s) as usize
        }
    }

    fn get(&self, p: usize, j: usize) -> u32 {
        if self.all {
            j as u32
        } else {
            self.build_rows[self.ranges[p].0 as usize + j]
        }
    }

    /// Candidate pairs before any early exit, for EXPLAIN ANALYZE.
    fn pairs_hint(&self, n: usize) -> usize {
        (0..n).map(|p| self.len(p)).sum()
    }
}

struct PairContext<'a> {
    filter: &'a PairFilter,
    pair_columns: &'a [ArrayRef],
    probe_key: Option<&'a ArrayRef>,
    build_key: Option<&'a ArrayRef>,
    groups: &'a CandidateGroups,
}

impl PairContext<'_> {
    /// The facts of probe rows `s..e`: pairs in rounds of at most
    /// [`PAIR_BATCH`], a row leaving the rounds once matched.
    fn chunk(&self, s: usize, e: usize) -> Result<(Vec<bool>, Vec<bool>, Vec<bool>)> {
        let rows = e - s;
        let (mut matched, mut nonempty, mut has_null) = (vec![false; rows], vec![false; rows], vec![false; rows]);
        let mut next = vec![0usize; rows];
        let mut open: Vec<usize> = (0..rows).filter(|&r| self.groups.len(s + r) > 0).collect();
        while !open.is_empty() {
            let (mut p_idx, mut b_idx) = (Vec::new(), Vec::new());
            // Spread the batch over the open rows: a row with a huge group cannot starve the others.
            let share = (PAIR_BATCH / open.len()).max(1);
            for &r in &open {
                let len = self.groups.len(s + r);
                let end = (next[r] + share).min(len);
                for j in next[r]..end {
                    p_idx.push((s + r) as u32);
                    b_idx.push(self.groups.get(s + r, j));
                }
                next[r] = end;
                if p_idx.len() >= PAIR_BATCH {
                    break;
                }
            }
            let (passes, key_equal, key_null) = self.evaluate(&p_idx, &b_idx)?;
            for (t, &p) in p_idx.iter().enumerate() {
                let r = p as usize - s;
                if passes.value(t) && passes.is_valid(t) {
                    nonempty[r] = true;
                    matched[r] |= key_equal.as_ref().is_none_or(|k| k.is_valid(t) && k.value(t));
                    has_null[r] |= key_null.as_ref().is_some_and(|k| k.value(t));
                }
            }
            open.retain(|&r| !matched[r] && next[r] < self.groups.len(s + r));
        }
        Ok((matched, nonempty, has_null))
    }

    /// Over pairs (probe row, build row): the filter, and for IN whether the
    /// keys are equal and whether the build key is NULL.
    fn evaluate(
        &self,
        p_idx: &[u32],
        b_idx: &[u32],
    ) -> Result<(BooleanArray, Option<BooleanArray>, Option<BooleanArray>)> {
        let (p, b) = (UInt32Array::from(p_idx.to_vec()), UInt32Array::from(b_idx.to_vec()));
        let columns: Vec<ArrayRef> = self
            .filter
            .columns
            .iter()
            .zip(self.pair_columns)
            .map(|(&(from_probe, _), c)| Ok(take(c.as_ref(), if from_probe { &p } else { &b }, None)?))
            .collect::<Result<_>>()?;
        let options = datafusion::arrow::array::RecordBatchOptions::new().with_row_count(Some(p_idx.len()));
        let batch = RecordBatch::try_new_with_options(self.filter.schema.clone(), columns, &options)?;
        let passes = self.filter.expr.evaluate(&batch)?.into_array(p_idx.len())?;
        let passes = passes
            .as_any()
            .downcast_ref::<BooleanArray>()
            .cloned()
            .ok_or_else(|| DataFusionError::Internal("setfusion: join filter is not boolean".into()))?;
        let (key_equal, key_null) = match (self.probe_key, self.build_key) {
            (Some(pk), Some(bk)) => {
                let (pk, bk) = (take(pk.as_ref(), &p, None)?, take(bk.as_ref(), &b, None)?);
                let equal = datafusion::arrow::compute::kernels::cmp::eq(&pk, &bk)?;
                (Some(equal), Some(datafusion::arrow::compute::is_null(bk.as_ref())?))
            }
            _ => (None, None),
        };
        Ok((passes, key_equal, key_null))
    }
}

/// One bit per row of `keys` (a probe key column, by batch): the key is NULL
/// there; None when it never is.
fn null_bits<'a>(keys: impl Iterator<Item = &'a ArrayRef> + Clone, n: usize) -> Option<BooleanBuffer> {
    if keys.clone().all(|k| k.logical_null_count() == 0) {
        return None;
    }
    let mut bits = datafusion::arrow::array::BooleanBufferBuilder::new(n);
    for k in keys {
        match k.logical_nulls() {
            None => bits.append_n(k.len(), false),
            Some(valid) => bits.append_buffer(&!valid.inner()),
        }
    }
    Some(bits.finish())
}
