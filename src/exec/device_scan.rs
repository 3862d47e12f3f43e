//! `DeviceScanExec`: a Parquet input of a set selection whose key column the
//! device reads itself ([`crate::scan`]). The node stands where DataFusion's
//! scan subtree stood (a Parquet `DataSourceExec`, optionally under column
//! projections, `CoalesceBatchesExec`, `RepartitionExec` or
//! `CoalescePartitionsExec`), with that subtree's schema and properties.
//!
//! `SetSelectExec` recognises it and takes the keys on the device, with no
//! Arrow batch on the host. Anyone else who executes it gets the original
//! subtree's batches: the node runs that subtree, which it keeps (it is a
//! leaf to the optimizer, so no later rule rewrites what it stands for).
//!
//! [`DeviceScanExec::try_from_input`] decides at planning time, from the plan
//! alone: what it cannot take (a filter, a type, a remote store, a partition
//! column, ...) comes back as a reason for EXPLAIN. The files themselves are
//! checked when the scan runs (codec, encodings, nested or adapted columns),
//! where an unsupported file sends that input back to the host scan.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::physical_plan::ParquetSource;
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};

use crate::scan::ScanFile;

/// See the module documentation.
#[derive(Debug)]
pub struct DeviceScanExec {
    /// The subtree this node stands for (run as is by anyone but a set selection).
    input: Arc<dyn ExecutionPlan>,
    files: Vec<ScanFile>,
    /// The key column's name in the files.
    column: String,
    data_type: DataType,
    /// What the last device scan did (or why it went back to the host), for EXPLAIN ANALYZE.
    ran: Arc<Mutex<Option<String>>>,
}

impl DeviceScanExec {
    /// A device scan of `key` (an expression over `input`'s output) for
    /// `input`, or the reason there can be none.
    pub fn try_from_input(
        input: &Arc<dyn ExecutionPlan>,
        key: &PhysicalExprRef,
        key_type: &DataType,
    ) -> std::result::Result<Self, String> {
        let Some(col) = key.downcast_ref::<Column>() else { return Err(format!("key {key} is not a column")) };
        let data_type = input.schema().field(col.index()).data_type().clone();
        if &data_type != key_type {
            return Err(format!("key type {data_type} is coerced to {key_type}"));
        }
        if !crate::scan::supported_type(&data_type) {
            return Err(format!("type {data_type}"));
        }
        // Follow the key column down to the scan.
        let mut node = input.clone();
        let mut index = col.index();
        loop {
            if let Some(p) = node.downcast_ref::<ProjectionExec>() {
                let e = &p.expr()[index];
                let Some(c) = e.expr.downcast_ref::<Column>() else {
                    return Err(format!("key computed by {}", e.expr));
                };
                index = c.index();
                node = p.input().clone();
            } else if matches!(node.name(), "CoalesceBatchesExec" | "RepartitionExec" | "CoalescePartitionsExec")
                && node.children().len() == 1
            {
                // They move rows between batches and partitions, never change a value.
                let child = node.children()[0].clone();
                node = child;
            } else {
                break;
            }
        }
        if node.name() == "FilterExec" {
            return Err("a filter on the input".into());
        }
        let Some(ds) = node.downcast_ref::<DataSourceExec>() else {
            return Err(format!("input {} is not a Parquet scan", node.name()));
        };
        let Some((config, _)) = ds.downcast_to_file_source::<ParquetSource>() else {
            return Err("input is not a Parquet scan".into());
        };
        // Dynamic filters (this node's own, a TopK's above) only let a scan
        // skip rows that cannot matter; the device reads every row instead.
        // Any other pushed filter changes which rows the input has.
        if let Some(filter) = config.file_source().filter() {
            let dynamic_only = datafusion::physical_expr::split_conjunction(&filter).iter().all(|c| {
                c.downcast_ref::<datafusion::physical_expr::expressions::DynamicFilterPhysicalExpr>().is_some()
            });
            if !dynamic_only {
                return Err("a filter pushed into the Parquet scan".into());
            }
        }
        if config.limit.is_some() {
            return Err("a limit on the Parquet scan".into());
        }
        if config.object_store_url.as_str() != "file:///" {
            return Err(format!("object store {} is not the local file system", config.object_store_url.as_str()));
        }
        let table = config.file_source().table_schema();
        let file_schema = table.file_schema().clone();
        let file_index = match config.file_source().projection() {
            Some(p) => {
                let Some(e) = p.iter().nth(index) else { return Err("scan projection".into()) };
                let Some(c) = e.expr.downcast_ref::<Column>() else {
                    return Err(format!("key computed by {} in the scan", e.expr));
                };
                c.index()
            }
            None => index,
        };
        if file_index >= file_schema.fields().len() {
            return Err("key is a partition column".into());
        }
        let field = file_schema.field(file_index);
        if field.data_type() != &data_type {
            return Err(format!("schema adaptation: {} read as {data_type}", field.data_type()));
        }
        // Each file once, with the byte ranges DataFusion split it into.
        let mut by_path: BTreeMap<PathBuf, Vec<(u64, u64)>> = BTreeMap::new();
        let mut whole: std::collections::BTreeSet<PathBuf> = Default::default();
        for group in &config.file_groups {
            for f in group.iter() {
                let path = PathBuf::from(format!("/{}", f.object_meta.location.as_ref()));
                match &f.range {
                    Some(r) => by_path.entry(path).or_default().push((r.start.max(0) as u64, r.end.max(0) as u64)),
                    None => {
                        whole.insert(path.clone());
                        by_path.entry(path).or_default();
                    }
                }
            }
        }
        let files = by_path
            .into_iter()
            .map(|(path, ranges)| ScanFile { ranges: if whole.contains(&path) { vec![] } else { ranges }, path })
            .collect();
        Ok(Self {
            input: input.clone(),
            files,
            column: field.name().clone(),
            data_type,
            ran: Arc::new(Mutex::new(None)),
        })
    }

    pub fn files(&self) -> &[ScanFile] {
        &self.files
    }
    pub fn column(&self) -> &str {
        &self.column
    }
    pub fn data_type(&self) -> &DataType {
        &self.data_type
    }
    /// The subtree the node stands for.
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }
    /// Record what the device scan did (shown by EXPLAIN ANALYZE).
    pub fn set_ran(&self, what: String) {
        *self.ran.lock().unwrap_or_else(|e| e.into_inner()) = Some(what);
    }
}

impl DisplayAs for DeviceScanExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "DeviceScanExec: column={}, type={}, files={}", self.column, self.data_type, self.files.len())?;
        if !matches!(t, DisplayFormatType::TreeRender) {
            if let Some(ran) = self.ran.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                write!(f, ", ran=\"{ran}\"")?;
            }
        }
        Ok(())
    }
}

impl ExecutionPlan for DeviceScanExec {
    fn name(&self) -> &str {
        "DeviceScanExec"
    }
    fn schema(&self) -> SchemaRef {
        self.input.schema()
    }
    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }
    /// A leaf to the optimizer: the subtree it stands for stays as planned.
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }
    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal("DeviceScanExec has no children".into()))
        }
    }
    /// The key column is read as is: no expression of its own.
    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn datafusion::physical_expr::PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }
    /// Executed by anyone but a set selection: the original scan's batches.
    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        self.input.execute(partition, context)
    }
}
