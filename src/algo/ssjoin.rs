//! Set-similarity join (issue 4): all pairs of sets whose Jaccard, Dice,
//! cosine similarity or overlap reaches a threshold.
//!
//! * **Preprocessing** ([`preprocess`], shared by both backends): elements
//!   (u64 keys: integers, or dictionary ids of strings) become dense u32 token
//!   ids ordered by ascending global document frequency over both inputs
//!   (rare tokens first, so prefixes are selective); every set is sorted and
//!   deduplicated; sets are ordered by size (ties by id).
//! * **CPU backend** ([`ssjoin_cpu`]): a multithreaded PPJoin (AllPairs with
//!   the positional filter): static inverted index over the *index prefixes*
//!   of the indexed side, probe prefixes scanned within the length-filter
//!   window, positional pruning of candidates, merge verification with early
//!   termination. Threads take chunks of probe sets from a shared counter.
//! * **GPU backend** ([`ssjoin_gpu`], kernels/ssjoin.cu): sf-gSSJoin /
//!   fgssjoin style. The CSR inverted index (prefix tokens -> set positions,
//!   sorted by position = by size) lives on the device. A first kernel counts
//!   per probe set the index entries its prefix visits inside its length
//!   window; the host cuts the probe sets into blocks whose count matrix
//!   (block rows x window columns) and candidate buffer fit the free device
//!   memory / `setfusion.memory_limit`. Per block, one CUDA block per probe
//!   set walks the concatenated inverted-list segments of its prefix tokens
//!   (split evenly over the threads) and increments `count[row][y]` with
//!   atomics; the first touch appends `(row, y)` to a candidate list. The
//!   verify kernel resets the counters it read (so the matrix is never
//!   cleared as a whole), merges both sets with early termination, applies
//!   the threshold in double precision and appends `(x, y, overlap)` for
//!   matching pairs only; just those triples return to the host.
//!
//! Exactness: every backend decides a pair with the same predicate
//! [`Threshold::passes`] on `(overlap, |x|, |y|)`, which evaluates the metric
//! from integers with one IEEE division (plus one square root for cosine), the
//! same expression as the SQL functions in `crate::udf` and as the kernel. All
//! filters are derived from that predicate (never from a separately rounded
//! formula), so they only drop pairs the predicate rejects.
//!
//! Similarity of two empty sets is 0 (see `crate::udf`): with a threshold
//! > 0 an empty set never joins.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use cudarc::driver::{LaunchConfig, PushKernelArg};
use datafusion::error::{DataFusionError, Result};

use crate::gpu::{cuda_err, Gpu, TransferStats};

/// A result pair: (id of the R set, id of the S set, overlap). For a self
/// join the first id is the smaller one.
pub type Pair = (u32, u32, u32);

/// The similarity function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Metric {
    /// |x ∩ y| / |x ∪ y|
    Jaccard = 0,
    /// 2 |x ∩ y| / (|x| + |y|)
    Dice = 1,
    /// |x ∩ y| / sqrt(|x| |y|)
    Cosine = 2,
    /// |x ∩ y|
    Overlap = 3,
}

impl Metric {
    /// The SQL function name.
    pub fn name(&self) -> &'static str {
        match self {
            Metric::Jaccard => "jaccard",
            Metric::Dice => "dice",
            Metric::Cosine => "set_cosine",
            Metric::Overlap => "overlap",
        }
    }

    pub fn from_name(name: &str) -> Option<Metric> {
        match name {
            "jaccard" => Some(Metric::Jaccard),
            "dice" => Some(Metric::Dice),
            "set_cosine" => Some(Metric::Cosine),
            "overlap" => Some(Metric::Overlap),
            _ => None,
        }
    }

    /// The metric's value for overlap `o` of sets of sizes `a` and `b`.
    /// Computed from exact integers with one rounding step (cosine: the
    /// square root and the division), identically on CPU, GPU and in SQL.
    /// Two empty sets (and, for cosine, any empty set) give 0.
    #[inline]
    pub fn value(&self, o: u64, a: u64, b: u64) -> f64 {
        match self {
            Metric::Jaccard => {
                let den = a + b - o;
                if den == 0 {
                    0.0
                } else {
                    o as f64 / den as f64
                }
            }
            Metric::Dice => {
                let den = a + b;
                if den == 0 {
                    0.0
                } else {
                    (2 * o) as f64 / den as f64
                }
            }
            Metric::Cosine => {
                let p = a * b;
                if p == 0 {
                    0.0
                } else {
                    o as f64 / (p as f64).sqrt()
                }
            }
            Metric::Overlap => o as f64,
        }
    }

    /// Is `t` a valid join threshold for this metric? `Err` says why not.
    pub fn check_threshold(&self, t: f64) -> std::result::Result<(), String> {
        match self {
            Metric::Overlap if !(t >= 1.0 && t.is_finite()) => {
                Err(format!("overlap join threshold must be at least 1, got {t}"))
            }
            Metric::Overlap => Ok(()),
            _ if !(t > 0.0 && t <= 1.0) => {
                Err(format!("{} join threshold must be in (0, 1], got {t}", self.name()))
            }
            _ => Ok(()),
        }
    }
}

/// `metric(x, y) >= value` (or `> value` when `strict`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Threshold {
    pub metric: Metric,
    pub value: f64,
    pub strict: bool,
}

impl Threshold {
    pub fn new(metric: Metric, value: f64) -> Self {
        Self { metric, value, strict: false }
    }

    pub fn strict(metric: Metric, value: f64) -> Self {
        Self { metric, value, strict: true }
    }

    /// The join predicate on (overlap, |x|, |y|).
    #[inline]
    pub fn passes(&self, o: u32, a: u32, b: u32) -> bool {
        let v = self.metric.value(o as u64, a as u64, b as u64);
        if self.strict {
            v > self.value
        } else {
            v >= self.value
        }
    }

    /// Smallest overlap with which sets of sizes `a` and `b` pass, or None.
    pub fn min_overlap(&self, a: u32, b: u32) -> Option<u32> {
        let m = a.min(b);
        if m == 0 || !self.passes(m, a, b) {
            return None;
        }
        let t = self.value;
        let (af, bf) = (a as f64, b as f64);
        let est = match self.metric {
            Metric::Jaccard => t * (af + bf) / (1.0 + t),
            Metric::Dice => t * (af + bf) / 2.0,
            Metric::Cosine => t * (af * bf).sqrt(),
            Metric::Overlap => t,
        };
        let mut o = if est.is_finite() { (est.ceil().max(1.0)).min(m as f64) as u32 } else { m };
        while o > 1 && self.passes(o - 1, a, b) {
            o -= 1;
        }
        while !self.passes(o, a, b) {
            o += 1;
        }
        Some(o)
    }

    /// Can some pair of sets of sizes `a` and `b` pass at all?
    #[inline]
    fn feasible(&self, a: u32, b: u32) -> bool {
        b >= 1 && a >= 1 && self.passes(a.min(b), a, b)
    }

    /// The partner sizes `[lo, hi]` (hi capped at `cap`) for which a set of
    /// size `a` can pass (the length filter), or None.
    pub fn size_range(&self, a: u32, cap: u32) -> Option<(u32, u32)> {
        if a == 0 || !self.feasible(a, a) {
            return None;
        }
        let t = self.value;
        let af = a as f64;
        let est_lo = match self.metric {
            Metric::Jaccard => t * af,
            Metric::Dice => t * af / (2.0 - t),
            Metric::Cosine => t * t * af,
            Metric::Overlap => t,
        };
        let mut lo = if est_lo.is_finite() { est_lo.floor().clamp(1.0, af) as u32 } else { 1 };
        while lo > 1 && self.feasible(a, lo - 1) {
            lo -= 1;
        }
        while !self.feasible(a, lo) {
            lo += 1;
        }
        let cap = cap.max(a);
        let est_hi = match self.metric {
            Metric::Jaccard => af / t,
            Metric::Dice => af * (2.0 - t) / t,
            Metric::Cosine => af / (t * t),
            Metric::Overlap => f64::INFINITY,
        };
        let mut hi = if est_hi.is_finite() && est_hi < cap as f64 { (est_hi.ceil() as u32).max(a) } else { cap };
        while hi < cap && self.feasible(a, hi + 1) {
            hi += 1;
        }
        while hi > a && !self.feasible(a, hi) {
            hi -= 1;
        }
        Some((lo, hi))
    }
}

// ---------------------------------------------------------------------------
// Preprocessing
// ---------------------------------------------------------------------------

/// Raw sets as CSR: set `i` is `elems[offsets[i]..offsets[i + 1]]` (any order,
/// duplicates allowed). Set `i` gets id `i`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawSets {
    pub offsets: Vec<usize>,
    pub elems: Vec<u64>,
}

impl RawSets {
    pub fn new() -> Self {
        Self { offsets: vec![0], elems: Vec::new() }
    }

    pub fn from_vecs(sets: &[Vec<u64>]) -> Self {
        let mut r = Self::new();
        for s in sets {
            r.push(s.iter().copied());
        }
        r
    }

    pub fn push(&mut self, set: impl IntoIterator<Item = u64>) {
        if self.offsets.is_empty() {
            self.offsets.push(0);
        }
        self.elems.extend(set);
        self.offsets.push(self.elems.len());
    }

    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn set(&self, i: usize) -> &[u64] {
        &self.elems[self.offsets[i]..self.offsets[i + 1]]
    }
}

/// Preprocessed sets: set at position `p` is `tokens[offsets[p]..offsets[p+1]]`
/// (strictly increasing token ids), positions ordered by size; `ids[p]` is the
/// caller's id of that set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetCollection {
    pub offsets: Vec<u32>,
    pub tokens: Vec<u32>,
    pub ids: Vec<u32>,
}

impl SetCollection {
    pub fn len(&self) -> usize {
        self.ids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
    #[inline]
    pub fn set(&self, p: usize) -> &[u32] {
        &self.tokens[self.offsets[p] as usize..self.offsets[p + 1] as usize]
    }
    #[inline]
    pub fn size(&self, p: usize) -> u32 {
        self.offsets[p + 1] - self.offsets[p]
    }
    pub fn max_size(&self) -> u32 {
        (0..self.len()).map(|p| self.size(p)).max().unwrap_or(0)
    }
    /// One past the largest token id.
    pub fn vocabulary(&self) -> u32 {
        self.tokens.iter().max().map(|m| m + 1).unwrap_or(0)
    }
}

/// splitmix64 as a `Hasher` for u64 keys (std's SipHash is several times slower).
#[derive(Default)]
struct MixHasher(u64);
impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        let mut x = self.0;
        x ^= x >> 30;
        x = x.wrapping_mul(0xbf58476d1ce4e5b9);
        x ^= x >> 27;
        x = x.wrapping_mul(0x94d049bb133111eb);
        x ^ (x >> 31)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8 | *b as u64).wrapping_mul(0x100000001b3);
        }
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = i;
    }
}
type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<MixHasher>>;

/// Sort and deduplicate each set.
pub fn dedup_sets(raw: &RawSets) -> RawSets {
    let mut out = RawSets { offsets: Vec::with_capacity(raw.len() + 1), elems: Vec::with_capacity(raw.elems.len()) };
    out.offsets.push(0);
    let mut buf = Vec::new();
    for i in 0..raw.len() {
        buf.clear();
        buf.extend_from_slice(raw.set(i));
        buf.sort_unstable();
        buf.dedup();
        out.elems.extend_from_slice(&buf);
        out.offsets.push(out.elems.len());
    }
    out
}

/// Preprocess one or two collections with one shared token order (see the
/// module documentation). `s = None` is a self join of `r`.
pub fn preprocess(r: &RawSets, s: Option<&RawSets>) -> (SetCollection, Option<SetCollection>) {
    let rd = dedup_sets(r);
    let sd = s.map(dedup_sets);
    let mut freq: FastMap<u64, u32> = FastMap::default();
    for e in rd.elems.iter().chain(sd.iter().flat_map(|s| s.elems.iter())) {
        *freq.entry(*e).or_insert(0) += 1;
    }
    let mut order: Vec<(u32, u64)> = freq.iter().map(|(e, f)| (*f, *e)).collect();
    order.sort_unstable();
    for (rank, (_, e)) in order.iter().enumerate() {
        *freq.get_mut(e).unwrap() = rank as u32;
    }
    let build = |d: &RawSets| -> SetCollection {
        let n = d.len();
        let mut perm: Vec<u32> = (0..n as u32).collect();
        perm.sort_by_key(|&i| (d.offsets[i as usize + 1] - d.offsets[i as usize], i));
        let mut c = SetCollection {
            offsets: Vec::with_capacity(n + 1),
            tokens: Vec::with_capacity(d.elems.len()),
            ids: perm.clone(),
        };
        assert!(d.elems.len() < u32::MAX as usize, "similarity join: more than 2^32 set elements");
        c.offsets.push(0);
        for &i in &perm {
            let start = c.tokens.len();
            c.tokens.extend(d.set(i as usize).iter().map(|e| freq[e]));
            c.tokens[start..].sort_unstable();
            c.offsets.push(c.tokens.len() as u32);
        }
        c
    };
    let rc = build(&rd);
    let sc = sd.as_ref().map(build);
    (rc, sc)
}

// ---------------------------------------------------------------------------
// Plan shared by both backends: length-filter tables and the prefix index
// ---------------------------------------------------------------------------

/// Per probe size `a`: the window of indexed positions `[lo_pos, hi_pos)`
/// (length filter), the probe prefix length and the partner size range.
struct Tables {
    lo_pos: Vec<u32>,
    hi_pos: Vec<u32>,
    probe_prefix: Vec<u32>,
    lo_size: Vec<u32>,
    hi_size: Vec<u32>,
}

/// Inverted index over the indexed side's prefixes: token -> (set position,
/// token position in the set), sorted by set position (= by set size).
/// `positions` is only filled for the CPU backend (the GPU kernel finds a
/// match's position itself), empty otherwise.
struct PrefixIndex {
    offsets: Vec<u32>,
    sets: Vec<u32>,
    positions: Vec<u32>,
}

/// Index entries per worker thread below which another thread does not pay
/// for its spawn and its histogram row.
const INDEX_ENTRIES_PER_THREAD: usize = 32 * 1024;
/// Cap on the per-thread histogram rows (threads x vocabulary counters).
const INDEX_HISTOGRAM_WORDS: usize = 64 << 20;

impl PrefixIndex {
    /// CSR index of `s`'s prefixes (`prefix[size]` tokens of each set) over
    /// tokens `0..vocab`, built on up to `threads` threads without per-set
    /// allocations: each thread counts the tokens of a contiguous range of
    /// sets into its own histogram row, the rows are turned into write
    /// cursors by one prefix sum over (token, thread) split by token ranges,
    /// and each thread scatters its sets through its cursors. Thread ranges
    /// follow set order, so every list stays sorted by set position (what the
    /// window binary searches need) with no sort, exactly as a serial build.
    /// `vocab` must exceed every prefix token (sets are strictly increasing,
    /// so their last tokens bound them).
    /// `per_thread`: entries below which another thread is not worth it.
    fn build(s: &SetCollection, prefix: &[u32], vocab: usize, with_positions: bool, threads: usize, per_thread: usize) -> Self {
        use std::sync::atomic::AtomicU32;
        use std::sync::{Barrier, OnceLock};
        let n_s = s.len();
        let entries = |p: usize| prefix[s.size(p) as usize] as usize;
        let total: usize = (0..n_s).map(entries).sum();
        let threads = threads
            .min(total / per_thread.max(1))
            .min(INDEX_HISTOGRAM_WORDS / vocab.max(1))
            .max(1);
        // Set ranges with about equal entry counts (sets grow with position).
        let mut bounds = Vec::with_capacity(threads + 1);
        bounds.push(0usize);
        let mut acc = 0usize;
        for p in 0..n_s {
            while bounds.len() < threads && acc >= total * bounds.len() / threads {
                bounds.push(p);
            }
            acc += entries(p);
        }
        while bounds.len() <= threads {
            bounds.push(n_s);
        }
        let zeros = |n: usize| -> Vec<AtomicU32> { std::iter::repeat_with(|| AtomicU32::new(0)).take(n).collect() };
        // Relaxed atomics only make the shared arrays writable from several
        // threads without unsafe: every slot has one writer per phase and the
        // barriers order the phases (plain loads and stores on x86 and ARM).
        let offsets = zeros(vocab + 1);
        let sets = zeros(total);
        let positions = zeros(if with_positions { total } else { 0 });
        let rows: Vec<OnceLock<Vec<AtomicU32>>> = (0..threads).map(|_| OnceLock::new()).collect();
        let range_totals = zeros(threads);
        let barrier = Barrier::new(threads);
        let work = |i: usize| {
            let (p0, p1) = (bounds[i], bounds[i + 1]);
            // 1. Count this thread's sets into its own row (first touched here,
            // so the row's pages land near this thread).
            let row = zeros(vocab);
            for p in p0..p1 {
                let set = s.set(p);
                for &t in &set[..prefix[set.len()] as usize] {
                    let c = &row[t as usize];
                    c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                }
            }
            let _ = rows[i].set(row);
            barrier.wait();
            let all: Vec<&[AtomicU32]> =
                rows.iter().map(|r| r.get().expect("every worker sets its row before the barrier").as_slice()).collect();
            // 2. Entries of this thread's token range, then 3. exclusive prefix
            // sum in (token, thread) order: row i's counter becomes the first
            // slot of thread i's sets in that token's list.
            let (t0, t1) = (vocab * i / threads, vocab * (i + 1) / threads);
            let mut sum = 0u32;
            for t in t0..t1 {
                for row in &all {
                    sum += row[t].load(Ordering::Relaxed);
                }
            }
            range_totals[i].store(sum, Ordering::Relaxed);
            barrier.wait();
            let mut run: u32 = range_totals[..i].iter().map(|c| c.load(Ordering::Relaxed)).sum();
            for t in t0..t1 {
                offsets[t].store(run, Ordering::Relaxed);
                for row in &all {
                    let c = row[t].load(Ordering::Relaxed);
                    row[t].store(run, Ordering::Relaxed);
                    run += c;
                }
            }
            barrier.wait();
            // 4. Scatter: disjoint slots per thread, ascending set positions.
            let row = all[i];
            for p in p0..p1 {
                let set = s.set(p);
                for (j, &t) in set[..prefix[set.len()] as usize].iter().enumerate() {
                    let k = row[t as usize].load(Ordering::Relaxed);
                    row[t as usize].store(k + 1, Ordering::Relaxed);
                    sets[k as usize].store(p as u32, Ordering::Relaxed);
                    if with_positions {
                        positions[k as usize].store(j as u32, Ordering::Relaxed);
                    }
                }
            }
        };
        if threads == 1 {
            work(0);
        } else {
            std::thread::scope(|scope| {
                for i in 0..threads {
                    let work = &work;
                    scope.spawn(move || work(i));
                }
            });
        }
        offsets[vocab].store(total as u32, Ordering::Relaxed);
        let plain = |v: Vec<AtomicU32>| -> Vec<u32> { v.into_iter().map(AtomicU32::into_inner).collect() };
        PrefixIndex { offsets: plain(offsets), sets: plain(sets), positions: plain(positions) }
    }
}

struct Plan<'a> {
    r: &'a SetCollection,
    s: &'a SetCollection,
    self_join: bool,
    tables: Tables,
    index: PrefixIndex,
    s_sizes: Vec<u32>,
}

impl<'a> Plan<'a> {
    /// Length tables and prefix index; `with_positions`: record each index
    /// entry's token position (the CPU backend's positional filter).
    fn new(r: &'a SetCollection, s: Option<&'a SetCollection>, thr: Threshold, with_positions: bool, threads: usize) -> Self {
        let self_join = s.is_none();
        let s = s.unwrap_or(r);
        let s_sizes: Vec<u32> = (0..s.len()).map(|p| s.size(p)).collect();
        let max_r = r.max_size();
        let max_s = s.max_size();
        let n = max_r as usize + 1;
        let mut tables = Tables {
            lo_pos: vec![0; n],
            hi_pos: vec![0; n],
            probe_prefix: vec![0; n],
            lo_size: vec![0; n],
            hi_size: vec![0; n],
        };
        for a in 1..=max_r {
            let Some((lo, hi)) = thr.size_range(a, max_s) else { continue };
            let alpha = thr.min_overlap(a, lo).unwrap_or(a);
            let i = a as usize;
            tables.lo_pos[i] = s_sizes.partition_point(|&b| b < lo) as u32;
            tables.hi_pos[i] = s_sizes.partition_point(|&b| b <= hi) as u32;
            tables.probe_prefix[i] = a - alpha + 1;
            tables.lo_size[i] = lo;
            tables.hi_size[i] = hi;
        }
        // Index prefix per indexed size b.
        let mut index_prefix = vec![0u32; max_s as usize + 1];
        for b in 1..=max_s {
            let alpha = if self_join {
                // Partners probe later, so they are at least as large.
                thr.min_overlap(b, b)
            } else {
                thr.size_range(b, max_r.max(1)).and_then(|(lo, _)| thr.min_overlap(b, lo))
            };
            index_prefix[b as usize] = alpha.map(|al| b - al + 1).unwrap_or(0);
        }
        // One past the largest token of either side (probe tokens look up
        // their lists too). Sets are strictly increasing, so the last tokens
        // suffice: O(sets) instead of a scan of every token.
        let last_max = |c: &SetCollection| (0..c.len()).filter_map(|p| c.set(p).last().map(|t| t + 1)).max().unwrap_or(0);
        let vocab = if self_join { last_max(r) } else { last_max(r).max(last_max(s)) } as usize;
        let index = PrefixIndex::build(s, &index_prefix, vocab, with_positions, threads, INDEX_ENTRIES_PER_THREAD);
        Plan { r, s, self_join, tables, index, s_sizes }
    }

    /// The indexed-position window of probe `x` (length filter; self joins
    /// only pair a set with those before it).
    #[inline]
    fn window(&self, x: usize) -> (u32, u32) {
        let a = self.r.size(x) as usize;
        let (lo, mut hi) = (self.tables.lo_pos[a], self.tables.hi_pos[a]);
        if self.self_join {
            hi = hi.min(x as u32);
        }
        (lo, hi.max(lo))
    }

    fn pair(&self, x: u32, y: u32, o: u32) -> Pair {
        let (a, b) = (self.r.ids[x as usize], self.s.ids[y as usize]);
        if self.self_join && b < a {
            (b, a, o)
        } else {
            (a, b, o)
        }
    }
}

/// Overlap of two strictly increasing token lists, or None as soon as it
/// cannot reach `need`.
#[inline]
fn overlap_at_least(x: &[u32], y: &[u32], need: u32) -> Option<u32> {
    let (mut i, mut j, mut o) = (0usize, 0usize, 0u32);
    while i < x.len() && j < y.len() {
        if o as usize + (x.len() - i).min(y.len() - j) < need as usize {
            return None;
        }
        match x[i].cmp(&y[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                o += 1;
                i += 1;
                j += 1;
            }
        }
    }
    (o >= need).then_some(o)
}

/// Counters of one join run (EXPLAIN ANALYZE).
#[derive(Debug, Default, Clone)]
pub struct JoinStats {
    /// Candidate pairs that reached verification.
    pub candidates: u64,
    /// Pairs that passed the threshold.
    pub results: u64,
    /// Probe blocks (GPU) or probe chunks (CPU).
    pub blocks: u64,
    /// Inverted-index entries the probes visited (GPU).
    pub hits: u64,
    /// Host time building the length tables and the prefix index.
    pub plan: std::time::Duration,
    pub transfer: TransferStats,
}

/// Run `work(chunk_start, chunk_end, state)` over `[0, n)` in chunks on
/// `threads` threads; returns the per-thread outputs.
fn parallel_chunks<S: Send, F>(n: usize, threads: usize, chunk: usize, init: impl Fn() -> S + Sync, work: F) -> Vec<S>
where
    F: Fn(usize, usize, &mut S) + Sync,
{
    let next = AtomicUsize::new(0);
    let threads = threads.clamp(1, n.div_ceil(chunk).max(1));
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut st = init();
                    loop {
                        let start = next.fetch_add(chunk, Ordering::Relaxed);
                        if start >= n {
                            break;
                        }
                        work(start, (start + chunk).min(n), &mut st);
                    }
                    st
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("ssjoin worker panicked")).collect()
    })
}

/// Default thread count: the machine's available parallelism.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

// ---------------------------------------------------------------------------
// CPU backend
// ---------------------------------------------------------------------------

/// CPU backend (PPJoin, all cores). `s = None`: self join, pairs `id_a < id_b`.
pub fn ssjoin_cpu(r: &SetCollection, s: Option<&SetCollection>, thr: Threshold) -> Vec<Pair> {
    ssjoin_cpu_with(r, s, thr, default_threads(), &mut JoinStats::default())
}

/// [`ssjoin_cpu`] with an explicit thread count and statistics.
pub fn ssjoin_cpu_with(
    r: &SetCollection,
    s: Option<&SetCollection>,
    thr: Threshold,
    threads: usize,
    stats: &mut JoinStats,
) -> Vec<Pair> {
    ssjoin_cpu_until(r, s, thr, threads, stats, None).unwrap_or_default()
}

/// [`ssjoin_cpu_with`] that gives up (None) once `deadline` has passed; the
/// workers check it between chunks of 64 probes (the benchmark's CPU cap).
pub fn ssjoin_cpu_until(
    r: &SetCollection,
    s: Option<&SetCollection>,
    thr: Threshold,
    threads: usize,
    stats: &mut JoinStats,
    deadline: Option<Instant>,
) -> Option<Vec<Pair>> {
    let expired = std::sync::atomic::AtomicBool::new(false);
    let started = Instant::now();
    let plan = Plan::new(r, s, thr, true, threads);
    stats.plan += started.elapsed();
    let n_s = plan.s.len();
    struct State {
        counts: Vec<u32>,
        touched: Vec<u32>,
        out: Vec<Pair>,
        candidates: u64,
        alpha_size: u32,
        alpha_lo: u32,
        alpha: Vec<u32>,
    }
    const PRUNED: u32 = u32::MAX;
    let chunk = 64;
    let states = parallel_chunks(
        r.len(),
        threads,
        chunk,
        || State {
            counts: vec![0; n_s],
            touched: Vec::new(),
            out: Vec::new(),
            candidates: 0,
            alpha_size: 0,
            alpha_lo: 0,
            alpha: Vec::new(),
        },
        |start, end, st| {
            if let Some(d) = deadline {
                if expired.load(Ordering::Relaxed) || Instant::now() >= d {
                    expired.store(true, Ordering::Relaxed);
                    return;
                }
            }
            for x in start..end {
                let a = r.size(x);
                let p = plan.tables.probe_prefix[a as usize] as usize;
                let (lo, hi) = plan.window(x);
                if p == 0 || lo >= hi {
                    continue;
                }
                if st.alpha_size != a {
                    // Minimum overlaps for this probe size over its partner sizes.
                    let (ls, hs) = (plan.tables.lo_size[a as usize], plan.tables.hi_size[a as usize]);
                    st.alpha_size = a;
                    st.alpha_lo = ls;
                    st.alpha.clear();
                    st.alpha.extend((ls..=hs).map(|b| thr.min_overlap(a, b).unwrap_or(u32::MAX)));
                }
                let xs = r.set(x);
                for (i, &w) in xs[..p].iter().enumerate() {
                    let (ls, le) = (plan.index.offsets[w as usize] as usize, plan.index.offsets[w as usize + 1] as usize);
                    let list = &plan.index.sets[ls..le];
                    let from = list.partition_point(|&y| y < lo);
                    let to = from + list[from..].partition_point(|&y| y < hi);
                    for k in from..to {
                        let y = list[k] as usize;
                        let c = st.counts[y];
                        if c == PRUNED {
                            continue;
                        }
                        if c == 0 {
                            st.touched.push(y as u32);
                        }
                        let b = plan.s_sizes[y];
                        let j = plan.index.positions[ls + k];
                        let alpha = st.alpha[(b - st.alpha_lo) as usize];
                        let ub = c + 1 + (a - i as u32 - 1).min(b - j - 1);
                        st.counts[y] = if ub >= alpha { c + 1 } else { PRUNED };
                    }
                }
                for t in 0..st.touched.len() {
                    let y = st.touched[t] as usize;
                    let c = std::mem::take(&mut st.counts[y]);
                    if c == PRUNED {
                        continue;
                    }
                    st.candidates += 1;
                    let b = plan.s_sizes[y];
                    let alpha = st.alpha[(b - st.alpha_lo) as usize];
                    if let Some(o) = overlap_at_least(xs, plan.s.set(y), alpha) {
                        if thr.passes(o, a, b) {
                            st.out.push(plan.pair(x as u32, y as u32, o));
                        }
                    }
                }
                st.touched.clear();
            }
        },
    );
    if expired.load(Ordering::Relaxed) {
        return None;
    }
    let mut out = Vec::with_capacity(states.iter().map(|s| s.out.len()).sum());
    for st in states {
        stats.candidates += st.candidates;
        out.extend(st.out);
    }
    stats.results += out.len() as u64;
    stats.blocks += r.len().div_ceil(chunk) as u64;
    Some(out)
}

// ---------------------------------------------------------------------------
// References (tests and benchmarks)
// ---------------------------------------------------------------------------

/// Nested-loop reference: every pair, full merge, the same predicate.
pub fn ssjoin_brute_force(r: &SetCollection, s: Option<&SetCollection>, thr: Threshold) -> Vec<Pair> {
    let self_join = s.is_none();
    let s = s.unwrap_or(r);
    let mut out = Vec::new();
    for x in 0..r.len() {
        let ys = if self_join { 0..x } else { 0..s.len() };
        for y in ys {
            let o = overlap_at_least(r.set(x), s.set(y), 0).unwrap_or(0);
            if thr.passes(o, r.size(x), s.size(y)) {
                let (a, b) = (r.ids[x], s.ids[y]);
                out.push(if self_join && b < a { (b, a, o) } else { (a, b, o) });
            }
        }
    }
    out
}

/// Exact reference without any filter: a full inverted index over `s` counts
/// every intersecting pair, then the predicate decides (thresholds > 0 need
/// overlap >= 1). Multithreaded; fast enough for tens of thousands of sets.
pub fn ssjoin_exact_counter(r: &SetCollection, s: Option<&SetCollection>, thr: Threshold) -> Vec<Pair> {
    let self_join = s.is_none();
    let s = s.unwrap_or(r);
    let vocab = r.vocabulary().max(s.vocabulary()) as usize;
    let mut offsets = vec![0u32; vocab + 1];
    for &t in &s.tokens {
        offsets[t as usize + 1] += 1;
    }
    for i in 1..offsets.len() {
        offsets[i] += offsets[i - 1];
    }
    let mut fill = offsets.clone();
    let mut lists = vec![0u32; s.tokens.len()];
    for p in 0..s.len() {
        for &t in s.set(p) {
            lists[fill[t as usize] as usize] = p as u32;
            fill[t as usize] += 1;
        }
    }
    let states = parallel_chunks(
        r.len(),
        default_threads(),
        32,
        || (vec![0u32; s.len()], Vec::<u32>::new(), Vec::<Pair>::new()),
        |start, end, (counts, touched, out)| {
            for x in start..end {
                for &t in r.set(x) {
                    let list = &lists[offsets[t as usize] as usize..offsets[t as usize + 1] as usize];
                    let end = if self_join { list.partition_point(|&y| (y as usize) < x) } else { list.len() };
                    for &y in &list[..end] {
                        if counts[y as usize] == 0 {
                            touched.push(y);
                        }
                        counts[y as usize] += 1;
                    }
                }
                for &y in touched.iter() {
                    let o = std::mem::take(&mut counts[y as usize]);
                    if thr.passes(o, r.size(x), s.size(y as usize)) {
                        let (a, b) = (r.ids[x], s.ids[y as usize]);
                        out.push(if self_join && b < a { (b, a, o) } else { (a, b, o) });
                    }
                }
                touched.clear();
            }
        },
    );
    states.into_iter().flat_map(|(_, _, o)| o).collect()
}

// ---------------------------------------------------------------------------
// GPU backend
// ---------------------------------------------------------------------------

/// Threads per CUDA block of `join_probes` (the kernel's SF_BLOCK).
const JOIN_BLOCK: u32 = 128;
/// Slots of the shared-memory candidate table of the first pass: 16 bytes
/// each (key, count, last position, compaction list) = 32 KiB per CUDA block,
/// under the 48 KiB default, so about six blocks fit an SM. Probes with more
/// distinct candidates run again with tables in global memory.
const SHARED_SLOTS: u32 = 2048;
/// CUDA blocks per SM for the grid-stride loops over probes when the
/// occupancy query fails (normally the grid is what fits at once, so no
/// block starts late with a full share of probes).
const BLOCKS_PER_SM: u32 = 4;
/// Result triples the output buffer starts with (it grows on overflow).
const MAX_OUT_START: usize = 1 << 24;

/// Table slots for a probe with at most `m` distinct candidates (the
/// kernel's `sf_table_slots`): a power of two >= 1.5 m + 1, at least 32.
fn table_slots(m: u32) -> usize {
    let want = m as u64 + (m >> 1) as u64 + 1;
    want.next_power_of_two().clamp(32, 1 << 31) as usize
}

/// The device-resident inputs of one join, in two buffers (the collection,
/// uploaded while the host builds the plan; then the plan's tables and
/// index), passed to the kernel as views.
struct DeviceInputs {
    bufs: [crate::gpu::DeviceBuffer<u32>; 2],
    /// (buffer, range) of r_off, r_tok, s_off, s_tok, pp, lo, hi, idx_off, idx_sets
    ranges: [(usize, std::ops::Range<usize>); 9],
}

/// Kernel arguments fixed for the whole join, and one launch of
/// `join_probes` (the only kernel), so the launch list lives in one place.
struct JoinKernel<'a> {
    gpu: &'a Gpu,
    f: cudarc::driver::CudaFunction,
    inputs: &'a DeviceInputs,
    self_join: i32,
    metric: i32,
    t: f64,
    strict: i32,
    shared_slots: u32,
}

/// Where one launch takes its probes and candidate tables from.
enum Probes<'a> {
    /// Probe positions `first..first + n`, shared-memory tables; probes
    /// whose table would exceed [`SHARED_SLOTS`] are deferred to `big`.
    Range { first: u32, n: u32 },
    /// Probe positions `list[first..first + n]`, global tables at
    /// `tab + tab_off[first + i]` (4 * slots words each).
    Listed { list: &'a crate::gpu::DeviceBuffer<u32>, tab: &'a crate::gpu::DeviceBuffer<u32>, tab_off: &'a crate::gpu::DeviceBuffer<u64>, first: u32, n: u32 },
}

impl JoinKernel<'_> {
    fn launch(
        &self,
        probes: &Probes,
        big: &crate::gpu::DeviceBuffer<u32>,
        counters: &crate::gpu::DeviceBuffer<u64>,
        out: &crate::gpu::DeviceBuffer<u32>,
        out_cap: u64,
    ) -> Result<()> {
        let stream = self.gpu.stream();
        let v: Vec<_> = self.inputs.ranges.iter().map(|(b, r)| self.inputs.bufs[*b].slice.slice(r.clone())).collect();
        let null: u64 = 0;
        let (first, n, shared) = match probes {
            Probes::Range { first, n } => (*first, *n, self.shared_slots),
            Probes::Listed { first, n, .. } => (*first, *n, 0),
        };
        if n == 0 {
            return Ok(());
        }
        let sms = self.gpu.info().multiprocessors.max(1) as u32;
        let per_sm = self
            .f
            .occupancy_max_active_blocks_per_multiprocessor(JOIN_BLOCK, shared as usize * 16, None)
            .unwrap_or(BLOCKS_PER_SM)
            .max(1);
        let cfg = LaunchConfig {
            grid_dim: (n.min(sms * per_sm), 1, 1),
            block_dim: (JOIN_BLOCK, 1, 1),
            shared_mem_bytes: shared * 16,
        };
        let mut b = stream.launch_builder(&self.f);
        for view in &v {
            b.arg(view);
        }
        b.arg(&self.self_join).arg(&self.metric).arg(&self.t).arg(&self.strict);
        match probes {
            Probes::Range { .. } => b.arg(&null),
            Probes::Listed { list, .. } => b.arg(&list.slice),
        };
        b.arg(&first).arg(&n);
        match probes {
            Probes::Range { .. } => b.arg(&null).arg(&null),
            Probes::Listed { tab, tab_off, .. } => b.arg(&tab.slice).arg(&tab_off.slice),
        };
        b.arg(&shared).arg(&big.slice).arg(&counters.slice).arg(&out.slice).arg(&out_cap);
        // SAFETY: the argument list matches kernels/ssjoin.cu join_probes. The tables cover every probe size and the
        // index every token; deferred probes (< n per launch) fit `big` (2 words per probe of the join); a listed
        // probe's region (4 * table_slots(m) words at tab_off) lies inside `tab`; at most out_cap triples are written.
        unsafe { b.launch(cfg) }.map_err(|e| cuda_err("ssjoin join_probes", e))?;
        Ok(())
    }
}

/// Knobs of the GPU path; tests shrink them to force the deferred-probe,
/// grouping and output-overflow paths on small inputs.
#[derive(Debug, Clone, Copy)]
struct GpuTuning {
    /// Shared-memory table slots per CUDA block in the first pass.
    shared_slots: u32,
    /// Initial output buffer (triples); None: from the budget.
    out_start: Option<usize>,
}

const DEFAULT_TUNING: GpuTuning = GpuTuning { shared_slots: SHARED_SLOTS, out_start: None };

/// Device counters: result triples, deferred probes, candidates, index entries.
fn read_counters(gpu: &Gpu, c: &crate::gpu::DeviceBuffer<u64>, ts: &mut TransferStats) -> Result<[u64; 4]> {
    let v = gpu.download(c, 4, ts)?;
    Ok([v[0], v[1], v[2], v[3]])
}

/// GPU backend (kernels/ssjoin.cu); same contract as [`ssjoin_cpu`]. The
/// caller holds the device lock and has set the memory budget. Errors
/// (including "does not fit the budget") are returned, never panicked.
///
/// Host <-> device traffic: one upload of the preprocessed collection, the
/// length tables and the prefix index; one launch over all probes with
/// shared-memory candidate tables; a read of four counters; the result
/// triples. Only probes with more distinct candidates than a shared table
/// holds (skewed data, low thresholds) cost a second round: their list goes
/// up and they run in groups whose global-memory tables fit the budget,
/// without a host wait between groups unless the output buffer could fill.
pub fn ssjoin_gpu(
    gpu: &Gpu,
    r: &SetCollection,
    s: Option<&SetCollection>,
    thr: Threshold,
    stats: &mut JoinStats,
) -> Result<Vec<Pair>> {
    ssjoin_gpu_tuned(gpu, r, s, thr, stats, DEFAULT_TUNING)
}

fn ssjoin_gpu_tuned(
    gpu: &Gpu,
    r: &SetCollection,
    s: Option<&SetCollection>,
    thr: Threshold,
    stats: &mut JoinStats,
    tuning: GpuTuning,
) -> Result<Vec<Pair>> {
    let self_join = s.is_none();
    let s_c = s.unwrap_or(r);
    let n_r = r.len();
    if n_r == 0 || s_c.is_empty() {
        return Ok(Vec::new());
    }
    if r.tokens.len() >= u32::MAX as usize || s_c.tokens.len() >= u32::MAX as usize {
        return Err(DataFusionError::ResourcesExhausted("similarity join: more than 2^32 set elements".into()));
    }

    // The collection goes up on a second thread while this one builds the
    // plan (length tables + prefix index), so its staging copy and DMA hide
    // behind the index build instead of following it; the plan's arrays
    // follow in a second, smaller upload.
    let mut collection: Vec<&[u32]> = vec![&r.offsets, &r.tokens];
    if !self_join {
        collection.extend([s_c.offsets.as_slice(), s_c.tokens.as_slice()]);
    }
    let (plan, plan_time, uploaded) = std::thread::scope(|scope| {
        let up = scope.spawn(|| -> Result<(crate::gpu::DeviceBuffer<u32>, TransferStats)> {
            // A fresh thread has no current CUDA context.
            gpu.context().bind_to_thread().map_err(|e| cuda_err("bind CUDA context", e))?;
            let mut st = TransferStats::default();
            let buf = gpu.upload_chunks(&collection, &mut st)?;
            Ok((buf, st))
        });
        let started = Instant::now();
        let plan = Plan::new(r, s, thr, false, default_threads());
        let plan_time = started.elapsed();
        let uploaded =
            up.join().unwrap_or_else(|_| Err(DataFusionError::Internal("ssjoin: collection upload thread panicked".into())));
        (plan, plan_time, uploaded)
    });
    stats.plan += plan_time;
    let (collection_buf, upload_stats) = uploaded?;
    stats.transfer.add(&upload_stats);
    if plan.index.sets.is_empty() {
        return Ok(Vec::new());
    }
    let ts = &mut stats.transfer;
    let stream = gpu.stream().clone();

    let plan_arrays: [&[u32]; 5] = [
        &plan.tables.probe_prefix,
        &plan.tables.lo_pos,
        &plan.tables.hi_pos,
        &plan.index.offsets,
        &plan.index.sets,
    ];
    let plan_buf = gpu.upload_chunks(&plan_arrays, ts)?;
    let mut ranges: Vec<(usize, std::ops::Range<usize>)> = Vec::with_capacity(9);
    let mut at = 0;
    for c in &collection {
        ranges.push((0, at..at + c.len()));
        at += c.len();
    }
    if self_join {
        // s_off, s_tok are r_off, r_tok.
        ranges.extend([ranges[0].clone(), ranges[1].clone()]);
    }
    at = 0;
    for c in &plan_arrays {
        ranges.push((1, at..at + c.len()));
        at += c.len();
    }
    let ranges: [(usize, std::ops::Range<usize>); 9] =
        ranges.try_into().map_err(|_| DataFusionError::Internal("ssjoin: input layout".into()))?;
    let inputs = DeviceInputs { bufs: [collection_buf, plan_buf], ranges };
    let kernel = JoinKernel {
        gpu,
        f: gpu.function("ssjoin", "join_probes")?,
        inputs: &inputs,
        self_join: plan.self_join as i32,
        metric: thr.metric as i32,
        t: thr.value,
        strict: thr.strict as i32,
        shared_slots: tuning.shared_slots,
    };
    let mut counters = gpu.alloc_zeros::<u64>(4)?;
    let big = gpu.alloc::<u32>(2 * n_r)?;
    let avail = |gpu: &Gpu| gpu.budget().available().min(gpu.free_memory().unwrap_or(usize::MAX)) / 10 * 9;
    let mut out_cap = tuning.out_start.unwrap_or_else(|| (avail(gpu) / 8 / 12).clamp(1024, MAX_OUT_START)).max(1);
    let mut out = gpu.alloc::<u32>(out_cap * 3)?;
    let mut result: Vec<Pair> = Vec::new();
    let mut push = |triples: Vec<u32>| result.extend(triples.chunks_exact(3).map(|c| plan.pair(c[0], c[1], c[2])));

    // 1. All probes with shared-memory tables. If the results overflow the
    // output buffer, grow it (or, if the budget says no, halve the range).
    let mut deferred: Vec<(u32, u32)> = Vec::new();
    let mut ranges = vec![(0u32, n_r as u32)];
    while let Some((a, b)) = ranges.pop() {
        stream.memset_zeros(&mut counters.slice).map_err(|e| cuda_err("memset", e))?;
        let t = Instant::now();
        kernel.launch(&Probes::Range { first: a, n: b - a }, &big, &counters, &out, out_cap as u64)?;
        let c = read_counters(gpu, &counters, ts)?;
        ts.kernel += t.elapsed();
        stats.blocks += 1;
        if c[0] > out_cap as u64 {
            let need = usize::try_from(c[0]).unwrap_or(usize::MAX);
            drop(out);
            match gpu.alloc::<u32>(need.saturating_mul(3)) {
                Ok(o) => {
                    out = o;
                    out_cap = need;
                    ranges.push((a, b));
                }
                Err(_) if b - a > 1 => {
                    out = gpu.alloc::<u32>(out_cap * 3)?;
                    let mid = a + (b - a) / 2;
                    ranges.extend([(mid, b), (a, mid)]);
                }
                Err(e) => return Err(e),
            }
            continue;
        }
        stats.candidates += c[2];
        stats.hits += c[3];
        if c[0] > 0 {
            push(gpu.download(&out, c[0] as usize * 3, ts)?);
        }
        if c[1] > 0 {
            let list = gpu.download(&big, c[1] as usize * 2, ts)?;
            deferred.extend(list.chunks_exact(2).map(|p| (p[0], p[1])));
        }
    }

    // 2. Probes with many candidates: global-memory tables, in groups whose
    // tables fit the scratch buffer and whose results (at most their distinct
    // candidates) fit the output buffer, so no group can overflow it.
    if !deferred.is_empty() {
        deferred.sort_unstable();
        let words: Vec<usize> = deferred.iter().map(|&(_, m)| 4 * table_slots(m)).collect();
        let total_words: usize = words.iter().sum();
        let largest = words.iter().copied().max().unwrap_or(0);
        let list_host: Vec<u32> = deferred.iter().map(|&(x, _)| x).collect();
        let list = gpu.upload(&list_host, ts)?;
        // A group is at least one probe: the output must hold its bound.
        let largest_bound = deferred.iter().map(|&(_, m)| m as usize).max().unwrap_or(0);
        if largest_bound > out_cap {
            drop(out);
            out = gpu.alloc::<u32>(largest_bound * 3)?;
            out_cap = largest_bound;
        }
        let scratch_words = total_words.min(avail(gpu).saturating_sub(deferred.len() * 8) / 4);
        if largest > scratch_words {
            return Err(DataFusionError::ResourcesExhausted(format!(
                "setfusion GPU: device memory budget exceeded: similarity join probe needs a {} byte candidate table, {} bytes available",
                largest * 4,
                scratch_words * 4
            )));
        }
        let mut groups: Vec<(usize, usize, u64)> = Vec::new(); // (first, end, distinct bound)
        let mut offsets = Vec::with_capacity(deferred.len());
        let (mut g0, mut used, mut bound) = (0usize, 0usize, 0u64);
        for (i, &w) in words.iter().enumerate() {
            let m = deferred[i].1 as u64;
            if i > g0 && (used + w > scratch_words || bound + m > out_cap as u64) {
                groups.push((g0, i, bound));
                (g0, used, bound) = (i, 0, 0);
            }
            offsets.push(used as u64);
            used += w;
            bound += m;
        }
        groups.push((g0, words.len(), bound));
        let tab_off = gpu.upload(&offsets, ts)?;
        let tab = gpu.alloc::<u32>(scratch_words)?;
        stream.memset_zeros(&mut counters.slice).map_err(|e| cuda_err("memset", e))?;
        let mut pending = 0u64; // bound on the triples in `out` not yet downloaded
        let t = Instant::now();
        for &(first, end, gbound) in &groups {
            if pending + gbound > out_cap as u64 {
                drain(gpu, &out, &mut counters, ts, (&mut stats.candidates, &mut stats.hits), &mut push)?;
                pending = 0;
            }
            let probes =
                Probes::Listed { list: &list, tab: &tab, tab_off: &tab_off, first: first as u32, n: (end - first) as u32 };
            kernel.launch(&probes, &big, &counters, &out, out_cap as u64)?;
            pending += gbound;
            stats.blocks += 1;
        }
        drain(gpu, &out, &mut counters, ts, (&mut stats.candidates, &mut stats.hits), &mut push)?;
        ts.kernel += t.elapsed();
    }
    stats.results += result.len() as u64;
    Ok(result)
}

/// Wait for the launches so far, take their result triples and counts, and
/// zero the counters for the next launches.
fn drain(
    gpu: &Gpu,
    out: &crate::gpu::DeviceBuffer<u32>,
    counters: &mut crate::gpu::DeviceBuffer<u64>,
    ts: &mut TransferStats,
    (candidates, hits): (&mut u64, &mut u64),
    push: &mut dyn FnMut(Vec<u32>),
) -> Result<()> {
    let c = read_counters(gpu, counters, ts)?;
    *candidates += c[2];
    *hits += c[3];
    if c[0] > 0 {
        push(gpu.download(out, c[0] as usize * 3, ts)?);
    }
    gpu.stream().memset_zeros(&mut counters.slice).map_err(|e| cuda_err("memset", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Uniform elements in [0, universe), sizes in [0, max_size].
    pub(crate) fn uniform(n: usize, universe: u64, max_size: usize, seed: u64) -> RawSets {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut r = RawSets::new();
        for _ in 0..n {
            let k = rng.random_range(0..=max_size);
            r.push((0..k).map(|_| rng.random_range(0..universe)).collect::<Vec<_>>());
        }
        r
    }

    /// Zipf-skewed elements (exponent ~1) via inverse CDF on a harmonic table.
    pub(crate) fn zipf(n: usize, universe: usize, max_size: usize, seed: u64) -> RawSets {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut cdf = Vec::with_capacity(universe);
        let mut acc = 0.0;
        for i in 1..=universe {
            acc += 1.0 / i as f64;
            cdf.push(acc);
        }
        let mut r = RawSets::new();
        for _ in 0..n {
            let k = rng.random_range(0..=max_size);
            r.push(
                (0..k)
                    .map(|_| {
                        let u = rng.random::<f64>() * acc;
                        cdf.partition_point(|&c| c < u) as u64 * 7919 + 3
                    })
                    .collect::<Vec<_>>(),
            );
        }
        r
    }

    fn sorted(mut v: Vec<Pair>) -> Vec<Pair> {
        v.sort_unstable();
        v
    }

    fn thresholds() -> Vec<Threshold> {
        let mut v = Vec::new();
        for m in [Metric::Jaccard, Metric::Dice, Metric::Cosine] {
            for t in [0.1, 0.3, 0.5, 0.6, 0.75, 0.9, 1.0] {
                v.push(Threshold::new(m, t));
            }
            v.push(Threshold::strict(m, 0.5));
            v.push(Threshold::strict(m, 1.0));
        }
        for k in [1.0, 2.0, 3.0, 2.5] {
            v.push(Threshold::new(Metric::Overlap, k));
        }
        v.push(Threshold::strict(Metric::Overlap, 2.0));
        v
    }

    fn collections() -> Vec<(&'static str, RawSets, RawSets)> {
        vec![
            ("uniform", uniform(300, 40, 12, 1), uniform(250, 40, 12, 2)),
            ("zipf", zipf(300, 200, 20, 3), zipf(200, 200, 20, 4)),
            ("dups", uniform(200, 8, 10, 5), uniform(100, 8, 6, 6)),
        ]
    }

    #[test]
    fn min_overlap_and_size_range_agree_with_predicate() {
        for thr in thresholds() {
            for a in 0..40u32 {
                for b in 0..40u32 {
                    let expect = (1..=a.min(b)).find(|&o| thr.passes(o, a, b));
                    assert_eq!(thr.min_overlap(a, b), expect, "{thr:?} a={a} b={b}");
                }
                let feasible: Vec<u32> = (1..=60).filter(|&b| a > 0 && thr.passes(a.min(b), a, b)).collect();
                let range = thr.size_range(a, 60);
                match range {
                    None => assert!(feasible.is_empty(), "{thr:?} a={a}"),
                    Some((lo, hi)) => assert_eq!(feasible, (lo..=hi).collect::<Vec<_>>(), "{thr:?} a={a}"),
                }
            }
        }
    }

    #[test]
    fn preprocess_orders_tokens_and_sets() {
        let raw = RawSets::from_vecs(&[vec![5, 5, 1, 9], vec![], vec![1], vec![1, 9, 2]]);
        let (c, _) = preprocess(&raw, None);
        // 1 appears in 3 sets, 9 in 2, 5 and 2 in one: 2 and 5 get the smallest ids.
        assert_eq!(c.ids, vec![1, 2, 0, 3]);
        assert_eq!(c.size(0), 0);
        for p in 0..c.len() {
            assert!(c.set(p).windows(2).all(|w| w[0] < w[1]));
        }
        let id_of_1 = c.set(1)[0];
        assert_eq!(id_of_1, 3, "most frequent token gets the largest id");
    }

    #[test]
    fn cpu_matches_brute_force() {
        for (name, a, b) in collections() {
            let (r, s) = preprocess(&a, Some(&b));
            let s = s.unwrap();
            let (rs, _) = preprocess(&a, None);
            for thr in thresholds() {
                let want = sorted(ssjoin_brute_force(&rs, None, thr));
                assert_eq!(sorted(ssjoin_cpu(&rs, None, thr)), want, "{name} self {thr:?}");
                assert_eq!(sorted(ssjoin_exact_counter(&rs, None, thr)), want, "{name} self counter {thr:?}");
                let want = sorted(ssjoin_brute_force(&r, Some(&s), thr));
                assert_eq!(sorted(ssjoin_cpu(&r, Some(&s), thr)), want, "{name} r-s {thr:?}");
                assert_eq!(sorted(ssjoin_cpu_with(&r, Some(&s), thr, 3, &mut JoinStats::default())), want);
            }
        }
    }

    /// The threaded index build equals the serial one (same lists, same
    /// order), for any thread count including more threads than sets.
    #[test]
    fn parallel_prefix_index_matches_serial() {
        let (c, _) = preprocess(&zipf(3000, 500, 30, 21), None);
        let vocab = c.vocabulary() as usize;
        for cut in [0u32, 1, 3] {
            // prefix[b]: all but `cut` tokens of a set of size b.
            let prefix: Vec<u32> = (0..=c.max_size()).map(|b| b.saturating_sub(cut)).collect();
            let serial = PrefixIndex::build(&c, &prefix, vocab, true, 1, 1);
            assert_eq!(serial.offsets.len(), vocab + 1);
            for threads in [2, 3, 7, 16, 64] {
                for pos in [true, false] {
                    let par = PrefixIndex::build(&c, &prefix, vocab, pos, threads, 1);
                    assert_eq!(par.offsets, serial.offsets, "cut {cut} threads {threads}");
                    assert_eq!(par.sets, serial.sets, "cut {cut} threads {threads}");
                    if pos {
                        assert_eq!(par.positions, serial.positions, "cut {cut} threads {threads}");
                    } else {
                        assert!(par.positions.is_empty());
                    }
                }
            }
            // Lists ascending by set position, entries point at their token.
            for t in 0..vocab {
                let (a, b) = (serial.offsets[t] as usize, serial.offsets[t + 1] as usize);
                assert!(serial.sets[a..b].windows(2).all(|w| w[0] < w[1]));
                for k in a..b {
                    assert_eq!(c.set(serial.sets[k] as usize)[serial.positions[k] as usize], t as u32);
                }
            }
        }
        // More threads than sets.
        let (few, _) = preprocess(&uniform(5, 30, 12, 8), None);
        let prefix: Vec<u32> = (0..=few.max_size()).collect();
        let v = few.vocabulary() as usize;
        let one = PrefixIndex::build(&few, &prefix, v, true, 1, 1);
        let many = PrefixIndex::build(&few, &prefix, v, true, 16, 1);
        assert_eq!((one.offsets, one.sets, one.positions), (many.offsets, many.sets, many.positions));
        let (e, _) = preprocess(&RawSets::from_vecs(&[vec![], vec![]]), None);
        let idx = PrefixIndex::build(&e, &[0], 0, true, 4, 1);
        assert_eq!((idx.offsets, idx.sets.len()), (vec![0], 0));
    }

    /// Host plan time on a bench-like 100k collection (sizes 10..=50,
    /// universe 100k): `cargo test --release --lib plan_timing -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn plan_timing() {
        let mut rng = StdRng::seed_from_u64(5);
        let mut raw = RawSets::new();
        for _ in 0..100_000 {
            let k = rng.random_range(10..=50);
            raw.push((0..k).map(|_| rng.random_range(0..100_000u64)).collect::<Vec<_>>());
        }
        let (c, _) = preprocess(&raw, None);
        for t in [0.5, 0.6, 0.9] {
            let thr = Threshold::new(Metric::Jaccard, t);
            for (threads, pos) in [(1, true), (1, false), (default_threads(), false)] {
                let mut best = std::time::Duration::MAX;
                for _ in 0..5 {
                    let t0 = Instant::now();
                    let plan = Plan::new(&c, None, thr, pos, threads);
                    best = best.min(t0.elapsed());
                    std::hint::black_box(&plan.index.sets);
                }
                let entries = Plan::new(&c, None, thr, pos, threads).index.sets.len();
                eprintln!("t={t} threads={threads} positions={pos}: plan {:.2} ms ({entries} entries)", best.as_secs_f64() * 1e3);
            }
        }
    }

    #[test]
    fn empty_inputs() {
        let empty = RawSets::new();
        let some = RawSets::from_vecs(&[vec![1, 2], vec![], vec![2, 1, 1]]);
        let thr = Threshold::new(Metric::Jaccard, 0.5);
        let (e, _) = preprocess(&empty, None);
        assert!(ssjoin_cpu(&e, None, thr).is_empty());
        let (r, s) = preprocess(&empty, Some(&some));
        assert!(ssjoin_cpu(&r, s.as_ref(), thr).is_empty());
        let (r, s) = preprocess(&some, Some(&empty));
        assert!(ssjoin_cpu(&r, s.as_ref(), thr).is_empty());
        let (r, _) = preprocess(&some, None);
        assert_eq!(ssjoin_cpu(&r, None, thr), vec![(0, 2, 2)]);
        // Only empty sets: nothing joins (empty/empty similarity is 0).
        let (r, _) = preprocess(&RawSets::from_vecs(&[vec![], vec![]]), None);
        assert!(ssjoin_cpu(&r, None, Threshold::new(Metric::Jaccard, 0.01)).is_empty());
    }

    /// GPU vs brute force; skips without a device unless SETFUSION_REQUIRE_GPU=1.
    #[test]
    fn gpu_matches_brute_force() {
        let g = match crate::gpu::gpu(0) {
            Ok(g) => g,
            Err(e) => {
                if std::env::var("SETFUSION_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                    panic!("SETFUSION_REQUIRE_GPU=1 but no GPU: {e}");
                }
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "skipping gpu_matches_brute_force: {e}");
                return;
            }
        };
        let _lock = g.lock_blocking();
        for limit in [0usize, 1 << 20] {
            g.budget().set_limit(limit);
            for (name, a, b) in collections() {
                let (r, s) = preprocess(&a, Some(&b));
                let s = s.unwrap();
                let (rs, _) = preprocess(&a, None);
                for thr in thresholds() {
                    let want = sorted(ssjoin_brute_force(&rs, None, thr));
                    let got = ssjoin_gpu(&g, &rs, None, thr, &mut JoinStats::default()).unwrap();
                    assert_eq!(sorted(got), want, "{name} self {thr:?} limit {limit}");
                    let want = sorted(ssjoin_brute_force(&r, Some(&s), thr));
                    let got = ssjoin_gpu(&g, &r, Some(&s), thr, &mut JoinStats::default()).unwrap();
                    assert_eq!(sorted(got), want, "{name} r-s {thr:?} limit {limit}");
                }
            }
        }
        // Tiny shared tables (nearly every probe deferred to global tables, in
        // many groups) and a one-triple output buffer (overflow: grow, drain).
        g.budget().set_limit(1 << 20);
        for (name, a, b) in collections() {
            let (r, s) = preprocess(&a, Some(&b));
            let (rs, _) = preprocess(&a, None);
            for shared_slots in [32, 64] {
                let tuning = GpuTuning { shared_slots, out_start: Some(1) };
                for thr in thresholds() {
                    let want = sorted(ssjoin_brute_force(&rs, None, thr));
                    let got = ssjoin_gpu_tuned(&g, &rs, None, thr, &mut JoinStats::default(), tuning).unwrap();
                    assert_eq!(sorted(got), want, "{name} self {thr:?} tuned {tuning:?}");
                    let want = sorted(ssjoin_brute_force(&r, s.as_ref(), thr));
                    let got = ssjoin_gpu_tuned(&g, &r, s.as_ref(), thr, &mut JoinStats::default(), tuning).unwrap();
                    assert_eq!(sorted(got), want, "{name} r-s {thr:?} tuned {tuning:?}");
                }
            }
        }
        // Sets longer than one segment chunk (128 prefix tokens), few of them.
        let long = uniform(60, 400, 390, 12);
        let (lr, _) = preprocess(&long, None);
        for t in [0.05, 0.2, 0.5] {
            let thr = Threshold::new(Metric::Jaccard, t);
            let want = sorted(ssjoin_brute_force(&lr, None, thr));
            assert_eq!(sorted(ssjoin_gpu(&g, &lr, None, thr, &mut JoinStats::default()).unwrap()), want, "long t={t}");
            let tuning = GpuTuning { shared_slots: 32, out_start: Some(1) };
            let got = ssjoin_gpu_tuned(&g, &lr, None, thr, &mut JoinStats::default(), tuning).unwrap();
            assert_eq!(sorted(got), want, "long tuned t={t}");
        }
        // A larger skewed self join streamed through many small blocks.
        g.budget().set_limit(4 << 20);
        let (r, _) = preprocess(&zipf(5000, 2000, 40, 9), None);
        for t in [0.3, 0.6, 0.9] {
            let thr = Threshold::new(Metric::Jaccard, t);
            let mut st = JoinStats::default();
            let got = sorted(ssjoin_gpu(&g, &r, None, thr, &mut st).unwrap());
            assert_eq!(got, sorted(ssjoin_exact_counter(&r, None, thr)), "zipf 5000 t={t}");
            assert!(st.blocks >= 1);
        }
        g.budget().set_limit(0);
    }
}

/// Doctor self-check: the GPU join against brute force on random collections,
/// every metric, self and R-S joins.
pub fn self_check(gpu: &Gpu) -> Result<String> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut random_sets = |n: usize| {
        let sets: Vec<Vec<u64>> = (0..n).map(|_| (0..rng.random_range(0..20)).map(|_| rng.random_range(0..60u64)).collect()).collect();
        RawSets::from_vecs(&sets)
    };
    let (r, s) = (random_sets(300), random_sets(200));
    let (rc, sc) = preprocess(&r, Some(&s));
    let sc = sc.unwrap();
    let (selfc, _) = preprocess(&r, None);
    let mut checked = 0;
    for (metric, t) in [(Metric::Jaccard, 0.5), (Metric::Dice, 0.6), (Metric::Cosine, 0.7), (Metric::Overlap, 3.0)] {
        let thr = Threshold::new(metric, t);
        for (a, b) in [(&rc, Some(&sc)), (&selfc, None)] {
            let mut want = ssjoin_brute_force(a, b, thr);
            let mut got = ssjoin_gpu(gpu, a, b, thr, &mut JoinStats::default())?;
            want.sort_unstable();
            got.sort_unstable();
            if got != want {
                return Err(DataFusionError::Execution(format!(
                    "ssjoin self-check failed: {} >= {t}: gpu {} pairs, brute force {}",
                    metric.name(),
                    got.len(),
                    want.len()
                )));
            }
            checked += 1;
        }
    }
    Ok(format!("{checked} joins match brute force"))
}
