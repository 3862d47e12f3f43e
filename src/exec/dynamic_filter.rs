//! Dynamic filters that setfusion's two-input operators publish into one of
//! their inputs, as DataFusion's `HashJoinExec` does (DataFusion 55,
//! `joins/hash_join/shared_bounds.rs`).
//!
//! During the post-optimization filter pushdown, an operator offers a
//! `DynamicFilterPhysicalExpr` over the key expressions of its *filtered*
//! input; a scan below (Parquet) that accepts it prunes row groups, pages and,
//! with `parquet.pushdown_filters`, rows with it. At run time the operator
//! first collects its *source* input, then publishes from the source's keys
//! (the filter is complete before the filtered input is first polled, so a scan
//! never sees an unfinished filter and nothing waits on anything):
//!
//! - bounds: `key >= min AND key <= max` per key column;
//! - membership: `key IN (v1, ..)` over the source's distinct keys when they
//!   are few (`optimizer.hash_join_inlist_pushdown_max_size` bytes and
//!   `hash_join_inlist_pushdown_max_distinct_values` values, DataFusion's
//!   limits), one key column only (DataFusion also uses a hash-table lookup
//!   for larger sides and a struct IN list for several columns; setfusion's
//!   keys are not a DataFusion hash table, so those publish bounds only);
//! - NULLs: where a filtered row with a NULL key can still matter (NULLs
//!   equal and the source holds a NULL, or a NOT IN's subquery side),
//!   `key IS NULL OR ...` keeps it, as DataFusion's `preserve_probe_nulls`.
//!
//! The filter drops only rows that cannot change the operator's answer: the
//! operator decides which input is filtered ([`FilteredInput`]) and never
//! filters the rows an anti join / EXCEPT keeps. Key columns whose equality
//! is not the filter's comparison (floats: setfusion's -0.0 = 0.0 and NaN =
//! NaN; dictionaries, nested types) or whose two sides differ in type are
//! left out of the filter; with none left, no filter is offered.

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, RecordBatch, UInt32Array};
use datafusion::arrow::compute::{concat, take};
use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::functions_aggregate::min_max::{MaxAccumulator, MinAccumulator};
use datafusion::logical_expr::{Accumulator, Operator};
use datafusion::physical_expr::expressions::{lit, BinaryExpr, DynamicFilterPhysicalExpr, InListExpr, IsNullExpr};
use datafusion::physical_expr::{PhysicalExpr, PhysicalExprRef};
use datafusion::physical_plan::filter_pushdown::{
    ChildFilterDescription, ChildPushdownResult, FilterDescription, FilterPushdownPhase, FilterPushdownPropagation,
};
use datafusion::physical_plan::ExecutionPlan;

/// Which input of a two-input operator a dynamic filter prunes (by child index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilteredInput {
    /// Child 0: the probe / kept side, filtered by the build side's keys.
    Probe,
    /// Child 1: the build / looked-up side, filtered by the probe side's keys.
    Build,
}

impl FilteredInput {
    pub fn child_index(self) -> usize {
        match self {
            FilteredInput::Probe => 0,
            FilteredInput::Build => 1,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            FilteredInput::Probe => "probe",
            FilteredInput::Build => "build",
        }
    }
}

/// When the filter keeps filtered rows whose key is NULL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepNulls {
    /// A NULL key matches nothing: such rows cannot matter.
    Never,
    /// NULLs are equal: a NULL key matters when the source holds a NULL.
    WhenSourceHasNull,
    /// Always (the subquery side of a NOT IN: one NULL there decides every row).
    Always,
}

/// The plan of an operator's dynamic filter: which input, on which key
/// columns (source key, filtered key), and the NULL rule.
#[derive(Debug, Clone)]
pub struct KeyFilterPlan {
    pub input: FilteredInput,
    /// (source key, filtered key) pairs of equal type that the filter compares.
    pub keys: Vec<(PhysicalExprRef, PhysicalExprRef)>,
    pub nulls: KeepNulls,
}

/// A published (or to-be-published) filter: the plan and the expression the
/// filtered input's scan holds.
#[derive(Debug, Clone)]
pub struct DynamicKeyFilter {
    pub plan: KeyFilterPlan,
    pub filter: Arc<DynamicFilterPhysicalExpr>,
}

/// Whether comparisons and IN lists on this type are the operator's key
/// equality (and Parquet statistics order it).
fn comparable(t: &DataType) -> bool {
    use DataType::*;
    t.is_integer()
        || matches!(
            t,
            Boolean
                | Decimal32(..)
                | Decimal64(..)
                | Decimal128(..)
                | Decimal256(..)
                | Date32
                | Date64
                | Timestamp(..)
                | Time32(_)
                | Time64(_)
                | Utf8
                | LargeUtf8
                | Utf8View
                | Binary
                | LargeBinary
                | BinaryView
                | FixedSizeBinary(_)
        )
}

impl KeyFilterPlan {
    /// The plan for filtering `filtered` (child `input`) by `source`'s keys:
    /// the key pairs of one comparable type on both sides; None when there
    /// is none.
    pub fn new(
        input: FilteredInput,
        source: &Arc<dyn ExecutionPlan>,
        filtered: &Arc<dyn ExecutionPlan>,
        source_keys: &[PhysicalExprRef],
        filtered_keys: &[PhysicalExprRef],
        nulls: KeepNulls,
    ) -> Option<Self> {
        let (ss, fs) = (source.schema(), filtered.schema());
        let keys: Vec<_> = source_keys
            .iter()
            .zip(filtered_keys)
            .filter(|(s, f)| match (s.data_type(&ss), f.data_type(&fs)) {
                (Ok(a), Ok(b)) => a == b && comparable(&a),
                _ => false,
            })
            .map(|(s, f)| (s.clone(), f.clone()))
            .collect();
        (!keys.is_empty()).then_some(Self { input, keys, nulls })
    }

    fn filtered_keys(&self) -> Vec<PhysicalExprRef> {
        self.keys.iter().map(|(_, f)| f.clone()).collect()
    }
}

/// Is the join dynamic filter pushdown on in this session (DataFusion's own switch)?
pub fn enabled(config: &ConfigOptions) -> bool {
    config.optimizer.enable_join_dynamic_filter_pushdown
}

/// `ExecutionPlan::gather_filters_for_pushdown` of an operator with two
/// children that passes no parent filter down and, in the post phase, offers
/// `plan`'s dynamic filter to its filtered child (unless it holds one already).
pub fn gather(
    phase: FilterPushdownPhase,
    parent_filters: Vec<Arc<dyn PhysicalExpr>>,
    config: &ConfigOptions,
    plan: Option<&KeyFilterPlan>,
    current: Option<&DynamicKeyFilter>,
) -> Result<FilterDescription> {
    let mut described = [
        ChildFilterDescription::all_unsupported(&parent_filters),
        ChildFilterDescription::all_unsupported(&parent_filters),
    ];
    if let (FilterPushdownPhase::Post, Some(plan), None, true) = (phase, plan, current, enabled(config)) {
        let filter = Arc::new(DynamicFilterPhysicalExpr::new(plan.filtered_keys(), lit(true)));
        let i = plan.input.child_index();
        described[i] = described[i].clone().with_self_filter(filter);
    }
    let [a, b] = described;
    Ok(FilterDescription::new().with_child(a).with_child(b))
}

/// The dynamic filter a child accepted (as `handle_child_pushdown_result`
/// sees it): DataFusion keeps it whether or not a scan said it evaluates it
/// fully (statistics pruning uses it either way).
pub fn accepted(result: &ChildPushdownResult, plan: Option<&KeyFilterPlan>) -> Option<DynamicKeyFilter> {
    let plan = plan?;
    let predicate = result.self_filters.get(plan.input.child_index())?.first()?.predicate.clone();
    let filter = (predicate as Arc<dyn std::any::Any + Send + Sync>).downcast::<DynamicFilterPhysicalExpr>().ok()?;
    Some(DynamicKeyFilter { plan: plan.clone(), filter })
}

/// `handle_child_pushdown_result`'s answer: the node with the accepted filter, if any.
pub fn propagate(
    result: ChildPushdownResult,
    updated: Option<Arc<dyn ExecutionPlan>>,
) -> FilterPushdownPropagation<Arc<dyn ExecutionPlan>> {
    let propagation = FilterPushdownPropagation::if_any(result);
    match updated {
        Some(node) => propagation.with_updated_node(node),
        None => propagation,
    }
}

impl DynamicKeyFilter {
    /// Does `filtered` (the filtered child) hold this filter, so that computing it is worth it?
    pub fn is_used_by(&self, filtered: &Arc<dyn ExecutionPlan>) -> Result<bool> {
        let Some(id) = self.filter.expression_id() else { return Ok(false) };
        let mut found = false;
        filtered.apply(|node| {
            node.apply_expressions(&mut |root| {
                root.apply(|e| {
                    found |= e.expression_id() == Some(id);
                    Ok(if found { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
                })
            })?;
            Ok(if found { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
        })?;
        Ok(found)
    }

    /// Compute the filter from the source input's batches, publish it and mark
    /// it complete. An empty source leaves the filter `true`, as DataFusion does.
    /// Each execution publishes before its filtered input is read, so a plan
    /// executed again (a recursive query's step) never reads with an earlier
    /// execution's filter: an empty source then resets it to `true`.
    pub fn publish(&self, source: &[&RecordBatch], filtered_schema: &Schema, config: &ConfigOptions) -> Result<()> {
        let rows: usize = source.iter().map(|b| b.num_rows()).sum();
        if rows > 0 {
            let expr = self.expression(source, filtered_schema, config)?;
            self.filter.update(expr)?;
        } else if self.filter.snapshot_generation() > 1 {
            self.filter.update(lit(true))?;
        }
        self.filter.mark_complete();
        Ok(())
    }

    /// Mark the filter complete without narrowing it (the source could not be read).
    pub fn give_up(&self) {
        self.filter.mark_complete();
    }

    fn expression(
        &self,
        source: &[&RecordBatch],
        filtered_schema: &Schema,
        config: &ConfigOptions,
    ) -> Result<PhysicalExprRef> {
        let mut predicates: Vec<PhysicalExprRef> = vec![];
        let mut source_has_null = false;
        let mut columns: Vec<Vec<ArrayRef>> = vec![];
        for (source_key, filtered_key) in &self.plan.keys {
            let arrays: Vec<ArrayRef> =
                source.iter().map(|b| source_key.evaluate(b)?.into_array(b.num_rows())).collect::<Result<_>>()?;
            source_has_null |= arrays.iter().any(|a| a.null_count() > 0);
            let data_type = source_key.data_type(&source[0].schema())?;
            let (mut min, mut max) = (MinAccumulator::try_new(&data_type)?, MaxAccumulator::try_new(&data_type)?);
            for a in &arrays {
                min.update_batch(std::slice::from_ref(a))?;
                max.update_batch(std::slice::from_ref(a))?;
            }
            let ge: PhysicalExprRef =
                Arc::new(BinaryExpr::new(filtered_key.clone(), Operator::GtEq, lit(min.evaluate()?)));
            let le: PhysicalExprRef =
                Arc::new(BinaryExpr::new(filtered_key.clone(), Operator::LtEq, lit(max.evaluate()?)));
            predicates.push(Arc::new(BinaryExpr::new(ge, Operator::And, le)));
            columns.push(arrays);
        }
        if let [arrays] = columns.as_slice() {
            if let Some(list) = membership(&self.plan.keys[0].1, arrays, filtered_schema, config)? {
                predicates.push(list);
            }
        }
        let mut expr = predicates
            .into_iter()
            .reduce(|a, b| Arc::new(BinaryExpr::new(a, Operator::And, b)) as PhysicalExprRef)
            .unwrap_or_else(|| lit(true));
        let keep_nulls = match self.plan.nulls {
            KeepNulls::Never => false,
            KeepNulls::WhenSourceHasNull => source_has_null,
            KeepNulls::Always => true,
        };
        if keep_nulls {
            let mut any_null: Option<PhysicalExprRef> = None;
            for (_, key) in &self.plan.keys {
                if key.nullable(filtered_schema)? {
                    let is_null: PhysicalExprRef = Arc::new(IsNullExpr::new(key.clone()));
                    any_null = Some(match any_null {
                        Some(acc) => Arc::new(BinaryExpr::new(acc, Operator::Or, is_null)) as PhysicalExprRef,
                        None => is_null,
                    });
                }
            }
            if let Some(any_null) = any_null {
                expr = Arc::new(BinaryExpr::new(any_null, Operator::Or, expr));
            }
        }
        Ok(expr)
    }
}

/// `key IN (distinct non-NULL source keys)` when they are few enough by
/// DataFusion's limits for its IN-list pushdown; None otherwise.
fn membership(
    key: &PhysicalExprRef,
    arrays: &[ArrayRef],
    schema: &Schema,
    config: &ConfigOptions,
) -> Result<Option<PhysicalExprRef>> {
    let size: usize = arrays.iter().map(|a| a.get_array_memory_size()).sum();
    if arrays.is_empty() || size > config.optimizer.hash_join_inlist_pushdown_max_size {
        return Ok(None);
    }
    let refs: Vec<&dyn Array> = arrays.iter().map(|a| a.as_ref()).collect();
    let all = concat(&refs)?;
    let converter = RowConverter::new(vec![SortField::new(all.data_type().clone())])?;
    let rows = converter.convert_columns(&[all.clone()])?;
    let mut seen = HashSet::new();
    let mut distinct = vec![];
    for i in 0..all.len() {
        if all.is_valid(i) && seen.insert(rows.row(i)) {
            if distinct.len() == config.optimizer.hash_join_inlist_pushdown_max_distinct_values {
                return Ok(None);
            }
            distinct.push(i as u32);
        }
    }
    let values = take(all.as_ref(), &UInt32Array::from(distinct), None)?;
    Ok(Some(Arc::new(InListExpr::try_new_from_array(key.clone(), values, false, schema)?)))
}

/// Two inputs' partitions, collected by `collect(input)` (0: probe, 1:
/// build): both at once; or, with `filter` in use by its filtered input, the
/// source first, then the filter published (off the runtime), then the
/// filtered input, whose scan thus starts with the complete filter, as
/// DataFusion's hash join polls its probe side only once its build side is in.
pub(crate) async fn collect_both<F, Fut>(
    filter: Option<&DynamicKeyFilter>,
    inputs: [&Arc<dyn ExecutionPlan>; 2],
    config: &ConfigOptions,
    collect: F,
) -> Result<[Vec<Vec<RecordBatch>>; 2]>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<Vec<RecordBatch>>>>,
{
    let Some(filter) = in_use(filter, inputs, config)? else {
        let (a, b) = futures::try_join!(collect(0), collect(1))?;
        return Ok([a, b]);
    };
    let filtered = filter.plan.input.child_index();
    let source = match collect(1 - filtered).await {
        Ok(s) => s,
        Err(e) => {
            filter.give_up();
            return Err(e);
        }
    };
    let source = publish_from(filter, source, inputs[filtered].schema(), config).await?;
    let filtered_parts = collect(filtered).await?;
    Ok(if filtered == 0 { [filtered_parts, source] } else { [source, filtered_parts] })
}

/// `filter`, when dynamic filters are on and its filtered input (of
/// `inputs`, by child index) holds it; None: there is nothing to publish.
pub(crate) fn in_use(
    filter: Option<&DynamicKeyFilter>,
    inputs: [&Arc<dyn ExecutionPlan>; 2],
    config: &ConfigOptions,
) -> Result<Option<DynamicKeyFilter>> {
    Ok(match filter {
        Some(f) if enabled(config) && f.is_used_by(inputs[f.plan.input.child_index()])? => Some(f.clone()),
        _ => None,
    })
}

/// Publish `filter` from its source input's collected partitions, off the
/// runtime (given up on an error), and hand the partitions back.
pub(crate) async fn publish_from(
    filter: DynamicKeyFilter,
    source: Vec<Vec<RecordBatch>>,
    filtered_schema: datafusion::arrow::datatypes::SchemaRef,
    config: &ConfigOptions,
) -> Result<Vec<Vec<RecordBatch>>> {
    let config = config.clone();
    super::off_runtime(move || {
        let batches: Vec<&RecordBatch> = source.iter().flatten().collect();
        let published = filter.publish(&batches, &filtered_schema, &config);
        if published.is_err() {
            filter.give_up();
        }
        published.map(|_| source)
    })
    .await
}

/// `stream` cut after `fetch` rows (None: all of it).
pub(crate) fn limit_stream(
    stream: futures::stream::BoxStream<'static, Result<RecordBatch>>,
    fetch: Option<usize>,
) -> futures::stream::BoxStream<'static, Result<RecordBatch>> {
    use futures::StreamExt;
    let Some(fetch) = fetch else { return stream };
    // The input is not polled again once `fetch` rows are out.
    futures::stream::unfold((stream, fetch), |(mut stream, left)| async move {
        if left == 0 {
            return None;
        }
        match stream.next().await? {
            Ok(b) => {
                let b = if b.num_rows() > left { b.slice(0, left) } else { b };
                let left = left - b.num_rows();
                Some((Ok(b), (stream, left)))
            }
            Err(e) => Some((Err(e), (stream, 0))),
        }
    })
    .boxed()
}
