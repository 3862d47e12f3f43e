//! Physical rule: Parquet inputs of set selections read by the device.
//!
//! Runs after every other rule (the plan's shape is final). For each
//! `SemiJoinExec` / `SetOpExec` on the GPU backend that reads all its input
//! partitions at once, each input that is a Parquet scan the device can read
//! becomes a [`DeviceScanExec`]: its key column (under the input's filters,
//! which the device runs), and where its rows are output (the probe side of
//! a join that outputs columns) all its columns, which the device decodes
//! for the output (fixed-width types, no filter). A composite key of exact
//! fixed-width columns (integers, dates, short decimals) is read column by
//! column and packed by the device into one exact 64-bit key, by ranges both
//! sides share, so both sides are device scans or neither (as string keys,
//! whose hashes are proved against both sides' bytes). A Parquet input that stays
//! with DataFusion's scan gets its reason in the operator's EXPLAIN line
//! (`device_scan="..."`); inputs that are not Parquet scans, operators on the
//! CPU backend and `setfusion.device_scan = false` leave the plan as it was.
//!
//! A `MarkJoinExec` on the GPU backend whose marks come from one key
//! selection (a correlated EXISTS on one key, an uncorrelated IN; no residual
//! filter) gets its subquery side read by the device the same way, keys only.
//! Its probe side, whose every row is output with its mark, is read by the
//! device too where it can decode all its columns ([`mark_probe_scan`]).
//! Then the `FilterExec` above it (through a projection of its columns) is
//! absorbed by the join where the device can evaluate its predicate
//! ([`absorb_filter_above`]): only the rows it keeps come back from the device.
//!
//! An aggregate without grouping (`count`, `sum`, `min`, `max`) over a
//! selection whose kept side the device reads is absorbed by the selection
//! ([`absorb_aggregate_above`]): the device reduces the kept rows' columns,
//! and only the aggregates' row comes back.

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::config::ConfigOptions;
use datafusion::datasource::physical_plan::ParquetSource;
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, Partitioning};

use super::decision::Reading;
use crate::config::SetfusionConfig;
use crate::exec::device_scan::DeviceScanExec;
use crate::exec::kept_aggregate::AggregateAbove;
use crate::exec::mark_join::MarkJoinExec;
use crate::exec::set_select::SetSelectExec;

#[derive(Debug, Default)]
pub struct DeviceScanRule;

/// One input as the rule would read it: the plan, its key, and the columns
/// it outputs (None: keys only).
pub(super) type ReadSide<'a> = (&'a Arc<dyn ExecutionPlan>, &'a PhysicalExprRef, Option<&'a [usize]>);

/// How the rule would read `sides` (every input the device may read; one key
/// each, of `key_type`), for the operator's decision, made before the rule
/// runs: whether the device reads them all (string keys need both sides), and
/// the bytes of their Parquet pages host threads inflate first (gzip, lz4:
/// `pages::inflated_on_host`) and of the ZSTD pages the device decompresses,
/// read from the files' footers.
pub(super) fn reading(cfg: &SetfusionConfig, key_type: &DataType, sides: &[ReadSide<'_>]) -> Reading {
    if !cfg.device_scan || sides.is_empty() {
        return Reading::default();
    }
    let key_type = crate::keys::key_type(key_type);
    let scans: Vec<std::result::Result<DeviceScanExec, String>> = sides
        .iter()
        .map(|(input, key, output)| DeviceScanExec::try_from_input(input, key, &key_type, *output))
        .collect();
    let strings = crate::scan::is_byte_type(&key_type);
    if let (true, Some(Err(why))) = (strings, scans.iter().find(|s| s.is_err())) {
        crate::util::trace(&format!("string keys stay with the host: {why}"));
    }
    Reading {
        device_read: strings && scans.iter().all(|s| s.is_ok()),
        // String keys are read on both sides or neither.
        device_scans: if strings { scans.iter().all(|s| s.is_ok()) } else { scans.iter().any(|s| s.is_ok()) },
        inflated: scans.iter().flatten().map(DeviceScanExec::inflated_bytes).sum(),
    }
}

/// Does the subtree read Parquet files?
fn reads_parquet(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let mut found = false;
    let _ = plan.apply(|p| {
        if p.downcast_ref::<DataSourceExec>().and_then(|d| d.downcast_to_file_source::<ParquetSource>()).is_some() {
            found = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// The device scan of a mark join's probe side (`key`: its key, of
/// `key_type`), whose every row is output with its mark: every column
/// decoded by the device, or why not. The rows come back in the order of the
/// device's keys (a filtered input's NULL keys last) and are cut into
/// partitions of consecutive rows, so an input that promises an order or a
/// hash partitioning stays with DataFusion's scan; so does one whose pages
/// host threads inflate (zstd, gzip, lz4: `pages::inflated_on_host`), which DataFusion's scan decodes as
/// fast as the device's round trip, and a filtered input whose output
/// columns may hold NULLs (the device puts only NULL-free columns in a
/// filter's order).
fn mark_probe_scan(
    probe: &Arc<dyn ExecutionPlan>,
    key: &PhysicalExprRef,
    key_type: &DataType,
) -> std::result::Result<DeviceScanExec, String> {
    if probe.output_ordering().is_some() {
        return Err("its rows are output in an order the device scan does not keep".into());
    }
    if matches!(probe.output_partitioning(), Partitioning::Hash(..)) {
        return Err("its rows are output hash-partitioned".into());
    }
    let schema = probe.schema();
    let every_column: Vec<usize> = (0..schema.fields().len()).collect();
    let scan = DeviceScanExec::try_from_input(probe, key, key_type, Some(&every_column))?;
    if scan.filter().is_some() {
        if let Some(f) = schema.fields().iter().find(|f| f.is_nullable()) {
            return Err(format!("a filtered input whose output column {} may hold NULLs", f.name()));
        }
    }
    if scan.inflated_bytes().host > 0 {
        return Err("its pages are inflated on host threads (gzip, lz4, or zstd under SETFUSION_DEVICE_ZSTD=0), where DataFusion's scan \
                    decodes them as fast"
            .into());
    }
    Ok(scan)
}

/// The node of type `T` under `node`, through projections of columns and
/// round-robin repartitions (which only move whole batches), with its column
/// under each of `node`'s columns. None: another node is in between.
fn down_to<T: ExecutionPlan>(node: &Arc<dyn ExecutionPlan>) -> Option<(Arc<dyn ExecutionPlan>, Vec<usize>)> {
    let mut node = node.clone();
    let mut columns: Vec<usize> = (0..node.schema().fields().len()).collect();
    loop {
        if node.downcast_ref::<T>().is_some() {
            return Some((node, columns));
        }
        let next = if let Some(projection) = node.downcast_ref::<ProjectionExec>() {
            let below: Option<Vec<usize>> = projection
                .projection_expr()
                .iter()
                .map(|e| e.expr.downcast_ref::<Column>().map(Column::index))
                .collect();
            let below = below?;
            columns = columns.iter().map(|&c| below[c]).collect();
            projection.input().clone()
        } else if let Some(repartition) = node.downcast_ref::<RepartitionExec>() {
            if !matches!(repartition.partitioning(), Partitioning::RoundRobinBatch(_)) || repartition.preserve_order() {
                return None;
            }
            repartition.input().clone()
        } else {
            return None;
        };
        node = next;
    }
}

/// An aggregate without grouping (`count`, `sum`, `min`, `max`) over a set
/// selection whose kept side the device reads, absorbed by the selection
/// ([`SetSelectExec::with_aggregate_above`]): the device reduces the kept
/// rows' columns where it decoded them, and nothing but the aggregates' row
/// comes back. `plan`: the aggregate's top node, `Single` over one
/// partition, or `Final` over the `Partial` one (through a
/// `CoalescePartitionsExec`). None: the plan stays (grouping, another
/// function, another input; the trace says why).
fn absorb_aggregate_above(
    plan: &Arc<dyn ExecutionPlan>,
    top: &AggregateExec,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let stays = |why: &str| {
        crate::util::trace(&format!("the aggregate above stays: {why}"));
        Ok(None)
    };
    if !top.group_expr().is_empty() {
        return stays("grouping");
    }
    // The aggregate that reads the rows: the top one, or the partial one under it.
    let partial: Arc<dyn ExecutionPlan>;
    let reading: &AggregateExec = match top.mode() {
        AggregateMode::Single if top.input().output_partitioning().partition_count() == 1 => top,
        AggregateMode::Final => {
            partial = match top.input().downcast_ref::<CoalescePartitionsExec>() {
                Some(coalesce) if coalesce.fetch().is_some() => return stays("a fetch"),
                Some(coalesce) => coalesce.input().clone(),
                None => top.input().clone(),
            };
            match partial.downcast_ref::<AggregateExec>() {
                Some(p)
                    if *p.mode() == AggregateMode::Partial
                        && p.group_expr().is_empty()
                        && p.aggr_expr().len() == top.aggr_expr().len() =>
                {
                    p
                }
                _ => return stays(&format!("{} under the final aggregate", partial.name())),
            }
        }
        // (The partial one is read from the final one above it.)
        AggregateMode::Partial => return Ok(None),
        mode => return stays(&format!("mode {mode:?}")),
    };
    let below = down_to::<SetSelectExec>(reading.input()).or_else(|| down_to::<MarkJoinExec>(reading.input()));
    let Some((node, columns)) = below else {
        return stays(&format!("{} under the aggregate", reading.input().name()));
    };
    let schema = node.schema();
    let absorbed = AggregateAbove::try_new(
        reading.aggr_expr(),
        reading.filter_expr(),
        &reading.input_schema(),
        &columns,
        &schema,
        plan.schema(),
    )
    .and_then(|above| match node.downcast_ref::<SetSelectExec>() {
        Some(selection) => selection.with_aggregate_above(plan, above).map(|n| Arc::new(n) as Arc<dyn ExecutionPlan>),
        None => match node.downcast_ref::<MarkJoinExec>() {
            Some(join) => join.with_aggregate_above(plan, above).map(|n| Arc::new(n) as Arc<dyn ExecutionPlan>),
            None => Err(format!("{} under the aggregate", node.name())),
        },
    });
    match absorbed {
        Ok(absorbed) => Ok(Some(absorbed)),
        Err(why) => stays(&why),
    }
}

/// A `FilterExec` over a mark join whose both sides the device reads
/// (directly, or through projections of columns and round-robin
/// repartitions), absorbed by
/// the join with its projection: the device evaluates the predicate over the
/// decoded probe columns and the marks, and brings back only the kept rows'
/// output columns. None: the plan stays (a fetch on the filter, another
/// input, or a predicate the device cannot evaluate; the join says which).
fn absorb_filter_above(plan: &Arc<dyn ExecutionPlan>, filter: &FilterExec) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    if filter.fetch().is_some() {
        return Ok(None);
    }
    let Some((join, columns)) = down_to::<MarkJoinExec>(filter.input()) else { return Ok(None) };
    let Some(join) = join.downcast_ref::<MarkJoinExec>() else { return Ok(None) };
    let joined = join.schema();
    let predicate = filter
        .predicate()
        .clone()
        .transform(|e| {
            Ok(match e.downcast_ref::<Column>().and_then(|c| columns.get(c.index())) {
                Some(&at) => Transformed::yes(Arc::new(Column::new(joined.field(at).name(), at)) as PhysicalExprRef),
                None => Transformed::no(e),
            })
        })?
        .data;
    let output: Vec<usize> = match filter.projection() {
        Some(p) => p.iter().filter_map(|&i| columns.get(i).copied()).collect(),
        None => columns.clone(),
    };
    match join.with_filter_above(plan, predicate, output) {
        Ok(absorbed) => Ok(Some(Arc::new(absorbed))),
        Err(why) => {
            crate::util::trace(&format!("the filter above the mark join stays: {why}"));
            Ok(None)
        }
    }
}

impl DeviceScanRule {
    /// A mark join's subquery side (and probe side) read by the device, or
    /// the reasons in its EXPLAIN line.
    fn rewrite_mark_join(
        plan: &Arc<dyn ExecutionPlan>,
        node: &MarkJoinExec,
        cfg: &SetfusionConfig,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let children = plan.children();
        let (Some(&probe), Some(&build)) = (children.first(), children.get(1)) else { return Ok(None) };
        if !cfg.device_scan || !node.decision().on_gpu() || !reads_parquet(build) {
            return Ok(None);
        }
        let scanned = |c: &Arc<dyn ExecutionPlan>| c.downcast_ref::<DeviceScanExec>().is_some();
        if scanned(build) || scanned(probe) {
            return Ok(None);
        }
        let keys = match node.device_scan_keys() {
            Err(why) => Err(why),
            Ok((probe_key, build_key)) => {
                let key_type = crate::keys::key_type(&probe_key.data_type(&probe.schema())?);
                if crate::scan::is_byte_type(&key_type) {
                    Err("string keys: the device reads both sides or neither, and the probe side's rows are output \
                         with their marks"
                        .to_string())
                } else {
                    Ok((probe_key, build_key, key_type))
                }
            }
        };
        let scan = keys.and_then(|(probe_key, build_key, key_type)| {
            DeviceScanExec::try_from_input(build, &build_key, &key_type, None).map(|s| (s, probe_key, key_type))
        });
        let (new_build, new_probe, note): (Arc<dyn ExecutionPlan>, Arc<dyn ExecutionPlan>, Option<String>) = match scan
        {
            Err(why) => (build.clone(), probe.clone(), Some(format!("build: {why}"))),
            Ok((scan, ..)) if !reads_parquet(probe) => (Arc::new(scan), probe.clone(), None),
            Ok((scan, probe_key, key_type)) => match mark_probe_scan(probe, &probe_key, &key_type) {
                Ok(p) => (Arc::new(scan), Arc::new(p), None),
                Err(why) => (Arc::new(scan), probe.clone(), Some(format!("probe: {why}"))),
            },
        };
        Ok(Some(Arc::new(node.with_scans(new_probe, new_build, note)?)))
    }

    fn rewrite(plan: Arc<dyn ExecutionPlan>, cfg: &SetfusionConfig) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
        if let Some(aggregate) = plan.downcast_ref::<AggregateExec>() {
            if !cfg.device_scan {
                return Ok(Transformed::no(plan));
            }
            return Ok(match absorb_aggregate_above(&plan, aggregate)? {
                Some(p) => Transformed::yes(p),
                None => Transformed::no(plan),
            });
        }
        if let Some(filter) = plan.downcast_ref::<FilterExec>() {
            if !cfg.device_scan {
                return Ok(Transformed::no(plan));
            }
            return Ok(match absorb_filter_above(&plan, filter)? {
                Some(p) => Transformed::yes(p),
                None => Transformed::no(plan),
            });
        }
        if let Some(mark) = plan.downcast_ref::<MarkJoinExec>() {
            return Ok(match Self::rewrite_mark_join(&plan, mark, cfg)? {
                Some(p) => Transformed::yes(p),
                None => Transformed::no(plan),
            });
        }
        let Some(node) = plan.downcast_ref::<SetSelectExec>() else { return Ok(Transformed::no(plan)) };
        // Only the GPU backend reads keys on the device; a disabled scan leaves the plan (and EXPLAIN) as it was.
        if !cfg.device_scan || !node.decision().on_gpu() {
            return Ok(Transformed::no(plan));
        }
        let children: Vec<Arc<dyn ExecutionPlan>> = plan.children().into_iter().cloned().collect();
        let mut reasons = Vec::new();
        let mut new_children = children.clone();
        // Both sides' keys are encoded as the probe side's types.
        let Some(key) = node.probe_keys().first() else { return Ok(Transformed::no(plan)) };
        let key_type = crate::keys::key_type(&key.data_type(&children[0].schema())?);
        let key_types = crate::keys::key_types(node.probe_keys(), &children[0].schema())?;
        for (i, (side, keys)) in [("probe", node.probe_keys()), ("build", node.build_keys())].into_iter().enumerate() {
            if !reads_parquet(&children[i]) || children[i].downcast_ref::<DeviceScanExec>().is_some() {
                continue;
            }
            let why = if node.partitioned_inputs_requested() {
                Err("hash-partitioned inputs".to_string())
            } else {
                // A side whose rows are output (the probe side) has the columns the
                // operator outputs (its projection's, or all) decoded too.
                let output: Option<Vec<usize>> = (!node.keys_only(i == 0)).then(|| {
                    node.projection()
                        .map_or_else(|| (0..children[i].schema().fields().len()).collect(), <[usize]>::to_vec)
                });
                DeviceScanExec::try_from_input_keys(&children[i], keys, &key_types, output.as_deref())
            };
            match why {
                Ok(scan) => new_children[i] = Arc::new(scan),
                Err(why) => reasons.push(format!("{side}: {why}")),
            }
        }
        // String keys are hashed, and the hashes proved against the bytes where
        // they lie: on the device for both sides, or on the host for both.
        // Composite keys are packed into one 64-bit key by ranges that both
        // sides' columns share: on the device for both, or on the host.
        let scanned = |c: &Arc<dyn ExecutionPlan>| c.downcast_ref::<DeviceScanExec>().is_some();
        let both = if crate::scan::is_byte_type(&key_type) {
            Some("string keys")
        } else {
            (key_types.len() > 1).then_some("composite keys")
        };
        if let Some(what) = both.filter(|_| !new_children.iter().all(scanned)) {
            if new_children.iter().any(scanned) {
                reasons.push(format!("{what}: the device reads both sides or neither"));
            }
            new_children = children.clone();
        }
        let note = (!reasons.is_empty()).then(|| reasons.join("; "));
        let changed = new_children.iter().zip(&children).any(|(a, b)| !Arc::ptr_eq(a, b));
        if !changed && note.is_none() {
            return Ok(Transformed::no(plan));
        }
        let mut new_children = new_children.into_iter();
        let (Some(probe), Some(build)) = (new_children.next(), new_children.next()) else {
            return Ok(Transformed::no(plan));
        };
        // Rebuilt, not made anew: the rule runs after DataFusion's pushdowns, and
        // the node's fetch (a LIMIT) and dynamic filter must survive it.
        let with_note = node.rebuilt(probe, build, node.projection().map(<[usize]>::to_vec))?.with_scan_note(note);
        Ok(Transformed::yes(Arc::new(with_note)))
    }
}

impl PhysicalOptimizerRule for DeviceScanRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        super::rewrite_when_enabled(plan, config, Self::rewrite)
    }
    fn name(&self) -> &str {
        "setfusion_device_scan"
    }
    fn schema_check(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_expr::expressions::Column;
    use datafusion::physical_expr::PhysicalExprRef;
    use datafusion::prelude::{col, ParquetReadOptions, SessionContext};
    use parquet::basic::Compression;
    use parquet::file::properties::WriterProperties;

    use super::{mark_probe_scan, reading};
    use crate::config::SetfusionConfig;

    /// A Parquet file of `k` (BIGINT), `p` (BIGINT) and `s` (VARCHAR) under `codec`.
    fn write(dir: &std::path::Path, name: &str, codec: Compression) -> String {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("p", DataType::Int64, false),
            Field::new("s", DataType::Utf8, false),
        ]));
        let n = 40_000i64;
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values((0..n).map(|i| i * 7919 % 100_003))),
                Arc::new(Int64Array::from_iter_values(0..n)),
                Arc::new(StringArray::from_iter_values((0..n).map(|i| format!("s{}", i % 977)))),
            ],
        )
        .unwrap();
        let path = dir.join(name);
        let props = WriterProperties::builder().set_compression(codec).build();
        crate::scan::fixtures::write_file(&path, &batch, props).unwrap();
        path.display().to_string()
    }

    /// `batch` as the snappy Parquet file `name`.parquet under `dir`; its path.
    fn snappy_file(dir: &std::path::Path, name: &str, batch: &RecordBatch) -> String {
        let path = dir.join(format!("{name}.parquet"));
        let props = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
        crate::scan::fixtures::write_file(&path, batch, props).unwrap();
        path.display().to_string()
    }

    /// `aggregates` without grouping over `input`, as DataFusion plans them
    /// over several partitions: `Final` over `CoalescePartitionsExec` over `Partial`.
    fn aggregated(
        input: Arc<dyn datafusion::physical_plan::ExecutionPlan>,
        aggregates: Vec<Arc<datafusion::physical_expr::aggregate::AggregateFunctionExpr>>,
    ) -> Arc<dyn datafusion::physical_plan::ExecutionPlan> {
        use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode, PhysicalGroupBy};
        use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
        let (n, schema, none) = (aggregates.len(), input.schema(), PhysicalGroupBy::new_single(vec![]));
        let partial = AggregateExec::try_new(
            AggregateMode::Partial,
            none.clone(),
            aggregates.clone(),
            vec![None; n],
            input,
            schema.clone(),
        )
        .unwrap();
        let coalesced = Arc::new(CoalescePartitionsExec::new(Arc::new(partial)));
        Arc::new(
            AggregateExec::try_new(AggregateMode::Final, none, aggregates, vec![None; n], coalesced, schema).unwrap(),
        )
    }

    /// The aggregate function `f` of `arg` over rows of `schema`, named `name`.
    fn aggregate_of(
        f: Arc<datafusion::logical_expr::AggregateUDF>,
        arg: PhysicalExprRef,
        name: &str,
        schema: &datafusion::arrow::datatypes::SchemaRef,
    ) -> Arc<datafusion::physical_expr::aggregate::AggregateFunctionExpr> {
        use datafusion::physical_expr::aggregate::AggregateExprBuilder;
        Arc::new(AggregateExprBuilder::new(f, vec![arg]).schema(schema.clone()).alias(name).build().unwrap())
    }

    /// The physical plan of `sql` in `ctx`.
    async fn physical(ctx: &SessionContext, sql: &str) -> Arc<dyn datafusion::physical_plan::ExecutionPlan> {
        ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap()
    }

    /// The decision's inputs before the rule runs: gzip pages count as host
    /// inflation (only the columns read: the key, and the output columns of a
    /// side whose rows are output), snappy pages do not; string keys are read
    /// by the device only where every side can be; nothing without the device scan.
    #[tokio::test]
    async fn reading_counts_the_pages_the_host_inflates() {
        let dir = std::env::temp_dir().join(format!("setfusion-reading-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ctx = SessionContext::new();
        let gzip = write(&dir, "z.parquet", Compression::GZIP(Default::default()));
        let snappy = write(&dir, "s.parquet", Compression::SNAPPY);
        ctx.register_parquet("z", &gzip, ParquetReadOptions::default()).await.unwrap();
        ctx.register_parquet("s", &snappy, ParquetReadOptions::default()).await.unwrap();
        let plan = |sql: &'static str| physical(&ctx, sql);
        let (z, s) = (plan("SELECT k, p, s FROM z").await, plan("SELECT k, p, s FROM s").await);
        let col = |name: &str, i: usize| -> PhysicalExprRef { Arc::new(Column::new(name, i)) };
        let (k, text) = (col("k", 0), col("s", 2));
        let cfg = SetfusionConfig::default();
        let int = DataType::Int64;

        let keys_only = reading(&cfg, &int, &[(&z, &k, None)]);
        assert!(keys_only.inflated.host > 0, "{keys_only:?}");
        assert!(!keys_only.device_read, "integer keys cost the same either way");
        let with_output = reading(&cfg, &int, &[(&z, &k, Some(&[0, 1])), (&s, &k, None)]);
        assert!(with_output.inflated.host > keys_only.inflated.host, "{with_output:?}");
        assert_eq!(reading(&cfg, &int, &[(&s, &k, Some(&[0, 1]))]).inflated.host, 0);

        // (The type as the plan reads it: DataFusion reads Parquet strings as views.)
        let string = s.schema().field(2).data_type().clone();
        let strings = reading(&cfg, &string, &[(&s, &text, None), (&z, &text, None)]);
        assert!(strings.device_read && strings.inflated.host > 0, "{strings:?}");
        // A side the device cannot read (a key coerced to another type) keeps string keys on the host.
        let coerced = reading(&cfg, &string, &[(&s, &text, None), (&s, &k, None)]);
        assert!(!coerced.device_read, "{coerced:?}");

        let off = SetfusionConfig { device_scan: false, ..SetfusionConfig::default() };
        assert_eq!(reading(&off, &int, &[(&z, &k, None)]), Default::default());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A mark join's probe side, whose every row is output with its mark, is
    /// read by the device only where its rows can come back as they must:
    /// any order, no hash partitioning, no page the host inflates first, and
    /// under a filter no column that may hold NULLs. Each refusal says why.
    #[tokio::test]
    async fn a_mark_joins_probe_side_is_read_where_every_row_can_come_back() {
        let dir = std::env::temp_dir().join(format!("setfusion-mark-probe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ctx = SessionContext::new();
        let snappy = write(&dir, "s.parquet", Compression::SNAPPY);
        let gzip = write(&dir, "z.parquet", Compression::GZIP(Default::default()));
        let nullable = dir.join("n.parquet");
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("p", DataType::Int64, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(0..5000)),
                Arc::new(Int64Array::from_iter((0..5000).map(|i| (i % 7 != 0).then_some(i)))),
            ],
        )
        .unwrap();
        let props = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
        crate::scan::fixtures::write_file(&nullable, &batch, props).unwrap();
        let sorted = ParquetReadOptions::default().file_sort_order(vec![vec![col("k").sort(true, false)]]);
        ctx.register_parquet("s", &snappy, ParquetReadOptions::default()).await.unwrap();
        ctx.register_parquet("z", &gzip, ParquetReadOptions::default()).await.unwrap();
        ctx.register_parquet("n", nullable.to_str().unwrap(), ParquetReadOptions::default()).await.unwrap();
        ctx.register_parquet("o", &snappy, sorted).await.unwrap();
        let plan = |sql: &'static str| physical(&ctx, sql);
        let k: PhysicalExprRef = Arc::new(Column::new("k", 0));
        let int = DataType::Int64;
        let why =
            |r: std::result::Result<crate::exec::device_scan::DeviceScanExec, String>| r.err().unwrap_or_default();

        let every_row = mark_probe_scan(&plan("SELECT k, p FROM s").await, &k, &int).unwrap();
        assert_eq!(every_row.payload().map(<[_]>::len), Some(2));
        let filtered = mark_probe_scan(&plan("SELECT k, p FROM s WHERE p > 5").await, &k, &int).unwrap();
        assert!(filtered.filter().is_some());
        // NULLs without a filter come back with their rows; under one they keep the host scan.
        assert!(mark_probe_scan(&plan("SELECT k, p FROM n").await, &k, &int).is_ok());
        let refused = why(mark_probe_scan(&plan("SELECT k, p FROM n WHERE k > 5").await, &k, &int));
        assert!(refused.contains("output column p may hold NULLs"), "{refused}");
        let refused = why(mark_probe_scan(&plan("SELECT k, p FROM z").await, &k, &int));
        assert!(refused.contains("inflated on host threads"), "{refused}");
        let refused = why(mark_probe_scan(&plan("SELECT k, p FROM o").await, &k, &int));
        assert!(refused.contains("in an order"), "{refused}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The `FilterExec` above a mark join whose both sides the device reads
    /// is absorbed by the join (through a projection of its columns, with the
    /// filter's own projection, none for a `count(*)`), and a predicate the
    /// device cannot evaluate is not. The absorbed node answers as the
    /// `FilterExec` did, three-valued marks and NULL columns included: on the
    /// device where there is one, else on the host (the device path falls back).
    #[tokio::test]
    async fn the_filter_above_a_device_read_mark_join_is_absorbed() {
        use datafusion::logical_expr::Operator;
        use datafusion::physical_expr::expressions::{binary, lit, not, BinaryExpr};
        use datafusion::physical_optimizer::PhysicalOptimizerRule;
        use datafusion::physical_plan::filter::FilterExecBuilder;
        use datafusion::physical_plan::projection::ProjectionExec;
        use datafusion::physical_plan::ExecutionPlan;

        use crate::config::Strategy;
        use crate::exec::common::{Decision, Reason};
        use crate::exec::device_scan::DeviceScanExec;
        use crate::exec::mark_join::{MarkJoinExec, MarkKind};

        let dir = std::env::temp_dir().join(format!("setfusion-filter-above-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let table = |name: &str, rows: i64, null_every: i64, seed: i64| {
            let schema = Arc::new(Schema::new(vec![
                Field::new("k", DataType::Int64, true),
                Field::new("p", DataType::Int64, true),
            ]));
            let key = |i: i64| (i % null_every != 1).then_some((i * 7919 + seed) % 3001);
            let batch = RecordBatch::try_new(
                schema,
                vec![
                    Arc::new(Int64Array::from_iter((0..rows).map(key))),
                    Arc::new(Int64Array::from_iter((0..rows).map(|i| (i % 11 != 5).then_some(i)))),
                ],
            )
            .unwrap();
            snappy_file(&dir, name, &batch)
        };
        let ctx = crate::context();
        let (a, b, b_clean) = (table("a", 6000, 97, 3), table("b", 2500, 401, 11), table("c", 2500, i64::MAX, 11));
        ctx.register_parquet("a", &a, ParquetReadOptions::default()).await.unwrap();
        ctx.register_parquet("b", &b, ParquetReadOptions::default()).await.unwrap();
        ctx.register_parquet("c", &b_clean, ParquetReadOptions::default()).await.unwrap();
        let plan = |sql: &'static str| physical(&ctx, sql);
        let k: PhysicalExprRef = Arc::new(Column::new("k", 0));
        let int = DataType::Int64;
        let probe: Arc<dyn ExecutionPlan> =
            Arc::new(mark_probe_scan(&plan("SELECT k, p FROM a").await, &k, &int).unwrap());
        let options = ctx.state().config_options().clone();
        for subquery in ["SELECT k FROM b", "SELECT k FROM c"] {
            let build = plan(subquery).await;
            let build: Arc<dyn ExecutionPlan> =
                Arc::new(DeviceScanExec::try_from_input(&build, &k, &int, None).unwrap());
            let decision = Decision::gpu(Strategy::Auto, Reason::MinRowsZero);
            let join: Arc<dyn ExecutionPlan> = Arc::new(
                MarkJoinExec::try_new(
                    MarkKind::In,
                    probe.clone(),
                    build,
                    vec![],
                    Some((k.clone(), k.clone())),
                    None,
                    "mark",
                    decision,
                )
                .unwrap(),
            );
            // [p, mark, k] over the join's [k, p, mark].
            let columns = [("p", 1), ("mark", 2), ("k", 0)];
            let exprs: Vec<(PhysicalExprRef, String)> =
                columns.iter().map(|&(n, i)| (Arc::new(Column::new(n, i)) as PhysicalExprRef, n.to_string())).collect();
            let projected: Arc<dyn ExecutionPlan> = Arc::new(ProjectionExec::try_new(exprs, join.clone()).unwrap());
            let schema = projected.schema();
            let c = |n: &str| -> PhysicalExprRef { Arc::new(Column::new_with_schema(n, &schema).unwrap()) };
            let p_below = binary(c("p"), Operator::Lt, lit(1000i64), &schema).unwrap();
            let cases: Vec<(PhysicalExprRef, Option<Vec<usize>>, bool)> = vec![
                // NOT mark OR p < 1000, count(*): no column out.
                (Arc::new(BinaryExpr::new(not(c("mark")).unwrap(), Operator::Or, p_below.clone())), Some(vec![]), true),
                // mark OR p IS NULL, the mark and k out (NULL marks dropped, NULL p kept).
                (
                    Arc::new(BinaryExpr::new(
                        c("mark"),
                        Operator::Or,
                        Arc::new(datafusion::physical_expr::expressions::IsNullExpr::new(c("p"))),
                    )),
                    Some(vec![1, 2]),
                    true,
                ),
                // Every column out.
                (p_below.clone(), None, true),
                // A predicate the device does not evaluate (%): the plan stays.
                (
                    binary(c("p"), Operator::Modulo, lit(3i64), &schema)
                        .map(|m| binary(m, Operator::Eq, lit(1i64), &schema).unwrap())
                        .unwrap(),
                    Some(vec![0]),
                    false,
                ),
            ];
            for (predicate, projection, absorbed) in cases {
                let filter: Arc<dyn ExecutionPlan> = Arc::new(
                    FilterExecBuilder::new(predicate.clone(), projected.clone())
                        .apply_projection(projection.clone())
                        .unwrap()
                        .build()
                        .unwrap(),
                );
                let rewritten = super::DeviceScanRule.optimize(filter.clone(), &options).unwrap();
                let node = rewritten.downcast_ref::<MarkJoinExec>();
                assert_eq!(node.is_some(), absorbed, "{predicate} {projection:?}");
                if let Some(node) = node {
                    assert!(node.filter_above().is_some());
                    assert_eq!(rewritten.schema(), filter.schema());
                }
                let rows = |plan: Arc<dyn ExecutionPlan>| {
                    let task = ctx.task_ctx();
                    async move {
                        let batches = datafusion::physical_plan::collect(plan, task).await.unwrap();
                        let n: usize = batches.iter().map(|b| b.num_rows()).sum();
                        let mut text: Vec<String> = datafusion::arrow::util::pretty::pretty_format_batches(&batches)
                            .unwrap()
                            .to_string()
                            .lines()
                            .skip(3)
                            .map(str::to_string)
                            .collect();
                        text.sort();
                        (n, text)
                    }
                };
                // (Both plans share their scans, whose state a first execution uses up.)
                let reset = datafusion::physical_plan::execution_plan::reset_plan_states;
                let want = rows(reset(filter.clone()).unwrap()).await;
                assert!(want.0 > 0, "{predicate}");
                assert_eq!(rows(reset(rewritten).unwrap()).await, want, "{subquery}: {predicate} {projection:?}");
            }
            // The aggregate above the absorbed filter ([p, k] out): absorbed too, unless it reads the mark.
            use datafusion::functions_aggregate::count::count_udaf;
            use datafusion::functions_aggregate::min_max::max_udaf;
            use datafusion::functions_aggregate::sum::sum_udaf;
            for (projection, absorbed) in [(vec![0, 2], true), (vec![1, 0], false)] {
                let filter: Arc<dyn ExecutionPlan> = Arc::new(
                    FilterExecBuilder::new(p_below.clone(), projected.clone())
                        .apply_projection(Some(projection.clone()))
                        .unwrap()
                        .build()
                        .unwrap(),
                );
                let rows_schema = filter.schema();
                let c = |i: usize| -> PhysicalExprRef { Arc::new(Column::new(rows_schema.field(i).name(), i)) };
                let of = |f, arg, name: &str| aggregate_of(f, arg, name, &rows_schema);
                let top = aggregated(
                    filter,
                    vec![
                        of(count_udaf(), lit(1i64), "count(*)"),
                        of(sum_udaf(), c(1 - absorbed as usize), "sum(p)"),
                        of(count_udaf(), c(absorbed as usize), "count(x)"),
                        of(max_udaf(), c(1 - absorbed as usize), "max(p)"),
                    ],
                );
                let rewritten = super::DeviceScanRule.optimize(top.clone(), &options).unwrap();
                let node = rewritten.downcast_ref::<MarkJoinExec>();
                assert_eq!(node.is_some_and(|n| n.aggregate_above().is_some()), absorbed, "{projection:?}");
                assert_eq!(rewritten.schema(), top.schema());
                let collect = |plan: Arc<dyn ExecutionPlan>| {
                    let task = ctx.task_ctx();
                    async move {
                        let batches = datafusion::physical_plan::collect(plan, task).await.unwrap();
                        datafusion::arrow::util::pretty::pretty_format_batches(&batches).unwrap().to_string()
                    }
                };
                let reset = datafusion::physical_plan::execution_plan::reset_plan_states;
                let want = collect(reset(top.clone()).unwrap()).await;
                assert_eq!(collect(reset(rewritten).unwrap()).await, want, "{subquery}: {projection:?}");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An aggregate without grouping over a selection whose kept side the
    /// device reads is absorbed by the selection (`count(*)`, `count`, `sum`
    /// of BIGINT and of INT cast, `min`, `max`, NULLs among the values), and
    /// answers as DataFusion's aggregate did: reduced on the device where
    /// there is one, else folded on the host. Grouping or another function
    /// leaves the plan alone.
    #[tokio::test]
    async fn the_aggregate_above_a_device_read_selection_is_absorbed() {
        use datafusion::functions_aggregate::average::avg_udaf;
        use datafusion::functions_aggregate::count::count_udaf;
        use datafusion::functions_aggregate::min_max::{max_udaf, min_udaf};
        use datafusion::functions_aggregate::sum::sum_udaf;
        use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
        use datafusion::physical_expr::expressions::{lit, CastExpr};
        use datafusion::physical_optimizer::PhysicalOptimizerRule;
        use datafusion::physical_plan::ExecutionPlan;

        use crate::algo::select::SetOp;
        use crate::config::Strategy;
        use crate::exec::common::{Decision, NullMode, Reason};
        use crate::exec::device_scan::DeviceScanExec;
        use crate::exec::set_select::SetSelectExec;

        let dir = std::env::temp_dir().join(format!("setfusion-aggregate-above-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let table = |name: &str, rows: i64, seed: i64| {
            let schema = Arc::new(Schema::new(vec![
                Field::new("k", DataType::Int64, true),
                Field::new("p", DataType::Int64, true),
                Field::new("q", DataType::Int32, true),
            ]));
            let batch = RecordBatch::try_new(
                schema,
                vec![
                    Arc::new(Int64Array::from_iter(
                        (0..rows).map(|i| (i % 89 != 1).then_some((i * 7919 + seed) % 3001)),
                    )),
                    Arc::new(Int64Array::from_iter((0..rows).map(|i| (i % 11 != 5).then_some(i * 1_000_003 - 40_000)))),
                    Arc::new(datafusion::arrow::array::Int32Array::from_iter(
                        (0..rows).map(|i| (i % 13 != 2).then_some((i as i32) * 7 - 9000)),
                    )),
                ],
            )
            .unwrap();
            snappy_file(&dir, name, &batch)
        };
        let ctx = crate::context();
        let (a, b) = (table("a", 6000, 3), table("b", 2500, 11));
        ctx.register_parquet("a", &a, ParquetReadOptions::default()).await.unwrap();
        ctx.register_parquet("b", &b, ParquetReadOptions::default()).await.unwrap();
        let plan = |sql: &'static str| physical(&ctx, sql);
        let k: PhysicalExprRef = Arc::new(Column::new("k", 0));
        let int = DataType::Int64;
        let probe: Arc<dyn ExecutionPlan> = Arc::new(
            DeviceScanExec::try_from_input(&plan("SELECT k, p, q FROM a").await, &k, &int, Some(&[0, 1, 2])).unwrap(),
        );
        let build: Arc<dyn ExecutionPlan> =
            Arc::new(DeviceScanExec::try_from_input(&plan("SELECT k FROM b").await, &k, &int, None).unwrap());
        let options = ctx.state().config_options().clone();
        let decision = Decision::gpu(Strategy::Auto, Reason::MinRowsZero);
        for (op, nulls) in [(SetOp::Semi, NullMode::NeverEqual), (SetOp::Anti, NullMode::NeverEqual)] {
            // The selection outputs [q, p] of the kept rows.
            let selection: Arc<dyn ExecutionPlan> = Arc::new(
                SetSelectExec::try_new(
                    op,
                    probe.clone(),
                    build.clone(),
                    vec![k.clone()],
                    vec![k.clone()],
                    nulls,
                    decision.clone(),
                    Some(vec![2, 1]),
                )
                .unwrap(),
            );
            let schema = selection.schema();
            let c = |n: &str| -> PhysicalExprRef { Arc::new(Column::new_with_schema(n, &schema).unwrap()) };
            let aggregate = |f, arg: PhysicalExprRef, name: &str| aggregate_of(f, arg, name, &schema);
            let q_wide: PhysicalExprRef = Arc::new(CastExpr::new(c("q"), DataType::Int64, None));
            let cases: Vec<(Vec<Arc<AggregateFunctionExpr>>, bool)> = vec![
                (
                    vec![
                        aggregate(count_udaf(), lit(1i64), "count(*)"),
                        aggregate(sum_udaf(), c("p"), "sum(p)"),
                        aggregate(count_udaf(), c("p"), "count(p)"),
                        aggregate(min_udaf(), c("q"), "min(q)"),
                        aggregate(max_udaf(), c("p"), "max(p)"),
                        aggregate(sum_udaf(), q_wide, "sum(q)"),
                    ],
                    true,
                ),
                (vec![aggregate(count_udaf(), lit(1i64), "count(*)")], true),
                (
                    vec![aggregate(avg_udaf(), Arc::new(CastExpr::new(c("p"), DataType::Float64, None)), "avg(p)")],
                    false,
                ),
            ];
            for (aggregates, absorbed) in cases {
                let top = aggregated(selection.clone(), aggregates.clone());
                let rewritten = super::DeviceScanRule.optimize(top.clone(), &options).unwrap();
                let node = rewritten.downcast_ref::<SetSelectExec>();
                assert_eq!(node.is_some(), absorbed, "{op:?} {aggregates:?}");
                if let Some(node) = node {
                    assert!(node.aggregate_above().is_some());
                    assert_eq!(rewritten.schema(), top.schema());
                    assert_eq!(rewritten.properties().partitioning.partition_count(), 1);
                }
                let rows = |plan: Arc<dyn ExecutionPlan>| {
                    let task = ctx.task_ctx();
                    async move {
                        let batches = datafusion::physical_plan::collect(plan, task).await.unwrap();
                        datafusion::arrow::util::pretty::pretty_format_batches(&batches).unwrap().to_string()
                    }
                };
                // (Both plans share their scans, whose state a first execution uses up.)
                let reset = datafusion::physical_plan::execution_plan::reset_plan_states;
                let want = rows(reset(top.clone()).unwrap()).await;
                assert_eq!(rows(reset(rewritten.clone()).unwrap()).await, want, "{op:?}");
                // Executed again, the same answer.
                assert_eq!(rows(reset(rewritten).unwrap()).await, want, "{op:?}, again");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
