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
//! computed once for all partitions (ranks in INTERSECT ALL are global), all
//! partitions are filtered at once on the copy threads (into batches of about
//! 128K rows), and `execute(p)` streams partition `p` of the result.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use datafusion::arrow::array::{make_array, ArrayData, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions};
use datafusion::arrow::buffer::BooleanBuffer;
use datafusion::arrow::compute::BatchCoalescer;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::projection::ProjectionMapping;
use datafusion::physical_expr::{PhysicalExpr, PhysicalExprRef};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, Time};
use datafusion::physical_plan::projection::{try_embed_projection, EmbeddedProjection, ProjectionExec};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    collect_partitioned, DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};
use tokio::sync::OnceCell;

use crate::algo::row_hash;
use crate::algo::select::{self, GpuStrategy, SetOp};
use crate::config::{SetfusionConfig, Strategy};
use crate::exec::DeviceMetrics;
use crate::gpu::{self, TransferStats};
use crate::keys::{self, KeyColumns, RowSubset};

/// Where the selection runs, decided at planning time.
#[derive(Debug, Clone, PartialEq)]
pub enum Backend {
    /// GPU backend with the configured strategy (`auto` picks at run time).
    Gpu(Strategy),
    /// CPU backend, with the reason it was chosen.
    Cpu(String),
}

/// NULL semantics of the keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NullMode {
    /// Equi-join: a NULL key matches nothing.
    NeverEqual,
    /// Set operations (and IS NOT DISTINCT FROM joins): NULL equals NULL.
    Equal,
    /// NOT IN: SQL three-valued logic (any NULL on the other side, or a NULL
    /// kept-side key, removes the row unless the other side is empty).
    NullAware,
}

/// The computed result, per partition of the kept side: its output batches
/// (kept rows, projected), or for an output without columns only the number
/// of kept rows.
#[derive(Debug)]
struct Selected {
    outputs: Vec<Output>,
}

#[derive(Debug)]
enum Output {
    Batches(Vec<RecordBatch>),
    Rows(usize),
}

/// The operator. See the module documentation.
#[derive(Debug)]
pub struct SetSelectExec {
    op: SetOp,
    /// The side whose rows are output.
    keep: Arc<dyn ExecutionPlan>,
    /// The side that is only looked up.
    other: Arc<dyn ExecutionPlan>,
    keep_keys: Vec<PhysicalExprRef>,
    other_keys: Vec<PhysicalExprRef>,
    nulls: NullMode,
    backend: Backend,
    /// Optional projection of the kept side's columns.
    projection: Option<Vec<usize>>,
    schema: SchemaRef,
    cache: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    result: Arc<OnceCell<std::result::Result<Arc<Selected>, Arc<DataFusionError>>>>,
    /// What ran (strategy, partitions), for EXPLAIN ANALYZE.
    ran: Arc<Mutex<Option<String>>>,
    /// The planner's reason for a GPU choice (the cost model's estimate), for EXPLAIN.
    choice_note: Option<String>,
}

impl SetSelectExec {
    #[allow(clippy::too_many_arguments)]
    pub fn try_new(
        op: SetOp,
        keep: Arc<dyn ExecutionPlan>,
        other: Arc<dyn ExecutionPlan>,
        keep_keys: Vec<PhysicalExprRef>,
        other_keys: Vec<PhysicalExprRef>,
        nulls: NullMode,
        backend: Backend,
        projection: Option<Vec<usize>>,
    ) -> Result<Self> {
        if keep_keys.len() != other_keys.len() || keep_keys.is_empty() {
            return Err(DataFusionError::Plan("setfusion: key lists must be non-empty and of equal length".into()));
        }
        let keep_schema = keep.schema();
        let schema = match &projection {
            Some(p) => Arc::new(keep_schema.project(p)?),
            None => keep_schema.clone(),
        };
        // Filtering keeps the kept side's partitioning, orderings and equivalences; a
        // (column-only) projection maps them onto the output columns, as HashJoinExec
        // does. Dropping them instead broke TPC-H Q20: a sort pushed below this node
        // was lost once a projection was embedded, and SortPreservingMergeExec above
        // no longer saw its order.
        let (eq, partitioning) = match &projection {
            None => (keep.equivalence_properties().clone(), keep.output_partitioning().clone()),
            Some(p) => {
                let mapping = ProjectionMapping::from_indices(p, &keep_schema)?;
                let input_eq = keep.equivalence_properties();
                (input_eq.project(&mapping, schema.clone()), keep.output_partitioning().project(&mapping, input_eq))
            }
        };
        let cache = Arc::new(PlanProperties::new(eq, partitioning, EmissionType::Final, Boundedness::Bounded));
        Ok(Self {
            op,
            keep,
            other,
            keep_keys,
            other_keys,
            nulls,
            backend,
            projection,
            schema,
            cache,
            metrics: ExecutionPlanMetricsSet::new(),
            result: Arc::new(OnceCell::new()),
            ran: Arc::new(Mutex::new(None)),
            choice_note: None,
        })
    }

    /// The planner's reason for a GPU choice, shown in EXPLAIN.
    pub fn with_note(mut self, note: Option<String>) -> Self {
        self.choice_note = note;
        self
    }

    pub fn op(&self) -> SetOp {
        self.op
    }
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    fn is_join(&self) -> bool {
        matches!(self.op, SetOp::Semi | SetOp::Anti)
    }

    /// The kept side's column whose kept values the GPU backend can send back
    /// instead of the host cutting them out of the batches: the only key, a
    /// plain column of a 64-bit type whose key is its own bits, and output.
    fn key_column_in_output(&self) -> Option<usize> {
        let [key] = self.keep_keys.as_slice() else { return None };
        let col = key.downcast_ref::<datafusion::physical_expr::expressions::Column>()?;
        let field = self.keep.schema().fields().get(col.index())?.clone();
        let own_bits = keys::key_is_own_bits(field.data_type());
        let output = !self.schema.fields().is_empty() && self.projection.as_ref().is_none_or(|p| p.contains(&col.index()));
        (own_bits && output && matches!(self.backend, Backend::Gpu(_))).then_some(col.index())
    }
}

impl DisplayAs for SetSelectExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let keys: Vec<String> =
            self.keep_keys.iter().zip(&self.other_keys).map(|(a, b)| format!("({a}, {b})")).collect();
        let backend = match &self.backend {
            Backend::Gpu(strategy) => match &self.choice_note {
                Some(note) => format!("gpu, strategy={strategy}, reason=\"{note}\""),
                None => format!("gpu, strategy={strategy}"),
            },
            Backend::Cpu(reason) => format!("cpu, reason=\"{reason}\""),
        };
        write!(f, "{}: op={}", self.name(), self.op.name())?;
        if self.is_join() {
            write!(f, ", on=[{}]", keys.join(", "))?;
        } else {
            write!(f, ", columns={}", self.keep_keys.len())?;
        }
        match self.nulls {
            NullMode::NeverEqual => {}
            NullMode::Equal if !self.is_join() => {}
            NullMode::Equal => write!(f, ", nulls_equal")?,
            NullMode::NullAware => write!(f, ", null_aware")?,
        }
        write!(f, ", backend={backend}")?;
        super::fmt_projection_and_ran(f, t, &self.projection, &self.ran)
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
        vec![&self.keep, &self.other]
    }

    /// Kept rows leave in their input order, partition by partition.
    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true, false]
    }

    /// All input partitions are read at once: repartitioning them first only costs.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false, false]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        super::visit_exprs(self.keep_keys.iter().chain(&self.other_keys), f)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let (keep, other) = super::two_children(children, "SetSelectExec")?;
        Ok(Arc::new(SetSelectExec::try_new(
            self.op,
            keep,
            other,
            self.keep_keys.clone(),
            self.other_keys.clone(),
            self.nulls,
            self.backend.clone(),
            self.projection.clone(),
        )?
        .with_note(self.choice_note.clone())))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let cell = self.result.clone();
        let run = Run {
            keep: self.keep.clone(),
            other: self.other.clone(),
            keep_keys: self.keep_keys.clone(),
            other_keys: self.other_keys.clone(),
            output: (!self.schema.fields().is_empty()).then(|| self.projection.clone()),
            selector: Selector {
                op: self.op,
                nulls: self.nulls,
                backend: self.backend.clone(),
                key_from_device: self.key_column_in_output(),
                device_keys: Mutex::new(None),
                metrics: Metrics::new(&self.metrics),
                ran: self.ran.clone(),
            },
        };
        let out_rows = MetricBuilder::new(&self.metrics).output_rows(partition);
        let schema = self.schema.clone();
        let batch_size = context.session_config().batch_size().max(1);
        let fut = async move {
            let sel = cell
                .get_or_init(|| async move {
                    let r = run.run(context).await.map(Arc::new).map_err(Arc::new);
                    crate::util::trace("run returned");
                    r
                })
                .await
                .clone()
                .map_err(DataFusionError::Shared)?;
            crate::util::trace(&format!("partition {partition} ready"));
            let out = match sel.outputs.get(partition) {
                Some(Output::Batches(batches)) => {
                    out_rows.add(batches.iter().map(|b| b.num_rows()).sum());
                    batches.iter().cloned().map(Ok).collect()
                }
                Some(Output::Rows(rows)) => {
                    // No column is read above (count(*)): row counts only, nothing filtered. Batches
                    // stay at batch_size rows: the aggregate above materialises a literal per row,
                    // and small arrays are reused by the allocator where huge ones page-fault.
                    out_rows.add(*rows);
                    (0..*rows)
                        .step_by(batch_size)
                        .map(|at| {
                            let options = RecordBatchOptions::new().with_row_count(Some(batch_size.min(rows - at)));
                            RecordBatch::try_new_with_options(schema.clone(), vec![], &options).map_err(DataFusionError::from)
                        })
                        .collect()
                }
                None => Vec::new(),
            };
            Ok::<_, DataFusionError>(futures::stream::iter(out))
        };
        let stream = futures::stream::once(fut).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), stream.boxed())))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    /// Absorb a column-only projection above (e.g. the empty one under
    /// count(*)): fewer columns are filtered, none at all for an empty one.
    fn try_swapping_with_projection(&self, projection: &ProjectionExec) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        try_embed_projection(projection, self)
    }
}

impl EmbeddedProjection for SetSelectExec {
    /// `projection` indexes this node's output columns; it is composed with
    /// the node's own projection of the kept side.
    fn with_projection(&self, projection: Option<Vec<usize>>) -> Result<Self> {
        let composed = match (&self.projection, projection) {
            (Some(own), Some(p)) => Some(p.iter().map(|&i| own[i]).collect()),
            (None, p) => p,
            (own, None) => own.clone(),
        };
        SetSelectExec::try_new(
            self.op,
            self.keep.clone(),
            self.other.clone(),
            self.keep_keys.clone(),
            self.other_keys.clone(),
            self.nulls,
            self.backend.clone(),
            composed,
        )
        .map(|e| e.with_note(self.choice_note.clone()))
    }
}

#[derive(Clone)]
struct Metrics {
    device: DeviceMetrics,
    encode_time: Time,
    /// Waiting for both inputs to be collected.
    input_time: Time,
    /// Cutting the kept rows out of the kept side's batches (host, copy threads).
    output_filter_time: Time,
    /// The whole selection (both backends, NULL handling, transfers, kernels).
    select_time: Time,
}

impl Metrics {
    fn new(m: &ExecutionPlanMetricsSet) -> Self {
        Self {
            device: DeviceMetrics::new(m),
            encode_time: MetricBuilder::new(m).subset_time("key_encode_time", 0),
            input_time: MetricBuilder::new(m).subset_time("input_time", 0),
            output_filter_time: MetricBuilder::new(m).subset_time("output_filter_time", 0),
            select_time: MetricBuilder::new(m).subset_time("select_time", 0),
        }
    }
}

/// One execution of the operator (all partitions).
struct Run {
    keep: Arc<dyn ExecutionPlan>,
    other: Arc<dyn ExecutionPlan>,
    keep_keys: Vec<PhysicalExprRef>,
    other_keys: Vec<PhysicalExprRef>,
    /// The kept side's columns to output (None inside: all); None: no column
    /// is output, only row counts.
    output: Option<Option<Vec<usize>>>,
    selector: Selector,
}

impl std::ops::Deref for Run {
    type Target = Selector;
    fn deref(&self) -> &Selector {
        &self.selector
    }
}

/// The selection itself, from key columns to one bit per kept-side row: key
/// encoding, NULL rules, backend and strategy, device fallbacks. Shared by
/// `SetSelectExec` and `MarkJoinExec` (whose marks are semi selections).
pub(crate) struct Selector {
    op: SetOp,
    nulls: NullMode,
    backend: Backend,
    /// The kept side's key column, when it is output and the device can send
    /// its kept values back (see [`SetSelectExec::key_column_in_output`]).
    key_from_device: Option<usize>,
    /// The kept keys the GPU backend sent back, when asked for and possible.
    device_keys: Mutex<Option<gpu::PendingBuffer>>,
    metrics: Metrics,
    ran: Arc<Mutex<Option<String>>>,
}

/// Output batches aim at this many rows (or the session's batch size, if
/// larger): every batch costs a cross-thread hand-off in the operators above
/// (CoalescePartitionsExec under `collect`), measured at ~13 us per batch on
/// the GPU machine, 20 ms for the 1536 batches of a 100M-row input.
const OUTPUT_BATCH_ROWS: usize = 1 << 17;
/// At most this many input rows go into one output batch (one task), so
/// sparse selections still spread over the copy threads.
const GROUP_INPUT_ROWS: usize = 1 << 20;
/// The inputs are executed with at least this batch size. The operator reads
/// all of both inputs before it outputs a row, so their batch size only sets
/// how many batches it handles, each with its own bookkeeping (key arrays,
/// selection slices, packing pieces): a 100M-row in-memory table comes as
/// 12,288 batches of 8,192 rows (DataSourceExec splits its 65,536-row batches
/// to the session's batch size), or as 1,536.
const INPUT_BATCH_ROWS: usize = 1 << 16;

/// `context` with a session batch size of at least [`INPUT_BATCH_ROWS`], for executing the inputs.
pub(crate) fn input_context(context: &Arc<TaskContext>) -> Arc<TaskContext> {
    let config = context.session_config();
    if config.batch_size() >= INPUT_BATCH_ROWS {
        return context.clone();
    }
    Arc::new(TaskContext::new(
        context.task_id(),
        context.session_id(),
        config.clone().with_batch_size(INPUT_BATCH_ROWS),
        context.scalar_functions().clone(),
        context.higher_order_functions().clone(),
        context.aggregate_functions().clone(),
        context.window_functions().clone(),
        context.runtime_env(),
    ))
}

/// Cut the kept rows out of every partition (`projection` applied first, so
/// only output columns are read), on the copy threads, all partitions at
/// once: partitions filtering in their own streams were measured to serialise
/// on the runtime (a woken partition can wait in a busy worker's queue for a
/// whole partition's filtering: 20 ms of 100 on 100M rows). Consecutive input
/// batches of a partition are filtered into one output batch of about
/// [`OUTPUT_BATCH_ROWS`] rows (arrow's `BatchCoalescer` copies kept rows
/// straight into the output), so no extra copy is made to form large batches.
/// `projection`: the kept side's output columns (None inside: all); None: no
/// column is output, only each partition's row count. `key_column`: a column
/// (kept side index) whose kept values came back from the device, in row
/// order, as 64-bit values of its own type: the host slices them instead of
/// reading and filtering that column, when they are as many as the kept rows.
/// Returns the outputs and whether that key column was used.
fn filter_partitions(
    parts: &[Vec<RecordBatch>],
    selection: &BooleanBuffer,
    projection: Option<Option<&[usize]>>,
    key_column: Option<(usize, gpu::PendingBuffer)>,
    batch_size: usize,
    out_mem: Option<&gpu::Gpu>,
) -> Result<(Vec<Output>, bool)> {
    let mut flat = Vec::new();
    let mut at = 0;
    for (p, batches) in parts.iter().enumerate() {
        for b in batches {
            flat.push((p, b, at));
            at += b.num_rows();
        }
    }
    // Counted on the selection's bytes: a BooleanBuffer slice per batch would
    // bump one shared reference count from every thread (3.6 ms for 12,288 batches).
    let (bits, bits_at) = (selection.inner(), selection.offset());
    let kept: Vec<usize> =
        crate::gpu::par_map(&flat, 256, |(_, b, at)| Ok::<_, DataFusionError>(bits.count_set_bits_offset(bits_at + *at, b.num_rows())))?;
    crate::util::trace("filter: kept rows counted");
    let Some(projection) = projection else {
        let mut rows = vec![0; parts.len()];
        flat.iter().zip(&kept).for_each(|((p, ..), k)| rows[*p] += k);
        return Ok((rows.into_iter().map(Output::Rows).collect(), false));
    };
    let Some((_, first, _)) = flat.first() else { return Ok((parts.iter().map(|_| Output::Batches(Vec::new())).collect(), false)) };
    let columns: Vec<usize> = projection.map_or_else(|| (0..first.num_columns()).collect(), <[usize]>::to_vec);
    // Output columns filtered on the host (all but a key column from the device).
    // The device's kept keys stand in for the key column only if they cover every kept row.
    let total: usize = kept.iter().sum();
    let key_column = key_column.filter(|(c, keys)| columns.contains(c) && keys.len() == total * 8);
    let from_device = key_column.is_some();
    let host_columns: Vec<usize> = columns.iter().copied().filter(|&c| key_column.as_ref().is_none_or(|(k, _)| c != *k)).collect();
    // Groups of consecutive batches of one partition: (partition, first, end, kept rows, kept rows before).
    let target = OUTPUT_BATCH_ROWS.max(batch_size);
    let mut groups: Vec<(usize, usize, usize, usize, usize)> = Vec::new();
    let (mut input_rows, mut before) = (0usize, 0usize);
    for (i, ((p, b, _), &k)) in flat.iter().zip(&kept).enumerate() {
        match groups.last_mut() {
            Some(g) if g.0 == *p && g.3 < target && input_rows < GROUP_INPUT_ROWS => {
                g.2 = i + 1;
                g.3 += k;
                input_rows += b.num_rows();
            }
            _ => {
                groups.push((*p, i, i + 1, k, before));
                input_rows = b.num_rows();
            }
        }
        before += k;
    }
    // Fixed-width host columns without NULLs land in one pinned buffer from the
    // device's pool (resident pages, reused across queries) when there is a device.
    let widths = fixed_widths(&flat, &kept, &host_columns);
    crate::util::trace("filter: groups formed, widths checked");
    let pinned_hosts = match (out_mem, &widths) {
        (Some(g), Some(widths)) => Some(filter_fixed_width_pinned(g, &flat, &kept, selection, &groups, &host_columns, widths, before)?),
        _ => None,
    };
    crate::util::trace("filter: pinned columns written");
    // The host's columns of each group's output batch, filtered in parallel
    // while the device's keys are still on their way.
    type Filtered = Result<Option<(SchemaRef, Option<RecordBatch>)>>;
    let mut results: Vec<Option<Filtered>> = groups.iter().map(|_| None).collect();
    crate::gpu::for_each_mut(&mut results, &|g, slot| {
        let (_, first, end, rows, _) = groups[g];
        let run = || -> Filtered {
            if rows == 0 {
                return Ok(None);
            }
            // The batches' own schema (nullability as produced), not the plan's.
            let schema = Arc::new(flat[first].1.schema().project(&columns)?);
            if let Some(hosts) = &pinned_hosts {
                return Ok(Some((schema, hosts[g].clone())));
            }
            if let Some(widths) = &widths {
                let batches = group_batches(flat.as_slice(), &kept, selection, first, end);
                return Ok(Some((schema, Some(filter_fixed_width(&batches, &host_columns, widths, rows)?))));
            }
            let mut out: Option<BatchCoalescer> = None;
            for i in first..end {
                let (_, b, at) = flat[i];
                let n = b.num_rows();
                if kept[i] == 0 || host_columns.is_empty() {
                    continue;
                }
                let b = b.project(&host_columns)?;
                let out = out.get_or_insert_with(|| BatchCoalescer::new(b.schema(), rows));
                if kept[i] == n {
                    out.push_batch(b)?;
                } else {
                    out.push_batch_with_filter(b, &BooleanArray::new(selection.slice(at, n), None))?;
                }
            }
            let host = match out {
                Some(mut out) => {
                    out.finish_buffered_batch()?;
                    out.next_completed_batch()
                }
                None => None,
            };
            Ok(Some((schema, host)))
        };
        *slot = Some(run());
    });
    crate::util::trace("filter: group batches formed");
    let key_column = match key_column {
        Some((c, pending)) => Some((c, pending.wait()?)),
        None => None,
    };
    let mut outputs: Vec<Vec<RecordBatch>> = parts.iter().map(|_| Vec::new()).collect();
    for (&(p, _, _, rows, before), r) in groups.iter().zip(results) {
        let Some((schema, host)) = r.expect("for_each_mut runs every task")? else { continue };
        let arrays: Vec<ArrayRef> = columns
            .iter()
            .enumerate()
            .map(|(j, c)| match (&key_column, &host) {
                (Some((k, keys)), _) if k == c => {
                    let data = ArrayData::builder(schema.field(j).data_type().clone())
                        .len(rows)
                        .add_buffer(keys.slice_with_length(before * 8, rows * 8))
                        .build()?;
                    Ok(make_array(data))
                }
                (_, Some(h)) => Ok(h.column(host_columns.iter().position(|x| x == c).unwrap_or(0)).clone()),
                _ => Err(DataFusionError::Internal("setfusion: output column missing".into())),
            })
            .collect::<Result<_>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        outputs[p].push(RecordBatch::try_new_with_options(schema, arrays, &options)?);
    }
    Ok((outputs.into_iter().map(Output::Batches).collect(), from_device))
}

/// A batch's bits of the selection: the selection's bytes and the bit offset
/// of the batch's first row (no BooleanBuffer per batch: see `filter_partitions`).
pub(crate) type KeptBits<'a> = (&'a [u8], usize);

/// The batches `first..end` of `flat` that keep rows, each with its bits of the selection.
fn group_batches<'a>(
    flat: &[(usize, &'a RecordBatch, usize)],
    kept: &[usize],
    selection: &'a BooleanBuffer,
    first: usize,
    end: usize,
) -> Vec<(&'a RecordBatch, KeptBits<'a>)> {
    (first..end).filter(|&i| kept[i] > 0).map(|i| (flat[i].1, (selection.values(), selection.offset() + flat[i].2))).collect()
}

/// The kept rows of `columns` of `batches` (each with its selection) as one
/// batch of `rows` rows, the columns being fixed-width primitives of byte
/// `widths` (see [`fixed_widths`]): kept values are copied straight into one
/// output buffer per column. (`BatchCoalescer` filters a batch that keeps
/// more than 1/16 of its rows into a temporary batch first and copies that
/// again.)
fn filter_fixed_width(batches: &[(&RecordBatch, KeptBits<'_>)], columns: &[usize], widths: &[usize], rows: usize) -> Result<RecordBatch> {
    let Some((first, _)) = batches.first() else { return Err(DataFusionError::Internal("setfusion: no batch to filter".into())) };
    let mut arrays = Vec::with_capacity(columns.len());
    for (&c, &w) in columns.iter().zip(widths) {
        let values = if w == 8 { kept_values::<u64>(batches, c, rows) } else { kept_values::<u32>(batches, c, rows) };
        let data = ArrayData::builder(first.column(c).data_type().clone()).len(rows).add_buffer(values).build()?;
        arrays.push(make_array(data));
    }
    let schema = Arc::new(first.schema().project(columns)?);
    let options = RecordBatchOptions::new().with_row_count(Some(rows));
    Ok(RecordBatch::try_new_with_options(schema, arrays, &options)?)
}

/// The byte widths of `columns` when every one is a fixed-width 4- or 8-byte
/// primitive of one type without NULLs in every batch with kept rows.
fn fixed_widths(flat: &[(usize, &RecordBatch, usize)], kept: &[usize], columns: &[usize]) -> Option<Vec<usize>> {
    let first = flat.iter().zip(kept).find(|(_, k)| **k > 0)?.0 .1;
    if columns.is_empty() {
        return None;
    }
    columns
        .iter()
        .map(|&c| {
            let dt = first.column(c).data_type().clone();
            let w = dt.primitive_width().filter(|w| *w == 4 || *w == 8)?;
            flat.iter()
                .zip(kept)
                .filter(|(_, k)| **k > 0)
                .all(|((_, b, _), _)| {
                    // (Primitive values are aligned by construction: ScalarBuffer checks it.)
                    let a = b.column(c);
                    a.data_type() == &dt && a.logical_null_count() == 0
                })
                .then_some(w)
        })
        .collect()
}

/// Every group's kept rows of the fixed-width `columns` (see [`fixed_widths`]),
/// written straight into one pinned host buffer (`Gpu::host_output`): one
/// region per column, one slice per group in it. Returns each group's batch of
/// those columns (None for groups that keep nothing).
#[allow(clippy::too_many_arguments)]
fn filter_fixed_width_pinned(
    g: &gpu::Gpu,
    flat: &[(usize, &RecordBatch, usize)],
    kept: &[usize],
    selection: &BooleanBuffer,
    groups: &[(usize, usize, usize, usize, usize)],
    columns: &[usize],
    widths: &[usize],
    total: usize,
) -> Result<Vec<Option<RecordBatch>>> {
    let region: Vec<usize> = widths.iter().map(|w| (total * w).next_multiple_of(64)).collect();
    let bytes: usize = region.iter().sum();
    let mut out = g.host_output(bytes)?;
    crate::util::trace("filter: pinned output buffer ready");
    let mut rest = &mut out.as_mut_slice()?[..bytes];
    // slices[g][j]: group g's part of column j's region.
    let mut slices: Vec<Vec<&mut [u8]>> = groups.iter().map(|_| Vec::new()).collect();
    for (j, w) in widths.iter().enumerate() {
        let (col, tail) = std::mem::take(&mut rest).split_at_mut(region[j]);
        rest = tail;
        let mut col = col;
        for (gi, grp) in groups.iter().enumerate() {
            let (mine, tail) = std::mem::take(&mut col).split_at_mut(grp.3 * w);
            slices[gi].push(mine);
            col = tail;
        }
    }
    crate::gpu::for_each_mut(&mut slices, &|gi, dsts| {
        let (_, first, end, _, _) = groups[gi];
        let batches = group_batches(flat, kept, selection, first, end);
        for ((&c, &w), dst) in columns.iter().zip(widths).zip(dsts.iter_mut()) {
            if w == 8 {
                write_kept::<u64>(&batches, c, dst);
            } else {
                write_kept::<u32>(&batches, c, dst);
            }
        }
    });
    drop(slices);
    let buffer = out.into_buffer(bytes)?;
    let Some(first) = flat.iter().zip(kept).find(|(_, k)| **k > 0).map(|(f, _)| f.1) else {
        return Ok(groups.iter().map(|_| None).collect());
    };
    let schema = Arc::new(first.schema().project(columns)?);
    groups
        .iter()
        .map(|&(_, _, _, rows, before)| {
            if rows == 0 {
                return Ok(None);
            }
            let mut at = 0;
            let arrays = columns
                .iter()
                .zip(widths)
                .enumerate()
                .map(|(j, (&c, &w))| {
                    let data = ArrayData::builder(first.column(c).data_type().clone())
                        .len(rows)
                        .add_buffer(buffer.slice_with_length(at + before * w, rows * w))
                        .build()?;
                    at += region[j];
                    Ok(make_array(data))
                })
                .collect::<Result<Vec<ArrayRef>>>()?;
            let options = RecordBatchOptions::new().with_row_count(Some(rows));
            Ok(Some(RecordBatch::try_new_with_options(schema.clone(), arrays, &options)?))
        })
        .collect()
}

/// Call `f` with every value of `values` whose bit in `mask` (bytes, bit
/// offset of the first value) is set, in order, one 64-bit mask word at a
/// time. The one loop behind the fixed-width output paths (and `setfusion
/// bench filter`).
pub(crate) fn for_each_kept<T: Copy>(values: &[T], mask: KeptBits<'_>, mut f: impl FnMut(T)) {
    let chunks = datafusion::arrow::util::bit_chunk_iterator::BitChunks::new(mask.0, mask.1, values.len());
    let mut word = |base: usize, mut m: u64| {
        while m != 0 {
            f(values[base + m.trailing_zeros() as usize]);
            m &= m - 1;
        }
    };
    for (w, bits) in chunks.iter().enumerate() {
        word(w * 64, bits);
    }
    word(chunks.chunk_len() * 64, chunks.remainder_bits());
}

/// Column `c` (fixed width `T`, aligned, no NULLs) of a batch as a slice.
fn fixed_values<T: datafusion::arrow::datatypes::ArrowNativeType>(b: &RecordBatch, c: usize) -> datafusion::arrow::buffer::ScalarBuffer<T> {
    let data = b.column(c).to_data();
    datafusion::arrow::buffer::ScalarBuffer::<T>::new(data.buffers()[0].clone(), data.offset(), data.len())
}

/// Write the kept values of column `c` (fixed width `T`, aligned, no NULLs) of every batch, in order, into `dst`.
fn write_kept<T: datafusion::arrow::datatypes::ArrowNativeType>(batches: &[(&RecordBatch, KeptBits<'_>)], c: usize, dst: &mut [u8]) {
    use datafusion::arrow::datatypes::ToByteSlice;
    let mut slots = dst.chunks_exact_mut(std::mem::size_of::<T>());
    for &(b, mask) in batches {
        for_each_kept(&fixed_values::<T>(b, c), mask, |v: T| {
            if let Some(slot) = slots.next() {
                slot.copy_from_slice(v.to_byte_slice());
            }
        });
    }
}

/// The kept values of column `c` (fixed width `T`, aligned, no NULLs) of every batch, in order.
fn kept_values<T: datafusion::arrow::datatypes::ArrowNativeType>(
    batches: &[(&RecordBatch, KeptBits<'_>)],
    c: usize,
    rows: usize,
) -> datafusion::arrow::buffer::Buffer {
    let mut out: Vec<T> = Vec::with_capacity(rows);
    for &(b, mask) in batches {
        for_each_kept(&fixed_values::<T>(b, c), mask, |v| out.push(v));
    }
    datafusion::arrow::buffer::Buffer::from_vec(out)
}

/// Evaluate key expressions on every batch: `out[b][k]` is key k of batch b.
pub(crate) fn key_columns(batches: &[&RecordBatch], exprs: &[PhysicalExprRef]) -> Result<Vec<Vec<ArrayRef>>> {
    crate::gpu::par_map(batches, 128, |b| exprs.iter().map(|e| e.evaluate(b).and_then(|v| v.into_array(b.num_rows()))).collect())
}

impl Run {
    async fn run(self, context: Arc<TaskContext>) -> Result<Selected> {
        let cfg = SetfusionConfig::from_options(context.session_config().options());
        crate::util::trace("run start");
        let waiting = Instant::now();
        let inputs = input_context(&context);
        let (keep_parts, other_parts) = futures::try_join!(
            collect_partitioned(self.keep.clone(), inputs.clone()),
            collect_partitioned(self.other.clone(), inputs)
        )?;
        self.metrics.input_time.add_duration(waiting.elapsed());
        crate::util::trace("inputs collected");
        let batch_size = context.session_config().batch_size();
        super::off_runtime(move || self.select_and_filter(&cfg, keep_parts, other_parts, batch_size)).await
    }

    /// The selection and the output filter over the collected inputs (synchronous: see [`super::off_runtime`]).
    fn select_and_filter(
        self,
        cfg: &SetfusionConfig,
        keep_parts: Vec<Vec<RecordBatch>>,
        other_parts: Vec<Vec<RecordBatch>>,
        batch_size: usize,
    ) -> Result<Selected> {
        let keep_batches: Vec<&RecordBatch> = keep_parts.iter().flatten().collect();
        let other_batches: Vec<&RecordBatch> = other_parts.iter().flatten().collect();
        let keep_rows: usize = keep_batches.iter().map(|b| b.num_rows()).sum();
        let other_rows: usize = other_batches.iter().map(|b| b.num_rows()).sum();
        self.metrics.device.input_rows.add(keep_rows + other_rows);
        let selection = if keep_rows == 0 {
            BooleanBuffer::new_unset(0)
        } else {
            let keep_schema = self.keep.schema();
            let types: Vec<DataType> =
                self.keep_keys.iter().map(|k| Ok(keys::key_type(&k.data_type(&keep_schema)?))).collect::<Result<_>>()?;
            let keep_cols = key_columns(&keep_batches, &self.keep_keys)?;
            let other_cols = key_columns(&other_batches, &self.other_keys)?;
            crate::util::trace("key columns evaluated");
            self.select_columns(cfg, keep_cols, other_cols, &types)?
        };
        crate::util::trace("select done");
        let t = Instant::now();
        let projection = self.output.as_ref().map(|p| p.as_deref());
        let device_keys = self.device_keys.lock().unwrap_or_else(|e| e.into_inner()).take();
        let key_column = self.key_from_device.zip(device_keys);
        let g = match &self.backend {
            Backend::Gpu(_) if cfg.pinned_output => gpu::gpu(cfg.device).ok(),
            _ => None,
        };
        let used_device = key_column.is_some() || g.is_some();
        let (outputs, keys_from_device) = match filter_partitions(&keep_parts, &selection, projection, key_column, batch_size, g.as_deref()) {
            // Device trouble (the kept keys' way back, pinned output memory) never fails
            // the query: the host alone filters every column again. A host-side error
            // recurs there and is returned.
            Err(_) if used_device => filter_partitions(&keep_parts, &selection, projection, None, batch_size, None)?,
            r => r?,
        };
        if let Some(ran) = self.ran.lock().unwrap().as_mut().filter(|_| keys_from_device) {
            ran.push_str(", key column from device");
        }
        self.metrics.output_filter_time.add_duration(t.elapsed());
        crate::util::trace("output filtered");
        drop((keep_batches, other_batches));
        crate::gpu::drop_later((keep_parts, other_parts, selection));
        crate::util::trace("inputs dropped");
        Ok(Selected { outputs })
    }

}

impl Selector {
    /// A selector for `op` under `nulls` on `backend`, reporting into `metrics`.
    pub(crate) fn new(op: SetOp, nulls: NullMode, backend: Backend, metrics: &ExecutionPlanMetricsSet, ran: Arc<Mutex<Option<String>>>) -> Self {
        Self { op, nulls, backend, key_from_device: None, device_keys: Mutex::new(None), metrics: Metrics::new(metrics), ran }
    }

    /// One bit per kept-side row (`keep_cols`: per batch, the key columns),
    /// casting both sides' keys to `types` and encoding them first; records what ran.
    pub(crate) fn select_columns(
        &self,
        cfg: &SetfusionConfig,
        keep_cols: Vec<Vec<ArrayRef>>,
        other_cols: Vec<Vec<ArrayRef>>,
        types: &[DataType],
    ) -> Result<BooleanBuffer> {
        let t = Instant::now();
        let keep_cols = keep_cols.into_iter().map(|cols| coerce_like(cols, types)).collect::<Result<Vec<_>>>()?;
        let other_cols = other_cols.into_iter().map(|cols| coerce_like(cols, types)).collect::<Result<Vec<_>>>()?;
        let (mut keep_k, mut other_k, nulls_in_keys) = match keys::encode_packed(&keep_cols, &other_cols, types)? {
            Some((k, o)) => (k, o, true),
            None => {
                let converter = keys::converter_for(types)?;
                // The GPU backend hashes hash-encoded keys on the device; only the CPU backend needs host hashes up front.
                let host_hashes = !matches!(self.backend, Backend::Gpu(_));
                let k = keys::encode(&keep_cols, types, converter.as_ref(), host_hashes)?;
                let o = keys::encode(&other_cols, types, converter.as_ref(), host_hashes)?;
                (k, o, keys::key_bytes_carry_nulls(types))
            }
        };
        if self.nulls == NullMode::Equal && nulls_in_keys {
            // Row-encoded, column-hashed (NULL masks) and packed keys carry their NULLs:
            // (NULL, 1) and (NULL, 2) differ, (NULL, 1) equals (NULL, 1) only.
            keep_k.nulls = None;
            other_k.nulls = None;
        }
        self.metrics.encode_time.add_duration(t.elapsed());
        crate::util::trace("keys encoded");
        let t = Instant::now();
        let (sel, ran) = self.select(cfg, &keep_k, &other_k)?;
        self.metrics.select_time.add_duration(t.elapsed());
        *self.ran.lock().unwrap() = Some(ran);
        crate::gpu::drop_later((keep_k, other_k, keep_cols, other_cols));
        Ok(sel)
    }

    /// Compute the selection over all kept rows, applying NULL semantics around the keyed core.
    fn select(&self, cfg: &SetfusionConfig, keep: &KeyColumns, other: &KeyColumns) -> Result<(BooleanBuffer, String)> {
        let n = keep.len();
        // NOT IN with an empty subquery keeps everything, NULL keys included.
        if self.nulls == NullMode::NullAware && other.is_empty() {
            return Ok((BooleanBuffer::new_set(n), "no-op (empty subquery)".into()));
        }
        // NOT IN with a NULL in the subquery keeps nothing.
        if self.nulls == NullMode::NullAware && other.null_count() > 0 {
            return Ok((BooleanBuffer::new_unset(n), "no-op (NULL in subquery)".into()));
        }
        let null_is_value = self.nulls == NullMode::Equal;
        // Rows with NULL keys leave the keyed core; their fate is decided here.
        let keep_idx: Option<Vec<u32>> =
            (keep.null_count() > 0).then(|| (0..n as u32).filter(|i| !keep.is_null(*i as usize)).collect());
        let other_idx: Option<Vec<u32>> =
            (other.null_count() > 0).then(|| (0..other.len() as u32).filter(|i| !other.is_null(*i as usize)).collect());
        let (mut core, ran) = self.select_keys(cfg, keep, other, &keep_idx, &other_idx)?;
        let Some(keep_idx) = keep_idx else {
            return Ok((core, ran));
        };
        // Scatter back and decide NULL-key rows.
        let mut words = vec![0u32; n.div_ceil(32)];
        for j in core.set_indices() {
            let i = keep_idx[j] as usize;
            words[i >> 5] |= 1 << (i & 31);
        }
        let null_keep_count = {
            let m = keep.null_count();
            let nb = other.null_count();
            match (self.op, null_is_value, self.nulls) {
                (_, _, NullMode::NullAware) => 0,
                (SetOp::Semi, true, _) => if nb > 0 { m } else { 0 },
                (SetOp::Semi, false, _) => 0,
                (SetOp::Anti, true, _) => if nb > 0 { 0 } else { m },
                (SetOp::Anti, false, _) => m,
                (SetOp::IntersectAll, ..) => m.min(nb),
                (SetOp::IntersectDistinct, ..) => (m > 0 && nb > 0) as usize,
                (SetOp::ExceptAll, ..) => m.saturating_sub(nb),
                (SetOp::ExceptDistinct, ..) => (m > 0 && nb == 0) as usize,
            }
        };
        let mut left = null_keep_count;
        for i in 0..n {
            if left == 0 {
                break;
            }
            if keep.is_null(i) {
                words[i >> 5] |= 1 << (i & 31);
                left -= 1;
            }
        }
        core = select::words_to_bool(words, n);
        Ok((core, ran))
    }

    /// The keyed core over the non-NULL keys (`*_idx`: their rows, None = all):
    /// choose backend and strategy, run, verify hashed keys.
    fn select_keys(
        &self,
        cfg: &SetfusionConfig,
        keep: &KeyColumns,
        other: &KeyColumns,
        keep_idx: &Option<Vec<u32>>,
        other_idx: &Option<Vec<u32>>,
    ) -> Result<(BooleanBuffer, String)> {
        let (Some(keep_rows), Some(other_rows)) = (&keep.bytes, &other.bytes) else {
            // Exact keys: the key is the value, nothing to verify.
            let (kk, ok) = (core_keys(keep, keep_idx)?, core_keys(other, other_idx)?);
            return Ok(self.select_hashes(cfg, &kk.slices(), &ok.slices(), false));
        };
        let keep_rows = RowSubset::new(keep_rows, keep_idx.as_deref())?;
        let other_rows = RowSubset::new(other_rows, other_idx.as_deref())?;
        let mut gpu_note = None;
        if let Backend::Gpu(_) = &self.backend {
            // Hash and verify on the device; the host never hashes these rows.
            match self.run_gpu_rows(cfg, other_rows, keep_rows) {
                Ok(Some(sel)) => return Ok((sel, "gpu/hash (device row hashes)".into())),
                Ok(None) => {
                    let (b_ids, p_ids) = keys::exact_ids(other_rows, keep_rows);
                    let ran = "gpu/hash (device row hashes), hash collision resolved on cpu".to_string();
                    return Ok((select::select_cpu(self.op, &b_ids, &p_ids), ran));
                }
                // Too large for one device pass: hash on the host, where the GPU select partitions.
                Err(e) if gpu::is_out_of_memory(&e) => gpu_note = Some(" (rows over the device budget: host row hashes)"),
                Err(e) => {
                    // Device trouble never fails the query: the CPU twin gives the same answer.
                    let reason = format!("cpu (GPU failed: {})", crate::util::one_line(&e));
                    let (kk, ok) = (core_keys(keep, keep_idx)?, core_keys(other, other_idx)?);
                    let sel = select::select_cpu_chunks(self.op, &ok.slices(), &kk.slices());
                    return self.verify_host_hashed(sel, reason, (keep_rows, &kk), (other_rows, &ok));
                }
            }
        }
        // Host hashes (the CPU backend computed them while encoding).
        let (kk, ok) = (core_keys(keep, keep_idx)?, core_keys(other, other_idx)?);
        let (sel, mut ran) = self.select_hashes(cfg, &kk.slices(), &ok.slices(), true);
        ran.push_str(gpu_note.unwrap_or(""));
        self.verify_host_hashed(sel, ran, (keep_rows, &kk), (other_rows, &ok))
    }

    /// Hashed keys selected on host hashes: make sure equal hashes meant equal
    /// rows; on a collision recompute exactly.
    fn verify_host_hashed(
        &self,
        sel: BooleanBuffer,
        mut ran: String,
        keep: (RowSubset<'_>, &CoreKeys<'_>),
        other: (RowSubset<'_>, &CoreKeys<'_>),
    ) -> Result<(BooleanBuffer, String)> {
        let (kh, oh) = (keep.1.contiguous(), other.1.contiguous());
        match keys::verify_rows_or_exact(other.0, &oh, keep.0, &kh) {
            None => Ok((sel, ran)),
            Some((b_ids, p_ids)) => {
                ran.push_str(", hash collision resolved on cpu");
                Ok((select::select_cpu(self.op, &b_ids, &p_ids), ran))
            }
        }
    }

    /// Select on 64-bit keys with the configured backend (hash-encoded keys: `hashed`).
    fn select_hashes(&self, cfg: &SetfusionConfig, kk: &[&[u64]], ok: &[&[u64]], hashed: bool) -> (BooleanBuffer, String) {
        match &self.backend {
            Backend::Cpu(_) => (select::select_cpu_chunks(self.op, ok, kk), "cpu".to_string()),
            Backend::Gpu(_) => match self.run_gpu(cfg, kk, ok, hashed) {
                Ok(r) => r,
                Err(e) => {
                    // Device trouble never fails the query: the CPU twin gives the same answer.
                    (select::select_cpu_chunks(self.op, ok, kk), format!("cpu (GPU failed: {})", crate::util::one_line(&e)))
                }
            },
        }
    }

    /// Hashed keys on the GPU: device row hashes, device verification, device select.
    fn run_gpu_rows(&self, cfg: &SetfusionConfig, build: RowSubset<'_>, probe: RowSubset<'_>) -> Result<Option<BooleanBuffer>> {
        let device = gpu::gpu(cfg.device).map_err(|e| DataFusionError::Execution(e.to_string()))?;
        let g = device.lease(cfg.memory_limit.0);
        let mut stats = TransferStats::default();
        let r = row_hash::select_subsets_gpu(&g, self.op, build, probe, &mut stats);
        self.metrics.device.record(&stats);
        r
    }

    fn run_gpu(&self, cfg: &SetfusionConfig, kk: &[&[u64]], ok: &[&[u64]], hashed: bool) -> Result<(BooleanBuffer, String)> {
        let device = gpu::gpu(cfg.device).map_err(|e| DataFusionError::Execution(e.to_string()))?;
        let g = device.lease(cfg.memory_limit.0);
        // Hashed keys only support the hash table (their "domain" is meaningless).
        let forced = match cfg.strategy {
            Strategy::Sort => Some(GpuStrategy::Sort), // sorts any 64-bit keys, hashes included
            _ if hashed => Some(GpuStrategy::Hash),
            Strategy::Hash => Some(GpuStrategy::Hash),
            Strategy::Bitmap => Some(GpuStrategy::Bitmap),
            Strategy::Auto | Strategy::Cpu => None,
        };
        let mut stats = TransferStats::default();
        // Exact keys only (they come back into pinned memory the output owns);
        // the output filter checks that they cover every kept row.
        let want_keys = self.key_from_device.is_some() && !hashed && cfg.pinned_output;
        let (sel, ran, keys) = select::select_gpu_auto(&g, forced, self.op, ok, kk, want_keys, &mut stats)?;
        *self.device_keys.lock().unwrap_or_else(|e| e.into_inner()) = keys;
        self.metrics.device.record(&stats);
        Ok((sel, ran))
    }
}

/// One side's non-NULL keys as slices: the chunks themselves when no row is dropped.
enum CoreKeys<'a> {
    Borrowed(Vec<&'a [u64]>),
    Owned(Vec<u64>),
}

impl CoreKeys<'_> {
    fn slices(&self) -> Vec<&[u64]> {
        match self {
            CoreKeys::Borrowed(v) => v.clone(),
            CoreKeys::Owned(v) => vec![v.as_slice()],
        }
    }
    /// The keys in one slice (borrowed when they already are).
    fn contiguous(&self) -> std::borrow::Cow<'_, [u64]> {
        match self {
            CoreKeys::Borrowed(v) if v.len() == 1 => std::borrow::Cow::Borrowed(v[0]),
            CoreKeys::Borrowed(v) => std::borrow::Cow::Owned(v.concat()),
            CoreKeys::Owned(v) => std::borrow::Cow::Borrowed(v.as_slice()),
        }
    }
}

/// One side's keys at `idx` (None: all rows): exact values, or row hashes
/// (computed here on the host when encoding deferred them to the device).
fn core_keys<'a>(k: &'a KeyColumns, idx: &Option<Vec<u32>>) -> Result<CoreKeys<'a>> {
    if let (Some(rows), true) = (&k.bytes, k.hashes_deferred()) {
        return Ok(CoreKeys::Owned(keys::hash_rows(RowSubset::new(rows, idx.as_deref())?)));
    }
    Ok(match idx {
        None => CoreKeys::Borrowed(k.slices()),
        Some(_) => CoreKeys::Owned(k.iter().enumerate().filter(|(i, _)| !k.is_null(*i)).map(|(_, v)| v).collect()),
    })
}

/// Cast key columns to the types they are encoded as ([`keys::key_type`]:
/// dictionaries to their values or views; the other side to the kept side's
/// types, which the planner already coerced, guarding view variants).
fn coerce_like(cols: Vec<ArrayRef>, types: &[DataType]) -> Result<Vec<ArrayRef>> {
    cols.into_iter()
        .zip(types)
        .map(|(c, t)| if c.data_type() == t { Ok(c) } else { Ok(datafusion::arrow::compute::cast(&c, t)?) })
        .collect()
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Array, Int32Array, StringArray};
    use datafusion::arrow::datatypes::{Field, Schema};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::physical_expr::expressions::col;
    use datafusion::prelude::SessionContext;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn batch(schema: &SchemaRef, rng: &mut rand::rngs::StdRng, n: usize) -> RecordBatch {
        let words = ["", "a", "setfusion", "a string key longer than sixteen bytes", "ß∂ƒ"];
        let s: StringArray = (0..n).map(|_| (rng.random_range(0..8) > 0).then(|| words[rng.random_range(0..words.len())])).collect();
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
                        RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(k)), Arc::new(s), Arc::new(v)]).unwrap()
                    })
                    .collect()
            })
            .collect();
        let g = crate::gpu::test_gpu();
        for density in [0.0, 0.3, 1.0] {
            let selection = BooleanBuffer::from_iter((0..all_keys.len()).map(|_| rng.random_bool(density)));
            let keys = datafusion::arrow::buffer::Buffer::from_vec(select::compact_kept_keys_cpu(&all_keys, &selection));
            let projections: [Option<Vec<usize>>; 6] = [None, Some(vec![0, 2]), Some(vec![2, 0]), Some(vec![0]), Some(vec![1, 0, 0]), Some(vec![1])];
            for p in projections {
                let (host, _) = filter_partitions(&parts, &selection, Some(p.as_deref()), None, 8192, None).unwrap();
                // With a device, its pinned pool holds the host's fixed-width output.
                let (device, used) = filter_partitions(&parts, &selection, Some(p.as_deref()), Some((0, gpu::PendingBuffer::ready(keys.clone()))), 8192, g.as_deref()).unwrap();
                assert_eq!(used, p.as_ref().is_none_or(|p| p.contains(&0)), "projection {p:?}");
                // Kept keys that do not cover every kept row are not used.
                let short = datafusion::arrow::buffer::Buffer::from_vec(vec![0u64; selection.count_set_bits() + 1]);
                let (_, used) = filter_partitions(&parts, &selection, Some(p.as_deref()), Some((0, gpu::PendingBuffer::ready(short))), 8192, None).unwrap();
                assert!(!used, "projection {p:?}");
                let mut at = 0;
                for ((h, d), part) in host.iter().zip(&device).zip(&parts) {
                    let (Output::Batches(h), Output::Batches(d)) = (h, d) else { panic!("batches expected") };
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

    fn sorted_rows(batches: &[RecordBatch]) -> Vec<(Option<String>, i32)> {
        let mut v: Vec<_> = batches
            .iter()
            .flat_map(|b| {
                let s = b.column(0).as_any().downcast_ref::<StringArray>().unwrap().clone();
                let i = b.column(1).as_any().downcast_ref::<Int32Array>().unwrap().clone();
                (0..b.num_rows()).map(move |r| (s.is_valid(r).then(|| s.value(r).to_string()), i.value(r))).collect::<Vec<_>>()
            })
            .collect();
        v.sort();
        v
    }

    /// Row-encoded keys (strings, composite) give the same rows on the GPU
    /// backend (device row hashes; without a device, its CPU fallback with
    /// deferred host hashes) as on the CPU backend.
    #[tokio::test]
    async fn hashed_keys_gpu_backend_matches_cpu_backend() {
        let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8, true), Field::new("i", DataType::Int32, false)]));
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        let keep_parts = vec![vec![batch(&schema, &mut rng, 300), batch(&schema, &mut rng, 200)], vec![batch(&schema, &mut rng, 250)]];
        let other_parts = vec![vec![batch(&schema, &mut rng, 400)]];
        let ctx = SessionContext::new();
        let ops = [SetOp::Semi, SetOp::Anti, SetOp::IntersectDistinct, SetOp::IntersectAll, SetOp::ExceptDistinct, SetOp::ExceptAll];
        let key_sets: [&[&str]; 2] = [&["s"], &["s", "i"]];
        for keys in key_sets {
            let exprs: Vec<PhysicalExprRef> = keys.iter().map(|k| col(k, &schema).unwrap()).collect();
            for op in ops {
                for nulls in [NullMode::NeverEqual, NullMode::Equal, NullMode::NullAware] {
                    if nulls == NullMode::NullAware && op != SetOp::Anti {
                        continue;
                    }
                    let run = |backend: Backend| {
                        let keep = MemorySourceConfig::try_new_exec(&keep_parts, schema.clone(), None).unwrap();
                        let other = MemorySourceConfig::try_new_exec(&other_parts, schema.clone(), None).unwrap();
                        Arc::new(
                            SetSelectExec::try_new(op, keep, other, exprs.clone(), exprs.clone(), nulls, backend, None).unwrap(),
                        )
                    };
                    let (gpu_exec, cpu_exec) = (run(Backend::Gpu(Strategy::Hash)), run(Backend::Cpu("test".into())));
                    let got = datafusion::physical_plan::collect(gpu_exec.clone(), ctx.task_ctx()).await.unwrap();
                    let want = datafusion::physical_plan::collect(cpu_exec, ctx.task_ctx()).await.unwrap();
                    let ran = gpu_exec.ran.lock().unwrap().clone().unwrap_or_default();
                    assert!(ran.starts_with("gpu/hash (device row hashes)") || ran.starts_with("cpu (GPU failed") || ran.starts_with("no-op"), "{ran}");
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
                    assert_eq!(project(sorted_rows(&got)), project(sorted_rows(&want)), "{keys:?} {op:?} {nulls:?} ran={ran}");
                }
            }
        }
    }
}
