//! Physical rule: Parquet inputs of set selections read by the device.
//!
//! Runs after every other rule (the plan's shape is final). For each
//! `SemiJoinExec` / `SetOpExec` on the GPU backend that reads all its input
//! partitions at once, each input that is a Parquet scan the device can read
//! becomes a [`DeviceScanExec`]: its key column (under the input's filters,
//! which the device runs), and where its rows are output (the probe side of
//! a join that outputs columns) all its columns, which the device decodes
//! for the output (fixed-width types, no filter). A Parquet input that stays
//! with DataFusion's scan gets its reason in the operator's EXPLAIN line
//! (`device_scan="..."`); inputs that are not Parquet scans, operators on the
//! CPU backend and `setfusion.device_scan = false` leave the plan as it was.
//!
//! A `MarkJoinExec` on the GPU backend whose marks come from one key
//! selection (a correlated EXISTS on one key, an uncorrelated IN; no residual
//! filter) gets its subquery side read by the device the same way, keys only;
//! its probe side's rows are output with their marks and stay with the host.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::config::ConfigOptions;
use datafusion::datasource::physical_plan::ParquetSource;
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;

use crate::config::SetfusionConfig;
use crate::exec::device_scan::DeviceScanExec;
use crate::exec::mark_join::MarkJoinExec;
use crate::exec::set_select::SetSelectExec;

#[derive(Debug, Default)]
pub struct DeviceScanRule;

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

impl DeviceScanRule {
    /// A mark join's subquery side read by the device, or the reason in its EXPLAIN line.
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
        if build.downcast_ref::<DeviceScanExec>().is_some() {
            return Ok(None);
        }
        let scan = match node.device_scan_keys() {
            Err(why) => Err(why),
            Ok((probe_key, build_key)) => {
                let key_type = crate::keys::key_type(&probe_key.data_type(&probe.schema())?);
                if crate::scan::is_byte_type(&key_type) {
                    Err("string keys: the device reads both sides or neither, and the probe side's rows are output \
                         with their marks"
                        .to_string())
                } else {
                    DeviceScanExec::try_from_input(build, &build_key, &key_type, None)
                }
            }
        };
        let rebuilt = match scan {
            Ok(scan) => node.with_build_scan(Arc::new(scan), None)?,
            Err(why) => node.with_build_scan(build.clone(), Some(format!("build: {why}")))?,
        };
        Ok(Some(Arc::new(rebuilt)))
    }

    fn rewrite(plan: Arc<dyn ExecutionPlan>, cfg: &SetfusionConfig) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
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
        // Both sides' keys are encoded as the probe side's type.
        let Some(key) = node.probe_keys().first() else { return Ok(Transformed::no(plan)) };
        let key_type = crate::keys::key_type(&key.data_type(&children[0].schema())?);
        for (i, (side, keys)) in [("probe", node.probe_keys()), ("build", node.build_keys())].into_iter().enumerate() {
            if !reads_parquet(&children[i]) || children[i].downcast_ref::<DeviceScanExec>().is_some() {
                continue;
            }
            let why = if node.partitioned_inputs_requested() {
                Err("hash-partitioned inputs".to_string())
            } else if keys.len() != 1 {
                Err(format!("{} key columns", keys.len()))
            } else {
                // A side whose rows are output (the probe side) has the columns the
                // operator outputs (its projection's, or all) decoded too.
                let output: Option<Vec<usize>> = (!node.keys_only(i == 0)).then(|| {
                    node.projection()
                        .map_or_else(|| (0..children[i].schema().fields().len()).collect(), <[usize]>::to_vec)
                });
                DeviceScanExec::try_from_input(&children[i], &keys[0], &key_type, output.as_deref())
            };
            match why {
                Ok(scan) => new_children[i] = Arc::new(scan),
                Err(why) => reasons.push(format!("{side}: {why}")),
            }
        }
        // String keys are hashed, and the hashes proved against the bytes where
        // they lie: on the device for both sides, or on the host for both.
        let scanned = |c: &Arc<dyn ExecutionPlan>| c.downcast_ref::<DeviceScanExec>().is_some();
        if crate::scan::is_byte_type(&key_type) && !new_children.iter().all(scanned) {
            if new_children.iter().any(scanned) {
                reasons.push("string keys: the device reads both sides or neither".into());
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
