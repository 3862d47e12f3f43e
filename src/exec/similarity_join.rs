//! `SimilarityJoinExec`: an inner join whose predicate contains
//! `metric(l.set, r.set) >= t` (or `> t`), computed as a set-similarity join
//! ([`crate::algo::ssjoin`], GPU or CPU backend) instead of a nested loop.
//!
//! Both inputs are collected; the two set expressions are evaluated and
//! encoded with one key space (strings dictionary-encoded, see
//! [`crate::algo::ssjoin::encode`]); the join yields (left row, right row) pairs, the
//! remaining conjuncts of the join filter are evaluated on those pairs and the
//! join's output columns are gathered with `take`. When both sides produce the
//! very same sets (a self join such as `FROM r a JOIN r b ON a.id < b.id AND
//! jaccard(a.s, b.s) >= t`), the algorithm runs as a self join (each unordered
//! pair once) and the pairs are mirrored, with the diagonal added.
//!
//! One output partition, streamed: each output batch is gathered from the
//! pairs when the stream is read.
//!
//! Memory: one `MemoryConsumer` per execution reserves the collected inputs
//! (then their concatenation) and the pairs' row indices until the stream is
//! consumed or dropped, and each output batch while it is built. The encoded
//! sets and the backends' own working memory are not reserved. Nothing
//! spills: over the pool's limit the query fails with `ResourcesExhausted`.

use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions, UInt32Array};
use datafusion::arrow::compute::{filter, take};
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::JoinSide;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr, PhysicalExprRef};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::joins::utils::JoinFilter;
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, MetricsSet, Time,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties, SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};

use crate::algo::ssjoin::{self, JoinStats, Pair, RawSets, Threshold};
use crate::algo::ssjoin_prep;
use crate::config::{SetfusionConfig, Strategy};
use crate::exec::common::{device_finishes_first, device_worth_starting, start_for_next_queries, Backend, Decision};
use crate::exec::memory::{batch_bytes, collect_reserved, hold_device, reservation};
use crate::exec::sets_cache;
use crate::exec::DeviceMetrics;
use crate::gpu;

/// The operator. See the module documentation.
#[derive(Debug)]
pub struct SimilarityJoinExec {
    /// What every execution reads, shared with it (see `exec::common`).
    spec: Arc<SimilaritySpec>,
    cache: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    ran: Arc<Mutex<Option<String>>>,
}

impl SimilarityJoinExec {
    #[allow(clippy::too_many_arguments)]
    pub fn try_new(
        left: Arc<dyn ExecutionPlan>,
        right: Arc<dyn ExecutionPlan>,
        left_set: PhysicalExprRef,
        right_set: PhysicalExprRef,
        threshold: Threshold,
        residual: Option<JoinFilter>,
        projection: Option<Vec<usize>>,
        decision: Decision,
    ) -> Result<Self> {
        threshold.check().map_err(DataFusionError::Plan)?;
        let (ls, rs) = (left.schema(), right.schema());
        let fields: Vec<_> = ls.fields().iter().chain(rs.fields().iter()).cloned().collect();
        let joined = Schema::new(fields);
        let schema = Arc::new(match &projection {
            Some(p) => joined.project(p)?,
            None => joined,
        });
        let cache = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Ok(Self {
            spec: Arc::new(SimilaritySpec {
                left,
                right,
                left_set,
                right_set,
                threshold,
                residual,
                projection,
                decision,
                schema,
            }),
            cache,
            metrics: ExecutionPlanMetricsSet::new(),
            ran: Arc::new(Mutex::new(None)),
        })
    }

    pub fn threshold(&self) -> Threshold {
        self.spec.threshold
    }
    pub fn decision(&self) -> &Decision {
        &self.spec.decision
    }
    pub fn set_exprs(&self) -> (&PhysicalExprRef, &PhysicalExprRef) {
        (&self.spec.left_set, &self.spec.right_set)
    }
    pub fn residual(&self) -> Option<&JoinFilter> {
        self.spec.residual.as_ref()
    }
    pub fn projection(&self) -> Option<&[usize]> {
        self.spec.projection.as_deref()
    }
}

impl DisplayAs for SimilarityJoinExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let op = if self.spec.threshold.strict { ">" } else { ">=" };
        write!(
            f,
            "SimilarityJoinExec: metric={}, on=({}, {}), threshold {op} {}",
            self.spec.threshold.metric.name(),
            self.spec.left_set,
            self.spec.right_set,
            self.spec.threshold.value
        )?;
        if let Some(r) = &self.spec.residual {
            write!(f, ", filter={}", r.expression())?;
        }
        write!(f, ", {}", self.spec.decision)?;
        super::fmt_projection_and_ran(f, t, &self.spec.projection, &self.ran)
    }
}

impl ExecutionPlan for SimilarityJoinExec {
    fn name(&self) -> &str {
        "SimilarityJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.spec.left, &self.spec.right]
    }

    /// Both inputs are read whole. Said so that a Ballista task, which
    /// otherwise sees only its own partition slice of each input, reads
    /// every partition. (In one process the rule that puts this node in
    /// runs after distribution enforcement, which adds nothing.)
    fn required_input_distribution(&self) -> Vec<datafusion::physical_plan::Distribution> {
        vec![datafusion::physical_plan::Distribution::SinglePartition; 2]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        super::visit_exprs(
            [&self.spec.left_set, &self.spec.right_set]
                .into_iter()
                .chain(self.spec.residual.as_ref().map(|r| r.expression())),
            f,
        )
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let (left, right) = super::two_children(children, "SimilarityJoinExec")?;
        Ok(Arc::new(SimilarityJoinExec::try_new(
            left,
            right,
            self.spec.left_set.clone(),
            self.spec.right_set.clone(),
            self.spec.threshold,
            self.spec.residual.clone(),
            self.spec.projection.clone(),
            self.spec.decision.clone(),
        )?))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!("SimilarityJoinExec has one partition, got {partition}")));
        }
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let run = Run {
            spec: self.spec.clone(),
            // One partition: each execution is partition 0's own.
            metrics: Metrics::new(&self.metrics, partition),
            elapsed_compute: baseline.elapsed_compute().clone(),
            ran: self.ran.clone(),
        };
        let fut = run.run(context);
        let stream = futures::stream::once(fut).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.spec.schema.clone(), super::observed(stream.boxed(), baseline))))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

#[derive(Clone)]
struct Metrics {
    candidates: Count,
    verified: Count,
    join_time: Time,
    device: DeviceMetrics,
    /// The peak of the execution's memory reservation.
    peak_memory: Gauge,
}

impl Metrics {
    fn new(m: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        Self {
            candidates: MetricBuilder::new(m).counter("candidates", partition),
            verified: MetricBuilder::new(m).counter("verified_pairs", partition),
            join_time: MetricBuilder::new(m).subset_time("join_time", partition),
            device: DeviceMetrics::new(m, Some(partition)),
            peak_memory: super::execution_peak_memory(m, Some(partition)),
        }
    }
}

/// The node's inputs and choices, shared by the node and its executions.
#[derive(Debug)]
struct SimilaritySpec {
    left: Arc<dyn ExecutionPlan>,
    right: Arc<dyn ExecutionPlan>,
    /// The set expression over the left input's schema.
    left_set: PhysicalExprRef,
    /// The set expression over the right input's schema.
    right_set: PhysicalExprRef,
    threshold: Threshold,
    /// Other conjuncts of the join filter, applied to the pairs.
    residual: Option<JoinFilter>,
    /// Projection of the joined (left ++ right) columns.
    projection: Option<Vec<usize>>,
    /// The planner's choice (`planner::decision::decide_similarity`), shown in EXPLAIN.
    decision: Decision,
    schema: SchemaRef,
}

/// One execution: the node's spec and the execution's own state.
struct Run {
    spec: Arc<SimilaritySpec>,
    metrics: Metrics,
    /// The join and the forming of its output batches (not the inputs' collection).
    elapsed_compute: Time,
    ran: Arc<Mutex<Option<String>>>,
}

/// The sets a join takes: raw, preprocessed by the backend that joins them,
/// or a self join's collection preprocessed already (kept between queries by
/// [`super::sets_cache`]).
#[derive(Clone, Copy)]
pub enum JoinSets<'a> {
    Raw(&'a RawSets, Option<&'a RawSets>),
    Prepared(&'a ssjoin::SetCollection),
}

impl<'a> JoinSets<'a> {
    /// The collections, preprocessed on the host where they are raw.
    fn on_host(self) -> (Cow<'a, ssjoin::SetCollection>, Option<ssjoin::SetCollection>) {
        match self {
            JoinSets::Raw(r, s) => {
                let (rc, sc) = ssjoin_prep::preprocess(r, s);
                (Cow::Owned(rc), sc)
            }
            JoinSets::Prepared(c) => (Cow::Borrowed(c), None),
        }
    }

    /// The set elements of both sides.
    fn elements(self) -> usize {
        match self {
            JoinSets::Raw(r, s) => r.elems.len() + s.map_or(0, |s| s.elems.len()),
            JoinSets::Prepared(c) => c.tokens.len(),
        }
    }

    /// What the host does before it joins, for EXPLAIN ANALYZE.
    fn host_work(self) -> &'static str {
        match self {
            JoinSets::Raw(..) => "preprocessed and joined",
            JoinSets::Prepared(_) => "joined",
        }
    }
}

/// Preprocess the sets (unless they come preprocessed) and run the join on
/// the chosen backend: the GPU
/// backend preprocesses on the device where that path takes the inputs
/// ([`ssjoin_prep::preprocess_for_gpu`]); device trouble falls back to the
/// CPU. A GPU chosen by the cost model (`strategy = auto`) on a device that
/// is not ready is not waited for ([`join_while_device_starts`]) unless the
/// sets are too many to preprocess on the host meanwhile
/// ([`HOST_PREP_MAX_ELEMENTS`]); an explicit GPU strategy waits. A device
/// nobody started (the planner starts it only for large inputs) is started
/// by the host's join once the join is seen to outlast the start
/// ([`device_worth_starting`]), and otherwise for the process's next queries
/// once this one has joined. Returns the
/// first collection (a self join's caller needs its sizes), the pairs and
/// where they were computed.
pub fn join_sets<'a>(
    backend: Backend,
    cfg: &SetfusionConfig,
    memory: Option<&MemoryReservation>,
    sets: JoinSets<'a>,
    thr: Threshold,
    stats: &mut JoinStats,
) -> (Cow<'a, ssjoin::SetCollection>, Vec<Pair>, String) {
    let on_cpu = |stats: &mut JoinStats, why: String| {
        let (rc, sc) = sets.on_host();
        let pairs = cpu_join(&rc, sc.as_ref(), thr, stats);
        (rc, pairs, why)
    };
    match backend {
        Backend::Cpu => on_cpu(stats, "cpu".into()),
        Backend::Gpu
            if cfg.strategy == Strategy::Auto
                && !matches!(gpu::readiness_if_started(cfg.device), Some(gpu::Readiness::Ready))
                && sets.elements() < HOST_PREP_MAX_ELEMENTS =>
        {
            let start_ms = gpu::calibration::Calibration::current().start_ms;
            // A start the host's join asks for stops that join, and the device
            // path waits for the start: the device redoes the whole join
            // anyway, and the host's 16 threads would only compete with the
            // start for the little that is left by the time it is ready.
            let handover = |joined_ms: f64, done: f64| match gpu::readiness_if_started(cfg.device) {
                Some(gpu::Readiness::Ready) => device_finishes_first(joined_ms, done),
                Some(_) => None,
                None => match device_worth_starting(joined_ms, done, start_ms) {
                    Some(true) => {
                        gpu::start_for_query(cfg.device, &crate::algo::SIMILARITY_KERNELS);
                        Some(true)
                    }
                    _ => None,
                },
            };
            let joined = join_while_device_starts(cfg, memory, sets, thr, stats, &handover);
            if gpu::readiness_if_started(cfg.device).is_none() {
                // The host's join was too short to start the device for; the
                // process's next queries may use it.
                start_for_next_queries(cfg.device);
            }
            joined
        }
        Backend::Gpu => {
            let g = match gpu::gpu(cfg.device) {
                Ok(g) => g,
                Err(e) => return on_cpu(stats, format!("cpu (GPU failed: {e})")),
            };
            let lease = match hold_device(&g, cfg, memory) {
                Ok(l) => l,
                Err(e) => return on_cpu(stats, format!("cpu (GPU failed: {})", crate::util::one_line(&e))),
            };
            crate::util::trace("similarity join: device held");
            let mut st = JoinStats::default();
            let ((rc, sc), prep) = match sets {
                JoinSets::Raw(r, s) => {
                    let ((rc, sc), prep) = ssjoin_prep::preprocess_for_gpu(&lease, r, s, &mut st.transfer);
                    ((Cow::Owned(rc), sc), prep)
                }
                JoinSets::Prepared(c) => ((Cow::Borrowed(c), None), "preprocessed by an earlier query".to_string()),
            };
            crate::util::trace(&format!("similarity join: {prep}"));
            let out = ssjoin::ssjoin_gpu(&lease, &rc, sc.as_ref(), thr, &mut st);
            drop(lease);
            if crate::util::tracing() {
                let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
                let t = &st.transfer;
                crate::util::trace(&format!(
                    "similarity join: on the device (these counted since it was held: host plan {:.1} ms, \
                     uploads {:.1} ms of {} bytes, kernels {:.1} ms, downloads {:.1} ms of {} bytes)",
                    ms(st.plan),
                    ms(t.to_device),
                    t.bytes_to_device,
                    ms(t.kernel),
                    ms(t.to_host),
                    t.bytes_to_host
                ));
            }
            match out {
                Ok(pairs) => {
                    stats.add(&st);
                    let ran = format!("gpu in {} probe block(s), {prep}", st.blocks);
                    (rc, pairs, ran)
                }
                Err(e) => {
                    let pairs = cpu_join(&rc, sc.as_ref(), thr, stats);
                    (rc, pairs, format!("cpu (GPU failed: {e})"))
                }
            }
        }
    }
}

/// The CPU backend's join of preprocessed collections, on all threads.
fn cpu_join(
    rc: &ssjoin::SetCollection,
    sc: Option<&ssjoin::SetCollection>,
    thr: Threshold,
    stats: &mut JoinStats,
) -> Vec<Pair> {
    ssjoin::ssjoin_cpu_with(rc, sc, thr, ssjoin::default_threads(), stats)
}

/// Sets of this many elements or more wait for a starting device rather
/// than being preprocessed on the host: that alone would outlast the start
/// (1M sets of 30 elements took 1.76 s on the H100 host's 16 threads, the
/// device's preprocessing ~0.1 s; BENCHMARKS section 2), while the
/// DBLP-sized collections (1.2M-5.9M elements) are preprocessed within it.
const HOST_PREP_MAX_ELEMENTS: usize = 16 << 20;

/// The join the cost model gave the device, while the device is still
/// starting or not started (a fresh process: ~200-600 ms of driver and
/// context start). The host preprocesses the sets and joins them meanwhile,
/// and hands the join to the device only once `handover(joined_ms, done)`
/// says so, asked between the host's chunks with the time the host has
/// joined and the share of its probe elements handed out: Some(true) hands
/// over, Some(false) keeps the host to the end, None asks again. A query's
/// rule ([`join_sets`]): a starting device, once ready, takes over where
/// it would finish first ([`device_finishes_first`]); a device nobody started
/// is started, and waited for, only where the join would outlast the start
/// ([`device_worth_starting`]). So a fresh process's similarity join is never
/// much slower than the CPU backend's, however high its threshold (issue 31:
/// at Jaccard 0.9 a fresh process lost 0.69x waiting for the device), and a
/// long join still ends on the device.
fn join_while_device_starts<'a>(
    cfg: &SetfusionConfig,
    memory: Option<&MemoryReservation>,
    sets: JoinSets<'a>,
    thr: Threshold,
    stats: &mut JoinStats,
    handover: &(dyn Fn(f64, f64) -> Option<bool> + Sync),
) -> (Cow<'a, ssjoin::SetCollection>, Vec<Pair>, String) {
    let began = Instant::now();
    let (rc, sc) = sets.on_host();
    let did = sets.host_work();
    // The join's start (the first question), and the decision, made once.
    let joining: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let switch: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let give_up = |done: f64| match switch.get() {
        Some(&s) => s,
        None => {
            let joined_ms = joining.get_or_init(Instant::now).elapsed().as_secs_f64() * 1e3;
            handover(joined_ms, done).is_some_and(|d| *switch.get_or_init(|| d))
        }
    };
    let started_before = gpu::readiness_if_started(cfg.device).is_some();
    let mut host = JoinStats::default();
    if let Some(pairs) = ssjoin::ssjoin_cpu_until(&rc, sc.as_ref(), thr, ssjoin::default_threads(), &mut host, &give_up)
    {
        stats.add(&host);
        let host_ms = began.elapsed().as_secs_f64() * 1e3;
        let ran = if started_before {
            format!("cpu while the device started ({did} on the host in {host_ms:.0} ms)")
        } else {
            format!("cpu, the device not started: the host's join ended first ({did} in {host_ms:.0} ms)")
        };
        return (rc, pairs, ran);
    }
    let stopped_ms = began.elapsed().as_secs_f64() * 1e3;
    let waited = Instant::now();
    let g = gpu::gpu(cfg.device);
    let handed = if started_before {
        format!("the host's join stopped {stopped_ms:.0} ms in, once the device was ready")
    } else {
        format!(
            "the host's join stopped {stopped_ms:.0} ms in to start the device, which it would outlast; ready {:.0} ms later",
            waited.elapsed().as_secs_f64() * 1e3
        )
    };
    let device = g.map_err(|e| e.to_string()).and_then(|g| {
        let lease = hold_device(&g, cfg, memory).map_err(|e| crate::util::one_line(&e))?;
        let mut st = JoinStats::default();
        let pairs = ssjoin::ssjoin_gpu(&lease, &rc, sc.as_ref(), thr, &mut st).map_err(|e| e.to_string())?;
        Ok((pairs, st))
    });
    match device {
        Ok((pairs, st)) => {
            stats.add(&st);
            let prep = match sets {
                JoinSets::Raw(..) => "preprocessed on the host",
                JoinSets::Prepared(_) => "preprocessed by an earlier query",
            };
            (rc, pairs, format!("gpu in {} probe block(s), {prep}; {handed}", st.blocks))
        }
        Err(e) => {
            let pairs = cpu_join(&rc, sc.as_ref(), thr, stats);
            (rc, pairs, format!("cpu (GPU failed: {e}; {handed})"))
        }
    }
}

/// Does the residual filter reject every pair of a row with itself? True when
/// one of its conjuncts compares a left and a right column by `<`, `>` or
/// `<>` and the two are one array, so a row's two values are equal (a self
/// join read once, `ON a.id < b.id AND ...`). Its diagonal then need not be
/// emitted: 100k pairs for a 100k-set self join, most of the output work.
fn rejects_diagonal(f: &JoinFilter, left: &RecordBatch, right: &RecordBatch) -> bool {
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::{BinaryExpr, Column};
    use datafusion::physical_plan::joins::utils::ColumnIndex;
    let column = |ci: &ColumnIndex| match ci.side {
        JoinSide::Left => left.columns().get(ci.index),
        _ => right.columns().get(ci.index),
    };
    let side = |e: &Arc<dyn PhysicalExpr>| e.downcast_ref::<Column>().and_then(|c| f.column_indices().get(c.index()));
    datafusion::physical_expr::utils::split_conjunction(f.expression()).iter().any(|e| {
        let Some(b) = e.downcast_ref::<BinaryExpr>() else { return false };
        if !matches!(b.op(), Operator::Lt | Operator::Gt | Operator::NotEq) {
            return false;
        }
        match (side(b.left()), side(b.right())) {
            (Some(l), Some(r)) if l.side != r.side => {
                matches!((column(l), column(r)), (Some(x), Some(y)) if Arc::ptr_eq(x, y))
            }
            _ => false,
        }
    })
}

/// `parts` as one batch of `schema`'s columns, the columns `read` says
/// concatenated (their bytes reserved in `memory`), the others all NULL (their
/// fields made nullable): the operator reads only the former by row. `parts`
/// lack column `absent` where it is given (a scan without the kept sets).
fn concat_read(
    schema: &SchemaRef,
    parts: &[RecordBatch],
    read: &[bool],
    absent: Option<usize>,
    memory: &MemoryReservation,
) -> Result<RecordBatch> {
    use datafusion::arrow::array::new_null_array;
    use datafusion::arrow::datatypes::Field;
    let rows: usize = parts.iter().map(|b| b.num_rows()).sum();
    let mut fields = Vec::with_capacity(read.len());
    let mut columns = Vec::with_capacity(read.len());
    for (i, f) in schema.fields().iter().enumerate() {
        if read[i] && absent != Some(i) {
            // The parts' column: one index lower past the column they lack.
            let at = if absent.is_some_and(|a| i > a) { i - 1 } else { i };
            let pieces: Vec<&dyn Array> = parts.iter().map(|b| b.column(at).as_ref()).collect();
            // One piece is not copied (`concat` slices it).
            let c = match pieces.len() {
                0 => datafusion::arrow::array::new_empty_array(f.data_type()),
                _ => datafusion::arrow::compute::concat(&pieces)?,
            };
            memory.try_grow(c.get_array_memory_size())?;
            fields.push(f.clone());
            columns.push(c);
        } else {
            fields.push(Arc::new(Field::new(f.name(), f.data_type().clone(), true)));
            columns.push(new_null_array(f.data_type(), rows));
        }
    }
    Ok(RecordBatch::try_new_with_options(
        Arc::new(Schema::new(fields)),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(rows)),
    )?)
}

/// The sets an execution joins, as its inputs gave them.
enum SetsIn {
    /// An input without rows: nothing to join.
    None,
    /// The set columns' arrays, one side's chunks each; `shared`: the same
    /// arrays on both sides; `keep`: where to keep the preprocessed sets.
    Arrays { la: Vec<ArrayRef>, ra: Vec<ArrayRef>, shared: bool, keep: Option<sets_cache::SetsKey> },
    /// A self join's sets, preprocessed by an earlier query.
    Kept(Arc<sets_cache::CachedSets>),
}

/// Are the two set expressions one plain column of the same index?
fn same_column(a: &PhysicalExprRef, b: &PhysicalExprRef) -> bool {
    use datafusion::physical_expr::expressions::Column;
    matches!((a.downcast_ref::<Column>(), b.downcast_ref::<Column>()), (Some(x), Some(y)) if x.index() == y.index())
}

/// The plan below any repartitioning or coalescing (they only reorder rows).
fn strip_partitioning(p: &Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    let mut p = p.clone();
    use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
    use datafusion::physical_plan::repartition::RepartitionExec;
    while (p.downcast_ref::<RepartitionExec>().is_some() || p.downcast_ref::<CoalescePartitionsExec>().is_some())
        && p.children().len() == 1
    {
        p = p.children()[0].clone();
    }
    p
}

/// Do both inputs produce the same rows (in some order)? True when, below
/// repartitioning, they are the same plan of scans, projections and filters
/// (DataFusion plans `FROM r a JOIN r b` with a round-robin repartition on
/// one side only): node by node, the same scan, equal expressions, none of
/// them volatile (`random()` twice gives two tables). Other nodes say no.
fn same_rows(left: &Arc<dyn ExecutionPlan>, right: &Arc<dyn ExecutionPlan>) -> bool {
    left.schema() == right.schema() && same_deterministic_plan(&strip_partitioning(left), &strip_partitioning(right))
}

/// `a` and `b` are the same tree of scans, projections and filters, with
/// equal, non-volatile expressions.
fn same_deterministic_plan(a: &Arc<dyn ExecutionPlan>, b: &Arc<dyn ExecutionPlan>) -> bool {
    use datafusion::datasource::source::DataSourceExec;
    use datafusion::physical_expr_common::physical_expr::is_volatile;
    use datafusion::physical_plan::filter::FilterExec;
    use datafusion::physical_plan::projection::ProjectionExec;
    let node = if let (Some(x), Some(y)) = (a.downcast_ref::<ProjectionExec>(), b.downcast_ref::<ProjectionExec>()) {
        x.expr() == y.expr() && !x.expr().iter().any(|e| is_volatile(&e.expr))
    } else if let (Some(x), Some(y)) = (a.downcast_ref::<FilterExec>(), b.downcast_ref::<FilterExec>()) {
        x.predicate() == y.predicate() && x.projection() == y.projection() && !is_volatile(x.predicate())
    } else if let (Some(x), Some(y)) = (a.downcast_ref::<DataSourceExec>(), b.downcast_ref::<DataSourceExec>()) {
        same_source(x, y)
    } else {
        false
    };
    let (ca, cb) = (a.children(), b.children());
    node && ca.len() == cb.len() && ca.iter().zip(&cb).all(|(x, y)| same_deterministic_plan(x, y))
}

/// Do two scans read the same rows? In-memory tables: the same batches (the
/// same table, registered once or twice; two tables of one shape describe
/// themselves alike). Files: the same files, projection and pushed filters,
/// as DataFusion describes the scan (its sources do not compare otherwise).
fn same_source(
    a: &datafusion::datasource::source::DataSourceExec,
    b: &datafusion::datasource::source::DataSourceExec,
) -> bool {
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::datasource::physical_plan::FileScanConfig;
    let (sa, sb) = (a.data_source(), b.data_source());
    if let (Some(x), Some(y)) = (sa.downcast_ref::<MemorySourceConfig>(), sb.downcast_ref::<MemorySourceConfig>()) {
        let same_batch = |p: &RecordBatch, q: &RecordBatch| {
            p.num_rows() == q.num_rows()
                && p.num_columns() == q.num_columns()
                && p.columns().iter().zip(q.columns()).all(|(c, d)| Arc::ptr_eq(c, d))
        };
        return x.projection() == y.projection()
            && x.partitions().len() == y.partitions().len()
            && x.partitions()
                .iter()
                .zip(y.partitions())
                .all(|(p, q)| p.len() == q.len() && p.iter().zip(q).all(|(p, q)| same_batch(p, q)));
    }
    if sa.downcast_ref::<FileScanConfig>().is_some() && sb.downcast_ref::<FileScanConfig>().is_some() {
        let one_line = |p: &datafusion::datasource::source::DataSourceExec| {
            datafusion::physical_plan::displayable(p).one_line().to_string()
        };
        return one_line(a) == one_line(b);
    }
    false
}

impl Run {
    async fn run(self, context: Arc<TaskContext>) -> Result<futures::stream::BoxStream<'static, Result<RecordBatch>>> {
        let cfg = SetfusionConfig::from_options(context.session_config().options());
        let batch_size = context.session_config().batch_size().max(1);
        let (ls, rs) = (self.spec.left.schema(), self.spec.right.schema());
        let memory = reservation(&context, "SimilarityJoinExec");
        // The columns the output and the residual filter read, by side: only these are
        // concatenated (the set columns are encoded from the batches as they came, a copy
        // of every element less).
        let nl = ls.fields().len();
        let (mut read_left, mut read_right) = (vec![false; nl], vec![false; rs.fields().len()]);
        let output: Vec<usize> = match &self.spec.projection {
            Some(p) => p.clone(),
            None => (0..nl + rs.fields().len()).collect(),
        };
        for &c in &output {
            if c < nl {
                read_left[c] = true;
            } else {
                read_right[c - nl] = true;
            }
        }
        for c in self.spec.residual.iter().flat_map(|f| f.column_indices()) {
            match c.side {
                JoinSide::Left => read_left[c.index] = true,
                _ => read_right[c.index] = true,
            }
        }
        let read_once = same_rows(&self.spec.left, &self.spec.right);
        // A self join's sets kept by an earlier query over the same files: only
        // the other columns the output and the filter need are read.
        let read: Vec<bool> = read_left.iter().zip(&read_right).map(|(a, b)| *a || *b).collect();
        // The one input a self join reads once.
        let input = strip_partitioning(&self.spec.left);
        let sets_key =
            (read_once && cfg.sets_cache_limit.0 > 0 && same_column(&self.spec.left_set, &self.spec.right_set))
                .then(|| sets_cache::SetsKey::of(&input, &self.spec.left_set))
                .flatten()
                .filter(|k| !read[k.column()]);
        let mut kept = None;
        if let Some(key) = &sets_key {
            let scan = sets_cache::get(key).and_then(|s| Some((s, key.scan_without_sets(&input)?)));
            if let Some((sets, scan)) = scan {
                let parts: Vec<RecordBatch> = collect_reserved(scan, sets_cache::in_fixed_order(&context), &memory)
                    .await?
                    .into_iter()
                    .flatten()
                    .collect();
                if parts.iter().map(|b| b.num_rows()).sum::<usize>() == sets.rows {
                    let left = concat_read(&ls, &parts, &read, Some(key.column()), &memory)?;
                    crate::util::trace("similarity join: the other columns read; the sets kept from an earlier query");
                    kept = Some((sets, left));
                } else {
                    sets_cache::forget(key);
                }
            }
        }
        let (left, right, sets_in, parts_bytes) = if let Some((sets, left)) = kept {
            let sets_in = if left.num_rows() == 0 { SetsIn::None } else { SetsIn::Kept(sets) };
            (left.clone(), left, sets_in, 0)
        } else {
            let (lparts, rparts, left, right) = if read_once {
                // A self join whose sides differ only in partitioning: read once, so the
                // sets line up row for row and the join runs as a self join.
                // Rows in a fixed order where the sets may be kept (they name rows by position).
                let scan_context =
                    if sets_key.is_some() { sets_cache::in_fixed_order(&context) } else { context.clone() };
                let lp = collect_reserved(input, scan_context, &memory).await?;
                crate::util::trace("similarity join: partitions read");
                let lp: Vec<RecordBatch> = lp.into_iter().flatten().collect();
                let left = concat_read(&ls, &lp, &read, None, &memory)?;
                (lp.clone(), lp, left.clone(), left)
            } else {
                let (lp, rp) = futures::try_join!(
                    collect_reserved(self.spec.left.clone(), context.clone(), &memory),
                    collect_reserved(self.spec.right.clone(), context.clone(), &memory)
                )?;
                let (lp, rp): (Vec<RecordBatch>, Vec<RecordBatch>) =
                    (lp.into_iter().flatten().collect(), rp.into_iter().flatten().collect());
                let (left, right) = (
                    concat_read(&ls, &lp, &read_left, None, &memory)?,
                    concat_read(&rs, &rp, &read_right, None, &memory)?,
                );
                (lp, rp, left, right)
            };
            if left.num_rows() == 0 || right.num_rows() == 0 {
                (left, right, SetsIn::None, 0)
            } else {
                let evaluating = self.elapsed_compute.timer();
                let evaluate = |e: &PhysicalExprRef, parts: &[RecordBatch]| -> Result<Vec<ArrayRef>> {
                    parts.iter().map(|b| e.evaluate(b)?.into_array(b.num_rows())).collect()
                };
                let la = evaluate(&self.spec.left_set, &lparts)?;
                let ra = evaluate(&self.spec.right_set, &rparts)?;
                // The same arrays on both sides (a self join read once): encoded once.
                let shared = read_once && la.iter().zip(&ra).all(|(a, b)| Arc::ptr_eq(a, b));
                // The batches stay reserved until the join is done (the set columns point into them).
                let parts_bytes: usize =
                    lparts.iter().chain(if read_once { &[][..] } else { &rparts[..] }).map(batch_bytes).sum();
                drop((lparts, rparts));
                evaluating.done();
                // Kept for later queries only where the sets are one column of the scan, read once.
                let keep = sets_key.filter(|_| shared);
                (left, right, SetsIn::Arrays { la, ra, shared, keep }, parts_bytes)
            }
        };
        self.metrics.device.input_rows.add(left.num_rows() + right.num_rows());
        self.metrics.peak_memory.set_max(memory.size());
        if matches!(sets_in, SetsIn::None) {
            return Ok(futures::stream::empty().boxed());
        }
        crate::util::trace("similarity join: inputs collected");

        let timer = Instant::now();
        let thr = self.spec.threshold;
        let skip_diagonal = self.spec.residual.as_ref().is_some_and(|f| rejects_diagonal(f, &left, &right));
        let backend = self.spec.decision.backend;
        let cfg2 = cfg.clone();
        let held = memory.clone();
        let elapsed_compute = self.elapsed_compute.clone();
        let rows = left.num_rows();
        let (lidx, ridx, ran, stats) = tokio::task::spawn_blocking(move || -> Result<_> {
            let _timer = elapsed_compute.timer();
            let mut stats = JoinStats::default();
            let (mut lidx, mut ridx) = (Vec::new(), Vec::new());
            // A self join's pairs both ways, and the diagonal (unless the residual filter rejects every such pair).
            let mut self_join_rows = |c: &ssjoin::SetCollection, pairs: Vec<Pair>| {
                lidx.reserve(pairs.len() * 2);
                ridx.reserve(pairs.len() * 2);
                for (a, b, _) in pairs {
                    lidx.push(a);
                    ridx.push(b);
                    lidx.push(b);
                    ridx.push(a);
                }
                for p in (0..c.len()).filter(|_| !skip_diagonal) {
                    let n = c.size(p);
                    if n > 0 && thr.passes(n, n, n) {
                        lidx.push(c.ids[p]);
                        ridx.push(c.ids[p]);
                    }
                }
            };
            let ran = match sets_in {
                SetsIn::None => String::new(),
                SetsIn::Kept(sets) => {
                    let c = &sets.collection;
                    let (_, pairs, ran) =
                        join_sets(backend, &cfg2, Some(held.as_ref()), JoinSets::Prepared(c), thr, &mut stats);
                    self_join_rows(c, pairs);
                    format!(
                        "{ran}, self join; the sets kept from an earlier query ({:.1} MB)",
                        sets.bytes() as f64 / 1e6
                    )
                }
                SetsIn::Arrays { la, ra, shared, keep } => {
                    crate::util::trace("similarity join: set columns evaluated");
                    let both = [la, ra];
                    let enc =
                        crate::algo::ssjoin::encode::encode("similarity join", &both[..if shared { 1 } else { 2 }])?;
                    drop(both);
                    crate::util::trace("similarity join: sets encoded");
                    let same = shared || (enc[0].sets == enc[1].sets && enc[0].valid == enc[1].valid);
                    if same {
                        let (c, pairs, ran) = join_sets(
                            backend,
                            &cfg2,
                            Some(held.as_ref()),
                            JoinSets::Raw(&enc[0].sets, None),
                            thr,
                            &mut stats,
                        );
                        self_join_rows(&c, pairs);
                        match keep {
                            Some(key) => {
                                let sets = Arc::new(sets_cache::CachedSets { collection: c.into_owned(), rows });
                                let mb = sets.bytes() as f64 / 1e6;
                                if sets_cache::put(key, sets, cfg2.sets_cache_limit.0) {
                                    format!("{ran}, self join; the sets kept for later queries ({mb:.1} MB)")
                                } else {
                                    format!("{ran}, self join; the sets ({mb:.1} MB) not kept: over sets_cache_limit")
                                }
                            }
                            None => format!("{ran}, self join"),
                        }
                    } else {
                        let (_, pairs, ran) = join_sets(
                            backend,
                            &cfg2,
                            Some(held.as_ref()),
                            JoinSets::Raw(&enc[0].sets, Some(&enc[1].sets)),
                            thr,
                            &mut stats,
                        );
                        lidx.reserve(pairs.len());
                        ridx.reserve(pairs.len());
                        for (a, b, _) in pairs {
                            lidx.push(a);
                            ridx.push(b);
                        }
                        ran
                    }
                }
            };
            crate::util::trace("similarity join: joined");
            Ok((lidx, ridx, ran, stats))
        })
        .await
        .map_err(|e| DataFusionError::Execution(format!("similarity join task failed: {e}")))??;
        self.metrics.join_time.add_duration(timer.elapsed());
        self.metrics.candidates.add(stats.candidates as usize);
        self.metrics.verified.add(stats.results as usize);
        self.metrics.device.record(&stats.transfer);
        *self.ran.lock().unwrap() = Some(ran);

        let _ = memory.try_shrink(parts_bytes);
        let cols = output;
        // The pairs' row indices, held until the stream is done.
        memory.try_grow((lidx.capacity() + ridx.capacity()) * std::mem::size_of::<u32>())?;
        self.metrics.peak_memory.set_max(memory.size());
        let (lidx, ridx) = (Arc::new(lidx), Arc::new(ridx));
        let elapsed_compute = self.elapsed_compute.clone();
        let residual = self.spec.residual.clone();
        let schema = self.spec.schema.clone();
        let starts = (0..lidx.len()).step_by(batch_size);
        let out = futures::stream::iter(starts).filter_map(move |start| {
            // `memory` lives as long as the stream: released when it is consumed or dropped.
            let memory = &memory;
            let _timer = elapsed_compute.timer();
            let batch = (|| -> Result<Option<RecordBatch>> {
                let end = (start + batch_size).min(lidx.len());
                let mut li = UInt32Array::from(lidx[start..end].to_vec());
                let mut ri = UInt32Array::from(ridx[start..end].to_vec());
                if let Some(f) = &residual {
                    let columns: Vec<ArrayRef> = f
                        .column_indices()
                        .iter()
                        .map(|c| match c.side {
                            JoinSide::Left => take(left.column(c.index).as_ref(), &li, None),
                            _ => take(right.column(c.index).as_ref(), &ri, None),
                        })
                        .collect::<std::result::Result<_, _>>()?;
                    let batch = RecordBatch::try_new_with_options(
                        f.schema().clone(),
                        columns,
                        &RecordBatchOptions::new().with_row_count(Some(li.len())),
                    )?;
                    let mask = f.expression().evaluate(&batch)?.into_array(li.len())?;
                    let mask = mask
                        .as_any()
                        .downcast_ref::<BooleanArray>()
                        .ok_or_else(|| DataFusionError::Internal("join filter is not boolean".into()))?;
                    li = filter(&li, mask)?.as_any().downcast_ref::<UInt32Array>().unwrap().clone();
                    ri = filter(&ri, mask)?.as_any().downcast_ref::<UInt32Array>().unwrap().clone();
                }
                if li.is_empty() {
                    return Ok(None);
                }
                let columns: Vec<ArrayRef> = cols
                    .iter()
                    .map(|&c| {
                        if c < nl {
                            take(left.column(c).as_ref(), &li, None)
                        } else {
                            take(right.column(c - nl).as_ref(), &ri, None)
                        }
                    })
                    .collect::<std::result::Result<_, _>>()?;
                let batch = RecordBatch::try_new_with_options(
                    schema.clone(),
                    columns,
                    &RecordBatchOptions::new().with_row_count(Some(li.len())),
                )?;
                // Reserved while it is built; the caller's once returned.
                let bytes = batch_bytes(&batch);
                memory.try_grow(bytes)?;
                memory.shrink(bytes);
                Ok(Some(batch))
            })();
            std::future::ready(batch.transpose())
        });
        crate::util::trace("similarity join: pairs ready");
        Ok(out.boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::ssjoin::Metric;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A join on a device still starting answers as the host's join, whether
    /// the device never becomes ready, is ready at once (the device joins
    /// everything; without a GPU, the host after the device's failure), or
    /// becomes ready midway (the rule decides which finishes).
    #[test]
    fn a_join_while_the_device_starts_answers_as_the_host() {
        let raw = crate::algo::ssjoin::reference::generate(3000, true, 7);
        let thr = Threshold::new(Metric::Jaccard, 0.5);
        let (rc, _) = ssjoin_prep::preprocess(&raw, None);
        let want = sorted(ssjoin::ssjoin_cpu(&rc, None, thr));
        assert!(!want.is_empty());
        let gpu = gpu::test_gpu();
        let cfg = SetfusionConfig::default();
        let asked = AtomicUsize::new(0);
        let never = |_: f64, _: f64| None;
        let at_once = |_: f64, _: f64| Some(true);
        // Ready from the fourth question on, then the query's rule.
        let midway = |joined_ms: f64, done: f64| {
            (asked.fetch_add(1, Ordering::Relaxed) >= 3).then(|| device_finishes_first(joined_ms, done)).flatten()
        };
        for (name, handover) in [
            ("never", &never as &(dyn Fn(f64, f64) -> Option<bool> + Sync)),
            ("at once", &at_once),
            ("midway", &midway),
        ] {
            let mut stats = JoinStats::default();
            let (_, pairs, ran) =
                join_while_device_starts(&cfg, None, JoinSets::Raw(&raw, None), thr, &mut stats, handover);
            assert_eq!(sorted(pairs), want, "{name}: {ran}");
            match name {
                "never" => assert!(
                    ran.starts_with("cpu while the device started") || ran.starts_with("cpu, the device not started"),
                    "{ran}"
                ),
                "at once" if gpu.is_some() => assert!(ran.starts_with("gpu"), "{ran}"),
                "at once" => assert!(ran.starts_with("cpu (GPU failed"), "{ran}"),
                // Ready after the host began: the rule may leave this short join on the host.
                _ => assert!(ran.starts_with("gpu") || ran.starts_with("cpu"), "{name}: {ran}"),
            }
        }
    }

    fn sorted(pairs: Vec<Pair>) -> Vec<Pair> {
        let mut v: Vec<Pair> = pairs.iter().map(|p| (p.0.min(p.1), p.0.max(p.1), p.2)).collect();
        v.sort_unstable();
        v
    }
}
