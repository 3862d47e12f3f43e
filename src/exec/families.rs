//! `FamiliesExec`: the intersection of two families of sets
//! ([`crate::algo::families`]), the plan of the `intersect_families` table
//! function.
//!
//! Each input is a table of sets in one of two layouts:
//! * wide: one row per set, an `id` column and an `elements` list of integers
//!   (a repeated row is a repeated set; a NULL list is an empty set);
//! * long: one row per (`id`, `element`); the rows of one id form its set.
//!
//! NULL elements are ignored. The output, by level:
//! * `distinct` (the paper's I): `elements` (sorted list), `frequency`
//!   (BIGINT, the number of pairs of input rows giving that set), ordered by
//!   size, then elements;
//! * `pairs` (I_r): `left_id`, `right_id`, `elements` for every non-empty
//!   intersection, in input order of the left then right sets;
//! * `all` (I_c): the same with the empty intersections;
//! * `counts` (seed 004's MISI): `left_id`, `right_id`, `overlap` (BIGINT,
//!   the size of the intersection) for every non-empty intersection, in the
//!   same order as `pairs`, without materialising the elements
//!   ([`crate::algo::overlap`] chooses inverted lists or bitmaps).
//!
//! With one input (the self form) the pairs are those with left id < right
//! id (rows with a NULL id pair with nothing), in id order.
//!
//! One output partition. Pairs stream out in slices of left sets; the
//! distinct level is complete only at the end.
//!
//! Memory: one `MemoryConsumer` per execution reserves the collected inputs
//! (then their concatenation) until the producer ends (the stream is consumed
//! or dropped). The set families, the distinct sets and the backends' working
//! memory are not reserved. Nothing spills: over the pool's limit the query
//! fails with `ResourcesExhausted`.

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Int64Array, ListArray, RecordBatch, UInt32Array, UInt64Array,
};
use datafusion::arrow::buffer::{OffsetBuffer, ScalarBuffer};
use datafusion::arrow::compute::{cast, concat_batches, sort_to_indices, take};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef, UInt64Type};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, Gauge, MetricsSet, Time};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties, SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};

use crate::algo::families::{self, DistinctColumns, DistinctOut, DistinctSets, Family, PairIntersections, PairSpace};
use crate::algo::overlap;
use crate::config::{SetfusionConfig, Strategy};
use crate::exec::common::{decide_at_run_time, Decision, Reason, Unit};
use crate::exec::memory::{batch_bytes, collect_reserved, hold_device, reservation};
use crate::exec::DeviceMetrics;
use crate::gpu::{self, TransferStats};

/// The paper's three result levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// I: distinct non-empty intersections with frequencies.
    Distinct,
    /// I_r: non-empty intersections with their pair.
    Pairs,
    /// I_c: every pair's intersection, empty ones included.
    All,
    /// The size of every non-empty pair's intersection.
    Counts,
}

impl Level {
    pub fn parse(s: &str) -> Result<Level> {
        match s.trim().to_ascii_lowercase().as_str() {
            "distinct" => Ok(Level::Distinct),
            "pairs" => Ok(Level::Pairs),
            "all" => Ok(Level::All),
            "counts" => Ok(Level::Counts),
            other => Err(DataFusionError::Plan(format!(
                "intersect_families: unknown level '{other}': expected 'distinct' (the default), 'pairs', 'all' or \
                 'counts'"
            ))),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Level::Distinct => "distinct",
            Level::Pairs => "pairs",
            Level::All => "all",
            Level::Counts => "counts",
        }
    }
}

/// Where a family's sets are in its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One row per set: `id`, `elements` (a list).
    Wide { id: usize, elements: usize },
    /// One row per element: `id`, `element`.
    Long { id: usize, element: usize },
}

impl Layout {
    /// The layout of a table of sets, from its column names, with a plan
    /// error naming `table` when it has neither.
    pub fn of(table: &str, schema: &Schema) -> Result<Layout> {
        let find = |name: &str| schema.index_of(name).ok();
        let integer = |dt: &DataType| dt.is_integer() || matches!(dt, DataType::Null);
        let problem = |what: String| {
            DataFusionError::Plan(format!(
                "intersect_families: table '{table}' {what} (columns: {})",
                column_list(schema)
            ))
        };
        let id = find("id").ok_or_else(|| problem("has no `id` column".into()))?;
        if let Some(e) = find("elements") {
            let dt = schema.field(e).data_type();
            return match dt {
                DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _)
                    if integer(f.data_type()) =>
                {
                    Ok(Layout::Wide { id, elements: e })
                }
                other => Err(problem(format!("has `elements` of type {other}; expected a list of integers"))),
            };
        }
        if let Some(e) = find("element") {
            let dt = schema.field(e).data_type();
            return if integer(dt) {
                Ok(Layout::Long { id, element: e })
            } else {
                Err(problem(format!("has `element` of type {dt}; expected an integer")))
            };
        }
        Err(problem(
            "has neither an `elements` list column (one row per set) nor an `element` column (one row per element)"
                .into(),
        ))
    }

    fn id(&self) -> usize {
        match self {
            Layout::Wide { id, .. } | Layout::Long { id, .. } => *id,
        }
    }

    /// The element type as stored.
    fn element_type(&self, schema: &Schema) -> DataType {
        match self {
            Layout::Wide { elements, .. } => match schema.field(*elements).data_type() {
                DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => f.data_type().clone(),
                other => other.clone(),
            },
            Layout::Long { element, .. } => schema.field(*element).data_type().clone(),
        }
    }
}

fn column_list(schema: &Schema) -> String {
    schema.fields().iter().map(|f| format!("{} {}", f.name(), f.data_type())).collect::<Vec<_>>().join(", ")
}

/// Elements are compared as Int64, or as UInt64 when both families' element
/// types are unsigned.
fn element_type(types: &[DataType]) -> DataType {
    if types.iter().all(|t| t.is_unsigned_integer() || matches!(t, DataType::Null))
        && !types.iter().all(|t| matches!(t, DataType::Null))
    {
        DataType::UInt64
    } else {
        DataType::Int64
    }
}

/// The output schema of a level.
fn output_schema(level: Level, left_id: &DataType, right_id: &DataType, element: &DataType) -> SchemaRef {
    let list = DataType::List(Arc::new(Field::new("item", element.clone(), false)));
    Arc::new(match level {
        Level::Distinct => {
            Schema::new(vec![Field::new("elements", list, false), Field::new("frequency", DataType::Int64, false)])
        }
        Level::Pairs | Level::All => Schema::new(vec![
            Field::new("left_id", left_id.clone(), true),
            Field::new("right_id", right_id.clone(), true),
            Field::new("elements", list, false),
        ]),
        Level::Counts => Schema::new(vec![
            Field::new("left_id", left_id.clone(), true),
            Field::new("right_id", right_id.clone(), true),
            Field::new("overlap", DataType::Int64, false),
        ]),
    })
}

/// The element type the families are compared as, and the output schema of
/// `level` over tables of these schemas and layouts.
pub fn families_schema(
    level: Level,
    left: &Schema,
    left_layout: Layout,
    right: &Schema,
    right_layout: Layout,
) -> (DataType, SchemaRef) {
    let element = element_type(&[left_layout.element_type(left), right_layout.element_type(right)]);
    let schema = output_schema(
        level,
        left.field(left_layout.id()).data_type(),
        right.field(right_layout.id()).data_type(),
        &element,
    );
    (element, schema)
}

/// The operator. See the module documentation.
#[derive(Debug)]
pub struct FamiliesExec {
    /// What every execution reads, shared with it (see `exec::common`).
    spec: Arc<FamiliesSpec>,
    cache: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    ran: Arc<Mutex<Option<String>>>,
}

impl FamiliesExec {
    pub fn try_new(
        left: Arc<dyn ExecutionPlan>,
        right: Option<Arc<dyn ExecutionPlan>>,
        left_layout: Layout,
        right_layout: Layout,
        level: Level,
    ) -> Result<Self> {
        let (ls, rs) = (left.schema(), right.as_ref().map_or_else(|| left.schema(), |r| r.schema()));
        let (element, schema) = families_schema(level, &ls, left_layout, &rs, right_layout);
        let cache = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(1),
            if level == Level::Distinct { EmissionType::Final } else { EmissionType::Incremental },
            Boundedness::Bounded,
        ));
        Ok(Self {
            spec: Arc::new(FamiliesSpec { left, right, left_layout, right_layout, level, element, schema }),
            cache,
            metrics: ExecutionPlanMetricsSet::new(),
            ran: Arc::new(Mutex::new(None)),
        })
    }
}

impl FamiliesExec {
    /// The layouts of the left and right families (the right one is the left's in the self form).
    pub fn layouts(&self) -> (Layout, Layout) {
        (self.spec.left_layout, self.spec.right_layout)
    }
    pub fn level(&self) -> Level {
        self.spec.level
    }
    /// The self form (one family joined with itself, left id < right id)?
    pub fn is_self_join(&self) -> bool {
        self.spec.right.is_none()
    }
}

impl DisplayAs for FamiliesExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "FamiliesExec: level={}, form={}",
            self.spec.level.name(),
            if self.spec.right.is_some() { "two families" } else { "self (left id < right id)" }
        )?;
        write!(f, ", backend=gpu when one is usable and there are at least setfusion.min_rows pairs, else cpu")?;
        super::fmt_projection_and_ran(f, t, &None, &self.ran)
    }
}

impl ExecutionPlan for FamiliesExec {
    fn name(&self) -> &str {
        "FamiliesExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        std::iter::once(&self.spec.left).chain(self.spec.right.as_ref()).collect()
    }

    /// The families are read whole: each input in one partition (a Ballista
    /// task otherwise sees only its own partition slice of each input).
    fn required_input_distribution(&self) -> Vec<datafusion::physical_plan::Distribution> {
        vec![datafusion::physical_plan::Distribution::SinglePartition; self.children().len()]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let mut it = children.into_iter();
        let left = it.next().ok_or_else(|| DataFusionError::Internal("FamiliesExec needs its inputs".into()))?;
        let right = if self.spec.right.is_some() { it.next() } else { None };
        Ok(Arc::new(FamiliesExec::try_new(
            left,
            right,
            self.spec.left_layout,
            self.spec.right_layout,
            self.spec.level,
        )?))
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(
            &Arc<dyn datafusion::physical_expr::PhysicalExpr>,
        ) -> Result<datafusion::common::tree_node::TreeNodeRecursion>,
    ) -> Result<datafusion::common::tree_node::TreeNodeRecursion> {
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!("FamiliesExec has one partition, got {partition}")));
        }
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let run = Run {
            spec: self.spec.clone(),
            // One partition: each execution is partition 0's own.
            device: DeviceMetrics::new(&self.metrics, Some(partition)),
            peak_memory: super::execution_peak_memory(&self.metrics, Some(partition)),
            elapsed_compute: baseline.elapsed_compute().clone(),
            ran: self.ran.clone(),
        };
        let schema = self.spec.schema.clone();
        let fut = async move {
            let rx = run.start(context).await?;
            let stream = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
            Ok::<_, DataFusionError>(stream)
        };
        let stream = futures::stream::once(fut).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, super::observed(stream.boxed(), baseline))))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// One input family, read from its table.
struct Sets {
    /// The id of each set, in set order.
    ids: ArrayRef,
    /// Each set's elements as order-preserving u64 keys (CSR).
    offsets: Vec<usize>,
    keys: Vec<u64>,
}

/// The sign bit: flipped, an Int64's bits become an order-preserving u64 key
/// (unsigned order is signed order), and back.
const SIGN: u64 = 1 << 63;

/// Order-preserving u64 key of an Int64.
fn signed_key(x: i64) -> u64 {
    (x as u64) ^ SIGN
}

impl Sets {
    fn read(batch: &RecordBatch, layout: Layout, element: &DataType) -> Result<Sets> {
        let ids = batch.column(layout.id()).clone();
        match layout {
            Layout::Wide { elements, .. } => {
                let list = batch.column(elements);
                // A Null-typed column is a column of NULL lists: empty sets.
                let (values, bounds) =
                    crate::keys::list_parts(list)?.unwrap_or_else(|| (list.clone(), vec![(0, 0); list.len()]));
                let values = ElementKeys::of(&values, element)?;
                // Each set's length first, then every set's keys written in place by
                // blocks of sets on the host's threads: one pass over the values and no
                // intermediate copies (three copies of 6.25M keys, each faulting in
                // fresh pages, cost ~270 ms on two cores at k = 50,000).
                let lists = list.logical_nulls();
                let mut offsets = Vec::with_capacity(bounds.len() + 1);
                offsets.push(0);
                let mut at = 0;
                for (row, &(s, e)) in bounds.iter().enumerate() {
                    // A NULL list is an empty set.
                    if lists.as_ref().is_none_or(|l| l.is_valid(row)) {
                        at += values.valid_in(s..e);
                    }
                    offsets.push(at);
                }
                let mut keys = vec![0u64; at];
                let ranges = set_blocks(&offsets);
                let lens = ranges.iter().map(|rows| offsets[rows.end] - offsets[rows.start]);
                let parts = crate::host::split_mut(&mut keys, lens);
                let mut blocks: Vec<(std::ops::Range<usize>, &mut [u64])> = ranges.iter().cloned().zip(parts).collect();
                crate::host::for_each_mut(&mut blocks, &|_, (rows, out)| {
                    let mut w = 0;
                    for row in rows.clone() {
                        if offsets[row + 1] > offsets[row] {
                            let (s, e) = bounds[row];
                            w += values.write(s..e, &mut out[w..]);
                        }
                    }
                });
                Ok(Sets { ids, offsets, keys })
            }
            Layout::Long { element: col, .. } => {
                let (keys, valid) = element_keys(batch.column(col), element)?;
                // Group rows by id (NULL ids group together), sets in order of first appearance.
                let conv = RowConverter::new(vec![SortField::new(ids.data_type().clone())])?;
                let rows = conv.convert_columns(&[ids.clone()])?;
                let mut set_of: std::collections::HashMap<&[u8], usize> = std::collections::HashMap::new();
                let mut first_row: Vec<u32> = Vec::new();
                let mut members: Vec<Vec<u64>> = Vec::new();
                for r in 0..batch.num_rows() {
                    let s = *set_of.entry(rows.row(r).data()).or_insert_with(|| {
                        first_row.push(r as u32);
                        members.push(Vec::new());
                        members.len() - 1
                    });
                    if valid.as_ref().is_none_or(|v| v[r]) {
                        members[s].push(keys[r]);
                    }
                }
                let ids = take(ids.as_ref(), &UInt32Array::from(first_row), None)?;
                let mut out = Sets { ids, offsets: Vec::with_capacity(members.len() + 1), keys: Vec::new() };
                out.offsets.push(0);
                for m in members {
                    out.keys.extend(m);
                    out.offsets.push(out.keys.len());
                }
                Ok(out)
            }
        }
    }

    fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// The sets reordered by ascending id (NULL ids dropped), and for each the
    /// first set with a larger id: the self form's pairs. Sets already in that
    /// order keep their keys; others are gathered on the host's threads.
    fn in_id_order(self) -> Result<(Sets, Vec<u32>)> {
        let order = sort_to_indices(self.ids.as_ref(), None, None)?;
        let order: Vec<u32> = order.values().iter().copied().filter(|&i| self.ids.is_valid(i as usize)).collect();
        let out = if order.len() == self.len() && order.iter().enumerate().all(|(at, &i)| at == i as usize) {
            self
        } else {
            let ids = take(self.ids.as_ref(), &UInt32Array::from(order.clone()), None)?;
            let pieces: Vec<&[u64]> =
                order.iter().map(|&i| &self.keys[self.offsets[i as usize]..self.offsets[i as usize + 1]]).collect();
            let mut offsets = Vec::with_capacity(order.len() + 1);
            offsets.push(0);
            offsets.extend(pieces.iter().scan(0, |at, p| {
                *at += p.len();
                Some(*at)
            }));
            let mut keys = vec![0u64; *offsets.last().unwrap_or(&0)];
            crate::host::parallel_gather(&pieces, &mut keys, crate::host::copy_threads(), &|_| {});
            Sets { ids, offsets, keys }
        };
        let mut from = vec![0u32; order.len()];
        if !order.is_empty() {
            let ranges = datafusion::arrow::compute::kernels::partition::partition(&[out.ids.clone()])?;
            for r in ranges.ranges() {
                from[r.clone()].fill(r.end as u32);
            }
        }
        Ok((out, from))
    }
}

/// An integer column as order-preserving u64 keys, and which are valid
/// (None: all are).
fn element_keys(values: &ArrayRef, element: &DataType) -> Result<(Vec<u64>, Option<Vec<bool>>)> {
    let v = ElementKeys::of(values, element)?;
    let valid = v.valid.as_ref().map(|n| n.iter().collect());
    Ok(((0..values.len()).map(|i| v.key(i)).collect(), valid))
}

/// A list column's element values, read as order-preserving u64 keys where
/// they lie: Int64 and UInt64 values in place, other integer types cast once.
struct ElementKeys {
    values: ElementValues,
    /// The values' NULLs (None: none is NULL).
    valid: Option<datafusion::arrow::buffer::NullBuffer>,
}

enum ElementValues {
    /// Keys of an Int64 image: the sign bit flipped ([`signed_key`]).
    Signed(ScalarBuffer<i64>),
    /// Int32 values, widened as they are read (no cast of the whole column).
    Signed32(ScalarBuffer<i32>),
    Unsigned(ScalarBuffer<u64>),
    /// A `DataType::Null` column: every value NULL.
    Null,
}

impl ElementKeys {
    /// `values` as keys of the output's `element` type (UInt64, else Int64).
    fn of(values: &ArrayRef, element: &DataType) -> Result<ElementKeys> {
        if values.data_type() == &DataType::Null {
            let valid = Some(datafusion::arrow::buffer::NullBuffer::new_null(values.len()));
            return Ok(ElementKeys { values: ElementValues::Null, valid });
        }
        let valid = values.logical_nulls().filter(|n| n.null_count() > 0);
        let values = match element {
            DataType::UInt64 => {
                ElementValues::Unsigned(cast(values, &DataType::UInt64)?.as_primitive::<UInt64Type>().values().clone())
            }
            _ if values.data_type() == &DataType::Int32 => ElementValues::Signed32(
                values.as_primitive::<datafusion::arrow::datatypes::Int32Type>().values().clone(),
            ),
            _ => {
                let v = cast(values, &DataType::Int64)
                    .map_err(|e| DataFusionError::Execution(format!("intersect_families: element {e}")))?;
                ElementValues::Signed(v.as_primitive::<Int64Type>().values().clone())
            }
        };
        Ok(ElementKeys { values, valid })
    }

    /// Value `i`'s key (whatever it is where the value is NULL).
    fn key(&self, i: usize) -> u64 {
        match &self.values {
            ElementValues::Signed(v) => signed_key(v[i]),
            ElementValues::Signed32(v) => signed_key(v[i] as i64),
            ElementValues::Unsigned(v) => v[i],
            ElementValues::Null => 0,
        }
    }

    /// How many of the values in `range` are not NULL.
    fn valid_in(&self, range: Range<usize>) -> usize {
        match &self.valid {
            None => range.len(),
            Some(n) => range.filter(|&i| n.is_valid(i)).count(),
        }
    }

    /// Write the keys of the valid values in `range` to the front of `out`; how many.
    fn write(&self, range: Range<usize>, out: &mut [u64]) -> usize {
        match (&self.valid, &self.values) {
            (None, ElementValues::Signed(v)) => {
                for (o, &x) in out.iter_mut().zip(&v[range.clone()]) {
                    *o = signed_key(x);
                }
                range.len()
            }
            (None, ElementValues::Signed32(v)) => {
                for (o, &x) in out.iter_mut().zip(&v[range.clone()]) {
                    *o = signed_key(x as i64);
                }
                range.len()
            }
            (None, ElementValues::Unsigned(v)) => {
                out[..range.len()].copy_from_slice(&v[range.clone()]);
                range.len()
            }
            _ => {
                let mut w = 0;
                for i in range.filter(|&i| self.valid.as_ref().is_none_or(|n| n.is_valid(i))) {
                    out[w] = self.key(i);
                    w += 1;
                }
                w
            }
        }
    }
}

/// Keep the first of each run of equal values of a sorted slice, in place;
/// the count kept.
fn dedup_sorted(run: &mut [u32]) -> usize {
    if run.is_empty() {
        return 0;
    }
    let mut kept = 1;
    for r in 1..run.len() {
        if run[r] != run[kept - 1] {
            run[kept] = run[r];
            kept += 1;
        }
    }
    kept
}

/// Blocks of consecutive sets (`offsets` in CSR form) for the host's threads,
/// cut by their elements: about an eighth of a thread's share each (at
/// least 65,536 elements or one set, at most 4,096 sets), so a few large sets
/// spread over the threads as well as many small ones (1,000 sets of 10^6
/// elements made one block of 4,096 sets: one thread wrote and then mapped
/// all 10^9 keys, 25 s of a 29 s query).
fn set_blocks(offsets: &[usize]) -> Vec<std::ops::Range<usize>> {
    const MAX_SETS: usize = 4096;
    let n = offsets.len().saturating_sub(1);
    let total = offsets.last().map_or(0, |&e| e - offsets[0]);
    let target = (total / (crate::host::copy_threads().max(1) * 8)).max(1 << 16);
    let mut blocks = Vec::with_capacity(n.div_ceil(MAX_SETS));
    let mut first = 0;
    while first < n {
        let mut last = first + 1;
        while last < n && last - first < MAX_SETS && offsets[last] - offsets[first] < target {
            last += 1;
        }
        blocks.push(first..last);
        first = last;
    }
    blocks
}

/// The element domain: the keys present in both families, ascending; dense
/// ids are positions in it.
struct Domain {
    keys: Vec<u64>,
    /// For keys within a span not much larger than the input, an O(1) lookup.
    ranks: Option<Ranks>,
}

/// The domain's keys as presence bits over their span from `lo`, with each
/// word's count of keys before it: a key's id is that count plus the bits
/// below it in its word. 12 bytes per 64 keys of span (19 MB over 10^8),
/// where a table of ids took 4 bytes a key of span (400 MB). Mapping 10^9
/// zipf elements took as long either way (3.3-4.7 s on 16 threads, within
/// the loans' spread; BENCHMARKS section 47): the saving is memory.
struct Ranks {
    lo: u64,
    bits: Vec<u64>,
    before: Vec<u32>,
}

impl Ranks {
    fn id(&self, k: u64) -> Option<u32> {
        let i = k.checked_sub(self.lo)?;
        let (w, b) = ((i / 64) as usize, i % 64);
        let word = *self.bits.get(w)?;
        (word >> b & 1 == 1).then(|| self.before[w] + (word & ((1u64 << b) - 1)).count_ones())
    }
}

impl Domain {
    /// Domain reduction (the paper's phase A): the keys in both `a` and `b`.
    fn shared(a: &[u64], b: &[u64]) -> Domain {
        // Blocks of both key lists, for the host's threads.
        const BLOCK: usize = 1 << 18;
        // The self form passes one side twice: its keys are read once.
        let b_blocks = if std::ptr::eq(a, b) { &[][..] } else { b };
        let blocks: Vec<&[u64]> = a.chunks(BLOCK).chain(b_blocks.chunks(BLOCK)).collect();
        let spans = crate::host::par_map(&blocks, 1, |c| {
            Ok::<_, DataFusionError>(c.iter().fold((u64::MAX, 0u64), |(lo, hi), &k| (lo.min(k), hi.max(k))))
        })
        .expect("infallible");
        let (lo, hi) = spans.into_iter().fold((u64::MAX, 0u64), |(lo, hi), (l, h)| (lo.min(l), hi.max(h)));
        let inputs = (a.len() + b.len()) as u64;
        if lo <= hi && hi - lo < 4 * inputs + (1 << 20) {
            // Dense keys (the usual case: ids of a vocabulary): each side's presence
            // bits over the span, set by parts of its keys on the host's threads
            // (12.5M keys took ~33 ms on one thread of the H100 host) and OR-ed together.
            let span = (hi - lo + 1) as usize;
            let words = span.div_ceil(64);
            let presence = |keys: &[u64]| -> Vec<u64> {
                // One bitmap per part, OR-ed after: at most a thread's worth of
                // parts, and never more bitmap words than the side has keys.
                let parts = (keys.len() / words).clamp(1, crate::host::copy_threads());
                let parts: Vec<&[u64]> = keys.chunks(keys.len().div_ceil(parts).max(1)).collect();
                let bitmaps = crate::host::par_map(&parts, 1, |part| {
                    let mut bits = vec![0u64; words];
                    for &k in part.iter() {
                        let i = (k - lo) as usize;
                        bits[i / 64] |= 1 << (i % 64);
                    }
                    Ok::<_, DataFusionError>(bits)
                })
                .expect("infallible");
                bitmaps
                    .into_iter()
                    .reduce(|mut x, y| {
                        x.iter_mut().zip(&y).for_each(|(x, y)| *x |= y);
                        x
                    })
                    .unwrap_or_else(|| vec![0u64; words])
            };
            // The self form passes one side twice: its bits are the domain.
            let mut bits = presence(a);
            let in_b = (!std::ptr::eq(a, b)).then(|| presence(b));
            let mut before = Vec::with_capacity(words);
            let mut count = 0u32;
            for (w, x) in bits.iter_mut().enumerate() {
                if let Some(y) = &in_b {
                    *x &= y[w];
                }
                before.push(count);
                count += x.count_ones();
            }
            // The keys in order, by blocks of words on the host's threads, each block
            // written where the counts before it say (92M keys, one by one on one
            // thread, were ~0.3 s of MISI's 10^9 elements).
            const WORDS: usize = 1 << 14;
            let mut keys = vec![0u64; count as usize];
            let starts: Vec<usize> = (0..words).step_by(WORDS).collect();
            let lens = starts.iter().map(|&w| {
                let end = before.get(w + WORDS).map_or(count, |&c| c);
                (end - before[w]) as usize
            });
            let mut parts: Vec<(usize, &mut [u64])> =
                starts.iter().copied().zip(crate::host::split_mut(&mut keys, lens)).collect();
            crate::host::for_each_mut(&mut parts, &|_, (from, out)| {
                let mut k = 0;
                for (w, &word) in bits.iter().enumerate().skip(*from).take(WORDS) {
                    let mut word = word;
                    while word != 0 {
                        out[k] = lo + (w * 64) as u64 + word.trailing_zeros() as u64;
                        k += 1;
                        word &= word - 1;
                    }
                }
            });
            return Domain { keys, ranks: Some(Ranks { lo, bits, before }) };
        }
        let distinct = |v: &[u64]| {
            let mut v = v.to_vec();
            v.sort_unstable();
            v.dedup();
            v
        };
        let (a, b) = (distinct(a), distinct(b));
        let mut keys = Vec::with_capacity(a.len().min(b.len()));
        let (mut i, mut j) = (0, 0);
        while i < a.len() && j < b.len() {
            match a[i].cmp(&b[j]) {
                std::cmp::Ordering::Less => i += 1,
                std::cmp::Ordering::Greater => j += 1,
                std::cmp::Ordering::Equal => {
                    keys.push(a[i]);
                    i += 1;
                    j += 1;
                }
            }
        }
        Domain { keys, ranks: None }
    }

    /// The dense id of a key, if it is in the domain.
    fn id(&self, k: u64) -> Option<u32> {
        match &self.ranks {
            Some(r) => r.id(k),
            None => self.keys.binary_search(&k).ok().map(|x| x as u32),
        }
    }

    /// A family of the sets' elements that lie in the domain, as dense ids.
    /// Blocks of sets on the host's threads (100,000 sets of ~125 elements:
    /// ~250 ms on one thread), each set's ids sorted (when its keys were not)
    /// and without repeats.
    fn family(&self, sets: &Sets) -> Result<Family> {
        let n = sets.len();
        let base = sets.offsets[0];
        // Each set's ids are written where its keys lie (a key outside the
        // domain, or a repeat, takes no place, so that is room enough), by
        // blocks of sets on the host's threads, into one buffer. The blocks'
        // own vectors, gathered after, wrote every id twice and held the
        // elements twice (4 GB more at 10^9); the self form's sets of
        // distinct elements, whose ids all stay, are now written once.
        let mut elements = vec![0u32; sets.offsets[n] - base];
        let ranges = set_blocks(&sets.offsets);
        let lens = ranges.iter().map(|rows| sets.offsets[rows.end] - sets.offsets[rows.start]);
        let mut parts: Vec<(std::ops::Range<usize>, &mut [u32], Vec<usize>)> = ranges
            .iter()
            .cloned()
            .zip(crate::host::split_mut(&mut elements, lens))
            .map(|(r, p)| (r, p, Vec::new()))
            .collect();
        crate::host::for_each_mut(&mut parts, &|_, (rows, out, lens)| {
            let first = sets.offsets[rows.start];
            for s in rows.clone() {
                let (from, to) = (sets.offsets[s], sets.offsets[s + 1]);
                let run = &mut out[from - first..to - first];
                let mut k = 0;
                for id in sets.keys[from..to].iter().filter_map(|&key| self.id(key)) {
                    run[k] = id;
                    k += 1;
                }
                let run = &mut run[..k];
                if !run.is_sorted() {
                    run.sort_unstable();
                }
                lens.push(dedup_sorted(run));
            }
        });
        let lens: Vec<usize> = parts.into_iter().flat_map(|(_, _, lens)| lens).collect();
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0);
        let mut at = 0;
        offsets.extend(lens.iter().map(|&l| {
            at += l;
            at
        }));
        if at == elements.len() {
            // Every key was in the domain once (the self form's sets of distinct elements).
            return Ok(Family { offsets, elements });
        }
        // The runs gathered back to back on the host's threads.
        let pieces: Vec<&[u32]> =
            (0..n).map(|s| &elements[sets.offsets[s] - base..sets.offsets[s] - base + lens[s]]).collect();
        let mut packed = vec![0u32; at];
        crate::host::parallel_gather(&pieces, &mut packed, crate::host::copy_threads(), &|_| {});
        Ok(Family { offsets, elements: packed })
    }

    /// The output list array of sets given as dense ids.
    fn list(&self, element: &DataType, offsets: &[usize], ids: &[u32]) -> Result<ArrayRef> {
        let values: ArrayRef = match element {
            DataType::UInt64 => Arc::new(UInt64Array::from_iter_values(ids.iter().map(|&i| self.keys[i as usize]))),
            _ => Arc::new(Int64Array::from_iter_values(ids.iter().map(|&i| (self.keys[i as usize] ^ SIGN) as i64))),
        };
        let base = offsets[0];
        let offs: Vec<i32> = offsets
            .iter()
            .map(|&o| {
                i32::try_from(o - base)
                    .map_err(|_| DataFusionError::Execution("intersect_families: batch of over 2^31 elements".into()))
            })
            .collect::<Result<_>>()?;
        let field = Arc::new(Field::new("item", element.clone(), false));
        Ok(Arc::new(ListArray::try_new(field, OffsetBuffer::new(ScalarBuffer::from(offs)), values, None)?))
    }
}

/// Pairs of one slice of left sets per output round: bounds the memory a
/// stream holds at once (the pair matrix on the device, output on the host).
const PAIRS_PER_ROUND: u64 = 1 << 26;

/// The node's inputs and choices, shared by the node and its executions.
#[derive(Debug)]
struct FamiliesSpec {
    left: Arc<dyn ExecutionPlan>,
    /// None: the self form.
    right: Option<Arc<dyn ExecutionPlan>>,
    left_layout: Layout,
    right_layout: Layout,
    level: Level,
    element: DataType,
    schema: SchemaRef,
}

/// One execution: the node's spec and the execution's own state.
struct Run {
    spec: Arc<FamiliesSpec>,
    device: DeviceMetrics,
    /// The peak of the execution's memory reservation.
    peak_memory: Gauge,
    /// The producer's work, not its waits for the consumer to take a batch.
    elapsed_compute: Time,
    ran: Arc<Mutex<Option<String>>>,
}

type Sender = tokio::sync::mpsc::Sender<Result<RecordBatch>>;

impl Run {
    /// Collect the inputs and start the producer; returns its batches.
    async fn start(self, context: Arc<TaskContext>) -> Result<tokio::sync::mpsc::Receiver<Result<RecordBatch>>> {
        let cfg = SetfusionConfig::from_options(context.session_config().options());
        let batch_size = context.session_config().batch_size().max(1);
        let memory = reservation(&context, "FamiliesExec");
        let collect = |p: Arc<dyn ExecutionPlan>| {
            let (ctx, memory) = (context.clone(), memory.clone());
            async move {
                let schema = p.schema();
                let parts = collect_reserved(p, ctx, &memory).await?;
                let parts_bytes: usize = parts.iter().flatten().map(batch_bytes).sum();
                let b = concat_batches(&schema, parts.iter().flatten())?;
                memory.try_grow(batch_bytes(&b))?;
                drop(parts);
                let _ = memory.try_shrink(parts_bytes);
                Ok::<_, DataFusionError>(b)
            }
        };
        let left = collect(self.spec.left.clone()).await?;
        let right = match &self.spec.right {
            Some(r) => Some(collect(r.clone()).await?),
            None => None,
        };
        self.device.input_rows.add(left.num_rows() + right.as_ref().map_or(0, |r| r.num_rows()));
        self.peak_memory.set_max(memory.size());
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        tokio::task::spawn_blocking(move || {
            let produced = self.produce(&cfg, &memory, batch_size, &left, right.as_ref(), &tx);
            // The inputs' reservation ends before the stream does (the sender's drop): a
            // consumer that has seen the end finds the pool as it was before the query.
            drop((left, right));
            memory.free();
            if let Err(e) = produced {
                let _ = tx.blocking_send(Err(e));
            }
        });
        Ok(rx)
    }

    fn produce(
        &self,
        cfg: &SetfusionConfig,
        memory: &MemoryReservation,
        batch_size: usize,
        left: &RecordBatch,
        right: Option<&RecordBatch>,
        tx: &Sender,
    ) -> Result<()> {
        let started = Instant::now();
        let compute = std::cell::RefCell::new(self.elapsed_compute.timer());
        let l = Sets::read(left, self.spec.left_layout, &self.spec.element)?;
        let (l, r, from) = match right {
            Some(rb) => (l, Some(Sets::read(rb, self.spec.right_layout, &self.spec.element)?), None),
            None => {
                let (sorted, from) = l.in_id_order()?;
                (sorted, None, Some(from))
            }
        };
        let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
        let read_ms = ms(started);
        let domain = Domain::shared(&l.keys, r.as_ref().map_or(&l.keys, |r| &r.keys));
        let domain_ms = ms(started) - read_ms;
        let lf = domain.family(&l)?;
        // The self form pairs the one family with itself (a copy of 10^9 ids took ~1 s).
        let rf = r.as_ref().map(|r| domain.family(r)).transpose()?;
        let right_ids = r.as_ref().map_or(&l.ids, |r| &r.ids);
        let space = PairSpace { left: &lf, right: rf.as_ref().unwrap_or(&lf), right_from: from.as_deref() };
        crate::util::trace(&format!(
            "intersect_families: sets read in {read_ms:.1} ms, their domain of {} keys found in {domain_ms:.1} ms, mapped to it in {:.1} ms",
            domain.keys.len(),
            ms(started) - read_ms - domain_ms
        ));
        let pairs = space.pair_count(0..lf.len());
        // The pair count is known only now: the one runtime rule (`planner::decision` decides everything
        // else at plan time); the device itself is taken below. Err: why the CPU.
        let backend = decide_at_run_time(cfg, pairs as usize, Unit::Pairs, || {
            gpu::wait_started(cfg.device);
            let min_rows = cfg.min_rows as u64;
            Decision::gpu(Strategy::Auto, Reason::AtLeastMinRows { count: pairs, unit: Unit::Pairs, min_rows })
        })
        .map(|_| ())
        .map_err(|d| d.reason);
        let send = |b: RecordBatch| -> Result<bool> {
            // Waiting for the consumer is not this operator's compute.
            compute.borrow_mut().stop();
            let sent = tx.blocking_send(Ok(b)).is_ok();
            compute.borrow_mut().restart();
            Ok(sent)
        };
        let mut ts = TransferStats::default();
        let mut notes: Vec<String> = Vec::new();
        match self.spec.level {
            Level::Distinct => {
                let flip = if self.spec.element == DataType::UInt64 { 0 } else { SIGN };
                let d = match &backend {
                    Ok(()) => match distinct_on_gpu(cfg, memory, &space, &domain.keys, flip, &mut ts) {
                        Ok((d, slices)) => {
                            let laid_out = matches!(d, DistinctOut::Columns(_));
                            notes.push(format!(
                                "gpu in {slices} slice(s){}",
                                if laid_out { ", output laid out on the device" } else { "" }
                            ));
                            d
                        }
                        Err(e) => {
                            notes.push(format!("cpu (GPU failed: {e})"));
                            DistinctOut::Sets(families::distinct_cpu(&space))
                        }
                    },
                    Err(why) => {
                        notes.push(format!("cpu ({why})"));
                        DistinctOut::Sets(families::distinct_cpu(&space))
                    }
                };
                *self.ran.lock().unwrap() = Some(format!(
                    "{}, {} sets x {} sets, {} distinct",
                    notes.join("; "),
                    lf.len(),
                    space.right.len(),
                    d.len()
                ));
                let made = Instant::now();
                let batches = match &d {
                    DistinctOut::Sets(d) => self.distinct_batches(&domain, d, batch_size)?,
                    DistinctOut::Columns(c) => column_batches(&self.spec.schema, &self.spec.element, c, batch_size)?,
                };
                crate::util::trace(&format!(
                    "intersect_families: {} output batches in {:.1} ms",
                    batches.len(),
                    ms(made)
                ));
                for b in batches {
                    if !send(b)? {
                        break;
                    }
                }
            }
            Level::Counts => {
                // The inverted lists, built once, if a round needs them (the bitmaps do not).
                let inv = std::sync::OnceLock::new();
                let cpu = |rows: Range<usize>| {
                    overlap::counts_cpu(&space, inv.get_or_init(|| families::InvertedLists::of_space(&space)), rows)
                };
                let mut at = 0;
                let mut gpu_failed: Option<String> = None;
                while at < lf.len() {
                    let end = round_end(&space, at);
                    let (counts, ran) = round_on(
                        &backend,
                        &mut gpu_failed,
                        || {
                            let (c, method) = counts_on_gpu(cfg, memory, &space, &inv, at..end, &mut ts)?;
                            Ok((c, format!("gpu by {}", method.name())))
                        },
                        || cpu(at..end),
                    );
                    *self.ran.lock().unwrap() =
                        Some(format!("{ran}, {} sets x {} sets, {pairs} pairs", lf.len(), space.right.len()));
                    let batches = self.count_batches(&space, &counts, at..end, &l.ids, right_ids, batch_size)?;
                    if !batches.into_iter().try_fold(true, |go, b| if go { send(b) } else { Ok(false) })? {
                        break;
                    }
                    at = end;
                }
            }
            Level::Pairs | Level::All => {
                // The right family's inverted lists, built once for every round.
                let inv = families::InvertedLists::of_space(&space);
                let mut at = 0;
                let mut gpu_failed: Option<String> = None;
                'rounds: while at < lf.len() {
                    let end = round_end(&space, at);
                    let (part, ran) = round_on(
                        &backend,
                        &mut gpu_failed,
                        || Ok((pairs_on_gpu(cfg, memory, &space, &inv, at..end, &mut ts)?, "gpu".to_string())),
                        || families::pairs_cpu_with(&space, &inv, at..end),
                    );
                    *self.ran.lock().unwrap() =
                        Some(format!("{ran}, {} sets x {} sets, {pairs} pairs", lf.len(), space.right.len()));
                    for b in self.pair_batches(&space, &domain, &part, at..end, &l.ids, right_ids, batch_size)? {
                        if !send(b)? {
                            // The consumer stopped reading (a LIMIT above).
                            break 'rounds;
                        }
                    }
                    at = end;
                }
            }
        }
        self.device.record(&ts);
        crate::util::trace(&format!("intersect_families: done in {:.1} ms", started.elapsed().as_secs_f64() * 1e3));
        Ok(())
    }

    /// Output batches of one round's non-empty counts (`counts`: a row of
    /// the right family's length per left set of `rows`).
    fn count_batches(
        &self,
        space: &PairSpace,
        counts: &[u32],
        rows: Range<usize>,
        left_ids: &ArrayRef,
        right_ids: &ArrayRef,
        batch_size: usize,
    ) -> Result<Vec<RecordBatch>> {
        let k = space.right.len();
        let (mut li, mut ri, mut n): (Vec<u32>, Vec<u32>, Vec<i64>) = (Vec::new(), Vec::new(), Vec::new());
        for (r, i) in rows.enumerate() {
            for j in space.first_right(i)..k {
                let c = counts[r * k + j];
                if c > 0 {
                    li.push(i as u32);
                    ri.push(j as u32);
                    n.push(c as i64);
                }
            }
        }
        let mut out = Vec::new();
        for start in (0..li.len()).step_by(batch_size) {
            let end = (start + batch_size).min(li.len());
            let lid = take(left_ids.as_ref(), &UInt32Array::from(li[start..end].to_vec()), None)?;
            let rid = take(right_ids.as_ref(), &UInt32Array::from(ri[start..end].to_vec()), None)?;
            let overlap: ArrayRef = Arc::new(Int64Array::from(n[start..end].to_vec()));
            out.push(RecordBatch::try_new(self.spec.schema.clone(), vec![lid, rid, overlap])?);
        }
        Ok(out)
    }

    fn distinct_batches(&self, domain: &Domain, d: &DistinctSets, batch_size: usize) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        for start in (0..d.len()).step_by(batch_size) {
            let end = (start + batch_size).min(d.len());
            let offs = &d.offsets[start..=end];
            let list = domain.list(&self.spec.element, offs, &d.elements[offs[0]..offs[end - start]])?;
            let freq = Int64Array::from_iter_values(d.frequency[start..end].iter().map(|&f| f as i64));
            out.push(RecordBatch::try_new(self.spec.schema.clone(), vec![list, Arc::new(freq)])?);
        }
        Ok(out)
    }

    /// Output batches of one round's pairs (with the empty ones for `all`).
    #[allow(clippy::too_many_arguments)]
    fn pair_batches(
        &self,
        space: &PairSpace,
        domain: &Domain,
        part: &PairIntersections,
        rows: Range<usize>,
        left_ids: &ArrayRef,
        right_ids: &ArrayRef,
        batch_size: usize,
    ) -> Result<Vec<RecordBatch>> {
        // Rows of the output: (left set, right set, the pair's number in `part` or none).
        let mut li: Vec<u32> = Vec::new();
        let mut ri: Vec<u32> = Vec::new();
        let mut which: Vec<Option<usize>> = Vec::new();
        if self.spec.level == Level::All {
            let mut p = 0;
            for i in rows {
                for j in space.first_right(i)..space.right.len() {
                    let hit = p < part.len() && part.left[p] as usize == i && part.right[p] as usize == j;
                    li.push(i as u32);
                    ri.push(j as u32);
                    which.push(hit.then_some(p));
                    p += hit as usize;
                }
            }
        } else {
            li.extend_from_slice(&part.left);
            ri.extend_from_slice(&part.right);
            which.extend((0..part.len()).map(Some));
        }
        let mut out = Vec::new();
        for start in (0..li.len()).step_by(batch_size) {
            let end = (start + batch_size).min(li.len());
            let mut offsets = vec![0usize];
            let mut elems: Vec<u32> = Vec::new();
            for w in &which[start..end] {
                if let Some(p) = w {
                    elems.extend_from_slice(part.set(*p));
                }
                offsets.push(elems.len());
            }
            let list = domain.list(&self.spec.element, &offsets, &elems)?;
            let lid = take(left_ids.as_ref(), &UInt32Array::from(li[start..end].to_vec()), None)?;
            let rid = take(right_ids.as_ref(), &UInt32Array::from(ri[start..end].to_vec()), None)?;
            out.push(RecordBatch::try_new(self.spec.schema.clone(), vec![lid, rid, list])?);
        }
        Ok(out)
    }
}

/// Output batches of the distinct sets the device laid out, made on the
/// host's threads: each batch's own copy of its rows (batches that shared the
/// whole output's buffers would each count all of it against the memory pool).
fn column_batches(
    schema: &SchemaRef,
    element: &DataType,
    c: &DistinctColumns,
    batch_size: usize,
) -> Result<Vec<RecordBatch>> {
    let (offsets, values, frequency) = (c.offsets(), c.values(), c.frequency());
    let field = Arc::new(Field::new("item", element.clone(), false));
    let starts: Vec<usize> = (0..c.len).step_by(batch_size).collect();
    crate::host::par_map(&starts, 8, |&start| {
        let end = (start + batch_size).min(c.len);
        let base = offsets[start];
        let offs: Vec<i32> = offsets[start..=end].iter().map(|&o| o - base).collect();
        let vals = &values[base as usize..offsets[end] as usize];
        let vals: ArrayRef = match element {
            DataType::UInt64 => Arc::new(UInt64Array::from(vals.to_vec())),
            _ => Arc::new(Int64Array::from_iter_values(vals.iter().map(|&v| v as i64))),
        };
        let list = ListArray::try_new(field.clone(), OffsetBuffer::new(ScalarBuffer::from(offs)), vals, None)?;
        let freq = Int64Array::from_iter_values(frequency[start..end].iter().map(|&f| f as i64));
        Ok(RecordBatch::try_new(schema.clone(), vec![Arc::new(list), Arc::new(freq)])?)
    })
}

/// The end of the round of left sets from `at`: left sets until
/// [`PAIRS_PER_ROUND`] pairs (at least one).
fn round_end(space: &PairSpace, at: usize) -> usize {
    let mut end = at + 1;
    let mut n = space.pair_count(at..end);
    while end < space.left.len() {
        let next = space.pair_count(end..end + 1);
        if n + next > PAIRS_PER_ROUND {
            break;
        }
        n += next;
        end += 1;
    }
    end
}

/// One round of a pairs or counts level and what ran it: on the GPU (`gpu`
/// gives the label) while `backend` allows it and no round has failed there,
/// else on the CPU. A GPU failure is kept, so the later rounds go to the CPU
/// at once, and the label says why.
fn round_on<T, R: std::fmt::Display>(
    backend: &std::result::Result<(), R>,
    gpu_failed: &mut Option<String>,
    gpu: impl FnOnce() -> Result<(T, String)>,
    cpu: impl FnOnce() -> T,
) -> (T, String) {
    if backend.is_ok() && gpu_failed.is_none() {
        match gpu() {
            Ok(done) => return done,
            Err(e) => *gpu_failed = Some(e.to_string()),
        }
    }
    let why = match backend {
        Err(why) => why.to_string(),
        Ok(()) => format!("GPU failed: {}", gpu_failed.as_deref().unwrap_or_default()),
    };
    (cpu(), format!("cpu ({why})"))
}

fn counts_on_gpu(
    cfg: &SetfusionConfig,
    memory: &MemoryReservation,
    space: &PairSpace,
    inv: &std::sync::OnceLock<families::InvertedLists>,
    rows: Range<usize>,
    ts: &mut TransferStats,
) -> Result<(Vec<u32>, overlap::OverlapMethod)> {
    let g = gpu::gpu(cfg.device).map_err(crate::gpu::GpuError::from)?;
    let lease = hold_device(&g, cfg, Some(memory))?;
    overlap::counts_gpu(&lease, space, inv, rows, None, ts)
}

/// The distinct level on the device: element ids output as their keys
/// (`keys`, the domain's, ascending) `^ flip`.
fn distinct_on_gpu(
    cfg: &SetfusionConfig,
    memory: &MemoryReservation,
    space: &PairSpace,
    keys: &[u64],
    flip: u64,
    ts: &mut TransferStats,
) -> Result<(DistinctOut, usize)> {
    let g = gpu::gpu(cfg.device).map_err(crate::gpu::GpuError::from)?;
    let lease = hold_device(&g, cfg, Some(memory))?;
    families::distinct_gpu_columns(&lease, space, keys, flip, ts)
}

fn pairs_on_gpu(
    cfg: &SetfusionConfig,
    memory: &MemoryReservation,
    space: &PairSpace,
    inv: &families::InvertedLists,
    rows: Range<usize>,
    ts: &mut TransferStats,
) -> Result<PairIntersections> {
    let g = gpu::gpu(cfg.device).map_err(crate::gpu::GpuError::from)?;
    let lease = hold_device(&g, cfg, Some(memory))?;
    families::pairs_gpu_with(&lease, space, inv, rows, ts)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set blocks cover every set once, in order, none empty and none over
    /// 4,096 sets, and a few large sets give every thread a block.
    #[test]
    fn set_blocks_cover_the_sets_and_spread_large_ones() {
        let csr = |lens: &[usize]| {
            let mut o = vec![0];
            lens.iter().for_each(|l| o.push(o.last().unwrap() + l));
            o
        };
        let many_small = vec![3; 10_000];
        let few_large = vec![1_000_000; 40];
        let mixed: Vec<usize> = (0..5000).map(|i| if i % 997 == 0 { 2_000_000 } else { i % 5 }).collect();
        for lens in [&[][..], &[0][..], &[5, 0, 7][..], &many_small, &few_large, &mixed] {
            let offsets = csr(lens);
            let blocks = set_blocks(&offsets);
            let mut next = 0;
            for b in &blocks {
                assert_eq!(b.start, next);
                assert!(b.end > b.start && b.end - b.start <= 4096, "{b:?}");
                next = b.end;
            }
            assert_eq!(next, lens.len());
        }
        // Large sets spread over every thread (they were one block for one thread).
        assert!(set_blocks(&csr(&few_large)).len() >= crate::host::copy_threads().min(40));
        assert!(set_blocks(&csr(&many_small)).len() >= 3);
    }

    /// The domain holds exactly the keys of both sides, ascending, and maps
    /// each to its position: dense spans (presence bits; over 3M, several
    /// blocks of words) and sparse ones.
    #[test]
    fn the_domain_is_the_keys_of_both_sides() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for (n, span) in
            [(0usize, 10u64), (10, 5), (3000, 2000), (700_000, 100_000), (2_000_000, 3_000_000), (5000, 1 << 40)]
        {
            let a: Vec<u64> = (0..n).map(|_| 7 + rng.random_range(0..span)).collect();
            let b: Vec<u64> = (0..n / 2 + 1).map(|_| 7 + rng.random_range(0..span)).collect();
            let d = Domain::shared(&a, &b);
            let (sa, sb): (std::collections::BTreeSet<u64>, std::collections::BTreeSet<u64>) =
                (a.iter().copied().collect(), b.iter().copied().collect());
            let want: Vec<u64> = sa.intersection(&sb).copied().collect();
            assert_eq!(d.keys, want, "n = {n}, span = {span}");
            for (i, &k) in want.iter().enumerate() {
                assert_eq!(d.id(k), Some(i as u32));
            }
            assert!(a.iter().chain(&b).filter(|k| !sb.contains(k) || !sa.contains(k)).all(|&k| d.id(k).is_none()));
            assert!(d.id(6).is_none() && d.id(u64::MAX).is_none());
            // One side given twice (the self form): its own distinct keys.
            let d = Domain::shared(&a, &a);
            assert_eq!(d.keys, sa.iter().copied().collect::<Vec<_>>(), "n = {n}, span = {span}, self");
            assert!(d.keys.iter().enumerate().all(|(i, &k)| d.id(k) == Some(i as u32)));
        }
    }

    /// The device's output columns become batches of their own rows, values
    /// as the element type (an Int64's bits, or UInt64), offsets from 0.
    #[test]
    fn laid_out_columns_become_batches() {
        let c =
            DistinctColumns::from_vecs(vec![0, 1, 3, 3, 6], vec![7, u64::MAX, 2, 1, 2, 3], vec![5, 1, 2, 9]).unwrap();
        for element in [DataType::Int64, DataType::UInt64] {
            let schema = output_schema(Level::Distinct, &DataType::Int64, &DataType::Int64, &element);
            let batches = column_batches(&schema, &element, &c, 3).unwrap();
            assert_eq!(batches.iter().map(|b| b.num_rows()).collect::<Vec<_>>(), vec![3, 1]);
            let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches).unwrap().to_string();
            let minus_one = if element == DataType::Int64 { "-1" } else { "18446744073709551615" };
            for want in ["[7]", &format!("[{minus_one}, 2]"), "[]", "[1, 2, 3]"] {
                assert!(text.contains(want), "{element}: {want} in {text}");
            }
            let list = batches[1].column(0).as_list::<i32>();
            assert_eq!(list.value_offsets(), &[0, 3], "{element}: offsets start at 0 in every batch");
            assert_eq!(batches[1].column(1).as_primitive::<Int64Type>().value(0), 9);
        }
    }
}
