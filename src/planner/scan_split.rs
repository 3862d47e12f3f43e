//! Parquet files read by row ranges, in parallel, under an operator that
//! collects its whole input (the similarity join, `intersect_families`).
//!
//! DataFusion reads one row group on one thread, and arrow-rs writes up to
//! 1M rows into one row group: a table of 100k sets in one file was scanned
//! on one thread, ~75 ms of a query whose join takes ~5 ms on the device.
//! Here each such file is listed once per range of rows, each in its own
//! file group with a [`ParquetRowSelection`] that selects the range; every
//! range is read by its own partition, and the operator above takes all
//! partitions at once. Nothing else changes: the scan's projection,
//! filters, schema and table statistics stay DataFusion's.

use std::sync::Arc;

use datafusion::common::tree_node::Transformed;
use datafusion::config::ConfigOptions;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::ParquetRowSelection;
use datafusion::datasource::physical_plan::ParquetSource;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result;
use datafusion::parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{replace_children_if_necessary, ExecutionPlan, ExecutionPlanProperties};

use crate::exec::families::FamiliesExec;
use crate::exec::similarity_join::SimilarityJoinExec;

/// The rule: the inputs of every similarity join and `intersect_families`
/// call, which collect all their input partitions at once, read by row ranges
/// (`setfusion.scan_ranges`). It runs after setfusion's other rules, on the
/// final plan: a families input read in one partition gets a
/// `CoalescePartitionsExec` over its ranges, so it still is one partition.
#[derive(Debug)]
pub struct ScanRangesRule;

impl ScanRangesRule {
    fn rewrite(plan: Arc<dyn ExecutionPlan>, threads: usize) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
        let families = plan.downcast_ref::<FamiliesExec>().is_some();
        if !families && plan.downcast_ref::<SimilarityJoinExec>().is_none() {
            return Ok(Transformed::no(plan));
        }
        let mut cut = 0;
        let mut children = Vec::new();
        for child in plan.children() {
            let (split, n) = split_parquet_scans(child, threads)?;
            let one = child.output_partitioning().partition_count() == 1;
            cut += n;
            children.push(if n > 0 && families && one && split.output_partitioning().partition_count() > 1 {
                Arc::new(CoalescePartitionsExec::new(split)) as Arc<dyn ExecutionPlan>
            } else {
                split
            });
        }
        if cut == 0 {
            return Ok(Transformed::no(plan));
        }
        Ok(Transformed::yes(replace_children_if_necessary(plan, children)?))
    }
}

impl PhysicalOptimizerRule for ScanRangesRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        let threads = config.execution.target_partitions;
        super::rewrite_when_enabled(plan, config, |p, cfg| {
            // A Ballista plan (`hash_partition_inputs`) is serialized for its executors, and
            // DataFusion's codec does not carry a file's row selection: every range would read
            // the whole file.
            if cfg.scan_ranges && !cfg.hash_partition_inputs {
                Self::rewrite(p, threads)
            } else {
                Ok(Transformed::no(p))
            }
        })
    }
    fn name(&self) -> &str {
        "setfusion_scan_ranges"
    }
    fn schema_check(&self) -> bool {
        true
    }
}

/// The fewest rows a range is cut to: below this, a partition's fixed cost
/// (opening the file, its footer, its pages) outweighs what it reads.
pub const MIN_RANGE_ROWS: u64 = 8192;

/// `plan`, an operator's input whose partitions the operator reads all at
/// once, with each Parquet scan reached through projections, filters and
/// repartitions read in about `parts` ranges of rows; and how many scans
/// were cut. A scan with a limit, row selections of its own, files read in
/// part, files not on the local disk, or as many row groups as `parts`
/// (which DataFusion's byte ranges already spread), stays as it is.
pub fn split_parquet_scans(plan: &Arc<dyn ExecutionPlan>, parts: usize) -> Result<(Arc<dyn ExecutionPlan>, usize)> {
    if let Some(scan) = plan.downcast_ref::<DataSourceExec>() {
        return Ok(match split_scan(scan, parts)? {
            Some(split) => (split, 1),
            None => (plan.clone(), 0),
        });
    }
    let passes = plan.downcast_ref::<ProjectionExec>().is_some()
        || plan.downcast_ref::<FilterExec>().is_some()
        || plan.downcast_ref::<CoalescePartitionsExec>().is_some()
        || plan.downcast_ref::<RepartitionExec>().is_some_and(|r| !r.preserve_order());
    if !passes || plan.children().len() != 1 {
        return Ok((plan.clone(), 0));
    }
    let (child, cut) = split_parquet_scans(plan.children()[0], parts)?;
    if cut == 0 {
        return Ok((plan.clone(), 0));
    }
    // Rebuilt, so the node's properties follow its input's partitions.
    Ok((replace_children_if_necessary(plan.clone(), vec![child])?, cut))
}

/// The row ranges of a file of `rows` rows cut for its share of `parts`.
/// Consecutive, covering every row once; one range when the file is small.
pub fn row_ranges(rows: u64, parts: usize) -> Vec<std::ops::Range<u64>> {
    let n = (rows / MIN_RANGE_ROWS).clamp(1, parts.max(1) as u64);
    let base = rows / n;
    let extra = rows % n;
    let mut start = 0;
    (0..n)
        .map(|i| {
            let len = base + u64::from(i < extra);
            let r = start..start + len;
            start += len;
            r
        })
        .collect()
}

fn split_scan(scan: &DataSourceExec, parts: usize) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some((config, _)) = scan.downcast_to_file_source::<ParquetSource>() else { return Ok(None) };
    if config.limit.is_some() || parts < 2 {
        return Ok(None);
    }
    // Each file once, in the order listed, with the byte ranges DataFusion cut it into
    // (a row group is read by the range that holds its middle, so one row group is one
    // partition however many ranges there are).
    let mut files: Vec<(&PartitionedFile, Vec<(i64, i64)>)> = Vec::new();
    for f in config.file_groups.iter().flat_map(|g| g.iter()) {
        if !f.extensions.is_empty() {
            return Ok(None);
        }
        let at = match files.iter().position(|(g, _)| g.object_meta.location == f.object_meta.location) {
            Some(at) => at,
            None => {
                files.push((f, Vec::new()));
                files.len() - 1
            }
        };
        let size = f.object_meta.size as i64;
        files[at].1.push(f.range.as_ref().map_or((0, size), |r| (r.start, r.end)));
    }
    // Only files read whole (by one range or several that cover them) are cut by rows.
    for (f, ranges) in &mut files {
        ranges.sort_unstable();
        let mut end = 0;
        for &(a, b) in ranges.iter() {
            if a != end {
                return Ok(None);
            }
            end = b;
        }
        if end != f.object_meta.size as i64 {
            return Ok(None);
        }
    }
    // Each file's rows and row groups by its footer (read once, cached for the scan).
    let mut shapes = Vec::with_capacity(files.len());
    for (f, _) in &files {
        match crate::scan::file_shape(&crate::scan::local_path(f)) {
            Some(shape) => shapes.push(shape),
            None => return Ok(None),
        }
    }
    // DataFusion's own ranges already keep `parts` threads busy.
    if files.is_empty() || shapes.iter().map(|s| s.1).sum::<usize>() >= parts {
        return Ok(None);
    }
    let total: u64 = shapes.iter().map(|s| s.0).sum();
    let mut groups = Vec::new();
    for ((f, _), &(n, _)) in files.iter().zip(&shapes) {
        let mut whole = (*f).clone();
        whole.range = None;
        // The file's share of the parts, by its rows.
        let share = if total == 0 { 1 } else { ((parts as u128 * n as u128).div_ceil(total as u128)) as usize };
        let ranges = row_ranges(n, share);
        if ranges.len() == 1 {
            groups.push(FileGroup::new(vec![whole]));
            continue;
        }
        for r in ranges {
            let mut selectors = Vec::with_capacity(3);
            if r.start > 0 {
                selectors.push(RowSelector::skip(r.start as usize));
            }
            selectors.push(RowSelector::select((r.end - r.start) as usize));
            if r.end < n {
                selectors.push(RowSelector::skip((n - r.end) as usize));
            }
            let mut piece = whole.clone();
            // The file's statistics are not the range's.
            piece.statistics = None;
            piece.extensions.insert(ParquetRowSelection::new(RowSelection::from(selectors)));
            groups.push(FileGroup::new(vec![piece]));
        }
    }
    // DataFusion reads as many row groups at once as there are.
    if groups.len() <= shapes.iter().map(|s| s.1).sum::<usize>() {
        return Ok(None);
    }
    let config = FileScanConfigBuilder::from(config.clone()).with_file_groups(groups).build();
    let split: Arc<dyn ExecutionPlan> = DataSourceExec::from_data_source(config);
    Ok(Some(split))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_every_row_once() {
        for (rows, parts) in [(0, 4), (1, 4), (8191, 16), (100_000, 16), (100_000, 1), (1 << 20, 7), (50_000, 0)] {
            let r = row_ranges(rows, parts);
            assert!(!r.is_empty());
            assert_eq!(r[0].start, 0);
            assert_eq!(r.last().unwrap().end, rows);
            assert!(r.windows(2).all(|w| w[0].end == w[1].start));
            assert!(r.len() <= parts.max(1));
            assert!(r.len() == 1 || r.iter().all(|x| x.end - x.start >= MIN_RANGE_ROWS));
        }
        assert_eq!(row_ranges(100_000, 16).len(), 12);
    }
}
