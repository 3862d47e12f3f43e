//! Physical rules: Parquet's statistics of float columns decide nothing.
//!
//! Parquet leaves NaN out of a float column's min / max (the format tells
//! readers to assume NaNs may be present), while DataFusion orders NaN above
//! every number and the NaN with the sign bit below every number. DataFusion
//! 55.2 trusts those bounds anyway (apache/datafusion#15812), and so answers
//! wrongly over a float column that holds a NaN:
//! * a column whose other values are all equal reads as that value (the
//!   scan's "constant columns": `SELECT c FROM t` over 0.25 and NaN gives
//!   0.25 twice);
//! * `SELECT max(c)` is answered from the statistics (1.5, not NaN);
//! * files, row groups and pages are dropped by `c > 1` or `c = 'NaN'`
//!   though their NaNs match, and the bloom filters drop -0.0 for `c = 0.0`.
//!
//! Two rules keep those statistics from deciding, on every Parquet scan:
//! * [`FloatStatisticsRule`], first of all physical rules, removes the float
//!   columns' min / max from the scan's statistics (the table's, the file
//!   groups' and each file's);
//! * [`UnprunedFloatFiltersRule`], last, wraps each conjunct of the scan's
//!   predicate that the statistics cannot decide over a float column
//!   (dynamic filters included) in `setfusion_unpruned(..)`
//!   ([`crate::udf::unpruned`]): it filters rows as before, but the pruning
//!   by row group statistics, page index and bloom filters cannot see into
//!   it. Conjuncts over other columns, `f = 2.5` and two-sided ranges
//!   (`f BETWEEN 1 AND 2`) still prune
//!   ([`crate::scan::pages::undecidable_by_statistics`] says which).
//!
//! setfusion's own device scan leaves the same conjuncts out of its pruning.
//! Both rules act only with setfusion enabled and `setfusion.trust_float_statistics`
//! off (its default; on, for data known to hold no NaN, DataFusion's plan stays).

use std::sync::Arc;

use datafusion::common::stats::Precision;
use datafusion::common::tree_node::Transformed;
use datafusion::common::Statistics;
use datafusion::config::ConfigOptions;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder, FileSource, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result;
use datafusion::logical_expr::ScalarUDF;
use datafusion::physical_expr::utils::conjunction;
use datafusion::physical_expr::{split_conjunction, PhysicalExprRef, ScalarFunctionExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;

use crate::scan::pages::undecidable_by_statistics;
use crate::udf::unpruned::{UnprunedUdf, NAME as UNPRUNED};
use crate::util::holds_float;

/// Removes float columns' min / max from Parquet scans' statistics.
#[derive(Debug, Default)]
pub struct FloatStatisticsRule;

impl PhysicalOptimizerRule for FloatStatisticsRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        super::rewrite_when_enabled(plan, config, |p, cfg| {
            if cfg.trust_float_statistics {
                return Ok(Transformed::no(p));
            }
            let Some((scan, _)) =
                p.downcast_ref::<DataSourceExec>().and_then(|d| d.downcast_to_file_source::<ParquetSource>())
            else {
                return Ok(Transformed::no(p));
            };
            let schema = scan.file_source().table_schema().table_schema();
            let floats: Vec<usize> = schema
                .fields()
                .iter()
                .enumerate()
                .filter(|(_, f)| holds_float(f.data_type()))
                .map(|(i, _)| i)
                .collect();
            let bounded = |s: &Statistics| {
                floats
                    .iter()
                    .filter_map(|&i| s.column_statistics.get(i))
                    .any(|c| !matches!(c.min_value, Precision::Absent) || !matches!(c.max_value, Precision::Absent))
            };
            let unbounded = |s: &Statistics| {
                let mut s = s.clone();
                for &i in &floats {
                    if let Some(c) = s.column_statistics.get_mut(i) {
                        c.min_value = Precision::Absent;
                        c.max_value = Precision::Absent;
                    }
                }
                s
            };
            let table = scan.statistics();
            let in_files = scan.file_groups.iter().any(|g| {
                g.file_statistics(None).is_some_and(bounded)
                    || g.iter().any(|f| f.statistics.as_deref().is_some_and(bounded))
            });
            if floats.is_empty() || !(bounded(&table) || in_files) {
                return Ok(Transformed::no(p));
            }
            let groups: Vec<FileGroup> = scan
                .file_groups
                .iter()
                .map(|g| {
                    let files: Vec<PartitionedFile> = g
                        .iter()
                        .map(|f| {
                            let mut f = f.clone();
                            f.statistics = f.statistics.as_deref().map(|s| Arc::new(unbounded(s)));
                            f
                        })
                        .collect();
                    let group = FileGroup::new(files);
                    match g.file_statistics(None) {
                        Some(s) => group.with_statistics(Arc::new(unbounded(s))),
                        None => group,
                    }
                })
                .collect();
            let scan =
                FileScanConfigBuilder::from(scan.clone()).with_file_groups(groups).with_statistics(unbounded(&table));
            Ok(Transformed::yes(DataSourceExec::from_data_source(scan.build())))
        })
    }

    fn name(&self) -> &str {
        "setfusion_float_statistics"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Wraps the float conjuncts of Parquet scans' predicates in `setfusion_unpruned`.
#[derive(Debug, Default)]
pub struct UnprunedFloatFiltersRule;

impl PhysicalOptimizerRule for UnprunedFloatFiltersRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        let options = Arc::new(config.clone());
        super::rewrite_when_enabled(plan, config, |p, cfg| {
            if cfg.trust_float_statistics {
                return Ok(Transformed::no(p));
            }
            let Some(exec) = p.downcast_ref::<DataSourceExec>() else {
                return Ok(Transformed::no(p));
            };
            let Some((scan, source)) = exec.downcast_to_file_source::<ParquetSource>() else {
                return Ok(Transformed::no(p));
            };
            let Some(predicate) = source.filter() else {
                return Ok(Transformed::no(p));
            };
            let schema = source.table_schema().table_schema().clone();
            let conjuncts: Vec<PhysicalExprRef> = split_conjunction(&predicate).into_iter().cloned().collect();
            let undecidable = undecidable_by_statistics(&conjuncts, &schema);
            let mut wrapped = false;
            let mut parts: Vec<PhysicalExprRef> = Vec::new();
            for (c, undecidable) in conjuncts.iter().zip(undecidable) {
                if is_unpruned(c) || !undecidable {
                    parts.push(c.clone());
                    continue;
                }
                let udf = Arc::new(ScalarUDF::from(UnprunedUdf::new()));
                parts.push(Arc::new(ScalarFunctionExpr::try_new(udf, vec![c.clone()], &schema, options.clone())?));
                wrapped = true;
            }
            if !wrapped {
                return Ok(Transformed::no(p));
            }
            let source = Arc::new(source.with_predicate(conjunction(parts)));
            let scan = FileScanConfigBuilder::from(scan.clone()).with_source(source).build();
            Ok(Transformed::yes(Arc::new(exec.clone().with_data_source(Arc::new(scan))) as Arc<dyn ExecutionPlan>))
        })
    }

    fn name(&self) -> &str {
        "setfusion_unpruned_float_filters"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

fn is_unpruned(e: &PhysicalExprRef) -> bool {
    e.downcast_ref::<ScalarFunctionExpr>().is_some_and(|f| f.name() == UNPRUNED)
}
