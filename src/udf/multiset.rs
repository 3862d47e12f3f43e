//! Multiset list functions (issue 15): `set_intersect_all`, `set_except_all`,
//! `set_union_all`, `set_symmetric_difference`, `sorted_intersect` and the
//! aggregate `set_intersect_agg`. The algorithms are in
//! [`crate::algo::multiset`].
//!
//! Rules shared by all of them:
//! * arguments are List, LargeList or FixedSizeList of integers or strings,
//!   both sides of the same class ([`sets::common_class`]); a NULL literal
//!   counts as a NULL list;
//! * lists are **multisets**: a value with m copies in `a` and n in `b`
//!   appears min(m, n) / max(m − n, 0) / max(m, n) / |m − n| times; this is
//!   unlike DataFusion's `array_intersect` / `array_union` / `array_except`,
//!   which return distinct values;
//! * NULL elements are ignored (as by `jaccard` and friends); a NULL list on
//!   either side gives NULL;
//! * the result is a List of Int64 (signed or mixed integers, or lists of
//!   NULLs only), UInt64 (unsigned integers) or Utf8 (strings), sorted
//!   ascending (strings by UTF-8 bytes), without NULL elements.
//!
//! The scalar functions sort a copy of each row's lists, except
//! `sorted_intersect`, which requires ascending lists and raises an execution
//! error naming the row otherwise (checking is linear; sorting is not).
//! `set_intersect_agg(list)` intersects every non-NULL list of a group by the
//! same min(m, n) rule (SvS, [`intersect_k`]); NULL lists are skipped and a
//! group without any non-NULL list gives NULL. Its partial state is the
//! running intersection, so it aggregates in partial and final stages.
//!
//! ## CPU or GPU (EXPLAIN cannot show a scalar function's choice)
//! Integer lists of a batch run as segmented kernels on the device
//! ([`crate::algo::multiset::list_op_gpu`]: a segmented radix sort of the
//! rows that are not ascending, then per row Balanced Path tiles for the
//! `set_*` rules (kernels/multiset.cu) or GTWJ sequence skipping for
//! `sorted_intersect` (kernels/sorted_intersect.cu), scans for the output
//! positions), else row by row on the CPU
//! ([`crate::algo::multiset::list_op_cpu`]); both give the same array and
//! the same errors. The choice is made per batch by
//! [`crate::planner::decision::list_function`] (the batch's size is known only
//! at run time):
//! * `setfusion.strategy = 'cpu'`: the CPU;
//! * `auto` (the default): the CPU when the batch's lists (both arguments)
//!   hold fewer than `setfusion.min_rows` elements, or when the cost rule
//!   [`crate::planner::cost::list_function_estimate`] prefers it (no usable
//!   device, a device still starting, a small batch: per-row CPU ~15 ns an
//!   element against the device's ~1.5 ms fixed cost plus 16 PCIe bytes an
//!   element, with the operators' 1.25 margin); `min_rows = 0` (the slt gpu
//!   mode) takes the device whenever it is usable;
//! * `hash`, `bitmap` or `sort`: the device whenever one is usable;
//! * a device out of memory hands the batch back to the CPU.
//!
//! String lists whose strings all have at most 7 bytes go to the device as
//! their inline keys (the bytes themselves, which order as the strings do;
//! made on the device from the strings' own bytes when no element is NULL,
//! [`crate::algo::list_pack`]) and the result is decoded from the keys.
//! Other string lists run as ranks on either path: the batch's distinct
//! strings are numbered in byte order ([`StringRanks`], on the host), the
//! integer rules run on the numbers (segmented kernels or per row) and the
//! result maps back; the cost rule counts the ranking on both sides.
//! `set_intersect_agg` over integers intersects on the device by the
//! session's settings ([`intersect_integer_lists`]: under `auto` from
//! [`crate::planner::decision::KWAY_GPU_MIN_ELEMENTS`] elements a batch). An aggregate's accumulator
//! sees no session settings in DataFusion 55, so [`IntersectAggSettingsRule`]
//! (an analyzer rule, which does see them) writes them into the function when
//! a query is planned.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Builder, ListBuilder, StringBuilder, UInt64Builder};
use datafusion::arrow::datatypes::{DataType, Int64Type, UInt64Type};
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::common::ScalarValue;
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::logical_expr::expr::WindowFunctionDefinition;
use datafusion::logical_expr::function::AccumulatorArgs;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, ColumnarValue, Expr, LogicalPlan, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, Volatility,
};
use datafusion::optimizer::AnalyzerRule;

use super::sets::{self, ElementClass};
use crate::algo::multiset::{
    first_descent, intersect_k, intersect_k_gpu, list_elements, list_op_cpu, multiset_op, unsorted_error, MultisetOp,
    PreparedLists, StringRanks,
};
use crate::algo::segmented::ListKey;
use crate::algo::sorted_intersect::sorted_intersect;
use crate::config::SetfusionConfig;
use crate::gpu::{self, Gpu, TransferStats};
use crate::keys::ListColumn;
use crate::util::trace;

/// The scalar functions of this module (added to [`super::functions`]).
pub fn scalar_functions() -> Vec<Arc<ScalarUDF>> {
    let mut v: Vec<Arc<ScalarUDF>> =
        MultisetOp::ALL.iter().map(|op| Arc::new(ScalarUDF::from(ListPairUdf::new(PairOp::Multiset(*op))))).collect();
    v.push(Arc::new(ScalarUDF::from(ListPairUdf::new(PairOp::SortedIntersect))));
    v
}

/// The aggregate functions of this module (registered by [`crate::install`]).
pub fn aggregate_functions() -> Vec<Arc<AggregateUDF>> {
    vec![Arc::new(AggregateUDF::from(IntersectAggUdf::new()))]
}

/// An element type the list functions compute on: i64, u64 or String.
pub trait ListElem: Ord + Clone + Debug + Send + Sync + 'static {
    /// The Arrow type list values are cast to before [`ListElem::gather`].
    fn read_type() -> DataType;
    /// The element type of result lists.
    fn result_type() -> DataType;
    /// Append the non-NULL elements of `values[start..end]` (already cast to
    /// [`ListElem::read_type`]) to `out`.
    fn gather(values: &ArrayRef, start: usize, end: usize, out: &mut Vec<Self>);
    /// A List array of the rows (None: a NULL list).
    fn build(rows: &[Option<Vec<Self>>]) -> ArrayRef;
    /// The min(m, n) intersection of ascending lists ([`intersect_k`]; integer
    /// types move large inputs to the device, see [`intersect_integer_lists`]).
    fn intersect_lists(lists: &[Vec<Self>], _settings: Option<&SetfusionConfig>) -> Vec<Self> {
        intersect_k(lists)
    }
}

/// [`intersect_k`] for integer lists: on the device ([`intersect_k_gpu`],
/// SvS with one thread per candidate) when [`crate::planner::decision::k_way`] gives one under
/// the session's settings (`settings` None, a function that was not
/// analyzed: the defaults), `auto` weighing its size and
/// the device's start; else, or when the device fails (out of memory
/// included), on the CPU. `SETFUSION_DISABLE_GPU=1` keeps it on the CPU.
pub fn intersect_integer_lists<T: ListKey>(lists: &[Vec<T>], settings: Option<&SetfusionConfig>) -> Vec<T> {
    let defaults = SetfusionConfig::default();
    let cfg = settings.unwrap_or(&defaults);
    let total: usize = lists.iter().map(|l| l.len()).sum();
    if let Ok((g, _)) = crate::planner::decision::k_way(cfg, total) {
        let lease = g.lease(cfg.memory_limit.0);
        if let Ok(v) = intersect_k_gpu(&lease, lists, &mut TransferStats::default()) {
            return v;
        }
    }
    intersect_k(lists)
}

/// `ListElem` for a primitive element type: read as `$arrow`, built with `$builder`.
macro_rules! primitive_list_elem {
    ($t:ty, $arrow:ty, $dt:ident, $builder:ty) => {
        impl ListElem for $t {
            fn read_type() -> DataType {
                DataType::$dt
            }
            fn result_type() -> DataType {
                DataType::$dt
            }
            fn gather(values: &ArrayRef, start: usize, end: usize, out: &mut Vec<Self>) {
                let p = values.as_primitive::<$arrow>();
                match p.nulls().filter(|n| n.null_count() > 0) {
                    None => out.extend_from_slice(&p.values()[start..end]),
                    Some(nb) => out.extend((start..end).filter(|&j| nb.is_valid(j)).map(|j| p.value(j))),
                }
            }
            fn build(rows: &[Option<Vec<Self>>]) -> ArrayRef {
                let mut b = ListBuilder::with_capacity(<$builder>::new(), rows.len());
                for r in rows {
                    match r {
                        None => b.append_null(),
                        Some(v) => {
                            b.values().append_slice(v);
                            b.append(true);
                        }
                    }
                }
                Arc::new(b.finish())
            }
            fn intersect_lists(lists: &[Vec<Self>], settings: Option<&SetfusionConfig>) -> Vec<Self> {
                intersect_integer_lists(lists, settings)
            }
        }
    };
}

primitive_list_elem!(i64, Int64Type, Int64, Int64Builder);
primitive_list_elem!(u64, UInt64Type, UInt64, UInt64Builder);

impl ListElem for String {
    fn read_type() -> DataType {
        DataType::LargeUtf8
    }
    fn result_type() -> DataType {
        DataType::Utf8
    }
    fn gather(values: &ArrayRef, start: usize, end: usize, out: &mut Vec<Self>) {
        let s = values.as_string::<i64>();
        out.extend((start..end).filter(|&j| s.is_valid(j)).map(|j| s.value(j).to_owned()));
    }
    fn build(rows: &[Option<Vec<Self>>]) -> ArrayRef {
        let mut b = ListBuilder::with_capacity(StringBuilder::new(), rows.len());
        for r in rows {
            match r {
                None => b.append_null(),
                Some(v) => {
                    for x in v {
                        b.values().append_value(x);
                    }
                    b.append(true);
                }
            }
        }
        Arc::new(b.finish())
    }
}

/// The result type of a list function whose arguments have element class `class`.
pub fn result_list_type(class: ElementClass) -> DataType {
    let elem = match class {
        ElementClass::Null | ElementClass::Signed => i64::result_type(),
        ElementClass::Unsigned => u64::result_type(),
        ElementClass::String => String::result_type(),
    };
    DataType::new_list(elem, true)
}

/// Row `i`'s non-NULL elements of `column` into `out` (cleared first); false
/// for a NULL list.
fn list_row<T: ListElem>(column: &ListColumn, i: usize, out: &mut Vec<T>) -> bool {
    out.clear();
    let Some(values) = &column.values else { return false };
    if !column.is_valid(i) {
        return false;
    }
    let (start, end) = column.ranges[i];
    T::gather(values, start, end, out);
    true
}

/// What a two-list function computes (the algorithm layer's [`ListOp`]).
pub use crate::algo::multiset::ListOp as PairOp;

/// `set_intersect_all`, `set_except_all`, `set_union_all`,
/// `set_symmetric_difference`, `sorted_intersect`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ListPairUdf {
    op: PairOp,
    signature: Signature,
}

impl ListPairUdf {
    pub fn new(op: PairOp) -> Self {
        Self { op, signature: Signature::any(2, Volatility::Immutable) }
    }
}

impl ScalarUDFImpl for ListPairUdf {
    fn name(&self) -> &str {
        self.op.name()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        Ok(result_list_type(sets::common_class(self.name(), arg_types)?))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let arrays: Vec<ArrayRef> = args.args.iter().map(|a| a.to_array(n)).collect::<Result<_>>()?;
        let types: Vec<DataType> = arrays.iter().map(|a| a.data_type().clone()).collect();
        let (a, b) = (&arrays[0], &arrays[1]);
        let cfg = SetfusionConfig::from_options(&args.config_options);
        let out = match sets::common_class(self.name(), &types)? {
            ElementClass::Null => evaluate_pair::<i64>(self.op, a, b),
            ElementClass::Signed => evaluate_integers::<i64>(&cfg, self.op, a, b),
            ElementClass::Unsigned => evaluate_integers::<u64>(&cfg, self.op, a, b),
            ElementClass::String => evaluate_strings(&cfg, self.op, a, b),
        }?;
        Ok(ColumnarValue::Array(out))
    }
}

/// Integer lists: the segmented GPU kernels when [`crate::planner::decision::list_function`] says so,
/// else the per-row CPU twin (the same results, errors included). A device
/// that runs out of memory hands the batch back to the CPU.
fn evaluate_integers<T: ListKey>(cfg: &SetfusionConfig, op: PairOp, a: &ArrayRef, b: &ArrayRef) -> Result<ArrayRef> {
    if let Ok((g, _)) = crate::planner::decision::list_function(cfg, list_elements(a)? + list_elements(b)?, false) {
        // The host's share before the device is taken (partitions pack their batches in
        // parallel); a batch it cannot pack (a cast the CPU twin refuses too, no pinned
        // memory) goes to the CPU twin, which answers or words the error.
        let packing = Instant::now();
        if let Ok(prepared) = PreparedLists::new::<T>(&g, op, a, b) {
            match run_prepared::<T>(&g, cfg, prepared, packing) {
                Err(e) if gpu::is_out_of_memory(&e) => {}
                other => return other,
            }
        }
    }
    list_op_cpu::<T>(op, a, b)
}

/// String lists: ranked ([`StringRanks`]: the batch's distinct strings
/// numbered in byte order, one hash lookup per element), then the integer
/// rules on the ranks, on the device when [`crate::planner::decision::list_function`] says so (a device
/// error hands the batch to the CPU) or per row on the CPU, and the ranks
/// mapped back to strings. Sorting and merging numbers is ~2x faster than
/// sorting and merging strings, so the CPU path ranks too. An unsorted
/// `sorted_intersect` row fails through the per-row path on the strings
/// themselves, which words the error with them (the rules on ranks find the
/// same row).
fn evaluate_strings(cfg: &SetfusionConfig, op: PairOp, a: &ArrayRef, b: &ArrayRef) -> Result<ArrayRef> {
    let null_typed = [a, b].iter().any(|x| x.data_type() == &DataType::Null);
    if null_typed {
        return evaluate_pair::<String>(op, a, b); // every row NULL
    }
    let elements = list_elements(a)? + list_elements(b)?;
    let mut chosen = crate::planner::decision::list_function(cfg, elements, true).ok();
    let packing = Instant::now(); // (the traced packing includes the strings' length check)
    if let (Some((g, _)), true) = (&chosen, crate::algo::list_pack::strings_fit_inline(a, b)?) {
        // Short strings go to the device as their inline keys, packed straight from the
        // strings (no ranking, no intermediate lists); a failure leaves them to the CPU.
        if let Ok(prepared) = PreparedLists::new::<u64>(g, op, a, b) {
            if prepared.is_unsorted() {
                return evaluate_pair::<String>(op, a, b); // the string path words the error
            }
            // The strings are built after the device is given back.
            if let Ok(keys) = run_prepared::<u64>(g, cfg, prepared, packing) {
                let building = Instant::now();
                let out = StringRanks::inline_strings(&keys);
                if crate::env::trace() {
                    trace(&format!("list batch: strings built in {:.2} ms", ms(building.elapsed())));
                }
                return out;
            }
        }
        chosen = None;
    }
    let ranked = StringRanks::new(a, b)?;
    let device = chosen.and_then(|(g, _)| {
        let packing = Instant::now();
        let prepared = PreparedLists::new::<u64>(&g, op, &ranked.a, &ranked.b).ok()?;
        run_prepared::<u64>(&g, cfg, prepared, packing).ok()
    });
    let out = match device {
        Some(out) => Ok(out),
        None => list_op_cpu::<u64>(op, &ranked.a, &ranked.b),
    };
    match out {
        Ok(out) => ranked.strings(&out),
        Err(_) if op == PairOp::SortedIntersect => evaluate_pair::<String>(op, a, b),
        Err(e) => Err(e),
    }
}

/// A packed batch's device part under a lease of the device, its copies
/// queued before the lease where the budget allows, the device given back
/// before the caller builds anything from the result. With SETFUSION_TRACE,
/// one line a batch: how long packing (since `packing`), waiting for the
/// device and holding it took.
fn run_prepared<T: ListKey>(
    g: &Gpu,
    cfg: &SetfusionConfig,
    mut prepared: PreparedLists,
    packing: Instant,
) -> Result<ArrayRef> {
    let packed = packing.elapsed();
    let mut stats = TransferStats::default();
    if cfg.memory_limit.0 == 0 {
        // The batch's copies overlap the kernels of the batch that holds the device (only
        // under the default budget: they are charged before the lease sets the session's).
        prepared.upload_ahead(g, &mut stats);
    }
    let waiting = Instant::now();
    let lease = g.lease(cfg.memory_limit.0);
    let (waited, holding) = (waiting.elapsed(), Instant::now());
    let out = prepared.run::<T>(&lease, &mut stats);
    drop(lease);
    if crate::env::trace() {
        trace(&format!(
            "list batch: packed {:.2} ms, waited {:.2} ms, held the device {:.2} ms \
             (to device {:.1} MB in {:.2} ms, kernels {:.2} ms, to host {:.1} MB in {:.2} ms)",
            ms(packed),
            ms(waited),
            ms(holding.elapsed()),
            stats.bytes_to_device as f64 / 1e6,
            ms(stats.to_device),
            ms(stats.kernel),
            stats.bytes_to_host as f64 / 1e6,
            ms(stats.to_host)
        ));
    }
    out
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The per-row CPU path of the two-list functions.
fn evaluate_pair<T: ListElem>(op: PairOp, a: &ArrayRef, b: &ArrayRef) -> Result<ArrayRef> {
    let (ca, cb) = (ListColumn::new(a, &T::read_type())?, ListColumn::new(b, &T::read_type())?);
    let mut rows: Vec<Option<Vec<T>>> = Vec::with_capacity(a.len());
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for i in 0..a.len() {
        let (valid_a, valid_b) = (list_row(&ca, i, &mut x), list_row(&cb, i, &mut y));
        if !(valid_a && valid_b) {
            rows.push(None);
            continue;
        }
        rows.push(Some(match op {
            PairOp::Multiset(m) => {
                x.sort_unstable();
                y.sort_unstable();
                multiset_op(m, &x, &y)
            }
            PairOp::SortedIntersect => {
                check_ascending(op.name(), "first", i, &x)?;
                check_ascending(op.name(), "second", i, &y)?;
                sorted_intersect(&x, &y)
            }
        }));
    }
    Ok(T::build(&rows))
}

fn check_ascending<T: ListElem>(func: &str, which: &str, row: usize, v: &[T]) -> Result<()> {
    match first_descent(v) {
        None => Ok(()),
        Some(k) => Err(unsorted_error(func, which, row, v, k)),
    }
}

/// `set_intersect_agg(list)`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct IntersectAggUdf {
    signature: Signature,
    /// The session's settings, written by [`IntersectAggSettingsRule`] (an
    /// accumulator sees none in DataFusion 55). None, a function that was not
    /// analyzed (a plan built by hand, or decoded on a Ballista executor,
    /// where only the name travels): the defaults.
    settings: Option<SetfusionConfig>,
}

impl IntersectAggUdf {
    pub fn new() -> Self {
        Self { signature: Signature::any(1, Volatility::Immutable), settings: None }
    }

    /// The function deciding with `settings`.
    pub fn with_settings(settings: SetfusionConfig) -> Self {
        Self { settings: Some(settings), ..Self::new() }
    }

    pub fn settings(&self) -> Option<&SetfusionConfig> {
        self.settings.as_ref()
    }
}

/// Writes the session's settings into every `set_intersect_agg` of a plan
/// (aggregates and window aggregates, subqueries included), where its
/// accumulators find them.
#[derive(Debug, Default)]
pub struct IntersectAggSettingsRule;

impl AnalyzerRule for IntersectAggSettingsRule {
    fn analyze(&self, plan: LogicalPlan, config: &ConfigOptions) -> Result<LogicalPlan> {
        let settings = SetfusionConfig::from_options(config);
        let func = Arc::new(AggregateUDF::from(IntersectAggUdf::with_settings(settings)));
        let ours = |f: &AggregateUDF| (f.inner().as_ref() as &dyn std::any::Any).is::<IntersectAggUdf>();
        plan.transform_up_with_subqueries(|node| {
            node.map_expressions(|e| {
                e.transform_up(|e| {
                    Ok(match e {
                        Expr::AggregateFunction(mut f) if ours(&f.func) => {
                            f.func = func.clone();
                            Transformed::yes(Expr::AggregateFunction(f))
                        }
                        Expr::WindowFunction(mut w) if matches!(&w.fun, WindowFunctionDefinition::AggregateUDF(f) if ours(f)) => {
                            w.fun = WindowFunctionDefinition::AggregateUDF(func.clone());
                            Transformed::yes(Expr::WindowFunction(w))
                        }
                        e => Transformed::no(e),
                    })
                })
            })
        })
        .data()
    }

    fn name(&self) -> &str {
        "setfusion_intersect_agg_settings"
    }
}

impl Default for IntersectAggUdf {
    fn default() -> Self {
        Self::new()
    }
}

impl AggregateUDFImpl for IntersectAggUdf {
    fn name(&self) -> &str {
        "set_intersect_agg"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        Ok(result_list_type(sets::common_class(self.name(), arg_types)?))
    }

    // The default state field (the return type, renamed) is the running
    // intersection: a NULL state means the partition saw no non-NULL list.

    fn accumulator(&self, acc_args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let types: Vec<DataType> = acc_args.expr_fields.iter().map(|f| f.data_type().clone()).collect();
        let settings = self.settings.clone();
        Ok(match sets::common_class(self.name(), &types)? {
            ElementClass::Null | ElementClass::Signed => Box::new(IntersectAccumulator::<i64>::new(settings.clone())),
            ElementClass::Unsigned => Box::new(IntersectAccumulator::<u64>::new(settings.clone())),
            ElementClass::String => Box::new(IntersectAccumulator::<String>::new(settings)),
        })
    }
}

/// The running min(m, n) intersection of a group's non-NULL lists, sorted.
#[derive(Debug)]
struct IntersectAccumulator<T> {
    /// None until the first non-NULL list.
    running: Option<Vec<T>>,
    settings: Option<SetfusionConfig>,
}

impl<T> IntersectAccumulator<T> {
    fn new(settings: Option<SetfusionConfig>) -> Self {
        Self { running: None, settings }
    }
}

impl<T> Default for IntersectAccumulator<T> {
    fn default() -> Self {
        Self::new(None)
    }
}

impl<T: ListElem> IntersectAccumulator<T> {
    /// Intersect every non-NULL list of `array` (input rows or partial
    /// states alike) into the running intersection, by SvS over the batch.
    fn absorb(&mut self, array: &ArrayRef) -> Result<()> {
        if self.running.as_ref().is_some_and(|r| r.is_empty()) {
            return Ok(()); // Nothing can come back into an empty intersection.
        }
        let column = ListColumn::new(array, &T::read_type())?;
        let mut lists: Vec<Vec<T>> = self.running.take().into_iter().collect();
        for i in 0..array.len() {
            let mut list = Vec::new();
            if list_row(&column, i, &mut list) {
                list.sort_unstable();
                lists.push(list);
            }
        }
        if !lists.is_empty() {
            self.running = Some(T::intersect_lists(&lists, self.settings.as_ref()));
        }
        Ok(())
    }
}

impl<T: ListElem> Accumulator for IntersectAccumulator<T> {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.absorb(&values[0])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        self.absorb(&states[0])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let list = T::build(std::slice::from_ref(&self.running));
        ScalarValue::try_from_array(&list, 0)
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![self.evaluate()?])
    }

    fn size(&self) -> usize {
        // Approximate for strings (their heap bytes are not counted).
        std::mem::size_of_val(self) + self.running.as_ref().map_or(0, |r| r.capacity() * std::mem::size_of::<T>())
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::ListArray;

    use super::*;
    use crate::config::Strategy;

    fn int_lists(rows: &[Option<Vec<Option<i64>>>]) -> ArrayRef {
        Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(rows.iter().cloned()))
    }

    #[test]
    fn pair_rows_and_nulls() {
        let a = int_lists(&[Some(vec![Some(3), Some(1), Some(1), None]), None, Some(vec![])]);
        let b = int_lists(&[Some(vec![Some(1), Some(3), Some(3)]), Some(vec![Some(1)]), Some(vec![Some(2)])]);
        let out = evaluate_pair::<i64>(PairOp::Multiset(MultisetOp::UnionAll), &a, &b).unwrap();
        let want = int_lists(&[Some(vec![Some(1), Some(1), Some(3), Some(3)]), None, Some(vec![Some(2)])]);
        assert_eq!(&out, &want);
    }

    #[test]
    fn sorted_intersect_rejects_unsorted_rows() {
        let a = int_lists(&[Some(vec![Some(1), Some(2)]), Some(vec![Some(5), Some(4)])]);
        let b = int_lists(&[Some(vec![Some(2)]), Some(vec![Some(4)])]);
        let err = evaluate_pair::<i64>(PairOp::SortedIntersect, &a, &b).unwrap_err().to_string();
        assert!(err.contains("first argument's list in row 1") && err.contains("5 comes before 4"), "{err}");
    }

    /// String lists through ranks: the integer rules on ranks (CPU twin, and
    /// the device when there is one) give the per-row string path's answer,
    /// with NULL lists, NULL elements, empty rows and shared strings; forced
    /// to the device, an unsorted `sorted_intersect` row fails with the
    /// string path's words.
    #[test]
    fn string_lists_by_rank_match_the_string_path() {
        use crate::algo::multiset::{list_op_gpu, random_string_list_column, ListOp};
        use rand::SeedableRng;
        let gpu = crate::gpu::test_gpu();
        let stats = &mut TransferStats::default();
        let mut rng = rand::rngs::StdRng::seed_from_u64(1717);
        let union = PairOp::Multiset(MultisetOp::UnionAll);
        // Short strings take the inline keys; a long one sends the batch to the ranks; NUL bytes
        // and empty strings test the inline keys' tie on padding.
        let spellings: [fn(&str) -> String; 3] = [
            |s| s.to_string(),
            |s| if s.ends_with('3') { format!("élément n° {s}") } else { s.to_string() },
            |s| s.replace('1', "\0").replace('2', ""),
        ];
        for (domain, spell) in [1i64, 7, 300, 100_000].into_iter().flat_map(|d| spellings.iter().map(move |f| (d, f))) {
            for op in ListOp::ALL {
                let mut a = respell(&random_string_list_column(&mut rng, 200, 40, domain, true), *spell);
                let mut b = respell(&random_string_list_column(&mut rng, 200, 40, domain, true), *spell);
                if op == PairOp::SortedIntersect {
                    // a ∪ a is a sorted (NULL elements dropped).
                    a = evaluate_pair::<String>(union, &a, &a).unwrap();
                    b = evaluate_pair::<String>(union, &b, &b).unwrap();
                }
                let want = evaluate_pair::<String>(op, &a, &b).unwrap();
                let ranked = StringRanks::new(&a, &b).unwrap();
                let cpu = ranked.strings(&list_op_cpu::<u64>(op, &ranked.a, &ranked.b).unwrap()).unwrap();
                assert_eq!(cpu.to_data(), want.to_data(), "{op:?}, domain {domain}: ranks on the CPU twin");
                if let Some(g) = &gpu {
                    let _lock = g.lock_blocking();
                    let got = ranked.strings(&list_op_gpu::<u64>(g, op, &ranked.a, &ranked.b, stats).unwrap()).unwrap();
                    assert_eq!(got.to_data(), want.to_data(), "{op:?}, domain {domain}: ranks on the GPU");
                    if crate::algo::list_pack::strings_fit_inline(&a, &b).unwrap() {
                        // Packed straight from the strings, as evaluate_strings does.
                        let keys = list_op_gpu::<u64>(g, op, &a, &b, stats).unwrap();
                        let got = StringRanks::inline_strings(&keys).unwrap();
                        assert_eq!(got.to_data(), want.to_data(), "{op:?}, domain {domain}: inline keys on the GPU");
                    }
                }
            }
        }
        // The function itself, the device forced: short strings (inline keys, raw without NULL
        // elements, packed with them) and long ones (refused by the packing, then ranked).
        let forced = SetfusionConfig { strategy: Strategy::Sort, ..SetfusionConfig::default() };
        for (null_elements, spell) in
            [(false, spellings[0]), (true, spellings[0]), (false, spellings[1]), (true, spellings[1])]
        {
            let a = respell(&random_string_list_column(&mut rng, 50, 20, 30, null_elements), spell);
            let b = respell(&random_string_list_column(&mut rng, 50, 20, 30, null_elements), spell);
            for op in ListOp::ALL {
                match (evaluate_strings(&forced, op, &a, &b), evaluate_pair::<String>(op, &a, &b)) {
                    (Ok(got), Ok(want)) => assert_eq!(got.to_data(), want.to_data(), "{op:?} forced"),
                    (Err(got), Err(want)) => assert_eq!(got.to_string(), want.to_string(), "{op:?} forced"),
                    (got, want) => panic!("{op:?} forced: {got:?} against {want:?}"),
                }
            }
        }
    }

    /// A List<Utf8> column with every string mapped by `f`.
    fn respell(col: &ArrayRef, f: fn(&str) -> String) -> ArrayRef {
        use datafusion::arrow::array::StringArray;
        let l = col.as_list::<i32>();
        let values: StringArray = l.values().as_string::<i32>().iter().map(|v| v.map(f)).collect();
        let field = Arc::new(datafusion::arrow::datatypes::Field::new_list_field(DataType::Utf8, true));
        Arc::new(
            datafusion::arrow::array::ListArray::try_new(
                field,
                l.offsets().clone(),
                Arc::new(values),
                l.nulls().cloned(),
            )
            .unwrap(),
        )
    }

    /// Inline keys order as the bytes do, and decode to them.
    #[test]
    fn inline_string_keys_order_as_bytes() {
        use crate::algo::multiset::{inline_bytes, inline_key};
        let mut words: Vec<&[u8]> =
            vec![b"", b"\0", b"\0\0", b"a", b"a\0", b"a\0\0", b"ab", b"abc", b"abcdefg", b"b", b"\xff", b"zz\xff\xff"];
        words.sort();
        let keys: Vec<u64> = words.iter().map(|w| inline_key(w)).collect();
        assert!(keys.windows(2).all(|k| k[0] < k[1]), "{keys:x?}");
        let mut buf = [0u8; 8];
        for (w, k) in words.iter().zip(&keys) {
            assert_eq!(inline_bytes(*k, &mut buf), *w);
        }
    }

    #[tokio::test]
    async fn the_session_settings_reach_set_intersect_agg() {
        use datafusion::common::tree_node::TreeNodeRecursion;
        let ctx = crate::context();
        ctx.sql("SET setfusion.strategy = 'cpu'").await.unwrap();
        ctx.sql("SET setfusion.min_rows = 7").await.unwrap();
        let q = "SELECT set_intersect_agg(l) AS i FROM (VALUES ([3, 1, 2, 2]), ([2, 3, 2])) t(l)";
        let plan = ctx.sql(q).await.unwrap().into_optimized_plan().unwrap();
        let mut found = Vec::new();
        plan.apply_with_subqueries(|p| {
            for e in p.expressions() {
                e.apply(|e| {
                    if let Expr::AggregateFunction(f) = e {
                        let udf = (f.func.inner().as_ref() as &dyn std::any::Any).downcast_ref::<IntersectAggUdf>();
                        found.push(udf.and_then(|u| u.settings().cloned()));
                    }
                    Ok(TreeNodeRecursion::Continue)
                })?;
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .unwrap();
        let want = SetfusionConfig { strategy: Strategy::Cpu, min_rows: 7, ..SetfusionConfig::default() };
        assert_eq!(found, vec![Some(want)], "{plan}");
        let batches = ctx.sql(q).await.unwrap().collect().await.unwrap();
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches).unwrap().to_string();
        assert!(text.contains("[2, 2, 3]"), "{text}");
    }

    #[test]
    fn accumulator_merges_partial_states() {
        let mut p1 = IntersectAccumulator::<i64>::default();
        p1.update_batch(&[int_lists(&[Some(vec![Some(1), Some(1), Some(2), Some(3)]), None])]).unwrap();
        let mut p2 = IntersectAccumulator::<i64>::default();
        p2.update_batch(&[int_lists(&[None])]).unwrap();
        let mut p3 = IntersectAccumulator::<i64>::default();
        p3.update_batch(&[int_lists(&[Some(vec![Some(3), Some(1), Some(1)])])]).unwrap();
        let states: Vec<ScalarValue> =
            [&mut p1, &mut p2, &mut p3].into_iter().map(|p| p.state().unwrap().remove(0)).collect();
        assert!(states[1].is_null(), "no non-NULL list: NULL state");
        let mut fin = IntersectAccumulator::<i64>::default();
        fin.merge_batch(&[ScalarValue::iter_to_array(states).unwrap()]).unwrap();
        let got = fin.evaluate().unwrap();
        let want = ScalarValue::try_from_array(&int_lists(&[Some(vec![Some(1), Some(1), Some(3)])]), 0).unwrap();
        assert_eq!(got, want);
        assert!(IntersectAccumulator::<i64>::default().evaluate().unwrap().is_null());
    }
}
