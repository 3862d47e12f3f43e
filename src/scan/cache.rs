//! The device column cache (issue 27, item 3): key columns the device scan
//! decoded stay on the device between the queries of a process, so a
//! repeated query reads, uploads and decodes nothing.
//!
//! - One cache per device, least recently used first out, bounded by
//!   `setfusion.cache_limit` (0: off).
//! - An entry is one scan's column: the files with their size, modification
//!   time and byte ranges, the column and its type. Every lookup stats the
//!   files again, so a rewritten file (new size or time) is never served:
//!   its stale entry is dropped.
//! - It yields: its buffers are charged to the device's [`MemoryBudget`]
//!   like any other, and the budget gives them back (LRU first) whenever a
//!   charge would not fit otherwise ([`MemoryBudget::set_evictor`]).
//! - A hit hands out a copy made on the device (the selection consumes its
//!   keys), which costs a few milliseconds for 100M keys.
//! - A string (BYTE_ARRAY) column's keys are hashes, trusted only beside the
//!   bytes that prove them: its entry keeps the decoder's spans and the page
//!   bodies they point into, and a hit hands out a copy of the spans that
//!   shares those bodies, so each query proves its hashes against the bytes.
//!
//! [`MemoryBudget`]: crate::gpu::MemoryBudget
//! [`MemoryBudget::set_evictor`]: crate::gpu::MemoryBudget::set_evictor

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use datafusion::arrow::datatypes::DataType;
use datafusion::error::Result;

use super::pages::FileStamp;
use super::{DeviceDecoded, DeviceStrings, Keep, ScanFile};
use crate::gpu::{DeviceBuffer, Gpu};

/// What identifies one cached column: every file as it is on disk now.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    files: Vec<(PathBuf, FileStamp, Vec<(u64, u64)>)>,
    column: String,
    data_type: DataType,
    /// The row groups the scan read.
    keep: Keep,
}

impl CacheKey {
    /// The key of `column` of `files` as they are now; None when a file
    /// cannot be inspected (it is then never cached).
    pub fn of(files: &[ScanFile], column: &str, data_type: &DataType) -> Option<Self> {
        let files = files
            .iter()
            .map(|f| Some((f.path.clone(), FileStamp::of_path(&f.path)?, f.ranges.clone())))
            .collect::<Option<Vec<_>>>()?;
        Some(Self { files, column: column.to_string(), data_type: data_type.clone(), keep: Keep::default() })
    }

    /// The same scan restricted to the row groups `keep` leaves.
    pub fn within(mut self, keep: Keep) -> Self {
        self.keep = keep;
        self
    }

    /// The same files and column, whatever their size and time.
    fn same_column(&self, other: &Self) -> bool {
        self.column == other.column
            && self.data_type == other.data_type
            && self.keep == other.keep
            && self.files.len() == other.files.len()
            && self.files.iter().zip(&other.files).all(|(a, b)| a.0 == b.0 && a.2 == b.2)
    }
}

struct Entry {
    keys: DeviceBuffer<u64>,
    valid: Option<DeviceBuffer<u32>>,
    /// A string column's spans and the page bodies they point into.
    strings: Option<DeviceStrings>,
    rows: usize,
    bytes: usize,
    last_use: u64,
}

#[derive(Default)]
struct Entries {
    map: HashMap<CacheKey, Entry>,
    clock: u64,
    bytes: usize,
}

impl Entries {
    /// Drop least recently used entries until at most `keep` bytes stay; the bytes freed.
    fn shrink_to(&mut self, keep: usize) -> usize {
        let before = self.bytes;
        while self.bytes > keep {
            let Some(oldest) = self.map.iter().min_by_key(|(_, e)| e.last_use).map(|(k, _)| k.clone()) else { break };
            if let Some(e) = self.map.remove(&oldest) {
                self.bytes -= e.bytes;
            }
        }
        before - self.bytes
    }
}

/// What a lookup or an insertion did, for EXPLAIN ANALYZE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheUse {
    /// The cache is off (`cache_limit = 0`) or the files cannot be inspected.
    Off,
    Hit {
        bytes: usize,
    },
    /// Read from the files, then kept.
    Stored {
        bytes: usize,
    },
    /// Read from the files, not kept (over the limit, or no device memory for the copy).
    Missed,
}

impl std::fmt::Display for CacheUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CacheUse::Off => write!(f, "cache off"),
            CacheUse::Hit { bytes } => write!(f, "cache hit, {:.1} MB on the device", *bytes as f64 / 1e6),
            CacheUse::Stored { bytes } => write!(f, "cache miss, {:.1} MB kept on the device", *bytes as f64 / 1e6),
            CacheUse::Missed => write!(f, "cache miss, not kept"),
        }
    }
}

/// One device's cache (see the module documentation).
pub struct ColumnCache {
    entries: Mutex<Entries>,
}

impl ColumnCache {
    /// The cache of `gpu`'s device, made (and made the budget's evictor) on first use.
    pub fn of(gpu: &Gpu) -> Arc<ColumnCache> {
        static CACHES: OnceLock<Mutex<HashMap<usize, Arc<ColumnCache>>>> = OnceLock::new();
        let mut caches = CACHES.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
        caches
            .entry(gpu.info().ordinal)
            .or_insert_with(|| {
                let cache = Arc::new(ColumnCache { entries: Mutex::new(Entries::default()) });
                let weak = Arc::downgrade(&cache);
                gpu.budget().set_evictor(Box::new(move |bytes| weak.upgrade().map_or(0, |c| c.give_back(bytes))));
                cache
            })
            .clone()
    }

    /// Free at least `bytes` (all when the cache holds less), least recently
    /// used first; the bytes freed. Called by the budget while a charge
    /// waits, possibly under this cache's own lock: it then frees nothing
    /// rather than wait.
    fn give_back(&self, bytes: usize) -> usize {
        match self.entries.try_lock() {
            Ok(mut e) => {
                let keep = e.bytes.saturating_sub(bytes.max(1));
                e.shrink_to(keep)
            }
            Err(_) => 0,
        }
    }

    /// Is `key` held (without touching its place in the LRU order)?
    pub fn holds(&self, key: &CacheKey) -> bool {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).map.contains_key(key)
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).bytes
    }

    /// Drop everything.
    pub fn clear(&self) {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).shrink_to(0);
    }

    /// The cached column for `key`, as a copy on the device; an entry of the
    /// same files and column with another size or time is dropped.
    pub fn get(&self, gpu: &Gpu, key: &CacheKey) -> Result<Option<DeviceDecoded>> {
        let mut e = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let stale: Vec<CacheKey> = e.map.keys().filter(|k| *k != key && k.same_column(key)).cloned().collect();
        for k in stale {
            if let Some(old) = e.map.remove(&k) {
                e.bytes -= old.bytes;
            }
        }
        e.clock += 1;
        let clock = e.clock;
        let Some(entry) = e.map.get_mut(key) else { return Ok(None) };
        entry.last_use = clock;
        // The copies are charged to the budget, which may ask this cache to
        // give memory back: it cannot while this lock is held (see give_back),
        // so a copy that does not fit fails and the caller reads the files.
        let keys = gpu.copy_on_device(&entry.keys, entry.rows);
        let valid = match &entry.valid {
            Some(v) => Some(gpu.copy_on_device(v, entry.rows.div_ceil(32))),
            None => None,
        };
        let strings = entry.strings.as_ref().map(|s| s.shared_copy(gpu));
        match (keys, valid.transpose(), strings.transpose()) {
            (Ok(keys), Ok(valid), Ok(strings)) => Ok(Some(DeviceDecoded { keys, valid, rows: entry.rows, strings })),
            _ => Ok(None),
        }
    }

    /// Device bytes a column's entry holds.
    pub fn bytes_of(decoded: &DeviceDecoded) -> usize {
        decoded.rows * 8
            + decoded.valid.as_ref().map_or(0, |_| decoded.rows.div_ceil(32) * 4)
            + decoded.strings.as_ref().map_or(0, DeviceStrings::bytes)
    }

    /// Keep a copy of `decoded` under `key` when it fits `limit` bytes
    /// (older entries leave to make room).
    pub fn put(&self, gpu: &Gpu, key: CacheKey, decoded: &DeviceDecoded, limit: usize) -> CacheUse {
        let bytes = Self::bytes_of(decoded);
        if bytes > limit {
            return CacheUse::Missed;
        }
        {
            let mut e = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(old) = e.map.remove(&key) {
                e.bytes -= old.bytes;
            }
            e.shrink_to(limit - bytes);
        }
        // Copied outside the lock, so the budget may take older entries back for it.
        let keys = gpu.copy_on_device(&decoded.keys, decoded.rows);
        let valid = decoded.valid.as_ref().map(|v| gpu.copy_on_device(v, decoded.rows.div_ceil(32))).transpose();
        let strings = decoded.strings.as_ref().map(|s| s.shared_copy(gpu)).transpose();
        let (Ok(keys), Ok(valid), Ok(strings)) = (keys, valid, strings) else { return CacheUse::Missed };
        let mut e = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        e.clock += 1;
        let last_use = e.clock;
        e.bytes += bytes;
        e.map.insert(key, Entry { keys, valid, strings, rows: decoded.rows, bytes, last_use });
        e.shrink_to(limit);
        CacheUse::Stored { bytes }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &std::path::Path, name: &str, body: &[u8]) -> ScanFile {
        let path = dir.join(name);
        std::fs::write(&path, body).unwrap();
        ScanFile { path, ranges: vec![] }
    }

    /// A key names the files as they are: another size (or time) is another key
    /// of the same column, and a missing file gives no key.
    #[test]
    fn keys_follow_the_files() {
        let dir = std::env::temp_dir().join(format!("setfusion-cache-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = file(&dir, "a.parquet", b"12345");
        let k1 = CacheKey::of(std::slice::from_ref(&f), "k", &DataType::Int64).unwrap();
        assert_eq!(Some(&k1), CacheKey::of(std::slice::from_ref(&f), "k", &DataType::Int64).as_ref());
        assert_ne!(Some(&k1), CacheKey::of(std::slice::from_ref(&f), "p", &DataType::Int64).as_ref());
        let f = file(&dir, "a.parquet", b"123456");
        let k2 = CacheKey::of(std::slice::from_ref(&f), "k", &DataType::Int64).unwrap();
        assert_ne!(k1, k2);
        assert!(k1.same_column(&k2));
        let missing = ScanFile { path: dir.join("missing.parquet"), ranges: vec![] };
        assert!(CacheKey::of(&[missing], "k", &DataType::Int64).is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// On the device: hits copy, a changed file misses, the limit holds (LRU
    /// first out), and the budget takes the cache's memory back when an
    /// allocation needs it.
    #[test]
    fn device_cache_hits_evicts_and_yields() {
        let Some(g) = crate::gpu::test_gpu() else { return };
        let _lease = g.lease(0);
        let cache = ColumnCache::of(&g);
        cache.clear();
        let dir = std::env::temp_dir().join(format!("setfusion-cache-dev-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut stats = crate::gpu::TransferStats::default();
        let decoded = |rows: usize, stats: &mut crate::gpu::TransferStats| {
            let keys: Vec<u64> = (0..rows as u64).collect();
            DeviceDecoded { keys: g.upload(&keys, stats).unwrap(), valid: None, rows, strings: None }
        };
        let (fa, fb) = (file(&dir, "a.parquet", b"a"), file(&dir, "b.parquet", b"b"));
        let (ka, kb) = (
            CacheKey::of(&[fa.clone()], "k", &DataType::Int64).unwrap(),
            CacheKey::of(&[fb], "k", &DataType::Int64).unwrap(),
        );
        assert_eq!(cache.put(&g, ka.clone(), &decoded(1000, &mut stats), 12_000), CacheUse::Stored { bytes: 8000 });
        let hit = cache.get(&g, &ka).unwrap().unwrap();
        assert_eq!(g.download(&hit.keys, 1000, &mut stats).unwrap(), (0..1000u64).collect::<Vec<_>>());
        // b does not fit beside a: a (least recently used) leaves.
        assert_eq!(cache.put(&g, kb.clone(), &decoded(1000, &mut stats), 12_000), CacheUse::Stored { bytes: 8000 });
        assert!(cache.get(&g, &ka).unwrap().is_none());
        assert!(cache.get(&g, &kb).unwrap().is_some());
        assert_eq!(cache.bytes(), 8000);
        // Too large for the limit: not kept.
        assert_eq!(cache.put(&g, ka.clone(), &decoded(2000, &mut stats), 12_000), CacheUse::Missed);
        // A rewritten file is another key, and its old entry is dropped.
        let fb2 = file(&dir, "b.parquet", b"bb");
        let kb2 = CacheKey::of(&[fb2], "k", &DataType::Int64).unwrap();
        assert!(cache.get(&g, &kb2).unwrap().is_none());
        assert_eq!(cache.bytes(), 0);
        // The budget takes the cache's memory when an allocation needs it.
        cache.put(&g, kb2.clone(), &decoded(1000, &mut stats), 12_000);
        let used = g.budget().used();
        g.budget().set_limit(used + 4000);
        let taken = g.alloc::<u64>(1000);
        g.budget().set_limit(0);
        assert!(taken.is_ok(), "the cache did not yield");
        assert_eq!(cache.bytes(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
