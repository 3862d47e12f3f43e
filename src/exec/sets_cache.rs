//! A similarity self join's preprocessed sets, kept between the queries of a
//! process (issue 31). Asked again over the same Parquet files (the same
//! query, or another threshold or metric), the join reads only the columns
//! its output and its filter need: the set column is neither read, decoded,
//! encoded nor preprocessed again, on either backend.
//!
//! - An entry is one scan's set column: every file with its size and
//!   modification time ([`FileStamp`]), a hash of its footer, byte range and
//!   row selection, and the scan as DataFusion describes it (its projection).
//!   Every lookup opens each file once, to stat it and read its footer, so a
//!   rewritten file is not served its old sets, even one rewritten in place
//!   with the same size within one tick of the clock that stamps it (unless
//!   its footer, with every column chunk's offsets, sizes and statistics,
//!   came out the same).
//! - Taken only where the sets are a plain column of a Parquet scan with no
//!   pushed filter or limit, and nothing else reads that column; the join's
//!   one-pass self join (the two sides the same rows, read once).
//! - Host memory, least recently used first out, up to
//!   `setfusion.sets_cache_limit` bytes (0 turns it off).
//!
//! The collection is the one preprocessing gives, whichever backend made it
//! (the device's preprocessing is tested equal to the host's).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use datafusion::arrow::datatypes::DataType;
use datafusion::datasource::physical_plan::parquet::ParquetRowSelection;
use datafusion::datasource::physical_plan::{FileSource, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::ExecutionPlan;

use crate::algo::ssjoin::SetCollection;
use crate::scan::{local_path, FileStamp};

/// What identifies one cached set column: every file as it is on disk now,
/// and the scan that read it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SetsKey {
    /// Per file, in the scan's order: path, byte range, row selection, partition values.
    files: Vec<(PathBuf, Option<(i64, i64)>, String, String)>,
    /// Each file as it is on disk now, by path: its stamp, and a hash of its
    /// footer (a file rewritten in place within one tick of the clock that
    /// stamps it, with the same size, still differs here unless its footer
    /// came out the same).
    on_disk: Vec<(PathBuf, FileStamp, u64)>,
    /// The scan as DataFusion describes it (its projection and file type).
    scan: String,
    /// The set column's index in the scan's output, and its type.
    column: usize,
    data_type: DataType,
}

impl SetsKey {
    /// The key of the sets `set` reads from `scan`'s output, or None where
    /// the cache cannot take them: not a plain column, not a Parquet scan of
    /// local files, a filter or limit pushed into the scan, a file extension
    /// other than a row selection, or a file that cannot be inspected.
    pub fn of(scan: &Arc<dyn ExecutionPlan>, set: &PhysicalExprRef) -> Option<Self> {
        let column = set.downcast_ref::<Column>()?.index();
        let exec = scan.downcast_ref::<DataSourceExec>()?;
        let (config, source) = exec.downcast_to_file_source::<ParquetSource>()?;
        if FileSource::filter(source).is_some()
            || config.limit.is_some()
            || !config.object_store_url.as_str().starts_with("file://")
        {
            return None;
        }
        let mut files = Vec::new();
        for f in config.file_groups.iter().flat_map(|g| g.files()) {
            let selection = f.extensions.get::<ParquetRowSelection>();
            // Extensions other than a row selection may change what is read.
            if f.extensions.len() > usize::from(selection.is_some()) {
                return None;
            }
            files.push((
                local_path(f),
                f.range.as_ref().map(|r| (r.start, r.end)),
                selection.map_or_else(String::new, |s| format!("{s:?}")),
                format!("{:?}", f.partition_values),
            ));
        }
        // A file read by several ranges is opened once.
        let mut paths: Vec<&PathBuf> = files.iter().map(|f| &f.0).collect();
        paths.sort_unstable();
        paths.dedup();
        let on_disk =
            paths.into_iter().map(|p| on_disk(p).map(|(s, h)| (p.clone(), s, h))).collect::<Option<Vec<_>>>()?;
        let scan = datafusion::physical_plan::displayable(exec).one_line().to_string();
        let schema = exec.schema();
        let data_type = schema.fields().get(column)?.data_type().clone();
        Some(Self { files, on_disk, scan, column, data_type })
    }

    /// The same scan without the set column (the other columns in their
    /// order), the projection pushed into the scan; None where it cannot be.
    pub fn scan_without_sets(&self, scan: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
        let schema = scan.schema();
        let kept: Vec<(PhysicalExprRef, String)> = (0..schema.fields().len())
            .filter(|&i| i != self.column)
            .map(|i| {
                let name = schema.field(i).name().clone();
                (Arc::new(Column::new(&name, i)) as PhysicalExprRef, name)
            })
            .collect();
        let projection = ProjectionExec::try_new(kept, scan.clone()).ok()?;
        scan.try_swapping_with_projection(&projection).ok().flatten()
    }

    /// The set column's index in the scan's output.
    pub fn column(&self) -> usize {
        self.column
    }
}

/// The file at `path` as it is now: its stamp, and a hash of its Parquet
/// footer (its metadata, with every row group's and column chunk's sizes,
/// offsets and statistics); None where either cannot be read, or the file
/// does not end with a Parquet footer.
fn on_disk(path: &std::path::Path) -> Option<(FileStamp, u64)> {
    let file = std::fs::File::open(path).ok()?;
    Some((FileStamp::of(&file)?, footer_hash(&file)?))
}

/// A hash of the Parquet footer `file` ends with (see [`on_disk`]).
fn footer_hash(file: &std::fs::File) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    use std::os::unix::fs::FileExt;
    let len = file.metadata().ok()?.len();
    let mut tail = [0u8; 8];
    file.read_exact_at(&mut tail, len.checked_sub(8)?).ok()?;
    if &tail[4..] != b"PAR1" {
        return None;
    }
    let footer_len = u64::from(u32::from_le_bytes(tail[..4].try_into().ok()?));
    let mut footer = vec![0u8; usize::try_from(footer_len).ok()?];
    file.read_exact_at(&mut footer, len.checked_sub(8 + footer_len)?).ok()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    footer.hash(&mut h);
    Some(h.finish())
}

/// `context` with DataFusion's file-stream work stealing off: each partition
/// of a scan then reads its own file group, in order, so the scan's rows come
/// in the same order in every query (with stealing, a partition may read
/// another's files). The kept sets name their rows by position, so both the
/// read that keeps them and every read that uses them go through this.
pub fn in_fixed_order(context: &Arc<TaskContext>) -> Arc<TaskContext> {
    let mut config = context.session_config().clone();
    config.options_mut().execution.enable_file_stream_work_stealing = false;
    super::common::with_session_config(context, config)
}

/// One scan's preprocessed sets.
#[derive(Debug)]
pub struct CachedSets {
    pub collection: SetCollection,
    /// The scan's rows: a hit reads the other columns again and must see as many.
    pub rows: usize,
}

impl CachedSets {
    /// The host memory the collection holds.
    pub fn bytes(&self) -> usize {
        let c = &self.collection;
        (c.offsets.capacity() + c.tokens.capacity() + c.ids.capacity()) * std::mem::size_of::<u32>()
    }
}

struct Entry {
    sets: Arc<CachedSets>,
    bytes: usize,
    last_use: u64,
}

#[derive(Default)]
struct Entries {
    map: HashMap<SetsKey, Entry>,
    clock: u64,
    bytes: usize,
}

fn entries() -> std::sync::MutexGuard<'static, Entries> {
    static ENTRIES: OnceLock<Mutex<Entries>> = OnceLock::new();
    ENTRIES.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// The sets kept for `key`, if any.
pub fn get(key: &SetsKey) -> Option<Arc<CachedSets>> {
    let mut e = entries();
    e.clock += 1;
    let clock = e.clock;
    let entry = e.map.get_mut(key)?;
    entry.last_use = clock;
    Some(entry.sets.clone())
}

/// Keep `sets` for `key` within `limit` bytes, least recently used first
/// out; false where they alone exceed the limit (or it is 0). Entries of the
/// same column whose files changed since are dropped first.
pub fn put(key: SetsKey, sets: Arc<CachedSets>, limit: usize) -> bool {
    let bytes = sets.bytes();
    let mut e = entries();
    let stale: Vec<SetsKey> = e
        .map
        .keys()
        .filter(|k| {
            k.column == key.column
                && k.scan == key.scan
                && k.files.len() == key.files.len()
                && k.files.iter().zip(&key.files).all(|(a, b)| a.0 == b.0)
        })
        .cloned()
        .collect();
    for k in stale {
        if let Some(old) = e.map.remove(&k) {
            e.bytes -= old.bytes;
        }
    }
    if bytes == 0 || bytes > limit {
        return false;
    }
    while e.bytes + bytes > limit {
        let Some(oldest) = e.map.iter().min_by_key(|(_, x)| x.last_use).map(|(k, _)| k.clone()) else { break };
        if let Some(old) = e.map.remove(&oldest) {
            e.bytes -= old.bytes;
        }
    }
    e.clock += 1;
    let last_use = e.clock;
    e.bytes += bytes;
    e.map.insert(key, Entry { sets, bytes, last_use });
    true
}

/// Forget `key`'s sets (a hit whose rows did not match).
pub fn forget(key: &SetsKey) {
    let mut e = entries();
    if let Some(old) = e.map.remove(key) {
        e.bytes -= old.bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, RecordBatch};

    /// A footer's hash is stable for one file, differs between files whose
    /// contents differ, and is None for a file that is not Parquet.
    #[test]
    fn footer_hash_tells_contents_apart() {
        let dir = std::env::temp_dir().join(format!("setfusion-footer-hash-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, values: Vec<i64>| {
            let batch = RecordBatch::try_from_iter(vec![("x", Arc::new(Int64Array::from(values)) as _)]).unwrap();
            let path = dir.join(name);
            let file = std::fs::File::create(&path).unwrap();
            let mut w = datafusion::parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
            w.write(&batch).unwrap();
            w.close().unwrap();
            path
        };
        let (a, b) = (write("a.parquet", vec![1, 2, 3]), write("b.parquet", vec![1, 2, 4]));
        let hash = |p: &std::path::Path| on_disk(p).map(|(_, h)| h);
        let ha = hash(&a).expect("a Parquet footer");
        assert_eq!(hash(&a), Some(ha));
        assert_ne!(hash(&b), Some(ha));
        let text = dir.join("t.parquet");
        std::fs::write(&text, b"not parquet at all").unwrap();
        assert_eq!(hash(&text), None);
        std::fs::write(&text, b"").unwrap();
        assert_eq!(hash(&text), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
